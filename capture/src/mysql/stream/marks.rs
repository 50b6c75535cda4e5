//! Transactions, where the stream stands, and the marks that become checkpoints.
//!
//! A transaction begins at its GTID (or BEGIN) event and commits at XID, COMMIT or a DDL
//! statement. Each commit moves the resume point to the end of the committing event and queues
//! a mark: a [`Checkpoint`] of that point (with the last GTID, the server's identity and the
//! snapshot's progress), which the publisher stores once Kafka acknowledged every event before
//! it. So a restart, or a reconnect, begins after the last whole transaction.
//!
//! The stream's position as a version (`file number << 32 | offset`) orders snapshot chunks
//! against the stream: an event read is "before" a position when its file and offset are.

use sluice_common::clock::{now_micros, now_secs};
use sluice_proto::v1;
use std::collections::BTreeMap;

use super::context::{Capture, TxState};
use crate::checkpoint::mysql::Checkpoint;
use crate::error::CaptureError;
use crate::mysql::position::BinlogPos;
use crate::snapshot::SnapshotProgress;

impl Capture {
    /// A transaction begins; while starting from a time, the first one committed at or after
    /// it ends the skip.
    pub(super) fn begin(&mut self, id: String, gtid: String, commit_time_micros: i64) {
        if let Some(t) = self.skip_until {
            if commit_time_micros / 1_000_000 >= t as i64 {
                tracing::info!(from = %id, "reached the start time");
                self.skip_until = None;
            }
        }
        self.tx = Some(TxState {
            id,
            gtid,
            index: 0,
            commit_time_micros,
        });
    }

    /// The transaction (if any) ends at `end`: resume there from now on.
    pub(super) async fn commit(&mut self, end: u64) -> Result<(), CaptureError> {
        let tx = self.tx.take();
        if let Some(tx) = &tx {
            if !tx.gtid.is_empty() {
                self.last_gtid = tx.gtid.clone();
                if let Some(set) = self.gtid_set.as_mut() {
                    if let Err(e) = set.add(&tx.gtid) {
                        // Not resumable by GTID from here on: said once, and a fail-over is
                        // then refused rather than started from a wrong set.
                        tracing::warn!(gtid = %tx.gtid, error = %e, "a GTID the capture cannot add to its set: fail-over by GTID is off until the next binlog file");
                        self.gtid_set = None;
                    }
                }
            }
        }
        self.resume = BinlogPos {
            file: self.file.clone(),
            pos: end,
        };
        self.publish_ddl_reached().await?;
        self.mark_now().await
    }

    /// Queue a checkpoint at the current position (between transactions).
    pub(super) async fn mark_now(&mut self) -> Result<(), CaptureError> {
        let progress = self.snapshot.as_ref().map(|s| s.progress());
        self.mark_with(progress).await
    }

    /// Queue a checkpoint at the current position with this snapshot progress.
    pub(super) async fn mark_with(
        &mut self,
        snapshot: Option<std::sync::Arc<SnapshotProgress>>,
    ) -> Result<(), CaptureError> {
        let checkpoint = self.checkpoint(snapshot);
        self.publisher.mark(checkpoint).await?;
        Ok(())
    }

    /// Store a checkpoint at the current position and wait until it is committed: nothing is
    /// published before it (a new connector's start).
    pub(super) async fn store_now(&mut self) -> Result<(), CaptureError> {
        let progress = self.snapshot.as_ref().map(|s| s.progress());
        let checkpoint = self.checkpoint(progress);
        self.publisher.store(checkpoint).await?;
        Ok(())
    }

    /// A checkpoint of the current position with this snapshot progress.
    fn checkpoint(&self, snapshot: Option<std::sync::Arc<SnapshotProgress>>) -> Checkpoint {
        // Not past a prepared XA transaction still open: a restart reads it again.
        let (next, gtid_set) = match self.xa.before() {
            Some(b) if self.before_pos(b, &self.resume) => (
                b.clone(),
                self.xa.gtid_before().unwrap_or_default().to_string(),
            ),
            _ => (self.resume.clone(), self.gtid_text()),
        };
        Checkpoint {
            next,
            last_gtid: self.last_gtid.clone(),
            gtid_set,
            server_id: self.server.server_id,
            server_uuid: self.server.server_uuid.clone(),
            written_at: now_secs(),
            snapshot,
            snapshots_done: self.snapshots_done.clone(),
            snapshots_pending: self.snapshots_pending.clone(),
            ddl_pending: self.ddl_pending.clone(),
            generation: self.generation,
            typed_columns: self.typed_columns(),
            unknown: Default::default(),
        }
    }

    /// The columns the binlog logs as another type, per table, from the schemas last published
    /// (and those restored at start that no schema has replaced since).
    fn typed_columns(&self) -> BTreeMap<String, BTreeMap<String, String>> {
        let mut out: BTreeMap<String, BTreeMap<String, String>> = BTreeMap::new();
        let mut add = |s: &v1::TableSchema| {
            let cols: BTreeMap<String, String> = s
                .columns
                .iter()
                .filter(|c| crate::mysql::schema::logged_as_another(c.r#type()))
                .map(|c| (c.name.clone(), c.r#type().as_str_name().to_string()))
                .collect();
            let key = format!("{}.{}", s.database, s.table);
            if cols.is_empty() {
                out.remove(&key);
            } else {
                out.insert(key, cols);
            }
        };
        for s in self.typed_restored.values() {
            add(s);
        }
        for s in self.last_schema.values() {
            add(s);
        }
        out
    }

    /// The GTID set read so far, as text (empty: not known).
    pub(super) fn gtid_text(&self) -> String {
        self.gtid_set
            .as_ref()
            .map(ToString::to_string)
            .unwrap_or_default()
    }

    /// The position of an event (`pos`, the `row`th row) in the file being read, with the
    /// transaction's GTID.
    pub(super) fn position(&self, pos: u64, row: u32) -> v1::Position {
        binlog_position(&self.file, pos, row, self.gtid())
    }

    /// The GTID of the transaction being read (empty: none, or the server writes none).
    fn gtid(&self) -> &str {
        self.tx.as_ref().map_or("", |t| t.gtid.as_str())
    }

    /// The event every change capture-mysql publishes begins as: `op` of `db.table` at `pos`
    /// in the file being read, in the transaction being read, committed at `commit_micros`
    /// (µs), versioned as its first row. The caller adds what its kind carries: the schema, key
    /// and images, or the statement; the transaction's place ([`Self::transaction`]).
    pub(super) fn event(
        &self,
        op: v1::Op,
        (db, table): (&str, &str),
        pos: u64,
        commit_micros: i64,
    ) -> Result<v1::ChangeEvent, sluice_proto::ContractError> {
        let at = (self.file.as_str(), pos, self.generation, self.gtid());
        self.event_at(op, (db, table), at, commit_micros)
    }

    /// [`Self::event`] at `pos` of another `file`, read in binlog `generation`, in the
    /// transaction `gtid`: a statement read earlier and published now.
    pub(super) fn event_at(
        &self,
        op: v1::Op,
        (db, table): (&str, &str),
        (file, pos, generation, gtid): (&str, u64, u8, &str),
        commit_micros: i64,
    ) -> Result<v1::ChangeEvent, sluice_proto::ContractError> {
        Ok(v1::ChangeEvent {
            contract: sluice_proto::CONTRACT_VERSION,
            source: Some(self.source.clone()),
            op: op as i32,
            database: db.to_string(),
            table: table.to_string(),
            version: sluice_proto::mysql_version_in(generation, file, pos, 0)?,
            position: Some(binlog_position(file, pos, 0, gtid)),
            commit_time_micros: commit_micros,
            capture_time_micros: now_micros(),
            ..Default::default()
        })
    }

    /// The place of an event in the transaction being read: its first, and whether it is the
    /// last.
    pub(super) fn transaction(&self, last: bool) -> Option<v1::Transaction> {
        self.tx.as_ref().map(|t| v1::Transaction {
            id: t.id.clone(),
            index: 0,
            last,
        })
    }

    /// While idle (the server sent a heartbeat): a heartbeat event with the position reached
    /// (`publish.heartbeat_interval_ms`).
    pub(super) async fn heartbeat(&mut self) -> Result<(), CaptureError> {
        let (version, position) = (self.stream_version(), self.position(self.read_to, 0));
        self.publisher
            .heartbeat(&self.config.topics.prefix, &self.source, version, position)
            .await?;
        Ok(())
    }

    /// The stream's position as a version: every event read so far is below it.
    pub(super) fn stream_version(&self) -> u64 {
        u64::from(self.generation) << 56 | self.stream_pos()
    }

    /// The stream's position in this server's binlog (`file number << 32 | offset`, without
    /// the generation), to compare with positions the server reports.
    pub(super) fn stream_pos(&self) -> u64 {
        let seq = sluice_proto::binlog_file_seq(&self.file).unwrap_or(0);
        seq << 32 | self.read_to
    }

    /// The version of row `row` of the event at `pos` of `file`, in this capture's generation.
    pub(super) fn version_at(
        &self,
        file: &str,
        pos: u64,
        row: u32,
    ) -> Result<u64, sluice_proto::ContractError> {
        sluice_proto::mysql_version_in(self.generation, file, pos, row)
    }

    /// `a` comes before `b` in the binlog.
    pub(super) fn before_pos(&self, a: &BinlogPos, b: &BinlogPos) -> bool {
        let seq = |f: &str| sluice_proto::binlog_file_seq(f).unwrap_or(0);
        (seq(&a.file), a.pos) < (seq(&b.file), b.pos)
    }

    /// The stream has not read up to `p` yet.
    pub(super) fn before(&self, p: &BinlogPos) -> bool {
        let seq = |f: &str| sluice_proto::binlog_file_seq(f).unwrap_or(0);
        (seq(&self.file), self.read_to) < (seq(&p.file), p.pos)
    }
}

/// A binlog position: `file:pos`, the `row`th row there, in the transaction `gtid`.
fn binlog_position(file: &str, pos: u64, row: u32, gtid: &str) -> v1::Position {
    v1::Position {
        kind: Some(v1::position::Kind::Binlog(v1::BinlogPosition {
            file: file.to_string(),
            pos,
            commit_pos: 0,
            gtid: gtid.to_string(),
            gtid_set: String::new(),
            row,
        })),
    }
}
