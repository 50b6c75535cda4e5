//! The checkpoint topic: what a capture stores in Kafka to resume from, read and written here
//! and nowhere else (the capture's start and acker, and the operator's tools, all come here).
//!
//! The topic is compacted; its records, by key:
//! - `<connector>`: the connector's checkpoint, JSON: [`mysql::Checkpoint`] or
//!   [`mongo::Checkpoint`] (a tool reads either as a [`Checkpoint`]);
//! - `sluice.incarnation/<connector>` ([`incarnation_key`]): the number of the connector's
//!   latest start (`crate::publish`, *incarnation*);
//! - `sluice.key-partitions/<connector>` ([`key_partitions_key`]): the partition counts its
//!   keys are spread over (`crate::publish::keying`).
//!
//! Every record is written in a Kafka transaction by the connector's one writer, whose
//! transactional id is [`transactional_id`]: starting a writer fences every earlier one, so two
//! captures of one connector, or a tool and a capture, never both write. Readers read committed
//! records only, each key's last one; a record without a payload deletes its key.
//!
//! A checkpoint keeps the fields a newer build wrote and this one does not know
//! ([`Unknown`]): a tool that rewrites it (`sluice position set`) leaves them as they were.
//!
//! Children: `mysql` and `mongo` (each capture's layout), `read` (every key's last record, in
//! one pass over the topic), `write` (the fenced writer).

pub mod mongo;
pub mod mysql;
mod read;
mod write;

use std::collections::BTreeMap;

use serde::Serialize;
use sluice_common::KafkaConfig;

pub use read::{parse, read_last, read_last_blocking, Read};
pub use write::overwrite;
pub(crate) use write::{CheckpointWriter, KeyCounts, KEEPALIVE};

use crate::snapshot::SnapshotProgress;

/// The fields of a stored checkpoint that this build does not know, kept as they were.
pub type Unknown = serde_json::Map<String, serde_json::Value>;

#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    #[error("Kafka client: {0}")]
    Client(#[from] rdkafka::error::KafkaError),
    #[error("checkpoint topic {topic}: {reason}")]
    Topic { topic: String, reason: String },
    #[error(
        "connector {connector:?}: another capture was started with the same connector name and \
         took its checkpoints over (Kafka transactional id {id:?}); this one stops. Two captures \
         of one connector would both publish and overwrite each other's checkpoints: give each \
         capture its own `connector`, or stop the other one"
    )]
    Fenced { connector: String, id: String },
    #[error("the checkpoint task stopped")]
    TaskGone,
}

/// The transactional id of a connector's checkpoint writer.
pub fn transactional_id(connector: &str) -> String {
    format!("sluice-capture.{connector}")
}

/// The key of a connector's incarnation counter.
pub fn incarnation_key(connector: &str) -> String {
    format!("{RESERVED}incarnation/{connector}")
}

/// The key of the partition counts a connector's keys are spread over.
pub fn key_partitions_key(connector: &str) -> String {
    format!("{RESERVED}key-partitions/{connector}")
}

/// Keys that are not a connector's checkpoint start with this.
const RESERVED: &str = "sluice.";

/// A key of the topic is a connector's checkpoint (not a counter of one).
pub fn is_checkpoint_key(key: &[u8]) -> bool {
    !key.starts_with(RESERVED.as_bytes())
}

/// A connector's checkpoint, whichever capture wrote it (a tool's view of the topic; each
/// capture reads its own layout).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(untagged)]
pub enum Checkpoint {
    Mysql(mysql::Checkpoint),
    Mongo(mongo::Checkpoint),
}

impl Checkpoint {
    /// Read a stored checkpoint: capture-mysql's has a binlog position (`next`), capture-mongo's
    /// an oplog time (`ts`).
    pub fn from_json(bytes: &[u8]) -> Result<Self, String> {
        let json: serde_json::Value =
            serde_json::from_slice(bytes).map_err(|e| format!("not JSON: {e}"))?;
        if json.get("next").is_some() {
            serde_json::from_value(json)
                .map(Self::Mysql)
                .map_err(|e| format!("not capture-mysql's checkpoint: {e}"))
        } else if json.get("ts").is_some() {
            serde_json::from_value(json)
                .map(Self::Mongo)
                .map_err(|e| format!("not capture-mongo's checkpoint: {e}"))
        } else {
            Err("neither a binlog position (next) nor an oplog time (ts): not a checkpoint".into())
        }
    }

    /// `mysql` or `mongodb`.
    pub fn source(&self) -> &'static str {
        match self {
            Self::Mysql(_) => "mysql",
            Self::Mongo(_) => "mongodb",
        }
    }

    /// `file:pos` (a binlog coordinate) or `seconds.increment` (an oplog time).
    pub fn position(&self) -> String {
        match self {
            Self::Mysql(c) => c.next.to_string(),
            Self::Mongo(c) => format!("{}.{}", c.ts.0, c.ts.1),
        }
    }

    /// When it was written, seconds since the epoch.
    pub fn written_at(&self) -> u64 {
        match self {
            Self::Mysql(c) => c.written_at,
            Self::Mongo(c) => c.written_at,
        }
    }

    pub fn set_written_at(&mut self, at: u64) {
        match self {
            Self::Mysql(c) => c.written_at = at,
            Self::Mongo(c) => c.written_at = at,
        }
    }

    /// The snapshot under way.
    pub fn snapshot(&self) -> Option<&SnapshotProgress> {
        match self {
            Self::Mysql(c) => c.snapshot.as_deref(),
            Self::Mongo(c) => c.snapshot.as_ref(),
        }
    }

    /// Snapshots finished (`initial`, re-snapshot request ids).
    pub fn snapshots_done(&self) -> &[String] {
        match self {
            Self::Mysql(c) => &c.snapshots_done,
            Self::Mongo(c) => &c.snapshots_done,
        }
    }

    /// The table (`database.table`, or `database.collection`) is being snapshotted, or is due
    /// to be: its rows in the target are not yet all there.
    pub fn snapshotting(&self, table: &str) -> bool {
        let under_way = self
            .snapshot()
            .and_then(|s| s.tables.get(table))
            .is_some_and(|t| !t.done);
        let due = match self {
            Self::Mysql(c) => c
                .snapshots_pending
                .iter()
                .any(|p| p.tables.iter().any(|t| t == table)),
            Self::Mongo(_) => false,
        };
        under_way || due
    }

    /// State tied to the position, which moving it would leave wrong: what it is, named by its
    /// field.
    pub fn held(&self) -> Vec<(&'static str, &'static str)> {
        let mut held = Vec::new();
        if self.snapshot().is_some() {
            held.push(("snapshot", "a snapshot under way"));
        }
        if let Self::Mysql(c) = self {
            if !c.snapshots_pending.is_empty() {
                held.push(("snapshots_pending", "snapshots due"));
            }
            if !c.ddl_pending.is_empty() {
                held.push((
                    "ddl_pending",
                    "statements read while behind the server, not published yet",
                ));
            }
        }
        held
    }

    /// The binlog generation of the versions published (0 for capture-mongo).
    pub fn generation(&self) -> u8 {
        match self {
            Self::Mysql(c) => c.generation,
            Self::Mongo(_) => 0,
        }
    }
}

/// A connector's last stored checkpoint and the partition it is in (a rewrite goes there, so
/// that it is the key's last record).
#[derive(Debug, Clone)]
pub struct Stored {
    pub checkpoint: Checkpoint,
    pub partition: i32,
}

/// Every connector's last checkpoint (committed ones only), by connector. Blocking.
pub fn read_connectors(
    kafka: &KafkaConfig,
    topic: &str,
    client_id: &str,
) -> Result<BTreeMap<String, Stored>, CheckpointError> {
    let last = read_last_blocking(kafka, topic, client_id, &is_checkpoint_key)?;
    let mut out = BTreeMap::new();
    for (key, read) in last {
        let checkpoint =
            Checkpoint::from_json(&read.payload).map_err(|e| CheckpointError::Topic {
                topic: topic.to_string(),
                reason: format!(
                    "partition {} offset {}: the record of {key:?}: {e}",
                    read.partition, read.offset
                ),
            })?;
        out.insert(
            key,
            Stored {
                checkpoint,
                partition: read.partition,
            },
        );
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MYSQL: &str = r#"{"next":{"file":"mysql-bin.000003","pos":1234},"gtid_set":"0-1-9","server_id":1,"written_at":1000,"snapshots_pending":[{"id":"rename x","tables":["db.t"]}],"generation":2}"#;
    const MONGO: &str = r#"{"ts":[1700000000,4],"resume_token":"1e00","replica_set":"rs0","written_at":999,"snapshot":{"id":"initial","tables":{"shop.orders":{"rows":12}}}}"#;

    #[test]
    fn either_captures_checkpoint_reads_with_its_position() {
        let my = Checkpoint::from_json(MYSQL.as_bytes()).unwrap();
        assert_eq!(my.source(), "mysql");
        assert_eq!(my.position(), "mysql-bin.000003:1234");
        assert_eq!((my.written_at(), my.generation()), (1000, 2));
        assert!(my.snapshotting("db.t"), "a snapshot due counts");
        assert!(!my.snapshotting("db.u"));
        assert_eq!(my.held(), [("snapshots_pending", "snapshots due")]);
        let mo = Checkpoint::from_json(MONGO.as_bytes()).unwrap();
        assert_eq!(mo.source(), "mongodb");
        assert_eq!(mo.position(), "1700000000.4");
        assert!(mo.snapshotting("shop.orders"));
        assert_eq!(mo.held(), [("snapshot", "a snapshot under way")]);
        let e = Checkpoint::from_json(br#"{"written_at":1}"#).unwrap_err();
        assert!(e.contains("not a checkpoint"), "{e}");
        let e = Checkpoint::from_json(br#"{"next":{"file":"f"}}"#).unwrap_err();
        assert!(e.contains("capture-mysql") && e.contains("pos"), "{e}");
        assert!(Checkpoint::from_json(b"{")
            .unwrap_err()
            .contains("not JSON"));
    }

    #[test]
    fn fields_of_a_newer_writer_survive_a_rewrite() {
        for (text, newer) in [
            (MYSQL, r#""xa_open":[{"xid":"x1"}]"#),
            (MONGO, r#""post_images":true"#),
        ] {
            let text = format!("{},{newer}}}", text.strip_suffix('}').unwrap());
            let mut c = Checkpoint::from_json(text.as_bytes()).unwrap();
            c.set_written_at(5);
            let again = serde_json::to_string(&c).unwrap();
            assert!(again.contains(newer), "{again}");
            assert!(again.contains(r#""written_at":5"#), "{again}");
            assert_eq!(Checkpoint::from_json(again.as_bytes()).unwrap(), c);
        }
    }

    #[test]
    fn counters_are_not_checkpoints() {
        assert!(is_checkpoint_key(b"mysql-main"));
        assert!(!is_checkpoint_key(incarnation_key("mysql-main").as_bytes()));
        assert!(!is_checkpoint_key(
            key_partitions_key("mysql-main").as_bytes()
        ));
        assert_eq!(transactional_id("m"), "sluice-capture.m");
    }
}
