//! apply-clickhouse: configuration and preflight checks against the target server.
//!
//! - [`sink`]: the sink (batches, writes, target tables, DDL);
//! - [`cluster`]: target tables on a ClickHouse cluster (Replicated engines, `ON CLUSTER`,
//!   Distributed tables);
//! - [`types`]: ClickHouse column types and the mapping from source columns;
//! - [`rowbinary`]: source values encoded as RowBinary of their target column's type.

pub mod cluster;
pub mod rowbinary;
pub mod sink;
pub mod types;

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use sluice_common::secret::Secret;
use sluice_common::{Check, KafkaConfig, LogConfig, MetricsConfig, Validate};

use crate::consumer::ConsumerConfig;
pub use crate::consumer::{ErrorsConfig, OnBadEvent};

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
    #[serde(default)]
    pub batch: BatchConfig,
    #[serde(default)]
    pub tables: TablesConfig,
    #[serde(default)]
    pub cluster: cluster::ClusterConfig,
    #[serde(default)]
    pub errors: ErrorsConfig,
    /// The compacted topic of schema records the capture writes. Default `_sluice_schemas`.
    #[serde(default = "default_schema_topic")]
    pub schema_topic: String,
    #[serde(default = "default_metrics")]
    pub metrics: MetricsConfig,
    #[serde(default)]
    pub log: LogConfig,
}

fn default_schema_topic() -> String {
    "_sluice_schemas".into()
}

/// `[batch]`: when a batch closes. Whichever comes first.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct BatchConfig {
    /// Rows (all tables together). Default 50000.
    pub max_rows: usize,
    /// RowBinary bytes (all tables together). Default 16777216 (16 MiB).
    pub max_bytes: usize,
    /// The longest an event waits in the batch, in milliseconds: a batch is written once it
    /// holds an event and this long has passed since the previous write began (at once after a
    /// quiet spell; one write per `max_wait_ms` under a steady stream). Default 500.
    pub max_wait_ms: u64,
}

impl Default for BatchConfig {
    fn default() -> Self {
        Self {
            max_rows: 50_000,
            max_bytes: 16 << 20,
            max_wait_ms: 500,
        }
    }
}

/// How a source table is kept in ClickHouse.
#[derive(Debug, Clone, Copy, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// The current state: ReplacingMergeTree(version) over the primary key, with a deleted flag.
    Mirror,
    /// Every change appended, with its operation and version.
    Changelog,
}

/// `[tables]`: target tables.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct TablesConfig {
    /// Target table name; placeholders `{db}`, `{table}`. Default `{table}`.
    pub name: String,
    /// The mode of tables not named in `modes`. Default `mirror`.
    pub mode: Mode,
    /// Per source table (`database.table`) modes, e.g. `"shop.orders" = "changelog"`.
    pub modes: BTreeMap<String, Mode>,
    /// Create missing target tables (and add new source columns). Default true.
    pub create: bool,
    /// The event version column. Default `_version`.
    pub version_column: String,
    /// The deleted flag of mirror tables. Default `_deleted`.
    pub deleted_column: String,
    /// The operation column of change-log tables. Default `_op`.
    pub op_column: String,
    /// The change logs of tables without a primary key: the event's place in its transaction
    /// (or in the table's snapshot), part of the sort key so that equal rows never collapse.
    /// Default `_row`.
    pub row_column: String,
    /// Where stopped tables are kept (in `clickhouse.database`), so that a restart does not
    /// take a stopped table up again: one row per target table with the reason. Delete a
    /// table's row (and restart) to take it up again. Default `_sluice_stopped`.
    pub stopped_table: String,
    /// Where the ALTERs applied are kept (in `clickhouse.database`): per target table the
    /// version of each, and the columns it renamed and dropped. A copy of an ALTER read from
    /// another partition, or again after a restart, is then known as applied, and rows of a
    /// schema before a rename or a drop still go to the right columns. Default `_sluice_ddl`.
    pub ddl_table: String,
    /// What a source `TRUNCATE` does to the target: `apply` (the default) or `keep`
    /// ([`OnTruncate`]).
    pub truncate: OnTruncate,
    /// Per source table (`database.table`) overrides of `truncate`.
    pub truncate_tables: BTreeMap<String, OnTruncate>,
    /// What a source `DROP TABLE` does to the target: `keep` (the default), `delete` or `stop`
    /// ([`OnDrop`]).
    pub drop: OnDrop,
    /// Per source table (`database.table`) overrides of `drop`.
    pub drop_tables: BTreeMap<String, OnDrop>,
    /// How DATE, DATETIME and TIMESTAMP columns of created tables are kept: `native` (the
    /// default: the server's widest date and time types; a value they cannot hold stops the
    /// table, named) or `text` (as MySQL prints them: every value exact) ([`types::Temporal`]).
    pub temporal: types::Temporal,
    /// Per source table (`database.table`) overrides of `temporal`.
    pub temporal_tables: BTreeMap<String, types::Temporal>,
    /// What a value a target column cannot hold (a zero, partial or invalid date, a date
    /// outside the type's range on this server) does: `stop` (the default: its table stops,
    /// the row, column and value named) or `mark` (the row is written with NULL in that
    /// column, or the type's zero where the column is not Nullable, and the column named in
    /// the row's `unheld_column`) ([`OnUnheld`]). Key columns are exact or refused, always.
    pub unheld: OnUnheld,
    /// Per source table (`database.table`) overrides of `unheld`.
    pub unheld_tables: BTreeMap<String, OnUnheld>,
    /// The column of a target with `unheld = "mark"` that names, per row, the columns whose
    /// source value it does not hold (`Array(String)`, empty for a row held exactly). Added to
    /// the tables the stage creates, and to an existing target when its table is marked.
    /// Default `_sluice_unheld`.
    pub unheld_column: String,
    /// Per source table (`database.table`): the `PARTITION BY` expression of the target table
    /// this stage creates. Default: none (one partition).
    pub partition_by: BTreeMap<String, String>,
    /// Per source table (`database.table`): the `ORDER BY` of the mirror this stage creates,
    /// in place of the primary key; it must name every primary key column (rows replace each
    /// other by it). A change log's sort key is this, then the version and the operation.
    /// Default: the primary key.
    pub order_by: BTreeMap<String, String>,
}

/// `tables.truncate`: what a source `TRUNCATE TABLE` does to the target.
#[derive(Debug, Clone, Copy, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum OnTruncate {
    /// The mirror equals the source: every row older than the statement is deleted (a
    /// mutation, `DELETE WHERE version < the TRUNCATE's`), so that no copy of the statement
    /// from another partition and no replay brings one back. A change-log table gets one row
    /// with op `truncate` at that version instead (the log keeps its history).
    Apply,
    /// The target keeps its rows (said in the log); the mirror then holds rows the source has
    /// not.
    Keep,
    /// The table stops, the statement named.
    Stop,
}

/// `tables.unheld`: what a value that a target column cannot hold does.
#[derive(Debug, Clone, Copy, Deserialize, Serialize, PartialEq, Eq, Default)]
#[serde(rename_all = "lowercase")]
pub enum OnUnheld {
    /// The row is refused (dead-lettered, named) and its table stops: the mirror is exact or
    /// visibly stopped.
    #[default]
    Stop,
    /// The row is written; the column gets NULL (the type's zero where it is not Nullable) and
    /// is named in the row's `tables.unheld_column`.
    Mark,
}

/// `tables.drop`: what a source `DROP TABLE` does to the target.
#[derive(Debug, Clone, Copy, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum OnDrop {
    /// The target keeps its rows, as the last state of the dropped table (said in the log). A
    /// table created again under that name writes into the same target.
    Keep,
    /// As `truncate = "apply"`: rows older than the DROP are deleted, the (empty) target stays.
    Delete,
    /// The table stops, the statement named.
    Stop,
}

impl Default for TablesConfig {
    fn default() -> Self {
        Self {
            name: "{table}".into(),
            mode: Mode::Mirror,
            modes: BTreeMap::new(),
            create: true,
            version_column: "_version".into(),
            deleted_column: "_deleted".into(),
            op_column: "_op".into(),
            row_column: "_row".into(),
            stopped_table: "_sluice_stopped".into(),
            ddl_table: "_sluice_ddl".into(),
            truncate: OnTruncate::Apply,
            truncate_tables: BTreeMap::new(),
            drop: OnDrop::Keep,
            drop_tables: BTreeMap::new(),
            temporal: types::Temporal::Native,
            temporal_tables: BTreeMap::new(),
            unheld: OnUnheld::Stop,
            unheld_tables: BTreeMap::new(),
            unheld_column: "_sluice_unheld".into(),
            partition_by: BTreeMap::new(),
            order_by: BTreeMap::new(),
        }
    }
}

impl TablesConfig {
    /// A column of the stage's own in a target (version, deleted flag, operation, row, the
    /// columns not held).
    pub fn is_bookkeeping(&self, column: &str) -> bool {
        [
            &self.version_column,
            &self.deleted_column,
            &self.op_column,
            &self.row_column,
            &self.unheld_column,
        ]
        .iter()
        .any(|c| c.as_str() == column)
    }

    pub fn mode_of(&self, source: &str) -> Mode {
        self.modes.get(source).copied().unwrap_or(self.mode)
    }

    pub fn truncate_of(&self, source: &str) -> OnTruncate {
        self.truncate_tables
            .get(source)
            .copied()
            .unwrap_or(self.truncate)
    }

    pub fn drop_of(&self, source: &str) -> OnDrop {
        self.drop_tables.get(source).copied().unwrap_or(self.drop)
    }

    pub fn unheld_of(&self, source: &str) -> OnUnheld {
        self.unheld_tables
            .get(source)
            .copied()
            .unwrap_or(self.unheld)
    }

    pub fn temporal_of(&self, source: &str) -> types::Temporal {
        self.temporal_tables
            .get(source)
            .copied()
            .unwrap_or(self.temporal)
    }
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
    /// The HTTP interface, `http://host:8123`, or `https://host:8443` over TLS (the server's
    /// certificate is checked against `ssl_ca`, or the public roots without it, and must name
    /// the host). Default `http://127.0.0.1:8123`.
    pub url: String,
    /// Default `default`.
    pub user: String,
    /// `password_file` reads it from a file. Default empty.
    pub password: Secret,
    /// The CA certificate(s) (PEM) an https server's certificate is checked against, instead
    /// of the public roots. Default empty.
    pub ssl_ca: String,
    /// A client certificate (PEM, with its chain) for servers that ask for one; with
    /// `ssl_key`. Default empty.
    pub ssl_cert: String,
    /// The client certificate's private key (PEM). Default empty.
    pub ssl_key: String,
    /// The database target tables live in. Default `default`.
    pub database: String,
    /// How INSERT bodies travel: `lz4` (ClickHouse's native block compression) or `none`
    /// (saves the CPU where the server is on the same host). Default `lz4`.
    pub compression: Compression,
}

/// `clickhouse.compression`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Compression {
    Lz4,
    None,
}

impl Default for ClickhouseConfig {
    fn default() -> Self {
        Self {
            url: "http://127.0.0.1:8123".into(),
            user: "default".into(),
            password: Secret::default(),
            ssl_ca: String::new(),
            ssl_cert: String::new(),
            ssl_key: String::new(),
            database: "default".into(),
            compression: Compression::Lz4,
        }
    }
}

impl ClickhouseConfig {
    /// A client for this server. Row validation against `DESCRIBE` is off: ClickHouse before
    /// 22.x knows neither the setting nor the format it needs.
    pub fn client(&self) -> Result<clickhouse::Client, String> {
        let http =
            hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
                .pool_idle_timeout(std::time::Duration::from_secs(2))
                .build(self.connector()?);
        Ok(clickhouse::Client::with_http_client(http)
            .with_url(&self.url)
            .with_user(&self.user)
            .with_password(self.password.expose())
            .with_database(&self.database)
            .with_validation(false)
            .with_compression(match self.compression {
                Compression::Lz4 => clickhouse::Compression::Lz4,
                Compression::None => clickhouse::Compression::None,
            }))
    }

    /// The connector: plain HTTP, or HTTPS with rustls (the CA and client certificate of
    /// this section, or the public roots); TCP keepalive and the idle timeout as the
    /// clickhouse crate's own client has them.
    fn connector(
        &self,
    ) -> Result<
        hyper_rustls::HttpsConnector<hyper_util::client::legacy::connect::HttpConnector>,
        String,
    > {
        use rustls::pki_types::pem::PemObject;
        use rustls::pki_types::{CertificateDer, PrivateKeyDer};
        let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
        let mut roots = rustls::RootCertStore::empty();
        if self.ssl_ca.is_empty() {
            roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
        } else {
            let certs = CertificateDer::pem_file_iter(&self.ssl_ca)
                .and_then(|i| i.collect::<Result<Vec<_>, _>>())
                .map_err(|e| format!("clickhouse.ssl_ca {}: {e}", self.ssl_ca))?;
            let (added, _) = roots.add_parsable_certificates(certs);
            if added == 0 {
                return Err(format!(
                    "clickhouse.ssl_ca {}: no certificate in it",
                    self.ssl_ca
                ));
            }
        }
        let builder = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| e.to_string())?
            .with_root_certificates(roots);
        let tls = if self.ssl_cert.is_empty() {
            builder.with_no_client_auth()
        } else {
            let chain = CertificateDer::pem_file_iter(&self.ssl_cert)
                .and_then(|i| i.collect::<Result<Vec<_>, _>>())
                .map_err(|e| format!("clickhouse.ssl_cert {}: {e}", self.ssl_cert))?;
            let key = PrivateKeyDer::from_pem_file(&self.ssl_key)
                .map_err(|e| format!("clickhouse.ssl_key {}: {e}", self.ssl_key))?;
            builder
                .with_client_auth_cert(chain, key)
                .map_err(|e| format!("clickhouse.ssl_cert/ssl_key: {e}"))?
        };
        let mut http = hyper_util::client::legacy::connect::HttpConnector::new();
        http.set_keepalive(Some(std::time::Duration::from_secs(60)));
        // (a host that drops the SYN: said, not waited on for the kernel's minutes)
        http.set_connect_timeout(Some(std::time::Duration::from_secs(10)));
        http.enforce_http(false);
        Ok(hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(tls)
            .https_or_http()
            .enable_http1()
            .wrap_connector(http))
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
        for (key, path) in [
            ("clickhouse.ssl_ca", &self.clickhouse.ssl_ca),
            ("clickhouse.ssl_cert", &self.clickhouse.ssl_cert),
            ("clickhouse.ssl_key", &self.clickhouse.ssl_key),
        ] {
            if !path.is_empty() && !std::path::Path::new(path).is_file() {
                return Err((key.into(), format!("no such file: {path}")));
            }
        }
        if self.clickhouse.ssl_cert.is_empty() != self.clickhouse.ssl_key.is_empty() {
            return Err((
                "clickhouse.ssl_key".into(),
                "a client certificate needs both ssl_cert and ssl_key".into(),
            ));
        }
        self.clickhouse
            .connector()
            .map_err(|e| ("clickhouse".to_string(), e))?;
        if self.clickhouse.database.is_empty() {
            return Err(("clickhouse.database".into(), "must not be empty".into()));
        }
        if self.batch.max_rows == 0 || self.batch.max_bytes == 0 || self.batch.max_wait_ms == 0 {
            return Err((
                "batch".into(),
                "max_rows, max_bytes and max_wait_ms must be above 0".into(),
            ));
        }
        if !self.tables.name.contains("{table}") {
            return Err((
                "tables.name".into(),
                "must contain {table} (else every table writes into one)".into(),
            ));
        }
        for (section, keys) in [
            ("modes", self.tables.modes.keys().collect::<Vec<_>>()),
            ("partition_by", self.tables.partition_by.keys().collect()),
            ("order_by", self.tables.order_by.keys().collect()),
        ] {
            for k in keys {
                if k.split('.').count() != 2 {
                    return Err((
                        format!("tables.{section}.{k}"),
                        "expected database.table".into(),
                    ));
                }
            }
        }
        for (k, v) in self.tables.partition_by.iter().chain(&self.tables.order_by) {
            if v.trim().is_empty() {
                return Err((format!("tables.*_by.{k}"), "an empty expression".into()));
            }
        }
        self.cluster.validate()?;
        self.kafka.validate()?;
        self.consumer.validate()?;
        self.log.validate()
    }
}

sluice_common::app_config!(Config);

/// A ClickHouse client error with its causes (a TLS refusal is buried in the chain of a
/// network error) and, where it is known, what to change.
pub fn explain(e: &clickhouse::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        let m = s.to_string();
        if !text.contains(&m) {
            text = format!("{text}: {m}");
        }
        source = s.source();
    }
    let lower = text.to_ascii_lowercase();
    let hint = if lower.contains("unknownissuer") || lower.contains("unknown issuer") {
        " (the server's certificate is not signed by a CA trusted here: set clickhouse.ssl_ca \
         to the CA that signed it)"
    } else if lower.contains("notvalidforname") || lower.contains("not valid for name") {
        " (the server's certificate does not name the host of clickhouse.url: connect by a \
         name it holds)"
    } else if lower.contains("authentication failed")
        || lower.contains("wrong password")
        || lower.contains("code: 516")
        || lower.contains("code: 192")
        || lower.contains("code: 193")
    {
        " (a wrong user or password: clickhouse.user, clickhouse.password)"
    } else {
        ""
    };
    format!("{text}{hint}")
}

pub async fn preflight(config: &Config) -> Vec<Check> {
    let mut checks = vec![config.kafka.check("apply-clickhouse").await];
    checks.push(config.consumer.topics_check(&config.kafka).await);
    let client = match config.clickhouse.client() {
        Ok(c) => c,
        Err(e) => {
            checks.push(Check::fail("clickhouse", e));
            return checks;
        }
    };
    // A port that accepts connections and never answers HTTP: said within the limit.
    let limit = std::time::Duration::from_secs(15);
    let version = match tokio::time::timeout(
        limit,
        client.query("SELECT version()").fetch_one::<String>(),
    )
    .await
    {
        Ok(r) => r,
        Err(_) => {
            checks.push(Check::fail(
                "clickhouse",
                format!(
                    "no answer from {} within {} s (is it ClickHouse's HTTP interface?)",
                    sluice_common::secret::redact_uri(&config.clickhouse.url),
                    limit.as_secs()
                ),
            ));
            return checks;
        }
    };
    match version {
        Ok(v) => {
            checks.push(Check::pass(
                "clickhouse",
                format!(
                    "ClickHouse {v} at {} as {}",
                    sluice_common::secret::redact_uri(&config.clickhouse.url),
                    config.clickhouse.user
                ),
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
        Err(e) => {
            let what = format!(
                "cannot query {}: {}",
                sluice_common::secret::redact_uri(&config.clickhouse.url),
                sluice_common::secret::scrub(
                    &crate::clickhouse::explain(&e),
                    &[config.clickhouse.password.expose()]
                )
            );
            let group = &config.consumer.group_id;
            // Only a server that does not answer is waited for; one that answers with an
            // error (a wrong user or password) is a configuration to fix.
            let unreachable = matches!(
                e,
                clickhouse::error::Error::Network(_) | clickhouse::error::Error::TimedOut
            );
            checks.push(
                if unreachable
                    && crate::group::group_has_run(&config.kafka, "apply-clickhouse", group).await
                {
                    Check::wait(
                        "clickhouse",
                        format!("{what} (consumer group {group:?} has run before: waiting for it)"),
                    )
                } else if unreachable {
                    Check::fail(
                        "clickhouse",
                        format!("{what} (a first start of consumer group {group:?}: check clickhouse.url)"),
                    )
                } else {
                    Check::fail(
                        "clickhouse",
                        format!(
                            "{what} (the server answered with an error: check clickhouse.user, \
                             clickhouse.password and the user's grants)"
                        ),
                    )
                },
            );
        }
    }
    checks
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compression_is_lz4_or_none() {
        let parse = |v: &str| toml::from_str::<ClickhouseConfig>(&format!("compression = {v:?}"));
        assert_eq!(
            ClickhouseConfig::default().compression,
            Compression::Lz4,
            "the default"
        );
        assert_eq!(parse("none").unwrap().compression, Compression::None);
        assert_eq!(parse("lz4").unwrap().compression, Compression::Lz4);
        let err = parse("zstd").unwrap_err().to_string();
        assert!(err.contains("zstd") && err.contains("lz4"), "{err}");
    }
}
