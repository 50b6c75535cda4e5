//! capture-mysql's checkpoint: the binlog position to resume from and the state tied to it.

use serde::{Deserialize, Serialize};

use super::Unknown;
use crate::mysql::position::BinlogPos;

/// What the capture stores in Kafka (checkpoint topic, key = connector name) after every event
/// up to `next` was acknowledged: the place to resume from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Checkpoint {
    /// The first byte after the last fully published transaction.
    pub next: BinlogPos,
    /// The GTID of that transaction, if the server writes GTIDs.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub last_gtid: String,
    /// Every transaction read up to `next` as a GTID set, where the capture knows it
    /// ([`crate::mysql::gtid::GtidSet`]: MariaDB the last GTID of each domain, MySQL
    /// `uuid:intervals`): after a fail-over the capture resumes from it on the new server.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub gtid_set: String,
    /// The source's server_id and server_uuid (MySQL) when the checkpoint was written: resuming
    /// from another server's binlog coordinates would be wrong.
    pub server_id: u32,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub server_uuid: String,
    /// Wall-clock time of the write, seconds since the epoch.
    pub written_at: u64,
    /// The snapshot being taken, with each table's last published key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshot: Option<std::sync::Arc<crate::snapshot::SnapshotProgress>>,
    /// Snapshots finished (`initial`, re-snapshot request ids).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub snapshots_done: Vec<String>,
    /// Snapshots the capture asked itself for (a table renamed into the captured set), not
    /// finished yet: taken one after another once the one running is done.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub snapshots_pending: Vec<PendingSnapshot>,
    /// DDL read while the capture was behind the server, not published yet: published at the
    /// table's next rows, with the schema the binlog gives them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ddl_pending: Vec<PendingDdl>,
    /// The binlog generation of the versions published (`mysql.generation`).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub generation: u8,
    /// Per table (`db.table`), its columns of a type the binlog logs as another (INET4, INET6,
    /// UUID as BINARY; JSON as a BLOB) and that type, as the capture last published them: a
    /// restart reading rows behind a statement that since dropped or renamed such a column
    /// (information_schema no longer has it) still publishes them in their type.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub typed_columns:
        std::collections::BTreeMap<String, std::collections::BTreeMap<String, String>>,
    /// Fields of a newer capture's checkpoint that this build does not know: kept as they are
    /// when the checkpoint is written again (`sluice position set`).
    #[serde(flatten)]
    pub unknown: Unknown,
}

fn is_zero(g: &u8) -> bool {
    *g == 0
}

/// DDL of one table read while behind the server: the server's schema then may be that of a
/// later statement, so the event waits for the table's next table map (its schema exact as of
/// the rows), or for the capture to catch up with the server.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PendingDdl {
    pub database: String,
    pub table: String,
    /// "alter" or "create" (a create first stays a create).
    pub kind: String,
    /// The table's schema before the first statement, where known: its protobuf, in hex.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub before: String,
    /// Every statement, in order.
    pub statements: Vec<String>,
    /// Where the last one is: its version and position.
    pub file: String,
    pub start: u64,
    pub ts: u32,
    /// The generation of the server the statement was read from (a fail-over since raised
    /// the capture's): its version is of that generation. Absent in older checkpoints: the
    /// checkpoint's own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generation: Option<u8>,
}

/// A snapshot the capture asked itself for: its id and the tables (`database.table`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PendingSnapshot {
    pub id: String,
    pub tables: Vec<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checkpoint_json_round_trip() {
        let c = Checkpoint {
            next: BinlogPos {
                file: "mysql-bin.000001".into(),
                pos: 4,
            },
            last_gtid: "0-1-5".into(),
            gtid_set: "0-1-5,1-2-3".into(),
            server_id: 1,
            server_uuid: String::new(),
            written_at: 1,
            snapshot: None,
            snapshots_done: vec![],
            snapshots_pending: vec![],
            ddl_pending: vec![],
            generation: 0,
            typed_columns: Default::default(),
            unknown: Unknown::new(),
        };
        let text = serde_json::to_string(&c).unwrap();
        assert!(!text.contains("server_uuid"));
        assert!(!text.contains("snapshot"));
        assert!(
            !text.contains("generation"),
            "generation 0 is left out: {text}"
        );
        assert_eq!(serde_json::from_str::<Checkpoint>(&text).unwrap(), c);
        let g = Checkpoint {
            generation: 3,
            ..c.clone()
        };
        let text = serde_json::to_string(&g).unwrap();
        assert!(text.contains("\"generation\":3"), "{text}");
        assert_eq!(serde_json::from_str::<Checkpoint>(&text).unwrap(), g);
        // Columns the binlog logs as another type, by table.
        let mut typed = Checkpoint {
            typed_columns: Default::default(),
            ..c.clone()
        };
        typed
            .typed_columns
            .entry("db.t".into())
            .or_default()
            .insert("a".into(), "COLUMN_TYPE_INET4".into());
        let text = serde_json::to_string(&typed).unwrap();
        assert!(
            text.contains(r#""typed_columns":{"db.t":{"a":"COLUMN_TYPE_INET4"}}"#),
            "{text}"
        );
        assert_eq!(serde_json::from_str::<Checkpoint>(&text).unwrap(), typed);
        // With a snapshot under way.
        let mut tables = std::collections::BTreeMap::new();
        tables.insert(
            "db.t".to_string(),
            crate::snapshot::TableProgress {
                after: "0a020804".into(),
                rows: 10,
                done: false,
            },
        );
        let c = Checkpoint {
            snapshot: Some(std::sync::Arc::new(crate::snapshot::SnapshotProgress {
                id: "initial".into(),
                tables,
            })),
            snapshots_done: vec!["r1".into()],
            snapshots_pending: vec![PendingSnapshot {
                id: "rename x".into(),
                tables: vec!["db.t".into()],
            }],
            ddl_pending: vec![PendingDdl {
                database: "db".into(),
                table: "t".into(),
                kind: "alter".into(),
                before: "0a0264622a".into(),
                statements: vec!["ALTER TABLE t ADD c INT".into()],
                file: "mysql-bin.000001".into(),
                start: 400,
                ts: 1,
                generation: Some(2),
            }],
            ..c
        };
        let text = serde_json::to_string(&c).unwrap();
        assert_eq!(serde_json::from_str::<Checkpoint>(&text).unwrap(), c);
    }
}
