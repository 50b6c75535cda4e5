//! capture-mysql: configuration and preflight checks against the source server.

pub mod charset;
pub mod connect;
pub mod ddl;
pub mod decode;
pub mod gtid;
pub mod position;
pub mod rebuild;
pub mod schema;
pub mod snapshot;
pub mod stream;

use mysql_async::prelude::Queryable;
use serde::{Deserialize, Serialize};
use sluice_common::secret::{Secret, Uri};
use sluice_common::{
    Check, KafkaConfig, LogConfig, MetricsConfig, StandbyConfig, TopicsConfig, Validate,
};

use crate::filter::FilterConfig;
use crate::publish::PublishConfig;
use position::BinlogPos;
use sluice_common::sql::mysql::ident;

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
    #[serde(default)]
    pub standby: StandbyConfig,
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
    /// and SELECT. A password in the URL is percent-encoded (`@` is `%40`, `#` is `%23`); or
    /// give it as `password` (or `password_file`), which needs no encoding. Default
    /// `mysql://root@127.0.0.1:3306`.
    pub url: Uri,
    /// The user, instead of the URL's. Default empty (the URL's).
    pub user: String,
    /// The password, instead of the URL's; `password_file` reads it from a file. Default empty
    /// (the URL's).
    pub password: Secret,
    /// TLS: `verify_identity` (the server's certificate is checked against `ssl_ca`, or the
    /// public roots without it, and must name the host of the URL), `required` (encrypted, the
    /// certificate not checked: a man in the middle goes unnoticed), or `disabled` (no TLS:
    /// the password and every row cross the network in clear). There is no `preferred`: a
    /// silent fall-back to clear text is what an attacker asks for; and no `verify_ca`: the
    /// driver cannot check the chain without the name (docs/operations.md, Security). Default
    /// `verify_identity`.
    pub ssl_mode: SslMode,
    /// The CA certificate(s) (PEM) the server's certificate is checked against, instead of the
    /// public roots. Default empty.
    pub ssl_ca: String,
    /// A client certificate (PEM, with its chain), for servers that require one
    /// (`REQUIRE X509`); with `ssl_key`. Default empty.
    pub ssl_cert: String,
    /// The client certificate's private key (PEM). Default empty.
    pub ssl_key: String,
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
    /// A capture that has read nothing for this long while the server's binlog is past it, or
    /// has had nothing acknowledged by Kafka for this long with records in flight, is stalled:
    /// `/healthz` says so (503, with both positions) until it moves again. In milliseconds.
    /// Default 60000.
    pub stalled_after_ms: u64,
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

/// `mysql.ssl_mode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum SslMode {
    Disabled,
    Required,
    VerifyIdentity,
}

impl Default for MysqlConfig {
    fn default() -> Self {
        Self {
            url: Uri::new("mysql://root@127.0.0.1:3306"),
            user: String::new(),
            password: Secret::default(),
            ssl_mode: SslMode::VerifyIdentity,
            ssl_ca: String::new(),
            ssl_cert: String::new(),
            ssl_key: String::new(),
            server_id: 5400,
            start: "end".into(),
            heartbeat_ms: 5000,
            stalled_after_ms: 60_000,
            accept_rows_without_metadata: false,
            generation: 0,
        }
    }
}

impl MysqlConfig {
    /// The connection options: the URL's, with `user`, `password` and the TLS settings.
    pub fn opts(&self) -> Result<mysql_async::Opts, String> {
        let url = mysql_async::Opts::from_url(self.url.expose())
            .map_err(|e| format!("not a mysql:// URL ({}): {e}", self.url))?;
        let mut b = mysql_async::OptsBuilder::from_opts(url);
        if !self.user.is_empty() {
            b = b.user(Some(&self.user));
        }
        if !self.password.is_empty() {
            b = b.pass(Some(self.password.expose()));
        }
        let ssl = match self.ssl_mode {
            SslMode::Disabled => None,
            mode => {
                let mut ssl = mysql_async::SslOpts::default();
                if !self.ssl_ca.is_empty() {
                    ssl = ssl
                        .with_root_certs(vec![std::path::PathBuf::from(&self.ssl_ca).into()])
                        .with_disable_built_in_roots(true);
                }
                if !self.ssl_cert.is_empty() {
                    ssl = ssl.with_client_identity(Some(mysql_async::ClientIdentity::new(
                        std::path::PathBuf::from(&self.ssl_cert).into(),
                        std::path::PathBuf::from(&self.ssl_key).into(),
                    )));
                }
                match mode {
                    SslMode::Required => ssl
                        .with_danger_accept_invalid_certs(true)
                        .with_danger_skip_domain_validation(true),
                    _ => ssl,
                }
                .into()
            }
        };
        Ok(b.ssl_opts(ssl).into())
    }

    /// Where the server is, for messages: the URL without its password, and the TLS mode.
    pub fn describe(&self) -> String {
        let user = if self.user.is_empty() {
            String::new()
        } else {
            format!(" as {}", self.user)
        };
        let mode = match self.ssl_mode {
            SslMode::Disabled => "disabled",
            SslMode::Required => "required",
            SslMode::VerifyIdentity => "verify_identity",
        };
        format!("{}{user} (ssl_mode {mode})", self.url)
    }
}

impl Validate for Config {
    fn validate(&self) -> Result<(), (String, String)> {
        if self.connector.is_empty() {
            return Err(("connector".into(), "must not be empty".into()));
        }
        self.mysql
            .opts()
            .map_err(|e| ("mysql.url".to_string(), e))?;
        for (key, path) in [
            ("mysql.ssl_ca", &self.mysql.ssl_ca),
            ("mysql.ssl_cert", &self.mysql.ssl_cert),
            ("mysql.ssl_key", &self.mysql.ssl_key),
        ] {
            if !path.is_empty() && !std::path::Path::new(path).is_file() {
                return Err((key.into(), format!("no such file: {path}")));
            }
        }
        if self.mysql.ssl_cert.is_empty() != self.mysql.ssl_key.is_empty() {
            return Err((
                "mysql.ssl_key".into(),
                "a client certificate needs both ssl_cert and ssl_key".into(),
            ));
        }
        if self.mysql.ssl_mode == SslMode::Disabled
            && !(self.mysql.ssl_ca.is_empty() && self.mysql.ssl_cert.is_empty())
        {
            return Err((
                "mysql.ssl_mode".into(),
                "is disabled, yet ssl_ca or ssl_cert is set: say verify_identity".into(),
            ));
        }
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
        if !(1_000..=86_400_000).contains(&self.mysql.stalled_after_ms) {
            return Err((
                "mysql.stalled_after_ms".into(),
                "must be between 1000 and 86400000".into(),
            ));
        }
        crate::filter::Filter::new(&self.filter, stream::SYSTEM_DATABASES)?;
        self.kafka.validate()?;
        self.topics.validate()?;
        self.standby.validate()?;
        self.publish.validate()?;
        self.snapshot.validate()?;
        self.log.validate()
    }
}

sluice_common::app_config!(Config);

/// The server's current binlog file and position (none: it writes no binlog).
pub async fn binlog_position(
    conn: &mut mysql_async::Conn,
) -> Result<Option<BinlogPos>, mysql_async::Error> {
    let version: Option<String> = conn.query_first("SELECT @@version").await?;
    let sql = binlog_status_sql(&version.unwrap_or_default());
    let row: Option<mysql_async::Row> = conn.query_first(sql).await?;
    Ok(row.map(|r| BinlogPos {
        file: r.get(0).unwrap_or_default(),
        pos: r.get(1).unwrap_or(4),
    }))
}

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

/// A connection error in words that name the cause: TLS (which check failed, and the
/// setting that changes it), a refused password, an unknown host.
pub fn connect_error(e: &mysql_async::Error, mysql: &MysqlConfig) -> String {
    let text = e.to_string();
    let lower = text.to_ascii_lowercase();
    let hint = if matches!(
        e,
        mysql_async::Error::Driver(mysql_async::DriverError::NoClientSslFlagFromServer)
    ) {
        " (the server offers no TLS: configure TLS on it, or set mysql.ssl_mode = \"disabled\" \
         to send the password and the rows in clear)"
    } else if lower.contains("unknownissuer") || lower.contains("unknown issuer") {
        " (the server's certificate is not signed by a CA this capture trusts: set mysql.ssl_ca \
         to the CA that signed it)"
    } else if lower.contains("notvalidforname") || lower.contains("not valid for name") {
        " (the server's certificate does not name the host of mysql.url: connect by a name \
         or address the certificate holds)"
    } else if lower.contains("access denied") && lower.contains("using password: yes") {
        " (a wrong password, or this user may not connect from this host)"
    } else if lower.contains("access denied") && lower.contains("using password: no") {
        " (no password was given: set mysql.password or mysql.password_file)"
    } else if lower.contains("requires secure transport") || lower.contains("require ssl") {
        " (this user must connect over TLS: set mysql.ssl_mode)"
    } else {
        ""
    };
    let secrets = [mysql.password.expose()];
    sluice_common::secret::scrub(&format!("{text}{hint}"), &secrets)
}

/// What the binlog reader needs from the server, checked one by one.
pub async fn preflight(config: &Config) -> Vec<Check> {
    let mut checks = vec![config.kafka.check("capture-mysql").await];
    let opts = config.mysql.opts().expect("validated at load");
    let mut conn = match connect::connect(opts).await {
        Ok(c) => c,
        Err(e) => {
            checks.push(Check::fail(
                "mysql",
                format!(
                    "cannot connect to {}: {}",
                    config.mysql.describe(),
                    connect_error(&e, &config.mysql)
                ),
            ));
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
    if let Ok(filter) = crate::filter::Filter::new(&config.filter, stream::SYSTEM_DATABASES) {
        checks.push(select_check(&mut conn, &filter).await);
    }
    let _ = conn.disconnect().await;
    checks
}

/// SELECT on each table the filter includes (the snapshot reads them): a table the user may
/// not read is named. Only the tables the user can see are known; none at all is a warning.
async fn select_check(conn: &mut mysql_async::Conn, filter: &crate::filter::Filter) -> Check {
    let tables: Vec<(String, String)> = match conn
        .query(
            "SELECT TABLE_SCHEMA, TABLE_NAME FROM information_schema.TABLES \
             WHERE TABLE_TYPE = 'BASE TABLE'",
        )
        .await
    {
        Ok(t) => t,
        Err(e) => return Check::fail("privileges", format!("listing the tables failed: {e}")),
    };
    let wanted: Vec<&(String, String)> =
        tables.iter().filter(|(d, t)| filter.wants(d, t)).collect();
    if wanted.is_empty() {
        return Check::warn(
            "privileges",
            "no table the filter includes is visible to this user: none exists yet, or SELECT \
             on them is missing",
        );
    }
    let mut refused_on = Vec::new();
    for (d, t) in wanted.iter().take(500) {
        let sql = format!("SELECT 1 FROM {}.{} LIMIT 0", ident(d), ident(t));
        if let Err(e) = conn.query_drop(&sql).await {
            refused_on.push(format!("`{d}`.`{t}` ({e})"));
        }
    }
    if refused_on.is_empty() {
        Check::pass(
            "privileges",
            format!(
                "SELECT on the {} table(s) the filter includes",
                wanted.len()
            ),
        )
    } else {
        Check::fail(
            "privileges",
            format!(
                "SELECT refused on {}: GRANT SELECT ON those tables (or their databases) TO the \
                 capture user",
                refused_on.join(", ")
            ),
        )
    }
}

/// A statement refused: which privilege it needs, and the GRANT that gives it.
fn refused(e: &mysql_async::Error, privilege: &str, statement: &str) -> String {
    match e {
        mysql_async::Error::Server(s) if [1227, 1142, 1143, 1044, 1045].contains(&s.code) => {
            format!(
                "{statement} was refused ({}): GRANT {privilege} ON *.* TO the capture user",
                s.message
            )
        }
        other => format!("{statement} failed: {other}"),
    }
}

/// The statements the capture runs, run here: each one refused names the privilege it lacks
/// (grants are not read: roles, wildcards and MariaDB's names make their text a poor guide).
async fn privilege_checks(conn: &mut mysql_async::Conn, version: &str) -> Vec<Check> {
    let mut checks = Vec::new();
    let client = if version.to_ascii_lowercase().contains("mariadb") {
        "BINLOG MONITOR"
    } else {
        "REPLICATION CLIENT"
    };
    let status = binlog_status_sql(version);
    let at: Option<(String, u64)> = match conn.query_first::<mysql_async::Row, _>(status).await {
        Ok(Some(row)) => {
            let file: Option<String> = row.get(0);
            let pos: Option<u64> = row.get(1);
            file.zip(pos)
        }
        Ok(None) => None,
        Err(e) => {
            checks.push(Check::fail("privileges", refused(&e, client, status)));
            None
        }
    };
    match conn.query_drop("SHOW BINARY LOGS").await {
        Ok(()) if at.is_some() => checks.push(Check::pass(
            "privileges",
            format!("{status} and SHOW BINARY LOGS answer ({client})"),
        )),
        Ok(()) => {}
        Err(e) => checks.push(Check::fail(
            "privileges",
            refused(&e, client, "SHOW BINARY LOGS"),
        )),
    }
    // The binlog dump the capture opens, as a non-blocking reader with server_id 0: it
    // registers no replica, so a capture running meanwhile is not disturbed.
    if let Some((file, pos)) = &at {
        let opts = conn.opts().clone();
        let dump = async {
            let c = connect::connect(opts).await?;
            let request = mysql_async::BinlogStreamRequest::new(0)
                .with_non_blocking()
                .with_filename(file.as_bytes())
                .with_pos(*pos);
            let mut stream = c.get_binlog_stream(request).await?;
            use futures::StreamExt;
            match stream.next().await {
                Some(Err(e)) => Err(e),
                _ => Ok(()),
            }
        };
        let slave = if version.to_ascii_lowercase().contains("mariadb") {
            "REPLICATION SLAVE (REPLICATION REPLICA)"
        } else {
            "REPLICATION SLAVE"
        };
        match tokio::time::timeout(std::time::Duration::from_secs(10), dump).await {
            Ok(Ok(())) => checks.push(Check::pass(
                "privileges",
                "a binlog dump is accepted (REPLICATION SLAVE)",
            )),
            Ok(Err(e)) => checks.push(Check::fail(
                "privileges",
                refused(&e, slave, "a binlog dump (COM_BINLOG_DUMP)"),
            )),
            Err(_) => checks.push(Check::warn(
                "privileges",
                "a binlog dump did not answer within 10 s",
            )),
        }
    }
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
    checks.extend(privilege_checks(conn, &version).await);
    Ok(checks)
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
