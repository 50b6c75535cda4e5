//! Where in the binlog to start, and the checkpoint the capture stores in Kafka.

use serde::{Deserialize, Serialize};

/// A binlog coordinate: file and byte offset.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct BinlogPos {
    pub file: String,
    pub pos: u64,
}

impl std::fmt::Display for BinlogPos {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}", self.file, self.pos)
    }
}

/// `[mysql] start`: where a capture without a checkpoint begins.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Start {
    /// The end of the binlog now: only changes from now on.
    End,
    /// The oldest binlog file the server still has.
    Earliest,
    /// A file and offset, `mysql-bin.000042:1234`.
    At(BinlogPos),
    /// A GTID set: MySQL `uuid:1-100,...`, MariaDB `0-1-100,...`; the capture starts after it.
    Gtid(String),
    /// The first transaction committed at or after this time (seconds since the epoch).
    Timestamp(u64),
}

impl Start {
    /// Parse `end`, `earliest`, `file:pos`, `gtid:SET`, `time:SECONDS` or `time:RFC3339`.
    pub fn parse(s: &str) -> Result<Self, String> {
        let s = s.trim();
        match s {
            "end" => return Ok(Start::End),
            "earliest" => return Ok(Start::Earliest),
            _ => {}
        }
        if let Some(set) = s.strip_prefix("gtid:") {
            if set.trim().is_empty() {
                return Err("gtid: needs a GTID set".into());
            }
            return Ok(Start::Gtid(set.trim().to_string()));
        }
        if let Some(t) = s.strip_prefix("time:") {
            return sluice_common::civil::parse_epoch_seconds(t.trim()).map(Start::Timestamp);
        }
        if let Some((file, pos)) = s.rsplit_once(':') {
            let pos: u64 = pos
                .parse()
                .map_err(|_| format!("{pos:?} is not a binlog offset"))?;
            if file.is_empty() || pos < 4 {
                return Err("expected FILE:POS with POS >= 4".into());
            }
            sluice_proto::binlog_file_seq(file).map_err(|e| e.to_string())?;
            return Ok(Start::At(BinlogPos {
                file: file.to_string(),
                pos,
            }));
        }
        Err(format!(
            "{s:?}: expected end, earliest, FILE:POS, gtid:SET or time:SECONDS|RFC3339"
        ))
    }
}

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
    fn starts_parse() {
        assert_eq!(Start::parse("end"), Ok(Start::End));
        assert_eq!(Start::parse("earliest"), Ok(Start::Earliest));
        assert_eq!(
            Start::parse("mysql-bin.000042:1234"),
            Ok(Start::At(BinlogPos {
                file: "mysql-bin.000042".into(),
                pos: 1234
            }))
        );
        assert_eq!(
            Start::parse("gtid:0-1-100"),
            Ok(Start::Gtid("0-1-100".into()))
        );
        assert_eq!(Start::parse("time:86400"), Ok(Start::Timestamp(86400)));
        assert_eq!(
            Start::parse("time:2024-02-29T12:00:00Z"),
            Ok(Start::Timestamp(1_709_208_000))
        );
        assert!(Start::parse("mysql-bin:12").is_err());
        assert!(Start::parse("bin.000001:2").is_err());
        assert!(Start::parse("gtid:").is_err());
        assert!(Start::parse("yesterday").is_err());
        assert!(Start::parse("time:2024-02-29 12:00").is_err());
    }

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
