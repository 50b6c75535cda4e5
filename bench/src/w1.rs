//! Reference workload W1 (MySQL binlog -> ClickHouse): the rows written, the sustained step
//! (the report's load generator with both stages running), and the test bed's server
//! processes whose CPU the steps count. `bench-w1` runs the steps.

use std::time::{Duration, Instant};

use mysql_async::prelude::Queryable;
use sluice_tests::{clickhouse_url, kafka_brokers, mysql_url, unique};

use crate::measure::spawn_stage;

/// INSERT of `n` W1 rows into `binlog_field_test_1` (ids from AUTO_INCREMENT), values derived
/// from `from..from + n`.
pub fn insert_sql(db: &str, from: u64, n: u64) -> String {
    insert_into(db, 1, from, n)
}

/// The same into `binlog_field_test_<table>`.
pub fn insert_into(db: &str, table: usize, from: u64, n: u64) -> String {
    let values: Vec<String> = (from..from + n)
        .map(|k| {
            format!(
                "('varchar value {k}','c','en2','set1,set3','11:22:33','2024-01-02',2024,\
                 '2024-01-02 03:04:05','2024-01-02 03:04:05',1.25,2.5,{}.25,'text {k}','blob',\
                 b'101',1,'m','l','t',{},{},{},{},{k})",
                k % 1_000_000,
                k % 256,
                k % 65536,
                k % 16_777_216,
                k % 4_294_967_296
            )
        })
        .collect();
    format!(
        "INSERT INTO `{db}`.binlog_field_test_{table} (testvarchar,testchar,testenum,testset,testtime,\
         testdate,testyear,testtimestamp,testdatetime,testfloat,testdouble,testdecimal,testtext,\
         testblob,testbit,testbool,testmediumblob,testlongblob,testtinyblob,\
         test_unsinged_tinyint,test_unsinged_smallint,test_unsinged_mediumint,\
         test_unsinged_int,test_unsinged_bigint) VALUES {}",
        values.join(",")
    )
}

/// The report's load generator (`insertDataTest`): `tables` W1 tables, one writer each,
/// inserting `batch` rows every `every_ms` ms, for `seconds`, while both stages run. A batch's
/// latency runs from MariaDB acknowledging its INSERT to ClickHouse counting its rows (every
/// table's count polled every 20 ms).
#[derive(Clone, Copy)]
pub struct Load {
    pub tables: usize,
    pub batch: u64,
    pub every_ms: u64,
    pub seconds: u64,
}

impl Load {
    /// Rows per second offered; 0 = as fast as the writers go (`--every-ms 0`).
    pub fn offered(&self) -> u64 {
        (self.tables as u64 * self.batch * 1000)
            .checked_div(self.every_ms)
            .unwrap_or(0)
    }
}

pub struct Sustained {
    pub load: Load,
    /// `[batch] max_wait_ms` of the applier (None: its default).
    pub max_wait_ms: Option<u64>,
    /// From the start of both stages (on an empty pipeline: no topic, no group, no target
    /// table yet) until ClickHouse showed the row inserted into each table right after it.
    pub first_row: f64,
    pub rows: u64,
    pub achieved: f64,
    /// CPU seconds of the ClickHouse server over the load (the test bed's, by its pid file;
    /// None for a server elsewhere).
    pub clickhouse_cpu: Option<f64>,
    /// Of those, what the benchmark's own count polls cost it (the polls over the load times
    /// the cost of one, measured before the load).
    pub clickhouse_poll_cpu: Option<f64>,
    pub polls: usize,
    /// Batches the applier wrote over the load (each one INSERT per table it holds).
    pub writes: f64,
    pub p50: f64,
    pub p99: f64,
    pub max: f64,
    pub capture_cpu: f64,
    pub apply_cpu: f64,
    pub capture_rss: f64,
    pub apply_rss: f64,
}

impl Sustained {
    /// ClickHouse's CPU seconds for the pipeline's writes: over the load, less the polls'.
    pub fn write_cpu(&self) -> Option<f64> {
        self.clickhouse_cpu
            .zip(self.clickhouse_poll_cpu)
            .map(|(c, p)| c - p)
    }

    /// What a run of the sustained step printed.
    pub fn line(&self) -> String {
        let e2e = self;
        format!(
            "Sustained end to end ({} tables x {} rows every {} ms, max_wait_ms {}): {} rows/s offered for {} s ({} rows): achieved {:.0} rows/s; \
             latency MariaDB commit -> visible in ClickHouse p50 {:.3} s, p99 {:.3} s, max {:.3} s; \
             CPU capture {:.1} s, apply {:.1} s, ClickHouse {} ({:.0} writes); peak RSS capture {:.1} MiB, apply {:.1} MiB; \
             first row visible {:.2} s after both stages started",
            e2e.load.tables,
            e2e.load.batch,
            e2e.load.every_ms,
            e2e.max_wait_ms.map_or("default".to_string(), |m| m.to_string()),
            e2e.load.offered(),
            e2e.load.seconds,
            e2e.rows,
            e2e.achieved,
            e2e.p50,
            e2e.p99,
            e2e.max,
            e2e.capture_cpu,
            e2e.apply_cpu,
            match (e2e.clickhouse_cpu, e2e.clickhouse_poll_cpu) {
                (Some(c), Some(p)) => format!(
                    "{:.1} s for the writes ({c:.1} s in all, less {p:.1} s answering the benchmark's {} count polls)",
                    c - p,
                    e2e.polls
                ),
                _ => "not measured (not the test bed's)".to_string(),
            },
            e2e.writes,
            e2e.capture_rss / 1048576.0,
            e2e.apply_rss / 1048576.0,
            e2e.first_row,
        )
    }

    pub fn json(&self) -> serde_json::Value {
        let e2e = self;
        serde_json::json!({
            "tables": e2e.load.tables,
            "batch_rows": e2e.load.batch,
            "every_ms": e2e.load.every_ms,
            "max_wait_ms": e2e.max_wait_ms,
            "offered_rows_per_second": e2e.load.offered(),
            "seconds": e2e.load.seconds,
            "rows": e2e.rows,
            "achieved_rows_per_second": e2e.achieved,
            "latency_p50_seconds": e2e.p50,
            "latency_p99_seconds": e2e.p99,
            "latency_max_seconds": e2e.max,
            "capture_cpu_seconds": e2e.capture_cpu,
            "apply_cpu_seconds": e2e.apply_cpu,
            "clickhouse_cpu_seconds": e2e.clickhouse_cpu,
            "clickhouse_poll_cpu_seconds": e2e.clickhouse_poll_cpu,
            "polls": e2e.polls,
            "clickhouse_write_cpu_seconds": e2e.write_cpu(),
            "clickhouse_write_cpu_seconds_per_million_rows": e2e.write_cpu().map(|c| c / e2e.rows as f64 * 1e6),
            "writes": e2e.writes,
            "capture_peak_rss_bytes": e2e.capture_rss,
            "apply_peak_rss_bytes": e2e.apply_rss,
            "first_row_seconds": e2e.first_row,
        })
    }
}

pub async fn sustained(
    release: &std::path::Path,
    load: Load,
    max_wait_ms: Option<u64>,
) -> anyhow::Result<Sustained> {
    let db = unique("sluice_bench_e2e");
    let ch_db = format!("{db}_mirror");
    let prefix = unique("bench_e2e");
    let mut c = mysql_async::Conn::new(mysql_async::Opts::from_url(&mysql_url())?).await?;
    c.query_drop(format!("CREATE DATABASE `{db}`")).await?;
    let ddl = sluice_tests::w1_create_table(&db);
    for t in 1..=load.tables {
        c.query_drop(ddl.replace("binlog_field_test_1", &format!("binlog_field_test_{t}")))
            .await?;
    }
    let ch = clickhouse::Client::default()
        .with_url(clickhouse_url())
        .with_validation(false);
    ch.query(&format!("CREATE DATABASE {ch_db}"))
        .execute()
        .await?;
    // The capture starts where the binlog is now, so that the rows inserted right after its
    // start are read however long its start takes.
    let version: String = c.query_first("SELECT @@version").await?.unwrap_or_default();
    let status: mysql_async::Row = c
        .query_first(sluice_capture::mysql::binlog_status_sql(&version))
        .await?
        .ok_or_else(|| anyhow::anyhow!("no binlog position"))?;
    let (file, pos): (String, u64) = (
        status.get(0).unwrap_or_default(),
        status.get(1).unwrap_or_default(),
    );
    let batch = match max_wait_ms {
        Some(ms) => format!("[batch]\nmax_wait_ms = {ms}\n"),
        None => String::new(),
    };
    let started = Instant::now();
    let (capture, _, _cf) = spawn_stage(
        &release.join("capture-mysql"),
        &format!(
            "connector = \"{prefix}\"\n[mysql]\nssl_mode = \"disabled\"\nurl = \"{}\"\nstart = \"{file}:{pos}\"\nserver_id = {}\n\
             [filter]\ninclude = [\"{db}\\\\..*\"]\n[topics]\nprefix = \"{prefix}\"\n\
             [publish]\npartitions = 6\nreplication_factor = 1\n[kafka]\nbrokers = \"{}\"\n",
            mysql_url(),
            sluice_tests::replica_server_id(),
            kafka_brokers()
        ),
    )?;
    let (apply, apply_port, _af) = spawn_stage(
        &release.join("apply-clickhouse"),
        &format!(
            "[clickhouse]\nurl = \"{}\"\ndatabase = \"{ch_db}\"\n[consumer]\ngroup_id = \"{prefix}\"\n\
             topics = [\"^{prefix}\\\\..*\"]\n{batch}[kafka]\nbrokers = \"{}\"\n",
            clickhouse_url(),
            kafka_brokers()
        ),
    )?;
    // Every table's row count in one query, from the parts' row counts: metadata only.
    // (`count()` on ClickHouse 18.16 reads a column of every part: polled every 20 ms it cost
    // the server more CPU than the pipeline's writes. Every row is inserted once here, so
    // merges drop none and the parts' rows are the table's.)
    let counts_sql = format!(
        "SELECT toUInt8(substring(table, {})) AS t, sum(rows) AS n FROM system.parts \
         WHERE database = '{ch_db}' AND active AND table LIKE 'binlog\\_field\\_test\\_%' GROUP BY table",
        "binlog_field_test_".len() + 1
    );
    let counts = |ch: clickhouse::Client, sql: String, tables: usize| async move {
        #[derive(clickhouse::Row, serde::Deserialize)]
        struct Count {
            t: u8,
            n: u64,
        }
        let mut out = vec![0u64; tables];
        if let Ok(rows) = ch.query(&sql).fetch_all::<Count>().await {
            for r in rows {
                out[r.t as usize - 1] = r.n;
            }
        }
        out
    };
    // The first rows: one per table, inserted as the stages start, through the whole pipeline
    // (the topics made, the group joined, the target tables created): the start-up path.
    for t in 1..=load.tables {
        c.query_drop(insert_into(&db, t, 0, 1)).await?;
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    while counts(ch.clone(), counts_sql.clone(), load.tables)
        .await
        .iter()
        .any(|n| *n < 1)
    {
        anyhow::ensure!(Instant::now() < deadline, "the first rows never arrived");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let first_row = started.elapsed().as_secs_f64();
    let ch_pid = clickhouse_pid();
    // What one count poll costs ClickHouse (the benchmark's own query, not the pipeline's
    // work): 100 of them, back to back, before the load.
    let ch_cpu = || ch_pid.and_then(|p| crate::measure::cpu_seconds(p).ok());
    let per_poll = {
        let before = ch_cpu();
        for _ in 0..100 {
            counts(ch.clone(), counts_sql.clone(), load.tables).await;
        }
        before.zip(ch_cpu()).map(|(a, b)| (b - a) / 100.0)
    };
    let mut polls = 0usize;
    let ch_cpu0 = ch_cpu();
    let writes = || {
        crate::measure::scrape(apply_port)
            .map(|b| crate::measure::metric(&b, "sluice_apply_batch_rows_count"))
            .unwrap_or(0.0)
    };
    let writes0 = writes();
    // The watcher: (time, rows visible per table) every 20 ms.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let watcher = {
        let (ch, sql, stop) = (ch.clone(), counts_sql.clone(), stop.clone());
        tokio::spawn(async move {
            let mut seen = Vec::new();
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let n = counts(ch.clone(), sql.clone(), load.tables).await;
                seen.push((Instant::now(), n));
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            seen
        })
    };
    // As fast as possible: as many batches as 10 ms apart would make.
    let batches = load.seconds * 1000 / load.every_ms.max(10);
    let started = Instant::now();
    let mut writers = Vec::new();
    for t in 1..=load.tables {
        let db = db.clone();
        writers.push(tokio::spawn(async move {
            let mut c = mysql_async::Conn::new(mysql_async::Opts::from_url(&mysql_url())?).await?;
            // --every-ms 0: as fast as the writer goes.
            let mut ticker = tokio::time::interval(Duration::from_millis(load.every_ms.max(1)));
            ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
            let mut acked = Vec::with_capacity(batches as usize);
            for k in 0..batches {
                if load.every_ms > 0 {
                    ticker.tick().await;
                }
                c.query_drop(insert_into(&db, t, 1 + k * load.batch, load.batch))
                    .await?;
                acked.push(Instant::now());
            }
            anyhow::Ok(acked)
        }));
    }
    let acked = crate::measure::join_writers(writers).await?;
    let per_table = 1 + batches * load.batch;
    let deadline = Instant::now() + Duration::from_secs(180);
    while counts(ch.clone(), counts_sql.clone(), load.tables)
        .await
        .iter()
        .any(|n| *n < per_table)
    {
        polls += 1;
        anyhow::ensure!(Instant::now() < deadline, "the pipeline never caught up");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let ch_cpu1 = ch_cpu();
    let writes = writes() - writes0;
    tokio::time::sleep(Duration::from_millis(50)).await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let seen = watcher.await?;
    // (1 + the polls of the wait above: every query the benchmark sent over the load)
    let polls = polls + 1 + seen.len();
    let l = crate::measure::latencies(&acked, &seen, load.batch);
    let rows = batches * load.batch * load.tables as u64;
    let [(capture_cpu, capture_rss), (apply_cpu, apply_rss)] =
        crate::measure::usage_and_stop(capture, apply)?;
    let result = Sustained {
        load,
        max_wait_ms,
        first_row,
        rows,
        clickhouse_cpu: ch_cpu0.zip(ch_cpu1).map(|(a, b)| b - a),
        clickhouse_poll_cpu: per_poll.map(|p| p * polls as f64),
        polls,
        writes,
        achieved: rows as f64 / l.all_visible.duration_since(started).as_secs_f64(),
        p50: l.p50,
        p99: l.p99,
        max: l.max,
        capture_cpu,
        apply_cpu,
        capture_rss,
        apply_rss,
    };
    c.query_drop(format!("DROP DATABASE `{db}`")).await?;
    ch.query(&format!("DROP DATABASE {ch_db}"))
        .execute()
        .await?;
    Ok(result)
}

/// One `sluice verify` run and what it cost.
pub struct VerifyRun {
    pub wall: f64,
    pub sluice_cpu: f64,
    pub mariadb_cpu: f64,
    pub clickhouse_cpu: f64,
}

/// The test bed's ClickHouse server process when the benchmark writes to it (for its CPU).
pub fn clickhouse_pid() -> Option<u32> {
    let url = clickhouse_url();
    let file = if url.ends_with(":18124") {
        "clickhouse-current/pid"
    } else if url.ends_with(":18123") {
        "clickhouse/pid"
    } else {
        return None;
    };
    server_pid(file).ok()
}

/// A test bed server's process (`deploy/testbed.sh`), by the pid file it keeps.
pub fn server_pid(file: &str) -> anyhow::Result<u32> {
    let dir =
        std::env::var("SLUICE_TESTBED_DIR").unwrap_or_else(|_| "/var/tmp/sluice-testbed".into());
    let path = format!("{dir}/{file}");
    Ok(std::fs::read_to_string(&path)
        .map_err(|e| anyhow::anyhow!("{path}: {e} (is the test bed running?)"))?
        .trim()
        .parse()?)
}

/// Run `sluice verify` once (it must find the mirror equal), with the CPU of the servers.
pub fn verify_run(
    release: &std::path::Path,
    capture: &std::path::Path,
    apply: &std::path::Path,
    rows: u64,
    parallel: u64,
) -> anyhow::Result<VerifyRun> {
    let mariadb = server_pid("mariadb/data/mariadbd.pid")?;
    let ch_file = if clickhouse_url().ends_with(":18124") {
        "clickhouse-current/pid"
    } else {
        "clickhouse/pid"
    };
    let clickhouse = server_pid(ch_file)?;
    let (m0, c0) = (
        crate::measure::cpu_seconds(mariadb)?,
        crate::measure::cpu_seconds(clickhouse)?,
    );
    let t0 = Instant::now();
    // The shell's children's CPU (cutime + cstime) once sluice has exited: sluice's own.
    let script = format!(
        "{} verify --quiet --json --parallel {parallel} --capture-config {} --apply-config {} \
         > \"$0\"; rc=$?; cat /proc/$$/stat; exit $rc",
        release.join("sluice").display(),
        capture.display(),
        apply.display()
    );
    let report = tempfile::NamedTempFile::new()?;
    let out = std::process::Command::new("sh")
        .args(["-c", &script, report.path().to_str().unwrap()])
        .output()?;
    let wall = t0.elapsed().as_secs_f64();
    let (m1, c1) = (
        crate::measure::cpu_seconds(mariadb)?,
        crate::measure::cpu_seconds(clickhouse)?,
    );
    let text = std::fs::read_to_string(report.path())?;
    anyhow::ensure!(
        out.status.success(),
        "sluice verify did not find the mirror equal: {text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let verified: serde_json::Value = serde_json::from_str(&text)?;
    anyhow::ensure!(
        verified["rows"] == rows,
        "sluice verify read {} rows",
        verified["rows"]
    );
    let stat = String::from_utf8_lossy(&out.stdout);
    let rest = &stat[stat.rfind(')').ok_or_else(|| anyhow::anyhow!("bad stat"))? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: f64 = f[13].parse::<f64>()? + f[14].parse::<f64>()?;
    Ok(VerifyRun {
        wall,
        sluice_cpu: ticks / 100.0,
        mariadb_cpu: m1 - m0,
        clickhouse_cpu: c1 - c0,
    })
}
