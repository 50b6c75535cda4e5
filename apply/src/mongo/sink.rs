//! apply-mongo: change topics to MongoDB collections, in batches, offsets after the write.
//!
//! Progress and resumption:
//! - Events are read from the consumer group's partitions and turned into writes
//!   ([`super::write`]). A batch closes at `batch.max_events`, `batch.max_bytes`, or
//!   `batch.max_wait_ms` after its first event; it is written round by round (one write per
//!   document per round, unordered within a round) and only when MongoDB has acknowledged every
//!   write (with the configured write concern) are the partitions' offsets stored.
//! - A failure of a whole command (network, election, write concern) writes the same batch
//!   again with backoff (0.5 s to 30 s) while nothing more is read. Writes are idempotent, so
//!   the repeated part changes nothing.
//! - A write MongoDB refuses for that document alone (duplicate key on a unique index,
//!   validation, size) sends its event to the dead-letter topic with the server's message (or
//!   stops the process, with `errors.on_bad_event = "stop"`); the rest of the batch is written.
//! - A DDL event is applied in order with its partition: the batch so far is written first.
//!   Drops, renames and database drops are recorded with their version in
//!   `<meta_database>.applied_ddl`: the same command arriving on the other partitions is not
//!   applied again, and a row event older than it (read late from another partition, or
//!   replayed after a restart) is skipped instead of bringing back what was dropped.
//! - Before partitions are revoked (rebalance) the batch in hand is written and committed from
//!   the revoke callback; SIGTERM does the same and exits.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use futures::StreamExt;
use mongodb::bson::{doc, Bson, Document};
use prometheus::{Histogram, HistogramOpts, IntCounter, IntCounterVec, Opts, Registry};
use prost::Message as _;
use rdkafka::consumer::{Consumer, StreamConsumer};
use rdkafka::message::{BorrowedMessage, OwnedMessage};
use rdkafka::Message;
use sluice_common::Shutdown;
use sluice_proto::v1::Op;
use sluice_proto::ChangeEvent;

use super::write::{commands, reply_errors, rounds, transient_code, writes_of, Write};
use super::Config;
use crate::consumer::OnBadEvent;
use crate::group::{
    block_on, BatchSink, DeadLetters, Drain, GroupContext, GroupMetrics, Offsets,
    DEAD_LETTER_MAX_BYTES,
};
use sluice_proto::view::RowEvent;

#[derive(Debug, thiserror::Error)]
pub enum ApplyError {
    #[error("Kafka: {0}")]
    Kafka(#[from] rdkafka::error::KafkaError),
    #[error("MongoDB: {0}")]
    Mongo(String),
    #[error("{0}")]
    Definite(String),
}

#[derive(Clone)]
struct Metrics {
    writes: IntCounterVec,
    batch_events: Histogram,
    batch_seconds: Histogram,
    retries: IntCounter,
    dead_letters: IntCounterVec,
    stale: IntCounter,
    ddl: IntCounterVec,
    latency: Histogram,
    group: GroupMetrics,
}

impl Metrics {
    fn new(r: &Registry) -> prometheus::Result<Self> {
        let writes = IntCounterVec::new(
            Opts::new(
                "sluice_apply_writes_total",
                "Document writes acknowledged by MongoDB, by target namespace and kind.",
            ),
            &["namespace", "kind"],
        )?;
        let batch_events = Histogram::with_opts(
            HistogramOpts::new("sluice_apply_batch_rows", "Events per written batch.")
                .buckets(vec![1.0, 10.0, 100.0, 1e3, 1e4, 5e4, 1e5, 2e5, 5e5, 1e6]),
        )?;
        let batch_seconds = Histogram::with_opts(HistogramOpts::new(
            "sluice_apply_batch_duration_seconds",
            "Time to write one batch, retries included.",
        ))?;
        let retries = IntCounter::new(
            "sluice_apply_retries_total",
            "Batches written again after a MongoDB failure.",
        )?;
        let dead_letters = IntCounterVec::new(
            Opts::new(
                "sluice_apply_dead_letters_total",
                "Events sent to the dead-letter topic, by reason.",
            ),
            &["reason"],
        )?;
        let stale = IntCounter::new(
            "sluice_apply_stale_events_total",
            "Row events skipped because a later drop or rename of their collection was applied.",
        )?;
        let ddl = IntCounterVec::new(
            Opts::new(
                "sluice_apply_ddl_total",
                "Source commands, by kind and outcome (applied, skipped, filtered, failed).",
            ),
            &["kind", "outcome"],
        )?;
        let latency = Histogram::with_opts(
            HistogramOpts::new(
                "sluice_apply_end_to_end_latency_seconds",
                "Source commit to the batch acknowledged by MongoDB.",
            )
            .buckets(vec![
                0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 300.0,
            ]),
        )?;
        for c in [&writes, &dead_letters, &ddl] {
            r.register(Box::new(c.clone()))?;
        }
        r.register(Box::new(batch_events.clone()))?;
        r.register(Box::new(batch_seconds.clone()))?;
        r.register(Box::new(retries.clone()))?;
        r.register(Box::new(stale.clone()))?;
        r.register(Box::new(latency.clone()))?;
        Ok(Self {
            writes,
            batch_events,
            batch_seconds,
            retries,
            dead_letters,
            stale,
            ddl,
            latency,
            group: GroupMetrics::new(r)?,
        })
    }
}

/// One write of the batch and where it came from.
struct Item {
    db: Arc<str>,
    coll: Arc<str>,
    write: Write,
    /// Index into `Batch::messages`.
    origin: usize,
}

#[derive(Default)]
struct Batch {
    items: Vec<Item>,
    messages: Vec<OwnedMessage>,
    offsets: Offsets,
    events: usize,
    bytes: usize,
    started: Option<Instant>,
    oldest_commit_micros: Option<i64>,
}

/// MongoDB's code for a write that would duplicate a unique index's key.
const DUPLICATE_KEY: i32 = 11000;

/// Writes batches; shared by the sink and the rebalance callback.
#[derive(Clone)]
struct Writer {
    client: mongodb::Client,
    write_concern: Document,
    dead: DeadLetters,
    on_bad_event: OnBadEvent,
    metrics: Metrics,
}

/// A statement MongoDB refused for its document alone.
struct Refusal {
    /// Index into `Batch::messages`.
    origin: usize,
    reason: String,
    label: &'static str,
}

/// What a batch write did.
#[derive(Default)]
struct Outcome {
    refused: Vec<Refusal>,
    /// (namespace, kind) -> writes acknowledged.
    writes: HashMap<(String, &'static str), u64>,
}

/// Why a batch write did not complete.
enum WriteFailure {
    /// Worth trying again (network, election, write concern).
    Transient(String),
    Definite(String),
}

impl Writer {
    /// Write every item of `batch`, round by round. Statements refused for their document
    /// alone are returned, not dead-lettered yet: a transient failure later in the batch writes
    /// it all again, and they would be refused (and sent) twice.
    async fn write(&self, batch: &Batch) -> Result<Outcome, WriteFailure> {
        let mut outcome = Outcome::default();
        let keys: Vec<(&str, &str, &[u8])> = batch
            .items
            .iter()
            .map(|i| (&*i.db, &*i.coll, i.write.key().as_bytes()))
            .collect();
        for round in rounds(&keys) {
            let writes: Vec<(usize, &Write)> =
                round.iter().map(|&i| (i, &batch.items[i].write)).collect();
            let held = self.write_round(batch, &writes, &mut outcome).await?;
            if held.is_empty() {
                continue;
            }
            // Inserts of keys the target holds: written again, in the same round (before the
            // key's next write), as replacements.
            let again: Vec<(usize, Write)> = held
                .iter()
                .filter_map(|&i| Some((i, batch.items[i].write.as_replacement()?)))
                .collect();
            let again: Vec<(usize, &Write)> = again.iter().map(|(i, w)| (*i, w)).collect();
            self.write_round(batch, &again, &mut outcome).await?;
        }
        Ok(outcome)
    }

    /// Write `writes` (indexes into the batch's items, with the write to make for each; one
    /// per key) as commands per collection, and read the replies. Returns the inserts refused
    /// because the target already holds their key.
    async fn write_round(
        &self,
        batch: &Batch,
        writes: &[(usize, &Write)],
        outcome: &mut Outcome,
    ) -> Result<Vec<usize>, WriteFailure> {
        // Per collection, in first-seen order.
        #[allow(clippy::type_complexity)] // (namespace, its writes with their indexes)
        let mut by_ns: Vec<((&str, &str), Vec<(usize, &Write)>)> = Vec::new();
        for &(i, w) in writes {
            let it = &batch.items[i];
            let ns = (&*it.db, &*it.coll);
            match by_ns.iter_mut().find(|(n, _)| *n == ns) {
                Some((_, v)) => v.push((i, w)),
                None => by_ns.push((ns, vec![(i, w)])),
            }
        }
        // A command's statements are positions in its collection's writes.
        let commands = by_ns.iter().flat_map(|((db, coll), writes)| {
            commands(coll, writes.iter().map(|(_, w)| *w), &self.write_concern)
                .into_iter()
                .map(move |c| (*db, *coll, writes, c))
        });
        let replies = futures::stream::iter(commands.map(|(db, coll, writes, cmd)| async move {
            let reply = self.client.database(db).run_raw_command(cmd.body).await;
            (db, coll, writes, cmd.statements, reply)
        }))
        .buffer_unordered(4)
        .collect::<Vec<_>>()
        .await;
        let mut held = Vec::new();
        for (db, coll, writes, statements, reply) in replies {
            let reply = reply.map_err(classify)?;
            let ns = format!("{db}.{coll}");
            let mut done = vec![true; statements.len()];
            for e in reply_errors(&reply).map_err(WriteFailure::Transient)? {
                if transient_code(e.code) {
                    return Err(WriteFailure::Transient(format!(
                        "{ns}: {} (code {})",
                        e.message, e.code
                    )));
                }
                let Some(&(item, write)) = statements.get(e.index).map(|&k| &writes[k]) else {
                    continue;
                };
                if e.code == DUPLICATE_KEY && matches!(write, Write::Insert { .. }) {
                    held.push(item);
                    done[e.index] = false;
                    continue;
                }
                // Refused, not acknowledged: not counted as a write.
                done[e.index] = false;
                outcome.refused.push(Refusal {
                    origin: batch.items[item].origin,
                    reason: format!(
                        "{ns}: MongoDB refused the write: {} (code {})",
                        e.message, e.code
                    ),
                    label: if e.code == DUPLICATE_KEY {
                        "duplicate_key"
                    } else {
                        "refused"
                    },
                });
            }
            let mut kinds: Vec<(&'static str, u64)> = Vec::new();
            for (k, done) in statements.iter().zip(done) {
                let kind = writes[*k].1.kind();
                match kinds.iter_mut().find(|(n, _)| *n == kind) {
                    Some((_, c)) => *c += u64::from(done),
                    None => kinds.push((kind, u64::from(done))),
                }
            }
            for (kind, n) in kinds {
                *outcome.writes.entry((ns.clone(), kind)).or_insert(0) += n;
            }
        }
        Ok(held)
    }

    /// After the whole batch is written: count the writes and dead-letter the refused events
    /// (an event refused in several statements is sent once).
    async fn settle(&self, batch: &Batch, outcome: Outcome) -> Result<(), String> {
        for ((ns, kind), n) in &outcome.writes {
            self.metrics
                .writes
                .with_label_values(&[ns.as_str(), kind])
                .inc_by(*n);
        }
        let mut sent = std::collections::HashSet::new();
        for r in &outcome.refused {
            if sent.insert(r.origin) {
                self.dead_letter(&batch.messages[r.origin], &r.reason, r.label)
                    .await?;
            }
        }
        if !outcome.refused.is_empty() {
            tracing::warn!(refused = outcome.refused.len(), "writes refused");
        }
        Ok(())
    }

    async fn dead_letter(&self, m: &OwnedMessage, reason: &str, label: &str) -> Result<(), String> {
        self.metrics.dead_letters.with_label_values(&[label]).inc();
        if self.on_bad_event == OnBadEvent::Stop {
            return Err(format!(
                "event at {}/{}@{} cannot be written: {reason}",
                m.topic(),
                m.partition(),
                m.offset()
            ));
        }
        self.dead.send(m, reason).await
    }
}

fn classify(e: mongodb::error::Error) -> WriteFailure {
    match &*e.kind {
        // Bad command, no permission, unknown option, too large: writing again cannot help.
        mongodb::error::ErrorKind::Command(c) if matches!(c.code, 2 | 9 | 13 | 14 | 72 | 10334) => {
            WriteFailure::Definite(format!("{} (code {})", c.message, c.code))
        }
        _ => WriteFailure::Transient(e.to_string()),
    }
}

/// Writes the batch in hand before partitions are let go.
pub(crate) struct MongoDrain {
    batch: Arc<Mutex<Batch>>,
    writer: Writer,
    runtime: tokio::runtime::Handle,
}

impl Drain for MongoDrain {
    fn drain(&self) -> Option<Offsets> {
        let taken = std::mem::take(&mut *self.batch.lock().expect("batch lock"));
        if taken.offsets.is_empty() {
            return None;
        }
        let write = async {
            let outcome = self.writer.write(&taken).await.map_err(|f| match f {
                WriteFailure::Transient(e) | WriteFailure::Definite(e) => e,
            })?;
            self.writer.settle(&taken, outcome).await
        };
        match block_on(&self.runtime, write) {
            Ok(()) => {
                tracing::info!(
                    events = taken.events,
                    "wrote the batch in hand before letting partitions go"
                );
                Some(taken.offsets)
            }
            Err(e) => {
                tracing::warn!(error = %e, events = taken.events,
                    "could not write the batch in hand before letting partitions go; their next owner reads it again");
                None
            }
        }
    }
}

type Context = GroupContext<MongoDrain>;

pub struct Sink {
    config: Config,
    client: mongodb::Client,
    consumer: Arc<StreamConsumer<Context>>,
    batch: Arc<Mutex<Batch>>,
    writer: Writer,
    metrics: Metrics,
    /// Target namespace ("db.coll") or database ("db") -> version of the last drop or rename
    /// applied to it.
    applied: HashMap<String, u64>,
    applied_read: Option<Instant>,
    /// Source database -> collection -> target namespace ([`Config::target`], worked out once).
    targets: HashMap<String, HashMap<String, Target>>,
}

/// A target database and collection, shared by every write to them.
type Target = (Arc<str>, Arc<str>);

fn now_micros() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros() as i64)
        .unwrap_or(0)
}

impl Sink {
    pub async fn start(config: Config, registry: &Registry) -> Result<Self, ApplyError> {
        let metrics = Metrics::new(registry).expect("metrics register once");
        let client = mongodb::Client::with_uri_str(&config.mongodb.uri)
            .await
            .map_err(|e| ApplyError::Mongo(e.to_string()))?;
        let mut write_concern = doc! {};
        let w = config.mongodb.write_concern.trim();
        match w.parse::<i32>() {
            Ok(n) => write_concern.insert("w", n),
            Err(_) => write_concern.insert("w", w),
        };
        if config.mongodb.journal {
            write_concern.insert("j", true);
        }
        if config.mongodb.wtimeout_ms > 0 {
            write_concern.insert("wtimeout", config.mongodb.wtimeout_ms as i64);
        }
        let mut cc = config
            .kafka
            .consumer_config("apply-mongo", &config.consumer.group_id);
        cc.set("statistics.interval.ms", "5000");
        if config.delay_seconds > 0 {
            // Waiting for an event to age must not look like a dead consumer.
            let ms = (config.delay_seconds * 1000 + 60_000).max(300_000);
            cc.set("max.poll.interval.ms", ms.min(i32::MAX as u64).to_string());
        }
        let dead = DeadLetters::new(
            config
                .kafka
                .producer_config("apply-mongo")
                .set("message.max.bytes", DEAD_LETTER_MAX_BYTES.to_string())
                .clone(),
            &config.errors.dead_letter_topic,
        )?;
        config
            .kafka
            .ensure_topic(
                "apply-mongo",
                &config.errors.dead_letter_topic,
                1,
                -1,
                false,
                Some(DEAD_LETTER_MAX_BYTES),
            )
            .await
            .map_err(ApplyError::Definite)?;
        let batch = Arc::new(Mutex::new(Batch::default()));
        let writer = Writer {
            client: client.clone(),
            write_concern,
            dead,
            on_bad_event: config.errors.on_bad_event,
            metrics: metrics.clone(),
        };
        let consumer: StreamConsumer<Context> = cc.create_with_context(GroupContext {
            metrics: metrics.group.clone(),
            drain: MongoDrain {
                batch: batch.clone(),
                writer: writer.clone(),
                runtime: tokio::runtime::Handle::current(),
            },
        })?;
        let topics: Vec<&str> = config.consumer.topics.iter().map(String::as_str).collect();
        consumer.subscribe(&topics)?;
        let mut sink = Self {
            config,
            client,
            consumer: Arc::new(consumer),
            batch,
            writer,
            metrics,
            applied: HashMap::new(),
            applied_read: None,
            targets: HashMap::new(),
        };
        sink.read_applied().await?;
        Ok(sink)
    }

    fn applied_collection(&self) -> mongodb::Collection<Document> {
        self.client
            .database(&self.config.mongodb.meta_database)
            .collection("applied_ddl")
    }

    /// Load the versions of applied drops and renames (other instances apply them too).
    async fn read_applied(&mut self) -> Result<(), ApplyError> {
        let mut cursor = self.applied_collection().find(doc! {}).await.map_err(|e| {
            ApplyError::Mongo(format!(
                "reading {}.applied_ddl: {e}",
                self.config.mongodb.meta_database
            ))
        })?;
        while let Some(d) = cursor.next().await {
            let d = d.map_err(|e| ApplyError::Mongo(e.to_string()))?;
            if let (Ok(ns), Ok(v)) = (d.get_str("_id"), d.get_i64("version")) {
                let v = v as u64;
                let e = self.applied.entry(ns.to_string()).or_insert(0);
                *e = (*e).max(v);
            }
        }
        self.applied_read = Some(Instant::now());
        Ok(())
    }

    /// Consume until shutdown; then write what is held, commit, and return.
    pub async fn run(mut self, shutdown: Shutdown) -> Result<(), ApplyError> {
        crate::group::run(&mut self, &shutdown).await
    }

    fn batch(&self) -> std::sync::MutexGuard<'_, Batch> {
        self.batch.lock().expect("batch lock")
    }

    fn full(&self) -> bool {
        let b = self.batch();
        b.events >= self.config.batch.max_events || b.bytes >= self.config.batch.max_bytes
    }

    async fn handle(&mut self, m: OwnedMessage, shutdown: &Shutdown) -> Result<(), ApplyError> {
        // Read where it lies: a row event's documents are copied once, into its writes. A DDL
        // event is decoded whole below.
        let payload = m.payload().unwrap_or_default();
        let event = match RowEvent::parse(payload) {
            Ok(e) if e.contract > sluice_proto::CONTRACT_VERSION => Err(format!(
                "contract version {} is newer than this build's {}",
                e.contract,
                sluice_proto::CONTRACT_VERSION
            )),
            Ok(e) => Ok(e),
            Err(e) => Err(format!("not a change event: {e}")),
        };
        let event = match event {
            Ok(e) => e,
            Err(reason) => {
                self.writer
                    .dead_letter(&m, &reason, "undecodable")
                    .await
                    .map_err(ApplyError::Definite)?;
                self.batch().offsets.record(&m);
                return Ok(());
            }
        };
        if self.config.delay_seconds > 0 && event.commit_time_micros > 0 {
            let due = event.commit_time_micros + self.config.delay_seconds as i64 * 1_000_000;
            let wait = due - now_micros();
            if wait > 0 {
                // What is held is written first: the wait may be long.
                self.flush(shutdown).await?;
                tokio::select! {
                    _ = shutdown.wait() => return Ok(()), // not recorded: read again
                    _ = tokio::time::sleep(Duration::from_micros(wait as u64)) => {}
                }
            }
        }
        self.batch().started.get_or_insert_with(Instant::now);
        match event.op() {
            Op::Ddl | Op::Truncate => {
                self.flush(shutdown).await?;
                let (applied, label) = match ChangeEvent::decode(payload) {
                    Ok(ddl) => (self.apply_ddl(&ddl).await, "ddl"),
                    Err(e) => (Err(format!("not a change event: {e}")), "undecodable"),
                };
                if let Err(reason) = applied {
                    self.writer
                        .dead_letter(&m, &reason, label)
                        .await
                        .map_err(ApplyError::Definite)?;
                }
                let mut b = self.batch();
                b.offsets.record(&m);
            }
            Op::Insert | Op::Update | Op::Delete | Op::SnapshotRead => {
                let (db, coll) = self.target(event.database, event.table);
                if self.stale(&db, &coll, event.version).await? {
                    self.metrics.stale.inc();
                    self.batch().offsets.record(&m);
                    return Ok(());
                }
                match writes_of(&event) {
                    Ok(writes) => {
                        let commit_time_micros = event.commit_time_micros;
                        let mut b = self.batch();
                        let origin = b.messages.len();
                        for w in writes {
                            b.bytes += w.size();
                            b.items.push(Item {
                                db: Arc::clone(&db),
                                coll: Arc::clone(&coll),
                                write: w,
                                origin,
                            });
                        }
                        b.events += 1;
                        if commit_time_micros > 0 {
                            let o = b.oldest_commit_micros.get_or_insert(commit_time_micros);
                            *o = (*o).min(commit_time_micros);
                        }
                        b.offsets.record(&m);
                        b.messages.push(m);
                    }
                    Err(reason) => {
                        let reason = format!("{}.{}: {reason}", event.database, event.table);
                        self.writer
                            .dead_letter(&m, &reason, "value")
                            .await
                            .map_err(ApplyError::Definite)?;
                        self.batch().offsets.record(&m);
                    }
                }
            }
            _ => self.batch().offsets.record(&m), // heartbeats, transaction markers
        }
        Ok(())
    }

    /// Where a source collection goes, remembered.
    fn target(&mut self, db: &str, coll: &str) -> Target {
        if let Some(t) = self.targets.get(db).and_then(|m| m.get(coll)) {
            return t.clone();
        }
        let (d, c) = self.config.target(db, coll);
        let t: Target = (d.into(), c.into());
        self.targets
            .entry(db.to_string())
            .or_default()
            .insert(coll.to_string(), t.clone());
        t
    }

    /// True when a drop or rename of the namespace (or a drop of its database) newer than
    /// `version` was applied: the event's effect is gone at the source too.
    async fn stale(&mut self, db: &str, coll: &str, version: u64) -> Result<bool, ApplyError> {
        if self.applied.is_empty()
            && self
                .applied_read
                .is_some_and(|t| t.elapsed() < Duration::from_secs(5))
        {
            return Ok(false);
        }
        if self
            .applied_read
            .is_none_or(|t| t.elapsed() >= Duration::from_secs(5))
        {
            self.read_applied().await?;
        }
        let v = |k: &str| self.applied.get(k).copied().unwrap_or(0);
        Ok(v(&format!("{db}.{coll}")).max(v(db)) > version)
    }

    async fn record_applied(&mut self, key: String, version: u64) -> Result<(), String> {
        self.applied_collection()
            .update_one(
                doc! { "_id": &key },
                doc! { "$max": { "version": version as i64 } },
            )
            .upsert(true)
            .await
            .map_err(|e| {
                format!(
                    "recording the command in {}.applied_ddl: {e}",
                    self.config.mongodb.meta_database
                )
            })?;
        let e = self.applied.entry(key).or_insert(0);
        *e = (*e).max(version);
        Ok(())
    }

    /// Repeat a source command on the target. `Err(reason)`: it failed (dead-lettered).
    async fn apply_ddl(&mut self, event: &ChangeEvent) -> Result<(), String> {
        let Some(ddl) = &event.ddl else { return Ok(()) };
        let kind = ddl.kind.as_str();
        if !self.config.ddl.applies(kind) {
            self.metrics
                .ddl
                .with_label_values(&[kind, "filtered"])
                .inc();
            tracing::info!(kind, statement = %ddl.statement, "source command not applied (ddl.apply)");
            return Ok(());
        }
        let (db, coll) = self.config.target(&event.database, &event.table);
        let destructive = matches!(kind, "drop" | "rename" | "drop_database");
        let key = if kind == "drop_database" {
            db.clone()
        } else {
            format!("{db}.{coll}")
        };
        if destructive {
            let _ = self.read_applied().await;
            if self.applied.get(&key).copied().unwrap_or(0) >= event.version {
                self.metrics.ddl.with_label_values(&[kind, "skipped"]).inc();
                return Ok(()); // applied already (from another partition, or before a restart)
            }
        }
        let json: serde_json::Value = serde_json::from_str(&ddl.statement)
            .map_err(|e| format!("command {:?} is not JSON: {e}", ddl.statement))?;
        let command = match Bson::try_from(json) {
            Ok(Bson::Document(d)) => d,
            _ => return Err(format!("command {:?} is not a document", ddl.statement)),
        };
        let database = self.client.database(&db);
        // Codes that mean "already so": NamespaceNotFound, NamespaceExists, IndexNotFound.
        let ignore = |code: i32| matches!(code, 26 | 48 | 27);
        let run = |cmd: Document, on: mongodb::Database| async move {
            match on.run_command(cmd).await {
                Ok(_) => Ok(()),
                Err(e) => match &*e.kind {
                    mongodb::error::ErrorKind::Command(c) if ignore(c.code) => Ok(()),
                    _ => Err(e.to_string()),
                },
            }
        };
        let result = match kind {
            "drop" => run(doc! { "drop": &coll }, database).await,
            "drop_database" => run(doc! { "dropDatabase": 1 }, database).await,
            "create" => {
                let mut cmd = command.clone();
                cmd.insert("create", &coll);
                run(cmd, database).await
            }
            "create_indexes" => {
                let indexes: Vec<Bson> = command
                    .get_array("indexes")
                    .map_err(|e| format!("createIndexes without indexes: {e}"))?
                    .iter()
                    .map(|i| match i {
                        Bson::Document(d) => {
                            let mut d = d.clone();
                            d.remove("ns");
                            d.remove("v");
                            Bson::Document(d)
                        }
                        other => other.clone(),
                    })
                    .collect();
                run(
                    doc! { "createIndexes": &coll, "indexes": indexes },
                    database,
                )
                .await
            }
            "drop_indexes" => {
                let index = command
                    .get("index")
                    .cloned()
                    .unwrap_or(Bson::String("*".into()));
                run(doc! { "dropIndexes": &coll, "index": index }, database).await
            }
            "rename" => {
                let (tdb, tcoll) = self.config.target(&ddl.new_database, &ddl.new_table);
                run(
                    doc! { "renameCollection": format!("{db}.{coll}"), "to": format!("{tdb}.{tcoll}"), "dropTarget": false },
                    self.client.database("admin"),
                )
                .await
            }
            _ => Ok(()),
        };
        match result {
            Ok(()) => {
                if destructive {
                    self.record_applied(key, event.version).await?;
                }
                self.metrics.ddl.with_label_values(&[kind, "applied"]).inc();
                tracing::info!(kind, target = %format!("{db}.{coll}"), "applied source command");
                Ok(())
            }
            Err(e) => {
                self.metrics.ddl.with_label_values(&[kind, "failed"]).inc();
                Err(format!("{kind} on {db}.{coll} failed: {e}"))
            }
        }
    }

    /// Write the batch (retrying transient failures), then store its offsets.
    async fn flush(&mut self, shutdown: &Shutdown) -> Result<(), ApplyError> {
        let batch = std::mem::take(&mut *self.batch());
        if batch.offsets.is_empty() {
            return Ok(());
        }
        let started = Instant::now();
        let mut backoff = Duration::from_millis(500);
        let outcome = loop {
            match self.writer.write(&batch).await {
                Ok(outcome) => break outcome,
                Err(WriteFailure::Definite(e)) => return Err(ApplyError::Mongo(e)),
                Err(WriteFailure::Transient(e)) => {
                    self.metrics.retries.inc();
                    if shutdown.is_triggered() {
                        return Err(ApplyError::Mongo(format!(
                            "stopping with an unwritten batch (it is read again on restart): {e}"
                        )));
                    }
                    tracing::warn!(error = %e, retry_in = ?backoff, "batch write failed; retrying");
                    tokio::select! {
                        _ = shutdown.wait() => {}
                        _ = tokio::time::sleep(backoff) => {}
                    }
                    backoff = (backoff * 2).min(Duration::from_secs(30));
                }
            }
        };
        self.writer
            .settle(&batch, outcome)
            .await
            .map_err(ApplyError::Definite)?;
        batch.offsets.store(&*self.consumer);
        if batch.events > 0 {
            self.metrics.batch_events.observe(batch.events as f64);
            self.metrics
                .batch_seconds
                .observe(started.elapsed().as_secs_f64());
        }
        if let Some(c) = batch.oldest_commit_micros {
            self.metrics
                .latency
                .observe((now_micros() - c).max(0) as f64 / 1e6);
        }
        Ok(())
    }
}

impl BatchSink for Sink {
    type Drain = MongoDrain;
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
        // Kept in the batch (dead letters after a refused bulk write): copied, without the
        // headers `detach` would also copy (a dead letter carries its own).
        let kept = OwnedMessage::new(
            m.payload().map(<[u8]>::to_vec),
            m.key().map(<[u8]>::to_vec),
            m.topic().to_string(),
            m.timestamp(),
            m.partition(),
            m.offset(),
            None,
        );
        self.handle(kept, shutdown).await
    }

    async fn write_held(&mut self, shutdown: &Shutdown) -> Result<(), ApplyError> {
        self.flush(shutdown).await
    }
}
