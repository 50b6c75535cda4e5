//! Reading the last checkpoint back at start, and writing checkpoints as the connector's one
//! writer.
//!
//! Checkpoints go through a producer of their own with the transactional id
//! `sluice-capture.<connector>`, each in a Kafka transaction. Starting that producer
//! (`init_transactions`) fences every earlier producer of the same id: a second capture started
//! with the same connector name makes the first one's next checkpoint fail, and the first stops
//! saying so, instead of both publishing and overwriting each other's checkpoints. An idle
//! capture writes its checkpoint again every [`KEEPALIVE`], so it learns of a successor even
//! when nothing happens.

use std::sync::Arc;
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use rdkafka::{Message, Offset, TopicPartitionList};
use serde::de::DeserializeOwned;
use sluice_common::KafkaConfig;

use super::PublishError;

/// How often an unchanged checkpoint is written again (to learn of a successor).
pub(super) const KEEPALIVE: Duration = Duration::from_secs(10);

/// The checkpoint topic's key of a connector's incarnation counter ([`super::Incarnation`]).
pub(super) fn incarnation_key(connector: &str) -> String {
    format!("sluice.incarnation/{connector}")
}

/// The transactional id of a connector's checkpoint writer.
pub(super) fn transactional_id(connector: &str) -> String {
    format!("sluice-capture.{connector}")
}

/// The partition counts a connector spreads its keys over ([`super::keying`]): written with
/// the next checkpoint, in its transaction, whenever they changed.
#[derive(Default)]
pub(super) struct KeyCounts {
    pub(super) counts: super::keying::Counts,
    /// Changes made, and the last change written.
    pub(super) version: u64,
    written: u64,
}

/// The producer that writes a connector's checkpoints, fenced by the next one started.
pub(super) struct CheckpointWriter {
    producer: BaseProducer,
    topic: String,
    connector: String,
    timeout: Duration,
    counts: Arc<std::sync::Mutex<KeyCounts>>,
}

impl CheckpointWriter {
    /// Create it and take the connector's transactional id over (fencing any earlier writer).
    pub(super) async fn start(
        kafka: &KafkaConfig,
        client_id: &str,
        topic: &str,
        connector: &str,
        counts: Arc<std::sync::Mutex<KeyCounts>>,
    ) -> Result<Arc<Self>, PublishError> {
        let mut config = kafka.producer_config(client_id);
        let id = transactional_id(connector);
        config
            .set("transactional.id", &id)
            .set("linger.ms", "0")
            .set("transaction.timeout.ms", "60000");
        let timeout = kafka.request_timeout();
        let (topic, connector) = (topic.to_string(), connector.to_string());
        tokio::task::spawn_blocking(move || {
            let producer: BaseProducer = config.create()?;
            producer
                .init_transactions(timeout * 3)
                .map_err(|e| PublishError::Checkpoint {
                    topic: topic.clone(),
                    reason: format!(
                        "cannot take over transactional id {id:?} for connector {connector:?}: \
                         {e}. The checkpoints are written in Kafka transactions so that a second \
                         capture of the same connector fences the first: the brokers need \
                         transactions (transaction.state.log.* settings the cluster can meet) \
                         and the user WRITE and DESCRIBE on TransactionalId {id:?}"
                    ),
                })?;
            Ok(Arc::new(Self {
                producer,
                topic,
                connector,
                timeout: timeout * 3,
                counts,
            }))
        })
        .await
        .map_err(|_| PublishError::AckerGone)?
    }

    /// Write one checkpoint, in a transaction of its own; waits for its commit.
    pub(super) async fn write(self: &Arc<Self>, payload: Vec<u8>) -> Result<(), PublishError> {
        let key = self.connector.clone().into_bytes();
        self.write_keyed(key, payload).await
    }

    /// Write `payload` under `key`, in a transaction of its own; waits for its commit.
    pub(super) async fn write_keyed(
        self: &Arc<Self>,
        key: Vec<u8>,
        payload: Vec<u8>,
    ) -> Result<(), PublishError> {
        let w = self.clone();
        tokio::task::spawn_blocking(move || w.write_blocking(&key, &payload))
            .await
            .map_err(|_| PublishError::AckerGone)?
    }

    fn send_blocking(&self, key: &[u8], payload: &[u8]) -> Result<(), KafkaError> {
        loop {
            let record = BaseRecord::to(&self.topic).key(key).payload(payload);
            match self.producer.send(record) {
                Ok(()) => return Ok(()),
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), _)) => {
                    self.producer.poll(Duration::from_millis(50));
                }
                Err((e, _)) => return Err(e),
            }
        }
    }

    fn write_blocking(&self, record_key: &[u8], payload: &[u8]) -> Result<(), PublishError> {
        let counts = {
            let c = self.counts.lock().expect("counts lock");
            (c.version != c.written).then(|| {
                let json = serde_json::to_vec(&c.counts).expect("counts serialize");
                (c.version, json)
            })
        };
        // Brokers away for a while (a restart, a coordinator moving) are waited for, up to six
        // commit timeouts (each three request timeouts: 3 minutes by default): a commit that timed out is tried again, and a transaction that
        // must be aborted is aborted and written again (a checkpoint written twice is
        // harmless: the last one counts). Fencing and fatal errors are not retried.
        let deadline = Instant::now() + self.timeout * 6;
        let result = loop {
            let attempt = (|| {
                self.producer.begin_transaction()?;
                self.send_blocking(record_key, payload)?;
                if let Some((_, json)) = &counts {
                    let key = super::keying::key_of(&self.connector);
                    self.send_blocking(key.as_bytes(), json)?;
                }
                self.commit(deadline)
            })();
            match attempt {
                Err(KafkaError::Transaction(t))
                    if t.txn_requires_abort()
                        && !fenced(&KafkaError::Transaction(t.clone()))
                        && Instant::now() < deadline =>
                {
                    tracing::warn!(error = %t, "a checkpoint's transaction failed; aborting it and writing the checkpoint again");
                    let _ = self.producer.abort_transaction(self.timeout);
                    std::thread::sleep(Duration::from_millis(500));
                }
                other => break other,
            }
        };
        match result {
            Ok(()) => {
                if let Some((version, _)) = counts {
                    let mut c = self.counts.lock().expect("counts lock");
                    c.written = c.written.max(version);
                }
                Ok(())
            }
            Err(e) => {
                if fenced(&e) {
                    return Err(PublishError::Fenced {
                        connector: self.connector.clone(),
                        id: transactional_id(&self.connector),
                    });
                }
                if let KafkaError::Transaction(t) = &e {
                    if t.txn_requires_abort() {
                        let _ = self.producer.abort_transaction(self.timeout);
                    }
                }
                Err(PublishError::Checkpoint {
                    topic: self.topic.clone(),
                    reason: e.to_string(),
                })
            }
        }
    }
}

impl CheckpointWriter {
    /// Commit the open transaction. Brokers away for a while (a restart, a leader election)
    /// make the commit time out: that is retried, as librdkafka allows, until `deadline`,
    /// rather than stopping the capture at the first one; anything else, or a longer outage,
    /// is the commit's failure.
    fn commit(&self, deadline: Instant) -> Result<(), KafkaError> {
        loop {
            match self.producer.commit_transaction(self.timeout) {
                Err(e) if commit_retriable(&e) && Instant::now() < deadline => {
                    tracing::warn!(error = %e, "a checkpoint's commit was not answered in time (the brokers away?); trying again");
                }
                other => return other,
            }
        }
    }
}

/// A commit that may be tried again: its flush or the commit itself timed out, or librdkafka
/// says so.
fn commit_retriable(e: &KafkaError) -> bool {
    match e {
        KafkaError::Flush(RDKafkaErrorCode::OperationTimedOut) => true,
        KafkaError::Transaction(t) => t.is_retriable(),
        _ => false,
    }
}

/// The consumer has fetched partition `p` up to `high` (past any commit marker there).
fn at_end(consumer: &BaseConsumer, topic: &str, p: i32, high: i64) -> bool {
    consumer
        .position()
        .ok()
        .and_then(|tpl| tpl.find_partition(topic, p).map(|e| e.offset()))
        .is_some_and(|o| matches!(o, Offset::Offset(n) if n >= high))
}

/// The error says a newer producer of the same transactional id took over.
fn fenced(e: &KafkaError) -> bool {
    let code = match e {
        KafkaError::Transaction(t) => t.code(),
        other => match other.rdkafka_error_code() {
            Some(c) => c,
            None => return false,
        },
    };
    matches!(
        code,
        RDKafkaErrorCode::Fenced
            | RDKafkaErrorCode::ProducerFenced
            | RDKafkaErrorCode::InvalidProducerEpoch
    )
}

/// A record read by [`read_last`]: its payload, partition and offset.
pub(super) type Read = (Vec<u8>, i32, i64);

/// What a record of the checkpoint topic holds, as `C`.
pub(super) fn parse<C: DeserializeOwned>(
    topic: &str,
    read: Option<Read>,
) -> Result<Option<C>, PublishError> {
    let Some((payload, partition, offset)) = read else {
        return Ok(None);
    };
    serde_json::from_slice(&payload)
        .map(Some)
        .map_err(|e| PublishError::Checkpoint {
            topic: topic.to_string(),
            reason: format!(
                "record at partition {partition} offset {offset} is not a checkpoint: {e}"
            ),
        })
}

/// The last record of each of `keys` on the checkpoint topic, read in one pass from its start
/// to its end.
pub(super) async fn read_last(
    kafka: &KafkaConfig,
    topic: &str,
    keys: Vec<String>,
    client_id: &str,
) -> Result<std::collections::HashMap<String, Read>, PublishError> {
    let mut config = kafka.client_config(client_id);
    // Checkpoints are written in transactions: committed ones only. A commit marker takes a
    // partition's last offset and is never delivered, so the end is where the consumer's
    // position reaches the high watermark.
    config
        .set("group.id", format!("{client_id}-checkpoint-reader"))
        .set("enable.auto.commit", "false")
        .set("isolation.level", "read_committed")
        // Read from its start, the topic can be large (a checkpoint a second, until the
        // broker compacts it): a small prefetch, not librdkafka's 64 MiB, so that a start's
        // memory does not grow with it.
        .set("queued.max.messages.kbytes", "1024");
    let timeout = kafka.request_timeout();
    let topic = topic.to_string();
    tokio::task::spawn_blocking(move || {
        let consumer: BaseConsumer = config.create()?;
        let md = consumer.fetch_metadata(Some(&topic), timeout)?;
        let Some(t) = md.topics().iter().find(|t| t.name() == topic) else {
            return Ok(Default::default());
        };
        if t.error().is_some() || t.partitions().is_empty() {
            return Ok(Default::default()); // no such topic yet: no checkpoint
        }
        let mut last = std::collections::HashMap::new();
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
                // Short waits: the partition's end is a commit marker, which is never
                // delivered, so the end shows only as the position reaching it (checked
                // between polls), and a capture's start waits on this read.
                match consumer.poll(Duration::from_millis(10)) {
                    Some(Ok(m)) => {
                        if let (Some(key), Some(payload)) = (m.key(), m.payload()) {
                            if let Some(k) = keys.iter().find(|k| k.as_bytes() == key) {
                                last.insert(
                                    k.clone(),
                                    (payload.to_vec(), m.partition(), m.offset()),
                                );
                            }
                        }
                        if m.offset() + 1 >= high {
                            break;
                        }
                    }
                    Some(Err(e)) => return Err(e.into()),
                    None => {
                        if at_end(&consumer, &topic, p.id(), high) {
                            break;
                        }
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
