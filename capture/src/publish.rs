//! Publishing change events to Kafka, and the checkpoints that make a restart lose nothing.
//!
//! Every record is handed to an idempotent `acks=all` producer without waiting; its delivery
//! future goes, in order, into a bounded queue that one task (the acker) awaits front to back.
//! The capture puts a *mark* into the same queue at each transaction commit. When the acker
//! reaches a mark, every record before it is acknowledged, so the mark's position is safe to
//! resume from; the acker writes it to the checkpoint topic (compacted, key = connector name)
//! at most every `checkpoint_interval_ms`, and always when the capture stops.
//!
//! The queue is bounded (`max_in_flight`): a slow broker slows the reader instead of growing
//! memory. A record that cannot be delivered (librdkafka gave up) stops the capture; on restart
//! it resumes from the last checkpoint, and replays are harmless because events carry versions.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use prometheus::{Histogram, HistogramOpts, IntCounterVec, Opts, Registry};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::producer::{DeliveryFuture, FutureProducer, FutureRecord, Producer};
use rdkafka::{Message, Offset, TopicPartitionList};
use serde::{de::DeserializeOwned, Deserialize, Serialize};
use sluice_common::KafkaConfig;
use tokio::sync::mpsc;

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

enum Pending<C> {
    Delivery {
        fut: DeliveryFuture,
        topic: std::sync::Arc<str>,
        sent: Instant,
    },
    Mark(C),
}

/// Hands records to Kafka in order and marks safe resume points. See the module docs.
pub struct Publisher<C> {
    producer: FutureProducer,
    kafka: KafkaConfig,
    client_id: String,
    config: PublishConfig,
    /// Topics known to exist, with their partition counts (and a shared copy of the name).
    topics: HashMap<String, (i32, std::sync::Arc<str>)>,
    queue: mpsc::Sender<Pending<C>>,
    acker: tokio::task::JoinHandle<Result<Option<C>, PublishError>>,
    timeout: Duration,
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
        let producer: FutureProducer = producer_config.create()?;
        let (tx, rx) = mpsc::channel(config.max_in_flight);
        let acker = tokio::spawn(ack_loop(
            rx,
            producer.clone(),
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
            queue: tx,
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
        if let Some((n, _)) = self.topics.get(topic) {
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
        self.topics.insert(topic.to_string(), (n, topic.into()));
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

    /// Hand a record to the producer (waiting while its queue is full) and queue its delivery.
    pub async fn send(
        &mut self,
        topic: &str,
        key: &[u8],
        payload: &[u8],
        partition: Option<i32>,
    ) -> Result<(), PublishError> {
        let mut record = FutureRecord::to(topic).key(key).payload(payload);
        if let Some(p) = partition {
            record = record.partition(p);
        }
        let fut = loop {
            match self.producer.send_result(record) {
                Ok(fut) => break fut,
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), r)) => {
                    record = r;
                    tokio::time::sleep(Duration::from_millis(2)).await;
                }
                Err((e, _)) => return Err(e.into()),
            }
        };
        let topic = match self.topics.get(topic) {
            Some((_, name)) => name.clone(),
            None => topic.into(),
        };
        self.queue
            .send(Pending::Delivery {
                fut,
                topic,
                sent: Instant::now(),
            })
            .await
            .map_err(|_| PublishError::AckerGone)
    }

    /// Publish one record and wait for its acknowledgement (schema records).
    pub async fn send_and_wait(
        &self,
        topic: &str,
        key: &[u8],
        payload: &[u8],
    ) -> Result<(), PublishError> {
        self.producer
            .send(
                FutureRecord::to(topic).key(key).payload(payload),
                Duration::from_millis(self.config.delivery_timeout_ms),
            )
            .await
            .map(|_| ())
            .map_err(|(e, _)| PublishError::Delivery {
                topic: topic.to_string(),
                reason: e.to_string(),
            })
    }

    /// Everything sent so far, once acknowledged, makes `checkpoint` safe to resume from.
    pub async fn mark(&mut self, checkpoint: C) -> Result<(), PublishError> {
        self.queue
            .send(Pending::Mark(checkpoint))
            .await
            .map_err(|_| PublishError::AckerGone)
    }

    /// True when the acker stopped (a delivery failed): the caller should `finish` to learn why.
    pub fn failed(&self) -> bool {
        self.acker.is_finished()
    }

    /// Wait for every queued record, write the last safe checkpoint, and return it.
    pub async fn finish(self) -> Result<Option<C>, PublishError> {
        drop(self.queue);
        let last = self.acker.await.map_err(|_| PublishError::AckerGone)??;
        let _ = self.producer.flush(self.timeout);
        Ok(last)
    }
}

async fn ack_loop<C: Serialize + Clone>(
    mut rx: mpsc::Receiver<Pending<C>>,
    producer: FutureProducer,
    topic: String,
    connector: String,
    interval: Duration,
    metrics: PublishMetrics,
) -> Result<Option<C>, PublishError> {
    let mut safe: Option<C> = None;
    let mut written = true; // nothing to write yet
    let mut last_write = Instant::now();
    let write = |c: C| {
        let producer = producer.clone();
        let topic = topic.clone();
        let connector = connector.clone();
        let metrics = metrics.clone();
        async move {
            let payload = serde_json::to_vec(&c).expect("checkpoints serialize");
            let r = producer
                .send(
                    FutureRecord::to(&topic).key(&connector).payload(&payload),
                    Duration::from_secs(60),
                )
                .await;
            match r {
                Ok(_) => {
                    metrics.checkpoints.with_label_values(&["ok"]).inc();
                    Ok(())
                }
                Err((e, _)) => {
                    metrics.checkpoints.with_label_values(&["error"]).inc();
                    Err(PublishError::Checkpoint {
                        topic: topic.clone(),
                        reason: e.to_string(),
                    })
                }
            }
        }
    };
    loop {
        let next = if written {
            rx.recv().await
        } else {
            // A checkpoint is waiting: write it when the interval is up, or at the end.
            match tokio::time::timeout_at(
                tokio::time::Instant::from_std(last_write + interval),
                rx.recv(),
            )
            .await
            {
                Ok(n) => n,
                Err(_) => {
                    write(safe.clone().expect("pending")).await?;
                    written = true;
                    last_write = Instant::now();
                    continue;
                }
            }
        };
        match next {
            Some(Pending::Delivery { fut, topic, sent }) => match fut.await {
                Ok(Ok(_)) => metrics
                    .produce_latency
                    .observe(sent.elapsed().as_secs_f64()),
                Ok(Err((e, _))) => {
                    return Err(PublishError::Delivery {
                        topic: topic.to_string(),
                        reason: e.to_string(),
                    })
                }
                Err(_) => {
                    return Err(PublishError::Delivery {
                        topic: topic.to_string(),
                        reason: "the producer dropped the record".into(),
                    })
                }
            },
            Some(Pending::Mark(c)) => {
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
