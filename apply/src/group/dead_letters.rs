//! Dead letters: events that can never be written, sent to the dead-letter topic with why and
//! where they were read.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use rdkafka::error::KafkaResult;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{BaseProducer, FutureProducer, FutureRecord};
use rdkafka::{ClientConfig, Message};

/// The headers of a dead letter.
pub mod headers {
    /// The reason, for people.
    pub const REASON: &str = "sluice.reason";
    /// The reason's label ([`crate::error::Reason::label`]).
    pub const REASON_KIND: &str = "sluice.reason.kind";
    /// Where the event was read: topic, partition, offset.
    pub const TOPIC: &str = "sluice.topic";
    pub const PARTITION: &str = "sluice.partition";
    pub const OFFSET: &str = "sluice.offset";
}

/// The largest dead letter: as large as the largest event a capture writes.
pub const DEAD_LETTER_MAX_BYTES: usize = 64 << 20;

/// Sends events that can never be written to the dead-letter topic, with the reason and where
/// they came from in headers ([`headers`]); the payload and key are the original ones (`sluice
/// dead-letters` reads them back).
///
/// The producer is made at the first dead letter. rdkafka's producer keeps a thread polling
/// in 100 ms slices, and each slice's last millisecond spins (the remaining time is rounded
/// down to 0 ms): about 1 % of a core for a producer that, here, mostly never sends.
#[derive(Clone)]
pub struct DeadLetters {
    config: ClientConfig,
    producer: Arc<OnceLock<FutureProducer>>,
    topic: Arc<str>,
}

impl DeadLetters {
    /// Checks the producer's settings now (librdkafka refuses bad ones when a client is made),
    /// so that a mistake stops the stage at start, not at its first dead letter.
    pub fn new(config: ClientConfig, topic: &str) -> KafkaResult<Self> {
        let _check: BaseProducer = config.create()?;
        Ok(DeadLetters {
            config,
            producer: Arc::new(OnceLock::new()),
            topic: topic.into(),
        })
    }

    /// The dead-letter topic of a stage: its producer's settings checked, and the topic made
    /// (one partition, sized for [`DEAD_LETTER_MAX_BYTES`]) unless it exists.
    pub async fn start(
        kafka: &sluice_common::KafkaConfig,
        client_id: &str,
        topic: &str,
    ) -> Result<Self, crate::error::ApplyError> {
        use crate::error::{ApplyError, Origin};
        let dead = DeadLetters::new(
            kafka
                .producer_config(client_id)
                .set("message.max.bytes", DEAD_LETTER_MAX_BYTES.to_string())
                .clone(),
            topic,
        )?;
        kafka
            .ensure_topic(client_id, topic, 1, -1, false, Some(DEAD_LETTER_MAX_BYTES))
            .await
            .map_err(|e| ApplyError::definite(Origin::Kafka, e))?;
        Ok(dead)
    }

    fn producer(&self) -> Result<&FutureProducer, String> {
        if let Some(p) = self.producer.get() {
            return Ok(p);
        }
        let p = self
            .config
            .create()
            .map_err(|e| format!("could not make the dead-letter producer: {e}"))?;
        // Another task may have made one meanwhile: either serves.
        let _ = self.producer.set(p);
        Ok(self.producer.get().expect("set just now"))
    }

    /// Send the dead letter of `m` and wait for Kafka's acknowledgement.
    pub async fn send<M: Message>(
        &self,
        m: &M,
        bad: &crate::error::BadEvent,
    ) -> Result<(), String> {
        self.enqueue(m, bad).await?.wait().await
    }

    /// Hand the dead letter of `m` to the producer (waiting only while its queue is full): the
    /// acknowledgement is awaited later ([`Pending::wait`]), before the offset of `m` is
    /// stored, so that a busy stopped table's dead letters go out together, not one round trip
    /// each.
    pub async fn enqueue<M: Message>(
        &self,
        m: &M,
        bad: &crate::error::BadEvent,
    ) -> Result<Pending, String> {
        let reason = bad.message.as_str();
        let where_ = format!("{}/{}@{}", m.topic(), m.partition(), m.offset());
        // The reason may quote the row (its key, a value): in the dead letter, where `sluice
        // dead-letters show` reads it, and in the log only at debug level.
        tracing::warn!(at = %where_, reason = bad.reason.label(), topic = %self.topic, "dead-lettering an event (`sluice dead-letters show` prints why)");
        tracing::debug!(at = %where_, reason, "dead-lettering an event");
        let partition = m.partition().to_string();
        let offset = m.offset().to_string();
        let headers = OwnedHeaders::new()
            .insert(Header {
                key: headers::REASON,
                value: Some(reason),
            })
            .insert(Header {
                key: headers::REASON_KIND,
                value: Some(bad.reason.label()),
            })
            .insert(Header {
                key: headers::TOPIC,
                value: Some(m.topic()),
            })
            .insert(Header {
                key: headers::PARTITION,
                value: Some(&partition),
            })
            .insert(Header {
                key: headers::OFFSET,
                value: Some(&offset),
            });
        let mut record = FutureRecord::to(&self.topic)
            .payload(m.payload().unwrap_or_default())
            .headers(headers);
        if let Some(k) = m.key() {
            record = record.key(k);
        }
        let failed = |e: rdkafka::error::KafkaError| {
            format!(
                "could not write the dead letter for {where_} to {}: {e}",
                self.topic
            )
        };
        let producer = self.producer()?;
        let delivery = match producer.send_result(record) {
            Ok(d) => Some(d),
            Err((
                rdkafka::error::KafkaError::MessageProduction(
                    rdkafka::types::RDKafkaErrorCode::QueueFull,
                ),
                record,
            )) => {
                // The queue is full: wait for room and this one's acknowledgement.
                producer
                    .send(record, Duration::from_secs(60))
                    .await
                    .map_err(|(e, _)| failed(e))?;
                None
            }
            Err((e, _)) => return Err(failed(e)),
        };
        Ok(Pending {
            delivery,
            what: format!("the dead letter for {where_} to {}", self.topic),
        })
    }
}

/// A dead letter handed to the producer, not yet acknowledged.
pub struct Pending {
    delivery: Option<rdkafka::producer::DeliveryFuture>,
    what: String,
}

impl Pending {
    /// Wait for Kafka's acknowledgement.
    pub async fn wait(self) -> Result<(), String> {
        let Some(d) = self.delivery else {
            return Ok(());
        };
        match d.await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err((e, _))) => Err(format!("could not write {}: {e}", self.what)),
            Err(_) => Err(format!(
                "could not write {}: the producer went away",
                self.what
            )),
        }
    }
}

/// Wait for every dead letter of `pending`; the first failure is the answer.
pub async fn wait_all(pending: Vec<Pending>) -> Result<(), String> {
    for p in pending {
        p.wait().await?;
    }
    Ok(())
}
