//! What both captures share about snapshots: `[snapshot]` (which snapshot to take, and how)
//! and the progress of one under way, which travels in the checkpoint.

use std::collections::BTreeMap;

use prometheus::{IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry};
use serde::{Deserialize, Serialize};

/// A snapshot under way, stored in the checkpoint: a restart goes on from each table's (or
/// collection's) last published key.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapshotProgress {
    /// `initial` or the re-snapshot's `request_id`.
    pub id: String,
    /// `database.table` (MongoDB `database.collection`) -> its progress, for every table of
    /// this snapshot. (capture-mongo's checkpoints before 2026-12 name it `collections`.)
    #[serde(alias = "collections")]
    pub tables: BTreeMap<String, TableProgress>,
}

/// Where the copy of one table or collection stands.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TableProgress {
    /// The last key published, in hex: MySQL a protobuf `Row` of the key values, MongoDB the
    /// BSON document `{v: _id}`. Empty before the first chunk.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub after: String,
    /// Rows (documents) published so far. (capture-mongo's older checkpoints name it `docs`.)
    #[serde(alias = "docs")]
    pub rows: u64,
    #[serde(default)]
    pub done: bool,
}

/// `[snapshot]`: what to read besides the binlog.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct SnapshotConfig {
    /// `stream` (changes only), `snapshot` (the tables' current rows, then stop) or
    /// `snapshot+stream` (current rows, then the changes, without a gap). The snapshot is
    /// taken once per connector; a capture resuming from a checkpoint goes on with an
    /// unfinished snapshot. Default `stream`.
    pub mode: String,
    /// Rows per chunk (MySQL), documents per batch (MongoDB). Default 10000.
    pub chunk_rows: u64,
    /// Tables read at the same time. Default 2.
    pub parallel_tables: usize,
    /// Tables (`database.table`, MongoDB `database.collection`) to snapshot again while streaming goes on, once per
    /// `request_id`. Default none.
    pub tables: Vec<String>,
    /// Names a re-snapshot request: a new id runs `tables` again. Default empty (none).
    pub request_id: String,
    /// MongoDB: publish each collection's options and indexes before its documents, so that
    /// apply-mongo creates them on the target (when its DDL filter lets `create` and
    /// `createIndexes` through). Default true.
    pub copy_indexes: bool,
}

impl Default for SnapshotConfig {
    fn default() -> Self {
        Self {
            mode: "stream".into(),
            chunk_rows: 10_000,
            parallel_tables: 2,
            tables: Vec::new(),
            request_id: String::new(),
            copy_indexes: true,
        }
    }
}

impl SnapshotConfig {
    pub fn validate(&self) -> Result<(), (String, String)> {
        if !["stream", "snapshot", "snapshot+stream"].contains(&self.mode.as_str()) {
            return Err((
                "snapshot.mode".into(),
                format!(
                    "{:?}: expected stream, snapshot or snapshot+stream",
                    self.mode
                ),
            ));
        }
        if !(1..=10_000_000).contains(&self.chunk_rows) {
            return Err((
                "snapshot.chunk_rows".into(),
                "must be between 1 and 10000000".into(),
            ));
        }
        if !(1..=64).contains(&self.parallel_tables) {
            return Err((
                "snapshot.parallel_tables".into(),
                "must be between 1 and 64".into(),
            ));
        }
        for t in &self.tables {
            if split_name(t).is_none() {
                return Err((
                    "snapshot.tables".into(),
                    format!("{t:?}: expected database.table"),
                ));
            }
        }
        if !self.tables.is_empty() && self.request_id.is_empty() {
            return Err((
                "snapshot.request_id".into(),
                "must be set when snapshot.tables is: a new id asks for a new snapshot".into(),
            ));
        }
        Ok(())
    }

    /// The initial snapshot is wanted.
    pub fn initial(&self) -> bool {
        self.mode != "stream"
    }

    /// Stop once the snapshot is published.
    pub fn stop_after(&self) -> bool {
        self.mode == "snapshot"
    }
}

pub fn split_name(name: &str) -> Option<(String, String)> {
    let (db, table) = name.split_once('.')?;
    (!db.is_empty() && !table.is_empty()).then(|| (db.to_string(), table.to_string()))
}

/// The snapshot metrics both captures serve (a MongoDB collection is its `table`).
pub struct SnapshotMetrics {
    pub rows: IntCounterVec,
    pub left_to_stream: IntCounterVec,
    pub estimated: IntGaugeVec,
    pub tables_remaining: IntGauge,
    pub chunks: IntCounterVec,
}

impl SnapshotMetrics {
    pub fn new(r: &Registry) -> prometheus::Result<Self> {
        let rows = IntCounterVec::new(
            Opts::new(
                "sluice_capture_snapshot_rows_total",
                "Rows published by snapshots (after reconciliation with the stream).",
            ),
            &["database", "table"],
        )?;
        let left_to_stream = IntCounterVec::new(
            Opts::new(
                "sluice_capture_snapshot_rows_left_to_stream_total",
                "Rows of snapshot chunks not published because the stream changed them while \
                 the chunk was read (the stream's newer image stands).",
            ),
            &["database", "table"],
        )?;
        let estimated = IntGaugeVec::new(
            Opts::new(
                "sluice_capture_snapshot_rows_estimated",
                "Estimated rows of each table being snapshotted (information_schema).",
            ),
            &["database", "table"],
        )?;
        let tables_remaining = IntGauge::new(
            "sluice_capture_snapshot_tables_remaining",
            "Tables of the running snapshot not finished yet.",
        )?;
        let chunks = IntCounterVec::new(
            Opts::new(
                "sluice_capture_snapshot_chunks_total",
                "Snapshot chunks read, by outcome (published, retried).",
            ),
            &["outcome"],
        )?;
        for outcome in ["published", "retried"] {
            chunks.with_label_values(&[outcome]);
        }
        r.register(Box::new(rows.clone()))?;
        r.register(Box::new(left_to_stream.clone()))?;
        r.register(Box::new(estimated.clone()))?;
        r.register(Box::new(tables_remaining.clone()))?;
        r.register(Box::new(chunks.clone()))?;
        Ok(Self {
            rows,
            left_to_stream,
            estimated,
            tables_remaining,
            chunks,
        })
    }
}

/// The id of the snapshot a connector takes first.
pub const INITIAL: &str = "initial";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn progress_reads_both_captures_older_checkpoints() {
        // capture-mongo wrote `collections` and `docs` before the two progress types became one.
        let old = r#"{"id":"initial","collections":{"db.c":{"after":"0a","docs":7,"done":true}}}"#;
        let p: SnapshotProgress = serde_json::from_str(old).unwrap();
        assert_eq!(
            p.tables["db.c"],
            TableProgress {
                after: "0a".into(),
                rows: 7,
                done: true
            }
        );
        let mysql = r#"{"id":"r1","tables":{"db.t":{"rows":3}}}"#;
        let p: SnapshotProgress = serde_json::from_str(mysql).unwrap();
        assert_eq!(
            p.tables["db.t"],
            TableProgress {
                after: String::new(),
                rows: 3,
                done: false
            }
        );
        let again: SnapshotProgress =
            serde_json::from_str(&serde_json::to_string(&p).unwrap()).unwrap();
        assert_eq!(again, p);
    }

    #[test]
    fn config_is_checked() {
        let mut c = SnapshotConfig::default();
        assert!(c.validate().is_ok());
        c.mode = "initial".into();
        assert_eq!(c.validate().unwrap_err().0, "snapshot.mode");
        c.mode = "snapshot+stream".into();
        c.tables = vec!["db.t".into()];
        assert_eq!(c.validate().unwrap_err().0, "snapshot.request_id");
        c.request_id = "r1".into();
        assert!(c.validate().is_ok());
        c.tables = vec!["nodot".into()];
        assert_eq!(c.validate().unwrap_err().0, "snapshot.tables");
    }
}
