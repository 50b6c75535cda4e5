//! apply-clickhouse: change topics to ClickHouse tables, in batches, offsets after the write.
//!
//! Progress and resumption:
//! - Events are read from the consumer group's partitions and encoded straight into RowBinary,
//!   one buffer per target table. A batch closes when it reaches `batch.max_rows` or
//!   `batch.max_bytes`, or `batch.max_wait_ms` after its first event; then every table's buffer
//!   is written with one INSERT each, and only when ClickHouse has acknowledged all of them are
//!   the partitions' offsets stored (and committed by the consumer, every second and at stop).
//! - A crash between the INSERT and the commit re-reads the batch. Replays are harmless: mirror
//!   tables are ReplacingMergeTree on the primary key with the event version, change-log tables
//!   are ReplacingMergeTree on (key, version); on servers with `insert_deduplication_token`
//!   the repeated INSERT is also dropped at once.
//! - ClickHouse unreachable or failing: the same batch is retried with backoff (0.5 s to 30 s)
//!   while nothing more is read, so memory stays bounded by one batch.
//! - An event that can never be written (not a change event, an unknown schema, a value the
//!   column cannot hold) goes to the dead-letter topic with the reason (or stops the process,
//!   with `errors.on_bad_event = "stop"`); the rest flows on.
//! - Before partitions are revoked (rebalance), the batch in hand is written and its offsets
//!   committed from the revoke callback; SIGTERM does the same and exits.
//! - A DDL event is applied in order with the rows of its partition: the batch so far is
//!   written first. ADD and DROP COLUMN are applied to the target; a DDL that fails stops that
//!   table (its later events are dead-lettered with the statement named), not the pipeline.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use prometheus::{Histogram, HistogramOpts, IntCounterVec, Opts, Registry};
use prost::Message as _;
use rdkafka::consumer::{Consumer, StreamConsumer};
use rdkafka::message::BorrowedMessage;
use rdkafka::Message;
use sluice_common::Shutdown;
use sluice_proto::v1::{Column, Op, TableSchema};
use sluice_proto::view::{self, RowEvent, ValueRef};
use sluice_proto::ChangeEvent;

use super::rowbinary::encode;
use super::types::{map_column, ChType, Features};
use super::{Config, Mode, OnBadEvent};
use crate::group::{
    block_on, BatchSink, DeadLetters, Drain, GroupContext, GroupMetrics, Offsets,
    DEAD_LETTER_MAX_BYTES,
};
use crate::schemas::SchemaCache;

#[derive(Debug, thiserror::Error)]
pub enum ApplyError {
    #[error("Kafka: {0}")]
    Kafka(#[from] rdkafka::error::KafkaError),
    #[error("ClickHouse: {0}")]
    ClickHouse(String),
    #[error("{0}")]
    Definite(String),
}

#[derive(Clone)]
struct Metrics {
    rows: IntCounterVec,
    batch_rows: Histogram,
    batch_seconds: Histogram,
    retries: prometheus::IntCounter,
    dead_letters: IntCounterVec,
    latency: Histogram,
    group: GroupMetrics,
}

impl Metrics {
    fn new(r: &Registry) -> prometheus::Result<Self> {
        let rows = IntCounterVec::new(
            Opts::new(
                "sluice_apply_rows_total",
                "Rows written to ClickHouse, by target table.",
            ),
            &["table"],
        )?;
        let batch_rows = Histogram::with_opts(
            HistogramOpts::new("sluice_apply_batch_rows", "Rows per written batch.")
                .buckets(vec![1.0, 10.0, 100.0, 1e3, 1e4, 5e4, 1e5, 2e5, 5e5, 1e6]),
        )?;
        let batch_seconds = Histogram::with_opts(HistogramOpts::new(
            "sluice_apply_batch_duration_seconds",
            "Time to write one batch (every table's INSERT), retries included.",
        ))?;
        let retries = prometheus::IntCounter::new(
            "sluice_apply_retries_total",
            "Statements retried because ClickHouse did not answer: INSERTs, and the lookups and changes of target tables.",
        )?;
        let dead_letters = IntCounterVec::new(
            Opts::new(
                "sluice_apply_dead_letters_total",
                "Events sent to the dead-letter topic, by reason.",
            ),
            &["reason"],
        )?;
        let latency = Histogram::with_opts(
            HistogramOpts::new(
                "sluice_apply_end_to_end_latency_seconds",
                "Source commit to the batch acknowledged by ClickHouse.",
            )
            .buckets(vec![
                0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 300.0,
            ]),
        )?;
        r.register(Box::new(rows.clone()))?;
        r.register(Box::new(batch_rows.clone()))?;
        r.register(Box::new(batch_seconds.clone()))?;
        r.register(Box::new(retries.clone()))?;
        r.register(Box::new(dead_letters.clone()))?;
        r.register(Box::new(latency.clone()))?;
        Ok(Self {
            rows,
            batch_rows,
            batch_seconds,
            retries,
            dead_letters,
            latency,
            group: GroupMetrics::new(r)?,
        })
    }
}

/// Writes the batch in hand before partitions are let go (see [`crate::group`]).
pub(crate) struct ChDrain {
    batch: Arc<Mutex<Batch>>,
    in_flight: Arc<Mutex<InFlight>>,
    writer: Writer,
    runtime: tokio::runtime::Handle,
}

/// The batch being written while the next one is gathered: at most one. Its offsets are
/// stored once it is written, before any later batch's.
#[derive(Default)]
struct InFlight {
    task: Option<tokio::task::JoinHandle<Result<Offsets, ApplyError>>>,
    /// A write that failed where the sink did not see it (in the rebalance callback): the sink
    /// stops instead of storing later offsets past it.
    failed: Option<String>,
}

type Context = GroupContext<ChDrain>;

impl Drain for ChDrain {
    /// If the write fails, nothing is stored: the next owner reads those events again
    /// (harmless).
    fn drain(&self) -> Option<Offsets> {
        // First the batch being written: its offsets come before the batch in hand's.
        let task = self.in_flight.lock().expect("in-flight lock").task.take();
        let mut offsets = Offsets::default();
        if let Some(task) = task {
            match block_on(&self.runtime, task) {
                Ok(Ok(o)) => offsets = o,
                failed => {
                    let why = match failed {
                        Ok(Err(e)) => e.to_string(),
                        Err(e) => format!("the write task ended: {e}"),
                        Ok(Ok(_)) => unreachable!(),
                    };
                    tracing::warn!(error = %why, "the batch being written failed; its partitions' next owner reads it again");
                    self.in_flight.lock().expect("in-flight lock").failed = Some(why);
                    return None;
                }
            }
        }
        let taken = std::mem::take(&mut *self.batch.lock().expect("batch lock"));
        if taken.offsets.is_empty() {
            return (!offsets.is_empty()).then_some(offsets);
        }
        let write = async {
            for (name, tb) in &taken.tables {
                self.writer.insert_once(name, tb).await?;
            }
            Ok::<(), clickhouse::error::Error>(())
        };
        match block_on(&self.runtime, write) {
            Ok(()) => {
                tracing::info!(
                    rows = taken.rows,
                    "wrote the batch in hand before letting partitions go"
                );
                offsets.merge(taken.offsets);
                Some(offsets)
            }
            Err(e) => {
                tracing::warn!(error = %e, rows = taken.rows,
                    "could not write the batch in hand before letting partitions go; their next owner reads it again");
                None
            }
        }
    }
}

/// Writes one table's part of a batch: one INSERT. Shared by the sink and the rebalance
/// callback (which writes the batch in hand before partitions are let go).
#[derive(Clone)]
struct Writer {
    client: clickhouse::Client,
    database: String,
    dedup_token: bool,
    rows: IntCounterVec,
}

impl Writer {
    async fn insert_once(
        &self,
        name: &str,
        tb: &TableBatch,
    ) -> Result<(), clickhouse::error::Error> {
        let sql = format!(
            "INSERT INTO {}.{} ({}) FORMAT RowBinary",
            quote(&self.database),
            quote(name),
            tb.columns
                .iter()
                .map(|c| quote(c))
                .collect::<Vec<_>>()
                .join(", ")
        );
        // The full pieces are shared, not copied; the one being filled is copied (at most about
        // a piece).
        let tail = Bytes::copy_from_slice(&tb.body);
        let pieces = tb.done.iter().chain(std::iter::once(&tail));
        let mut insert = self.client.insert_formatted_with(sql);
        if self.dedup_token {
            // Only servers that know the setting get a token (hashing the batch costs CPU).
            let (hash, len) = pieces
                .clone()
                .fold((FNV_START, 0usize), |(h, n), p| (fnv(h, p), n + p.len()));
            let token = format!("{hash:016x}-{len}");
            insert = insert.with_setting("insert_deduplication_token", token);
        }
        for piece in pieces {
            if !piece.is_empty() {
                insert.send(piece.clone()).await?;
            }
        }
        insert.end().await?;
        self.rows.with_label_values(&[name]).inc_by(tb.rows as u64);
        Ok(())
    }
}

/// What is known of a target table.
#[derive(Clone)]
struct Target {
    name: String,
    mode: Mode,
    /// Column name -> ClickHouse type, as the server has them.
    columns: BTreeMap<String, ChType>,
    /// Why the table is stopped (a DDL failed), if it is.
    stopped: Option<String>,
}

/// How the rows of one schema are written: worked out once per schema id.
struct Plan {
    target: String,
    mode: Mode,
    schema: std::sync::Arc<TableSchema>,
    /// Per source column, in schema order: the target type, or `None` if the target lacks it.
    types: Vec<Option<ChType>>,
    /// The bookkeeping columns' types, where the target has them.
    version: Option<ChType>,
    flag: Option<ChType>,
    /// The INSERT's column list.
    insert_columns: std::sync::Arc<Vec<String>>,
}

/// One table's part of a batch: the INSERT's column list and RowBinary rows, in pieces of
/// about [`PIECE`] bytes that each end at a row's end. A large batch never reallocates (and
/// copies) one buffer as it grows, and each piece is compressed and sent on its own, so the
/// INSERT holds no second copy of the batch.
struct TableBatch {
    columns: std::sync::Arc<Vec<String>>,
    /// Full pieces.
    done: Vec<Bytes>,
    /// The piece being filled.
    body: Vec<u8>,
    rows: usize,
}

const PIECE: usize = 1 << 20;

impl TableBatch {
    /// After a row: start a new piece once this one is full.
    fn row_done(&mut self) {
        if self.body.len() >= PIECE {
            // Later pieces are sized at once: this table's part is a large one.
            let next = Vec::with_capacity(PIECE + PIECE / 8);
            self.done
                .push(Bytes::from(std::mem::replace(&mut self.body, next)));
        }
    }
}

#[derive(Default)]
pub(crate) struct Batch {
    tables: BTreeMap<String, TableBatch>,
    /// The offsets stored once this batch is written.
    offsets: Offsets,
    rows: usize,
    bytes: usize,
    started: Option<Instant>,
    oldest_commit_micros: Option<i64>,
}

pub struct Sink {
    config: Config,
    client: clickhouse::Client,
    features: Features,
    consumer: Arc<StreamConsumer<Context>>,
    dead: DeadLetters,
    schemas: SchemaCache,
    targets: HashMap<String, Target>,
    plans: HashMap<u64, std::sync::Arc<Plan>>,
    /// Shared with the rebalance callback, which drains it before partitions go.
    batch: Arc<Mutex<Batch>>,
    /// The batch being written; shared with the rebalance callback too.
    in_flight: Arc<Mutex<InFlight>>,
    writer: Writer,
    metrics: Metrics,
    /// The run's shutdown, for waits outside a batch write (a target looked up or changed).
    shutdown: Shutdown,
}

/// Why an event was not taken.
enum Refusal {
    /// The event itself can never be written: it goes to the dead-letter topic (or stops the
    /// sink, as `errors.on_bad_event` says).
    Bad(String),
    /// The sink cannot go on (a batch not written, a shutdown while ClickHouse was away): it
    /// stops, and nothing after the last written batch is stored, so it is all read again.
    Stop(ApplyError),
}

impl From<String> for Refusal {
    fn from(reason: String) -> Self {
        Refusal::Bad(reason)
    }
}

impl From<ApplyError> for Refusal {
    fn from(e: ApplyError) -> Self {
        Refusal::Stop(e)
    }
}

fn now_micros() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros() as i64)
        .unwrap_or(0)
}

fn quote(name: &str) -> String {
    format!("`{}`", name.replace('\\', "\\\\").replace('`', "\\`"))
}

impl Sink {
    pub async fn start(config: Config, registry: &Registry) -> Result<Self, ApplyError> {
        let metrics = Metrics::new(registry).expect("metrics register once");
        let client = config.clickhouse.client();
        let version: String = client
            .query("SELECT version()")
            .fetch_one()
            .await
            .map_err(|e| ApplyError::ClickHouse(e.to_string()))?;
        let features = Features::of_version(&version);
        tracing::info!(%version, ?features, "ClickHouse");
        let mut cc = config
            .kafka
            .consumer_config("apply-clickhouse", &config.consumer.group_id);
        cc.set("statistics.interval.ms", "5000");
        let batch = Arc::new(Mutex::new(Batch::default()));
        let in_flight = Arc::new(Mutex::new(InFlight::default()));
        let writer = Writer {
            client: client.clone(),
            database: config.clickhouse.database.clone(),
            dedup_token: features.dedup_token,
            rows: metrics.rows.clone(),
        };
        let consumer: StreamConsumer<Context> = cc.create_with_context(GroupContext {
            metrics: metrics.group.clone(),
            drain: ChDrain {
                batch: batch.clone(),
                in_flight: in_flight.clone(),
                writer: writer.clone(),
                runtime: tokio::runtime::Handle::current(),
            },
        })?;
        let topics: Vec<&str> = config.consumer.topics.iter().map(String::as_str).collect();
        consumer.subscribe(&topics)?;
        let dead = DeadLetters::new(
            config
                .kafka
                .producer_config("apply-clickhouse")
                .set("message.max.bytes", DEAD_LETTER_MAX_BYTES.to_string())
                .clone(),
            &config.errors.dead_letter_topic,
        )?;
        config
            .kafka
            .ensure_topic(
                "apply-clickhouse",
                &config.errors.dead_letter_topic,
                1,
                -1,
                false,
                Some(DEAD_LETTER_MAX_BYTES),
            )
            .await
            .map_err(ApplyError::Definite)?;
        let mut schemas = SchemaCache::new(&config.kafka, &config.schema_topic, "apply-clickhouse");
        schemas.refresh().await?;
        Ok(Self {
            client,
            features,
            consumer: Arc::new(consumer),
            dead,
            schemas,
            targets: HashMap::new(),
            plans: HashMap::new(),
            batch,
            in_flight,
            writer,
            metrics,
            config,
            shutdown: Shutdown::new(),
        })
    }

    /// Consume until shutdown; then write what is held, commit, and return.
    pub async fn run(mut self, shutdown: Shutdown) -> Result<(), ApplyError> {
        self.shutdown = shutdown.clone();
        crate::group::run(&mut self, &shutdown).await
    }

    fn batch(&self) -> std::sync::MutexGuard<'_, Batch> {
        self.batch.lock().expect("batch lock")
    }

    fn full(&self) -> bool {
        let b = self.batch();
        b.rows >= self.config.batch.max_rows || b.bytes >= self.config.batch.max_bytes
    }

    async fn handle(
        &mut self,
        m: &BorrowedMessage<'_>,
        shutdown: &Shutdown,
    ) -> Result<(), ApplyError> {
        match self.apply_event(m, shutdown).await {
            Ok(()) => {}
            Err(Refusal::Bad(reason)) => self.dead_letter(m, &reason).await?,
            Err(Refusal::Stop(e)) => return Err(e),
        }
        // The event belongs to the batch in hand now (one that a DDL began, if it flushed).
        let mut batch = self.batch();
        batch.started.get_or_insert_with(Instant::now);
        batch.offsets.record(m);
        Ok(())
    }

    /// `Err(Refusal::Bad(reason))` means: this event can never be written.
    async fn apply_event(
        &mut self,
        m: &BorrowedMessage<'_>,
        shutdown: &Shutdown,
    ) -> Result<(), Refusal> {
        let payload = m.payload().unwrap_or_default();
        // Only what a row needs is decoded; a DDL event is decoded whole.
        let row = RowEvent::parse(payload).map_err(|e| format!("not a change event: {e}"))?;
        if row.contract > sluice_proto::CONTRACT_VERSION {
            return Err(Refusal::Bad(format!(
                "contract version {} is newer than this build's {}",
                row.contract,
                sluice_proto::CONTRACT_VERSION
            )));
        }
        match row.op() {
            Op::Ddl | Op::Truncate => {
                let event =
                    ChangeEvent::decode(payload).map_err(|e| format!("not a change event: {e}"))?;
                // Ordered with the rows of this partition: write what came before.
                self.flush(shutdown).await?;
                self.settle().await?;
                self.apply_ddl(&event).await?;
                Ok(())
            }
            Op::Insert | Op::Update | Op::Delete | Op::SnapshotRead => self.add_row(&row).await,
            _ => Ok(()), // heartbeats and transaction markers carry no rows
        }
    }

    async fn schema(&mut self, event: &RowEvent<'_>) -> Result<TableSchema, Refusal> {
        if let Some(s) = event.schema {
            let s = TableSchema::decode(s).map_err(|e| format!("not a change event: {e}"))?;
            self.schemas.remember(&s);
        }
        match self.schemas.get(event.schema_id).await {
            Ok(Some(s)) => Ok(s),
            Ok(None) => Err(Refusal::Bad(format!(
                "schema {} of {}.{} is not on the schema topic {}",
                sluice_proto::schema_record_key(event.schema_id),
                event.database,
                event.table,
                self.config.schema_topic
            ))),
            // Kafka failing, not the event: stop rather than dead-letter what is readable.
            Err(e) => Err(Refusal::Stop(ApplyError::Definite(format!(
                "reading the schema topic {}: {e}",
                self.config.schema_topic
            )))),
        }
    }

    fn target_name(&self, db: &str, table: &str) -> String {
        self.config
            .tables
            .name
            .replace("{db}", db)
            .replace("{table}", table)
    }

    /// The target of a source table: known, read from the server, or created.
    async fn target(&mut self, schema: &TableSchema) -> Result<Target, Refusal> {
        let name = self.target_name(&schema.database, &schema.table);
        if let Some(t) = self.targets.get(&name) {
            return Ok(t.clone());
        }
        let source = format!("{}.{}", schema.database, schema.table);
        let mut mode = self.config.tables.mode_of(&source);
        if mode == Mode::Mirror && schema.primary_key.is_empty() {
            tracing::warn!(table = %source, "no primary key: mirror mode impossible, writing a change log");
            mode = Mode::Changelog;
        }
        let mut columns = self.describe(&name).await?;
        if columns.is_empty() {
            if !self.config.tables.create {
                return Err(Refusal::Bad(format!(
                    "target table {}.{name} does not exist and tables.create is off",
                    self.config.clickhouse.database
                )));
            }
            self.create(&name, mode, schema).await?;
            columns = self.describe(&name).await?;
        }
        let t = Target {
            name: name.clone(),
            mode,
            columns,
            stopped: None,
        };
        self.targets.insert(name, t.clone());
        Ok(t)
    }

    /// Run a statement of the bookkeeping around writes (reading or changing a target) until
    /// ClickHouse answers: unreachable or overloaded, it is retried with backoff as INSERTs
    /// are; its answer, success or refusal, is returned. A shutdown during the wait stops the
    /// sink.
    async fn answered<T, F>(
        &self,
        what: &str,
        mut attempt: impl FnMut() -> F,
    ) -> Result<Result<T, clickhouse::error::Error>, ApplyError>
    where
        F: std::future::Future<Output = Result<T, clickhouse::error::Error>>,
    {
        let mut backoff = Duration::from_millis(500);
        loop {
            match attempt().await {
                Err(e) if !is_definite(&e) => {
                    self.metrics.retries.inc();
                    tracing::warn!(what, error = %e, retry_in = ?backoff, "ClickHouse did not answer; retrying");
                    if self.shutdown.is_triggered() {
                        return Err(ApplyError::ClickHouse(format!(
                            "stopping while {what} waits for ClickHouse (read again on restart): {e}"
                        )));
                    }
                    tokio::select! {
                        _ = self.shutdown.wait() => {}
                        _ = tokio::time::sleep(backoff) => {}
                    }
                    backoff = (backoff * 2).min(Duration::from_secs(30));
                }
                answer => return Ok(answer),
            }
        }
    }

    async fn describe(&self, name: &str) -> Result<BTreeMap<String, ChType>, Refusal> {
        #[derive(clickhouse::Row, serde::Deserialize)]
        struct Col {
            name: String,
            r#type: String,
        }
        let what = format!("reading the columns of {name}");
        let cols = self
            .answered(&what, || {
                self.client
                    .query("SELECT name, type FROM system.columns WHERE database = ? AND table = ?")
                    .bind(&self.config.clickhouse.database)
                    .bind(name)
                    .fetch_all::<Col>()
            })
            .await?
            // The server refusing to show its own columns: no event can be written.
            .map_err(|e| ApplyError::ClickHouse(format!("{what}: {e}")))?;
        let mut out = BTreeMap::new();
        for c in cols {
            // Columns of types this stage cannot write are simply not written (defaults).
            if let Ok(t) = ChType::parse(&c.r#type) {
                out.insert(c.name, t);
            }
        }
        Ok(out)
    }

    async fn create(&mut self, name: &str, mode: Mode, s: &TableSchema) -> Result<(), Refusal> {
        let m = &self.config.tables;
        let mut cols: Vec<String> = s
            .columns
            .iter()
            .map(|c| format!("{} {}", quote(&c.name), map_column(c, self.features).sql()))
            .collect();
        let key: Vec<String> = s
            .primary_key
            .iter()
            .map(|i| quote(&s.columns[*i as usize].name))
            .collect();
        let (engine, order) = match mode {
            Mode::Mirror => {
                cols.push(format!("{} UInt64", quote(&m.version_column)));
                cols.push(format!("{} UInt8", quote(&m.deleted_column)));
                (
                    format!("ReplacingMergeTree({})", quote(&m.version_column)),
                    key.join(", "),
                )
            }
            Mode::Changelog => {
                cols.push(format!("{} String", quote(&m.op_column)));
                cols.push(format!("{} UInt64", quote(&m.version_column)));
                let mut order = key.clone();
                order.push(quote(&m.version_column));
                order.push(quote(&m.op_column));
                ("ReplacingMergeTree".to_string(), order.join(", "))
            }
        };
        let sql = format!(
            "CREATE TABLE IF NOT EXISTS {}.{} ({}) ENGINE = {engine} ORDER BY ({order})",
            quote(&self.config.clickhouse.database),
            quote(name),
            cols.join(", ")
        );
        self.answered(&format!("creating {name}"), || {
            self.client.query(&sql).execute()
        })
        .await?
        .map_err(|e| format!("{sql}: {e}"))?;
        tracing::info!(table = name, ?mode, "created target table");
        Ok(())
    }

    /// Work out how rows of `event`'s schema are written: the target (created or extended as
    /// needed), and per column its target type.
    async fn plan(&mut self, event: &RowEvent<'_>) -> Result<std::sync::Arc<Plan>, Refusal> {
        let schema = self.schema(event).await?;
        let mut target = self.target(&schema).await?;
        if let Some(why) = &target.stopped {
            return Err(Refusal::Bad(format!(
                "table {} is stopped: {why}",
                target.name
            )));
        }
        // New source columns: add them to the target first.
        let missing: Vec<&Column> = schema
            .columns
            .iter()
            .filter(|c| !target.columns.contains_key(&c.name))
            .collect();
        if !missing.is_empty() && self.config.tables.create {
            self.flush_table(&target.name).await?;
            for c in missing {
                let t = map_column(c, self.features);
                let sql = format!(
                    "ALTER TABLE {}.{} ADD COLUMN {} {}",
                    quote(&self.config.clickhouse.database),
                    quote(&target.name),
                    quote(&c.name),
                    t.sql()
                );
                let what = format!("adding column {} to {}", c.name, target.name);
                match self
                    .answered(&what, || self.client.query(&sql).execute())
                    .await?
                {
                    Ok(()) => {
                        tracing::info!(table = %target.name, column = %c.name, "added column")
                    }
                    Err(e) if e.to_string().contains("already exists") => {}
                    Err(e) => return Err(Refusal::Bad(format!("{sql}: {e}"))),
                }
                target.columns.insert(c.name.clone(), t);
            }
            self.targets.insert(target.name.clone(), target.clone());
        }
        let m = &self.config.tables;
        let types: Vec<Option<ChType>> = schema
            .columns
            .iter()
            .map(|c| target.columns.get(&c.name).cloned())
            .collect();
        let mut insert_columns: Vec<String> = schema
            .columns
            .iter()
            .zip(&types)
            .filter(|(_, t)| t.is_some())
            .map(|(c, _)| c.name.clone())
            .collect();
        let version = target.columns.get(&m.version_column).cloned();
        if version.is_some() {
            insert_columns.push(m.version_column.clone());
        }
        let flag_name = match target.mode {
            Mode::Mirror => &m.deleted_column,
            Mode::Changelog => &m.op_column,
        };
        let flag = target.columns.get(flag_name).cloned();
        if flag.is_some() {
            insert_columns.push(flag_name.clone());
        }
        Ok(std::sync::Arc::new(Plan {
            target: target.name.clone(),
            mode: target.mode,
            schema: std::sync::Arc::new(schema),
            types,
            version,
            flag,
            insert_columns: std::sync::Arc::new(insert_columns),
        }))
    }

    /// Add the row of `event` (its image is read where it lies).
    async fn add_row(&mut self, event: &RowEvent<'_>) -> Result<(), Refusal> {
        let plan = match self.plans.get(&event.schema_id) {
            Some(p) => p.clone(),
            None => {
                let p = self.plan(event).await?;
                self.plans.insert(event.schema_id, p.clone());
                p
            }
        };
        let op = event.op();
        let image = match op {
            Op::Delete => event.before,
            _ => event.after,
        }
        .ok_or_else(|| format!("{op:?} event without its row image"))?;
        let schema = &plan.schema;
        // One INSERT per table per batch: a different column list (a schema change) closes
        // this table's part first.
        let mut guard = loop {
            {
                let guard = self.batch();
                let other_columns = guard.tables.get(&plan.target).is_some_and(|b| {
                    !std::sync::Arc::ptr_eq(&b.columns, &plan.insert_columns)
                        && *b.columns != *plan.insert_columns
                });
                if !other_columns {
                    break guard;
                }
            }
            self.flush_table(&plan.target).await?;
        };
        let batch = &mut *guard;
        let tb = match batch.tables.get_mut(&plan.target) {
            Some(tb) => tb,
            None => batch
                .tables
                .entry(plan.target.clone())
                .or_insert_with(|| TableBatch {
                    columns: plan.insert_columns.clone(),
                    done: Vec::new(),
                    body: Vec::with_capacity(1 << 16),
                    rows: 0,
                }),
        };
        // Encode straight into the table's buffer; a failing row is cut off again.
        let start = tb.body.len();
        let mut encode_row = || -> Result<(), String> {
            let mut n = 0;
            for v in view::values(image) {
                let v = v.map_err(|e| format!("not a change event: {e}"))?;
                let (Some(c), Some(t)) = (schema.columns.get(n), plan.types.get(n)) else {
                    return Err(format!(
                        "the row has more values than its schema's {} columns",
                        schema.columns.len()
                    ));
                };
                n += 1;
                if let Some(t) = t {
                    encode(v, c, t, &mut tb.body).map_err(|e| {
                        format!("{}.{} column {}: {e}", event.database, event.table, c.name)
                    })?;
                }
            }
            if n != schema.columns.len() {
                return Err(format!(
                    "the row has {n} values, its schema {} columns",
                    schema.columns.len()
                ));
            }
            let meta = Column::default();
            if let Some(t) = &plan.version {
                encode(ValueRef::Uint(event.version), &meta, t, &mut tb.body)
                    .map_err(|e| format!("version column: {e}"))?;
            }
            if let Some(t) = &plan.flag {
                let v = match plan.mode {
                    Mode::Mirror => ValueRef::Uint(u64::from(op == Op::Delete)),
                    Mode::Changelog => ValueRef::Text(op_name(op)),
                };
                encode(v, &meta, t, &mut tb.body).map_err(|e| format!("flag column: {e}"))?;
            }
            Ok(())
        };
        if let Err(e) = encode_row() {
            tb.body.truncate(start);
            return Err(Refusal::Bad(e));
        }
        let len = tb.body.len() - start;
        tb.rows += 1;
        tb.row_done();
        batch.rows += 1;
        batch.bytes += len;
        if event.commit_time_micros > 0 {
            let o = batch
                .oldest_commit_micros
                .get_or_insert(event.commit_time_micros);
            *o = (*o).min(event.commit_time_micros);
        }
        Ok(())
    }

    /// Apply a source DDL to its target. A statement ClickHouse refuses stops that table; an
    /// unreachable ClickHouse is waited for.
    async fn apply_ddl(&mut self, event: &ChangeEvent) -> Result<(), ApplyError> {
        let Some(ddl) = &event.ddl else {
            return Ok(());
        };
        // Target columns may change: plans are worked out again.
        self.plans.clear();
        let name = self.target_name(&event.database, &event.table);
        let statement = ddl.statement.clone();
        let result: Result<(), Refusal> = async {
            match ddl.kind.as_str() {
                "alter" => {
                    let Some(new) = &ddl.schema else { return Ok(()) };
                    self.schemas.remember(new);
                    let Some(target) = self.targets.get(&name).cloned() else {
                        return Ok(()); // made from the schema when its first row arrives
                    };
                    let wanted: HashSet<&str> = new.columns.iter().map(|c| c.name.as_str()).collect();
                    let m = &self.config.tables;
                    let keep: HashSet<&str> = [
                        m.version_column.as_str(),
                        m.deleted_column.as_str(),
                        m.op_column.as_str(),
                    ]
                    .into();
                    let mut target = target;
                    for col in target.columns.keys().cloned().collect::<Vec<_>>() {
                        if wanted.contains(col.as_str()) || keep.contains(col.as_str()) {
                            continue;
                        }
                        let sql = format!(
                            "ALTER TABLE {}.{} DROP COLUMN {}",
                            quote(&self.config.clickhouse.database),
                            quote(&name),
                            quote(&col)
                        );
                        let what = format!("dropping column {col} of {name}");
                        match self.answered(&what, || self.client.query(&sql).execute()).await? {
                            Ok(()) => tracing::info!(table = %name, column = %col, "dropped column"),
                            Err(e) if e.to_string().contains("no such column")
                                || e.to_string().contains("Wrong column name") => {}
                            Err(e) => return Err(Refusal::Bad(format!("{sql}: {e}"))),
                        }
                        target.columns.remove(&col);
                    }
                    // Added columns are added when the first row that has them arrives.
                    self.targets.insert(name.clone(), target);
                    Ok(())
                }
                "drop" | "truncate" | "rename" => {
                    // Data in the target is kept; the operator decides what to do with it.
                    tracing::warn!(table = %name, kind = %ddl.kind, statement = %statement, "source DDL not applied to the target");
                    Ok(())
                }
                _ => Ok(()),
            }
        }
        .await;
        match result {
            Ok(()) => Ok(()),
            Err(Refusal::Stop(e)) => Err(e),
            Err(Refusal::Bad(e)) => {
                tracing::error!(table = %name, statement = %statement, error = %e, "DDL failed: stopping this table");
                let reason = format!("DDL {statement:?} failed: {e}");
                if let Some(t) = self.targets.get_mut(&name) {
                    t.stopped = Some(reason);
                }
                Ok(())
            }
        }
    }

    /// Write one table's part of the batch now (before a schema change of that table).
    /// Write one table's part now (its column list changes), after the batch being written.
    async fn flush_table(&mut self, name: &str) -> Result<(), ApplyError> {
        self.settle().await?;
        let part = self.batch().tables.remove(name);
        if let Some(tb) = part {
            insert(&self.writer, &self.metrics, name, tb, &self.shutdown).await?;
        }
        Ok(())
    }

    /// Start writing the batch in hand (after the one being written, whose offsets are stored
    /// first); the next batch is gathered meanwhile. Its offsets are stored once it is written.
    async fn flush(&mut self, shutdown: &Shutdown) -> Result<(), ApplyError> {
        self.settle().await?;
        let batch = std::mem::take(&mut *self.batch());
        if batch.tables.is_empty() {
            // Only events without rows (heartbeats, dead letters): nothing to wait for.
            batch.offsets.store(&*self.consumer);
            return Ok(());
        }
        let (writer, metrics, shutdown) =
            (self.writer.clone(), self.metrics.clone(), shutdown.clone());
        let task = tokio::spawn(async move {
            let started = Instant::now();
            let mut batch = batch;
            for (name, tb) in std::mem::take(&mut batch.tables) {
                // On failure nothing of this batch is stored; it is read again after a restart.
                insert(&writer, &metrics, &name, tb, &shutdown).await?;
            }
            metrics.batch_rows.observe(batch.rows as f64);
            metrics
                .batch_seconds
                .observe(started.elapsed().as_secs_f64());
            if let Some(c) = batch.oldest_commit_micros {
                metrics
                    .latency
                    .observe((now_micros() - c).max(0) as f64 / 1e6);
            }
            Ok(batch.offsets)
        });
        self.in_flight.lock().expect("in-flight lock").task = Some(task);
        Ok(())
    }

    /// Wait for the batch being written, if any, and store its offsets.
    async fn settle(&mut self) -> Result<(), ApplyError> {
        let (task, failed) = {
            let mut f = self.in_flight.lock().expect("in-flight lock");
            (f.task.take(), f.failed.take())
        };
        if let Some(why) = failed {
            return Err(ApplyError::ClickHouse(format!(
                "a batch could not be written before a rebalance: {why}"
            )));
        }
        if let Some(task) = task {
            let offsets = task
                .await
                .map_err(|e| ApplyError::ClickHouse(format!("the write task ended: {e}")))??;
            offsets.store(&*self.consumer);
        }
        Ok(())
    }

    async fn dead_letter(
        &mut self,
        m: &BorrowedMessage<'_>,
        reason: &str,
    ) -> Result<(), ApplyError> {
        let where_ = format!("{}/{}@{}", m.topic(), m.partition(), m.offset());
        self.metrics
            .dead_letters
            .with_label_values(&[reason_label(reason)])
            .inc();
        if self.config.errors.on_bad_event == OnBadEvent::Stop {
            return Err(ApplyError::Definite(format!(
                "event at {where_} cannot be written: {reason}"
            )));
        }
        self.dead
            .send(m, reason)
            .await
            .map_err(ApplyError::Definite)
    }
}

/// One table's part, retried until written, refused for good (an error the data will always
/// get) or shut down.
async fn insert(
    writer: &Writer,
    metrics: &Metrics,
    name: &str,
    tb: TableBatch,
    shutdown: &Shutdown,
) -> Result<(), ApplyError> {
    let mut backoff = Duration::from_millis(500);
    loop {
        match writer.insert_once(name, &tb).await {
            Ok(()) => return Ok(()),
            Err(e) if is_definite(&e) => {
                return Err(ApplyError::ClickHouse(format!(
                    "INSERT into {name} refused: {e}"
                )))
            }
            Err(e) => {
                metrics.retries.inc();
                tracing::warn!(table = name, error = %e, retry_in = ?backoff, "INSERT failed; retrying");
                if shutdown.is_triggered() {
                    return Err(ApplyError::ClickHouse(format!(
                        "stopping with an unwritten batch for {name} (it is read again on restart): {e}"
                    )));
                }
                tokio::select! {
                    _ = shutdown.wait() => {}
                    _ = tokio::time::sleep(backoff) => {}
                }
                backoff = (backoff * 2).min(Duration::from_secs(30));
            }
        }
    }
}

fn op_name(op: Op) -> &'static str {
    match op {
        Op::Insert => "insert",
        Op::Update => "update",
        Op::Delete => "delete",
        Op::SnapshotRead => "snapshot",
        _ => "other",
    }
}

fn reason_label(reason: &str) -> &'static str {
    if reason.starts_with("not a change event") {
        "undecodable"
    } else if reason.contains("schema") && reason.contains("not on the schema topic") {
        "unknown_schema"
    } else if reason.contains("is stopped") {
        "table_stopped"
    } else if reason.contains("contract version") {
        "contract"
    } else {
        "value"
    }
}

/// ClickHouse refusing the data itself (bad type, missing table) will refuse it again.
fn is_definite(e: &clickhouse::error::Error) -> bool {
    match e {
        clickhouse::error::Error::BadResponse(text) => {
            // Server-side exceptions about the data or the schema; overload and timeouts are
            // retried.
            let retryable = [
                "TOO_MANY_PARTS",
                "Too many parts",
                "TIMEOUT",
                "MEMORY_LIMIT",
                "Memory limit",
            ]
            .iter()
            .any(|k| text.contains(k));
            !retryable
        }
        _ => false,
    }
}

const FNV_START: u64 = 0xcbf2_9ce4_8422_2325;

/// FNV-1a of `b`, continuing from `h` (start with [`FNV_START`]).
fn fnv(mut h: u64, b: &[u8]) -> u64 {
    for x in b {
        h ^= u64::from(*x);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

impl BatchSink for Sink {
    type Drain = ChDrain;
    type Error = ApplyError;

    fn consumer(&self) -> Arc<StreamConsumer<Context>> {
        self.consumer.clone()
    }

    fn batch_started(&self) -> Option<Instant> {
        self.batch().started
    }

    fn batch_full(&self) -> bool {
        self.full()
    }

    fn max_wait(&self) -> Duration {
        Duration::from_millis(self.config.batch.max_wait_ms)
    }

    async fn on_message(
        &mut self,
        m: &BorrowedMessage<'_>,
        shutdown: &Shutdown,
    ) -> Result<(), ApplyError> {
        self.handle(m, shutdown).await
    }

    async fn write_held(&mut self, shutdown: &Shutdown) -> Result<(), ApplyError> {
        self.flush(shutdown).await
    }

    async fn settle(&mut self) -> Result<(), ApplyError> {
        Sink::settle(self).await
    }
}
