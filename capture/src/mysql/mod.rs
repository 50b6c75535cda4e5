//! capture-mysql: configuration and preflight checks against the source server.

pub mod charset;
pub mod ddl;
pub mod decode;
pub mod gtid;
pub mod position;
pub mod schema;
pub mod snapshot;
pub mod stream;

use mysql_async::prelude::Queryable;
use serde::{Deserialize, Serialize};
use sluice_common::{Check, KafkaConfig, LogConfig, MetricsConfig, TopicsConfig, Validate};

use crate::filter::FilterConfig;
use crate::publish::PublishConfig;

/// The whole configuration of `capture-mysql`.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// The name of this capture, written into every event and used as its checkpoint key.
    /// Default `mysql`.
    #[serde(default = "default_connector")]
    pub connector: String,
    #[serde(default)]
    pub mysql: MysqlConfig,
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
    #[serde(default = "default_metrics")]
    pub metrics: MetricsConfig,
    #[serde(default)]
    pub log: LogConfig,
}

fn default_connector() -> String {
    "mysql".into()
}

fn default_metrics() -> MetricsConfig {
    MetricsConfig {
        listen: "0.0.0.0:9101".parse().expect("valid address"),
    }
}

/// `[mysql]`: the source server.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct MysqlConfig {
    /// `mysql://user:password@host:port`. The user needs REPLICATION SLAVE, REPLICATION CLIENT
    /// and SELECT. Default `mysql://root@127.0.0.1:3306`.
    pub url: String,
    /// The server_id this capture presents as a replica; must differ from the source's and
    /// every other replica's. Default 5400.
    pub server_id: u32,
    /// Where to begin when there is no checkpoint yet: `end` (changes from now on),
    /// `earliest` (the oldest binlog the server has), `FILE:POS`, `gtid:SET` or
    /// `time:SECONDS|YYYY-MM-DDTHH:MM:SSZ`. Ignored once a checkpoint exists. Default `end`.
    pub start: String,
    /// The heartbeat period asked of the server, in milliseconds; three missed heartbeats
    /// mean a dead connection, which is re-opened. Default 5000.
    pub heartbeat_ms: u64,
    /// Accept a server that has no `binlog_row_metadata` at all (MySQL 5.7, MariaDB 10.4 and
    /// older), whose binlog does not say which columns its rows were written with: a capture
    /// behind a rename, a reorder of columns of one type, a change of signedness, charset or
    /// ENUM members would decode those rows with today's columns. Refused unless set. Default
    /// false.
    pub accept_rows_without_metadata: bool,
    /// The binlog generation: the top 8 bits of every version this capture publishes
    /// (`sluice_proto::mysql_version_in`). Raise it by one when starting a new connector on a
    /// binlog history that began again (RESET MASTER, a restored server, a fail-over to a
    /// server with its own file numbers), so that its versions stay above every version
    /// published before; the capture's error messages say when, and to what. A checkpoint's
    /// generation wins over a lower one here. Default 0.
    pub generation: u8,
}

impl Default for MysqlConfig {
    fn default() -> Self {
        Self {
            url: "mysql://root@127.0.0.1:3306".into(),
            server_id: 5400,
            start: "end".into(),
            heartbeat_ms: 5000,
            accept_rows_without_metadata: false,
            generation: 0,
        }
    }
}

impl Validate for Config {
    fn validate(&self) -> Result<(), (String, String)> {
        if self.connector.is_empty() {
            return Err(("connector".into(), "must not be empty".into()));
        }
        mysql_async::Opts::from_url(&self.mysql.url)
            .map_err(|e| ("mysql.url".to_string(), format!("not a mysql:// URL: {e}")))?;
        if self.mysql.server_id == 0 {
            return Err((
                "mysql.server_id".into(),
                "must be above 0 (0 is refused by the server for replicas)".into(),
            ));
        }
        position::Start::parse(&self.mysql.start).map_err(|e| ("mysql.start".to_string(), e))?;
        if !(100..=600_000).contains(&self.mysql.heartbeat_ms) {
            return Err((
                "mysql.heartbeat_ms".into(),
                "must be between 100 and 600000".into(),
            ));
        }
        crate::filter::Filter::new(&self.filter, stream::SYSTEM_DATABASES)?;
        self.kafka.validate()?;
        self.topics.validate()?;
        self.publish.validate()?;
        self.snapshot.validate()?;
        self.log.validate()
    }
}

sluice_common::app_config!(Config);

/// The statement that shows the server's current binlog file and position (columns `File`,
/// `Position`, ...), by its `@@version`: MySQL 8.2+ has `SHOW BINARY LOG STATUS` (8.4 removed
/// `SHOW MASTER STATUS`); MySQL before 8.2 and every MariaDB (10.5.2+ also knows `SHOW BINLOG
/// STATUS`, 11.x still `SHOW MASTER STATUS`) take `SHOW MASTER STATUS`.
pub fn binlog_status_sql(version: &str) -> &'static str {
    if version.to_ascii_lowercase().contains("mariadb") {
        return "SHOW MASTER STATUS";
    }
    let mut parts = version
        .split(|c: char| !c.is_ascii_digit())
        .map(|p| p.parse::<u32>().unwrap_or(0));
    let (major, minor) = (parts.next().unwrap_or(0), parts.next().unwrap_or(0));
    if (major, minor) >= (8, 2) {
        "SHOW BINARY LOG STATUS"
    } else {
        "SHOW MASTER STATUS"
    }
}

/// The binlog settings checks, from `SHOW GLOBAL VARIABLES` rows.
pub fn binlog_checks(vars: &[(String, String)], accept_without_metadata: bool) -> Vec<Check> {
    let mut checks = Vec::new();
    for (name, want) in [
        ("log_bin", "ON"),
        ("binlog_format", "ROW"),
        ("binlog_row_image", "FULL"),
    ] {
        let value = vars
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.clone())
            .unwrap_or_default();
        if value.eq_ignore_ascii_case(want) {
            checks.push(Check::pass(name, format!("{name} = {want}")));
        } else {
            checks.push(Check::fail(
                name,
                format!(
                    "{name} is {value:?}, must be {want}: set `{name}={want}` in the \
                     server's configuration and restart it"
                ),
            ));
        }
    }
    let var = |name: &str| {
        vars.iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.to_ascii_uppercase())
    };
    match var("binlog_row_metadata") {
        Some(v) if v == "FULL" => checks.push(Check::pass(
            "binlog_row_metadata",
            "binlog_row_metadata = FULL: rows decode with the columns of their own time",
        )),
        Some(v) => checks.push(Check::fail(
            "binlog_row_metadata",
            format!(
                "binlog_row_metadata is {v}, must be FULL: without it the binlog does not say \
                 which columns its rows were written with, and a capture behind a schema change \
                 (a column renamed, reordered, made UNSIGNED, an ENUM member inserted) would \
                 decode them with today's. Run SET GLOBAL binlog_row_metadata = 'FULL' (and set \
                 it in the server's configuration)"
            ),
        )),
        None if accept_without_metadata => checks.push(Check::warn(
            "binlog_row_metadata",
            "the server has no binlog_row_metadata (MySQL < 8.0, MariaDB < 10.5), accepted \
             (mysql.accept_rows_without_metadata): schemas come from information_schema when \
             the capture reads a table's DDL. Keep the capture caught up when changing a table: \
             a capture behind a schema change stops when the rows' column count or storage \
             types disagree with the table's, but a rename, a reorder of columns of one type, a \
             change of signedness, charset or ENUM members cannot be seen \
             (docs/capture-mysql.md, Schemas)",
        )),
        None => checks.push(Check::fail(
            "binlog_row_metadata",
            "the server has no binlog_row_metadata (MySQL < 8.0, MariaDB < 10.5): its binlog \
             does not say which columns its rows were written with, and a capture behind a \
             rename, a reorder of columns of one type, a change of signedness, charset or ENUM \
             members would decode them with today's. Upgrade the server (MySQL 8.0, MariaDB \
             10.5, with binlog_row_metadata = FULL), or accept that risk with \
             mysql.accept_rows_without_metadata = true and keep the capture caught up when \
             changing tables",
        )),
    }
    // Compressed binlogs: MariaDB's compressed query and rows events, MySQL 8.0.20+'s
    // TRANSACTION_PAYLOAD (its inner events carry no position of their own). Neither is
    // decoded: refused here, and stopped at if a session turns it on.
    for (name, what) in [
        (
            "log_bin_compress",
            "MariaDB writes compressed query and rows events, which the capture does not \
             decode: set log_bin_compress=OFF",
        ),
        (
            "binlog_transaction_compression",
            "MySQL wraps each transaction in a compressed TRANSACTION_PAYLOAD event, which the \
             capture does not decode: set binlog_transaction_compression=OFF (globally and in \
             the configuration; a session that turns it on stops the capture at its first \
             transaction)",
        ),
    ] {
        match var(name) {
            Some(v) if v == "ON" || v == "1" => {
                checks.push(Check::fail(name, format!("{name} is ON: {what}")))
            }
            Some(_) => checks.push(Check::pass(name, format!("{name} = OFF"))),
            None => {}
        }
    }
    if let Some(v) = var("binlog_row_value_options") {
        if v.contains("PARTIAL_JSON") {
            checks.push(Check::fail(
                "binlog_row_value_options",
                "PARTIAL_JSON logs JSON updates as diffs, which the capture does not apply: \
                 set binlog_row_value_options=''",
            ));
        }
    }
    checks
}

/// What the binlog reader needs from the server, checked one by one.
pub async fn preflight(config: &Config) -> Vec<Check> {
    let mut checks = vec![config.kafka.check("capture-mysql").await];
    let opts = mysql_async::Opts::from_url(&config.mysql.url).expect("validated at load");
    let mut conn = match mysql_async::Conn::new(opts).await {
        Ok(c) => c,
        Err(e) => {
            checks.push(Check::fail("mysql", format!("cannot connect: {e}")));
            return checks;
        }
    };
    match server_checks(
        &mut conn,
        config.mysql.server_id,
        config.mysql.accept_rows_without_metadata,
    )
    .await
    {
        Ok(mut c) => checks.append(&mut c),
        Err(e) => checks.push(Check::fail("mysql", format!("query failed: {e}"))),
    }
    let _ = conn.disconnect().await;
    checks
}

async fn server_checks(
    conn: &mut mysql_async::Conn,
    own_server_id: u32,
    accept_without_metadata: bool,
) -> Result<Vec<Check>, mysql_async::Error> {
    let mut checks = Vec::new();
    let (version, server_id): (String, u32) = conn
        .query_first("SELECT @@version, @@server_id")
        .await?
        .unwrap_or_default();
    let mariadb = version.to_ascii_lowercase().contains("mariadb");
    checks.push(Check::pass(
        "mysql",
        format!(
            "{} {version}, server_id {server_id}",
            if mariadb { "MariaDB" } else { "MySQL" }
        ),
    ));
    if server_id == own_server_id {
        checks.push(Check::fail(
            "mysql.server_id",
            format!("{own_server_id} is the source's own server_id; pick another"),
        ));
    }
    let vars: Vec<(String, String)> = conn
        .query(
            "SHOW GLOBAL VARIABLES WHERE Variable_name IN \
             ('log_bin', 'binlog_format', 'binlog_row_image', 'binlog_row_metadata', \
             'binlog_row_value_options', 'log_bin_compress', 'binlog_transaction_compression')",
        )
        .await?;
    checks.extend(binlog_checks(&vars, accept_without_metadata));
    let grants: Vec<String> = conn.query("SHOW GRANTS FOR CURRENT_USER()").await?;
    let all = grants.join(" ").to_uppercase();
    let has_all = all.contains("ALL PRIVILEGES ON *.*");
    for privilege in ["REPLICATION SLAVE", "REPLICATION CLIENT", "SELECT"] {
        // MariaDB 10.5+ names REPLICATION CLIENT "BINLOG MONITOR"; both are accepted.
        let ok = has_all
            || all.contains(privilege)
            || (privilege == "REPLICATION CLIENT" && all.contains("BINLOG MONITOR"))
            || (privilege == "REPLICATION SLAVE" && all.contains("REPLICATION REPLICA"));
        if ok {
            checks.push(Check::pass("privileges", format!("{privilege} granted")));
        } else {
            checks.push(Check::fail(
                "privileges",
                format!("{privilege} missing: GRANT {privilege} ON *.* TO the capture user"),
            ));
        }
    }
    Ok(checks)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn failed(checks: &[Check]) -> Vec<String> {
        checks
            .iter()
            .filter_map(|c| match &c.outcome {
                sluice_common::preflight::Outcome::Fail(why) => Some(format!("{}: {why}", c.name)),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn a_good_server_passes() {
        let c = binlog_checks(
            &vars(&[
                ("log_bin", "ON"),
                ("binlog_format", "ROW"),
                ("binlog_row_image", "FULL"),
                ("binlog_row_metadata", "FULL"),
            ]),
            false,
        );
        assert!(failed(&c).is_empty(), "{c:?}");
    }

    #[test]
    fn binlog_off_and_statement_format_are_named() {
        let c = binlog_checks(
            &vars(&[
                ("log_bin", "OFF"),
                ("binlog_format", "STATEMENT"),
                ("binlog_row_image", "MINIMAL"),
                ("binlog_row_value_options", "PARTIAL_JSON"),
            ]),
            true,
        );
        let f = failed(&c);
        assert_eq!(f.len(), 4, "{f:?}");
        assert!(f[0].contains("log_bin is \"OFF\", must be ON"), "{f:?}");
        assert!(
            f[1].contains("binlog_format is \"STATEMENT\", must be ROW"),
            "{f:?}"
        );
        assert!(f[2].contains("binlog_row_image"), "{f:?}");
        assert!(f[3].contains("PARTIAL_JSON"), "{f:?}");
        // (accepted: a warning)
        assert!(c.iter().any(|c| c.name == "binlog_row_metadata"
            && matches!(c.outcome, sluice_common::preflight::Outcome::Warn(_))));
        let c = binlog_checks(&vars(&[("log_bin", "ON")]), false);
        // A server without the setting at all: refused, unless accepted.
        assert!(c.iter().any(|c| c.name == "binlog_row_metadata"
            && matches!(&c.outcome, sluice_common::preflight::Outcome::Fail(why)
                if why.contains("mysql.accept_rows_without_metadata = true"))));
    }

    #[test]
    fn the_binlog_position_is_asked_for_as_each_server_names_it() {
        for (version, sql) in [
            ("10.11.6-MariaDB-0+deb12u1-log", "SHOW MASTER STATUS"),
            ("11.4.2-MariaDB", "SHOW MASTER STATUS"),
            ("5.7.44-log", "SHOW MASTER STATUS"),
            ("8.0.36", "SHOW MASTER STATUS"),
            ("8.1.0", "SHOW MASTER STATUS"),
            ("8.2.0", "SHOW BINARY LOG STATUS"),
            ("8.4.3", "SHOW BINARY LOG STATUS"),
            ("9.1.0-commercial", "SHOW BINARY LOG STATUS"),
        ] {
            assert_eq!(binlog_status_sql(version), sql, "{version}");
        }
    }

    #[test]
    fn compressed_binlogs_are_refused() {
        let good = [
            ("log_bin", "ON"),
            ("binlog_format", "ROW"),
            ("binlog_row_image", "FULL"),
            ("binlog_row_metadata", "FULL"),
        ];
        let with = |extra: (&'static str, &'static str)| {
            let mut v = good.to_vec();
            v.push(extra);
            failed(&binlog_checks(&vars(&v), false))
        };
        assert!(with(("log_bin_compress", "OFF")).is_empty());
        assert!(with(("binlog_transaction_compression", "OFF")).is_empty());
        let f = with(("log_bin_compress", "ON"));
        assert!(
            f.len() == 1 && f[0].contains("set log_bin_compress=OFF"),
            "{f:?}"
        );
        let f = with(("binlog_transaction_compression", "ON"));
        assert!(
            f.len() == 1
                && f[0].contains("TRANSACTION_PAYLOAD")
                && f[0].contains("set binlog_transaction_compression=OFF"),
            "{f:?}"
        );
    }

    #[test]
    fn row_metadata_other_than_full_is_refused_where_the_server_has_it() {
        let c = binlog_checks(
            &vars(&[
                ("log_bin", "ON"),
                ("binlog_format", "ROW"),
                ("binlog_row_image", "FULL"),
                ("binlog_row_metadata", "MINIMAL"),
            ]),
            false,
        );
        let f = failed(&c);
        assert_eq!(f.len(), 1, "{f:?}");
        assert!(
            f[0].contains("binlog_row_metadata is MINIMAL, must be FULL")
                && f[0].contains("SET GLOBAL binlog_row_metadata = 'FULL'"),
            "{f:?}"
        );
    }
}
