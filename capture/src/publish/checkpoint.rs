//! Reading the last checkpoint back at start.

use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::{Message, Offset, TopicPartitionList};
use serde::de::DeserializeOwned;
use sluice_common::KafkaConfig;

use super::PublishError;

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
