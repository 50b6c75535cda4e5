//! Benchmark: a source of many tables.
//!
//!     deploy/testbed.sh start && cargo build --release --bins
//!     target/release/bench-tables [--tables 1000] [--rate 10] [--seconds 60] [--only per-table|one]
//!         [--topics-at-start]
//!
//! MariaDB gets `--tables` small tables (`id BIGINT PRIMARY KEY, v INT, s VARCHAR(40)`);
//! capture-mysql and two apply-clickhouse instances of one group start; a writer changes
//! `--rate` rows per table per second (each 100 ms, a tenth of the tables get a 10-row INSERT or,
//! once a table has rows, an UPDATE of 10 of them) for `--seconds`. Two topic layouts, one after
//! the other (`--only` picks one):
//!
//! - `per-table`: the default template `{prefix}.{db}.{table}`, 2 partitions per topic (with
//!   one, the range assignor would give every topic's only partition to the same instance);
//! - `one`: `{prefix}.{db}`, every table on one topic of 6 partitions.
//!
//! `--topics-at-start` sets `publish.topics_at_start` (every table's topic made at the capture's
//! start, in one request). Figures per layout: start-up (the stages started until every table has its first row in
//! ClickHouse, tables and topics made on the way), events/s published and rows/s written over
//! the sustained window, each stage's CPU (share of one core over the window) and peak memory
//! (VmHWM), ClickHouse's CPU over the window (the test bed's server, by its pid file), and
//! catch-up (the writer stopped until every row is in ClickHouse). Then every table's row count
//! and sum of `v` are checked against MariaDB: a fast wrong run cannot report.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use mysql_async::prelude::Queryable;
use sluice_bench::measure::{cpu_seconds, metric, peak_rss, scrape};
use sluice_tests::{clickhouse_url, kafka_brokers, mysql_url, unique};

/// The three stages; killed if the benchmark ends early.
struct Stages([std::process::Child; 3]);

/// Start a stage with `config` (metrics on a free port, logs at info into `log`).
fn stage(
    binary: &std::path::Path,
    config: &str,
    log: &std::path::Path,
) -> anyhow::Result<(std::process::Child, u16, tempfile::NamedTempFile)> {
    let port = sluice_tests::free_port();
    let file = tempfile::NamedTempFile::new()?;
    std::fs::write(
        file.path(),
        format!("{config}\n[metrics]\nlisten = \"127.0.0.1:{port}\"\n"),
    )?;
    let child = std::process::Command::new(binary)
        .args(["-c", file.path().to_str().unwrap()])
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(log)?)
        .spawn()?;
    Ok((child, port, file))
}

impl Stages {
    /// Fail when a stage has exited.
    fn check(&mut self, logs: &std::path::Path) -> anyhow::Result<()> {
        for (c, name) in self
            .0
            .iter_mut()
            .zip(["capture-mysql", "apply a", "apply b"])
        {
            if let Some(status) = c.try_wait()? {
                anyhow::bail!("{name} exited ({status}); logs in {}", logs.display());
            }
        }
        Ok(())
    }

    /// SIGTERM each, and wait.
    fn stop(&mut self) {
        for c in self.0.iter_mut() {
            let _ = std::process::Command::new("kill")
                .args(["-TERM", &c.id().to_string()])
                .status();
            let _ = c.wait();
        }
    }
}

impl Drop for Stages {
    fn drop(&mut self) {
        for c in self.0.iter_mut() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

struct Figures {
    layout: &'static str,
    startup: f64,
    events_per_s: f64,
    rows_per_s: f64,
    cpu: [f64; 3],
    peak: [f64; 3],
    clickhouse_cpu: Option<f64>,
    catch_up: f64,
}

/// The test bed's ClickHouse server process (for its CPU), when the target is the test bed's.
fn clickhouse_pid() -> Option<u32> {
    if clickhouse_url() != "http://127.0.0.1:18123" {
        return None;
    }
    let dir = std::env::var("SLUICE_TESTBED_DIR").unwrap_or("/var/tmp/sluice-testbed".into());
    std::fs::read_to_string(format!("{dir}/clickhouse/pid"))
        .ok()?
        .trim()
        .parse()
        .ok()
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = sluice_bench::measure::Args::from_env(
        "bench-tables [--tables N] [--rate R] [--seconds S] [--only per-table|one] \
         [--topics-at-start]",
        &["--tables", "--rate", "--seconds", "--only"],
        &["--topics-at-start"],
        false,
    );
    let tables = args.option("--tables", 1000)?.max(1);
    let rate = args.option("--rate", 10)?.max(1);
    let seconds = args.option("--seconds", 60)?.max(5);
    let only = std::env::args()
        .skip_while(|a| a != "--only")
        .nth(1)
        .unwrap_or_default();
    let release = sluice_bench::measure::release_dir(&["capture-mysql", "apply-clickhouse"])?;
    let mut results = Vec::new();
    for layout in ["per-table", "one"] {
        if !only.is_empty() && only != layout {
            continue;
        }
        results.push(run(&release, layout, tables, rate, seconds).await?);
    }
    let m = sluice_bench::measure::machine();
    println!(
        "\n{tables} tables, {rate} rows changed per table per second ({} rows/s offered) for \
         {seconds} s; one capture-mysql, two apply-clickhouse; {} cores ({}), {:.0} GiB, MariaDB, \
         Kafka and ClickHouse {} on the same machine; checked: every table's rows equal the source\n",
        tables * rate,
        m.cores,
        m.cpu,
        m.memory_gib,
        if clickhouse_pid().is_some() { "18.16" } else { "(SLUICE_CLICKHOUSE_URL)" },
    );
    println!(
        "| topics | start-up, s | events/s | rows/s written | capture CPU | apply CPU (each) | \
         ClickHouse CPU | capture peak | apply peak (each) | catch-up, s |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|");
    for f in &results {
        println!(
            "| {} | {:.1} | {:.0} | {:.0} | {:.0} % | {:.0} % / {:.0} % | {} | {:.0} MiB | {:.0} / {:.0} MiB | {:.1} |",
            f.layout,
            f.startup,
            f.events_per_s,
            f.rows_per_s,
            f.cpu[0] * 100.0,
            f.cpu[1] * 100.0,
            f.cpu[2] * 100.0,
            f.clickhouse_cpu
                .map(|c| format!("{:.0} %", c * 100.0))
                .unwrap_or_else(|| "-".into()),
            f.peak[0] / 1048576.0,
            f.peak[1] / 1048576.0,
            f.peak[2] / 1048576.0,
            f.catch_up,
        );
    }
    Ok(())
}

async fn run(
    release: &std::path::Path,
    layout: &'static str,
    tables: u64,
    rate: u64,
    seconds: u64,
) -> anyhow::Result<Figures> {
    let db = unique("sluice_tables");
    let ch_db = format!("{db}_m");
    let mut c = mysql_async::Conn::new(mysql_async::Opts::from_url(&mysql_url())?).await?;
    c.query_drop(format!("CREATE DATABASE `{db}`")).await?;
    eprintln!("{layout}: creating {tables} tables");
    for chunk in (0..tables).collect::<Vec<_>>().chunks(100) {
        let sql: Vec<String> = chunk
            .iter()
            .map(|i| {
                format!(
                    "CREATE TABLE `{db}`.t{i} (id BIGINT PRIMARY KEY, v INT NOT NULL, \
                     s VARCHAR(40) NOT NULL)"
                )
            })
            .collect();
        c.query_drop(sql.join(";")).await?;
    }
    let ch = clickhouse::Client::default()
        .with_url(clickhouse_url())
        .with_validation(false);
    ch.query(&format!("CREATE DATABASE {ch_db}"))
        .execute()
        .await?;
    let prefix = unique("tables");
    let (template, partitions) = match layout {
        "per-table" => ("{prefix}.{db}.{table}", 2),
        _ => ("{prefix}.{db}", 6),
    };
    // From the binlog's end now: the rows written once the stages are up are all captured.
    let start = sluice_tests::capture::binlog_end().await;
    let at_start = std::env::args().any(|a| a == "--topics-at-start");
    let capture_config = format!(
        "connector = \"{prefix}\"\n[mysql]\nssl_mode = \"disabled\"\nurl = \"{}\"\nstart = \"{start}\"\n\
         server_id = {}\n[filter]\ninclude = [\"{db}\\\\..*\"]\n[topics]\nprefix = \"{prefix}\"\n\
         template = \"{template}\"\n[publish]\npartitions = {partitions}\nreplication_factor = 1\n\
         topics_at_start = {at_start}\n\
         [kafka]\nbrokers = \"{}\"\n",
        mysql_url(),
        sluice_tests::replica_server_id(),
        kafka_brokers(),
    );
    let group = unique("tables_group");
    let apply_config = |member: &str| {
        format!(
            "[clickhouse]\nurl = \"{}\"\ndatabase = \"{ch_db}\"\n\
             [consumer]\ngroup_id = \"{group}\"\ninstance_id = \"{group}-{member}\"\n\
             topics = [\"^{}\\\\..*\"]\n[kafka]\nbrokers = \"{}\"\n",
            clickhouse_url(),
            prefix.replace('.', "\\\\."),
            kafka_brokers()
        )
    };

    // Start-up: the stages started, one row per table written, until every table has it.
    let started = Instant::now();
    let logs = std::env::temp_dir().join(format!("bench-tables-{layout}"));
    std::fs::create_dir_all(&logs)?;
    let (capture, cap_port, _cap_file) = stage(
        &release.join("capture-mysql"),
        &capture_config,
        &logs.join("capture-mysql.log"),
    )?;
    let apply = release.join("apply-clickhouse");
    let (a, a_port, _a_file) = stage(&apply, &apply_config("a"), &logs.join("apply-a.log"))?;
    let (b, b_port, _b_file) = stage(&apply, &apply_config("b"), &logs.join("apply-b.log"))?;
    eprintln!("{layout}: the stages' logs are in {}", logs.display());
    let mut children = Stages([capture, a, b]);
    while scrape(cap_port).is_none() {
        anyhow::ensure!(
            started.elapsed() < Duration::from_secs(60),
            "capture-mysql not up"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for chunk in (0..tables).collect::<Vec<_>>().chunks(200) {
        let sql: Vec<String> = chunk
            .iter()
            .map(|i| format!("INSERT INTO `{db}`.t{i} VALUES (0, 0, 's')"))
            .collect();
        c.query_drop(sql.join(";")).await?;
    }
    let rows_written = |ports: [u16; 2]| {
        ports
            .iter()
            .map(|p| {
                scrape(*p)
                    .map(|b| metric(&b, "sluice_apply_rows_total"))
                    .unwrap_or(0.0)
            })
            .sum::<f64>()
    };
    loop {
        if rows_written([a_port, b_port]) >= tables as f64 {
            break;
        }
        for ch in children.0.iter_mut() {
            if let Some(s) = ch.try_wait()? {
                anyhow::bail!("a stage exited during start-up: {s}");
            }
        }
        anyhow::ensure!(
            started.elapsed() < Duration::from_secs(600),
            "{layout}: not every table's first row after 10 minutes"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let startup = started.elapsed().as_secs_f64();
    eprintln!("{layout}: start-up {startup:.1} s");

    // The sustained load.
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let (stop, db) = (stop.clone(), db.clone());
        tokio::spawn(async move {
            let mut c = mysql_async::Conn::new(mysql_async::Opts::from_url(&mysql_url())?).await?;
            let mut tick = tokio::time::interval(Duration::from_millis(100));
            let mut round = 0u64;
            let mut next_id = vec![1u64; tables as usize];
            let per_tick = tables.div_ceil(10);
            let batch = rate; // rows per table per second, in one statement each second
            while !stop.load(Ordering::SeqCst) {
                tick.tick().await;
                let from = (round % 10) * per_tick;
                let mut sql = Vec::new();
                for i in from..(from + per_tick).min(tables) {
                    let n = &mut next_id[i as usize];
                    // Inserts at first, then updates of the rows there (both are changes).
                    if *n <= 5 * batch {
                        let values: Vec<String> = (*n..*n + batch)
                            .map(|id| format!("({id}, {}, 's{id}')", id % 1000))
                            .collect();
                        sql.push(format!(
                            "INSERT INTO `{db}`.t{i} VALUES {}",
                            values.join(",")
                        ));
                        *n += batch;
                    } else {
                        let lo = 1 + (round / 10 * batch) % (5 * batch);
                        sql.push(format!(
                            "UPDATE `{db}`.t{i} SET v = v + 1 WHERE id >= {lo} AND id < {}",
                            lo + batch
                        ));
                    }
                }
                if !sql.is_empty() {
                    c.query_drop(sql.join(";")).await?;
                }
                round += 1;
            }
            anyhow::Ok(())
        })
    };
    // Measure after a few seconds of warm-up.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let pids: Vec<u32> = children.0.iter().map(|c| c.id()).collect();
    let ch_pid = clickhouse_pid();
    let cpu0: Vec<f64> = pids
        .iter()
        .map(|p| cpu_seconds(*p).unwrap_or(0.0))
        .collect();
    let ch0 = ch_pid.and_then(|p| cpu_seconds(p).ok());
    let events0 = scrape(cap_port)
        .map(|b| metric(&b, "sluice_capture_events_total"))
        .unwrap_or(0.0);
    let rows0 = rows_written([a_port, b_port]);
    let t0 = Instant::now();
    tokio::time::sleep(Duration::from_secs(seconds)).await;
    let window = t0.elapsed().as_secs_f64();
    let cpu: Vec<f64> = pids
        .iter()
        .zip(&cpu0)
        .map(|(p, c0)| (cpu_seconds(*p).unwrap_or(0.0) - c0) / window)
        .collect();
    let clickhouse_cpu = match (ch_pid, ch0) {
        (Some(p), Some(c0)) => cpu_seconds(p).ok().map(|c| (c - c0) / window),
        _ => None,
    };
    let events_per_s = (scrape(cap_port)
        .map(|b| metric(&b, "sluice_capture_events_total"))
        .unwrap_or(0.0)
        - events0)
        / window;
    let rows_per_s = (rows_written([a_port, b_port]) - rows0) / window;
    stop.store(true, Ordering::SeqCst);
    writer.await??;
    let stopped = Instant::now();
    children.check(&logs)?;

    // Catch-up, then the check: every table's count and sum of v equal the source's.
    let mut source: Vec<(String, u64, i64)> = Vec::new();
    for chunk in (0..tables).collect::<Vec<_>>().chunks(200) {
        let sql: Vec<String> = chunk
            .iter()
            .map(|i| {
                format!(
                    "SELECT 't{i}', COUNT(*), CAST(COALESCE(SUM(v), 0) AS SIGNED) FROM `{db}`.t{i}"
                )
            })
            .collect();
        let got: Vec<(String, u64, i64)> = c.query(sql.join(" UNION ALL ")).await?;
        source.extend(got);
    }
    source.sort();
    let deadline = Instant::now() + Duration::from_secs(900);
    let catch_up = loop {
        let mut target: Vec<(String, u64, i64)> = Vec::new();
        for chunk in (0..tables).collect::<Vec<_>>().chunks(100) {
            let sql: Vec<String> = chunk
                .iter()
                .map(|i| {
                    format!(
                        "SELECT 't{i}', count(), toInt64(sum(v)) FROM {ch_db}.t{i} FINAL \
                         WHERE _deleted = 0"
                    )
                })
                .collect();
            let got = ch
                .query(&sql.join(" UNION ALL "))
                .fetch_all::<(String, u64, i64)>()
                .await
                .unwrap_or_default();
            target.extend(got);
        }
        target.sort();
        if target == source {
            break stopped.elapsed().as_secs_f64();
        }
        children.check(&logs)?;
        anyhow::ensure!(
            Instant::now() < deadline,
            "{layout}: the target differs from the source 15 minutes after the load stopped \
             (first difference: {:?})",
            source
                .iter()
                .zip(
                    target
                        .iter()
                        .chain(std::iter::repeat(&(String::new(), 0, 0)))
                )
                .find(|(s, t)| s != t)
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    let peak: Vec<f64> = pids.iter().map(|p| peak_rss(*p).unwrap_or(0.0)).collect();
    children.stop();
    drop(children);
    c.query_drop(format!("DROP DATABASE `{db}`")).await?;
    ch.query(&format!("DROP DATABASE {ch_db}"))
        .execute()
        .await?;
    eprintln!("{layout}: done");
    Ok(Figures {
        layout: if layout == "one" {
            "one topic ({prefix}.{db}, 6 partitions)"
        } else {
            "one per table (2 partitions each)"
        },
        startup,
        events_per_s,
        rows_per_s,
        cpu: [cpu[0], cpu[1], cpu[2]],
        peak: [peak[0], peak[1], peak[2]],
        clickhouse_cpu,
        catch_up,
    })
}
