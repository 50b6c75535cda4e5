//! apply-mongo: change topics to MongoDB collections, in batches, offsets after the write.
//!
//! Progress and resumption:
//! - Events are read from the consumer group's partitions and turned into writes
//!   ([`super::write`]) held in the batch ([`batch`]). A batch closes at `batch.max_events`,
//!   `batch.max_bytes`, or once it holds an event and `batch.max_wait_ms` has passed since the
//!   previous write began (`due` in `group/run.rs`); it is written round by
//!   round (one write per document per round, unordered within a round: [`writer`]) and only
//!   when MongoDB has acknowledged every write (with the configured write concern) are the
//!   partitions' offsets stored.
//! - A transient failure of the batch write (network, no primary, an election or shutdown, a
//!   write concern timeout: by the server's code and labels, never its message) writes the
//!   same batch again with backoff (0.5 s to 5 s) while nothing more is read. Writes are
//!   idempotent, so the repeated part changes nothing. Any other failure of a whole command,
//!   an unknown server code included, stops the sink with the server's message: nothing after
//!   the last written batch is stored, so it is all read again after the fix.
//! - A write MongoDB refuses for that document alone (duplicate key on a unique index,
//!   validation, size) sends its event to the dead-letter topic with the server's message (or
//!   stops the process, with `errors.on_bad_event = "stop"`); the rest of the batch is written.
//! - A DDL event is applied in order with its partition: the batch so far is written first
//!   ([`ddl`]). Drops, renames and database drops are recorded with their version in
//!   `<meta_database>.applied_ddl`: the same command arriving on the other partitions is not
//!   applied again, and a row event older than it (read late from another partition, or
//!   replayed after a restart) is skipped instead of bringing back what was dropped.
//! - Before partitions are revoked (rebalance) the batch in hand is written and committed from
//!   the revoke callback ([`drain`]); SIGTERM does the same and exits.
//! - A member writes a partition only while it is its newest owner ([`fence`]): one that lost
//!   its partitions while retrying stops instead of overwriting the new owner's writes.

mod batch;
mod ddl;
mod drain;
mod fence;
mod metrics;
mod writer;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use prometheus::Registry;
use rdkafka::consumer::{Consumer, StreamConsumer};
use rdkafka::message::{BorrowedMessage, OwnedMessage};
use rdkafka::Message;
use sluice_common::clock::now_micros;
use sluice_common::Shutdown;
use sluice_proto::v1::Op;
use sluice_proto::view::RowEvent;

use self::batch::Batch;
use self::ddl::{AppliedDdl, Stopped};
use self::drain::MongoDrain;
use self::metrics::Metrics;
use self::writer::Writer;
use super::write::writes_of;
use super::Config;
use crate::consumer::subscribe;
use crate::error::{ApplyError, BadEvent, Reason};
use crate::group::{BatchSink, DeadLetters, GroupContext};

type Context = GroupContext<MongoDrain>;

pub struct Sink {
    config: Config,
    client: mongodb::Client,
    consumer: Arc<StreamConsumer<Context>>,
    /// The consumer's settings, for a new one after a fatal error ([`BatchSink::rejoin`]).
    consumer_config: rdkafka::ClientConfig,
    batch: Arc<Mutex<Batch>>,
    writer: Writer,
    metrics: Metrics,
    /// The drops and renames applied, by version.
    applied: AppliedDdl,
    /// Collections stopped (the capture refused them), kept across restarts.
    stopped: Stopped,
    /// A batch the rebalance callback could not write (see [`MongoDrain`]).
    drain_failed: Arc<Mutex<Option<String>>>,
    /// Failures in a row, for `/healthz`.
    outage: Arc<crate::group::Outage>,
    /// Source database -> collection -> target namespace ([`Config::target`], worked out once).
    targets: HashMap<String, HashMap<String, Target>>,
    /// When its batches are due.
    pace: crate::group::Pace,
}

/// A target database and collection, shared by every write to them.
type Target = (Arc<str>, Arc<str>);

/// The group's consumer, subscribed; its rebalances drain `batch`.
fn consumer(
    cc: &rdkafka::ClientConfig,
    config: &Config,
    metrics: &Metrics,
    batch: &Arc<Mutex<Batch>>,
    writer: &Writer,
    failed: &Arc<Mutex<Option<String>>>,
    health: &sluice_common::metrics::Health,
) -> Result<StreamConsumer<Context>, ApplyError> {
    let consumer: StreamConsumer<Context> = cc.create_with_context(
        GroupContext::new(
            metrics.group.clone(),
            MongoDrain {
                batch: batch.clone(),
                writer: writer.clone(),
                runtime: tokio::runtime::Handle::current(),
                failed: failed.clone(),
            },
        )
        .watching(&config.consumer.group_id, health),
    )?;
    subscribe(&consumer, &config.consumer.topics)?;
    Ok(consumer)
}

impl Sink {
    pub async fn start(
        config: Config,
        registry: &Registry,
        health: sluice_common::metrics::Health,
    ) -> Result<Self, ApplyError> {
        let metrics = Metrics::new(registry).expect("metrics register once");
        let client = mongodb::Client::with_uri_str(config.mongodb.uri.expose()).await?;
        let mut cc = config.consumer.client_config(&config.kafka, "apply-mongo");
        if config.delay_seconds > 0 {
            // Waiting for an event to age must not look like a dead consumer.
            let ms = (config.delay_seconds * 1000 + 60_000).max(300_000);
            cc.set("max.poll.interval.ms", ms.min(i32::MAX as u64).to_string());
        }
        let dead = DeadLetters::start(
            &config.kafka,
            "apply-mongo",
            &config.errors.dead_letter_topic,
        )
        .await?;
        let batch = Arc::new(Mutex::new(Batch::default()));
        let writer = Writer::new(
            client.clone(),
            &config.mongodb,
            dead,
            config.errors.on_bad_event,
            metrics.clone(),
            fence::Fence::new(
                &client,
                &config.mongodb.meta_database,
                &config.consumer.group_id,
                fence::member_name(&config.consumer.instance_id),
                &config.mongodb,
            ),
        );
        let drain_failed = Arc::new(Mutex::new(None));
        let consumer = consumer(
            &cc,
            &config,
            &metrics,
            &batch,
            &writer,
            &drain_failed,
            &health,
        )?;
        let mut applied = AppliedDdl::new(&client, &config.mongodb.meta_database);
        applied.read().await?;
        let outage = crate::group::Outage::new(
            health.clone(),
            Duration::from_millis(config.errors.degraded_after_ms),
        );
        let mut stopped = Stopped::new(
            &client,
            &config.mongodb.meta_database,
            health,
            metrics.stopped.clone(),
        );
        stopped.read().await?;
        Ok(Self {
            client,
            consumer: Arc::new(consumer),
            consumer_config: cc,
            batch,
            writer,
            metrics,
            applied,
            stopped,
            drain_failed,
            outage,
            targets: HashMap::new(),
            pace: crate::group::Pace::new(Duration::from_millis(config.batch.max_wait_ms)),
            config,
        })
    }

    /// Consume until shutdown; then write what is held, commit, and return.
    pub async fn run(mut self, shutdown: Shutdown) -> Result<(), ApplyError> {
        let result = crate::group::run(&mut self, &shutdown).await;
        crate::group::close_within(self, "apply-mongo").await;
        result
    }

    fn batch(&self) -> std::sync::MutexGuard<'_, Batch> {
        self.batch.lock().expect("batch lock")
    }

    fn full(&self) -> bool {
        let b = self.batch();
        b.events >= self.config.batch.max_events || b.bytes >= self.config.batch.max_bytes
    }

    /// One event: read it, wait until it is due, then apply a DDL event (after the batch so
    /// far) or take a row event's writes into the batch; its offset is stored with the batch.
    async fn handle(&mut self, m: OwnedMessage, shutdown: &Shutdown) -> Result<(), ApplyError> {
        // Read where it lies: a row event's documents are copied once, into its writes. A DDL
        // event is decoded whole when applied.
        let payload = m.payload().unwrap_or_default();
        let event = match read(payload) {
            Ok(e) => e,
            Err(bad) => {
                // A row event this build cannot apply (a newer contract) still names its
                // collection, which would lack the change: stopped first.
                if let Ok(e) = RowEvent::parse(payload) {
                    if matches!(
                        e.op(),
                        Op::Insert | Op::Update | Op::Delete | Op::SnapshotRead
                    ) {
                        let (db, coll) = self.target(e.database, e.table);
                        self.writer
                            .stop_for(&m, &format!("{db}.{coll}"), &bad)
                            .await?;
                        self.record_stops();
                    }
                }
                return self.skip(&m, &bad).await;
            }
        };
        if !self.due(event.commit_time_micros, shutdown).await? {
            return Ok(()); // not recorded: read again
        }
        self.batch().started.get_or_insert_with(Instant::now);
        match event.op() {
            Op::Ddl | Op::Truncate => {
                self.flush(shutdown).await?;
                // Still this partition's owner, for each attempt of the command.
                let mut origin = crate::group::Offsets::default();
                origin.record(&m);
                if let Err(bad) = self.apply_ddl_event(payload, &origin, shutdown).await? {
                    self.refused_ddl(&m, &bad).await?;
                    self.writer.dead_letter(&m, &bad).await?;
                }
                self.batch().offsets.record(&m);
            }
            Op::Insert | Op::Update | Op::Delete | Op::SnapshotRead => {
                let target = self.target(event.database, event.table);
                self.record_stops();
                // Another instance may have stopped a collection (its keys are on every
                // partition): read the record again before taking an event, once 5 s have gone by.
                if let Err(e) = self.stopped.refresh().await {
                    tracing::warn!(error = %e, "reading the stopped collections again failed; retrying in 5 s");
                }
                if !self.stopped.is_empty() {
                    let ns = format!("{}.{}", target.0, target.1);
                    if let Some(why) = self.stopped.why(&ns, event.version) {
                        let reason = format!(
                            "collection {ns} is stopped: {why} (delete its document from {} \
                             to take it up again)",
                            self.stopped.log.name
                        );
                        return self
                            .skip(&m, &BadEvent::new(Reason::TableStopped, reason))
                            .await;
                    }
                }
                if self
                    .applied
                    .stale(&target.0, &target.1, event.version)
                    .await?
                {
                    self.metrics.stale.inc();
                    self.batch().offsets.record(&m);
                    return Ok(());
                }
                match writes_of(&event) {
                    Ok(writes) => {
                        let commit_time_micros = event.commit_time_micros;
                        self.batch().push(&target, writes, commit_time_micros, m);
                    }
                    Err(reason) => {
                        let reason = format!("{}.{}: {reason}", event.database, event.table);
                        let bad = BadEvent::new(Reason::Value, reason);
                        // Stopped (recorded) first, then past it.
                        let ns = format!("{}.{}", target.0, target.1);
                        self.writer.stop_for(&m, &ns, &bad).await?;
                        self.record_stops();
                        self.skip(&m, &bad).await?;
                    }
                }
            }
            _ => self.batch().offsets.record(&m), // heartbeats, transaction markers
        }
        Ok(())
    }

    /// A drop or rename the target refused leaves documents the source no longer has where
    /// they were: the collection stops. (A refused index or validator command leaves the
    /// documents as the source has them: dead-lettered only.)
    async fn refused_ddl(&mut self, m: &OwnedMessage, bad: &BadEvent) -> Result<(), ApplyError> {
        use prost::Message as _;
        let Ok(e) = sluice_proto::ChangeEvent::decode(m.payload().unwrap_or_default()) else {
            return Ok(());
        };
        let kind = e.ddl.as_ref().map(|d| d.kind.as_str()).unwrap_or_default();
        if matches!(kind, "drop" | "rename") && !e.table.is_empty() {
            let (db, coll) = self.target(&e.database, &e.table);
            self.writer
                .stop_for(m, &format!("{db}.{coll}"), bad)
                .await?;
            self.record_stops();
        }
        Ok(())
    }

    /// Take the collections refused writes stopped ([`Writer::stop_for`], which recorded them)
    /// into memory: their later events are dead-lettered.
    fn record_stops(&mut self) {
        for s in self.writer.to_stop.take() {
            self.stopped.remember(s.ns, s.reason, s.version);
        }
    }

    /// Dead-letter an event that can never be written, and go past it.
    async fn skip(&mut self, m: &OwnedMessage, bad: &BadEvent) -> Result<(), ApplyError> {
        self.writer.dead_letter(m, bad).await?;
        self.batch().offsets.record(m);
        Ok(())
    }

    /// With `delay_seconds`, wait until an event committed at `commit_time_micros` is that old
    /// (what is held is written first: the wait may be long). False when shutdown came first.
    async fn due(
        &mut self,
        commit_time_micros: i64,
        shutdown: &Shutdown,
    ) -> Result<bool, ApplyError> {
        if self.config.delay_seconds == 0 || commit_time_micros <= 0 {
            return Ok(true);
        }
        let due = commit_time_micros + self.config.delay_seconds as i64 * 1_000_000;
        let wait = due - now_micros();
        if wait > 0 {
            self.flush(shutdown).await?;
            tokio::select! {
                _ = shutdown.wait() => return Ok(false),
                _ = tokio::time::sleep(Duration::from_micros(wait as u64)) => {}
            }
        }
        Ok(true)
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

    /// Write the batch (retrying transient failures), then store its offsets.
    async fn flush(&mut self, shutdown: &Shutdown) -> Result<(), ApplyError> {
        if let Some(why) = self.drain_failed.lock().expect("failed lock").take() {
            // Events were not written when partitions were let go: storing a later offset of a
            // partition kept or taken back would skip them.
            return Err(ApplyError::definite(
                crate::error::Origin::Sink,
                format!(
                    "MongoDB: the batch in hand could not be written before a rebalance ({why}); \
                     stopping, so that its events are read again from the committed offsets"
                ),
            ));
        }
        let batch = std::mem::take(&mut *self.batch());
        if batch.offsets.is_empty() {
            return Ok(());
        }
        if !batch.items.is_empty() {
            self.pace.writing();
        }
        self.metrics.group.writing(batch.oldest_commit_micros);
        let started = Instant::now();
        let mut backoff = Duration::from_millis(500);
        let outcome = loop {
            match self.writer.write(&batch).await {
                Ok(outcome) => {
                    self.outage.ok();
                    break outcome;
                }
                Err(e) if !e.is_transient() => return Err(e),
                Err(e) => {
                    self.metrics.retries.inc();
                    self.outage.failing(&format!("MongoDB: a batch write: {e}"));
                    if shutdown.is_triggered() {
                        return Err(e.context(
                            "stopping with an unwritten batch (it is read again on restart)",
                        ));
                    }
                    tracing::warn!(server = %self.config.mongodb.uri, error = %e, retry_in = ?backoff, "batch write failed; retrying");
                    tokio::select! {
                        _ = shutdown.wait() => {}
                        _ = tokio::time::sleep(backoff) => {}
                    }
                    backoff = (backoff * 2).min(sluice_common::RETRY_MAX);
                }
            }
        };
        self.writer.settle(&batch, outcome).await?;
        // Before the offsets: a restart must find the collection stopped.
        self.record_stops();
        batch
            .offsets
            .store(&*self.consumer, &self.consumer.context().incarnations);
        self.metrics
            .group
            .written(&batch.offsets, batch.oldest_commit_micros);
        // Collections other instances stopped meanwhile (their keys are on every partition).
        if let Err(e) = self.stopped.refresh().await {
            tracing::warn!(error = %e, "reading the stopped collections again failed; retrying after the next batch");
        }
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

/// A row event's envelope, read where it lies; an event this build cannot read is a
/// [`BadEvent`] (`undecodable`).
fn read(payload: &[u8]) -> Result<RowEvent<'_>, BadEvent> {
    let bad = |message: String| BadEvent::new(Reason::Undecodable, message);
    match RowEvent::parse(payload) {
        Ok(e) if e.contract > sluice_proto::CONTRACT_VERSION => Err(bad(format!(
            "contract version {} is newer than this build's {}",
            e.contract,
            sluice_proto::CONTRACT_VERSION
        ))),
        Ok(e) => Ok(e),
        Err(e) => Err(bad(format!("not a change event: {e}"))),
    }
}

impl BatchSink for Sink {
    type Drain = MongoDrain;

    fn consumer(&self) -> Arc<StreamConsumer<Context>> {
        self.consumer.clone()
    }

    fn batch_started(&self) -> Option<Instant> {
        self.batch().started
    }

    fn batch_full(&self) -> bool {
        self.full()
    }

    fn pace(&self) -> &crate::group::Pace {
        &self.pace
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

    fn skip(&mut self, m: &BorrowedMessage<'_>) {
        let mut batch = self.batch();
        batch.started.get_or_insert_with(Instant::now);
        batch.offsets.record(m);
    }

    async fn write_held(&mut self, shutdown: &Shutdown) -> Result<(), ApplyError> {
        if self.batch().events == 0 {
            // Idle: a collection taken up again (or stopped by another instance) is seen
            // without waiting for an event (its /healthz and gauge with it).
            if let Err(e) = self.stopped.refresh().await {
                tracing::debug!(error = %e, "reading the stopped collections again failed");
            }
        }
        self.flush(shutdown).await
    }

    async fn rejoin(&mut self) -> Result<Arc<StreamConsumer<Context>>, ApplyError> {
        crate::group::retire(&self.consumer);
        // Nothing of the batch in hand is stored: the new consumer reads it again. The
        // partitions' claims go too; they are claimed again when assigned.
        let dropped = std::mem::take(&mut *self.batch.lock().expect("batch lock"));
        tracing::info!(
            events = dropped.events,
            "the batch in hand is dropped; its events are read again"
        );
        self.writer.fence.forget();
        *self.drain_failed.lock().expect("failed lock") = None;
        // (the stage's `/healthz`, which the old consumer's membership watch spoke to)
        let health = self.consumer.context().health.clone().unwrap_or_default();
        let new = consumer(
            &self.consumer_config,
            &self.config,
            &self.metrics,
            &self.batch,
            &self.writer,
            &self.drain_failed,
            &health,
        )?;
        Ok(std::mem::replace(&mut self.consumer, Arc::new(new)))
    }
}
