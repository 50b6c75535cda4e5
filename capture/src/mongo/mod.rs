//! capture-mongo: configuration and preflight checks against the source deployment.

pub mod change;
pub mod stream;

use serde::{Deserialize, Serialize};
use sluice_common::mongo::{check_uri, describe_server};
use sluice_common::secret::Uri;
use sluice_common::{
    Check, KafkaConfig, LogConfig, MetricsConfig, StandbyConfig, TopicsConfig, Validate,
};

use crate::filter::{Filter, FilterConfig};
use crate::publish::PublishConfig;

/// The whole configuration of `capture-mongo`.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// The name of this capture, written into every event and used as its checkpoint key.
    /// Default `mongo`.
    #[serde(default = "default_connector")]
    pub connector: String,
    #[serde(default)]
    pub mongodb: MongoConfig,
    #[serde(default)]
    pub kafka: KafkaConfig,
    #[serde(default)]
    pub topics: TopicsConfig,
    #[serde(default)]
    pub filter: FilterConfig,
    #[serde(default)]
    pub publish: PublishConfig,
    #[serde(default)]
    pub snapshot: crate::snapshot::SnapshotConfig,
    #[serde(default)]
    pub standby: StandbyConfig,
    #[serde(default = "default_metrics")]
    pub metrics: MetricsConfig,
    #[serde(default)]
    pub log: LogConfig,
}

fn default_connector() -> String {
    "mongo".into()
}

fn default_metrics() -> MetricsConfig {
    MetricsConfig {
        listen: "0.0.0.0:9102".parse().expect("valid address"),
    }
}

/// Databases never captured.
pub const SYSTEM_DATABASES: &[&str] = &["admin", "local", "config"];

/// How changes are read.
#[derive(Debug, Clone, Copy, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    /// A change stream (MongoDB 4.0+ replica sets and sharded clusters).
    ChangeStream,
    /// Tailing `local.oplog.rs` with a tailable cursor (replica set members).
    Oplog,
}

/// `fullDocument` of update events in change stream mode.
#[derive(Debug, Clone, Copy, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub enum FullDocument {
    /// Only the update description.
    Default,
    /// Also the document as it is when the event is read (MongoDB's `updateLookup`).
    UpdateLookup,
    /// The document as it was right after the change (MongoDB 6.0+ with pre- and post-images
    /// enabled on the collection).
    WhenAvailable,
    Required,
}

/// `fullDocumentBeforeChange` in change stream mode (MongoDB 6.0+).
#[derive(Debug, Clone, Copy, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub enum BeforeChange {
    Off,
    WhenAvailable,
    Required,
}

/// `[mongodb]`: the source deployment and how to read it.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct MongoConfig {
    /// A MongoDB connection string of a replica set or sharded cluster.
    /// Default `mongodb://127.0.0.1:27017`.
    /// A password in it is percent-encoded (`@` is `%40`, `#` is `%23`, `:` is `%3A`);
    /// `uri_file` reads the whole string from a file. Shown with its password as `***`.
    pub uri: Uri,
    /// `change_stream` or `oplog`. Default `change_stream`.
    pub mode: Mode,
    /// Change stream scope: with `database` only, that database; with `collection` too, that
    /// collection; neither, the whole cluster. The oplog mode reads everything and filters.
    /// Default empty (cluster).
    pub database: String,
    pub collection: String,
    /// `default`, `updateLookup`, `whenAvailable` or `required`. Default `default`.
    pub full_document: FullDocument,
    /// `off`, `whenAvailable` or `required`. Default `off`.
    pub full_document_before_change: BeforeChange,
    /// Where to begin when there is no checkpoint yet: `now`, or `time:SECONDS[.INCREMENT]` /
    /// `time:YYYY-MM-DDTHH:MM:SSZ` (the first operation at or after that time). Ignored once a
    /// checkpoint exists. Default `now`.
    pub start: String,
    /// Stop cleanly once every change up to this time is published: `time:...` as for
    /// `start`. Default empty (never).
    pub end: String,
    /// Documents per cursor batch. Default 1000.
    pub batch_size: u32,
    /// How long the server waits for new changes before answering an empty batch, in
    /// milliseconds; idle checkpoints advance at this pace. Default 1000.
    pub max_await_ms: u64,
    /// A capture that has read nothing for this long (no change, no idle answer from the
    /// server, which comes every `max_await_ms` while it reads, and no record handed to Kafka),
    /// or has had nothing acknowledged by Kafka for this long with records in flight, is
    /// stalled: `/healthz` says so (503) until it moves again. In milliseconds. Default 60000.
    pub stalled_after_ms: u64,
    /// Oplog mode: bytes of oplog entries held in memory for transactions waiting for their
    /// last entry (`partialTxn`) or their commit (prepared), at most; a transaction past it
    /// waits in a file in `spill_dir`. Default 67108864 (64 MiB).
    pub max_held_bytes: usize,
    /// Where those files go. Default empty: the system's temporary folder (`TMPDIR`).
    pub spill_dir: String,
}

impl Default for MongoConfig {
    fn default() -> Self {
        Self {
            uri: Uri::new("mongodb://127.0.0.1:27017"),
            mode: Mode::ChangeStream,
            database: String::new(),
            collection: String::new(),
            full_document: FullDocument::Default,
            full_document_before_change: BeforeChange::Off,
            start: "now".into(),
            end: String::new(),
            batch_size: 1000,
            max_await_ms: 1000,
            stalled_after_ms: 60_000,
            max_held_bytes: 64 << 20,
            spill_dir: String::new(),
        }
    }
}

/// A point in the oplog given in the config.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StartAt {
    Now,
    Time(mongodb::bson::Timestamp),
}

/// Parse `now` or `time:SECONDS[.INCREMENT]` / `time:YYYY-MM-DDTHH:MM:SSZ`.
pub fn parse_point(s: &str) -> Result<StartAt, String> {
    let s = s.trim();
    if s == "now" {
        return Ok(StartAt::Now);
    }
    let bad =
        || format!("{s:?}: expected now, time:SECONDS[.INCREMENT] or time:YYYY-MM-DDTHH:MM:SSZ");
    let t = s.strip_prefix("time:").ok_or_else(bad)?;
    let (secs, inc) = match t.split_once('.') {
        Some((a, b)) if a.bytes().all(|c| c.is_ascii_digit()) => (
            a.parse::<u64>().map_err(|_| bad())?,
            b.parse::<u32>().map_err(|_| bad())?,
        ),
        _ => (
            sluice_common::civil::parse_epoch_seconds(t).map_err(|e| format!("{s:?}: {e}"))?,
            0,
        ),
    };
    let time = u32::try_from(secs).map_err(|_| format!("{s:?}: beyond 2106"))?;
    Ok(StartAt::Time(mongodb::bson::Timestamp {
        time,
        increment: inc,
    }))
}

impl Validate for Config {
    fn validate(&self) -> Result<(), (String, String)> {
        if self.connector.is_empty() {
            return Err(("connector".into(), "must not be empty".into()));
        }
        check_uri("mongodb.uri", self.mongodb.uri.expose())?;
        let m = &self.mongodb;
        parse_point(&m.start).map_err(|e| ("mongodb.start".to_string(), e))?;
        if !m.end.is_empty() {
            match parse_point(&m.end) {
                Ok(StartAt::Time(_)) => {}
                Ok(StartAt::Now) => {
                    return Err(("mongodb.end".into(), "must be a time:..., not now".into()))
                }
                Err(e) => return Err(("mongodb.end".into(), e)),
            }
        }
        if !m.collection.is_empty() && m.database.is_empty() {
            return Err((
                "mongodb.collection".into(),
                "needs mongodb.database as well".into(),
            ));
        }
        if m.batch_size == 0 {
            return Err(("mongodb.batch_size".into(), "must be at least 1".into()));
        }
        if m.stalled_after_ms < 1000 || m.stalled_after_ms <= 2 * m.max_await_ms {
            return Err((
                "mongodb.stalled_after_ms".into(),
                format!(
                    "{} is too short: at least 1000 and more than twice mongodb.max_await_ms ({}), \
                     the longest an idle source takes to answer",
                    m.stalled_after_ms, m.max_await_ms
                ),
            ));
        }
        Filter::new(&self.filter, SYSTEM_DATABASES)?;
        self.publish.validate()?;
        self.snapshot.validate()?;
        self.kafka.validate()?;
        self.topics.validate()?;
        self.standby.validate()?;
        self.log.validate()
    }
}

sluice_common::app_config!(Config);

pub async fn preflight(config: &Config) -> Vec<Check> {
    let mut checks = vec![config.kafka.check("capture-mongo").await];
    match describe_server(config.mongodb.uri.expose()).await {
        Ok((desc, hello)) => {
            checks.push(Check::pass("mongodb", desc));
            match hello.get_str("setName") {
                Ok(set) => checks.push(Check::pass("replica set", format!("member of {set}"))),
                Err(_) => checks.push(Check::warn(
                    "replica set",
                    "the server reports no replica set: MongoDB proper serves change streams \
                     only on replica sets and sharded clusters",
                )),
            }
        }
        Err(e) => checks.push(Check::fail("mongodb", e)),
    }
    if config.mongodb.mode == Mode::Oplog {
        checks.push(oplog_check(config.mongodb.uri.expose()).await);
    }
    checks
}

/// The oplog mode needs `local.oplog.rs` readable.
async fn oplog_check(uri: &str) -> Check {
    let result = async {
        let client = mongodb::Client::with_uri_str(uri).await?;
        client
            .database("local")
            .collection::<mongodb::bson::Document>("oplog.rs")
            .find_one(mongodb::bson::doc! {})
            .await
    }
    .await;
    match result {
        Ok(Some(_)) => Check::pass("oplog", "local.oplog.rs is readable"),
        Ok(None) => Check::warn(
            "oplog",
            "local.oplog.rs is empty or missing: is the server a replica set member?",
        ),
        Err(e) => Check::fail("oplog", format!("cannot read local.oplog.rs: {e}")),
    }
}

impl crate::Connector for Config {
    fn connector(&self) -> &str {
        &self.connector
    }
    fn kafka(&self) -> &KafkaConfig {
        &self.kafka
    }
    fn standby(&self) -> &StandbyConfig {
        &self.standby
    }
    fn publish(&self) -> &crate::publish::PublishConfig {
        &self.publish
    }
    fn topics(&self) -> &TopicsConfig {
        &self.topics
    }
}
