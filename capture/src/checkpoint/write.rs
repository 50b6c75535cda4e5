//! Writing checkpoints as the connector's one writer.
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

use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use sluice_common::KafkaConfig;

use super::{key_partitions_key, transactional_id, CheckpointError};
use crate::publish::keying;

/// How often an unchanged checkpoint is written again (to learn of a successor).
pub(crate) const KEEPALIVE: Duration = Duration::from_secs(10);

/// The partition counts a connector spreads its keys over ([`super::keying`]): written with
/// the next checkpoint, in its transaction, whenever they changed.
#[derive(Default)]
pub(crate) struct KeyCounts {
    pub(crate) counts: keying::Counts,
    /// Changes made, and the last change written.
    pub(crate) version: u64,
    written: u64,
}

/// The producer that writes a connector's checkpoints, fenced by the next one started.
pub(crate) struct CheckpointWriter {
    producer: BaseProducer,
    topic: String,
    connector: String,
    timeout: Duration,
    counts: Arc<std::sync::Mutex<KeyCounts>>,
}

impl CheckpointWriter {
    /// Create it and take the connector's transactional id over (fencing any earlier writer).
    pub(crate) async fn start(
        kafka: &KafkaConfig,
        client_id: &str,
        topic: &str,
        connector: &str,
        counts: Arc<std::sync::Mutex<KeyCounts>>,
    ) -> Result<Arc<Self>, CheckpointError> {
        let (kafka, client_id) = (kafka.clone(), client_id.to_string());
        let (topic, connector) = (topic.to_string(), connector.to_string());
        tokio::task::spawn_blocking(move || {
            Self::create(&kafka, &client_id, &topic, &connector, counts).map(Arc::new)
        })
        .await
        .map_err(|_| CheckpointError::TaskGone)?
    }

    /// [`Self::start`], blocking.
    fn create(
        kafka: &KafkaConfig,
        client_id: &str,
        topic: &str,
        connector: &str,
        counts: Arc<std::sync::Mutex<KeyCounts>>,
    ) -> Result<Self, CheckpointError> {
        let mut config = kafka.producer_config(client_id);
        let id = transactional_id(connector);
        config
            .set("transactional.id", &id)
            .set("linger.ms", "0")
            .set(
                "transaction.timeout.ms",
                super::read::OPEN_TRANSACTION_WAIT.as_millis().to_string(),
            );
        let timeout = kafka.request_timeout();
        let producer: BaseProducer = config.create()?;
        producer
            .init_transactions(timeout * 3)
            .map_err(|e| CheckpointError::Topic {
                topic: topic.to_string(),
                reason: format!(
                    "cannot take over transactional id {id:?} for connector {connector:?}: \
                     {e}. The checkpoints are written in Kafka transactions so that a second \
                     capture of the same connector fences the first: the brokers need \
                     transactions (transaction.state.log.* settings the cluster can meet) \
                     and the user WRITE and DESCRIBE on TransactionalId {id:?}"
                ),
            })?;
        Ok(Self {
            producer,
            topic: topic.to_string(),
            connector: connector.to_string(),
            timeout: timeout * 3,
            counts,
        })
    }

    /// Write one checkpoint, in a transaction of its own; waits for its commit.
    pub(crate) async fn write(self: &Arc<Self>, payload: Vec<u8>) -> Result<(), CheckpointError> {
        let key = self.connector.clone().into_bytes();
        self.write_keyed(key, payload).await
    }

    /// Write `payload` under `key`, in a transaction of its own; waits for its commit.
    pub(crate) async fn write_keyed(
        self: &Arc<Self>,
        key: Vec<u8>,
        payload: Vec<u8>,
    ) -> Result<(), CheckpointError> {
        let w = self.clone();
        tokio::task::spawn_blocking(move || w.write_blocking(&key, &payload, None))
            .await
            .map_err(|_| CheckpointError::TaskGone)?
    }

    fn send_blocking(
        &self,
        key: &[u8],
        payload: &[u8],
        partition: Option<i32>,
    ) -> Result<(), KafkaError> {
        loop {
            let mut record = BaseRecord::to(&self.topic).key(key).payload(payload);
            if let Some(p) = partition {
                record = record.partition(p);
            }
            match self.producer.send(record) {
                Ok(()) => return Ok(()),
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), _)) => {
                    self.producer.poll(Duration::from_millis(50));
                }
                Err((e, _)) => return Err(e),
            }
        }
    }

    /// Write `payload` under `record_key` (to `partition`, else the key's), with the partition
    /// counts when they changed, in one transaction; waits for its commit.
    fn write_blocking(
        &self,
        record_key: &[u8],
        payload: &[u8],
        partition: Option<i32>,
    ) -> Result<(), CheckpointError> {
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
                self.send_blocking(record_key, payload, partition)?;
                if let Some((_, json)) = &counts {
                    let key = key_partitions_key(&self.connector);
                    self.send_blocking(key.as_bytes(), json, None)?;
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
                    return Err(CheckpointError::Fenced {
                        connector: self.connector.clone(),
                        id: transactional_id(&self.connector),
                    });
                }
                if let KafkaError::Transaction(t) = &e {
                    if t.txn_requires_abort() {
                        let _ = self.producer.abort_transaction(self.timeout);
                    }
                }
                Err(CheckpointError::Topic {
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

/// A tool's one write of a connector's checkpoint (`sluice position set`), to `partition`
/// (where its last one is, so that this one is the key's last): the connector's transactional
/// id is taken over first, so a capture of the connector that still runs is fenced and stops
/// rather than writing over it. Blocking.
pub fn overwrite(
    kafka: &KafkaConfig,
    client_id: &str,
    topic: &str,
    connector: &str,
    partition: i32,
    payload: &[u8],
) -> Result<(), CheckpointError> {
    let writer = CheckpointWriter::create(kafka, client_id, topic, connector, Default::default())?;
    writer.write_blocking(connector.as_bytes(), payload, Some(partition))
}
