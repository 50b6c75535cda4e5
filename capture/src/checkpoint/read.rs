//! Reading the checkpoint topic: the last committed record of each wanted key, in one pass
//! from the topic's start to its end.

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::RDKafkaErrorCode;
use rdkafka::types::RDKafkaRespErr;
use rdkafka::{Message, Offset, TopicPartitionList};
use serde::de::DeserializeOwned;
use sluice_common::KafkaConfig;

use super::CheckpointError;

/// How long a transaction left open may hold a read: the checkpoint writer's
/// `transaction.timeout.ms`, after which the broker aborts it.
pub const OPEN_TRANSACTION_WAIT: Duration = Duration::from_secs(60);

/// A record's payload and where it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Read {
    pub payload: Vec<u8>,
    pub partition: i32,
    pub offset: i64,
}

/// What a record holds, as `C` (none read: `None`).
pub fn parse<C: DeserializeOwned>(
    topic: &str,
    read: Option<Read>,
) -> Result<Option<C>, CheckpointError> {
    let Some(read) = read else {
        return Ok(None);
    };
    serde_json::from_slice(&read.payload)
        .map(Some)
        .map_err(|e| CheckpointError::Topic {
            topic: topic.to_string(),
            reason: format!(
                "record at partition {} offset {} is not a checkpoint: {e}",
                read.partition, read.offset
            ),
        })
}

/// The last record of each of `keys` (see [`read_last_blocking`]).
pub async fn read_last(
    kafka: &KafkaConfig,
    topic: &str,
    keys: Vec<String>,
    client_id: &str,
) -> Result<HashMap<String, Read>, CheckpointError> {
    let (kafka, topic, client_id) = (kafka.clone(), topic.to_string(), client_id.to_string());
    tokio::task::spawn_blocking(move || {
        read_last_blocking(&kafka, &topic, &client_id, &|k| {
            keys.iter().any(|w| w.as_bytes() == k)
        })
    })
    .await
    .map_err(|_| CheckpointError::TaskGone)?
}

/// The last committed record of every key that `wanted` takes, by key, read from the topic's
/// start to its end (none when the topic does not exist). A record without a payload deletes
/// its key.
///
/// The end is each partition's high watermark, not its last stable offset: a transaction left
/// open (by a capture of another connector killed while it wrote a checkpoint) holds the last
/// stable offset below every record committed after it began, this connector's too. Reading to
/// the last stable offset would miss them and resume from an older checkpoint, or from none;
/// the read waits instead until the broker ends that transaction (its `transaction.timeout.ms`,
/// 60 s for the capture's checkpoint writer), and says so.
pub fn read_last_blocking(
    kafka: &KafkaConfig,
    topic: &str,
    client_id: &str,
    wanted: &dyn Fn(&[u8]) -> bool,
) -> Result<HashMap<String, Read>, CheckpointError> {
    let mut config = kafka.client_config(client_id);
    config
        .set("group.id", format!("{client_id}-checkpoint-reader"))
        .set("enable.auto.commit", "false")
        // Read from its start, the topic can be large (a checkpoint a second, until the
        // broker compacts it): a small prefetch, not librdkafka's 64 MiB, so that a start's
        // memory does not grow with it.
        .set("queued.max.messages.kbytes", "1024");
    let timeout = kafka.request_timeout();
    // The ends: asked with read_uncommitted (librdkafka asks for offsets at the consumer's
    // isolation level, and read_committed's "latest" is the last stable offset).
    let ends_of: BaseConsumer = config
        .clone()
        .set("isolation.level", "read_uncommitted")
        .create()?;
    let md = ends_of.fetch_metadata(Some(topic), timeout)?;
    let mut last = HashMap::new();
    let Some(t) = md.topics().iter().find(|t| t.name() == topic) else {
        return Ok(last); // no such topic yet: no checkpoint
    };
    match t.error() {
        None => {}
        Some(RDKafkaRespErr::RD_KAFKA_RESP_ERR_UNKNOWN_TOPIC_OR_PART) => {
            return Ok(last); // no such topic yet: no checkpoint
        }
        Some(e) => {
            return Err(CheckpointError::Topic {
                topic: topic.to_string(),
                reason: format!(
                    "its metadata says {}: its checkpoints cannot be read",
                    RDKafkaErrorCode::from(e)
                ),
            })
        }
    }
    let mut ends = BTreeMap::new();
    let mut tpl = TopicPartitionList::new();
    for p in t.partitions() {
        let (low, high) = ends_of.fetch_watermarks(topic, p.id(), timeout)?;
        if high > low {
            ends.insert(p.id(), high);
            tpl.add_partition_offset(topic, p.id(), Offset::Beginning)?;
        }
    }
    drop(ends_of);
    if ends.is_empty() {
        return Ok(last);
    }
    // Checkpoints are written in transactions: committed ones only. A commit marker takes a
    // partition's last offset and is never delivered, so the end is where the consumer's
    // position reaches the high watermark.
    let consumer: BaseConsumer = config.set("isolation.level", "read_committed").create()?;
    consumer.assign(&tpl)?;
    let started = Instant::now();
    let deadline = started + timeout * 3 + OPEN_TRANSACTION_WAIT;
    let mut progress = Instant::now();
    let mut said = false;
    while !ends.is_empty() {
        // Short waits: a partition's end is a commit marker, which is never delivered, so the
        // end shows only as the position reaching it (checked between polls), and a capture's
        // start waits on this read.
        match consumer.poll(Duration::from_millis(10)) {
            Some(Ok(m)) => {
                progress = Instant::now();
                if let Some(key) = m.key().filter(|k| wanted(k)) {
                    let key = String::from_utf8_lossy(key).into_owned();
                    match m.payload() {
                        Some(payload) => {
                            let read = Read {
                                payload: payload.to_vec(),
                                partition: m.partition(),
                                offset: m.offset(),
                            };
                            last.insert(key, read);
                        }
                        None => {
                            last.remove(&key);
                        }
                    }
                }
                if ends
                    .get(&m.partition())
                    .is_some_and(|e| m.offset() + 1 >= *e)
                {
                    ends.remove(&m.partition());
                }
            }
            Some(Err(e)) => return Err(e.into()),
            None => {
                if let Ok(pos) = consumer.position() {
                    for e in pos.elements_for_topic(topic) {
                        if let Offset::Offset(n) = e.offset() {
                            if ends.get(&e.partition()).is_some_and(|end| n >= *end) {
                                ends.remove(&e.partition());
                            }
                        }
                    }
                }
                if ends.is_empty() {
                    break;
                }
                if !said && progress.elapsed() > Duration::from_secs(5) {
                    said = true;
                    tracing::warn!(
                        topic,
                        partitions = ?ends.keys().collect::<Vec<_>>(),
                        "the checkpoint topic holds a transaction left open (a capture stopped \
                         while it wrote a checkpoint?): the checkpoints committed after it are \
                         read once the broker ends it (transaction.timeout.ms); waiting"
                    );
                }
                if Instant::now() > deadline {
                    return Err(CheckpointError::Topic {
                        topic: topic.to_string(),
                        reason: format!(
                            "could not read partitions {:?} to their ends in {:?} (a \
                             transaction left open longer than the writers' \
                             transaction.timeout.ms, or the brokers too slow); a capture must \
                             not start without its last checkpoint",
                            ends.keys().collect::<Vec<_>>(),
                            started.elapsed()
                        ),
                    });
                }
            }
        }
    }
    Ok(last)
}
