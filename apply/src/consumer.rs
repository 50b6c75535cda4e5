//! `[consumer]`: the consumer group and the topics an apply binary reads; `[errors]`: what
//! happens to events that can never be written.

use serde::{Deserialize, Serialize};

/// Subscribe `consumer` to `topics` (names, or patterns starting with `^`).
pub fn subscribe<C: rdkafka::consumer::ConsumerContext>(
    consumer: &rdkafka::consumer::StreamConsumer<C>,
    topics: &[String],
) -> rdkafka::error::KafkaResult<()> {
    use rdkafka::consumer::Consumer;
    let (patterns, names): (Vec<&String>, Vec<&String>) =
        topics.iter().partition(|t| t.starts_with('^'));
    tracing::info!(
        ?patterns,
        ?names,
        "subscribing: the topics matching the patterns, and the topics named"
    );
    let topics: Vec<&str> = topics.iter().map(String::as_str).collect();
    consumer.subscribe(&topics)
}

/// Why entry `t` of `consumer.topics` cannot be subscribed to, if it cannot: a pattern (it
/// starts with `^`, librdkafka's rule) that does not compile, or a name with a character no
/// topic name has (letters, digits, `.`, `_`, `-`), which librdkafka would take literally
/// and wait for forever.
fn topic_entry_error(t: &str) -> Option<String> {
    if t.starts_with('^') {
        return regex::Regex::new(t)
            .err()
            .map(|e| format!("{t:?} is not a valid pattern: {e}"));
    }
    let legal = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-');
    if t.len() > 249 || !t.chars().all(legal) {
        return Some(format!(
            "{t:?} is not a topic name (letters, digits, '.', '_' and '-' only, at most 249): \
             a name without a leading ^ is taken literally; for a pattern write \"^{t}\""
        ));
    }
    None
}

/// The topics `topics` (names, or `^` patterns) match among `existing`.
pub fn matching<'a>(topics: &[String], existing: &'a [String]) -> Vec<&'a String> {
    let patterns: Vec<regex::Regex> = topics
        .iter()
        .filter(|t| t.starts_with('^'))
        .filter_map(|t| regex::Regex::new(t).ok())
        .collect();
    existing
        .iter()
        .filter(|e| topics.contains(e) || patterns.iter().any(|p| p.is_match(e)))
        .collect()
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
        if let Some(e) = self.topics.iter().find_map(|t| topic_entry_error(t)) {
            return Err(("consumer.topics".into(), e));
        }
        Ok(())
    }

    /// `--check`'s line on the subscription: which entries are patterns and which names, and
    /// the topics that match now (a warning when none does yet: a new pipeline's capture
    /// makes them as its tables' first rows come).
    pub async fn topics_check(&self, kafka: &sluice_common::KafkaConfig) -> sluice_common::Check {
        use rdkafka::consumer::{BaseConsumer, Consumer};
        let config = kafka.client_config("sluice-check");
        let timeout = kafka.request_timeout();
        let listed = tokio::task::spawn_blocking(move || -> Result<Vec<String>, String> {
            let c: BaseConsumer = config.create().map_err(|e| e.to_string())?;
            let m = c.fetch_metadata(None, timeout).map_err(|e| e.to_string())?;
            Ok(m.topics().iter().map(|t| t.name().to_string()).collect())
        })
        .await
        .map_err(|e| e.to_string())
        .and_then(|r| r);
        let (patterns, names): (Vec<&String>, Vec<&String>) =
            self.topics.iter().partition(|t| t.starts_with('^'));
        let what = format!("patterns {patterns:?}, names {names:?}");
        match listed {
            Err(e) => sluice_common::Check::warn(
                "consumer.topics",
                format!("{what}; the topics could not be listed: {e}"),
            ),
            Ok(existing) => {
                let now = matching(&self.topics, &existing);
                if now.is_empty() {
                    sluice_common::Check::warn(
                        "consumer.topics",
                        format!("{what}: no topic matches yet (a new pipeline's capture makes them as its tables' first rows come)"),
                    )
                } else {
                    let shown: Vec<&str> = now.iter().take(10).map(|t| t.as_str()).collect();
                    let more = now.len().saturating_sub(shown.len());
                    sluice_common::Check::pass(
                        "consumer.topics",
                        format!(
                            "{what}: {} topics match now: {}{}",
                            now.len(),
                            shown.join(", "),
                            if more > 0 {
                                format!(" and {more} more")
                            } else {
                                String::new()
                            }
                        ),
                    )
                }
            }
        }
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

#[cfg(test)]
mod topics_tests {
    use super::*;

    #[test]
    fn topic_entries_are_patterns_that_compile_or_names_a_topic_can_have() {
        let config = |t: &str| ConsumerConfig {
            topics: vec![t.into()],
            ..ConsumerConfig::with_group("g")
        };
        assert!(config("^ux\\.ux_shop\\..*").validate().is_ok());
        assert!(config("cdc.shop.orders").validate().is_ok());
        let (key, why) = config("^ux\\.(ux_shop").validate().unwrap_err();
        assert_eq!(key, "consumer.topics");
        assert!(why.contains("is not a valid pattern"), "{why}");
        let (_, why) = config("ux\\.ux_shop\\..*").validate().unwrap_err();
        assert!(
            why.contains("taken literally") && why.contains("\"^ux"),
            "{why}"
        );
    }

    #[test]
    fn the_topics_that_match_are_the_named_ones_and_the_patterns() {
        let existing: Vec<String> = ["cdc.a.t", "cdc.a.u", "other", "cdcxa"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let m = matching(&["^cdc\\.a\\..*".into(), "other".into()], &existing);
        assert_eq!(m, ["cdc.a.t", "cdc.a.u", "other"]);
    }
}
