//! `sluice status`: where each capture connector stands and how far each apply group is
//! behind, read from Kafka alone.
//!
//! - A connector's position is its last committed checkpoint in the checkpoint topic (read
//!   with `isolation.level=read_committed`, as the captures read it): the binlog coordinate and
//!   GTID set (capture-mysql) or the oplog time and resume token (capture-mongo), when it was
//!   stored, and the snapshot under way.
//! - An apply group's lag is, per partition, the partition's end minus the group's committed
//!   offset (the partition's start when nothing is committed yet), and the age of the first
//!   event not committed (its Kafka timestamp, which the capture sets when it publishes).
//!   Its members and their partitions come from the group coordinator.
//!
//! The source's own current position (and so the capture's lag behind it) is not read here:
//! the capture exports it as metrics (`sluice_capture_lag_seconds`).
//!
//! Given apply configs (`--apply-config`), it also lists their stopped tables, read from the
//! targets.
//!
//! Children: `groups` (the apply groups' lag and members), `source_now` (a MySQL source's
//! position now), `stopped` (the apply stages' stopped tables), `render` (the text).

mod groups;
mod render;
mod source_now;
mod stopped;

use std::collections::BTreeMap;

use serde::Serialize;
use sluice_capture::checkpoint::{self, Checkpoint, Stored};
use sluice_common::clock::now_secs;
use sluice_common::KafkaConfig;

pub(crate) use groups::consumer;
pub use groups::{assignment, read_groups, Group, Member, PartitionLag};
pub use render::{duration_text, text};
pub use source_now::{binlog_bytes_between, mysql_source_now, SourceNow};
pub use stopped::{of_config as stopped_of_config, Stopped};

const CLIENT: &str = "sluice-status";

/// What `sluice status` shows.
#[derive(Debug, Serialize)]
pub struct Status {
    pub checkpoint_topic: String,
    pub connectors: Vec<Connector>,
    pub groups: Vec<Group>,
    pub dead_letter_topic: String,
    /// Dead letters by table and reason (none when the topic does not exist).
    pub dead_letters: Vec<DeadLetters>,
    /// The stopped tables of the apply stages whose configs were given (`--apply-config`);
    /// `None` when none was.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stopped: Option<Vec<Stopped>>,
}

/// The dead letters of one table (or, for bytes that are no change event, of one topic) and
/// one reason.
#[derive(Debug, Serialize, PartialEq)]
pub struct DeadLetters {
    /// `database.table`, or the topic the event was read from when it is not a change event.
    pub table: String,
    /// The reason's label (`value`, `table_stopped`, `undecodable`...; `-` on older ones).
    pub reason: String,
    /// Not replayed yet, and replayed.
    pub waiting: usize,
    pub replayed: usize,
    /// The newest one's Kafka time, milliseconds since the epoch.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_ms: Option<i64>,
}

/// Count dead letters by (table, reason), in that order.
pub fn count_dead_letters(letters: &[crate::replay::DeadLetter]) -> Vec<DeadLetters> {
    let mut by: BTreeMap<(String, String), DeadLetters> = BTreeMap::new();
    for d in letters {
        let table = if d.event.table.is_empty() {
            d.topic.clone()
        } else {
            d.event.table.clone()
        };
        let reason = d.kind.clone().unwrap_or_else(|| "-".into());
        let e = by
            .entry((table.clone(), reason.clone()))
            .or_insert(DeadLetters {
                table,
                reason,
                waiting: 0,
                replayed: 0,
                last_ms: None,
            });
        if d.replayed {
            e.replayed += 1;
        } else {
            e.waiting += 1;
        }
        e.last_ms = e.last_ms.max(d.timestamp_ms);
    }
    by.into_values().collect()
}

/// One capture connector's last stored checkpoint.
#[derive(Debug, Serialize)]
pub struct Connector {
    pub name: String,
    /// `mysql` (a binlog position) or `mongodb` (an oplog time).
    pub source: &'static str,
    /// `file:pos` (MySQL/MariaDB) or `seconds.increment` (MongoDB).
    pub position: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub gtid_set: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub resume_token: Option<String>,
    /// When it was stored, seconds since the epoch, and how long ago.
    pub written_at: u64,
    pub age_seconds: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub snapshot: Option<Snapshot>,
    pub snapshots_done: Vec<String>,
    /// Snapshots the capture queued for itself (a renamed table's, a rebuild after an ALTER),
    /// to run after the one under way: `id (tables)`.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub snapshots_queued: Vec<String>,
    /// Where the source is now, when its config was given (`--capture-config`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub source_now: Option<SourceNow>,
    /// The checkpoint as stored.
    pub checkpoint: Checkpoint,
}

/// The snapshot a checkpoint holds as under way.
#[derive(Debug, Serialize, PartialEq)]
pub struct Snapshot {
    pub id: String,
    pub tables: usize,
    pub tables_done: usize,
    pub rows: u64,
}

/// Read the status: every connector of `checkpoint_topic` (or only `connectors`), and every
/// consumer group that committed offsets on a topic (or only `groups`). Blocking.
pub fn read(
    kafka: &KafkaConfig,
    checkpoint_topic: &str,
    connectors: &[String],
    groups: &[String],
    dead_letter_topic: &str,
) -> Result<Status, String> {
    let mut checkpoints = read_checkpoints(kafka, checkpoint_topic)?
        .into_iter()
        .filter(|(k, _)| connectors.is_empty() || connectors.contains(k))
        .map(|(name, c)| connector(name, c.checkpoint, now_secs()))
        .collect::<Vec<_>>();
    checkpoints.sort_by(|a, b| a.name.cmp(&b.name));
    for c in connectors {
        if !checkpoints.iter().any(|k| &k.name == c) {
            return Err(format!(
                "connector {c:?}: no checkpoint in {checkpoint_topic} (never started, or another \
                 checkpoint topic: --checkpoint-topic)"
            ));
        }
    }
    let out = read_groups(kafka, groups)?;
    let letters = crate::replay::Kafka {
        config: kafka.clone(),
        dead_letter_topic: dead_letter_topic.to_string(),
    }
    .dead_letters();
    let dead_letters = match letters {
        Ok(l) => count_dead_letters(&l),
        Err(e) if e.contains("does not exist") => Vec::new(), // none ever written
        Err(e) => return Err(e),
    };
    Ok(Status {
        checkpoint_topic: checkpoint_topic.to_string(),
        connectors: checkpoints,
        groups: out,
        dead_letter_topic: dead_letter_topic.to_string(),
        dead_letters,
        stopped: None,
    })
}

/// The last checkpoint of each connector (committed transactions only). Blocking.
pub fn read_checkpoints(
    kafka: &KafkaConfig,
    topic: &str,
) -> Result<BTreeMap<String, Stored>, String> {
    checkpoint::read_connectors(kafka, topic, CLIENT).map_err(|e| e.to_string())
}

/// A connector's status from its stored checkpoint.
pub fn connector(name: String, c: Checkpoint, now: u64) -> Connector {
    let (gtid_set, resume_token) = match &c {
        Checkpoint::Mysql(m) => (m.gtid_set.clone(), None),
        Checkpoint::Mongo(m) => (String::new(), m.resume_token.clone()),
    };
    let snapshots_queued = match &c {
        Checkpoint::Mysql(m) => m
            .snapshots_pending
            .iter()
            .map(|p| format!("{} ({})", p.id, p.tables.join(", ")))
            .collect(),
        Checkpoint::Mongo(_) => Vec::new(),
    };
    let snapshot = c.snapshot().map(|s| Snapshot {
        id: s.id.clone(),
        tables: s.tables.len(),
        tables_done: s.tables.values().filter(|t| t.done).count(),
        rows: s.tables.values().map(|t| t.rows).sum(),
    });
    Connector {
        name,
        source: c.source(),
        position: c.position(),
        gtid_set,
        resume_token,
        written_at: c.written_at(),
        age_seconds: now.saturating_sub(c.written_at()),
        snapshot,
        snapshots_done: c.snapshots_done().to_vec(),
        snapshots_queued,
        source_now: None,
        checkpoint: c,
    }
}
