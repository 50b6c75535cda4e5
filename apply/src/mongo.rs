//! apply-mongo: configuration and preflight checks against the target deployment.

use serde::{Deserialize, Serialize};
use sluice_common::mongo::{check_uri, describe_server};
use sluice_common::{Check, KafkaConfig, LogConfig, MetricsConfig, Validate};

use crate::consumer::ConsumerConfig;

/// The whole configuration of `apply-mongo`.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    #[serde(default)]
    pub mongodb: MongoTargetConfig,
    #[serde(default)]
    pub kafka: KafkaConfig,
    #[serde(default = "default_consumer")]
    pub consumer: ConsumerConfig,
    #[serde(default = "default_metrics")]
    pub metrics: MetricsConfig,
    #[serde(default)]
    pub log: LogConfig,
}

fn default_consumer() -> ConsumerConfig {
    ConsumerConfig::with_group("sluice-apply-mongo")
}

fn default_metrics() -> MetricsConfig {
    MetricsConfig {
        listen: "0.0.0.0:9104".parse().expect("valid address"),
    }
}

/// `[mongodb]`: the target deployment.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct MongoTargetConfig {
    /// A MongoDB connection string. Default `mongodb://127.0.0.1:27017`.
    pub uri: String,
}

impl Default for MongoTargetConfig {
    fn default() -> Self {
        Self {
            uri: "mongodb://127.0.0.1:27017".into(),
        }
    }
}

impl Validate for Config {
    fn validate(&self) -> Result<(), (String, String)> {
        check_uri("mongodb.uri", &self.mongodb.uri)?;
        self.kafka.validate()?;
        self.consumer.validate()?;
        self.log.validate()
    }
}

sluice_common::app_config!(Config);

pub async fn preflight(config: &Config) -> Vec<Check> {
    let mut checks = vec![config.kafka.check("apply-mongo").await];
    checks.push(Check::from_result(
        "mongodb",
        describe_server(&config.mongodb.uri).await.map(|(d, _)| d),
    ));
    checks
}
