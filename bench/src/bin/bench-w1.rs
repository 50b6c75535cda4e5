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

use std::time::Instant;

use mysql_async::prelude::Queryable;
use sluice_bench::measure::{measure, num_cores, stop_child, Stage};
use sluice_bench::w1::{insert_sql, sustained, verify_run, Load};
use sluice_tests::{clickhouse_url, kafka_brokers, mysql_url, unique};

const MIB: u64 = 1 << 20;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    // As the stages do: the Kafka floor step runs in this process (sluice_bench::floor).
    sluice_common::keep_memory_small();
    let args = sluice_bench::measure::Args::from_env(
        "bench-w1 [--snapshot] [ROWS] [--tables N] [--batch B] [--every-ms T] [--seconds S] \
         [--big-rows K] [--max-wait-ms MS] [--sustained-only] [--verify] [--verify-runs N] \
         [--verify-parallel P]",
        &[
            "--tables",
            "--batch",
            "--every-ms",
            "--seconds",
            "--big-rows",
            "--max-wait-ms",
            "--verify-runs",
            "--verify-parallel",
        ],
        &["--snapshot", "--verify", "--sustained-only"],
        true,
    );
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
