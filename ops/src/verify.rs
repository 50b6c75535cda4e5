//! `sluice verify`: is the target right? Source (MySQL/MariaDB) and target (the ClickHouse
//! mirror) compared table by table, in primary-key chunks, each server hashing its own rows
//! (the canonical rendering of [`render`]), as pt-table-checksum does: rows cross the network
//! only for chunks whose checksums differ.
//!
//! It is right while the pipeline streams. A chunk whose checksums differ is narrowed down to
//! its keys: the source's rows are read in a consistent snapshot at a binlog position P, the
//! tool waits until the target has caught up past P (the capture's checkpoint at or past P, then
//! the apply group's committed offsets at the ends the table's topic had at that moment), and
//! only then reads the target's rows with their versions. A key on which they disagree is a
//! difference when the target's row is of a version before P (the target shows the state at P
//! and it is not the source's); a target row of a later version changed after the snapshot and
//! is read again in the next round. A key still changing after every round is reported as
//! unsettled, never as equal.

pub mod mongo;
pub mod render;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::{Duration, Instant};

use mysql_async::prelude::Queryable;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::{Offset, TopicPartitionList};
use serde::Serialize;
use sluice_capture::checkpoint::Checkpoint;
use sluice_capture::mysql::position::BinlogPos;
use sluice_proto::v1::{Column, ColumnType, TableSchema};

use sluice_apply::clickhouse::Mode;
use sluice_common::sql::{clickhouse as ch, mysql as my};

/// What `sluice verify` is asked.
#[derive(Debug, Clone)]
pub struct Options {
    /// Only these source tables (`database.table`); empty: every table the capture's filter
    /// takes.
    pub tables: Vec<String>,
    /// Rows per chunk.
    pub chunk_rows: u64,
    /// Chunks checksummed at the same time (each on a source connection of its own).
    pub parallel: usize,
    /// Rounds of re-reading keys that changed while they were compared.
    pub rounds: u32,
    /// How long to wait for the target to catch up with a source position.
    pub wait: Duration,
    /// Print progress on stderr.
    pub progress: bool,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            tables: Vec::new(),
            chunk_rows: 10_000,
            parallel: 1,
            rounds: 5,
            wait: Duration::from_secs(120),
            progress: true,
        }
    }
}

/// The whole answer.
#[derive(Debug, Serialize)]
pub struct Report {
    /// `equal`, `different` (a difference or a table not verified) or `unsettled` (nothing
    /// found different, but keys kept changing, or a table could not be verified).
    pub result: String,
    pub tables: Vec<TableReport>,
    pub rows: u64,
    pub seconds: f64,
}

impl Report {
    /// The process's exit status: 0 equal, 1 different, 2 unsettled or not verified.
    pub fn exit_code(&self) -> u8 {
        match self.result.as_str() {
            "equal" => 0,
            "different" => 1,
            _ => 2,
        }
    }
}

#[derive(Debug, Serialize)]
pub struct TableReport {
    pub source: String,
    pub target: String,
    /// `equal`, `different`, `unsettled` or `not verified`.
    pub result: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Source rows checksummed.
    pub rows: u64,
    pub chunks: u64,
    /// Chunks whose checksums differed at first (changes in flight included).
    pub chunks_narrowed: u64,
    /// Source columns the target has not (not compared).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub columns_not_compared: Vec<String>,
    pub missing: Vec<KeyDiff>,
    pub extra: Vec<KeyDiff>,
    pub different: Vec<KeyDiff>,
    pub unsettled: Vec<KeyDiff>,
    pub seconds: f64,
}

impl TableReport {
    /// A table about to be compared: nothing found yet.
    pub fn new(source: String, target: String) -> Self {
        Self {
            source,
            target,
            result: "equal".into(),
            reason: None,
            rows: 0,
            chunks: 0,
            chunks_narrowed: 0,
            columns_not_compared: Vec::new(),
            missing: Vec::new(),
            extra: Vec::new(),
            different: Vec::new(),
            unsettled: Vec::new(),
            seconds: 0.0,
        }
    }
}

/// One key that differs.
#[derive(Debug, Clone, Serialize)]
pub struct KeyDiff {
    /// Primary-key column -> value.
    pub key: BTreeMap<String, String>,
    /// The columns that differ (every column for a missing or extra row): name, source value,
    /// target value (canonical text: see docs/operations.md).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub columns: Vec<ColumnDiff>,
}

#[derive(Debug, Clone, Serialize)]
pub struct ColumnDiff {
    pub column: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub source: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub target: Option<String>,
}

/// The configurations `sluice verify` reads: the capture's (source, filter, Kafka, checkpoint
/// topic, connector) and the apply stage's (target, table names, group).
pub struct Setup {
    pub capture: sluice_capture::mysql::Config,
    pub apply: sluice_apply::clickhouse::Config,
}

/// How a key compares once the target has caught up past the snapshot the source was read in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Equal,
    Missing,
    Extra,
    Different,
    /// The target's row changed after the snapshot: read again.
    Later,
}

/// The target's state of one key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TargetRow {
    pub hash: u64,
    pub version: u64,
    pub deleted: bool,
}

/// Compare one key: `source` its hash in the snapshot, `target` its newest target row,
/// `before` the version of the snapshot's position (target versions at or below it are states
/// at or before the snapshot).
pub fn judge(source: Option<u64>, target: Option<TargetRow>, before: u64) -> Verdict {
    let live = target.filter(|t| !t.deleted);
    match (source, live) {
        (Some(s), Some(t)) if s == t.hash => return Verdict::Equal,
        (None, None) => return Verdict::Equal,
        _ => {}
    }
    if target.is_some_and(|t| t.version > before) {
        return Verdict::Later;
    }
    match (source, live) {
        (Some(_), None) => Verdict::Missing,
        (None, Some(_)) => Verdict::Extra,
        _ => Verdict::Different,
    }
}

/// The version of a binlog position in a generation (`sluice_proto::mysql_version_in` of its
/// first row): every row event before the position is below it, every one after above.
pub fn position_version(generation: u8, p: &BinlogPos) -> Result<u64, String> {
    sluice_proto::mysql_version_in(generation, &p.file, p.pos, 0).map_err(|e| e.to_string())
}

fn pos_key(p: &BinlogPos) -> (u64, u64) {
    (sluice_proto::binlog_file_seq(&p.file).unwrap_or(0), p.pos)
}

/// One table's comparison plan.
struct Plan {
    db: String,
    table: String,
    target: String,
    schema: TableSchema,
    /// Source columns compared, with the target's type of each.
    columns: Vec<(Column, String)>,
    /// The primary key's columns, with their target types.
    key: Vec<(Column, String)>,
    /// The key is one integer column: chunks are key ranges.
    ranged: bool,
    version_column: String,
    deleted_column: Option<String>,
}

impl Plan {
    fn source_name(&self) -> String {
        format!("{}.{}", my::ident(&self.db), my::ident(&self.table))
    }

    fn my_row(&self) -> String {
        render::mysql_concat(
            &self
                .columns
                .iter()
                .map(|(c, t)| render::mysql_part(c, t))
                .collect::<Vec<_>>(),
        )
    }

    fn my_key(&self) -> String {
        render::mysql_concat(
            &self
                .key
                .iter()
                .map(|(c, t)| render::mysql_part(c, t))
                .collect::<Vec<_>>(),
        )
    }

    fn ch_row(&self) -> String {
        render::clickhouse_concat(
            &self
                .columns
                .iter()
                .map(|(c, t)| render::clickhouse_part(c, t))
                .collect::<Vec<_>>(),
        )
    }

    fn ch_key(&self) -> String {
        render::clickhouse_concat(
            &self
                .key
                .iter()
                .map(|(c, t)| render::clickhouse_part(c, t))
                .collect::<Vec<_>>(),
        )
    }

    fn ch_deleted(&self) -> String {
        match &self.deleted_column {
            Some(d) => format!("toUInt8({})", ch::ident(d)),
            None => "toUInt8(0)".into(),
        }
    }

    /// The `WHERE` of a chunk (`1` for the whole table); the same text on both servers.
    fn range(&self, chunk: &Chunk, quote: fn(&str) -> String) -> String {
        if !self.ranged {
            return "1".into();
        }
        let k = quote(&self.key[0].0.name);
        let mut w = Vec::new();
        if let Some(lo) = &chunk.lo {
            w.push(format!("{k} > {lo}"));
        }
        if let Some(hi) = &chunk.hi {
            w.push(format!("{k} <= {hi}"));
        }
        if w.is_empty() {
            "1".into()
        } else {
            w.join(" AND ")
        }
    }

    /// The target's newest row of each key of a chunk.
    fn ch_latest(&self, chunk: &Chunk) -> String {
        format!(
            "SELECT _sluice_k, argMax(_sluice_h, _sluice_v) AS _sluice_lh, max(_sluice_v) AS \
             _sluice_lv, argMax(_sluice_d, _sluice_v) AS _sluice_ld FROM (SELECT {key} AS _sluice_k, \
             {hash} AS _sluice_h, {ver} AS _sluice_v, {del} AS _sluice_d FROM {db}.{t} WHERE {range}) \
             GROUP BY _sluice_k",
            key = self.ch_key(),
            hash = render::clickhouse_hash(&self.ch_row()),
            ver = ch::ident(&self.version_column),
            del = self.ch_deleted(),
            db = ch::ident(&self.target_db()),
            t = ch::ident(self.target_table()),
            range = self.range(chunk, ch::ident),
        )
    }

    fn target_db(&self) -> String {
        self.target
            .split_once('.')
            .map(|(d, _)| d)
            .unwrap_or("")
            .to_string()
    }

    fn target_table(&self) -> &str {
        self.target
            .split_once('.')
            .map(|(_, t)| t)
            .unwrap_or(&self.target)
    }
}

/// A key range: keys above `lo` up to `hi` (integers as text); open where absent.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Chunk {
    lo: Option<String>,
    hi: Option<String>,
}

/// The source side.
struct Source {
    pool: mysql_async::Pool,
    mariadb: bool,
    status_sql: &'static str,
}

impl Source {
    async fn open(config: &sluice_capture::mysql::MysqlConfig) -> Result<Self, String> {
        let opts = config.opts()?;
        let opts = mysql_async::OptsBuilder::from_opts(opts).setup(vec![
            "SET SESSION time_zone = '+00:00', NAMES utf8mb4".to_string(),
            "SET SESSION TRANSACTION ISOLATION LEVEL REPEATABLE READ".to_string(),
        ]);
        let pool = mysql_async::Pool::new(opts);
        let mut conn = pool
            .get_conn()
            .await
            .map_err(|e| sluice_capture::mysql::connect_error(&e, config))?;
        let version: Option<String> = conn
            .query_first("SELECT @@version")
            .await
            .map_err(|e| format!("{}: {e}", config.describe()))?;
        let version = version.unwrap_or_default();
        Ok(Self {
            pool,
            mariadb: version.to_ascii_lowercase().contains("mariadb"),
            status_sql: sluice_capture::mysql::binlog_status_sql(&version),
        })
    }

    async fn conn(&self) -> Result<mysql_async::Conn, String> {
        self.pool
            .get_conn()
            .await
            .map_err(|e| format!("the source: {e}"))
    }

    /// Every base table of the databases the capture's filter takes.
    async fn tables(
        &self,
        filter: &sluice_capture::filter::Filter,
    ) -> Result<Vec<(String, String)>, String> {
        let mut conn = self.conn().await?;
        let all: Vec<(String, String)> = conn
            .query(
                "SELECT TABLE_SCHEMA, TABLE_NAME FROM information_schema.TABLES \
                 WHERE TABLE_TYPE = 'BASE TABLE' ORDER BY TABLE_SCHEMA, TABLE_NAME",
            )
            .await
            .map_err(|e| format!("listing the source's tables: {e}"))?;
        Ok(all
            .into_iter()
            .filter(|(d, t)| filter.wants(d, t))
            .collect())
    }

    async fn query<T: mysql_async::prelude::FromRow + Send + 'static>(
        conn: &mut mysql_async::Conn,
        sql: &str,
    ) -> Result<Vec<T>, String> {
        conn.query(sql)
            .await
            .map_err(|e| format!("the source refused the query {}: {e}", abbreviated(sql)))
    }

    async fn position(&self, conn: &mut mysql_async::Conn) -> Result<BinlogPos, String> {
        let row: Option<mysql_async::Row> = conn
            .query_first(self.status_sql)
            .await
            .map_err(|e| format!("{}: {e}", self.status_sql))?;
        let row = row.ok_or_else(|| {
            "the source writes no binlog (SHOW MASTER STATUS is empty)".to_string()
        })?;
        Ok(BinlogPos {
            file: row.get(0).unwrap_or_default(),
            pos: row.get(1).unwrap_or(4),
        })
    }

    /// Opens a consistent snapshot on `conn`: the binlog positions it lies between (one
    /// position on MariaDB, which reports it; on MySQL the positions before and after).
    async fn snapshot(
        &self,
        conn: &mut mysql_async::Conn,
    ) -> Result<(BinlogPos, BinlogPos), String> {
        let before = if self.mariadb {
            None
        } else {
            Some(self.position(conn).await?)
        };
        let at = sluice_capture::mysql::snapshot::begin_snapshot(conn, self.mariadb)
            .await
            .map_err(|e| format!("START TRANSACTION WITH CONSISTENT SNAPSHOT: {e}"))?;
        if let Some(p) = at {
            return Ok((p.clone(), p));
        }
        if self.mariadb {
            return Err("the source reports no binlog_snapshot_position".into());
        }
        let after = self.position(conn).await?;
        Ok((before.expect("read before"), after))
    }
}

/// A query for an error message: its start.
fn abbreviated(sql: &str) -> String {
    match sql.char_indices().nth(160) {
        Some((i, _)) => format!("`{}...`", &sql[..i]),
        None => format!("`{sql}`"),
    }
}

/// The target side.
struct Target {
    client: clickhouse::Client,
    database: String,
}

impl Target {
    async fn query<T>(&self, sql: &str) -> Result<Vec<T>, String>
    where
        T: clickhouse::RowOwned + clickhouse::RowRead,
    {
        self.client.query(sql).fetch_all::<T>().await.map_err(|e| {
            format!(
                "ClickHouse refused the query {}: {}",
                abbreviated(sql),
                sluice_apply::clickhouse::explain(&e)
            )
        })
    }

    async fn columns(&self, target: &str) -> Result<Vec<(String, String)>, String> {
        let (db, t) = target.split_once('.').unwrap_or((&self.database, target));
        self.query(&format!(
            "SELECT name, type FROM system.columns WHERE database = {} AND table = {}",
            ch::string(db),
            ch::string(t)
        ))
        .await
    }

    /// Stopped target tables and why.
    async fn stopped(&self, table: &str) -> BTreeMap<String, String> {
        let sql = format!(
            "SELECT target, reason FROM {}.{} FINAL",
            ch::ident(&self.database),
            ch::ident(table)
        );
        self.query::<(String, String)>(&sql)
            .await
            .map(|v| v.into_iter().collect())
            .unwrap_or_default()
    }
}

/// Waits until the target has caught up past a source position.
pub(crate) struct Pipeline {
    pub(crate) capture_kafka: sluice_common::KafkaConfig,
    pub(crate) checkpoint_topic: String,
    pub(crate) connector: String,
    pub(crate) apply_kafka: sluice_common::KafkaConfig,
    pub(crate) group: String,
    pub(crate) topics: sluice_proto::TopicTemplate,
}

impl Pipeline {
    /// Blocks until the capture's checkpoint is at or past `p` with no snapshot of the table
    /// under way, and the group has committed every event the table's topic had then. Returns
    /// the capture's binlog generation.
    fn wait(&self, p: &BinlogPos, db: &str, table: &str, limit: Duration) -> Result<u8, String> {
        let cp = self.wait_for(
            &|cp| match cp {
                Checkpoint::Mysql(c) => (pos_key(&c.next) >= pos_key(p), c.next.to_string()),
                other => (false, other.position()),
            },
            &p.to_string(),
            db,
            table,
            limit,
        )?;
        Ok(cp.generation())
    }

    /// Blocks until `reached` says the capture's checkpoint is at or past the source position
    /// `target` (it answers whether, and where the checkpoint is), with no snapshot of
    /// `db.table` under way, and then until the group has committed every event the table's
    /// topic had at that moment. Returns the checkpoint.
    pub(crate) fn wait_for(
        &self,
        reached: &dyn Fn(&Checkpoint) -> (bool, String),
        target: &str,
        db: &str,
        table: &str,
        limit: Duration,
    ) -> Result<Checkpoint, String> {
        let deadline = Instant::now() + limit;
        let name = format!("{db}.{table}");
        let late = |what: String| {
            format!(
                "the target did not catch up with the source's position {target} within {} s: \
                 {what}",
                limit.as_secs()
            )
        };
        let checkpoint = loop {
            let stored =
                crate::status::read_checkpoints(&self.capture_kafka, &self.checkpoint_topic)?;
            let Some(cp) = stored.get(&self.connector) else {
                return Err(format!(
                    "connector {:?} has no checkpoint on {}: is the capture running with this \
                     config?",
                    self.connector, self.checkpoint_topic
                ));
            };
            let (done, at) = reached(&cp.checkpoint);
            let snapshotting = cp.checkpoint.snapshotting(&name);
            if done && !snapshotting {
                break cp.checkpoint.clone();
            }
            if Instant::now() > deadline {
                return Err(late(if snapshotting {
                    format!("the capture's snapshot of {name} is not done")
                } else {
                    format!("the capture {} is at {at}", self.connector)
                }));
            }
            std::thread::sleep(Duration::from_millis(150));
        };
        let topic = self.topics.topic(db, table).map_err(|e| e.to_string())?;
        let timeout = self.apply_kafka.request_timeout();
        let consumer = crate::status::consumer(&self.apply_kafka, &self.group)?;
        let md = consumer
            .fetch_metadata(Some(&topic), timeout)
            .map_err(|e| format!("topic {topic}: {e}"))?;
        let Some(t) = md
            .topics()
            .iter()
            .find(|t| t.name() == topic && t.error().is_none())
        else {
            return Ok(checkpoint); // nothing was ever published for the table
        };
        let mut ends = TopicPartitionList::new();
        for part in t.partitions() {
            let (_, high) = consumer
                .fetch_watermarks(&topic, part.id(), timeout)
                .map_err(|e| format!("topic {topic}[{}]: {e}", part.id()))?;
            ends.add_partition_offset(&topic, part.id(), Offset::Offset(high))
                .map_err(|e| e.to_string())?;
        }
        loop {
            let committed = committed(&consumer, &ends, timeout)?;
            let behind: Vec<String> = ends
                .elements()
                .iter()
                .filter_map(|e| {
                    let end = e.offset().to_raw().unwrap_or(0);
                    let at = committed.get(&e.partition()).copied().unwrap_or(-1);
                    (at < end).then(|| format!("[{}] {at} < {end}", e.partition()))
                })
                .collect();
            if behind.is_empty() {
                return Ok(checkpoint);
            }
            if Instant::now() > deadline {
                return Err(late(format!(
                    "group {} has not committed {topic} up to {}",
                    self.group,
                    behind.join(", ")
                )));
            }
            std::thread::sleep(Duration::from_millis(150));
        }
    }
}

fn committed(
    consumer: &BaseConsumer,
    ends: &TopicPartitionList,
    timeout: Duration,
) -> Result<HashMap<i32, i64>, String> {
    let mut tpl = TopicPartitionList::new();
    for e in ends.elements() {
        tpl.add_partition(e.topic(), e.partition());
    }
    let got = consumer
        .committed_offsets(tpl, timeout)
        .map_err(|e| format!("committed offsets: {e}"))?;
    Ok(got
        .elements()
        .iter()
        .filter_map(|e| e.offset().to_raw().map(|o| (e.partition(), o)))
        .collect())
}

/// Run the comparison.
pub async fn run(setup: &Setup, options: &Options) -> Result<Report, String> {
    let started = Instant::now();
    let filter = sluice_capture::filter::Filter::new(
        &setup.capture.filter,
        sluice_capture::mysql::stream::SYSTEM_DATABASES,
    )
    .map_err(|(k, e)| format!("{k}: {e}"))?;
    let source = Source::open(&setup.capture.mysql).await?;
    let target = Target {
        client: setup.apply.clickhouse.client()?,
        database: setup.apply.clickhouse.database.clone(),
    };
    let pipeline = std::sync::Arc::new(Pipeline {
        capture_kafka: setup.capture.kafka.clone(),
        checkpoint_topic: setup.capture.publish.checkpoint_topic.clone(),
        connector: setup.capture.connector.clone(),
        apply_kafka: setup.apply.kafka.clone(),
        group: setup.apply.consumer.group_id.clone(),
        topics: setup.capture.topics.template().map_err(|e| e.to_string())?,
    });
    let mut tables = source.tables(&filter).await?;
    only_wanted(&mut tables, &options.tables, "table")?;
    let stopped = target.stopped(&setup.apply.tables.stopped_table).await;
    let mut reports = Vec::new();
    for (db, table) in tables {
        let report = verify_table(
            &source, &target, &pipeline, setup, options, &stopped, &db, &table,
        )
        .await;
        if options.progress {
            eprintln!("{}", summary_line(&report));
        }
        reports.push(report);
    }
    Ok(report(reports, started))
}

/// Keep only the `database.name`s of `--table` (all when none is given); a name that is not
/// among them is an error.
pub(crate) fn only_wanted(
    names: &mut Vec<(String, String)>,
    wanted: &[String],
    what: &str,
) -> Result<(), String> {
    if wanted.is_empty() {
        return Ok(());
    }
    for want in wanted {
        if !names.iter().any(|(d, t)| &format!("{d}.{t}") == want) {
            return Err(format!(
                "{want}: no such {what} in the source, or outside the capture's filter"
            ));
        }
    }
    names.retain(|(d, t)| wanted.contains(&format!("{d}.{t}")));
    Ok(())
}

/// The whole answer from the tables' answers.
pub(crate) fn report(tables: Vec<TableReport>, started: Instant) -> Report {
    let result = if tables.iter().any(|r| r.result == "different") {
        "different"
    } else if tables.iter().all(|r| r.result == "equal") {
        "equal"
    } else {
        "unsettled"
    };
    Report {
        result: result.into(),
        rows: tables.iter().map(|r| r.rows).sum(),
        tables,
        seconds: started.elapsed().as_secs_f64(),
    }
}

#[allow(clippy::too_many_arguments)]
async fn verify_table(
    source: &Source,
    target: &Target,
    pipeline: &std::sync::Arc<Pipeline>,
    setup: &Setup,
    options: &Options,
    stopped: &BTreeMap<String, String>,
    db: &str,
    table: &str,
) -> TableReport {
    let started = Instant::now();
    let tables = &setup.apply.tables;
    let target_table = tables.name.replace("{db}", db).replace("{table}", table);
    let mut report = TableReport::new(
        format!("{db}.{table}"),
        format!("{}.{}", target.database, target_table),
    );
    let outcome = async {
        let plan = match plan(source, target, setup, db, table, &target_table, stopped).await? {
            Ok(plan) => plan,
            Err(reason) => {
                report.result = "not verified".into();
                report.reason = Some(reason);
                return Ok(());
            }
        };
        report.columns_not_compared = plan
            .schema
            .columns
            .iter()
            .filter(|c| !plan.columns.iter().any(|(p, _)| p.name == c.name))
            .map(|c| c.name.clone())
            .collect();
        compare(source, target, pipeline, options, &plan, &mut report).await
    }
    .await;
    if let Err(e) = outcome {
        report.result = "not verified".into();
        report.reason = Some(e);
    } else if report.result == "equal" {
        report.result = if !report.missing.is_empty()
            || !report.extra.is_empty()
            || !report.different.is_empty()
        {
            "different"
        } else if !report.unsettled.is_empty() {
            "unsettled"
        } else {
            "equal"
        }
        .into();
    }
    report.seconds = started.elapsed().as_secs_f64();
    report
}

/// The plan of one table, or why it cannot be verified.
async fn plan(
    source: &Source,
    target: &Target,
    setup: &Setup,
    db: &str,
    table: &str,
    target_table: &str,
    stopped: &BTreeMap<String, String>,
) -> Result<Result<Plan, String>, String> {
    let tables = &setup.apply.tables;
    let name = format!("{db}.{table}");
    let mut conn = source.conn().await?;
    let Some(schema) = sluice_capture::mysql::schema::load(&mut conn, db, table)
        .await
        .map_err(|e| format!("reading the schema of {name}: {e}"))?
    else {
        return Ok(Err("the table no longer exists in the source".into()));
    };
    drop(conn);
    if schema.primary_key.is_empty() {
        return Ok(Err(
            "no primary key: its target is a change log, which verify does not compare".into(),
        ));
    }
    if tables.mode_of(&name) == Mode::Changelog {
        return Ok(Err(
            "a change-log table (tables.modes): verify compares mirrors".into(),
        ));
    }
    if let Some(reason) = stopped.get(target_table) {
        return Ok(Err(format!(
            "the apply stage stopped this table: {reason} (docs/apply-clickhouse.md, Target \
             tables)"
        )));
    }
    let target_columns: BTreeMap<String, String> = target
        .columns(&format!("{}.{target_table}", target.database))
        .await?
        .into_iter()
        .collect();
    if target_columns.is_empty() {
        return Ok(Err(format!(
            "no target table {}.{target_table}",
            target.database
        )));
    }
    if !target_columns.contains_key(&tables.version_column) {
        return Ok(Err(format!(
            "the target has no version column {:?} (tables.version_column)",
            tables.version_column
        )));
    }
    let columns: Vec<(Column, String)> = schema
        .columns
        .iter()
        .filter_map(|c| target_columns.get(&c.name).map(|t| (c.clone(), t.clone())))
        .collect();
    let mut key = Vec::new();
    for i in &schema.primary_key {
        let c = &schema.columns[*i as usize];
        match target_columns.get(&c.name) {
            Some(t) => key.push((c.clone(), t.clone())),
            None => {
                return Ok(Err(format!(
                    "the target has no column {:?} of the primary key",
                    c.name
                )))
            }
        }
    }
    let ranged = key.len() == 1
        && matches!(
            key[0].0.r#type(),
            ColumnType::Tinyint
                | ColumnType::Smallint
                | ColumnType::Mediumint
                | ColumnType::Int
                | ColumnType::Bigint
        );
    Ok(Ok(Plan {
        db: db.to_string(),
        table: table.to_string(),
        target: format!("{}.{target_table}", target.database),
        schema,
        columns,
        key,
        ranged,
        version_column: tables.version_column.clone(),
        deleted_column: target_columns
            .contains_key(&tables.deleted_column)
            .then(|| tables.deleted_column.clone()),
    }))
}

/// First pass: every chunk's checksum on both servers; then narrow the chunks that differ.
async fn compare(
    source: &Source,
    target: &Target,
    pipeline: &std::sync::Arc<Pipeline>,
    options: &Options,
    plan: &Plan,
    report: &mut TableReport,
) -> Result<(), String> {
    use futures::StreamExt;
    let my_sum = format!(
        "SELECT COUNT(*), BIT_XOR({}) FROM {} WHERE ",
        render::mysql_hash(&plan.my_row()),
        plan.source_name()
    );
    // The chunks' bounds first (an index walk, cheap), then their checksums, `--parallel` at
    // a time, each on a connection of its own.
    let mut chunks = Vec::new();
    let mut conn = source.conn().await?;
    let mut lo: Option<String> = None;
    loop {
        let hi = if plan.ranged {
            let k = my::ident(&plan.key[0].0.name);
            let after = lo
                .as_ref()
                .map(|l| format!("WHERE {k} > {l} "))
                .unwrap_or_default();
            let sql = format!(
                "SELECT CAST({k} AS CHAR) FROM {} {after}ORDER BY {k} LIMIT 1 OFFSET {}",
                plan.source_name(),
                options.chunk_rows.max(1) - 1
            );
            Source::query::<String>(&mut conn, &sql)
                .await?
                .into_iter()
                .next()
        } else {
            None
        };
        chunks.push(Chunk {
            lo: lo.clone(),
            hi: hi.clone(),
        });
        match hi {
            Some(h) => lo = Some(h),
            None => break,
        }
    }
    drop(conn);
    let sums = futures::stream::iter(chunks)
        .map(|chunk| {
            let my_sql = format!("{my_sum}{}", plan.range(&chunk, my::ident));
            let ch_sql = format!(
                "SELECT count(), groupBitXor(_sluice_lh) FROM ({}) WHERE _sluice_ld = 0",
                plan.ch_latest(&chunk)
            );
            async move {
                let mut conn = source.conn().await?;
                let (mine, theirs) = tokio::join!(
                    Source::query::<(u64, Option<u64>)>(&mut conn, &my_sql),
                    target.query::<(u64, u64)>(&ch_sql)
                );
                let (rows, my_hash) = mine?.into_iter().next().unwrap_or((0, None));
                let theirs = theirs?.into_iter().next().unwrap_or((0, 0));
                Ok::<_, String>((chunk, rows, (rows, my_hash.unwrap_or(0)) != theirs))
            }
        })
        .buffered(options.parallel.max(1));
    futures::pin_mut!(sums);
    let mut differing = Vec::new();
    let mut last_progress = Instant::now();
    while let Some(sum) = sums.next().await {
        let (chunk, rows, differs) = sum?;
        report.rows += rows;
        report.chunks += 1;
        if differs {
            differing.push(chunk);
        }
        if options.progress && last_progress.elapsed() > Duration::from_secs(5) {
            last_progress = Instant::now();
            eprintln!(
                "verify: {}: {} chunks, {} rows, {} to narrow",
                report.source,
                report.chunks,
                report.rows,
                differing.len()
            );
        }
    }
    report.chunks_narrowed = differing.len() as u64;
    if differing.is_empty() {
        return Ok(());
    }
    narrow(source, target, pipeline, options, plan, differing, report).await
}

/// Key by key, over rounds, for the chunks that differ.
async fn narrow(
    source: &Source,
    target: &Target,
    pipeline: &std::sync::Arc<Pipeline>,
    options: &Options,
    plan: &Plan,
    chunks: Vec<Chunk>,
    report: &mut TableReport,
) -> Result<(), String> {
    // Per chunk the keys still open (None: every key).
    let mut open: Vec<(Chunk, Option<BTreeSet<String>>)> =
        chunks.into_iter().map(|c| (c, None)).collect();
    let mut found: Vec<(Chunk, String, Verdict)> = Vec::new();
    let my_keys = format!(
        "SELECT HEX({}), {} FROM {} WHERE ",
        plan.my_key(),
        render::mysql_hash(&plan.my_row()),
        plan.source_name()
    );
    for round in 0..options.rounds.max(1) {
        let mut conn = source.conn().await?;
        let (lo, hi) = source.snapshot(&mut conn).await?;
        let mut mine = Vec::new();
        for (chunk, _) in &open {
            let sql = format!("{my_keys}{}", plan.range(chunk, my::ident));
            let rows: HashMap<String, u64> = Source::query::<(String, u64)>(&mut conn, &sql)
                .await?
                .into_iter()
                .collect();
            mine.push(rows);
        }
        conn.query_drop("COMMIT").await.map_err(|e| e.to_string())?;
        drop(conn);
        let (p, name, limit) = (
            hi.clone(),
            (plan.db.clone(), plan.table.clone()),
            options.wait,
        );
        let pl = pipeline.clone();
        let generation = tokio::task::spawn_blocking(move || pl.wait(&p, &name.0, &name.1, limit))
            .await
            .map_err(|e| e.to_string())??;
        let before = position_version(generation, &lo)?;
        let mut next = Vec::new();
        for ((chunk, keys), mine) in open.into_iter().zip(mine) {
            let theirs: HashMap<String, TargetRow> = target
                .query::<(String, u64, u64, u8)>(&format!(
                    "SELECT hex(_sluice_k), _sluice_lh, _sluice_lv, _sluice_ld FROM ({})",
                    plan.ch_latest(&chunk)
                ))
                .await?
                .into_iter()
                .map(|(k, h, v, d)| {
                    (
                        k,
                        TargetRow {
                            hash: h,
                            version: v,
                            deleted: d != 0,
                        },
                    )
                })
                .collect();
            let all: BTreeSet<&String> = mine.keys().chain(theirs.keys()).collect();
            let mut later = BTreeSet::new();
            for k in all {
                if keys.as_ref().is_some_and(|open| !open.contains(k)) {
                    continue;
                }
                match judge(mine.get(k).copied(), theirs.get(k).copied(), before) {
                    Verdict::Equal => {}
                    Verdict::Later => {
                        later.insert(k.clone());
                    }
                    v => found.push((chunk.clone(), k.clone(), v)),
                }
            }
            if !later.is_empty() {
                next.push((chunk, Some(later)));
            }
        }
        open = next;
        if open.is_empty() {
            break;
        }
        if options.progress {
            eprintln!(
                "verify: {}: round {}: {} keys changed while compared, read again",
                report.source,
                round + 1,
                open.iter()
                    .map(|(_, k)| k.as_ref().map_or(0, BTreeSet::len))
                    .sum::<usize>()
            );
        }
    }
    // The values of what was found, for people.
    let mut by_chunk: Vec<(Chunk, Vec<(String, Verdict)>)> = Vec::new();
    for (chunk, k, v) in found {
        match by_chunk.iter_mut().find(|(c, _)| *c == chunk) {
            Some((_, ks)) => ks.push((k, v)),
            None => by_chunk.push((chunk, vec![(k, v)])),
        }
    }
    for (chunk, keys) in by_chunk {
        let wanted: Vec<String> = keys.iter().map(|(k, _)| my::string(k)).collect();
        let mut conn = source.conn().await?;
        let mine: HashMap<String, String> = Source::query::<(String, String)>(
            &mut conn,
            &format!(
                "SELECT HEX({}), HEX({}) FROM {} WHERE {} AND HEX({}) IN ({})",
                plan.my_key(),
                plan.my_row(),
                plan.source_name(),
                plan.range(&chunk, my::ident),
                plan.my_key(),
                wanted.join(", ")
            ),
        )
        .await?
        .into_iter()
        .collect();
        drop(conn);
        let ch_wanted: Vec<String> = keys.iter().map(|(k, _)| ch::string(k)).collect();
        let theirs: HashMap<String, String> = target
            .query::<(String, String)>(&format!(
                "SELECT hex(_sluice_k), hex(argMax(_sluice_r, _sluice_v)) AS _sluice_lr FROM (SELECT \
                 {key} AS _sluice_k, {row} AS _sluice_r, {ver} AS _sluice_v FROM {db}.{t} WHERE \
                 {range}) GROUP BY _sluice_k HAVING hex(_sluice_k) IN ({wanted})",
                key = plan.ch_key(),
                row = plan.ch_row(),
                ver = ch::ident(&plan.version_column),
                db = ch::ident(&plan.target_db()),
                t = ch::ident(plan.target_table()),
                range = plan.range(&chunk, ch::ident),
                wanted = ch_wanted.join(", ")
            ))
            .await?
            .into_iter()
            .collect();
        for (k, v) in keys {
            let diff = key_diff(plan, &k, mine.get(&k), theirs.get(&k), v);
            match v {
                Verdict::Missing => report.missing.push(diff),
                Verdict::Extra => report.extra.push(diff),
                _ => report.different.push(diff),
            }
        }
    }
    for (_, keys) in open {
        for k in keys.unwrap_or_default() {
            report
                .unsettled
                .push(key_diff(plan, &k, None, None, Verdict::Later));
        }
    }
    Ok(())
}

/// A found key with its values: every column for a missing or extra row, the differing
/// columns for a different one.
fn key_diff(
    plan: &Plan,
    key_hex: &str,
    source: Option<&String>,
    target: Option<&String>,
    verdict: Verdict,
) -> KeyDiff {
    let kinds = |cols: &[(Column, String)]| -> Vec<bool> {
        cols.iter().map(|(c, t)| render::delimited(c, t)).collect()
    };
    let (key_kinds, row_kinds) = (kinds(&plan.key), kinds(&plan.columns));
    let parts = |hex: &str, kinds: &[bool]| {
        sluice_common::hex::decode(hex)
            .ok()
            .and_then(|b| render::split_parts(&b, kinds))
    };
    let key_parts = parts(key_hex, &key_kinds).unwrap_or_default();
    let key = plan
        .key
        .iter()
        .zip(key_parts.iter())
        .map(|((c, _), v)| (c.name.clone(), display(c, v)))
        .collect();
    let mine = source.and_then(|s| parts(s, &row_kinds));
    let theirs = target.and_then(|t| parts(t, &row_kinds));
    let mut columns = Vec::new();
    if verdict != Verdict::Later {
        for (i, (c, _)) in plan.columns.iter().enumerate() {
            let s = mine.as_ref().and_then(|m| m.get(i));
            let t = theirs.as_ref().and_then(|m| m.get(i));
            let show = matches!(verdict, Verdict::Missing | Verdict::Extra) || s != t;
            if show {
                columns.push(ColumnDiff {
                    column: c.name.clone(),
                    source: (verdict != Verdict::Extra)
                        .then(|| s.map_or("?".into(), |v| display(c, v))),
                    target: (verdict != Verdict::Missing)
                        .then(|| t.map_or("?".into(), |v| display(c, v))),
                });
            }
        }
    }
    KeyDiff { key, columns }
}

/// A canonical value for people: floats back from `E:M` to their shortest decimal.
fn display(col: &Column, v: &Option<Vec<u8>>) -> String {
    if let (ColumnType::Float | ColumnType::Double, Some(b)) = (col.r#type(), v) {
        if let Some(f) = float_of(b) {
            return if col.r#type() == ColumnType::Float {
                (f as f32).to_string()
            } else {
                f.to_string()
            };
        }
    }
    render::show(v)
}

/// `E:M` -> M · 2^(E-52).
pub fn float_of(text: &[u8]) -> Option<f64> {
    let t = std::str::from_utf8(text).ok()?;
    if t == "0" {
        return Some(0.0);
    }
    let (e, m) = t.split_once(':')?;
    let (e, m): (i32, i64) = (e.parse().ok()?, m.parse().ok()?);
    // Two steps, so that neither power of two leaves the range of f64.
    let k = e - 52;
    Some(m as f64 * 2f64.powi(k / 2) * 2f64.powi(k - k / 2))
}

/// One line per table.
pub fn summary_line(t: &TableReport) -> String {
    let mut s = format!(
        "{} -> {}: {} ({} rows, {} chunks",
        t.source, t.target, t.result, t.rows, t.chunks
    );
    if t.chunks_narrowed > 0 {
        s.push_str(&format!(", {} narrowed to keys", t.chunks_narrowed));
    }
    s.push(')');
    let counts: Vec<String> = [
        ("missing", t.missing.len()),
        ("extra", t.extra.len()),
        ("different", t.different.len()),
        ("unsettled", t.unsettled.len()),
    ]
    .iter()
    .filter(|(_, n)| *n > 0)
    .map(|(w, n)| format!("{n} {w}"))
    .collect();
    if !counts.is_empty() {
        s.push_str(&format!(": {}", counts.join(", ")));
    }
    if let Some(r) = &t.reason {
        s.push_str(&format!(": {r}"));
    }
    s
}

/// The report for people: a line per table, then up to `limit` keys of each kind.
pub fn text(r: &Report, limit: usize) -> String {
    let mut out = Vec::new();
    for t in &r.tables {
        out.push(summary_line(t));
        if !t.columns_not_compared.is_empty() {
            out.push(format!(
                "  not in the target, not compared: {}",
                t.columns_not_compared.join(", ")
            ));
        }
        for (what, keys) in [
            ("missing", &t.missing),
            ("extra", &t.extra),
            ("different", &t.different),
            ("unsettled", &t.unsettled),
        ] {
            for k in keys.iter().take(limit) {
                let key: Vec<String> = k.key.iter().map(|(n, v)| format!("{n}={v}")).collect();
                out.push(format!("  {what:<9} {}", key.join(" ")));
                for c in &k.columns {
                    let v = |x: &Option<String>| x.as_deref().map(|s| format!("{s:?}"));
                    out.push(match (v(&c.source), v(&c.target)) {
                        (Some(s), Some(t)) => format!("    {}: source {s}, target {t}", c.column),
                        (Some(s), None) => format!("    {}: {s}", c.column),
                        (None, Some(t)) => format!("    {}: {t}", c.column),
                        (None, None) => format!("    {}", c.column),
                    });
                }
            }
            if keys.len() > limit {
                out.push(format!(
                    "  ... {} more {what} (all of them with --json)",
                    keys.len() - limit
                ));
            }
        }
    }
    out.push(format!(
        "{}: {} tables, {} rows in {:.1} s",
        r.result,
        r.tables.len(),
        r.rows,
        r.seconds
    ));
    out.join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(hash: u64, version: u64, deleted: bool) -> Option<TargetRow> {
        Some(TargetRow {
            hash,
            version,
            deleted,
        })
    }

    #[test]
    fn a_key_differs_only_when_the_target_shows_a_state_from_before_the_snapshot() {
        let p = 1000;
        // Agreement needs no version.
        assert_eq!(judge(Some(7), row(7, 5000, false), p), Verdict::Equal);
        assert_eq!(judge(None, None, p), Verdict::Equal);
        assert_eq!(judge(None, row(7, 10, true), p), Verdict::Equal);
        // Disagreement with a target state at or before P: the target is wrong.
        assert_eq!(judge(Some(7), row(8, 999, false), p), Verdict::Different);
        assert_eq!(judge(Some(7), row(8, 1000, false), p), Verdict::Different);
        assert_eq!(judge(Some(7), None, p), Verdict::Missing);
        assert_eq!(judge(Some(7), row(7, 10, true), p), Verdict::Missing);
        assert_eq!(judge(None, row(7, 10, false), p), Verdict::Extra);
        // A target row written after P: the source changed since the snapshot, read again.
        assert_eq!(judge(Some(7), row(8, 1001, false), p), Verdict::Later);
        assert_eq!(judge(Some(7), row(7, 1001, true), p), Verdict::Later);
        assert_eq!(judge(None, row(7, 1001, false), p), Verdict::Later);
    }

    #[test]
    fn positions_order_as_their_versions() {
        let a = BinlogPos {
            file: "mysql-bin.000002".into(),
            pos: 900,
        };
        let b = BinlogPos {
            file: "mysql-bin.000003".into(),
            pos: 4,
        };
        assert!(position_version(0, &a).unwrap() < position_version(0, &b).unwrap());
        assert!(position_version(0, &b).unwrap() < position_version(1, &a).unwrap());
        assert!(pos_key(&a) < pos_key(&b));
        // The event at the position itself (its first row) is not before it.
        assert_eq!(
            position_version(0, &a).unwrap(),
            sluice_proto::mysql_version("mysql-bin.000002", 900, 0).unwrap()
        );
    }

    #[test]
    fn canonical_floats_read_back_exactly() {
        for (text, want) in [
            ("-4:7205759403792794", 0.1f64),
            ("1023:9007199254740991", f64::MAX),
            ("-1022:1", 5e-324),
            ("-1022:4503599627370496", f64::MIN_POSITIVE),
            ("1:-5629499534213120", -2.5),
            ("0", 0.0),
        ] {
            assert_eq!(float_of(text.as_bytes()), Some(want), "{text}");
        }
        assert_eq!(
            float_of(b"-4:7205759511166976").map(|f| f as f32),
            Some(0.1f32)
        );
    }
}
