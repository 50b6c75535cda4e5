//! Snapshots: the current rows of tables, read in primary-key chunks while the binlog keeps
//! flowing, reconciled with the stream so that no row is ever published stale after a change.
//!
//! How one chunk of a table with a primary key goes (the watermark idea of Netflix's DBLog,
//! without writes to the source):
//! 1. The stream loop asks for the chunk at its read position S. From then on it notes the key
//!    of every row event of that table it reads ("touched" keys).
//! 2. A reader task opens `START TRANSACTION WITH CONSISTENT SNAPSHOT` (MariaDB reports the
//!    binlog position P the snapshot is consistent with; P >= S since the stream cannot read
//!    past the server), reads the table's schema and `SELECT`s the next `chunk_rows` rows after
//!    the last key, in key order, and commits.
//! 3. Once the stream has read up to P (a capture behind the server catches up first), between
//!    two of its transactions, the loop publishes the chunk's rows as `SNAPSHOT_READ` events,
//!    leaving out every touched key: the stream itself published a change of those rows after
//!    S, with its full after image, so the snapshot's copy is not needed and could be older.
//!    The other rows did not change between P and now: they are current. The events' version
//!    is the stream position at publication: above every event published before, below every
//!    one after. (MySQL reports no P; there the chunk is published when read: a capture far
//!    behind then publishes rows newer than the changes it has still to read, which replay
//!    over them and converge to the same end state.)
//! 4. The checkpoint written after that carries the chunk's last key: a capture killed in the
//!    middle of a snapshot goes on from the last published chunk.
//!
//! Tables without a primary key cannot be reconciled key by key. They are read whole in one
//! consistent snapshot, and the stream is held at its position P while the rows are published:
//! exact on MariaDB, whose snapshot reports P; on MySQL P is read with `SHOW MASTER STATUS` (or
//! `SHOW BINARY LOG STATUS`) right after the snapshot begins (see docs/capture-mysql.md).
//!
//! This module holds a run's state (its tables, the chunk of each in flight, the progress the
//! checkpoints carry) and the keys kept in the checkpoint; `reader` the reader tasks (the
//! consistent-snapshot transactions and their `SELECT`s); `values` the `SELECT` values as the
//! contract's values, exactly as the binlog decoder makes them.

mod reader;
mod values;

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Instant;

use mysql_async::prelude::Queryable;
use mysql_async::Pool;
use prost::Message;
use sluice_proto::v1::{self, TableSchema};
use tokio::sync::mpsc;

use super::position::BinlogPos;
use crate::error::CaptureError;
use crate::snapshot::{
    split_name, SnapshotConfig, SnapshotMetrics, SnapshotProgress, TableProgress,
};

pub use reader::{begin_snapshot, read_chunk, ChunkRequest};
pub use values::to_value;

/// What a reader task sends back to the stream loop.
pub enum Msg {
    /// A keyed chunk, whole.
    Chunk {
        chunk: u64,
        schema: TableSchema,
        rows: Vec<v1::Row>,
        /// Where the snapshot was consistent (MariaDB), for the sanity check P >= S.
        at: Option<BinlogPos>,
    },
    /// A table without a primary key: its snapshot began at `at`; rows follow in batches.
    Began {
        chunk: u64,
        schema: TableSchema,
        at: BinlogPos,
    },
    Batch {
        chunk: u64,
        rows: Vec<v1::Row>,
    },
    Ended {
        chunk: u64,
    },
    /// The read failed: a transient failure is read again, any other stops the capture.
    Failed {
        chunk: u64,
        error: CaptureError,
    },
}

/// A chunk asked for and not yet published.
pub struct InFlight {
    pub chunk: u64,
    /// Stream position when the chunk was asked for (`file number << 32 | offset`, without
    /// the generation).
    pub asked_at: u64,
    /// Keys of this table the stream published since then.
    pub touched: HashSet<Vec<u8>>,
    /// The rows, once read (keyed tables), and where the read was consistent (MariaDB).
    pub ready: Option<(TableSchema, Vec<v1::Row>, Option<BinlogPos>)>,
    /// Keyless tables: the stream holds at this position while the rows are published.
    pub hold: Option<Option<BinlogPos>>,
    pub schema: Option<TableSchema>,
    /// Keyless tables: rows read, waiting for the stream to reach the hold.
    pub pending: Vec<v1::Row>,
    pub ended: bool,
}

/// One table of a snapshot run: its progress and the chunk in flight.
pub struct TableRun {
    pub database: String,
    pub table: String,
    pub name: String,
    pub key_prefix: Vec<u8>,
    pub progress: TableProgress,
    pub estimate: u64,
    pub in_flight: Option<InFlight>,
    pub started: Option<Instant>,
    pub rows_at_start: u64,
    pub last_log: Instant,
    /// Its chunks wait for a prepared XA transaction that changed it to end (said once).
    pub waiting_xa: bool,
}

/// One snapshot being taken: its tables and their readers.
pub struct SnapshotRun {
    pub id: String,
    pub tables: Vec<TableRun>,
    pub parallel: usize,
    pub chunk_rows: u64,
    pub pool: Pool,
    pub tx: mpsc::Sender<Msg>,
    pub rx: mpsc::Receiver<Msg>,
    pub next_chunk: u64,
    pub mariadb: bool,
    pub metrics: Arc<SnapshotMetrics>,
    /// Key prefixes of the tables with a chunk in flight: the keys the stream touches.
    watch: Vec<(Vec<u8>, usize)>,
    /// Something to do: a message arrived, a chunk ended, a DDL happened.
    pub dirty: bool,
    /// The progress as the checkpoints carry it, rebuilt when it changes (every checkpoint
    /// holds it, and one is queued per transaction).
    shared: Arc<SnapshotProgress>,
    /// A chunk read waits for the stream to reach this position.
    pub wait_for: Option<BinlogPos>,
}

impl SnapshotRun {
    pub fn new(
        id: String,
        tables: Vec<TableRun>,
        config: &SnapshotConfig,
        opts: &mysql_async::Opts,
        mariadb: bool,
        metrics: Arc<SnapshotMetrics>,
    ) -> Self {
        let pool_opts = mysql_async::PoolOpts::default().with_constraints(
            mysql_async::PoolConstraints::new(0, config.parallel_tables.max(1)).expect("0 <= max"),
        );
        let opts = mysql_async::OptsBuilder::from_opts(opts.clone()).pool_opts(pool_opts);
        let (tx, rx) = mpsc::channel(16);
        let mut run = Self {
            id,
            tables,
            parallel: config.parallel_tables,
            chunk_rows: config.chunk_rows,
            pool: Pool::new(opts),
            tx,
            rx,
            next_chunk: 1,
            mariadb,
            metrics,
            watch: Vec::new(),
            dirty: true,
            wait_for: None,
            shared: Arc::default(),
        };
        run.refresh_progress();
        run.update_metrics();
        run
    }

    /// The progress for a checkpoint (shared, not copied).
    pub fn progress(&self) -> Arc<SnapshotProgress> {
        self.shared.clone()
    }

    /// Rebuild the shared progress after a table's progress changed.
    pub fn refresh_progress(&mut self) {
        self.shared = Arc::new(SnapshotProgress {
            id: self.id.clone(),
            tables: self
                .tables
                .iter()
                .map(|t| (t.name.clone(), t.progress.clone()))
                .collect(),
        });
    }

    pub fn done(&self) -> bool {
        self.tables.iter().all(|t| t.progress.done)
    }

    /// The table reading `chunk`.
    pub fn table_of(&mut self, chunk: u64) -> Option<&mut TableRun> {
        self.tables
            .iter_mut()
            .find(|t| t.in_flight.as_ref().is_some_and(|f| f.chunk == chunk))
    }

    /// Where the stream must hold, if a keyless table is being published: `Some(None)` = hold
    /// now (the snapshot's position is not known yet), `Some(Some(p))` = read up to p.
    pub fn hold(&self) -> Option<Option<BinlogPos>> {
        self.tables
            .iter()
            .filter_map(|t| t.in_flight.as_ref()?.hold.clone())
            .next()
    }

    /// Note a key the stream published (a no-op unless the table has a chunk in flight).
    #[inline]
    pub fn touch(&mut self, key_prefix: &[u8], key: &[u8]) {
        for (prefix, i) in &self.watch {
            if prefix.as_slice() == key_prefix {
                if let Some(f) = self.tables[*i].in_flight.as_mut() {
                    f.touched.insert(key.to_vec());
                }
            }
        }
    }

    /// The table (by key prefix) is in this snapshot and not published yet.
    pub fn pending_table(&self, key_prefix: &[u8]) -> bool {
        self.tables
            .iter()
            .any(|t| !t.progress.done && t.key_prefix == key_prefix)
    }

    /// Rebuild the list of tables whose keys are watched (after chunks were asked or ended).
    pub fn refresh_watch(&mut self) {
        self.watch = self
            .tables
            .iter()
            .enumerate()
            .filter(|(_, t)| t.in_flight.is_some())
            .map(|(i, t)| (t.key_prefix.clone(), i))
            .collect();
        self.dirty = true;
    }

    /// A DDL statement on a table: its chunk in flight is read again (with the new schema);
    /// a dropped or renamed table's snapshot ends.
    pub fn on_ddl(&mut self, database: &str, table: &str, ends: bool) {
        for t in &mut self.tables {
            if t.database == database && t.table == table {
                if t.in_flight.take().is_some() {
                    tracing::info!(table = %t.name, "DDL during the snapshot: the chunk is read again");
                }
                if ends {
                    tracing::info!(table = %t.name, "dropped or renamed during the snapshot: its snapshot ends");
                    t.progress.done = true;
                }
            }
        }
        self.refresh_progress();
        self.refresh_watch();
    }

    pub fn update_metrics(&self) {
        let remaining = self.tables.iter().filter(|t| !t.progress.done).count();
        self.metrics.tables_remaining.set(remaining as i64);
        for t in &self.tables {
            self.metrics
                .estimated
                .with_label_values(&[&t.database, &t.table])
                .set(t.estimate.max(t.progress.rows) as i64);
        }
    }

    /// Log rows done / estimated, rate and ETA of a table, at most every 5 s (and at its end).
    pub fn log_progress(t: &mut TableRun, force: bool) {
        if !force && t.last_log.elapsed().as_secs() < 5 {
            return;
        }
        t.last_log = Instant::now();
        let secs = t.started.map(|s| s.elapsed().as_secs_f64()).unwrap_or(0.0);
        let done_now = t.progress.rows.saturating_sub(t.rows_at_start);
        let rate = if secs > 0.0 {
            done_now as f64 / secs
        } else {
            0.0
        };
        let estimate = t.estimate.max(t.progress.rows);
        let eta = if rate > 0.0 && !t.progress.done {
            format!(
                "{:.0}s",
                estimate.saturating_sub(t.progress.rows) as f64 / rate
            )
        } else {
            "-".into()
        };
        tracing::info!(
            table = %t.name,
            rows = t.progress.rows,
            estimated = estimate,
            rows_per_second = rate as u64,
            eta = %eta,
            done = t.progress.done,
            "snapshot progress"
        );
    }
}

/// The tables of a snapshot: every base table the filter wants (initial), or the listed ones.
pub async fn list_tables(
    conn: &mut mysql_async::Conn,
    wants: impl Fn(&str, &str) -> bool,
    only: &[String],
) -> Result<Vec<(String, String, u64)>, mysql_async::Error> {
    let rows: Vec<(String, String, Option<u64>)> = conn
        .query(
            "SELECT TABLE_SCHEMA, TABLE_NAME, TABLE_ROWS FROM information_schema.TABLES \
             WHERE TABLE_TYPE = 'BASE TABLE' ORDER BY TABLE_SCHEMA, TABLE_NAME",
        )
        .await?;
    Ok(rows
        .into_iter()
        .filter(|(db, t, _)| {
            wants(db, t)
                && (only.is_empty()
                    || only
                        .iter()
                        .any(|n| split_name(n) == Some((db.clone(), t.clone()))))
        })
        .map(|(db, t, n)| (db, t, n.unwrap_or(0)))
        .collect())
}

pub fn new_table_run(database: String, table: String, estimate: u64) -> TableRun {
    TableRun {
        name: format!("{database}.{table}"),
        key_prefix: sluice_proto::event_key_prefix(&database, &table),
        database,
        table,
        progress: TableProgress::default(),
        estimate,
        in_flight: None,
        started: None,
        rows_at_start: 0,
        last_log: Instant::now(),
        waiting_xa: false,
    }
}

/// A key (the primary-key values of a row) as the checkpoint keeps it: a protobuf `Row` in hex.
pub fn encode_key(key: &[v1::Value]) -> String {
    let row = v1::Row {
        values: key.to_vec(),
    };
    sluice_common::hex::encode(&row.encode_to_vec())
}

/// A key of the checkpoint back to its values; empty for none.
pub fn decode_key(hex: &str) -> Result<Vec<v1::Value>, String> {
    if hex.is_empty() {
        return Ok(Vec::new());
    }
    let bytes = sluice_common::hex::decode(hex).map_err(|e| format!("snapshot key: {e}"))?;
    v1::Row::decode(bytes.as_slice())
        .map(|r| r.values)
        .map_err(|e| format!("snapshot key {hex:?}: {e}"))
}

/// The primary-key values of a row (empty for keyless tables).
pub fn key_of(schema: &TableSchema, row: &v1::Row) -> Vec<v1::Value> {
    schema
        .primary_key
        .iter()
        .map(|i| row.values[*i as usize].clone())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_proto::v1::value::Kind;

    #[test]
    fn keys_round_trip_through_hex() {
        let key = vec![
            v1::Value {
                kind: Some(Kind::Int(-5)),
            },
            v1::Value {
                kind: Some(Kind::Text("é".into())),
            },
        ];
        assert_eq!(decode_key(&encode_key(&key)).unwrap(), key);
        assert_eq!(decode_key("").unwrap(), vec![]);
        assert!(decode_key("zz").is_err());
    }
}
