//! capture-mongo: configuration and preflight checks against the source deployment.

use serde::{Deserialize, Serialize};
use sluice_common::mongo::{check_uri, describe_server};
use sluice_common::{Check, KafkaConfig, LogConfig, MetricsConfig, TopicsConfig, Validate};

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

/// `[mongodb]`: the source deployment.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct MongoConfig {
    /// A MongoDB connection string of a replica set (change streams need one).
    /// Default `mongodb://127.0.0.1:27017`.
    pub uri: String,
}

impl Default for MongoConfig {
    fn default() -> Self {
        Self {
            uri: "mongodb://127.0.0.1:27017".into(),
        }
    }
}

impl Validate for Config {
    fn validate(&self) -> Result<(), (String, String)> {
        if self.connector.is_empty() {
            return Err(("connector".into(), "must not be empty".into()));
        }
        check_uri("mongodb.uri", &self.mongodb.uri)?;
        self.kafka.validate()?;
        self.topics.validate()?;
        self.log.validate()
    }
}

sluice_common::app_config!(Config);

pub async fn preflight(config: &Config) -> Vec<Check> {
    let mut checks = vec![config.kafka.check("capture-mongo").await];
    match describe_server(&config.mongodb.uri).await {
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
    checks
}
