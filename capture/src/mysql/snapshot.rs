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
//! exact on MariaDB, whose snapshot reports P; on MySQL P is read with `SHOW MASTER STATUS`
//! right after the snapshot begins (see docs/capture-mysql.md).

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::time::Instant;

use mysql_async::prelude::Queryable;
use mysql_async::{Pool, Value as My};
use prost::Message;
use serde::{Deserialize, Serialize};
use sluice_proto::v1::{self, value::Kind, ColumnType, TableSchema};
use tokio::sync::mpsc;

use super::charset;
use super::position::BinlogPos;

pub use crate::snapshot::{split_name, SnapshotConfig, SnapshotMetrics, INITIAL};

/// Snapshot progress, stored in the checkpoint.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapshotProgress {
    /// `initial` or the re-snapshot's `request_id`.
    pub id: String,
    /// `database.table` -> progress, for every table of this snapshot.
    pub tables: BTreeMap<String, TableProgress>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TableProgress {
    /// The last key published, a protobuf `Row` in hex; empty before the first chunk.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub after: String,
    pub rows: u64,
    #[serde(default)]
    pub done: bool,
}

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
    Failed {
        chunk: u64,
        error: String,
        transient: bool,
    },
}

/// A chunk asked for and not yet published.
pub struct InFlight {
    pub chunk: u64,
    /// Stream position (version) when the chunk was asked for.
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
    }
}

pub fn encode_key(key: &[v1::Value]) -> String {
    let row = v1::Row {
        values: key.to_vec(),
    };
    row.encode_to_vec()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

pub fn decode_key(hex: &str) -> Result<Vec<v1::Value>, String> {
    if hex.is_empty() {
        return Ok(Vec::new());
    }
    let bytes = (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(hex.get(i..i + 2).unwrap_or("zz"), 16))
        .collect::<Result<Vec<u8>, _>>()
        .map_err(|e| format!("snapshot key {hex:?}: {e}"))?;
    v1::Row::decode(bytes.as_slice())
        .map(|r| r.values)
        .map_err(|e| format!("snapshot key {hex:?}: {e}"))
}

fn quote(name: &str) -> String {
    format!("`{}`", name.replace('`', "``"))
}

/// The `SELECT` list: ENUM and SET as their numbers (index, bitmap), the rest as stored.
fn select_list(schema: &TableSchema) -> String {
    schema
        .columns
        .iter()
        .map(|c| match c.r#type() {
            ColumnType::Enum | ColumnType::Set => format!("{}+0", quote(&c.name)),
            _ => quote(&c.name),
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// `WHERE` for the rows after `after` in key order: `a > ? OR (a = ? AND b > ?) ...`.
fn after_clause(schema: &TableSchema, after: &[v1::Value]) -> (String, Vec<My>) {
    let names: Vec<String> = schema
        .primary_key
        .iter()
        .map(|i| quote(&schema.columns[*i as usize].name))
        .collect();
    let mut ors = Vec::new();
    let mut params = Vec::new();
    for i in 0..names.len() {
        let mut ands = Vec::new();
        for (j, name) in names.iter().enumerate().take(i) {
            ands.push(format!("{name} = ?"));
            params.push(to_param(&after[j]));
        }
        ands.push(format!("{} > ?", names[i]));
        params.push(to_param(&after[i]));
        ors.push(format!("({})", ands.join(" AND ")));
    }
    (ors.join(" OR "), params)
}

/// A key value back to a statement parameter, compared by the server in the column's type
/// and collation.
fn to_param(v: &v1::Value) -> My {
    match &v.kind {
        None | Some(Kind::Null(_)) => My::NULL,
        Some(Kind::Int(i)) => My::Int(*i),
        Some(Kind::Uint(u)) | Some(Kind::Bits(u)) => My::UInt(*u),
        Some(Kind::Float32(f)) => My::Float(*f),
        Some(Kind::Float64(f)) => My::Double(*f),
        Some(Kind::Decimal(s)) | Some(Kind::Text(s)) | Some(Kind::Json(s)) => {
            My::Bytes(s.clone().into_bytes())
        }
        Some(Kind::Bytes(b)) => My::Bytes(b.clone()),
        Some(Kind::EnumValue(e)) => My::UInt(u64::from(e.index)),
        Some(Kind::SetValue(s)) => My::UInt(s.bits),
        Some(Kind::Date(d)) => My::Date(d.year as u16, d.month as u8, d.day as u8, 0, 0, 0, 0),
        Some(Kind::Datetime(d)) => My::Date(
            d.year as u16,
            d.month as u8,
            d.day as u8,
            d.hour as u8,
            d.minute as u8,
            d.second as u8,
            d.micros,
        ),
        Some(Kind::TimeMicros(t)) => {
            let neg = *t < 0;
            let a = t.unsigned_abs();
            let secs = a / 1_000_000;
            My::Time(
                neg,
                (secs / 86_400) as u32,
                (secs / 3600 % 24) as u8,
                (secs / 60 % 60) as u8,
                (secs % 60) as u8,
                (a % 1_000_000) as u32,
            )
        }
        Some(Kind::TimestampMicros(t)) => {
            if *t == 0 {
                My::Date(0, 0, 0, 0, 0, 0, 0)
            } else {
                let secs = t.div_euclid(1_000_000);
                let (y, m, d, hh, mm, ss) = civil_from_epoch(secs);
                My::Date(y as u16, m, d, hh, mm, ss, t.rem_euclid(1_000_000) as u32)
            }
        }
        Some(Kind::Geometry(_) | Kind::Bson(_) | Kind::RawText(_)) => My::NULL,
    }
}

fn civil_from_epoch(secs: i64) -> (i64, u8, u8, u8, u8, u8) {
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u8;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u8;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (
        y,
        m,
        d,
        (rem / 3600) as u8,
        (rem / 60 % 60) as u8,
        (rem % 60) as u8,
    )
}

fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

fn int_of(v: &My) -> Option<i128> {
    match v {
        My::Int(i) => Some(i128::from(*i)),
        My::UInt(u) => Some(i128::from(*u)),
        My::Bytes(b) => std::str::from_utf8(b).ok()?.trim().parse().ok(),
        My::Float(f) => Some(*f as i128),
        My::Double(f) => Some(*f as i128),
        _ => None,
    }
}

/// One value of a `SELECT` (binary protocol, results in the column's own bytes, time zone
/// UTC) as the binlog decoder would have produced it.
pub fn to_value(col: &v1::Column, v: My) -> Result<v1::Value, String> {
    use ColumnType as T;
    let bad = |v: &My| format!("column {}: unexpected value {v:?}", col.name);
    let kind = match (col.r#type(), v) {
        (_, My::NULL) => Kind::Null(true),
        (T::Tinyint | T::Smallint | T::Mediumint | T::Int | T::Bigint | T::Year, v) => {
            let i = int_of(&v).ok_or_else(|| bad(&v))?;
            if col.unsigned {
                Kind::Uint(u64::try_from(i).map_err(|_| bad(&v))?)
            } else {
                Kind::Int(i64::try_from(i).map_err(|_| bad(&v))?)
            }
        }
        (T::Float, My::Float(f)) => Kind::Float32(f),
        (T::Float, My::Double(f)) => Kind::Float32(f as f32),
        (T::Double, My::Double(f)) => Kind::Float64(f),
        (T::Double, My::Float(f)) => Kind::Float64(f64::from(f)),
        (T::Decimal, My::Bytes(b)) => {
            Kind::Decimal(String::from_utf8(b).map_err(|e| format!("{}: {e}", col.name))?)
        }
        (T::Bit, My::Bytes(b)) => Kind::Bits(b.iter().fold(0u64, |a, x| a << 8 | u64::from(*x))),
        (T::Bit, v) => Kind::Bits(int_of(&v).ok_or_else(|| bad(&v))? as u64),
        (T::Enum, v) => {
            let index = int_of(&v).ok_or_else(|| bad(&v))? as u32;
            let label =
                match index {
                    0 => String::new(),
                    i => col.members.get(i as usize - 1).cloned().ok_or_else(|| {
                        format!("{}: ENUM index {i} beyond the members", col.name)
                    })?,
                };
            Kind::EnumValue(v1::EnumValue { index, label })
        }
        (T::Set, v) => {
            let bits = int_of(&v).ok_or_else(|| bad(&v))? as u64;
            let members = (0..64)
                .filter(|i| bits & (1u64 << i) != 0)
                .map(|i| {
                    col.members
                        .get(i)
                        .cloned()
                        .ok_or_else(|| format!("{}: SET bit {i} beyond the members", col.name))
                })
                .collect::<Result<_, _>>()?;
            Kind::SetValue(v1::SetValue { bits, members })
        }
        (T::Date, My::Date(y, m, d, ..)) => Kind::Date(v1::Date {
            year: i32::from(y),
            month: u32::from(m),
            day: u32::from(d),
        }),
        (T::Datetime, My::Date(y, m, d, hh, mm, ss, us)) => Kind::Datetime(v1::DateTime {
            year: i32::from(y),
            month: u32::from(m),
            day: u32::from(d),
            hour: u32::from(hh),
            minute: u32::from(mm),
            second: u32::from(ss),
            micros: us,
        }),
        (T::Timestamp, My::Date(y, m, d, hh, mm, ss, us)) => {
            if y == 0 && m == 0 && d == 0 {
                Kind::TimestampMicros(0)
            } else {
                let days = days_from_civil(i64::from(y), i64::from(m), i64::from(d));
                let secs =
                    days * 86_400 + i64::from(hh) * 3600 + i64::from(mm) * 60 + i64::from(ss);
                Kind::TimestampMicros(secs * 1_000_000 + i64::from(us))
            }
        }
        (T::Time, My::Time(neg, days, hh, mm, ss, us)) => {
            let secs =
                ((i64::from(days) * 24 + i64::from(hh)) * 60 + i64::from(mm)) * 60 + i64::from(ss);
            let micros = secs * 1_000_000 + i64::from(us);
            Kind::TimeMicros(if neg { -micros } else { micros })
        }
        (T::Json, My::Bytes(b)) => match String::from_utf8(b) {
            Ok(t) => Kind::Json(t),
            Err(e) => charset::to_text(e.into_bytes(), &col.charset),
        },
        (T::Geometry, My::Bytes(b)) => {
            if b.len() < 4 {
                return Err(format!("{}: GEOMETRY of {} bytes", col.name, b.len()));
            }
            Kind::Geometry(v1::Geometry {
                srid: u32::from_le_bytes(b[..4].try_into().expect("4 bytes")),
                wkb: b[4..].to_vec(),
            })
        }
        (T::Binary | T::Varbinary | T::Blob, My::Bytes(b)) => Kind::Bytes(b),
        (T::Char | T::Varchar | T::Text, My::Bytes(b)) => {
            if col.charset == "binary" {
                Kind::Bytes(b)
            } else {
                charset::to_text(b, &col.charset)
            }
        }
        (_, v) => return Err(bad(&v)),
    };
    Ok(v1::Value { kind: Some(kind) })
}

/// Settings of every snapshot connection: results as stored (no charset conversion), times
/// in UTC (TIMESTAMP values then read as what the binlog holds).
async fn prepare(conn: &mut mysql_async::Conn) -> Result<(), mysql_async::Error> {
    conn.query_drop("SET SESSION time_zone = '+00:00', character_set_results = binary")
        .await?;
    conn.query_drop("SET SESSION TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        .await
}

async fn begin_snapshot(
    conn: &mut mysql_async::Conn,
    mariadb: bool,
) -> Result<Option<BinlogPos>, mysql_async::Error> {
    conn.query_drop("START TRANSACTION WITH CONSISTENT SNAPSHOT")
        .await?;
    if mariadb {
        let rows: Vec<(String, String)> =
            conn.query("SHOW STATUS LIKE 'binlog_snapshot_%'").await?;
        let get = |n: &str| {
            rows.iter()
                .find(|(k, _)| k.eq_ignore_ascii_case(n))
                .map(|(_, v)| v.clone())
        };
        if let (Some(file), Some(pos)) =
            (get("Binlog_snapshot_file"), get("Binlog_snapshot_position"))
        {
            if let Ok(pos) = pos.parse() {
                return Ok(Some(BinlogPos { file, pos }));
            }
        }
    }
    Ok(None)
}

async fn master_position(
    conn: &mut mysql_async::Conn,
) -> Result<Option<BinlogPos>, mysql_async::Error> {
    let row: Option<mysql_async::Row> = conn.query_first("SHOW MASTER STATUS").await?;
    Ok(row.map(|r| BinlogPos {
        file: r.get(0).unwrap_or_default(),
        pos: r.get(1).unwrap_or(4),
    }))
}

fn transient(e: &mysql_async::Error) -> bool {
    match e {
        mysql_async::Error::Io(_) => true,
        mysql_async::Error::Driver(_) => true,
        mysql_async::Error::Server(s) => matches!(s.code, 1053 | 2013 | 2006 | 1205 | 1213),
        _ => false,
    }
}

/// One chunk to read.
pub struct ChunkRequest {
    pub chunk: u64,
    pub database: String,
    pub table: String,
    /// The last key published; empty for the first chunk.
    pub after: Vec<v1::Value>,
    pub limit: u64,
    pub mariadb: bool,
}

/// Read one chunk of a keyed table (in a task), or a whole keyless table, and send it back.
pub async fn read_chunk(pool: Pool, tx: mpsc::Sender<Msg>, r: ChunkRequest) {
    let ChunkRequest {
        chunk,
        database,
        table,
        after,
        limit,
        mariadb,
    } = r;
    let result = read_inner(&pool, &tx, chunk, &database, &table, &after, limit, mariadb).await;
    if let Err((error, transient)) = result {
        let _ = tx
            .send(Msg::Failed {
                chunk,
                error: format!("snapshot of {database}.{table}: {error}"),
                transient,
            })
            .await;
    }
}

#[allow(clippy::too_many_arguments)]
async fn read_inner(
    pool: &Pool,
    tx: &mpsc::Sender<Msg>,
    chunk: u64,
    database: &str,
    table: &str,
    after: &[v1::Value],
    limit: u64,
    mariadb: bool,
) -> Result<(), (String, bool)> {
    let my = |e: mysql_async::Error| {
        let t = transient(&e);
        (e.to_string(), t)
    };
    let mut conn = pool.get_conn().await.map_err(my)?;
    prepare(&mut conn).await.map_err(my)?;
    let mut at = begin_snapshot(&mut conn, mariadb).await.map_err(my)?;
    // Inside the transaction: the statement below holds the table's metadata lock, so the
    // schema read here is the one it sees (checked against the result's columns).
    let schema = super::schema::load(&mut conn, database, table)
        .await
        .map_err(my)?
        .ok_or_else(|| (format!("{database}.{table} no longer exists"), false))?;
    let list = select_list(&schema);
    let from = format!("{}.{}", quote(database), quote(table));
    let keyed = !schema.primary_key.is_empty();
    let channel_gone = || ("the capture stopped".to_string(), false);
    let columns_match = |cols: &[mysql_async::Column]| -> Result<(), (String, bool)> {
        if cols.len() != schema.columns.len() {
            return Err((
                format!(
                    "the table changed while it was read ({} columns, {} expected); retrying",
                    cols.len(),
                    schema.columns.len()
                ),
                true,
            ));
        }
        Ok(())
    };
    if keyed {
        let order: Vec<String> = schema
            .primary_key
            .iter()
            .map(|i| quote(&schema.columns[*i as usize].name))
            .collect();
        let (clause, params) = if after.is_empty() {
            (String::new(), Vec::new())
        } else {
            let (c, p) = after_clause(&schema, after);
            (format!(" WHERE {c}"), p)
        };
        let sql = format!(
            "SELECT {list} FROM {from}{clause} ORDER BY {} LIMIT {limit}",
            order.join(", ")
        );
        let mut result = conn
            .exec_iter(sql, mysql_async::Params::Positional(params))
            .await
            .map_err(my)?;
        columns_match(result.columns_ref())?;
        let mut rows = Vec::with_capacity(limit.min(100_000) as usize);
        while let Some(row) = result.next().await.map_err(my)? {
            rows.push(row_of(&schema, row).map_err(|e| (e, false))?);
        }
        drop(result);
        conn.query_drop("COMMIT").await.map_err(my)?;
        tx.send(Msg::Chunk {
            chunk,
            schema,
            rows,
            at,
        })
        .await
        .map_err(|_| channel_gone())?;
        return Ok(());
    }
    if at.is_none() {
        at = master_position(&mut conn).await.map_err(my)?;
    }
    let at = at.ok_or_else(|| ("binary logging is off".to_string(), false))?;
    tx.send(Msg::Began {
        chunk,
        schema: schema.clone(),
        at,
    })
    .await
    .map_err(|_| channel_gone())?;
    let mut result = conn
        .query_iter(format!("SELECT {list} FROM {from}"))
        .await
        .map_err(my)?;
    columns_match(result.columns_ref())?;
    let mut batch = Vec::with_capacity(1000);
    while let Some(row) = result.next().await.map_err(my)? {
        batch.push(row_of(&schema, row).map_err(|e| (e, false))?);
        if batch.len() == 1000 {
            tx.send(Msg::Batch {
                chunk,
                rows: std::mem::take(&mut batch),
            })
            .await
            .map_err(|_| channel_gone())?;
        }
    }
    drop(result);
    conn.query_drop("COMMIT").await.map_err(my)?;
    if !batch.is_empty() {
        tx.send(Msg::Batch { chunk, rows: batch })
            .await
            .map_err(|_| channel_gone())?;
    }
    tx.send(Msg::Ended { chunk })
        .await
        .map_err(|_| channel_gone())?;
    Ok(())
}

fn row_of(schema: &TableSchema, row: mysql_async::Row) -> Result<v1::Row, String> {
    let values = row.unwrap();
    let mut out = Vec::with_capacity(values.len());
    for (col, v) in schema.columns.iter().zip(values) {
        out.push(to_value(col, v)?);
    }
    Ok(v1::Row { values: out })
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

    #[test]
    fn civil_dates_round_trip() {
        for secs in [
            0i64,
            86_399,
            951_782_400,
            4_102_444_800,
            1_709_208_000 + 3723,
        ] {
            let (y, m, d, hh, mm, ss) = civil_from_epoch(secs);
            let back = days_from_civil(y, i64::from(m), i64::from(d)) * 86_400
                + i64::from(hh) * 3600
                + i64::from(mm) * 60
                + i64::from(ss);
            assert_eq!(back, secs);
        }
        assert_eq!(civil_from_epoch(1_709_208_000), (2024, 2, 29, 12, 0, 0));
    }

    #[test]
    fn the_after_clause_walks_a_composite_key_in_order() {
        let col = |n: &str| v1::Column {
            name: n.into(),
            r#type: ColumnType::Int as i32,
            ..Default::default()
        };
        let schema = TableSchema {
            columns: vec![col("a"), col("x"), col("b")],
            primary_key: vec![0, 2],
            ..Default::default()
        };
        let v = |i| v1::Value {
            kind: Some(Kind::Int(i)),
        };
        let (sql, params) = after_clause(&schema, &[v(1), v(2)]);
        assert_eq!(sql, "(`a` > ?) OR (`a` = ? AND `b` > ?)");
        assert_eq!(params, vec![My::Int(1), My::Int(1), My::Int(2)]);
    }

    #[test]
    fn enum_and_set_are_read_as_numbers() {
        let schema = TableSchema {
            columns: vec![
                v1::Column {
                    name: "e".into(),
                    r#type: ColumnType::Enum as i32,
                    members: vec!["a".into(), "b".into()],
                    ..Default::default()
                },
                v1::Column {
                    name: "s`x".into(),
                    r#type: ColumnType::Set as i32,
                    members: vec!["a".into(), "b".into()],
                    ..Default::default()
                },
            ],
            ..Default::default()
        };
        assert_eq!(select_list(&schema), "`e`+0, `s``x`+0");
        let e = to_value(&schema.columns[0], My::Int(2)).unwrap();
        assert_eq!(
            e.kind,
            Some(Kind::EnumValue(v1::EnumValue {
                index: 2,
                label: "b".into()
            }))
        );
        let s = to_value(&schema.columns[1], My::Bytes(b"3".to_vec())).unwrap();
        assert_eq!(
            s.kind,
            Some(Kind::SetValue(v1::SetValue {
                bits: 3,
                members: vec!["a".into(), "b".into()]
            }))
        );
        assert!(to_value(&schema.columns[0], My::Int(3)).is_err());
    }
}
