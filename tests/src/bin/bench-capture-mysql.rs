//! Benchmark: capture-mysql catching up on a binlog backlog of the W1 table.
//!
//!     deploy/testbed.sh start && cargo build --release --bins
//!     cargo run --release -p sluice-tests --bin bench-capture-mysql -- [ROWS]
//!
//! Writes ROWS (default 1 000 000) rows of the W1 all-types table into MariaDB with the capture
//! stopped, then starts the release `capture-mysql` at the position before them and measures
//! until Kafka acknowledged every row (its `sluice_capture_produce_latency_seconds_count`): wall time,
//! rows/s, CPU seconds of the capture process and its peak resident memory (its own
//! `process_*` metrics). Prints a table and writes `target/bench/capture-mysql.json`.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use mysql_async::prelude::Queryable;
use sluice_tests::{free_port, kafka_brokers, mysql_url, unique};

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
    // Fields after the command name, which is in parentheses and may contain spaces.
    let rest = &stat[stat.rfind(')').ok_or_else(|| anyhow::anyhow!("bad stat"))? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: f64 = f[11].parse::<f64>()? + f[12].parse::<f64>()?;
    Ok(ticks / 100.0)
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let rows: u64 = std::env::args()
        .nth(1)
        .map(|a| a.parse())
        .transpose()?
        .unwrap_or(1_000_000);
    let target = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../target");
    let bin = target.join("release/capture-mysql");
    anyhow::ensure!(
        bin.exists(),
        "{} is missing: run `cargo build --release --bins` first",
        bin.display()
    );
    let db = unique("sluice_bench");
    let mut c = mysql_async::Conn::new(mysql_async::Opts::from_url(&mysql_url())?).await?;
    let ddl = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/workloads/w1.mysql.sql"),
    )?
    .replace(
        "`binlog_field_test_1`",
        &format!("`{db}`.`binlog_field_test_1`"),
    );
    c.query_drop(format!("CREATE DATABASE `{db}`")).await?;
    c.query_drop(ddl).await?;
    let status: mysql_async::Row = c.query_first("SHOW MASTER STATUS").await?.unwrap();
    let (file, pos): (String, u64) = (status.get(0).unwrap(), status.get(1).unwrap());

    eprintln!("writing {rows} rows of the W1 table into {db} ...");
    let t0 = Instant::now();
    let batch = 1000;
    let mut written = 0;
    while written < rows {
        let n = batch.min(rows - written);
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
    eprintln!("written in {write_secs:.1} s; capturing ...");

    let port = free_port();
    let connector = unique("bench");
    let config = tempfile::NamedTempFile::new()?;
    std::fs::write(
        config.path(),
        format!(
            "connector = \"{connector}\"\n[mysql]\nurl = \"{}\"\nstart = \"{file}:{pos}\"\n\
             server_id = {}\n[filter]\ninclude = [\"{db}\\\\..*\"]\n[topics]\nprefix = \"{connector}\"\n\
             [publish]\npartitions = 6\nreplication_factor = 1\n[kafka]\nbrokers = \"{}\"\n\
             [metrics]\nlisten = \"127.0.0.1:{port}\"\n[log]\nlevel = \"warn\"\n",
            mysql_url(),
            900_000 + std::process::id() % 90_000,
            kafka_brokers()
        ),
    )?;
    let start = Instant::now();
    let mut child = Command::new(&bin)
        .args(["-c", config.path().to_str().unwrap()])
        .stdout(Stdio::null())
        .spawn()?;
    let mut first_event: Option<Instant> = None;
    let mut peak_rss = 0.0f64;
    let (done, cpu) = loop {
        tokio::time::sleep(Duration::from_millis(100)).await;
        if let Some(status) = child.try_wait()? {
            anyhow::bail!("capture-mysql exited early: {status}");
        }
        let Some(body) = scrape(port) else { continue };
        // Acknowledged by Kafka: every delivery observes the produce latency histogram.
        let events = metric(&body, "sluice_capture_produce_latency_seconds_count");
        peak_rss = peak_rss.max(metric(&body, "process_resident_memory_bytes"));
        if events > 0.0 && first_event.is_none() {
            first_event = Some(Instant::now());
        }
        if events >= rows as f64 {
            break (Instant::now(), cpu_seconds(child.id())?);
        }
        anyhow::ensure!(
            start.elapsed() < Duration::from_secs(1800),
            "not done after 30 minutes"
        );
    };
    let _ = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status();
    let _ = child.wait();
    c.query_drop(format!("DROP DATABASE `{db}`")).await?;

    let wall = (done - start).as_secs_f64();
    let streaming = (done - first_event.unwrap_or(start)).as_secs_f64();
    let json = serde_json::json!({
        "benchmark": "capture-mysql catch-up, W1 table",
        "rows": rows,
        "source_insert_seconds": write_secs,
        "wall_seconds": wall,
        "streaming_seconds": streaming,
        "rows_per_second": rows as f64 / wall,
        "rows_per_second_streaming": rows as f64 / streaming,
        "cpu_seconds": cpu,
        "rows_per_cpu_second": rows as f64 / cpu,
        "cpu_seconds_per_million_rows": cpu / rows as f64 * 1e6,
        "peak_rss_bytes": peak_rss,
        "cores": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0),
    });
    println!("| measure | value |\n|---|---|");
    println!("| rows | {rows} |");
    println!("| wall time, start to last row acknowledged by Kafka | {wall:.2} s |");
    println!("| rows/s (wall) | {:.0} |", rows as f64 / wall);
    println!(
        "| rows/s (from first event) | {:.0} |",
        rows as f64 / streaming
    );
    println!("| capture CPU seconds (user+sys) | {cpu:.2} |");
    println!("| rows per CPU second | {:.0} |", rows as f64 / cpu);
    println!(
        "| CPU seconds per million rows | {:.2} |",
        cpu / rows as f64 * 1e6
    );
    println!("| peak RSS | {:.1} MiB |", peak_rss / 1048576.0);
    let out = target.join("bench");
    std::fs::create_dir_all(&out)?;
    std::fs::write(
        out.join("capture-mysql.json"),
        serde_json::to_string_pretty(&json)?,
    )?;
    Ok(())
}
