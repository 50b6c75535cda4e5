//! Benchmark of reference workload W1 (MySQL binlog -> ClickHouse), stage by stage.
//!
//!     deploy/testbed.sh start && cargo build --release --bins
//!     cargo run --release -p sluice-tests --bin bench-w1 -- [ROWS]
//!
//! 1. Writes ROWS (default 1 000 000) rows of the W1 all-types table into MariaDB, the pipeline
//!    stopped.
//! 2. Capture catch-up: starts the release `capture-mysql` at the position before them and
//!    measures until Kafka acknowledged every row.
//! 3. Apply drain: with the whole backlog in Kafka, starts the release `apply-clickhouse`
//!    (mirror mode) and measures until ClickHouse acknowledged every row.
//! 4. Checks the result: row count and a checksum of the mirror equal the source's, so a fast
//!    wrong run cannot report.
//!
//! For each stage: wall time, rows/s, CPU seconds of the process (from /proc), rows per CPU
//! second and peak resident memory. Prints a table and writes `target/bench/w1.json`.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use mysql_async::prelude::Queryable;
use sluice_tests::{clickhouse_url, free_port, kafka_brokers, mysql_url, unique};

fn metric(body: &str, name: &str) -> f64 {
    body.lines()
        .filter(|l| l.starts_with(name) && !l.starts_with('#'))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

fn scrape(port: u16) -> Option<String> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.write_all(b"GET /metrics HTTP/1.0\r\n\r\n").ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    Some(out)
}

/// User + system CPU seconds of a process, from /proc (the process collector's metric is
/// rounded to whole seconds).
fn cpu_seconds(pid: u32) -> anyhow::Result<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    let rest = &stat[stat.rfind(')').ok_or_else(|| anyhow::anyhow!("bad stat"))? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: f64 = f[11].parse::<f64>()? + f[12].parse::<f64>()?;
    Ok(ticks / 100.0)
}

/// Peak resident memory of a process (VmHWM), in bytes.
fn peak_rss(pid: u32) -> anyhow::Result<f64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let kb: f64 = status
        .lines()
        .find(|l| l.starts_with("VmHWM:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .ok_or_else(|| anyhow::anyhow!("no VmHWM"))?
        .parse()?;
    Ok(kb * 1024.0)
}

struct Stage {
    name: &'static str,
    wall: f64,
    cpu: f64,
    rss: f64,
}

/// Run `binary` with `config` until its `counter` metric reaches `rows`.
async fn measure(
    name: &'static str,
    binary: &std::path::Path,
    config: String,
    counter: &str,
    rows: u64,
) -> anyhow::Result<(Stage, Child)> {
    let port = free_port();
    let file = tempfile::NamedTempFile::new()?;
    std::fs::write(
        file.path(),
        format!("{config}\n[metrics]\nlisten = \"127.0.0.1:{port}\"\n[log]\nlevel = \"warn\"\n"),
    )?;
    let start = Instant::now();
    let mut child = Command::new(binary)
        .args(["-c", file.path().to_str().unwrap()])
        .stdout(Stdio::null())
        .spawn()?;
    loop {
        tokio::time::sleep(Duration::from_millis(100)).await;
        if let Some(status) = child.try_wait()? {
            anyhow::bail!("{name} exited early: {status}");
        }
        let Some(body) = scrape(port) else { continue };
        if metric(&body, counter) >= rows as f64 {
            let stage = Stage {
                name,
                wall: start.elapsed().as_secs_f64(),
                cpu: cpu_seconds(child.id())?,
                rss: peak_rss(child.id())?,
            };
            // Keep the file alive until the process has read it (it has, by now).
            drop(file);
            return Ok((stage, child));
        }
        anyhow::ensure!(
            start.elapsed() < Duration::from_secs(1800),
            "{name} not done after 30 minutes"
        );
    }
}

fn stop(mut child: Child) {
    let _ = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status();
    let _ = child.wait();
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let rows: u64 = std::env::args()
        .nth(1)
        .map(|a| a.parse())
        .transpose()?
        .unwrap_or(1_000_000);
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let release = root.join("target/release");
    for b in ["capture-mysql", "apply-clickhouse"] {
        anyhow::ensure!(
            release.join(b).exists(),
            "{} is missing: run `cargo build --release --bins` first",
            release.join(b).display()
        );
    }
    let db = unique("sluice_bench");
    let mut c = mysql_async::Conn::new(mysql_async::Opts::from_url(&mysql_url())?).await?;
    let ddl = std::fs::read_to_string(root.join("deploy/workloads/w1.mysql.sql"))?.replace(
        "`binlog_field_test_1`",
        &format!("`{db}`.`binlog_field_test_1`"),
    );
    c.query_drop(format!("CREATE DATABASE `{db}`")).await?;
    c.query_drop(ddl).await?;
    let status: mysql_async::Row = c.query_first("SHOW MASTER STATUS").await?.unwrap();
    let (file, pos): (String, u64) = (status.get(0).unwrap(), status.get(1).unwrap());

    eprintln!("1/4 writing {rows} rows of the W1 table into {db} ...");
    let t0 = Instant::now();
    let mut written = 0;
    while written < rows {
        let n = 1000.min(rows - written);
        let values: Vec<String> = (0..n)
            .map(|i| {
                let k = written + i;
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
        c.query_drop(format!(
            "INSERT INTO `{db}`.binlog_field_test_1 (testvarchar,testchar,testenum,testset,testtime,\
             testdate,testyear,testtimestamp,testdatetime,testfloat,testdouble,testdecimal,testtext,\
             testblob,testbit,testbool,testmediumblob,testlongblob,testtinyblob,\
             test_unsinged_tinyint,test_unsinged_smallint,test_unsinged_mediumint,\
             test_unsinged_int,test_unsinged_bigint) VALUES {}",
            values.join(",")
        ))
        .await?;
        written += n;
    }
    let write_secs = t0.elapsed().as_secs_f64();

    eprintln!("2/4 capture catch-up ...");
    let prefix = unique("bench");
    let capture_config = format!(
        "connector = \"{prefix}\"\n[mysql]\nurl = \"{}\"\nstart = \"{file}:{pos}\"\n\
         server_id = {}\n[filter]\ninclude = [\"{db}\\\\..*\"]\n[topics]\nprefix = \"{prefix}\"\n\
         [publish]\npartitions = 6\nreplication_factor = 1\n[kafka]\nbrokers = \"{}\"\n",
        mysql_url(),
        900_000 + std::process::id() % 90_000,
        kafka_brokers()
    );
    let (capture, child) = measure(
        "capture-mysql",
        &release.join("capture-mysql"),
        capture_config,
        "sluice_capture_produce_latency_seconds_count",
        rows,
    )
    .await?;
    stop(child);

    eprintln!("3/4 apply drain ...");
    let ch = clickhouse::Client::default()
        .with_url(clickhouse_url())
        .with_validation(false);
    let ch_db = format!("{db}_mirror");
    ch.query(&format!("CREATE DATABASE {ch_db}"))
        .execute()
        .await?;
    let apply_config = format!(
        "[clickhouse]\nurl = \"{}\"\ndatabase = \"{ch_db}\"\n[consumer]\ngroup_id = \"{prefix}\"\n\
         topics = [\"^{prefix}\\\\..*\"]\n[kafka]\nbrokers = \"{}\"\n",
        clickhouse_url(),
        kafka_brokers()
    );
    let (apply, child) = measure(
        "apply-clickhouse",
        &release.join("apply-clickhouse"),
        apply_config,
        "sluice_apply_rows_total",
        rows,
    )
    .await?;
    stop(child);

    eprintln!("4/4 checking ...");
    // Count, and sums over an unsigned, a signed and a text column.
    let row: mysql_async::Row = c
        .query_first(format!(
            "SELECT COUNT(*), CAST(SUM(test_unsinged_bigint) AS CHAR), CAST(SUM(testint) AS CHAR), \
             CAST(SUM(LENGTH(testvarchar)) AS CHAR), CAST(SUM(testdecimal) AS CHAR) \
             FROM `{db}`.binlog_field_test_1"
        ))
        .await?
        .unwrap();
    let source: (u64, String, String, String, String) = (
        row.get(0).unwrap(),
        row.get(1).unwrap(),
        row.get(2).unwrap(),
        row.get(3).unwrap(),
        row.get(4).unwrap(),
    );
    #[derive(clickhouse::Row, serde::Deserialize)]
    struct Check {
        n: u64,
        ubig: String,
        int: String,
        len: String,
        dec: String,
    }
    let got = ch
        .query(&format!(
            "SELECT count(), toString(sum(test_unsinged_bigint)), toString(sum(testint)), \
             toString(sum(length(testvarchar))), toString(sum(testdecimal)) \
             FROM {ch_db}.binlog_field_test_1 FINAL WHERE _deleted = 0"
        ))
        .fetch_one::<Check>()
        .await?;
    let target = (got.n, got.ubig, got.int, got.len, got.dec);
    // Decimal sums print with their scale in MySQL ("123.45") and may drop trailing zeros in
    // ClickHouse: compare them as numbers.
    let same_dec = source.4.parse::<f64>().ok() == target.4.parse::<f64>().ok();
    anyhow::ensure!(
        source.0 == target.0
            && source.1 == target.1
            && source.2 == target.2
            && source.3 == target.3
            && same_dec,
        "the mirror differs from the source: {target:?} vs {source:?}"
    );
    c.query_drop(format!("DROP DATABASE `{db}`")).await?;
    ch.query(&format!("DROP DATABASE {ch_db}"))
        .execute()
        .await?;

    let per = |s: &Stage| rows as f64 / s.cpu;
    println!(
        "W1, {rows} rows, {} cores; checked: count and checksum equal",
        num_cores()
    );
    println!(
        "| stage | wall s | rows/s | CPU s | rows per CPU s | CPU s per M rows | peak RSS MiB |"
    );
    println!("|---|---|---|---|---|---|---|");
    println!(
        "| MariaDB load (source, for scale) | {write_secs:.1} | {:.0} | | | | |",
        rows as f64 / write_secs
    );
    for s in [&capture, &apply] {
        println!(
            "| {} | {:.2} | {:.0} | {:.2} | {:.0} | {:.2} | {:.1} |",
            s.name,
            s.wall,
            rows as f64 / s.wall,
            s.cpu,
            per(s),
            s.cpu / rows as f64 * 1e6,
            s.rss / 1048576.0
        );
    }
    let stage_json = |s: &Stage| {
        serde_json::json!({
            "wall_seconds": s.wall,
            "rows_per_second": rows as f64 / s.wall,
            "cpu_seconds": s.cpu,
            "rows_per_cpu_second": per(s),
            "cpu_seconds_per_million_rows": s.cpu / rows as f64 * 1e6,
            "peak_rss_bytes": s.rss,
        })
    };
    let json = serde_json::json!({
        "benchmark": "W1 MySQL binlog -> ClickHouse",
        "rows": rows,
        "cores": num_cores(),
        "source_insert_seconds": write_secs,
        "capture_catch_up": stage_json(&capture),
        "apply_drain": stage_json(&apply),
        "checked": true,
    });
    let out = root.join("target/bench");
    std::fs::create_dir_all(&out)?;
    std::fs::write(out.join("w1.json"), serde_json::to_string_pretty(&json)?)?;
    Ok(())
}

fn num_cores() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(0)
}
