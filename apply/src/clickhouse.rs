//! apply-clickhouse: configuration and preflight checks against the target server.

use serde::{Deserialize, Serialize};
use sluice_common::{AppConfig, Check, KafkaConfig, LogConfig, MetricsConfig, Validate};

use crate::consumer::ConsumerConfig;

/// The whole configuration of `apply-clickhouse`.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    #[serde(default)]
    pub clickhouse: ClickhouseConfig,
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
    ConsumerConfig::with_group("sluice-apply-clickhouse")
}

fn default_metrics() -> MetricsConfig {
    MetricsConfig {
        listen: "0.0.0.0:9103".parse().expect("valid address"),
    }
}

/// `[clickhouse]`: the target server.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct ClickhouseConfig {
    /// The HTTP interface, `http://host:8123`. Default `http://127.0.0.1:8123`.
    pub url: String,
    /// Default `default`.
    pub user: String,
    /// Default empty.
    pub password: String,
    /// The database target tables live in. Default `default`.
    pub database: String,
}

impl Default for ClickhouseConfig {
    fn default() -> Self {
        Self {
            url: "http://127.0.0.1:8123".into(),
            user: "default".into(),
            password: String::new(),
            database: "default".into(),
        }
    }
}

impl ClickhouseConfig {
    /// A client for this server. Row validation against `DESCRIBE` is off: ClickHouse before
    /// 22.x knows neither the setting nor the format it needs.
    pub fn client(&self) -> clickhouse::Client {
        clickhouse::Client::default()
            .with_url(&self.url)
            .with_user(&self.user)
            .with_password(&self.password)
            .with_database(&self.database)
            .with_validation(false)
    }
}

impl Validate for Config {
    fn validate(&self) -> Result<(), (String, String)> {
        if !(self.clickhouse.url.starts_with("http://")
            || self.clickhouse.url.starts_with("https://"))
        {
            return Err((
                "clickhouse.url".into(),
                format!(
                    "expected http://host:port (the HTTP interface), got {:?}",
                    self.clickhouse.url
                ),
            ));
        }
        if self.clickhouse.url.starts_with("https://") {
            return Err((
                "clickhouse.url".into(),
                "https is not supported by this build; use http:// (or a TLS-terminating proxy)"
                    .into(),
            ));
        }
        if self.clickhouse.database.is_empty() {
            return Err(("clickhouse.database".into(), "must not be empty".into()));
        }
        self.kafka.validate()?;
        self.consumer.validate()?;
        self.log.validate()
    }
}

impl AppConfig for Config {
    fn log(&self) -> &LogConfig {
        &self.log
    }
    fn metrics(&self) -> &MetricsConfig {
        &self.metrics
    }
}

pub async fn preflight(config: &Config) -> Vec<Check> {
    let mut checks = vec![Check::from_result(
        "kafka",
        config
            .kafka
            .check_reachable("apply-clickhouse")
            .await
            .map(|n| format!("{} reachable ({n} broker(s))", config.kafka.brokers)),
    )];
    let client = config.clickhouse.client();
    match client.query("SELECT version()").fetch_one::<String>().await {
        Ok(v) => {
            checks.push(Check::pass(
                "clickhouse",
                format!("ClickHouse {v} at {}", config.clickhouse.url),
            ));
            let exists = client
                .query("SELECT count() FROM system.databases WHERE name = ?")
                .bind(&config.clickhouse.database)
                .fetch_one::<u64>()
                .await;
            checks.push(match exists {
                Ok(1) => Check::pass("clickhouse.database", config.clickhouse.database.clone()),
                Ok(_) => Check::fail(
                    "clickhouse.database",
                    format!(
                        "database {:?} does not exist: CREATE DATABASE it first",
                        config.clickhouse.database
                    ),
                ),
                Err(e) => Check::fail("clickhouse.database", e.to_string()),
            });
        }
        Err(e) => checks.push(Check::fail(
            "clickhouse",
            format!("cannot query {}: {e}", config.clickhouse.url),
        )),
    }
    checks
}
