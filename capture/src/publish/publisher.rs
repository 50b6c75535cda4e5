//! The [`Publisher`]: hands records to Kafka in order, without waiting for each, within the
//! `max_in_flight` / `max_in_flight_bytes` bounds, each numbered for the `Ledger` as it goes
//! (`produce`), on the partition its key belongs to ([`super::keying`]); creates topics; queues
//! marks for the acker (checkpoints go through a producer of their own).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{BaseRecord, Producer};
use serde::Serialize;
use sluice_common::KafkaConfig;
use tokio::sync::{mpsc, watch};

use super::acker::{ack_loop, Mark};
use super::keying;
use super::ledger::{full, KafkaProducer, Ledger};
use super::{PublishConfig, PublishError, PublishMetrics};
use crate::checkpoint::{self, CheckpointWriter, KeyCounts};

/// Hands records to Kafka in order and marks safe resume points. See [`crate::publish`].
pub struct Publisher<C> {
    producer: Arc<KafkaProducer>,
    kafka: KafkaConfig,
    client_id: String,
    config: PublishConfig,
    /// Topics known to exist, with the partition counts their keys are spread over
    /// ([`keying`]).
    topics: HashMap<String, i32>,
    /// Those counts as recorded in the checkpoint topic.
    counts: Arc<std::sync::Mutex<KeyCounts>>,
    /// The next record's sequence number (the acker reads it at the end).
    next: Arc<AtomicU64>,
    /// The gap-free acknowledged count, and the last value read of it.
    acked: watch::Receiver<u64>,
    acked_seen: u64,
    marks: mpsc::Sender<Mark<C>>,
    acker: tokio::task::JoinHandle<Result<Option<C>, PublishError>>,
    timeout: Duration,
    /// When the last heartbeat event was sent (`publish.heartbeat_interval_ms`).
    last_heartbeat: Option<Instant>,
    /// `<connector>/<incarnation>` of this start, in every record's
    /// [`sluice_common::kafka::INCARNATION_HEADER`].
    incarnation: String,
}

/// What a publisher has handed to Kafka and had acknowledged ([`Publisher::delivery`]).
#[derive(Clone)]
pub struct Delivery {
    next: Arc<AtomicU64>,
    acked: watch::Receiver<u64>,
}

impl Delivery {
    /// Records handed to the producer, and of those the ones acknowledged without a gap.
    pub fn counts(&self) -> (u64, u64) {
        (self.next.load(Ordering::Relaxed), *self.acked.borrow())
    }
}

/// Hand one record to the producer, waiting while its queue is full; returns its sequence
/// number.
async fn produce(
    producer: &KafkaProducer,
    next: &AtomicU64,
    incarnation: &str,
    topic: &str,
    key: &[u8],
    payload: &[u8],
    partition: Option<i32>,
) -> Result<u64, PublishError> {
    let seq = next.fetch_add(1, Ordering::Relaxed);
    let headers = OwnedHeaders::new_with_capacity(1).insert(Header {
        key: sluice_common::kafka::INCARNATION_HEADER,
        value: Some(incarnation),
    });
    let mut record = BaseRecord::with_opaque_to(topic, seq as usize)
        .key(key)
        .payload(payload)
        .headers(headers);
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

/// Create `topic` unless it exists: a compacted one (schemas, checkpoints) of one partition, a
/// change topic of `publish.partitions`, with `publish.max_message_bytes`.
async fn make_topic(
    kafka: &KafkaConfig,
    client_id: &str,
    config: &PublishConfig,
    topic: &str,
    compacted: bool,
) -> Result<(), PublishError> {
    let partitions = if compacted { 1 } else { config.partitions };
    let created = kafka
        .ensure_topic(
            client_id,
            topic,
            partitions,
            config.replication_factor,
            compacted,
            (!compacted).then_some(config.max_message_bytes),
        )
        .await
        .map_err(|reason| PublishError::CreateTopic {
            topic: topic.to_string(),
            reason,
        })?;
    if created {
        tracing::info!(topic, partitions, compacted, "created topic");
    }
    Ok(())
}

impl<C> Publisher<C>
where
    C: Serialize + Clone + Send + Sync + 'static,
{
    /// Connect, take the connector's checkpoints over (fencing an earlier capture of it), read
    /// its last checkpoint, make sure the schema and checkpoint topics exist, start the acker.
    /// Checkpoints are written under `connector`. Returns the publisher and the checkpoint to
    /// resume from: read only after the fencing, so no earlier capture overwrites it.
    pub async fn start(
        kafka: &KafkaConfig,
        config: &PublishConfig,
        client_id: &str,
        connector: &str,
        metrics: PublishMetrics,
    ) -> Result<(Self, Option<C>), PublishError>
    where
        C: serde::de::DeserializeOwned,
    {
        let mut producer_config = kafka.producer_config(client_id);
        producer_config.set("message.timeout.ms", config.delivery_timeout_ms.to_string());
        producer_config.set("message.max.bytes", config.max_message_bytes.to_string());
        // First: a capture started earlier with this connector is fenced from here on.
        let counts = Arc::new(std::sync::Mutex::new(KeyCounts::default()));
        let writer = CheckpointWriter::start(
            kafka,
            client_id,
            &config.checkpoint_topic,
            connector,
            counts.clone(),
        )
        .await?;
        // Once the earlier writer is fenced: the connector's checkpoint, and the partition
        // counts its keys are spread over, in one pass over the checkpoint topic.
        let counts_key = checkpoint::key_partitions_key(connector);
        let incarnation_key = checkpoint::incarnation_key(connector);
        let mut last = checkpoint::read_last(
            kafka,
            &config.checkpoint_topic,
            vec![
                connector.to_string(),
                counts_key.clone(),
                incarnation_key.clone(),
            ],
            client_id,
        )
        .await?;
        // The next incarnation, committed before any record is published: a successor,
        // fencing this writer, reads it and takes a higher one.
        let previous: Option<u64> =
            checkpoint::parse(&config.checkpoint_topic, last.remove(&incarnation_key))?;
        // Above the previous one, and above any number a lost checkpoint topic may have held
        // (milliseconds since the epoch): a capture whose checkpoints were deleted must not
        // start below what the apply stages already saw.
        let now_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        let incarnation = (previous.unwrap_or(0) + 1).max(now_ms);
        make_topic(kafka, client_id, config, &config.checkpoint_topic, true).await?;
        // The incarnation committed, and meanwhile the schema topic made (a start waits on both).
        let schemas = config.schema_topic.clone();
        let (written, schemas_made) = tokio::join!(
            writer.write_keyed(
                incarnation_key.into_bytes(),
                incarnation.to_string().into_bytes(),
            ),
            make_topic(kafka, client_id, config, &schemas, true)
        );
        written?;
        schemas_made?;
        tracing::info!(
            connector,
            incarnation,
            "this capture's incarnation (every record it publishes carries it; the apply stages \
             skip a lower one's records arriving after it)"
        );
        let resumed: Option<C> =
            checkpoint::parse(&config.checkpoint_topic, last.remove(connector))?;
        let recorded: Option<keying::Counts> =
            checkpoint::parse(&config.checkpoint_topic, last.remove(&counts_key))?;
        counts.lock().expect("counts lock").counts = recorded.unwrap_or_default();
        let producer: KafkaProducer = producer_config.create_with_context(
            Ledger::new(metrics.produce_latency.clone())
                .counting_errors(metrics.errors.with_label_values(&["kafka"])),
        )?;
        let producer = Arc::new(producer);
        let acked = producer.context().acked.subscribe();
        let next = Arc::new(AtomicU64::new(0));
        // Marks come once per source transaction; the bound only keeps a stalled broker from
        // growing memory (records are bounded by max_in_flight).
        let (tx, rx) = mpsc::channel(config.max_in_flight.clamp(1, 65536));
        let acker = tokio::spawn(ack_loop(
            rx,
            resumed.clone(),
            producer.clone(),
            next.clone(),
            writer,
            Duration::from_millis(config.checkpoint_interval_ms),
            metrics,
        ));
        let mut p = Self {
            producer,
            kafka: kafka.clone(),
            client_id: client_id.to_string(),
            config: config.clone(),
            topics: HashMap::new(),
            counts,
            next,
            acked,
            acked_seen: 0,
            marks: tx,
            acker,
            timeout: kafka.request_timeout(),
            last_heartbeat: None,
            incarnation: format!("{connector}/{incarnation}"),
        };
        // (The checkpoint topic was made above, before the incarnation was written to it, and
        // the schema topic beside that write.)
        let now = p.partition_count(&schemas).await?;
        p.remember(&schemas, true, now)?;
        Ok((p, resumed))
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
        make_topic(&self.kafka, &self.client_id, &self.config, topic, compacted).await?;
        let now = self.partition_count(topic).await?;
        self.remember(topic, compacted, now)
    }

    /// Create the change topics of `topics` that do not exist, in one request, and learn each
    /// one's partitions from one metadata request: a source of many tables does not make a
    /// round trip per table at its first row.
    pub async fn prepare_topics(&mut self, topics: &[String]) -> Result<(), PublishError> {
        let missing: Vec<String> = topics
            .iter()
            .filter(|t| !self.topics.contains_key(*t))
            .cloned()
            .collect();
        if missing.is_empty() {
            return Ok(());
        }
        let created = self
            .kafka
            .ensure_topics(
                &self.client_id,
                &missing,
                self.config.partitions,
                self.config.replication_factor,
                false,
                Some(self.config.max_message_bytes),
            )
            .await
            .map_err(|reason| PublishError::CreateTopic {
                topic: format!("{} topics", missing.len()),
                reason,
            })?;
        if !created.is_empty() {
            tracing::info!(
                topics = created.len(),
                partitions = self.config.partitions,
                "created the filtered tables' topics"
            );
        }
        let deadline = Instant::now() + self.timeout;
        let counts: HashMap<String, i32> = loop {
            let md = self.producer.client().fetch_metadata(None, self.timeout)?;
            let counts: HashMap<String, i32> = md
                .topics()
                .iter()
                .filter(|t| t.error().is_none() && !t.partitions().is_empty())
                .map(|t| (t.name().to_string(), t.partitions().len() as i32))
                .collect();
            if missing.iter().all(|t| counts.contains_key(t)) || Instant::now() > deadline {
                break counts;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        };
        for topic in &missing {
            // One whose metadata has not appeared yet is asked again at its first row.
            if let Some(now) = counts.get(topic) {
                self.remember(topic, false, *now)?;
            }
        }
        Ok(())
    }

    /// Keep `topic`'s partition count for its keys, given that it has `now` partitions.
    fn remember(&mut self, topic: &str, compacted: bool, now: i32) -> Result<i32, PublishError> {
        let n = if compacted {
            now
        } else {
            let mut c = self.counts.lock().expect("counts lock");
            let recorded = c.counts.get(topic).copied();
            let n = keying::spread(topic, recorded, now).map_err(|reason| {
                PublishError::Partitions {
                    topic: topic.to_string(),
                    reason,
                }
            })?;
            if recorded.is_none() {
                c.counts.insert(topic.to_string(), now);
                c.version += 1;
            }
            n
        };
        if now > n {
            tracing::warn!(
                topic,
                partitions = now,
                keys_over = n,
                "the topic has more partitions than when this connector first published to it; \
                 its keys stay on the first {n}, so that each key's events stay in order (the \
                 others get no rows). To spread keys over all of them, give the connector a new \
                 topic prefix and snapshot again"
            );
        }
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
        // The key's partition among those the topic's keys are spread over, not among all it
        // has now ([`keying`]).
        let partition = match partition {
            Some(p) => p,
            None => keying::partition_of(key, self.ensure_topic(topic, false).await?),
        };
        let partition = Some(partition);
        self.produce(topic, key, payload, partition).await?;
        Ok(())
    }

    /// While the source is idle: a heartbeat event (`OP_HEARTBEAT`) of `source` with the
    /// `version` and `position` reached, to `heartbeat_topic(prefix)` keyed by the connector
    /// name, at most every `publish.heartbeat_interval_ms` (never when 0).
    pub async fn heartbeat(
        &mut self,
        prefix: &str,
        source: &sluice_proto::v1::Source,
        version: u64,
        position: sluice_proto::v1::Position,
    ) -> Result<(), PublishError> {
        use prost::Message as _;
        use sluice_proto::v1;
        let every = Duration::from_millis(self.config.heartbeat_interval_ms);
        if every.is_zero() || self.last_heartbeat.is_some_and(|t| t.elapsed() < every) {
            return Ok(());
        }
        self.last_heartbeat = Some(Instant::now());
        let topic = super::heartbeat_topic(prefix);
        self.ensure_topic(&topic, false).await?;
        let event = v1::ChangeEvent {
            contract: sluice_proto::CONTRACT_VERSION,
            source: Some(source.clone()),
            op: v1::Op::Heartbeat as i32,
            version,
            position: Some(position),
            capture_time_micros: sluice_common::clock::now_micros(),
            ..Default::default()
        };
        self.send(
            &topic,
            source.connector.as_bytes(),
            &event.encode_to_vec(),
            None,
        )
        .await
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

    /// Hand one record to the producer with this start's incarnation ([`produce`]).
    async fn produce(
        &self,
        topic: &str,
        key: &[u8],
        payload: &[u8],
        partition: Option<i32>,
    ) -> Result<u64, PublishError> {
        produce(
            &self.producer,
            &self.next,
            &self.incarnation,
            topic,
            key,
            payload,
            partition,
        )
        .await
    }

    /// Publish one record and wait for its acknowledgement, and that of every record before
    /// it (schema records).
    pub async fn send_and_wait(
        &self,
        topic: &str,
        key: &[u8],
        payload: &[u8],
    ) -> Result<(), PublishError> {
        let seq = self.produce(topic, key, payload, None).await?;
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

    /// Like [`Self::mark`], and wait until the checkpoint is stored (every record sent before
    /// it acknowledged, the checkpoint written at once and committed). For positions that must
    /// be durable before anything after them is published: a restart must not find events of
    /// a run whose starting point it cannot know.
    pub async fn store(&mut self, checkpoint: C) -> Result<(), PublishError> {
        let upto = self.next.load(Ordering::Relaxed);
        let (done, stored) = tokio::sync::oneshot::channel();
        self.marks
            .send(Mark::Store {
                upto,
                checkpoint,
                done,
            })
            .await
            .map_err(|_| PublishError::AckerGone)?;
        // Dropped unanswered: the write failed, and the acker ended with the reason (`finish`
        // returns it).
        stored.await.map_err(|_| PublishError::AckerGone)
    }

    /// The counts of records handed to Kafka and acknowledged, for a watch from another task.
    pub fn delivery(&self) -> Delivery {
        Delivery {
            next: self.next.clone(),
            acked: self.acked.clone(),
        }
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
