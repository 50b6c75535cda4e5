//! `[consumer]`: the consumer group and the topics an apply binary reads; `[errors]`: what
//! happens to events that can never be written.

use serde::{Deserialize, Serialize};

/// Subscribe `consumer` to `topics` (names, or patterns starting with `^`).
pub fn subscribe<C: rdkafka::consumer::ConsumerContext>(
    consumer: &rdkafka::consumer::StreamConsumer<C>,
    topics: &[String],
) -> rdkafka::error::KafkaResult<()> {
    use rdkafka::consumer::Consumer;
    let topics: Vec<&str> = topics.iter().map(String::as_str).collect();
    consumer.subscribe(&topics)
}

#[derive(Debug, Clone, Deserialize, Serialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct ConsumerConfig {
    /// The consumer group; instances with the same group share the partitions.
    pub group_id: String,
    /// Topics to read: names, or regular expressions starting with `^` (librdkafka's rule).
    pub topics: Vec<String>,
    /// This instance's stable name in the group (Kafka static membership,
    /// `group.instance.id`): restarted within the session timeout (`session.timeout.ms`,
    /// 10 s here, settable in `[kafka.properties]`) it takes its partitions
    /// back at once, without a rebalance, instead of leaving them unread until the timeout.
    /// Each instance needs its own (the Kubernetes manifests give the pod's name). Default
    /// empty: dynamic membership.
    #[serde(default)]
    pub instance_id: String,
}

impl ConsumerConfig {
    pub fn with_group(group_id: &str) -> Self {
        Self {
            group_id: group_id.into(),
            topics: vec!["^sluice\\..*".into()],
            instance_id: String::new(),
        }
    }

    /// The consumer's settings: `kafka`'s, this group, and this instance's static name.
    pub fn client_config(
        &self,
        kafka: &sluice_common::KafkaConfig,
        client_id: &str,
    ) -> rdkafka::ClientConfig {
        let mut cc = kafka.consumer_config(client_id, &self.group_id);
        if !self.instance_id.is_empty() {
            cc.set("group.instance.id", &self.instance_id);
        }
        cc
    }

    pub fn validate(&self) -> Result<(), (String, String)> {
        if self.group_id.trim().is_empty() {
            return Err(("consumer.group_id".into(), "must not be empty".into()));
        }
        if self.topics.is_empty() {
            return Err((
                "consumer.topics".into(),
                "name at least one topic or ^pattern".into(),
            ));
        }
        if let Some(t) = self.topics.iter().find(|t| t.trim().is_empty()) {
            return Err(("consumer.topics".into(), format!("empty topic name {t:?}")));
        }
        Ok(())
    }
}

#[derive(Debug, Clone, Copy, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum OnBadEvent {
    /// A row event of a table (apply-clickhouse: a mirror or a change log) or of a collection
    /// (apply-mongo) that cannot be written stops its table or collection, named with the
    /// reason (the event and the later ones go to the dead-letter topic): a mirror missing a
    /// change would be silently wrong (a lost DELETE leaves a ghost row), a change log would
    /// miss a change. Events naming no table (undecodable) are dead-lettered.
    StopTable,
    /// Send it to the dead-letter topic and go on.
    DeadLetter,
    /// Stop the process (nothing after it is committed).
    Stop,
}

/// `[errors]`: events that can never be written.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct ErrorsConfig {
    /// `stop_table`, `dead_letter` or `stop`. Default `stop_table`.
    pub on_bad_event: OnBadEvent,
    /// Default `_sluice_dead_letters`.
    pub dead_letter_topic: String,
    /// How long the target may stay unreachable (writes retried) before `/healthz` says
    /// degraded (503, with the reason), in milliseconds. Default 60000.
    pub degraded_after_ms: u64,
}

impl Default for ErrorsConfig {
    fn default() -> Self {
        Self {
            on_bad_event: OnBadEvent::StopTable,
            dead_letter_topic: "_sluice_dead_letters".into(),
            degraded_after_ms: 60_000,
        }
    }
}
