//! apply-mongo: configuration and preflight checks against the target deployment.

pub mod sink;
pub mod write;

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use sluice_common::mongo::{check_uri, describe_server};
use sluice_common::secret::Uri;
use sluice_common::{Check, KafkaConfig, LogConfig, MetricsConfig, Validate};

use crate::consumer::{ConsumerConfig, ErrorsConfig};

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
    #[serde(default)]
    pub batch: BatchConfig,
    #[serde(default)]
    pub ddl: DdlConfig,
    /// Source namespace -> target namespace: `"shop.orders" = "archive.orders"` renames one
    /// collection, `"shop" = "archive"` a whole database. Unnamed namespaces keep their names.
    #[serde(default)]
    pub namespaces: BTreeMap<String, String>,
    /// Apply only events whose source commit is at least this many seconds old (a delayed
    /// replica, to undo mistakes from). Default 0.
    #[serde(default)]
    pub delay_seconds: u64,
    #[serde(default)]
    pub errors: ErrorsConfig,
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
    /// A password in it is percent-encoded (`@` is `%40`, `#` is `%23`, `:` is `%3A`);
    /// `uri_file` reads the whole string from a file. Shown with its password as `***`.
    pub uri: Uri,
    /// Write concern `w`: `majority`, a number of members (at least 1), or a tag set name.
    /// Default `majority`.
    pub write_concern: String,
    /// Wait for the journal (`j`). Default true.
    pub journal: bool,
    /// `wtimeout` in milliseconds; 0 waits as long as it takes. Default 0.
    pub wtimeout_ms: u64,
    /// Where apply keeps its own records (versions of applied drops and renames, so a replay
    /// never applies an older write after them). Default `_sluice`.
    pub meta_database: String,
    /// Write with `bypassDocumentValidation`, so that a validator on the target (copied from
    /// the source by `create` or `collMod`, or the target's own) never refuses a document the
    /// source took. The user needs the `bypassDocumentValidation` action (roles `dbAdmin` or
    /// `restore`). Off: a document the target's validator refuses is dead-lettered, named.
    /// Default true.
    pub bypass_validation: bool,
}

impl Default for MongoTargetConfig {
    fn default() -> Self {
        Self {
            uri: Uri::new("mongodb://127.0.0.1:27017"),
            write_concern: "majority".into(),
            journal: true,
            wtimeout_ms: 0,
            meta_database: "_sluice".into(),
            bypass_validation: true,
        }
    }
}

/// `[batch]`: when a batch closes. Whichever comes first.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct BatchConfig {
    /// Events (all collections together). Default 5000.
    pub max_events: usize,
    /// BSON bytes of the writes. Default 16777216 (16 MiB).
    pub max_bytes: usize,
    /// The longest an event waits in the batch, in milliseconds: a batch is written once it
    /// holds an event and this long has passed since the previous write began (at once after a
    /// quiet spell; one write per `max_wait_ms` under a steady stream). Default 500.
    pub max_wait_ms: u64,
}

impl Default for BatchConfig {
    fn default() -> Self {
        Self {
            max_events: 5_000,
            max_bytes: 16 << 20,
            max_wait_ms: 500,
        }
    }
}

/// The commands `[ddl] apply` may name.
pub const DDL_KINDS: [&str; 7] = [
    "create",
    "drop",
    "createIndexes",
    "dropIndexes",
    "collMod",
    "renameCollection",
    "dropDatabase",
];

/// `[ddl]`: which source commands are repeated on the target.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct DdlConfig {
    /// Any of `create`, `drop`, `createIndexes`, `dropIndexes`, `collMod`,
    /// `renameCollection`, `dropDatabase`, or `*` for all of them. Default `["*"]`.
    pub apply: Vec<String>,
    /// What the target's copy of a TTL index (or of a collection's `expireAfterSeconds`)
    /// does. Default `without_expiry`.
    pub ttl: TtlPolicy,
}

/// `ddl.ttl`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum TtlPolicy {
    /// The index is made on the same keys without `expireAfterSeconds`: the target never
    /// deletes a document by its own clock. The source's TTL deletions arrive as deletes, so
    /// the target stays equal to the source, and a document whose newer version is still on
    /// its way (the apply behind) is never deleted under it.
    #[default]
    WithoutExpiry,
    /// The target expires documents itself, as the source does (a target that is not a
    /// replica: it may delete a document before the change that would have kept it arrives).
    AsSource,
}

impl Default for DdlConfig {
    fn default() -> Self {
        Self {
            apply: vec!["*".into()],
            ttl: TtlPolicy::WithoutExpiry,
        }
    }
}

impl DdlConfig {
    /// Whether a command of the contract's `kind` is applied.
    pub fn applies(&self, kind: &str) -> bool {
        let name = match kind {
            "create" => "create",
            "drop" => "drop",
            "create_indexes" => "createIndexes",
            "drop_indexes" => "dropIndexes",
            "modify" => "collMod",
            "rename" => "renameCollection",
            "drop_database" => "dropDatabase",
            _ => return false,
        };
        self.apply.iter().any(|a| a == "*" || a == name)
    }
}

impl Validate for Config {
    fn validate(&self) -> Result<(), (String, String)> {
        check_uri("mongodb.uri", self.mongodb.uri.expose())?;
        let w = self.mongodb.write_concern.trim();
        if w.is_empty() || w == "0" {
            return Err((
                "mongodb.write_concern".into(),
                "must be majority, a number of at least 1, or a tag set: with w=0 no write \
                 could be confirmed before its offset is committed"
                    .into(),
            ));
        }
        if self.mongodb.meta_database.is_empty() {
            return Err(("mongodb.meta_database".into(), "must not be empty".into()));
        }
        if let Some(bad) = self
            .ddl
            .apply
            .iter()
            .find(|a| *a != "*" && !DDL_KINDS.contains(&a.as_str()))
        {
            return Err((
                "ddl.apply".into(),
                format!(
                    "unknown command {bad:?}; known: *, {}",
                    DDL_KINDS.join(", ")
                ),
            ));
        }
        for (from, to) in &self.namespaces {
            if from.contains('.') != to.contains('.') || from.is_empty() || to.is_empty() {
                return Err((
                    format!("namespaces.{from:?}"),
                    format!(
                        "{from:?} = {to:?}: map a database to a database or a collection \
                         (db.coll) to a collection"
                    ),
                ));
            }
        }
        if self.batch.max_events == 0 {
            return Err(("batch.max_events".into(), "must be at least 1".into()));
        }
        self.kafka.validate()?;
        self.consumer.validate()?;
        self.log.validate()
    }
}

impl Config {
    /// The target namespace of a source one.
    pub fn target(&self, db: &str, coll: &str) -> (String, String) {
        if let Some(t) = self.namespaces.get(&format!("{db}.{coll}")) {
            if let Some((d, c)) = t.split_once('.') {
                return (d.to_string(), c.to_string());
            }
        }
        match self.namespaces.get(db) {
            Some(d) => (d.clone(), coll.to_string()),
            None => (db.to_string(), coll.to_string()),
        }
    }
}

sluice_common::app_config!(Config);

pub async fn preflight(config: &Config) -> Vec<Check> {
    let mut checks = vec![config.kafka.check("apply-mongo").await];
    checks.push(config.consumer.topics_check(&config.kafka).await);
    let group = &config.consumer.group_id;
    checks.push(match describe_server(config.mongodb.uri.expose()).await {
        Ok((d, _)) => Check::pass("mongodb", d),
        // Only a server that does not answer is waited for; a refused login is a
        // configuration to fix.
        Err(e)
            if e.starts_with("cannot reach")
                && !e.contains("uthentication")
                && crate::group::group_has_run(&config.kafka, "apply-mongo", group).await =>
        {
            Check::wait(
                "mongodb",
                format!("{e} (consumer group {group:?} has run before: waiting for it)"),
            )
        }
        Err(e) if e.contains("uthentication") => Check::fail(
            "mongodb",
            format!("{e} (check the user and password in mongodb.uri, and authSource)"),
        ),
        Err(e) => Check::fail(
            "mongodb",
            format!("{e} (a first start of consumer group {group:?}: check mongodb.uri)"),
        ),
    });
    checks
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn namespace_map_and_ddl_filter() {
        let mut c: Config = toml::from_str(
            r#"
            [namespaces]
            "shop.orders" = "archive.old_orders"
            "shop" = "shop_copy"
            [ddl]
            apply = ["drop", "createIndexes"]
            "#,
        )
        .unwrap();
        assert_eq!(
            c.target("shop", "orders"),
            ("archive".into(), "old_orders".into())
        );
        assert_eq!(
            c.target("shop", "items"),
            ("shop_copy".into(), "items".into())
        );
        assert_eq!(c.target("other", "x"), ("other".into(), "x".into()));
        assert!(c.ddl.applies("drop") && c.ddl.applies("create_indexes"));
        assert!(!c.ddl.applies("drop_database") && !c.ddl.applies("other"));
        assert!(c.validate().is_ok());
        c.ddl.apply = vec!["truncate".into()];
        assert_eq!(c.validate().unwrap_err().0, "ddl.apply");
        c.ddl.apply = vec!["*".into()];
        assert!(c.ddl.applies("rename") && !c.ddl.applies("other"));
        c.mongodb.write_concern = "0".into();
        assert_eq!(c.validate().unwrap_err().0, "mongodb.write_concern");
        c.mongodb.write_concern = "majority".into();
        c.namespaces.insert("a.b".into(), "c".into());
        assert!(c.validate().unwrap_err().0.starts_with("namespaces"));
    }
}
