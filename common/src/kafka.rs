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

use crate::secret::Secret;

/// The header every record of a capture carries: `<connector>/<incarnation>`, the number in
/// decimal ASCII. Each start of a connector's capture takes a number above the last one
/// (stored in the checkpoint topic in a transaction of its fenced writer, and never below the
/// start's time in milliseconds since the epoch) before it publishes anything, so a capture
/// that was taken over and then revived (a paused process resumed) sends its buffered records
/// with a lower number than its successor's: the apply stages skip, per partition and
/// connector, every record whose incarnation is below one already seen there.
pub const INCARNATION_HEADER: &str = "sluice.incarnation";

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

/// A client-creation error without the value of the property it names (rdkafka's message
/// quotes it, and it may be a password).
pub fn config_error(e: &rdkafka::error::KafkaError) -> String {
    match e {
        rdkafka::error::KafkaError::ClientConfig(_, description, key, _value) => {
            format!("property {key}: {description}")
        }
        other => other.to_string(),
    }
}

/// librdkafka's errors as a client's log says them. A broker that restarts makes librdkafka
/// report the same transport failure for every connection, over and over: the first of each
/// kind is logged (WARN for a transport failure, which librdkafka retries by itself; ERROR
/// otherwise), then at most one line a minute with how many more came, so that a 15 s broker
/// restart is a few lines, not sixty. Each error, logged or not, is counted by `count`.
pub struct ErrorLog {
    client: &'static str,
    seen: std::sync::Mutex<std::collections::HashMap<String, (std::time::Instant, u64)>>,
}

/// How often a repeated librdkafka error is said again.
const SAY_AGAIN_AFTER: std::time::Duration = std::time::Duration::from_secs(60);

impl ErrorLog {
    pub fn new(client: &'static str) -> Self {
        Self {
            client,
            seen: Default::default(),
        }
    }

    /// Whether `e` is a transport failure librdkafka recovers from by itself (a broker down,
    /// restarting, or not resolvable yet).
    pub fn transient(e: &rdkafka::error::KafkaError) -> bool {
        use rdkafka::types::RDKafkaErrorCode as C;
        matches!(
            e.rdkafka_error_code(),
            Some(
                C::BrokerTransportFailure | C::AllBrokersDown | C::Resolve | C::BrokerNotAvailable
            )
        )
    }

    /// Log `error` (librdkafka's `reason` names the broker and the cause: "Connect to
    /// ipv4#127.0.0.1:9092 failed: Connection refused"), unless the same kind was said less
    /// than a minute ago. Returns whether it was logged.
    pub fn note(&self, error: &rdkafka::error::KafkaError, reason: &str) -> bool {
        let kind = match error.rdkafka_error_code() {
            Some(c) => format!("{c:?}"),
            None => error.to_string(),
        };
        let mut seen = self.seen.lock().expect("error log lock");
        let now = std::time::Instant::now();
        let more = match seen.get_mut(&kind) {
            Some((at, n)) if now.duration_since(*at) < SAY_AGAIN_AFTER => {
                *n += 1;
                return false;
            }
            Some((at, n)) => {
                let more = *n;
                *at = now;
                *n = 0;
                more
            }
            None => {
                seen.insert(kind, (now, 0));
                0
            }
        };
        let again = if more > 0 {
            format!(" ({more} more like it in the last minute)")
        } else {
            String::new()
        };
        if Self::transient(error) {
            tracing::warn!(
                client = self.client,
                "Kafka: {reason}{again} (librdkafka retries by itself)"
            );
        } else {
            tracing::error!(client = self.client, "Kafka: {error}: {reason}{again}");
        }
        true
    }
}

/// librdkafka's own log lines, for a client context's `log`: as rust-rdkafka logs them, except
/// a broker connection's failure (facility `FAIL`), which the error callback reports too
/// ([`ErrorLog`], without repeating): at debug here, so that a broker restart is not a line per
/// connection and retry.
pub fn librdkafka_log(level: rdkafka::config::RDKafkaLogLevel, fac: &str, message: &str) {
    use rdkafka::config::RDKafkaLogLevel as L;
    if fac == "FAIL" {
        tracing::debug!(target: "librdkafka", "librdkafka: {fac} {message}");
        return;
    }
    match level {
        L::Emerg | L::Alert | L::Critical | L::Error => {
            tracing::error!(target: "librdkafka", "librdkafka: {fac} {message}")
        }
        L::Warning => tracing::warn!(target: "librdkafka", "librdkafka: {fac} {message}"),
        L::Notice | L::Info => tracing::info!(target: "librdkafka", "librdkafka: {fac} {message}"),
        L::Debug => tracing::debug!(target: "librdkafka", "librdkafka: {fac} {message}"),
    }
}

/// A client context that keeps librdkafka's last error (for the preflight check's message).
#[derive(Default)]
struct LastError(std::sync::Mutex<Option<String>>);

impl rdkafka::ClientContext for LastError {
    fn error(&self, error: rdkafka::error::KafkaError, reason: &str) {
        *self.0.lock().expect("last error lock") = Some(format!("{error}: {reason}"));
    }
}

impl rdkafka::consumer::ConsumerContext for LastError {}

/// librdkafka properties that have their own key in `[kafka]`.
const OWN_KEYS: &[(&str, &str)] = &[
    ("security.protocol", "security_protocol"),
    ("sasl.mechanism", "sasl_mechanism"),
    ("sasl.mechanisms", "sasl_mechanism"),
    ("sasl.username", "sasl_username"),
    ("sasl.password", "sasl_password"),
    ("ssl.ca.location", "ssl_ca"),
    ("ssl.certificate.location", "ssl_cert"),
    ("ssl.key.location", "ssl_key"),
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
    /// `security.protocol`: `plaintext`, `ssl`, `sasl_plaintext` or `sasl_ssl`. Default
    /// `plaintext`.
    pub security_protocol: String,
    /// `sasl.mechanism`: `PLAIN`, `SCRAM-SHA-256` or `SCRAM-SHA-512`. Default empty
    /// (librdkafka's: GSSAPI, which this build does not have).
    pub sasl_mechanism: String,
    /// `sasl.username`. Default empty.
    pub sasl_username: String,
    /// `sasl.password`; `sasl_password_file` reads it from a file. Default empty.
    pub sasl_password: Secret,
    /// `ssl.ca.location`: the CA certificate(s) (PEM) the brokers' certificates are checked
    /// against (and their names, `ssl.endpoint.identification.algorithm = https`), instead
    /// of the system's roots. Default empty.
    pub ssl_ca: String,
    /// `ssl.certificate.location`: a client certificate (PEM), with `ssl_key`. Default empty.
    pub ssl_cert: String,
    /// `ssl.key.location`: the client certificate's private key (PEM). Default empty.
    pub ssl_key: String,
    /// Further librdkafka properties passed as they are (`linger.ms`, `compression.type`,
    /// `ssl.*`, `sasl.*`, ...); `--print-config` masks the values of those that hold
    /// secrets. Default: none.
    /// A number or a boolean is taken as librdkafka's text of it (`"linger.ms" = 5`).
    #[serde(
        serialize_with = "crate::secret::serialize_properties",
        deserialize_with = "scalar_properties"
    )]
    pub properties: BTreeMap<String, String>,
}

/// `[kafka.properties]`: every value as text, numbers and booleans included.
fn scalar_properties<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> Result<BTreeMap<String, String>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Scalar {
        Text(String),
        Int(i64),
        Float(f64),
        Bool(bool),
    }
    let raw = BTreeMap::<String, Scalar>::deserialize(d)?;
    Ok(raw
        .into_iter()
        .map(|(k, v)| {
            let v = match v {
                Scalar::Text(s) => s,
                Scalar::Int(i) => i.to_string(),
                Scalar::Float(f) => f.to_string(),
                Scalar::Bool(b) => b.to_string(),
            };
            (k, v)
        })
        .collect())
}

impl Default for KafkaConfig {
    fn default() -> Self {
        Self {
            brokers: "127.0.0.1:9092".into(),
            client_id: String::new(),
            request_timeout_ms: 10_000,
            security_protocol: "plaintext".into(),
            sasl_mechanism: String::new(),
            sasl_username: String::new(),
            sasl_password: Secret::default(),
            ssl_ca: String::new(),
            ssl_cert: String::new(),
            ssl_key: String::new(),
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
        for key in ["bootstrap.servers", "group.id", "client.id"]
            .into_iter()
            .chain(OWN_KEYS.iter().map(|(k, _)| *k))
        {
            if self.properties.contains_key(key) {
                return Err((
                    format!("kafka.properties.{key}"),
                    "has its own key in [kafka] (brokers, client_id, security_protocol, \
                     sasl_mechanism, sasl_username, sasl_password, ssl_ca, ssl_cert, ssl_key) \
                     or in the stage's section"
                        .into(),
                ));
            }
        }
        let protocol = self.security_protocol.to_ascii_lowercase();
        if !["plaintext", "ssl", "sasl_plaintext", "sasl_ssl"].contains(&protocol.as_str()) {
            return Err((
                "kafka.security_protocol".into(),
                format!(
                    "expected plaintext, ssl, sasl_plaintext or sasl_ssl, got {:?}",
                    self.security_protocol
                ),
            ));
        }
        if protocol.starts_with("sasl") {
            let m = self.sasl_mechanism.to_ascii_uppercase();
            if !["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER"].contains(&m.as_str()) {
                return Err((
                    "kafka.sasl_mechanism".into(),
                    format!(
                        "expected PLAIN, SCRAM-SHA-256, SCRAM-SHA-512 or OAUTHBEARER with {}, got {:?}",
                        self.security_protocol, self.sasl_mechanism
                    ),
                ));
            }
            if m != "OAUTHBEARER"
                && (self.sasl_username.is_empty() || self.sasl_password.is_empty())
            {
                return Err((
                    "kafka.sasl_username".into(),
                    "SASL needs sasl_username and sasl_password (or sasl_password_file)".into(),
                ));
            }
        }
        if protocol == "sasl_plaintext" && self.sasl_mechanism.eq_ignore_ascii_case("PLAIN") {
            tracing::warn!(
                "kafka.security_protocol = sasl_plaintext with PLAIN sends the password in clear: \
                 use sasl_ssl"
            );
        }
        for (key, path) in [
            ("kafka.ssl_ca", &self.ssl_ca),
            ("kafka.ssl_cert", &self.ssl_cert),
            ("kafka.ssl_key", &self.ssl_key),
        ] {
            if !path.is_empty() && !std::path::Path::new(path).is_file() {
                return Err((key.into(), format!("no such file: {path}")));
            }
        }
        // librdkafka refuses a bad property when a client is made; its message (rdkafka's
        // error) quotes the value, which may be a secret: checked here, shown without it.
        if let Err(e) = self
            .client_config("sluice-config-check")
            .create::<BaseConsumer>()
        {
            return Err(("kafka".into(), config_error(&e)));
        }
        let tls_files = !(self.ssl_ca.is_empty() && self.ssl_cert.is_empty());
        if tls_files && !protocol.ends_with("ssl") {
            return Err((
                "kafka.security_protocol".into(),
                format!(
                    "is {}, yet ssl_ca or ssl_cert is set: say ssl or sasl_ssl",
                    self.security_protocol
                ),
            ));
        }
        Ok(())
    }

    pub fn request_timeout(&self) -> Duration {
        Duration::from_millis(self.request_timeout_ms)
    }

    /// Settings common to producers, consumers and admin clients.
    pub fn client_config(&self, default_client_id: &str) -> ClientConfig {
        let mut c = ClientConfig::new();
        self.set_client(&mut c, default_client_id);
        c
    }

    /// Set the common settings on `c`. (Not copied from another `ClientConfig`: rdkafka's
    /// `config_map` hands out the values of sensitive properties, `sasl.password` and the
    /// like, as a placeholder.)
    fn set_client(&self, c: &mut ClientConfig, default_client_id: &str) {
        c.set("bootstrap.servers", &self.brokers);
        // A broker that restarts is reconnected to within a second of being back: librdkafka
        // doubles its reconnect wait up to 10 s by default, which after a restart of ten
        // seconds added up to 13 s more (docs/BENCHMARKS.md, recovery).
        c.set("reconnect.backoff.max.ms", "1000");
        c.set(
            "client.id",
            if self.client_id.is_empty() {
                default_client_id
            } else {
                &self.client_id
            },
        );
        c.set(
            "security.protocol",
            self.security_protocol.to_ascii_lowercase(),
        );
        for (key, value) in [
            ("sasl.mechanism", &self.sasl_mechanism),
            ("sasl.username", &self.sasl_username),
            ("sasl.password", &self.sasl_password.expose().to_string()),
            ("ssl.ca.location", &self.ssl_ca),
            ("ssl.certificate.location", &self.ssl_cert),
            ("ssl.key.location", &self.ssl_key),
        ] {
            if !value.is_empty() {
                c.set(key, value);
            }
        }
        for (k, v) in &self.properties {
            c.set(k, v);
        }
    }

    /// Where the brokers are and how they are reached, for messages (no secret).
    pub fn describe(&self) -> String {
        let auth = if self.sasl_username.is_empty() {
            String::new()
        } else {
            format!(", {} as {}", self.sasl_mechanism, self.sasl_username)
        };
        format!("{} ({}{auth})", self.brokers, self.security_protocol)
    }

    /// An idempotent, `acks=all` producer's settings.
    pub fn producer_config(&self, default_client_id: &str) -> ClientConfig {
        let mut c = ClientConfig::new();
        c.set("compression.type", "lz4");
        c.set("linger.ms", "5");
        // The Java client's partitioner, so every Kafka tool agrees on a key's partition.
        c.set("partitioner", "murmur2_random");
        self.set_client(&mut c, default_client_id);
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
        // A fetch waits at the broker up to this long for data. librdkafka keeps one fetch per
        // broker in flight, and partitions whose start offset is found while one waits join
        // the next: at 500 ms (the default) the first events after an assignment (a start, a
        // rebalance) waited about half a second more; 100 ms costs an idle consumer ten small
        // requests a second per broker.
        c.set("fetch.wait.max.ms", "100");
        // The session outlives an ordinary broker restart (9 - 16 s on the test bed), which
        // then costs no rebalance; a member that dies without leaving (kill -9, a lost node)
        // holds its partitions until the broker gives up on it: 30 s here, not librdkafka's
        // 45 s. A restarted one with `consumer.instance_id` takes them back at once
        // (docs/operations.md, Kafka settings; docs/BENCHMARKS.md, recovery).
        c.set("session.timeout.ms", "30000");
        c.set("heartbeat.interval.ms", "3000");
        self.set_client(&mut c, default_client_id);
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
    /// defaults; `compacted` sets `cleanup.policy=compact` and rolls a segment every hour
    /// (`segment.ms`): the broker compacts only closed segments, and by its default (7 days or
    /// 1 GiB) a checkpoint topic written every second grows to hundreds of MB that every
    /// capture's start reads from the beginning.
    pub async fn ensure_topic(
        &self,
        client_id: &str,
        topic: &str,
        partitions: i32,
        replication: i32,
        compacted: bool,
        max_message_bytes: Option<usize>,
    ) -> Result<bool, String> {
        self.ensure_topics(
            client_id,
            &[topic.to_string()],
            partitions,
            replication,
            compacted,
            max_message_bytes,
        )
        .await
        .map(|created| !created.is_empty())
    }

    /// [`Self::ensure_topic`] for several topics, in one request: the ones it created.
    pub async fn ensure_topics(
        &self,
        client_id: &str,
        topics: &[String],
        partitions: i32,
        replication: i32,
        compacted: bool,
        max_message_bytes: Option<usize>,
    ) -> Result<Vec<String>, String> {
        use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
        use rdkafka::client::DefaultClientContext;
        use rdkafka::types::RDKafkaErrorCode;
        if topics.is_empty() {
            return Ok(Vec::new());
        }
        let admin: AdminClient<DefaultClientContext> = self
            .client_config(client_id)
            .create()
            .map_err(|e| e.to_string())?;
        let max = max_message_bytes.map(|m| m.to_string());
        let new: Vec<NewTopic> = topics
            .iter()
            .map(|topic| {
                let mut new =
                    NewTopic::new(topic, partitions, TopicReplication::Fixed(replication));
                if compacted {
                    new = new
                        .set("cleanup.policy", "compact")
                        .set("segment.ms", "3600000");
                }
                if let Some(m) = &max {
                    new = new.set("max.message.bytes", m);
                }
                new
            })
            .collect();
        let opts = AdminOptions::new().operation_timeout(Some(self.request_timeout()));
        let results = admin.create_topics(&new, &opts).await.map_err(|e| {
            if topics.len() == 1 {
                format!("topic {}: {e}", topics[0])
            } else {
                format!("{} topics: {e}", topics.len())
            }
        })?;
        let mut created = Vec::new();
        for r in results {
            match r {
                Ok(t) => created.push(t),
                Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
                Err((t, code)) => return Err(format!("topic {t}: cannot create it: {code}")),
            }
        }
        Ok(created)
    }

    /// Ask the cluster for its metadata: the number of brokers, or why it could not be had.
    pub async fn check_reachable(&self, client_id: &str) -> Result<usize, String> {
        let config = self.client_config(client_id);
        let timeout = self.request_timeout();
        let (describe, secret) = (self.describe(), self.sasl_password.expose().to_string());
        tokio::task::spawn_blocking(move || {
            let consumer: BaseConsumer<LastError> = config
                .create_with_context(LastError::default())
                .map_err(|e| e.to_string())?;
            let md = consumer.fetch_metadata(None, timeout).map_err(|e| {
                // librdkafka says why only in its error events (a TLS handshake refused,
                // SASL credentials refused, a broker that does not answer), served by a poll.
                for _ in 0..5 {
                    let _ = consumer.poll(Duration::from_millis(50));
                }
                let why = consumer
                    .context()
                    .0
                    .lock()
                    .expect("last error lock")
                    .clone()
                    .map(|w| format!(" ({w})"))
                    .unwrap_or_default();
                crate::secret::scrub(
                    &format!("{describe}: no metadata within {timeout:?}: {e}{why}"),
                    &[&secret],
                )
            })?;
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

    #[test]
    fn every_client_reconnects_within_a_second_unless_told_otherwise() {
        let k = KafkaConfig::default();
        for c in [k.producer_config("x"), k.consumer_config("x", "g")] {
            assert_eq!(c.get("reconnect.backoff.max.ms"), Some("1000"));
        }
        let mut k = KafkaConfig::default();
        k.properties
            .insert("reconnect.backoff.max.ms".into(), "5000".into());
        assert_eq!(
            k.producer_config("x").get("reconnect.backoff.max.ms"),
            Some("5000")
        );
    }
}

#[cfg(test)]
mod error_log_tests {
    use super::ErrorLog;
    use rdkafka::error::KafkaError;
    use rdkafka::types::RDKafkaErrorCode;

    #[test]
    fn properties_take_numbers_and_booleans_as_text() {
        let k: super::KafkaConfig = toml::from_str(
            "[properties]\n\"linger.ms\" = 5\n\"enable.idempotence\" = true\n\"client.rack\" = \"a\"\n",
        )
        .unwrap();
        assert_eq!(k.properties["linger.ms"], "5");
        assert_eq!(k.properties["enable.idempotence"], "true");
        assert_eq!(k.properties["client.rack"], "a");
    }

    #[test]
    fn a_repeated_librdkafka_error_is_said_once_a_minute() {
        let log = ErrorLog::new("test");
        let down = KafkaError::Global(RDKafkaErrorCode::BrokerTransportFailure);
        assert!(ErrorLog::transient(&down));
        assert!(log.note(
            &down,
            "127.0.0.1:9092/1: Connect failed: Connection refused"
        ));
        for _ in 0..59 {
            assert!(!log.note(
                &down,
                "127.0.0.1:9092/1: Connect failed: Connection refused"
            ));
        }
        // Another kind is said at once.
        let auth = KafkaError::Global(RDKafkaErrorCode::Authentication);
        assert!(!ErrorLog::transient(&auth));
        assert!(log.note(&auth, "SASL authentication failed"));
    }
}
