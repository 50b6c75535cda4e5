//! capture-mongo's checkpoint: the oplog time (and change stream resume token) to resume from.

use serde::{Deserialize, Serialize};

use super::Unknown;
use crate::snapshot::SnapshotProgress;

/// A position in the source's history, as stored in Kafka.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Checkpoint {
    /// Oplog time of the last change published (or reached on an idle stream): seconds and
    /// increment.
    pub ts: (u32, u32),
    /// The change stream resume token there, as hex of its BSON document; absent when the
    /// capture read the oplog.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resume_token: Option<String>,
    /// The source's replica set name when the checkpoint was written (empty if it has none).
    #[serde(default)]
    pub replica_set: String,
    /// Wall-clock time of the write, seconds since the epoch.
    pub written_at: u64,
    /// The snapshot being taken, with each collection's last published `_id` (the shared
    /// progress type: `tables`, `rows`; checkpoints written before read as `collections`,
    /// `docs`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshot: Option<SnapshotProgress>,
    /// Snapshots finished (`initial`, re-snapshot request ids).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub snapshots_done: Vec<String>,
    /// Fields of a newer capture's checkpoint that this build does not know: kept as they are
    /// when the checkpoint is written again (`sluice position set`).
    #[serde(flatten)]
    pub unknown: Unknown,
}
