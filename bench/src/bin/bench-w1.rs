//! Benchmark of reference workload W1 (MySQL binlog -> ClickHouse), stage by stage.
//!
//!     deploy/testbed.sh start && cargo build --release --bins
//!     cargo run --release -p sluice-bench --bin bench-w1 -- [--snapshot] [ROWS] [--tables N] [--batch B] [--every-ms T] [--seconds S]
//!
//! With `--snapshot`, step 2 is a snapshot instead of a catch-up: the capture starts at the end
//! of the binlog with `[snapshot] mode = "snapshot+stream"` and reads the table in primary-key
//! chunks (measured until every row is published); step 5 is left out. Writes
//! `target/bench/w1-snapshot.json`.
//!
//! 1. Writes ROWS (default 1 000 000) rows of the W1 all-types table into MariaDB, the pipeline
//!    stopped.
//! 2. Capture catch-up: starts the release `capture-mysql` at the position before them and
//!    measures until Kafka acknowledged every row.
//! 3. Apply drain: with the whole backlog in Kafka, starts the release `apply-clickhouse`
//!    (mirror mode) and measures until ClickHouse acknowledged every row.
//! 4. Checks the result: row count and a checksum of the mirror equal the source's, so a fast
//!    wrong run cannot report.
//! 5. Sustained end to end, the report's load generator (`insertDataTest`): both stages
//!    running, `--tables N` W1 tables (default 5), one writer each, inserting `--batch B` rows
//!    (default 1000) every `--every-ms T` ms (default 100) for `--seconds S` (default 30), i.e.
//!    50 000 rows/s offered by default (`--every-ms 0`: as fast as the writers go, as many
//!    batches as 10 ms apart would make); each batch's latency runs from MariaDB acknowledging its
//!    INSERT to ClickHouse counting its rows (polled every 20 ms): p50, p99, max, and the rate
//!    achieved; the ClickHouse server's CPU seconds over the load (the test bed's server, by its
//!    pid file) and the applier's writes. The stages start on an empty pipeline (no topic, group
//!    or target table) with a row inserted into each table at once: the time until ClickHouse
//!    shows them is the first row's. The applier runs with its default `[batch]` settings, or
//!    `max_wait_ms` from `--max-wait-ms MS`. `--sustained-only` runs only this step (writes
//!    `target/bench/w1-sustained.json`).
//! 6. The floor (not with `--snapshot` or `--verify`; `sluice_bench::floor`): the same records
//!    consumed, decoded and produced again by Kafka's client alone, CPU per record of each.
//!
//! With `--big-rows K`, step 1 also writes K rows of 4 to 15 MiB each (sizes spread evenly) into
//! a second table of the same database, `big`, before the W1 rows: the catch-up and the drain
//! then carry them too (their counters wait for ROWS + K; written first, they are acknowledged
//! before the last W1 rows), step 4 checks each of them in the mirror by its MD5, and the peak
//! memory shows what large rows add.
//!
//! With `--verify`, step 5 is `sluice verify` of the mirror against the source instead (run
//! `--verify-runs N` times, default 2, with `--parallel P` from `--verify-parallel P`, default
//! 1): wall time, rows verified per second, and the CPU
//! seconds of the `sluice` process, of MariaDB and of ClickHouse (the test bed's server
//! processes, from /proc; the hashing is theirs). Writes `target/bench/w1-verify.json`.
//!
//! For each stage: wall time, rows/s, CPU seconds of the process (from /proc), rows per CPU
//! second and peak resident memory. Prints a table, the machine and server versions, the
//! report's figures beside ours (per CPU second of our processes, since the report ran on other
//! hardware), and writes `target/bench/w1.json`.

use std::time::{Duration, Instant};

use mysql_async::prelude::Queryable;
use sluice_bench::measure::{measure, num_cores, spawn_stage, stop_child, Stage};
use sluice_tests::{clickhouse_url, kafka_brokers, mysql_url, unique};

const MIB: u64 = 1 << 20;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    // As the stages do: the Kafka floor step runs in this process (sluice_bench::floor).
    sluice_common::keep_memory_small();
    let args =
        sluice_bench::measure::Args::from_env(&["--snapshot", "--verify", "--sustained-only"]);
    let snapshot = args.switch("--snapshot");
    let max_wait_ms = args.text("--max-wait-ms").map(|v| v.parse()).transpose()?;
    let verify = args.switch("--verify");
    let verify_runs = args.option("--verify-runs", 2)?.max(1);
    let verify_parallel = args.option("--verify-parallel", 1)?.max(1);
    let big_rows = args.option("--big-rows", 0)?;
    let load = Load {
        tables: args.option("--tables", 5)? as usize,
        batch: args.option("--batch", 1000)?,
        every_ms: args.option("--every-ms", 100)?,
        seconds: args.option("--seconds", 30)?,
    };
    anyhow::ensure!(
        (1..=5).contains(&load.tables) && load.batch > 0,
        "--tables 1..5, --batch above 0"
    );
    let rows: u64 = args
        .first_bare()
        .map(|a| a.parse())
        .transpose()?
        .unwrap_or(1_000_000);
    let release = sluice_bench::measure::release_dir(&["capture-mysql", "apply-clickhouse"])?;
    if args.switch("--sustained-only") {
        eprintln!("sustained end to end only ...");
        let e2e = sustained(&release, load, max_wait_ms).await?;
        let machine = sluice_bench::measure::machine();
        println!(
            "Machine: {} cores ({}), {:.1} GiB; every server on the same machine",
            machine.cores, machine.cpu, machine.memory_gib
        );
        println!("{}", e2e.line());
        sluice_bench::measure::write_json(
            "w1-sustained.json",
            &serde_json::json!({
                "benchmark": "W1 MySQL binlog -> ClickHouse, sustained",
                "machine": machine.json(),
                "sustained": e2e.json(),
            }),
        )?;
        return Ok(());
    }
    let db = unique("sluice_bench");
    let mut c = mysql_async::Conn::new(mysql_async::Opts::from_url(&mysql_url())?).await?;
    let ddl = sluice_tests::w1_create_table(&db);
    c.query_drop(format!("CREATE DATABASE `{db}`")).await?;
    c.query_drop(ddl).await?;
    let version: String = c.query_first("SELECT @@version").await?.unwrap_or_default();
    let status: mysql_async::Row = c
        .query_first(sluice_capture::mysql::binlog_status_sql(&version))
        .await?
        .unwrap();
    let (file, pos): (String, u64) = (status.get(0).unwrap(), status.get(1).unwrap());

    eprintln!("1/4 writing {rows} rows of the W1 table into {db} ...");
    if big_rows > 0 {
        c.query_drop(format!(
            "CREATE TABLE `{db}`.big (id INT PRIMARY KEY, b LONGBLOB NOT NULL)"
        ))
        .await?;
    }
    for i in 0..big_rows {
        // 4 MiB to 15 MiB (MariaDB's default max_allowed_packet is 16 MiB) of bytes that do not
        // compress (the broker's LZ4 would otherwise hide the row's size).
        let size = 4 * MIB + (11 * MIB) * i / big_rows.saturating_sub(1).max(1);
        let mut x = 0x9E37_79B9_7F4A_7C15u64 ^ i;
        let blob: Vec<u8> = (0..size)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect();
        c.exec_drop(format!("INSERT INTO `{db}`.big VALUES (?, ?)"), (i, blob))
            .await?;
    }
    let t0 = Instant::now();
    let mut written = 0;
    while written < rows {
        let n = 1000.min(rows - written);
        c.query_drop(insert_sql(&db, written, n)).await?;
        written += n;
    }
    let write_secs = t0.elapsed().as_secs_f64();

    let prefix = unique("bench");
    let (start, extra, counter, name) = if snapshot {
        eprintln!("2/4 capture snapshot ...");
        (
            "end".to_string(),
            "[snapshot]\nmode = \"snapshot+stream\"\nchunk_rows = 20000\n",
            "sluice_capture_snapshot_rows_total",
            "capture-mysql (snapshot)",
        )
    } else {
        eprintln!("2/4 capture catch-up ...");
        (
            format!("{file}:{pos}"),
            "",
            "sluice_capture_produce_latency_seconds_count",
            "capture-mysql",
        )
    };
    let capture_config = format!(
        "connector = \"{prefix}\"\n[mysql]\nssl_mode = \"disabled\"\nurl = \"{}\"\nstart = \"{start}\"\n\
         server_id = {}\n[filter]\ninclude = [\"{db}\\\\..*\"]\n[topics]\nprefix = \"{prefix}\"\n\
         [publish]\npartitions = 6\nreplication_factor = 1\n[kafka]\nbrokers = \"{}\"\n{extra}\n",
        mysql_url(),
        sluice_tests::replica_server_id(),
        kafka_brokers(),
    );
    // Extra capture-mysql TOML, for experiments (e.g. producer properties).
    let capture_config = sluice_bench::measure::with_extra(capture_config, "BENCH_CAPTURE_EXTRA")?;
    let capture_file = tempfile::NamedTempFile::new()?;
    std::fs::write(capture_file.path(), &capture_config)?;
    let (capture, child) = measure(
        name,
        &release.join("capture-mysql"),
        capture_config,
        counter,
        rows + big_rows,
    )
    .await?;
    stop_child(child);

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
        kafka_brokers(),
    );
    // Extra apply-clickhouse TOML, for experiments (e.g. consumer properties).
    let apply_config = sluice_bench::measure::with_extra(apply_config, "BENCH_APPLY_EXTRA")?;
    let apply_file = tempfile::NamedTempFile::new()?;
    std::fs::write(apply_file.path(), &apply_config)?;
    let (apply, child) = measure(
        "apply-clickhouse",
        &release.join("apply-clickhouse"),
        apply_config,
        "sluice_apply_rows_total",
        rows + big_rows,
    )
    .await?;
    stop_child(child);

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
    if big_rows > 0 {
        // Each large row whole: its MD5 on both sides.
        let source: Vec<(u64, String)> = c
            .query(format!("SELECT id, MD5(b) FROM `{db}`.big ORDER BY id"))
            .await?;
        let got: Vec<(u64, String)> = ch
            .query(&format!(
                "SELECT toUInt64(id), lower(hex(MD5(b))) FROM {ch_db}.big FINAL \
                 WHERE _deleted = 0 ORDER BY id"
            ))
            .fetch_all()
            .await?;
        anyhow::ensure!(
            source == got,
            "the large rows' mirror differs: {got:?} vs {source:?}"
        );
    }
    let verified = if verify {
        eprintln!("5/5 sluice verify, {verify_runs} runs ...");
        let mut runs = Vec::new();
        for _ in 0..verify_runs {
            runs.push(verify_run(
                &release,
                capture_file.path(),
                apply_file.path(),
                rows,
                verify_parallel,
            )?);
        }
        Some(runs)
    } else {
        None
    };
    c.query_drop(format!("DROP DATABASE `{db}`")).await?;
    ch.query(&format!("DROP DATABASE {ch_db}"))
        .execute()
        .await?;

    if let Some(runs) = verified {
        let machine = sluice_bench::measure::machine();
        let clickhouse: String = ch.query("SELECT version()").fetch_one().await?;
        println!(
            "sluice verify --parallel {verify_parallel}, W1 {rows} rows (chunks of 10 000), {} cores ({}); MariaDB {version}, \
             ClickHouse {clickhouse}; every server on the same machine",
            machine.cores, machine.cpu
        );
        println!(
            "| run | wall s | rows verified/s | CPU s sluice | CPU s MariaDB | CPU s ClickHouse |"
        );
        println!("|---|---|---|---|---|---|");
        for (i, r) in runs.iter().enumerate() {
            println!(
                "| {} | {:.2} | {:.0} | {:.2} | {:.2} | {:.2} |",
                i + 1,
                r.wall,
                rows as f64 / r.wall,
                r.sluice_cpu,
                r.mariadb_cpu,
                r.clickhouse_cpu
            );
        }
        sluice_bench::measure::write_json(
            "w1-verify.json",
            &serde_json::json!({
                "benchmark": "sluice verify, W1 MySQL -> ClickHouse mirror",
                "rows": rows,
                "clickhouse": clickhouse,
                "machine": machine.json(),
                "runs": runs.iter().map(|r| serde_json::json!({
                    "wall_seconds": r.wall,
                    "rows_per_second": rows as f64 / r.wall,
                    "cpu_seconds_sluice": r.sluice_cpu,
                    "cpu_seconds_mariadb": r.mariadb_cpu,
                    "cpu_seconds_clickhouse": r.clickhouse_cpu,
                })).collect::<Vec<_>>(),
            }),
        )?;
        return Ok(());
    }

    let per = |s: &Stage| rows as f64 / s.cpu;
    if snapshot {
        println!(
            "W1 snapshot, {rows} rows, {} cores; checked: count and checksum equal",
            num_cores()
        );
        println!("| stage | wall s | rows/s | CPU s | rows per CPU s | peak RSS MiB |");
        println!("|---|---|---|---|---|---|");
        let mut json = serde_json::Map::new();
        for s in [&capture, &apply] {
            println!(
                "| {} | {:.2} | {:.0} | {:.2} | {:.0} | {:.1} |",
                s.name,
                s.wall,
                rows as f64 / s.wall,
                s.cpu,
                per(s),
                s.rss / 1048576.0
            );
            json.insert(
                s.name.to_string(),
                serde_json::json!({
                    "wall_seconds": s.wall,
                    "rows_per_second": rows as f64 / s.wall,
                    "cpu_seconds": s.cpu,
                    "rows_per_cpu_second": per(s),
                    "peak_rss_bytes": s.rss,
                }),
            );
        }
        sluice_bench::measure::write_json(
            "w1-snapshot.json",
            &serde_json::json!({
                "benchmark": "W1 snapshot MySQL -> ClickHouse",
                "rows": rows,
                "cores": num_cores(),
                "stages": json,
                "checked": true,
            }),
        )?;
        return Ok(());
    }

    eprintln!(
        "5/5 sustained end to end: {} tables, {} rows every {} ms each ({} rows/s offered) for {} s ...",
        load.tables,
        load.batch,
        load.every_ms,
        load.offered(),
        load.seconds
    );
    let e2e = sustained(&release, load, max_wait_ms).await?;
    // Kafka's client alone over the same records: the floor under both stages' figures (last:
    // its million records produced again load the broker, not during the sustained step).
    let floor = if snapshot || verify {
        None
    } else {
        eprintln!(
            "6 Kafka's client alone over the same {} records ...",
            rows + big_rows
        );
        Some(sluice_bench::floor::measure(&kafka_brokers(), &prefix, rows + big_rows).await?)
    };

    let machine = sluice_bench::measure::machine();
    let mariadb: String = c.query_first("SELECT VERSION()").await?.unwrap_or_default();
    let clickhouse: String = ch
        .query("SELECT version()")
        .fetch_one()
        .await
        .unwrap_or_default();
    println!(
        "Machine: {} cores ({}), {:.1} GiB; MariaDB {mariadb}, ClickHouse {clickhouse}, Kafka at {}; \
         every server on the same machine",
        machine.cores,
        machine.cpu,
        machine.memory_gib,
        kafka_brokers()
    );
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
    if let Some(f) = &floor {
        print!("{}", f.lines("W1's rows"));
    }
    println!();
    println!("{}", e2e.line());
    let both_cpu = capture.cpu + apply.cpu;
    sluice_bench::measure::print_comparison(
        "Beside the report (Bifrost v1.6.2, W1: 4-core VMs, sync tool alone on one)",
        &[
            (
                "throughput, rows/s",
                "43 000 – 47 000 (its ceiling)".into(),
                format!(
                    "catch-up {:.0}, drain {:.0}; sustained {:.0} achieved of {} offered",
                    rows as f64 / capture.wall,
                    rows as f64 / apply.wall,
                    e2e.achieved,
                    e2e.load.offered()
                ),
            ),
            (
                "rows per CPU second of the sync process(es)",
                "20 500 – 29 400 (at 160 – 210 % CPU)".into(),
                format!(
                    "{:.0} for both stages (capture {:.0}, apply {:.0})",
                    rows as f64 / both_cpu,
                    per(&capture),
                    per(&apply)
                ),
            ),
            (
                "CPU seconds per million rows",
                "34 – 49".into(),
                format!("{:.1}", both_cpu / rows as f64 * 1e6),
            ),
            (
                "memory",
                "220 – 700 MB".into(),
                format!(
                    "capture {:.0} MiB + apply {:.0} MiB (peaks in the drain), {:.0} + {:.0} MiB sustained",
                    capture.rss / 1048576.0,
                    apply.rss / 1048576.0,
                    e2e.capture_rss / 1048576.0,
                    e2e.apply_rss / 1048576.0
                ),
            ),
            (
                "latency, commit -> visible",
                "not reported".into(),
                format!("p50 {:.3} s, p99 {:.3} s", e2e.p50, e2e.p99),
            ),
        ],
    );
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
        "machine": machine.json(),
        "servers": { "mariadb": mariadb, "clickhouse": clickhouse, "kafka": kafka_brokers() },
        "reference": {
            "report": "Bifrost v1.6.2",
            "rows_per_second": [43000, 47000],
            "rows_per_cpu_second": [20500, 29400],
            "memory_bytes": [220e6, 700e6],
        },
        "rows_per_cpu_second_both_stages": rows as f64 / both_cpu,
        "source_insert_seconds": write_secs,
        "capture_catch_up": stage_json(&capture),
        "apply_drain": stage_json(&apply),
        "sustained": e2e.json(),
        "kafka_floor": floor.map(|f| f.json()),
        "checked": true,
    });
    sluice_bench::measure::write_json("w1.json", &json)?;
    Ok(())
}

/// INSERT of `n` W1 rows into `binlog_field_test_1` (ids from AUTO_INCREMENT), values derived
/// from `from..from + n`.
fn insert_sql(db: &str, from: u64, n: u64) -> String {
    insert_into(db, 1, from, n)
}

/// The same into `binlog_field_test_<table>`.
fn insert_into(db: &str, table: usize, from: u64, n: u64) -> String {
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
struct Load {
    tables: usize,
    batch: u64,
    every_ms: u64,
    seconds: u64,
}

impl Load {
    /// Rows per second offered; 0 = as fast as the writers go (`--every-ms 0`).
    fn offered(&self) -> u64 {
        (self.tables as u64 * self.batch * 1000)
            .checked_div(self.every_ms)
            .unwrap_or(0)
    }
}

struct Sustained {
    load: Load,
    /// `[batch] max_wait_ms` of the applier (None: its default).
    max_wait_ms: Option<u64>,
    /// From the start of both stages (on an empty pipeline: no topic, no group, no target
    /// table yet) until ClickHouse showed the row inserted into each table right after it.
    first_row: f64,
    rows: u64,
    achieved: f64,
    /// CPU seconds of the ClickHouse server over the load (the test bed's, by its pid file;
    /// None for a server elsewhere).
    clickhouse_cpu: Option<f64>,
    /// Of those, what the benchmark's own count polls cost it (the polls over the load times
    /// the cost of one, measured before the load).
    clickhouse_poll_cpu: Option<f64>,
    polls: usize,
    /// Batches the applier wrote over the load (each one INSERT per table it holds).
    writes: f64,
    p50: f64,
    p99: f64,
    max: f64,
    capture_cpu: f64,
    apply_cpu: f64,
    capture_rss: f64,
    apply_rss: f64,
}

impl Sustained {
    /// ClickHouse's CPU seconds for the pipeline's writes: over the load, less the polls'.
    fn write_cpu(&self) -> Option<f64> {
        self.clickhouse_cpu
            .zip(self.clickhouse_poll_cpu)
            .map(|(c, p)| c - p)
    }

    /// What a run of the sustained step printed.
    fn line(&self) -> String {
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

    fn json(&self) -> serde_json::Value {
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

async fn sustained(
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
    let ch_cpu = || ch_pid.and_then(|p| sluice_bench::measure::cpu_seconds(p).ok());
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
        sluice_bench::measure::scrape(apply_port)
            .map(|b| sluice_bench::measure::metric(&b, "sluice_apply_batch_rows_count"))
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
    let acked = sluice_bench::measure::join_writers(writers).await?;
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
    let l = sluice_bench::measure::latencies(&acked, &seen, load.batch);
    let rows = batches * load.batch * load.tables as u64;
    let [(capture_cpu, capture_rss), (apply_cpu, apply_rss)] =
        sluice_bench::measure::usage_and_stop(capture, apply)?;
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
struct VerifyRun {
    wall: f64,
    sluice_cpu: f64,
    mariadb_cpu: f64,
    clickhouse_cpu: f64,
}

/// The test bed's ClickHouse server process when the benchmark writes to it (for its CPU).
fn clickhouse_pid() -> Option<u32> {
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
fn server_pid(file: &str) -> anyhow::Result<u32> {
    let dir =
        std::env::var("SLUICE_TESTBED_DIR").unwrap_or_else(|_| "/var/tmp/sluice-testbed".into());
    let path = format!("{dir}/{file}");
    Ok(std::fs::read_to_string(&path)
        .map_err(|e| anyhow::anyhow!("{path}: {e} (is the test bed running?)"))?
        .trim()
        .parse()?)
}

/// Run `sluice verify` once (it must find the mirror equal), with the CPU of the servers.
fn verify_run(
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
        sluice_bench::measure::cpu_seconds(mariadb)?,
        sluice_bench::measure::cpu_seconds(clickhouse)?,
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
        sluice_bench::measure::cpu_seconds(mariadb)?,
        sluice_bench::measure::cpu_seconds(clickhouse)?,
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
