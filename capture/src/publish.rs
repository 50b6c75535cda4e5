//! Publishing change events to Kafka, and the checkpoints that make a restart lose nothing.
//!
//! Every record is handed to an idempotent `acks=all` producer without waiting, numbered in the
//! order it was handed over. librdkafka's delivery callbacks tick the numbers off in a
//! [`Ledger`], which publishes how many records are acknowledged without a gap. At each
//! transaction commit the capture queues a *mark*: the checkpoint and the count of records sent
//! before it. One task (the acker) takes the marks in order; once the gap-free count reaches a
//! mark, every record before it is acknowledged, so the mark's position is safe to resume from.
//! The acker writes it to the checkpoint topic (compacted, key = connector name) at most every
//! `checkpoint_interval_ms`, and always when the capture stops.
//!
//! At most `max_in_flight` records are unacknowledged: a slow broker slows the reader instead
//! of growing memory. A record that cannot be delivered (librdkafka gave up) stops the capture; on restart
//! it resumes from the last checkpoint, and replays are harmless because events carry versions.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use prometheus::{Histogram, HistogramOpts, IntCounterVec, Opts, Registry};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::producer::{BaseRecord, DeliveryResult, Producer, ProducerContext, ThreadedProducer};
use rdkafka::{ClientContext, Message, Offset, TopicPartitionList};
use serde::{de::DeserializeOwned, Deserialize, Serialize};
use sluice_common::KafkaConfig;
use tokio::sync::{mpsc, watch};

#[derive(Debug, thiserror::Error)]
pub enum PublishError {
    #[error("Kafka client: {0}")]
    Client(#[from] KafkaError),
    #[error("topic {topic}: cannot create it: {reason}")]
    CreateTopic { topic: String, reason: String },
    #[error("topic {topic}: delivery failed: {reason}")]
    Delivery { topic: String, reason: String },
    #[error("checkpoint topic {topic}: {reason}")]
    Checkpoint { topic: String, reason: String },
    #[error("the acknowledgement task stopped")]
    AckerGone,
}

/// `[publish]`: how events and checkpoints are written.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, default)]
pub struct PublishConfig {
    /// Partitions of the change topics the capture creates; -1 takes the broker's
    /// `num.partitions`. Default -1.
    pub partitions: i32,
    /// Replication factor of the topics the capture creates; -1 takes the broker's
    /// `default.replication.factor`. Default -1.
    pub replication_factor: i32,
    /// The compacted topic of schema records. Default `_sluice_schemas`.
    pub schema_topic: String,
    /// The compacted topic of checkpoints (key = connector). Default `_sluice_checkpoints`.
    pub checkpoint_topic: String,
    /// Write a checkpoint at most this often, in milliseconds. Default 1000.
    pub checkpoint_interval_ms: u64,
    /// Records handed to the producer but not yet acknowledged, at most. Default 100000.
    pub max_in_flight: usize,
    /// Bytes (keys and values) handed to the producer but not yet acknowledged, at most; a
    /// larger record still goes, alone. Default 16777216 (16 MiB).
    pub max_in_flight_bytes: usize,
    /// How long a record may wait for its acknowledgement, in milliseconds
    /// (`message.timeout.ms`). Default 120000.
    pub delivery_timeout_ms: u64,
    /// The largest event, in bytes: the producer's `message.max.bytes` and the
    /// `max.message.bytes` of the topics the capture creates (a MongoDB document may be 16 MiB,
    /// an event can carry it twice). Default 67108864 (64 MiB).
    pub max_message_bytes: usize,
}

impl Default for PublishConfig {
    fn default() -> Self {
        Self {
            partitions: -1,
            replication_factor: -1,
            schema_topic: "_sluice_schemas".into(),
            checkpoint_topic: "_sluice_checkpoints".into(),
            checkpoint_interval_ms: 1000,
            max_in_flight: 100_000,
            max_in_flight_bytes: 16 << 20,
            delivery_timeout_ms: 120_000,
            max_message_bytes: 64 << 20,
        }
    }
}

impl PublishConfig {
    pub fn validate(&self) -> Result<(), (String, String)> {
        let bad = |k: &str, m: &str| Err((format!("publish.{k}"), m.to_string()));
        if self.partitions == 0 || self.partitions < -1 {
            return bad("partitions", "must be -1 (broker default) or at least 1");
        }
        if self.replication_factor == 0 || self.replication_factor < -1 {
            return bad(
                "replication_factor",
                "must be -1 (broker default) or at least 1",
            );
        }
        if self.schema_topic.is_empty() || self.checkpoint_topic.is_empty() {
            return bad("schema_topic", "topic names must not be empty");
        }
        if self.max_in_flight == 0 {
            return bad("max_in_flight", "must be at least 1");
        }
        if self.max_in_flight_bytes < 1 << 16 {
            return bad("max_in_flight_bytes", "must be at least 65536");
        }
        if !(1 << 20..=1 << 30).contains(&self.max_message_bytes) {
            return bad("max_message_bytes", "must be between 1 MiB and 1 GiB");
        }
        if self.delivery_timeout_ms < 1000 {
            return bad("delivery_timeout_ms", "must be at least 1000");
        }
        Ok(())
    }
}

/// The metrics every capture serves, whatever its source: events handed to Kafka, their
/// acknowledgement, checkpoints, the source lag and errors.
#[derive(Clone)]
pub struct PublishMetrics {
    pub lag_seconds: prometheus::IntGauge,
    pub errors: IntCounterVec,
    pub events: IntCounterVec,
    pub bytes: IntCounterVec,
    pub produce_latency: Histogram,
    pub checkpoints: IntCounterVec,
}

impl PublishMetrics {
    pub fn new(registry: &Registry) -> prometheus::Result<Self> {
        let events = IntCounterVec::new(
            Opts::new(
                "sluice_capture_events_total",
                "Change events handed to Kafka, by database, table and operation.",
            ),
            &["database", "table", "op"],
        )?;
        let bytes = IntCounterVec::new(
            Opts::new(
                "sluice_capture_event_bytes_total",
                "Bytes of change event payloads handed to Kafka, by database and table.",
            ),
            &["database", "table"],
        )?;
        let produce_latency = Histogram::with_opts(
            HistogramOpts::new(
                "sluice_capture_produce_latency_seconds",
                "Time from handing a record to the producer to its acknowledgement.",
            )
            .buckets(vec![
                0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
            ]),
        )?;
        let checkpoints = IntCounterVec::new(
            Opts::new(
                "sluice_capture_checkpoints_total",
                "Checkpoints written to the checkpoint topic, by outcome.",
            ),
            &["outcome"],
        )?;
        let lag_seconds = prometheus::IntGauge::new(
            "sluice_capture_lag_seconds",
            "Now minus the source timestamp of the last event read (0 when idle and caught up).",
        )?;
        let errors = IntCounterVec::new(
            Opts::new("sluice_capture_errors_total", "Errors by type."),
            &["error_type"],
        )?;
        registry.register(Box::new(lag_seconds.clone()))?;
        registry.register(Box::new(errors.clone()))?;
        registry.register(Box::new(events.clone()))?;
        registry.register(Box::new(bytes.clone()))?;
        registry.register(Box::new(produce_latency.clone()))?;
        registry.register(Box::new(checkpoints.clone()))?;
        Ok(Self {
            lag_seconds,
            errors,
            events,
            bytes,
            produce_latency,
            checkpoints,
        })
    }
}

/// Delivery bookkeeping, shared with librdkafka's delivery callbacks (which run on the
/// producer's polling thread). Every record gets the next sequence number as its delivery
/// opaque; `acked` publishes the count of records acknowledged without a gap (every sequence
/// number below it is delivered). No per-record future, channel message or allocation.
pub struct Ledger {
    state: std::sync::Mutex<LedgerState>,
    acked: watch::Sender<u64>,
    /// Turns true at the first failure.
    failed: watch::Sender<bool>,
    latency: Histogram,
    /// Key and value bytes handed to the producer, and acknowledged.
    sent_bytes: AtomicU64,
    acked_bytes: AtomicU64,
}

struct LedgerState {
    /// Every sequence number below `base` is acknowledged.
    base: u64,
    /// Acknowledged or not, for `base`, `base + 1`, ...
    done: VecDeque<bool>,
    /// The first failure: the topic and librdkafka's reason. Nothing at or after a failed
    /// record is ever counted as acknowledged.
    failure: Option<(String, String)>,
}

impl Ledger {
    fn new(latency: Histogram) -> Self {
        Self {
            state: std::sync::Mutex::new(LedgerState {
                base: 0,
                done: VecDeque::new(),
                failure: None,
            }),
            acked: watch::channel(0).0,
            failed: watch::channel(false).0,
            latency,
            sent_bytes: AtomicU64::new(0),
            acked_bytes: AtomicU64::new(0),
        }
    }

    /// Key and value bytes handed to the producer and not yet acknowledged.
    fn bytes_in_flight(&self) -> u64 {
        // Acknowledged first: a delivery between the two reads can only make this larger.
        let acked = self.acked_bytes.load(Ordering::Acquire);
        self.sent_bytes
            .load(Ordering::Acquire)
            .saturating_sub(acked)
    }

    fn fail(&self, topic: &str, reason: String) {
        let mut s = self.state.lock().expect("ledger lock");
        s.failure.get_or_insert_with(|| (topic.to_string(), reason));
        drop(s);
        // Wake every waiter so it sees the failure.
        self.failed.send_replace(true);
        self.acked.send_modify(|_| {});
    }

    fn failure(&self) -> Option<PublishError> {
        let s = self.state.lock().expect("ledger lock");
        s.failure
            .as_ref()
            .map(|(topic, reason)| PublishError::Delivery {
                topic: topic.clone(),
                reason: reason.clone(),
            })
    }

    /// Record `seq` as acknowledged; returns the new gap-free count when it moved.
    fn done(&self, seq: u64) -> Option<u64> {
        let mut s = self.state.lock().expect("ledger lock");
        let Some(idx) = seq.checked_sub(s.base) else {
            return None; // cannot happen: each sequence number is acknowledged once
        };
        let idx = idx as usize;
        if idx >= s.done.len() {
            s.done.resize(idx + 1, false);
        }
        s.done[idx] = true;
        let mut moved = 0;
        while s.done.front() == Some(&true) {
            s.done.pop_front();
            moved += 1;
        }
        if moved == 0 {
            return None;
        }
        s.base += moved;
        Some(s.base)
    }

    /// Wait until every record below `upto` is acknowledged, or one failed.
    async fn wait(&self, rx: &mut watch::Receiver<u64>, upto: u64) -> Result<(), PublishError> {
        loop {
            if let Some(e) = self.failure() {
                return Err(e);
            }
            if *rx.borrow_and_update() >= upto {
                return Ok(());
            }
            rx.changed().await.map_err(|_| PublishError::AckerGone)?;
        }
    }
}

impl ClientContext for Ledger {}

impl ProducerContext for Ledger {
    type DeliveryOpaque = usize;

    fn delivery(&self, result: &DeliveryResult<'_>, seq: usize) {
        match result {
            Ok(m) => {
                let size = m.payload_len() + m.key_len();
                self.acked_bytes.fetch_add(size as u64, Ordering::Release);
                if let Some(sent) = m.timestamp().to_millis() {
                    let now = std::time::SystemTime::now()
                        .duration_since(std::time::UNIX_EPOCH)
                        .map(|d| d.as_millis() as i64)
                        .unwrap_or(sent);
                    self.latency.observe((now - sent).max(0) as f64 / 1000.0);
                }
                if let Some(acked) = self.done(seq as u64) {
                    self.acked.send_replace(acked);
                }
            }
            Err((e, m)) => self.fail(m.topic(), e.to_string()),
        }
    }
}

type KafkaProducer = ThreadedProducer<Ledger>;

/// Whether `records` unacknowledged records of `bytes` bytes leave no room for another of
/// `size` bytes: too many records, or too many bytes with it, unless nothing is in flight (a
/// record larger than the limit goes, alone).
fn full(records: u64, bytes: u64, size: u64, max: u64, max_bytes: u64) -> bool {
    records >= max || (records > 0 && bytes + size > max_bytes)
}

/// A point the acker waits for: every record below `upto` acknowledged.
enum Mark<C> {
    /// ... makes `checkpoint` safe to resume from.
    At { upto: u64, checkpoint: C },
    /// ... and then the acker writes the last checkpoint and returns.
    End { upto: u64 },
}

/// Hands records to Kafka in order and marks safe resume points. See the module docs.
pub struct Publisher<C> {
    producer: Arc<KafkaProducer>,
    kafka: KafkaConfig,
    client_id: String,
    config: PublishConfig,
    /// Topics known to exist, with their partition counts.
    topics: HashMap<String, i32>,
    /// The next record's sequence number (shared with the acker's checkpoint records).
    next: Arc<AtomicU64>,
    /// The gap-free acknowledged count, and the last value read of it.
    acked: watch::Receiver<u64>,
    acked_seen: u64,
    marks: mpsc::Sender<Mark<C>>,
    acker: tokio::task::JoinHandle<Result<Option<C>, PublishError>>,
    timeout: Duration,
}

/// Hand one record to the producer, waiting while its queue is full; returns its sequence
/// number.
async fn produce(
    producer: &KafkaProducer,
    next: &AtomicU64,
    topic: &str,
    key: &[u8],
    payload: &[u8],
    partition: Option<i32>,
) -> Result<u64, PublishError> {
    let seq = next.fetch_add(1, Ordering::Relaxed);
    let mut record = BaseRecord::with_opaque_to(topic, seq as usize)
        .key(key)
        .payload(payload);
    if let Some(p) = partition {
        record = record.partition(p);
    }
    loop {
        match producer.send(record) {
            Ok(()) => {
                let size = key.len() + payload.len();
                producer
                    .context()
                    .sent_bytes
                    .fetch_add(size as u64, Ordering::Release);
                return Ok(seq);
            }
            Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), r)) => {
                record = r;
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
            Err((e, _)) => {
                // The sequence number will never be acknowledged: nothing after it counts.
                producer.context().fail(topic, e.to_string());
                return Err(e.into());
            }
        }
    }
}

impl<C> Publisher<C>
where
    C: Serialize + Clone + Send + Sync + 'static,
{
    /// Connect, make sure the schema and checkpoint topics exist, start the acker. Checkpoints
    /// are written under `connector`.
    pub async fn start(
        kafka: &KafkaConfig,
        config: &PublishConfig,
        client_id: &str,
        connector: &str,
        metrics: PublishMetrics,
    ) -> Result<Self, PublishError> {
        let mut producer_config = kafka.producer_config(client_id);
        producer_config.set("message.timeout.ms", config.delivery_timeout_ms.to_string());
        producer_config.set("message.max.bytes", config.max_message_bytes.to_string());
        let producer: KafkaProducer =
            producer_config.create_with_context(Ledger::new(metrics.produce_latency.clone()))?;
        let producer = Arc::new(producer);
        let acked = producer.context().acked.subscribe();
        let next = Arc::new(AtomicU64::new(0));
        // Marks come once per source transaction; the bound only keeps a stalled broker from
        // growing memory (records are bounded by max_in_flight).
        let (tx, rx) = mpsc::channel(config.max_in_flight.clamp(1, 65536));
        let acker = tokio::spawn(ack_loop(
            rx,
            producer.clone(),
            next.clone(),
            config.checkpoint_topic.clone(),
            connector.to_string(),
            Duration::from_millis(config.checkpoint_interval_ms),
            metrics,
        ));
        let mut p = Self {
            producer,
            kafka: kafka.clone(),
            client_id: client_id.to_string(),
            config: config.clone(),
            topics: HashMap::new(),
            next,
            acked,
            acked_seen: 0,
            marks: tx,
            acker,
            timeout: kafka.request_timeout(),
        };
        let (schemas, checkpoints) = (config.schema_topic.clone(), config.checkpoint_topic.clone());
        p.ensure_topic(&schemas, true).await?;
        p.ensure_topic(&checkpoints, true).await?;
        Ok(p)
    }

    /// Create `topic` unless it exists; returns its partition count.
    pub async fn ensure_topic(
        &mut self,
        topic: &str,
        compacted: bool,
    ) -> Result<i32, PublishError> {
        if let Some(n) = self.topics.get(topic) {
            return Ok(*n);
        }
        let partitions = if compacted { 1 } else { self.config.partitions };
        let created = self
            .kafka
            .ensure_topic(
                &self.client_id,
                topic,
                partitions,
                self.config.replication_factor,
                compacted,
                (!compacted).then_some(self.config.max_message_bytes),
            )
            .await
            .map_err(|reason| PublishError::CreateTopic {
                topic: topic.to_string(),
                reason,
            })?;
        if created {
            tracing::info!(topic, partitions, compacted, "created topic");
        }
        let n = self.partition_count(topic).await?;
        self.topics.insert(topic.to_string(), n);
        Ok(n)
    }

    async fn partition_count(&self, topic: &str) -> Result<i32, PublishError> {
        let deadline = Instant::now() + self.timeout;
        loop {
            let md = self
                .producer
                .client()
                .fetch_metadata(Some(topic), self.timeout)?;
            if let Some(t) = md.topics().iter().find(|t| t.name() == topic) {
                if t.error().is_none() && !t.partitions().is_empty() {
                    return Ok(t.partitions().len() as i32);
                }
            }
            if Instant::now() > deadline {
                return Err(PublishError::CreateTopic {
                    topic: topic.to_string(),
                    reason: "created, but its metadata did not appear in time".into(),
                });
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Hand a record to the producer, waiting while `max_in_flight` records or
    /// `max_in_flight_bytes` bytes are unacknowledged, or the producer's queue is full.
    pub async fn send(
        &mut self,
        topic: &str,
        key: &[u8],
        payload: &[u8],
        partition: Option<i32>,
    ) -> Result<(), PublishError> {
        let max = self.config.max_in_flight as u64;
        let max_bytes = self.config.max_in_flight_bytes as u64;
        let ledger = self.producer.context();
        let size = (key.len() + payload.len()) as u64;
        let full = |next: u64, acked: u64| {
            full(next - acked, ledger.bytes_in_flight(), size, max, max_bytes)
        };
        if full(self.next.load(Ordering::Relaxed), self.acked_seen) {
            loop {
                self.acked_seen = *self.acked.borrow_and_update();
                if let Some(e) = ledger.failure() {
                    return Err(e);
                }
                if !full(self.next.load(Ordering::Relaxed), self.acked_seen) {
                    break;
                }
                self.acked
                    .changed()
                    .await
                    .map_err(|_| PublishError::AckerGone)?;
            }
        }
        produce(&self.producer, &self.next, topic, key, payload, partition).await?;
        Ok(())
    }

    /// Send one record to every partition of `topic` (created if need be): a DDL or
    /// truncate event, which every apply instance must see in order with the rows of its own
    /// partitions. Returns the partition count.
    pub async fn send_to_every_partition(
        &mut self,
        topic: &str,
        key: &[u8],
        payload: &[u8],
    ) -> Result<i32, PublishError> {
        let partitions = self.ensure_topic(topic, false).await?;
        for p in 0..partitions {
            self.send(topic, key, payload, Some(p)).await?;
        }
        Ok(partitions)
    }

    /// Publish one record and wait for its acknowledgement, and that of every record before
    /// it (schema records).
    pub async fn send_and_wait(
        &self,
        topic: &str,
        key: &[u8],
        payload: &[u8],
    ) -> Result<(), PublishError> {
        let seq = produce(&self.producer, &self.next, topic, key, payload, None).await?;
        let mut rx = self.acked.clone();
        self.producer.context().wait(&mut rx, seq + 1).await
    }

    /// Everything sent so far, once acknowledged, makes `checkpoint` safe to resume from.
    pub async fn mark(&mut self, checkpoint: C) -> Result<(), PublishError> {
        let upto = self.next.load(Ordering::Relaxed);
        self.marks
            .send(Mark::At { upto, checkpoint })
            .await
            .map_err(|_| PublishError::AckerGone)
    }

    /// True when the acker stopped (a delivery failed): the caller should `finish` to learn why.
    pub fn failed(&self) -> bool {
        self.acker.is_finished()
    }

    /// Wait for every record sent, write the last safe checkpoint, and return it.
    pub async fn finish(self) -> Result<Option<C>, PublishError> {
        let upto = self.next.load(Ordering::Relaxed);
        let _ = self.marks.send(Mark::End { upto }).await;
        drop(self.marks);
        let last = self.acker.await.map_err(|_| PublishError::AckerGone)??;
        let _ = self.producer.flush(self.timeout);
        Ok(last)
    }
}

async fn ack_loop<C: Serialize + Clone>(
    mut rx: mpsc::Receiver<Mark<C>>,
    producer: Arc<KafkaProducer>,
    next: Arc<AtomicU64>,
    topic: String,
    connector: String,
    interval: Duration,
    metrics: PublishMetrics,
) -> Result<Option<C>, PublishError> {
    let ledger = producer.context();
    let mut acked = ledger.acked.subscribe();
    let mut failed = ledger.failed.subscribe();
    let mut safe: Option<C> = None;
    let mut written = true; // nothing to write yet
    let mut last_write = Instant::now();
    // Write `c` to the checkpoint topic and wait for it (and every record before it).
    let write = |c: C| {
        let producer = producer.clone();
        let next = next.clone();
        let topic = topic.clone();
        let connector = connector.clone();
        let metrics = metrics.clone();
        async move {
            let payload = serde_json::to_vec(&c).expect("checkpoints serialize");
            let result = async {
                let seq = produce(
                    &producer,
                    &next,
                    &topic,
                    connector.as_bytes(),
                    &payload,
                    None,
                )
                .await?;
                let mut rx = producer.context().acked.subscribe();
                producer.context().wait(&mut rx, seq + 1).await
            }
            .await;
            match result {
                Ok(()) => {
                    metrics.checkpoints.with_label_values(&["ok"]).inc();
                    Ok(())
                }
                Err(e) => {
                    metrics.checkpoints.with_label_values(&["error"]).inc();
                    Err(PublishError::Checkpoint {
                        topic: topic.clone(),
                        reason: e.to_string(),
                    })
                }
            }
        }
    };
    let due = |last_write: Instant| tokio::time::Instant::from_std(last_write + interval);
    loop {
        // The next mark; meanwhile a checkpoint held is written when its interval is up, and a
        // failed delivery ends the loop.
        let mark = tokio::select! {
            m = rx.recv() => m,
            _ = tokio::time::sleep_until(due(last_write)), if !written => {
                write(safe.clone().expect("pending")).await?;
                written = true;
                last_write = Instant::now();
                continue;
            }
            changed = failed.changed() => {
                changed.map_err(|_| PublishError::AckerGone)?;
                if let Some(e) = ledger.failure() {
                    return Err(e);
                }
                continue;
            }
        };
        let (upto, checkpoint) = match mark {
            Some(Mark::At { upto, checkpoint }) => (upto, Some(checkpoint)),
            Some(Mark::End { upto }) => (upto, None),
            None => (next.load(Ordering::Relaxed), None),
        };
        // Wait for the mark's records, writing a held checkpoint when its interval is up.
        loop {
            if let Some(e) = ledger.failure() {
                return Err(e);
            }
            if *acked.borrow_and_update() >= upto {
                break;
            }
            tokio::select! {
                changed = acked.changed() => changed.map_err(|_| PublishError::AckerGone)?,
                _ = tokio::time::sleep_until(due(last_write)), if !written => {
                    write(safe.clone().expect("pending")).await?;
                    written = true;
                    last_write = Instant::now();
                }
            }
        }
        match checkpoint {
            Some(c) => {
                safe = Some(c);
                written = false;
                if last_write.elapsed() >= interval {
                    write(safe.clone().expect("set")).await?;
                    written = true;
                    last_write = Instant::now();
                }
            }
            None => {
                if !written {
                    write(safe.clone().expect("pending")).await?;
                }
                return Ok(safe);
            }
        }
    }
}

/// The last checkpoint stored under `connector`, if any: the checkpoint topic is read from its
/// start to its end (it is compacted, so this is short).
pub async fn read_checkpoint<C: DeserializeOwned + Send + 'static>(
    kafka: &KafkaConfig,
    topic: &str,
    connector: &str,
    client_id: &str,
) -> Result<Option<C>, PublishError> {
    let mut config = kafka.client_config(client_id);
    config
        .set("group.id", format!("{client_id}-checkpoint-reader"))
        .set("enable.auto.commit", "false");
    let timeout = kafka.request_timeout();
    let (topic, connector) = (topic.to_string(), connector.to_string());
    tokio::task::spawn_blocking(move || {
        let consumer: BaseConsumer = config.create()?;
        let md = consumer.fetch_metadata(Some(&topic), timeout)?;
        let Some(t) = md.topics().iter().find(|t| t.name() == topic) else {
            return Ok(None);
        };
        if t.error().is_some() || t.partitions().is_empty() {
            return Ok(None); // no such topic yet: no checkpoint
        }
        let mut last: Option<C> = None;
        for p in t.partitions() {
            let (low, high) = consumer.fetch_watermarks(&topic, p.id(), timeout)?;
            if high <= low {
                continue;
            }
            let mut tpl = TopicPartitionList::new();
            tpl.add_partition_offset(&topic, p.id(), Offset::Beginning)?;
            consumer.assign(&tpl)?;
            let deadline = Instant::now() + timeout * 3;
            loop {
                match consumer.poll(Duration::from_millis(200)) {
                    Some(Ok(m)) => {
                        if m.key() == Some(connector.as_bytes()) {
                            if let Some(payload) = m.payload() {
                                last = Some(serde_json::from_slice(payload).map_err(|e| {
                                    PublishError::Checkpoint {
                                        topic: topic.clone(),
                                        reason: format!(
                                            "record at partition {} offset {} is not a checkpoint: {e}",
                                            m.partition(),
                                            m.offset()
                                        ),
                                    }
                                })?);
                            }
                        }
                        if m.offset() + 1 >= high {
                            break;
                        }
                    }
                    Some(Err(e)) => return Err(e.into()),
                    None => {
                        if Instant::now() > deadline {
                            return Err(PublishError::Checkpoint {
                                topic: topic.clone(),
                                reason: "could not read it to its end in time".into(),
                            });
                        }
                    }
                }
            }
        }
        Ok(last)
    })
    .await
    .map_err(|_| PublishError::AckerGone)?
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ledger() -> Ledger {
        Ledger::new(Histogram::with_opts(HistogramOpts::new("t", "t")).unwrap())
    }

    #[test]
    fn in_flight_limits_count_records_and_bytes() {
        assert!(!full(9, 100, 900, 10, 1000));
        assert!(full(10, 100, 1, 10, 1000), "records");
        assert!(full(1, 999, 2, 10, 1000), "bytes, with the new record");
        // A record larger than the limit waits until nothing is in flight, then goes alone.
        assert!(full(1, 10, 5000, 10, 1000));
        assert!(!full(0, 0, 5000, 10, 1000));
    }

    #[test]
    fn the_ledger_counts_only_acknowledgements_without_a_gap() {
        let l = ledger();
        // Partitions acknowledge out of order: 2 and 1 before 0.
        assert_eq!(l.done(2), None);
        assert_eq!(l.done(1), None);
        assert_eq!(l.done(0), Some(3));
        assert_eq!(l.done(4), None);
        assert_eq!(l.done(3), Some(5));
        assert_eq!(l.done(5), Some(6));
    }

    #[tokio::test]
    async fn a_failed_record_stops_every_waiter_and_nothing_after_it_counts() {
        let l = ledger();
        let mut rx = l.acked.subscribe();
        assert_eq!(l.done(0), Some(1));
        l.acked.send_replace(1);
        assert!(l.wait(&mut rx, 1).await.is_ok());
        // Record 1 fails; 2 is acknowledged, but the count stays at 1.
        l.fail("t.db.x", "Message timed out".into());
        assert_eq!(l.done(2), None);
        let err = l.wait(&mut rx, 3).await.unwrap_err().to_string();
        assert!(err.contains("t.db.x") && err.contains("timed out"), "{err}");
    }
}
