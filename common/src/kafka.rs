//! Kafka client settings shared by both stages.
//!
//! Correctness settings are fixed here and cannot be overridden from the config: the producer
//! is idempotent with `acks=all` (no loss, no duplicates on retry, order per partition), and the
//! consumer never stores an offset by itself (the apply stage stores it after the target
//! acknowledged the write).

use std::collections::BTreeMap;
use std::time::Duration;

use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use serde::{Deserialize, Serialize};

/// Properties the pipeline's guarantees depend on; `[kafka.properties]` may not set them.
const FIXED_PRODUCER: &[(&str, &str)] = &[
    ("enable.idempotence", "true"),
    ("acks", "all"),
    ("max.in.flight.requests.per.connection", "5"),
];
const FIXED_CONSUMER: &[(&str, &str)] = &[
    ("enable.auto.offset.store", "false"),
    ("isolation.level", "read_committed"),
    // The classic group protocol with eager assignors: a rebalance takes every partition
    // away, after the batch in hand was written (or the stage stopped), and hands them out
    // afresh from the committed offsets. Cooperative (incremental) assignment and KIP-848's
    // protocol would let a member keep partitions across a rebalance, which the apply stages
    // do not rely on.
    ("group.protocol", "classic"),
    ("partition.assignment.strategy", "range,roundrobin"),
];

/// `[kafka]`: the cluster and client settings.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, default)]
pub struct KafkaConfig {
    /// Bootstrap brokers, `host:port[,host:port...]`. Default `127.0.0.1:9092`.
    pub brokers: String,
    /// `client.id` reported to the brokers. Default: the binary's name.
    pub client_id: String,
    /// Timeout of metadata and admin requests, in milliseconds. Default 10000.
    pub request_timeout_ms: u64,
    /// Further librdkafka properties passed as they are (`security.protocol`, `sasl.*`,
    /// `ssl.*`, `linger.ms`, `compression.type`, ...). Default: none.
    pub properties: BTreeMap<String, String>,
}

impl Default for KafkaConfig {
    fn default() -> Self {
        Self {
            brokers: "127.0.0.1:9092".into(),
            client_id: String::new(),
            request_timeout_ms: 10_000,
            properties: BTreeMap::new(),
        }
    }
}

impl KafkaConfig {
    pub fn validate(&self) -> Result<(), (String, String)> {
        if self.brokers.split(',').any(|b| {
            let b = b.trim();
            b.rsplit_once(':')
                .is_none_or(|(h, p)| h.is_empty() || p.parse::<u16>().is_err())
        }) {
            return Err((
                "kafka.brokers".into(),
                format!("expected host:port[,host:port...], got {:?}", self.brokers),
            ));
        }
        if self.request_timeout_ms == 0 {
            return Err(("kafka.request_timeout_ms".into(), "must be above 0".into()));
        }
        for (key, _) in FIXED_PRODUCER.iter().chain(FIXED_CONSUMER) {
            if self.properties.contains_key(*key) {
                return Err((
                    format!("kafka.properties.{key}"),
                    "is fixed by the pipeline's delivery guarantees and cannot be set".into(),
                ));
            }
        }
        for key in ["bootstrap.servers", "group.id", "client.id"] {
            if self.properties.contains_key(key) {
                return Err((
                    format!("kafka.properties.{key}"),
                    "has its own key in [kafka] (brokers, client_id) or in the stage's section"
                        .into(),
                ));
            }
        }
        Ok(())
    }

    pub fn request_timeout(&self) -> Duration {
        Duration::from_millis(self.request_timeout_ms)
    }

    /// Settings common to producers, consumers and admin clients.
    pub fn client_config(&self, default_client_id: &str) -> ClientConfig {
        let mut c = ClientConfig::new();
        c.set("bootstrap.servers", &self.brokers);
        c.set(
            "client.id",
            if self.client_id.is_empty() {
                default_client_id
            } else {
                &self.client_id
            },
        );
        for (k, v) in &self.properties {
            c.set(k, v);
        }
        c
    }

    /// An idempotent, `acks=all` producer's settings.
    pub fn producer_config(&self, default_client_id: &str) -> ClientConfig {
        let mut c = ClientConfig::new();
        c.set("compression.type", "lz4");
        c.set("linger.ms", "5");
        // The Java client's partitioner, so every Kafka tool agrees on a key's partition.
        c.set("partitioner", "murmur2_random");
        for (k, v) in self.client_config(default_client_id).config_map() {
            c.set(k, v);
        }
        for (k, v) in FIXED_PRODUCER {
            c.set(*k, *v);
        }
        c
    }

    /// A group consumer's settings: offsets are stored only by the application, after the
    /// target acknowledged; they are committed from the stored ones.
    pub fn consumer_config(&self, default_client_id: &str, group_id: &str) -> ClientConfig {
        let mut c = ClientConfig::new();
        c.set("auto.offset.reset", "earliest");
        c.set("enable.auto.commit", "true");
        c.set("auto.commit.interval.ms", "1000");
        // Topics matching a subscribed pattern are found at metadata refreshes: a new table's
        // topic should be picked up within seconds, not librdkafka's default 5 minutes.
        c.set("topic.metadata.refresh.interval.ms", "3000");
        // Prefetch: librdkafka queues up to 64 MiB per partition by default, and pauses a
        // partition's fetching for a whole second (fetch.queue.backoff.ms) once its queue is
        // full. A small queue refilled at once keeps the same pace with a fraction of the
        // memory: the apply stages write one batch while gathering the next anyway
        // (docs/BENCHMARKS.md).
        c.set("queued.max.messages.kbytes", "1024");
        c.set("fetch.queue.backoff.ms", "5");
        // A member that dies without leaving (kill -9, a lost node) holds its partitions until
        // the broker gives up on it: 10 s here, not librdkafka's 45 s. A restarted one with
        // `consumer.instance_id` takes them back at once (docs/BENCHMARKS.md, recovery).
        c.set("session.timeout.ms", "10000");
        c.set("heartbeat.interval.ms", "3000");
        for (k, v) in self.client_config(default_client_id).config_map() {
            c.set(k, v);
        }
        c.set("group.id", group_id);
        for (k, v) in FIXED_CONSUMER {
            c.set(*k, *v);
        }
        c
    }

    /// The preflight check of the cluster: reachable, with how many brokers.
    pub async fn check(&self, client_id: &str) -> crate::Check {
        crate::Check::from_result(
            "kafka",
            self.check_reachable(client_id)
                .await
                .map(|n| format!("{} reachable ({n} broker(s))", self.brokers)),
        )
    }

    /// Create a topic unless it exists. `partitions`/`replication` of -1 take the broker's
    /// defaults; `compacted` sets `cleanup.policy=compact`.
    pub async fn ensure_topic(
        &self,
        client_id: &str,
        topic: &str,
        partitions: i32,
        replication: i32,
        compacted: bool,
        max_message_bytes: Option<usize>,
    ) -> Result<bool, String> {
        use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
        use rdkafka::client::DefaultClientContext;
        use rdkafka::types::RDKafkaErrorCode;
        let admin: AdminClient<DefaultClientContext> = self
            .client_config(client_id)
            .create()
            .map_err(|e| e.to_string())?;
        let mut new = NewTopic::new(topic, partitions, TopicReplication::Fixed(replication));
        if compacted {
            new = new.set("cleanup.policy", "compact");
        }
        let max = max_message_bytes.map(|m| m.to_string());
        if let Some(m) = &max {
            new = new.set("max.message.bytes", m);
        }
        let opts = AdminOptions::new().operation_timeout(Some(self.request_timeout()));
        let results = admin
            .create_topics([&new], &opts)
            .await
            .map_err(|e| format!("topic {topic}: {e}"))?;
        let mut created = false;
        for r in results {
            match r {
                Ok(_) => created = true,
                Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
                Err((_, code)) => return Err(format!("topic {topic}: cannot create it: {code}")),
            }
        }
        Ok(created)
    }

    /// Ask the cluster for its metadata: the number of brokers, or why it could not be had.
    pub async fn check_reachable(&self, client_id: &str) -> Result<usize, String> {
        let config = self.client_config(client_id);
        let timeout = self.request_timeout();
        tokio::task::spawn_blocking(move || {
            let consumer: BaseConsumer = config.create().map_err(|e| e.to_string())?;
            let md = consumer
                .fetch_metadata(None, timeout)
                .map_err(|e| format!("no metadata within {timeout:?}: {e}"))?;
            Ok(md.brokers().len())
        })
        .await
        .map_err(|e| e.to_string())?
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fixed_properties_cannot_be_overridden() {
        let mut k = KafkaConfig::default();
        k.properties.insert("acks".into(), "1".into());
        let (key, msg) = k.validate().unwrap_err();
        assert_eq!(key, "kafka.properties.acks");
        assert!(msg.contains("fixed"));
    }

    /// The apply stages rely on eager rebalances (every partition taken away, then handed out
    /// from the committed offsets): an incremental assignor or KIP-848's protocol is refused.
    #[test]
    fn the_group_protocol_is_pinned_to_eager_assignment() {
        for (key, value) in [
            ("partition.assignment.strategy", "cooperative-sticky"),
            ("group.protocol", "consumer"),
        ] {
            let mut k = KafkaConfig::default();
            k.properties.insert(key.into(), value.into());
            let (at, msg) = k.validate().unwrap_err();
            assert_eq!(at, format!("kafka.properties.{key}"));
            assert!(msg.contains("fixed"), "{msg}");
        }
        let c = KafkaConfig::default().consumer_config("x", "g");
        assert_eq!(c.get("group.protocol"), Some("classic"));
        assert_eq!(
            c.get("partition.assignment.strategy"),
            Some("range,roundrobin")
        );
    }

    #[test]
    fn brokers_are_checked() {
        let k = KafkaConfig {
            brokers: "localhost".into(),
            ..Default::default()
        };
        assert_eq!(k.validate().unwrap_err().0, "kafka.brokers");
        let k = KafkaConfig {
            brokers: "a:1, b:2".into(),
            ..Default::default()
        };
        k.validate().unwrap();
    }

    #[test]
    fn producer_is_idempotent_and_user_properties_pass() {
        let mut k = KafkaConfig::default();
        k.properties.insert("linger.ms".into(), "20".into());
        let c = k.producer_config("x");
        assert_eq!(c.get("enable.idempotence"), Some("true"));
        assert_eq!(c.get("acks"), Some("all"));
        assert_eq!(c.get("linger.ms"), Some("20"));
        assert_eq!(c.get("client.id"), Some("x"));
        let c = k.consumer_config("x", "g");
        assert_eq!(c.get("enable.auto.offset.store"), Some("false"));
        assert_eq!(c.get("group.id"), Some("g"));
    }
}
