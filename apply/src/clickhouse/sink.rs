//! apply-clickhouse: change topics to ClickHouse tables, in batches, offsets after the write.
//!
//! Progress and resumption:
//! - Events are read from the consumer group's partitions and encoded straight into RowBinary,
//!   one buffer per target table. A batch closes when it reaches `batch.max_rows` or
//!   `batch.max_bytes`, or once it holds an event and `batch.max_wait_ms` has passed since the
//!   previous write began (`due` in `group/run.rs`); then every table's buffer
//!   is written with one INSERT each, and only when ClickHouse has acknowledged all of them are
//!   the partitions' offsets stored (and committed by the consumer, every second and at stop).
//! - A crash between the INSERT and the commit re-reads the batch. Replays are harmless: mirror
//!   tables are ReplacingMergeTree on the primary key with the event version, change-log tables
//!   are ReplacingMergeTree on (key, version); on servers with `insert_deduplication_token`
//!   the repeated INSERT is also dropped at once.
//! - ClickHouse unreachable or failing: the same batch is retried with backoff (0.5 s to 5 s)
//!   while nothing more is read, so memory stays bounded by one batch. Which failures are
//!   retried is decided by the server's exception code ([`crate::error`]).
//! - An event that can never be written (not a change event, an unknown schema, a value the
//!   column cannot hold) is refused where that is found, as a [`BadEvent`] with its
//!   [`Reason`]; it goes to the dead-letter topic with the reason (or stops the process, with
//!   `errors.on_bad_event = "stop"`); the rest flows on.
//! - Before partitions are revoked (rebalance), the batch in hand is written and its offsets
//!   committed from the revoke callback; SIGTERM does the same and exits.
//! - A DDL event is applied in order with the rows of its partition: the batch so far is
//!   written first. ADD and DROP COLUMN are applied to the target; a DDL that fails stops that
//!   table (its later events are dead-lettered with the statement named), not the pipeline.
//!
//! This file is the sink and the steps of one event ([`Sink::start`], then per event
//! `apply_event`: decode, check the contract, then a row into the batch or a DDL after the
//! batch before it); the steps live by concern, in child modules:
//! - `batch`: the batch in hand and the one being written, the rows encoded into it, the
//!   drain before a rebalance, and the `BatchSink` the group's loop ([`crate::group`]) drives;
//! - `part`: one table's part of a batch, the rows of one INSERT in RowBinary pieces;
//! - `writer`: the INSERT of one table's part (with its deduplication token) and the retries
//!   of every statement;
//! - `target`: target tables: their names, what the server has, and how one schema's rows are
//!   written (the plan); `create` makes a missing one, `columns` changes its columns as the
//!   source's change (schema evolution);
//! - `ddl`: source DDL applied to the target; `rebuild`, an ALTER the capture follows by
//!   reading the table again;
//! - `stopped`: the stopped tables, kept in ClickHouse;
//! - `metrics`: what the sink counts.

mod applied;
mod batch;
mod claim;
mod columns;
mod create;
mod ddl;
mod metrics;
mod part;
mod rebuild;
mod stopped;
mod target;
mod writer;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use prometheus::Registry;
use prost::Message as _;
use rdkafka::consumer::StreamConsumer;
use rdkafka::message::BorrowedMessage;
use rdkafka::Message;
use sluice_common::Shutdown;
use sluice_proto::v1::Op;
use sluice_proto::view::RowEvent;
use sluice_proto::ChangeEvent;

use self::batch::{Batch, ChDrain, InFlight};
use self::metrics::Metrics;
use self::target::{Plan, Target};
use self::writer::Writer;
use super::types::Features;
use super::{Config, OnBadEvent};
use crate::consumer::subscribe;
use crate::error::{ApplyError, BadEvent, Origin, Reason};
use crate::group::{DeadLetters, GroupContext};
use crate::schemas::SchemaCache;

type Context = GroupContext<ChDrain>;

pub struct Sink {
    config: Config,
    client: clickhouse::Client,
    features: Features,
    consumer: Arc<StreamConsumer<Context>>,
    /// The consumer's settings, for a new one after a fatal error ([`BatchSink::rejoin`]).
    consumer_config: rdkafka::ClientConfig,
    dead: DeadLetters,
    schemas: SchemaCache,
    targets: HashMap<String, Target>,
    /// `/healthz`: degraded while a table is stopped (and while the target is out).
    health: sluice_common::metrics::Health,
    /// Target name -> why it is stopped (a DDL that could not be applied, or a table the
    /// source refused): its later events are dead-lettered with the reason.
    stopped: HashMap<String, String>,
    /// When `stopped` was last read from `tables.stopped_table` (again every 5 s).
    stopped_read_at: std::time::Instant,
    /// Per target, when its events were last read again because another instance changed it
    /// under them ([`Sink::changed_meanwhile`]): a few times a minute at most, then a refusal
    /// stops the table as any other.
    read_again: HashMap<String, Vec<std::time::Instant>>,
    /// The claim tables this process created (`claim`): its own claim is no other instance's
    /// work to wait for, and holding it, it goes on with the statement when it reads it again.
    claims_held: std::collections::HashSet<String>,
    /// The key of a row's part in the batch, reused from row to row (no name copied for a
    /// lookup).
    part_key: (String, usize),
    /// Target name -> the ALTERs applied to it (kept in ClickHouse, `tables.ddl_table`).
    applied: HashMap<String, Applied>,
    plans: HashMap<u64, Arc<Plan>>,
    /// Shared with the rebalance callback, which drains it before partitions go.
    batch: Arc<Mutex<Batch>>,
    /// The batch being written; shared with the rebalance callback too.
    in_flight: Arc<Mutex<InFlight>>,
    writer: Writer,
    metrics: Metrics,
    /// The (target, column) pairs whose values not held this process has logged.
    unheld_said: std::collections::HashSet<(String, String)>,
    /// Reused to work out a row's shard.
    scratch: Vec<u8>,
    /// When its batches are due.
    pace: crate::group::Pace,
    /// The run's shutdown, for waits outside a batch write (a target looked up or changed).
    shutdown: Shutdown,
}

/// The ALTERs applied to one target: the last one's version, and the columns renamed (old
/// name -> new) and dropped by any of them.
#[derive(Default)]
struct Applied {
    version: u64,
    renamed: std::collections::BTreeMap<String, String>,
    dropped: std::collections::HashSet<String>,
    /// The version of the last statement that made the name another table's (a CREATE, a
    /// table renamed to it, a new key): a row older than it is of the table before, and its
    /// partition's copy of the statement removes it.
    born: u64,
    /// The version of the last statement the capture follows with a rebuild (the table read
    /// again): every row older than it is replaced by a later one.
    rebuilt: u64,
    /// Another instance applied an ALTER since this one read the target: read it again.
    seen_elsewhere: bool,
}

/// Why an event was not taken.
enum Refusal {
    /// The event itself can never be written: it goes to the dead-letter topic (or stops the
    /// sink, as `errors.on_bad_event` says).
    Bad(BadEvent),
    /// The sink cannot go on (a batch not written, a shutdown while ClickHouse was away): it
    /// stops, and nothing after the last written batch is stored, so it is all read again.
    Stop(ApplyError),
}

impl From<BadEvent> for Refusal {
    fn from(bad: BadEvent) -> Self {
        Refusal::Bad(bad)
    }
}

impl From<ApplyError> for Refusal {
    fn from(e: ApplyError) -> Self {
        Refusal::Stop(e)
    }
}

/// The bytes are not a change event of the contract.
fn undecodable(e: impl std::fmt::Display) -> BadEvent {
    BadEvent::new(Reason::Undecodable, format!("not a change event: {e}"))
}

/// ClickHouse refused a statement for good (its message says which and why).
fn refused(message: impl std::fmt::Display) -> ApplyError {
    ApplyError::definite(Origin::ClickHouse, format!("ClickHouse: {message}"))
}

/// The shards of `cluster.write = "shards"`: their weights from `system.clusters` of the
/// `[clickhouse]` server, and per shard the replicas of `cluster.shards`, each checked to be
/// that shard of the cluster (its own `system.clusters` row). A replica that does not answer
/// now is left out until the next start (said so); a shard none of whose replicas answers
/// stops the start (tried again), a replica of another shard or a count of shards unlike the
/// cluster's is a configuration to fix.
async fn shards(
    config: &Config,
    client: &clickhouse::Client,
) -> Result<self::writer::Shards, ApplyError> {
    let cluster = &config.cluster;
    let weights: Vec<(u32, u32)> = client
        .query(
            "SELECT shard_num, any(shard_weight) FROM system.clusters WHERE cluster = ? \
             GROUP BY shard_num ORDER BY shard_num",
        )
        .bind(&cluster.name)
        .fetch_all()
        .await?;
    let bad = |m: String| ApplyError::definite(Origin::Sink, format!("cluster.shards: {m}"));
    if weights.len() != cluster.shards.len() {
        return Err(bad(format!(
            "{} shard(s) given, cluster {} has {} (system.clusters of {})",
            cluster.shards.len(),
            cluster.name,
            weights.len(),
            sluice_common::secret::redact_uri(&config.clickhouse.url)
        )));
    }
    let w: Vec<u32> = weights.iter().map(|(_, w)| *w).collect();
    let slots = crate::clickhouse::cluster::Slots::from_weights(&w).ok_or_else(|| {
        bad(format!(
            "every shard of cluster {} has weight 0",
            cluster.name
        ))
    })?;
    let mut replicas = Vec::new();
    for (i, urls) in cluster.shards.iter().enumerate() {
        let want = weights[i].0;
        let mut here = Vec::new();
        for url in urls {
            let shown = sluice_common::secret::redact_uri(url);
            let mut c = config.clickhouse.clone();
            c.url = url.clone();
            let client = c.client().map_err(|e| bad(format!("{shown}: {e}")))?;
            let is = client
                .query("SELECT shard_num FROM system.clusters WHERE cluster = ? AND is_local = 1")
                .bind(&cluster.name)
                .fetch_all::<u32>()
                .await;
            match is {
                Ok(n) if n == [want] => here.push((shown, client)),
                Ok(n) => {
                    return Err(bad(format!(
                        "{shown} is given as a replica of shard {want} (the {}. list), but it is \
                         {} of cluster {}",
                        i + 1,
                        match n.as_slice() {
                            [] => "no shard".to_string(),
                            n => format!("shard {n:?}"),
                        },
                        cluster.name
                    )))
                }
                Err(e) if crate::error::clickhouse_transient(&e) => {
                    tracing::warn!(server = %shown, shard = want, error = %e, "a replica of a shard does not answer: left out until the next start");
                }
                Err(e) => return Err(bad(format!("{shown}: {e}"))),
            }
        }
        if here.is_empty() {
            return Err(ApplyError::transient(
                Origin::ClickHouse,
                format!(
                    "ClickHouse: no replica of shard {want} of cluster {} answers ({})",
                    cluster.name,
                    urls.iter()
                        .map(|u| sluice_common::secret::redact_uri(u))
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            ));
        }
        replicas.push(here);
    }
    tracing::info!(cluster = %cluster.name, shards = replicas.len(), ?w, "writing straight to the shards");
    Ok(self::writer::Shards { slots, replicas })
}

/// The group's consumer, subscribed; its rebalances drain `batch` and `in_flight`.
fn consumer(
    cc: &rdkafka::ClientConfig,
    config: &Config,
    metrics: &Metrics,
    batch: &Arc<Mutex<Batch>>,
    in_flight: &Arc<Mutex<InFlight>>,
    writer: &Writer,
    health: &sluice_common::metrics::Health,
) -> Result<StreamConsumer<Context>, ApplyError> {
    let consumer: StreamConsumer<Context> = cc.create_with_context(
        GroupContext::new(
            metrics.group.clone(),
            ChDrain {
                batch: batch.clone(),
                in_flight: in_flight.clone(),
                writer: writer.clone(),
                runtime: tokio::runtime::Handle::current(),
            },
        )
        .watching(&config.consumer.group_id, health),
    )?;
    subscribe(&consumer, &config.consumer.topics)?;
    Ok(consumer)
}

impl Sink {
    /// Connect, and read the stopped tables and the statements applied: retried while
    /// ClickHouse does not answer, until `shutdown` (a stop during an outage at start ends the
    /// wait).
    pub async fn start(
        config: Config,
        registry: &Registry,
        health: sluice_common::metrics::Health,
        shutdown: Shutdown,
    ) -> Result<Self, ApplyError> {
        let metrics = Metrics::new(registry).expect("metrics register once");
        let client = config
            .clickhouse
            .client()
            .map_err(|e| ApplyError::definite(Origin::Sink, e))?;
        let version: String = client.query("SELECT version()").fetch_one().await?;
        let features = Features::of_version(&version);
        tracing::info!(%version, features = %features.summary(), "ClickHouse");
        let cc = config
            .consumer
            .client_config(&config.kafka, "apply-clickhouse");
        let batch = Arc::new(Mutex::new(Batch::default()));
        let in_flight = Arc::new(Mutex::new(InFlight::default()));
        let writer = Writer {
            client: client.clone(),
            database: config.clickhouse.database.clone(),
            dedup_token: features.dedup_token,
            async_insert_off: features.async_insert,
            distributed: config.cluster.distributed,
            shards: if config.cluster.to_shards() {
                Some(Arc::new(shards(&config, &client).await?))
            } else {
                None
            },
            local_suffix: config.cluster.local_suffix.clone(),
            version_column: config.tables.version_column.clone(),
            rows: metrics.rows.clone(),
            outage: crate::group::Outage::new(
                health.clone(),
                std::time::Duration::from_millis(config.errors.degraded_after_ms),
            ),
            server: sluice_common::secret::redact_uri(&config.clickhouse.url),
        };
        let consumer = consumer(&cc, &config, &metrics, &batch, &in_flight, &writer, &health)?;
        let dead = DeadLetters::start(
            &config.kafka,
            "apply-clickhouse",
            &config.errors.dead_letter_topic,
        )
        .await?;
        let mut schemas = SchemaCache::new(&config.kafka, &config.schema_topic, "apply-clickhouse");
        schemas.refresh().await?;
        let mut sink = Self {
            client,
            features,
            consumer: Arc::new(consumer),
            consumer_config: cc,
            dead,
            schemas,
            targets: HashMap::new(),
            stopped: HashMap::new(),
            stopped_read_at: std::time::Instant::now(),
            read_again: HashMap::new(),
            claims_held: Default::default(),
            health,
            part_key: Default::default(),
            applied: HashMap::new(),
            plans: HashMap::new(),
            batch,
            in_flight,
            writer,
            metrics,
            scratch: Vec::new(),
            unheld_said: Default::default(),
            pace: crate::group::Pace::new(std::time::Duration::from_millis(
                config.batch.max_wait_ms,
            )),
            config,
            shutdown,
        };
        sink.read_stopped().await?;
        sink.read_applied_ddl().await?;
        Ok(sink)
    }

    /// Consume until shutdown; then write what is held, commit, and return.
    pub async fn run(mut self, shutdown: Shutdown) -> Result<(), ApplyError> {
        self.shutdown = shutdown.clone();
        let result = crate::group::run(&mut self, &shutdown).await;
        crate::group::close_within(self, "apply-clickhouse").await;
        result
    }

    /// One event: a row goes into the batch, a DDL is applied after what came before it.
    /// `Err(Refusal::Bad(_))` means: this event can never be written.
    async fn apply_event(
        &mut self,
        m: &BorrowedMessage<'_>,
        shutdown: &Shutdown,
    ) -> Result<(), Refusal> {
        let payload = m.payload().unwrap_or_default();
        // Only what a row needs is decoded; a DDL event is decoded whole.
        let row = RowEvent::parse(payload).map_err(undecodable)?;
        if row.contract > sluice_proto::CONTRACT_VERSION {
            return Err(BadEvent::new(
                Reason::Contract,
                format!(
                    "contract version {} is newer than this build's {}",
                    row.contract,
                    sluice_proto::CONTRACT_VERSION
                ),
            )
            .into());
        }
        match row.op() {
            Op::Ddl | Op::Truncate => {
                let event = ChangeEvent::decode(payload).map_err(undecodable)?;
                let name = self.target_name(&event.database, &event.table);
                if let Some(why) = self.stopped.get(&name) {
                    // Not applied while the table is stopped, and not lost: dead-lettered
                    // like its rows, so that the documented resume (the stop deleted, the
                    // table's dead letters replayed) applies it in order with them.
                    let kind = event.ddl.as_ref().map_or("truncate", |d| d.kind.as_str());
                    let statement = event.ddl.as_ref().map_or("", |d| d.statement.as_str());
                    tracing::warn!(table = %name, kind, statement, stopped = %why, "DDL of a stopped table dead-lettered, not applied");
                    self.count_ddl(kind, "skipped");
                    let message = if kind == "refused" {
                        // (another partition's copy of the refusal that stopped it, or a
                        // later one: either way the remedy is the table copied again)
                        let reason = event.ddl.as_ref().map_or("", |d| d.reason.as_str());
                        format!(
                            "table {name} is stopped: {why}; the source refused it at \
                             {statement:?}: {reason}"
                        )
                    } else {
                        format!(
                            "table {name} is stopped: {why}; its {kind} statement \
                             {statement:?} is not applied meanwhile: `sluice dead-letters \
                             replay` applies it, in order with the table's rows, once the table \
                             is taken up again"
                        )
                    };
                    return Err(BadEvent::new(Reason::TableStopped, message).into());
                }
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

    /// A row that can never be written stops its table (`errors.on_bad_event = "stop_table"`,
    /// the default): a mirror would miss the change (a stale or missing row), a change log one
    /// of its changes.
    /// Whatever the reason (a value, a schema not on the schema topic, a newer contract), as
    /// long as the event is a row event naming its table; a stopped table's and a DDL's
    /// refusals have stopped it already.
    async fn stop_table_for(
        &mut self,
        m: &BorrowedMessage<'_>,
        bad: &BadEvent,
    ) -> Result<(), ApplyError> {
        if self.config.errors.on_bad_event != OnBadEvent::StopTable
            || matches!(
                bad.reason,
                Reason::Undecodable | Reason::TableStopped | Reason::Ddl
            )
        {
            return Ok(());
        }
        let Ok(row) = RowEvent::parse(m.payload().unwrap_or_default()) else {
            return Ok(());
        };
        if !matches!(
            row.op(),
            Op::Insert | Op::Update | Op::Delete | Op::SnapshotRead
        ) {
            return Ok(());
        }
        let name = self.target_name(row.database, row.table);
        if self.stopped.contains_key(&name) {
            return Ok(());
        }
        let reason = format!(
            "the event at {}/{}@{} cannot be written: {}. The table without it would be wrong; \
             fix the cause, delete the table's row from {} and re-snapshot the table (or set \
             errors.on_bad_event = \"dead_letter\" to skip such events)",
            m.topic(),
            m.partition(),
            m.offset(),
            bad.message,
            self.config.tables.stopped_table
        );
        tracing::error!(table = %name, %reason, "table stopped");
        self.stop_table(&name, &reason).await?;
        Ok(())
    }

    /// Hand an event that can never be written to the dead-letter topic (or stop, as
    /// `errors.on_bad_event` says), counted by its reason: its acknowledgement is awaited with
    /// its batch, before the event's offset is stored.
    async fn dead_letter(
        &mut self,
        m: &BorrowedMessage<'_>,
        bad: &BadEvent,
    ) -> Result<crate::group::Pending, ApplyError> {
        let where_ = format!("{}/{}@{}", m.topic(), m.partition(), m.offset());
        self.metrics
            .dead_letters
            .with_label_values(&[bad.reason.label()])
            .inc();
        if self.config.errors.on_bad_event == OnBadEvent::Stop {
            return Err(ApplyError::definite(
                Origin::Sink,
                format!("event at {where_} cannot be written: {bad}"),
            ));
        }
        self.dead
            .enqueue(m, bad)
            .await
            .map_err(|e| ApplyError::definite(Origin::Kafka, e))
    }
}
