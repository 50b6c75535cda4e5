//! The schema topic, as apply reads it: schema id -> table schema.
//!
//! The capture publishes every schema (and waits for Kafka's acknowledgement) before the first
//! event that names it, so a miss here means the topic has grown since it was last read: it is
//! read again, and an id still unknown after that is a definite error for that event. A read
//! that does not reach the end of the topic in time is a failure of Kafka, never an unknown
//! schema: it is tried again (for six read windows, three minutes by default, so a broker
//! restart is waited out), and then stops the stage (the event is read again on restart).

use std::collections::HashMap;
use std::time::{Duration, Instant};

use prost::Message;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::{Message as _, Offset, TopicPartitionList};
use sluice_common::KafkaConfig;
use sluice_proto::v1::{SchemaRecord, TableSchema};

pub struct SchemaCache {
    kafka: KafkaConfig,
    topic: String,
    client_id: String,
    schemas: HashMap<u64, TableSchema>,
    /// How long one read of the topic may take: three request timeouts unless set.
    read_for: Option<Duration>,
}

impl SchemaCache {
    pub fn new(kafka: &KafkaConfig, topic: &str, client_id: &str) -> Self {
        Self {
            kafka: kafka.clone(),
            topic: topic.to_string(),
            client_id: client_id.to_string(),
            schemas: HashMap::new(),
            read_for: None,
        }
    }

    /// Give one read of the topic `d` at most (instead of three request timeouts).
    pub fn with_read_deadline(mut self, d: Duration) -> Self {
        self.read_for = Some(d);
        self
    }

    /// The schema with this id, reading the topic again if it is not known yet. A read that
    /// fails (brokers away: a restart, a leader moving; or cut short by a slow broker) is tried
    /// again, with a backoff up to 5 s, for six read windows (three minutes by default: a
    /// broker restart takes seconds), before it is an error.
    pub async fn get(&mut self, id: u64) -> Result<Option<TableSchema>, KafkaError> {
        if let Some(s) = self.schemas.get(&id) {
            return Ok(Some(s.clone()));
        }
        let deadline = Instant::now() + self.read_window() * 6;
        let mut backoff = Duration::from_millis(500);
        loop {
            match self.refresh().await {
                Ok(()) => break,
                Err(e) if Instant::now() + backoff < deadline => {
                    tracing::warn!(error = %e, retry_in = ?backoff, "reading the schema topic failed; trying again");
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_secs(5));
                }
                Err(e) => return Err(e),
            }
        }
        Ok(self.schemas.get(&id).cloned())
    }

    /// How long one read of the topic may take: three request timeouts unless set.
    fn read_window(&self) -> Duration {
        self.read_for.unwrap_or(self.kafka.request_timeout() * 3)
    }

    /// Every column definition a known schema of `database.table` other than schema `except`
    /// has had (repeats included).
    pub fn columns_ever(
        &self,
        database: &str,
        table: &str,
        except: u64,
    ) -> Vec<sluice_proto::v1::Column> {
        self.schemas
            .values()
            .filter(|s| s.database == database && s.table == table && s.schema_id != except)
            .flat_map(|s| s.columns.iter().cloned())
            .collect()
    }

    /// Add a schema met inline (DDL events carry theirs).
    pub fn remember(&mut self, schema: &TableSchema) {
        if schema.schema_id != 0 {
            self.schemas.insert(schema.schema_id, schema.clone());
        }
    }

    /// Read the whole topic (it is compacted: one record per schema).
    pub async fn refresh(&mut self) -> Result<(), KafkaError> {
        let mut config = self.kafka.client_config(&self.client_id);
        config
            .set("group.id", format!("{}-schema-reader", self.client_id))
            .set("enable.auto.commit", "false")
            // A small prefetch, not librdkafka's 64 MiB: the topic is read whole.
            .set("queued.max.messages.kbytes", "1024");
        let topic = self.topic.clone();
        let timeout = self.kafka.request_timeout();
        let read_for = self.read_window();
        let started = Instant::now();
        let found = tokio::task::spawn_blocking(move || -> Result<Vec<TableSchema>, KafkaError> {
            let consumer: BaseConsumer = config.create()?;
            let md = consumer.fetch_metadata(Some(&topic), timeout)?;
            let Some(t) = md.topics().iter().find(|t| t.name() == topic) else {
                return Ok(Vec::new());
            };
            if t.error().is_some() {
                return Ok(Vec::new());
            }
            let mut out = Vec::new();
            let mut tpl = TopicPartitionList::new();
            // Read each partition up to its end as it is now (its high watermark).
            let mut ends = HashMap::new();
            for p in t.partitions() {
                let (low, high) = consumer.fetch_watermarks(&topic, p.id(), timeout)?;
                if high > low {
                    tpl.add_partition_offset(&topic, p.id(), Offset::Beginning)?;
                    ends.insert(p.id(), high);
                }
            }
            if ends.is_empty() {
                return Ok(out);
            }
            consumer.assign(&tpl)?;
            let deadline = Instant::now() + read_for;
            while !ends.is_empty() && Instant::now() < deadline {
                match consumer.poll(Duration::from_millis(200)) {
                    Some(Ok(m)) => {
                        if let Some(Ok(r)) = m.payload().map(SchemaRecord::decode) {
                            if let Some(s) = r.schema {
                                out.push(s);
                            }
                        }
                        if ends
                            .get(&m.partition())
                            .is_some_and(|h| m.offset() + 1 >= *h)
                        {
                            ends.remove(&m.partition());
                        }
                    }
                    Some(Err(e)) => return Err(e),
                    None => {}
                }
            }
            if !ends.is_empty() {
                // Cut short: what was not read may hold the schema asked for.
                tracing::warn!(topic = %topic, partitions = ?ends.keys().collect::<Vec<_>>(), "the schema topic was not read to its end in time");
                return Err(KafkaError::MessageConsumption(
                    rdkafka::types::RDKafkaErrorCode::OperationTimedOut,
                ));
            }
            Ok(out)
        })
        .await
        .expect("schema reader task")?;
        tracing::debug!(topic = %self.topic, records = found.len(), took = ?started.elapsed(), "read the schema topic");
        for s in found {
            self.schemas.insert(s.schema_id, s);
        }
        Ok(())
    }
}
