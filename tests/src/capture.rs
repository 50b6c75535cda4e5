//! Running the stages (`capture-mysql`, `apply-clickhouse`) as processes, and reading what the
//! capture published.

use std::collections::BTreeMap;
use std::io::Read;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use mysql_async::prelude::Queryable;
use prost::Message;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::{Message as _, Offset, TopicPartitionList};
use sluice_proto::ChangeEvent;

use crate::{bin, free_port, kafka_brokers, mysql_url, unique};

/// A stage process with its config file and metrics port; for captures, its own connector name
/// and topic prefix.
pub struct CaptureProcess {
    pub child: Child,
    binary: &'static str,
    pub connector: String,
    pub prefix: String,
    pub metrics_port: u16,
    config: tempfile::NamedTempFile,
    /// What the process wrote to stderr, read as it goes (a full pipe would block it).
    log: Option<std::thread::JoinHandle<String>>,
    /// The logs of the earlier runs of this process, before its restarts.
    earlier: String,
}

/// Read a child's stderr to its end on a thread of its own.
fn drain(child: &mut Child) -> Option<std::thread::JoinHandle<String>> {
    let mut s = child.stderr.take()?;
    Some(std::thread::spawn(move || {
        let mut out = Vec::new();
        let _ = s.read_to_end(&mut out);
        String::from_utf8_lossy(&out).into_owned()
    }))
}

/// The binlog coordinate where the server is now, as `FILE:POS` for `[mysql] start`.
pub async fn binlog_end() -> String {
    let mut c = mysql_async::Conn::new(mysql_async::Opts::from_url(&mysql_url()).unwrap())
        .await
        .unwrap();
    let (file, pos) = binlog_status(&mut c).await;
    format!("{file}:{pos}")
}

/// The server's binlog file and position now, asked for as the server names it (`SHOW MASTER
/// STATUS`, or MySQL 8.2+'s `SHOW BINARY LOG STATUS`).
pub async fn binlog_status(c: &mut mysql_async::Conn) -> (String, u64) {
    let version: String = c.query_first("SELECT @@version").await.unwrap().unwrap();
    let sql = sluice_capture::mysql::binlog_status_sql(&version);
    let row: mysql_async::Row = c.query_first(sql).await.unwrap().expect("binlog enabled");
    (row.get(0).unwrap(), row.get(1).unwrap())
}

impl CaptureProcess {
    /// Config for a capture of database `db` from `start`, with `extra` TOML appended.
    pub fn config(db: &str, start: &str, extra: &str) -> (String, String, String) {
        let connector = unique("conn");
        let prefix = unique("cdc");
        let text = format!(
            "connector = \"{connector}\"\n\
             [mysql]\n{}url = \"{}\"\nstart = \"{start}\"\nserver_id = {}\nheartbeat_ms = 1000\n\
             [filter]\ninclude = [\"{db}\\\\..*\"]\n\
             [topics]\nprefix = \"{prefix}\"\n\
             [publish]\npartitions = 3\nreplication_factor = 1\ncheckpoint_interval_ms = 100\n\
             [kafka]\nbrokers = \"{}\"\n{extra}\n",
            crate::mysql_tls(),
            mysql_url(),
            crate::replica_server_id(),
            kafka_brokers()
        );
        (text, connector, prefix)
    }

    /// Start capture-mysql with a config made by [`CaptureProcess::config`].
    pub fn spawn(config: (String, String, String)) -> Self {
        Self::spawn_binary("capture-mysql", config)
    }

    /// Start `binary` with config text (a `[metrics]` section is added).
    pub fn spawn_binary(binary: &'static str, config: (String, String, String)) -> Self {
        let (text, connector, prefix) = config;
        let metrics_port = free_port();
        let file = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(
            file.path(),
            format!("{text}\n[metrics]\nlisten = \"127.0.0.1:{metrics_port}\"\n"),
        )
        .unwrap();
        let mut child = Command::new(bin(binary))
            .args(["-c", file.path().to_str().unwrap()])
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let log = drain(&mut child);
        Self {
            child,
            binary,
            connector,
            prefix,
            metrics_port,
            config: file,
            log,
            earlier: String::new(),
        }
    }

    /// The config file the process was started with.
    pub fn config_path(&self) -> &std::path::Path {
        self.config.path()
    }

    /// Add TOML (new sections) to the config, for the next [`CaptureProcess::restart`].
    pub fn append_config(&mut self, extra: &str) {
        let mut text = std::fs::read_to_string(self.config.path()).unwrap();
        text.push('\n');
        text.push_str(extra);
        std::fs::write(self.config.path(), text).unwrap();
    }

    /// Replace `from` by `to` in the config, for the next [`CaptureProcess::restart`].
    pub fn edit_config(&mut self, from: &str, to: &str) {
        let text = std::fs::read_to_string(self.config.path()).unwrap();
        assert!(text.contains(from), "{from:?} is not in the config");
        std::fs::write(self.config.path(), text.replace(from, to)).unwrap();
    }

    /// The same capture (connector, prefix, config) started again, after the last one exited
    /// or was killed.
    pub fn restart(&mut self) {
        // The last run has exited (stopped or killed): keep what it logged.
        if let Some(h) = self.log.take() {
            self.earlier.push_str(&h.join().unwrap_or_default());
            self.earlier.push_str("---- restarted ----\n");
        }
        self.child = Command::new(bin(self.binary))
            .args(["-c", self.config.path().to_str().unwrap()])
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        self.log = drain(&mut self.child);
    }

    pub fn topic(&self, db: &str, table: &str) -> String {
        format!("{}.{db}.{table}", self.prefix)
    }

    /// SIGTERM, then wait; returns the exit code and stderr.
    pub fn stop(&mut self) -> (Option<i32>, String) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        self.wait(Duration::from_secs(30))
    }

    /// [`Self::stop`]; it must exit 0. Its log.
    pub fn stop_ok(&mut self) -> String {
        let (code, log) = self.stop();
        assert_eq!(
            code,
            Some(0),
            "{} exited {code:?}, not 0:\n{log}",
            self.binary
        );
        log
    }

    /// Keep `log` (what [`Self::stop`] returned) before what the next run logs, so that the
    /// log the last stop returns holds every run's.
    pub fn keep_log(&mut self, log: String) {
        self.earlier = log;
    }

    /// `kill <sig>` (`-STOP`, `-CONT`, ...) to the process, which must take it.
    pub fn signal(&self, sig: &str) {
        let ok = Command::new("kill")
            .args([sig, &self.child.id().to_string()])
            .status()
            .unwrap()
            .success();
        assert!(ok, "kill {sig}");
    }

    /// kill -9.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Whether the process has exited (without waiting).
    pub fn exited(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(Some(_)))
    }

    /// Wait for exit: the exit code and everything it logged.
    pub fn wait(&mut self, limit: Duration) -> (Option<i32>, String) {
        let deadline = Instant::now() + limit;
        let status = loop {
            if let Some(s) = self.child.try_wait().unwrap() {
                break s;
            }
            if Instant::now() > deadline {
                self.kill();
                let log = self
                    .log
                    .take()
                    .map(|h| h.join().unwrap_or_default())
                    .unwrap_or_default();
                panic!(
                    "{} did not exit within {limit:?}; its log:\n{}{log}",
                    self.binary, self.earlier
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        let err = self
            .log
            .take()
            .map(|h| h.join().unwrap_or_default())
            .unwrap_or_default();
        (
            status.code(),
            format!("{}{err}", std::mem::take(&mut self.earlier)),
        )
    }
}

impl Drop for CaptureProcess {
    /// Stopped as an operator would (SIGTERM, then SIGKILL after 5 s): a capture killed while it
    /// writes a checkpoint leaves a transaction open on the shared checkpoint topic, which every
    /// other capture's start then waits out (up to the writer's 60 s transaction timeout).
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = Command::new("kill")
                .args(["-TERM", &self.child.id().to_string()])
                .status();
            let deadline = Instant::now() + Duration::from_secs(5);
            while matches!(self.child.try_wait(), Ok(None)) && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Every event on `topic` (all partitions), waiting until `until` says the collection is
/// complete or `limit` passes. Events come grouped by partition, each partition in order.
pub fn read_events(
    topic: &str,
    limit: Duration,
    until: impl Fn(&BTreeMap<i32, Vec<ChangeEvent>>) -> bool,
) -> BTreeMap<i32, Vec<ChangeEvent>> {
    let consumer: BaseConsumer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", kafka_brokers())
        .set("group.id", unique("reader"))
        .set("enable.auto.commit", "false")
        .create()
        .unwrap();
    let mut by_partition: BTreeMap<i32, Vec<ChangeEvent>> = BTreeMap::new();
    let deadline = Instant::now() + limit;
    // Wait for the topic to exist.
    let partitions = loop {
        let md = consumer
            .fetch_metadata(Some(topic), Duration::from_secs(5))
            .unwrap();
        let t = &md.topics()[0];
        if t.error().is_none() && !t.partitions().is_empty() {
            break t.partitions().len() as i32;
        }
        if Instant::now() > deadline {
            return by_partition;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let mut tpl = TopicPartitionList::new();
    for p in 0..partitions {
        tpl.add_partition_offset(topic, p, Offset::Beginning)
            .unwrap();
    }
    consumer.assign(&tpl).unwrap();
    while !until(&by_partition) && Instant::now() < deadline {
        if let Some(m) = consumer.poll(Duration::from_millis(100)) {
            let m = m.unwrap();
            let ev = ChangeEvent::decode(m.payload().unwrap()).expect("a ChangeEvent");
            by_partition.entry(m.partition()).or_default().push(ev);
        }
    }
    by_partition
}

/// The row events (no DDL) of a collection, as one list.
pub fn row_events(by_partition: &BTreeMap<i32, Vec<ChangeEvent>>) -> Vec<ChangeEvent> {
    let mut all: Vec<ChangeEvent> = by_partition
        .values()
        .flatten()
        .filter(|e| e.key.is_some())
        .cloned()
        .collect();
    all.sort_by_key(|e| (e.version, e.transaction.as_ref().map(|t| t.index)));
    all
}

pub fn count_rows(by_partition: &BTreeMap<i32, Vec<ChangeEvent>>) -> usize {
    by_partition
        .values()
        .flatten()
        .filter(|e| e.key.is_some())
        .count()
}

/// The last checkpoint a connector stored (JSON), from the checkpoint topic (committed
/// transactions only, as the capture and `sluice status` read it).
pub fn last_checkpoint(connector: &str) -> Option<serde_json::Value> {
    let kafka = sluice_common::KafkaConfig {
        brokers: kafka_brokers(),
        ..Default::default()
    };
    sluice_capture::checkpoint::read_connectors(&kafka, "_sluice_checkpoints", "sluice-tests")
        .ok()?
        .remove(connector)
        .map(|s| serde_json::to_value(s.checkpoint).expect("checkpoints serialize"))
}

/// The sum of a metric's samples (every label set) at a process's /metrics; None when the
/// process does not serve it (yet).
pub fn metric_at(port: u16, name: &str) -> Option<f64> {
    let body = scrape(port)?;
    let values: Vec<f64> = body
        .lines()
        .filter(|l| {
            l.strip_prefix(name)
                .is_some_and(|rest| rest.starts_with('{') || rest.starts_with(' '))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .collect();
    (!values.is_empty()).then(|| values.iter().sum())
}

/// How many events of `topic` consumer group `group` has not committed: per partition, its
/// end minus the committed offset (its start when nothing is committed). Blocking.
pub fn group_lag(group: &str, topic: &str) -> i64 {
    let c: BaseConsumer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", kafka_brokers())
        .set("group.id", group)
        .create()
        .expect("consumer");
    let timeout = Duration::from_secs(10);
    let md = c.fetch_metadata(Some(topic), timeout).expect("metadata");
    let mut tpl = TopicPartitionList::new();
    for p in md.topics()[0].partitions() {
        tpl.add_partition(topic, p.id());
    }
    let committed = c
        .committed_offsets(tpl, timeout)
        .expect("committed offsets");
    committed
        .elements()
        .iter()
        .map(|e| {
            let (low, high) = c
                .fetch_watermarks(topic, e.partition(), timeout)
                .expect("watermarks");
            match e.offset() {
                Offset::Offset(at) => high - at,
                _ => high - low,
            }
        })
        .sum()
}

/// Wait until a capture's snapshot has published rows and has no table left.
pub async fn wait_snapshot_done(port: u16, limit: Duration) {
    let deadline = Instant::now() + limit;
    loop {
        let rows = metric_at(port, "sluice_capture_snapshot_rows_total");
        let left = metric_at(port, "sluice_capture_snapshot_tables_remaining");
        if rows.is_some_and(|r| r > 0.0) && left == Some(0.0) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "snapshot not finished after {limit:?}: {rows:?} rows, {left:?} tables left"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Wait until the capture counts a snapshot row it published (or has exited, or 20 s passed).
pub async fn first_snapshot_row(cap: &mut CaptureProcess) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while Instant::now() < deadline && !cap.exited() {
        if metric_at(cap.metrics_port, "sluice_capture_snapshot_rows_total")
            .is_some_and(|r| r > 0.0)
        {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Wait until the capture has stored a checkpoint (its first is the position it resolved at
/// start, stored before it reads a change).
pub async fn wait_first_checkpoint(cap: &CaptureProcess, limit: Duration) {
    let deadline = Instant::now() + limit;
    loop {
        let c = cap.connector.clone();
        if tokio::task::spawn_blocking(move || last_checkpoint(&c))
            .await
            .unwrap()
            .is_some()
        {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{} stored no checkpoint in {limit:?}",
            cap.connector
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Wait until the capture's stored checkpoint lists the initial snapshot as done (a restart
/// after that copies nothing, so the metrics would not tell).
pub async fn wait_initial_snapshot_stored(cap: &CaptureProcess, limit: Duration) {
    let deadline = Instant::now() + limit;
    loop {
        let c = cap.connector.clone();
        let stored = tokio::task::spawn_blocking(move || last_checkpoint(&c))
            .await
            .unwrap();
        let done = stored.as_ref().is_some_and(|c| {
            c["snapshots_done"]
                .as_array()
                .is_some_and(|d| d.iter().any(|s| s == "initial"))
        });
        if done {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the initial snapshot is not stored as done after {limit:?}: {stored:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Kill `cap` (-9) and start it again, 1 to 3 times, each at a seeded moment of the first
/// second after its snapshot's first row was counted (three times in four) or after its start.
/// Returns what was done, for the test to print.
pub async fn kill_in_first_second(cap: &mut CaptureProcess, rng: &mut crate::Rng) -> Vec<String> {
    let mut kills = Vec::new();
    for _ in 0..1 + rng.below(3) {
        let from_copy = rng.chance(75);
        if from_copy {
            first_snapshot_row(cap).await;
        }
        let after = Duration::from_millis(rng.below(1000));
        tokio::time::sleep(after).await;
        cap.kill();
        kills.push(format!(
            "{after:?} after {}",
            if from_copy {
                "the first snapshot row"
            } else {
                "the start"
            }
        ));
        cap.restart();
    }
    kills
}

/// Wait until the connector's stored checkpoint counts at least `at_least` snapshot rows
/// (as `count` reads them from the checkpoint's JSON); returns the count.
pub async fn wait_stored_snapshot_rows(
    connector: &str,
    at_least: u64,
    limit: Duration,
    count: impl Fn(&serde_json::Value) -> u64,
) -> u64 {
    let deadline = Instant::now() + limit;
    loop {
        let c = connector.to_string();
        let stored = tokio::task::spawn_blocking(move || last_checkpoint(&c))
            .await
            .unwrap();
        let n = stored.as_ref().map(&count).unwrap_or(0);
        if n >= at_least {
            return n;
        }
        assert!(
            Instant::now() < deadline,
            "no snapshot progress stored: {stored:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The dead letters of `topic` as (payload, `sluice.reason` header), read from the start until
/// `n` arrived or 30 s passed.
pub fn dead_letters(topic: &str, n: usize) -> Vec<(Vec<u8>, String)> {
    use rdkafka::consumer::{BaseConsumer, Consumer};
    use rdkafka::message::Headers;
    use rdkafka::Message;
    let consumer: BaseConsumer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", crate::kafka_brokers())
        .set("group.id", crate::unique("dlq-reader"))
        .set("auto.offset.reset", "earliest")
        .create()
        .expect("a consumer");
    consumer.subscribe(&[topic]).expect("subscribe");
    let mut out = Vec::new();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while out.len() < n && std::time::Instant::now() < deadline {
        if let Some(Ok(m)) = consumer.poll(Duration::from_millis(200)) {
            let reason = m
                .headers()
                .and_then(|h| h.iter().find(|h| h.key == "sluice.reason"))
                .and_then(|h| h.value.map(|v| String::from_utf8_lossy(v).into_owned()))
                .unwrap_or_default();
            out.push((m.payload().unwrap_or_default().to_vec(), reason));
        }
    }
    out
}

/// Run `sluice ARGS` against the test bed's Kafka: (exit code, stdout, stderr).
pub fn sluice(args: &[&str]) -> (Option<i32>, String, String) {
    let out = std::process::Command::new(crate::bin("sluice"))
        .args(args)
        .env("SLUICE_KAFKA_BROKERS", crate::kafka_brokers())
        .output()
        .expect("sluice runs");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `sluice verify --json` of the capture's and the apply stage's configs, as it ends: its exit
/// status, its output and its error output.
pub fn verify_exit(
    cap: &CaptureProcess,
    a: &CaptureProcess,
    extra: &[&str],
) -> (Option<i32>, String, String) {
    let mut args = vec![
        "verify",
        "--json",
        "--capture-config",
        cap.config_path().to_str().unwrap(),
        "--apply-config",
        a.config_path().to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    sluice(&args)
}

/// `sluice verify --json` of the capture's and the apply stage's configs (waiting up to 90 s
/// for the pipeline to settle): its exit status and its report.
pub fn verify(
    cap: &CaptureProcess,
    a: &CaptureProcess,
    extra: &[&str],
) -> (Option<i32>, serde_json::Value, String) {
    let mut args = vec!["--wait-secs", "90"];
    args.extend_from_slice(extra);
    let (code, out, err) = verify_exit(cap, a, &args);
    let report =
        serde_json::from_str(&out).unwrap_or_else(|e| panic!("sluice verify: {e}: {out}\n{err}"));
    (code, report, err)
}

impl CaptureProcess {
    /// An apply-clickhouse process reading the topics of `prefix` into ClickHouse database
    /// `ch_db` of `SLUICE_CLICKHOUSE_URL` (mirror tables, 200 ms batches), its dead letters
    /// into topic `dlq`.
    pub fn apply_clickhouse(prefix: &str, ch_db: &str, dlq: &str) -> Self {
        Self::apply_clickhouse_with(prefix, ch_db, dlq, "", "")
    }

    /// [`Self::apply_clickhouse`] in consumer group `group` (empty: a new one), with `extra`
    /// TOML (whole sections) after the configuration.
    pub fn apply_clickhouse_with(
        prefix: &str,
        ch_db: &str,
        dlq: &str,
        group: &str,
        extra: &str,
    ) -> Self {
        Self::apply_clickhouse_via(&crate::clickhouse_url(), prefix, ch_db, dlq, group, extra)
    }

    /// [`Self::apply_clickhouse_with`] writing to the ClickHouse server at `url`.
    pub fn apply_clickhouse_via(
        url: &str,
        prefix: &str,
        ch_db: &str,
        dlq: &str,
        group: &str,
        extra: &str,
    ) -> Self {
        let group = if group.is_empty() {
            crate::unique("g")
        } else {
            group.to_string()
        };
        // An `[errors]` section in `extra` joins the one made here.
        let (errors, extra) = match extra.split_once("[errors]\n") {
            Some((before, after)) => match after.split_once("\n[") {
                Some((section, rest)) => (section.to_string(), format!("{before}\n[{rest}")),
                None => (after.to_string(), before.to_string()),
            },
            None => (String::new(), extra.to_string()),
        };
        let config = format!(
            "[clickhouse]\nurl = \"{}\"\ndatabase = \"{ch_db}\"\n\
             [consumer]\ngroup_id = \"{}\"\ntopics = [\"^{}\\\\..*\"]\n\
             [batch]\nmax_wait_ms = 200\n[errors]\ndead_letter_topic = \"{dlq}\"\n{errors}\n\
             [kafka]\nbrokers = \"{}\"\n{extra}\n",
            url,
            group,
            prefix.replace('.', "\\\\."),
            kafka_brokers()
        );
        Self::spawn_binary("apply-clickhouse", (config, String::new(), String::new()))
    }
}

/// The answer to `sql` from `SLUICE_CLICKHOUSE_URL`, as TabSeparated text.
pub async fn clickhouse_tsv(sql: &str) -> clickhouse::error::Result<String> {
    let client = clickhouse::Client::default()
        .with_url(crate::clickhouse_url())
        .with_validation(false);
    let mut cursor = client.query(sql).fetch_bytes("TabSeparated")?;
    let mut out = Vec::new();
    while let Some(chunk) = cursor.next().await? {
        out.extend_from_slice(&chunk);
    }
    Ok(String::from_utf8_lossy(&out).into_owned())
}

/// A process's `/metrics` page (none while it does not answer).
pub fn scrape(port: u16) -> Option<String> {
    page(port, "/metrics")
}

/// A process's `/healthz` answer, status line included (none while it does not answer).
pub fn healthz(port: u16) -> Option<String> {
    page(port, "/healthz")
}

fn page(port: u16, path: &str) -> Option<String> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    s.write_all(format!("GET {path} HTTP/1.0\r\n\r\n").as_bytes())
        .ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    Some(out)
}
