//! The performance table of docs/BENCHMARKS.md, made by one command:
//!
//!     deploy/testbed.sh start && cargo build --release --bins
//!     target/release/bench-report [--runs N] [--rows R] [--docs D] [--seconds S]
//!
//! Runs the benchmarks of both pipelines as they are, N times each (default 3), alternated
//! (W1, W2, W1, W2, ...), then the recovery benchmark once with `--runs N`:
//!
//! - `bench-w1 R --tables 2 --seconds S` (default 1 000 000 rows, 60 s): capture-mysql catching up
//!   on a backlog of R W1 rows already in the binlog, apply-clickhouse draining it into
//!   ClickHouse, then both running under 20 000 rows/s (two W1 tables, 1000 rows every 100 ms
//!   each) with the ClickHouse server's CPU, the latency and the first row's time from a cold
//!   start;
//! - `bench-w2 D` (default 200 000 documents): capture-mongo catching up on the oplog,
//!   apply-mongo draining, both under 10 000 documents/s (the test bed's mongo-java-server is
//!   started afresh before each: it slows down as its heap fills);
//! - `bench-recovery --runs N`: an applier and the capture killed (kill -9) and the broker
//!   restarted, until rows flow again.
//!
//! Each run checks its target against its source (the benchmarks fail otherwise). Reads their
//! JSON (`target/bench/w1.json`, `w2.json`, `recovery.json`) after each run, prints a Markdown
//! table of every figure against its goal (each run, and the median), with the machine, and
//! writes it to `target/bench/report.md` and `report.json`. CPU is user + system time of the
//! process from /proc; memory is the kernel's high-water mark (`VmHWM`).

use std::process::Command;

use serde_json::{json, Value};

const MIB: f64 = 1048576.0;

fn main() -> anyhow::Result<()> {
    let args = sluice_bench::measure::Args::from_env(
        "bench-report [--runs N] [--rows R] [--docs D] [--seconds S]",
        &["--runs", "--rows", "--docs", "--seconds"],
        &[],
        false,
    );
    let runs = args.option("--runs", 3)?.max(1);
    let rows = args.option("--rows", 1_000_000)?;
    let docs = args.option("--docs", 200_000)?;
    let seconds = args.option("--seconds", 60)?;
    let release = sluice_bench::measure::release_dir(&[
        "capture-mysql",
        "apply-clickhouse",
        "capture-mongo",
        "apply-mongo",
        "bench-w1",
        "bench-w2",
        "bench-recovery",
    ])?;
    let out = sluice_bench::measure::out_dir()?;
    let run = |bin: &str, a: &[String], file: &str| -> anyhow::Result<Value> {
        let path = out.join(file);
        let _ = std::fs::remove_file(&path);
        eprintln!("== {bin} {}", a.join(" "));
        let status = Command::new(release.join(bin)).args(a).status()?;
        anyhow::ensure!(status.success(), "{bin} {} failed: {status}", a.join(" "));
        Ok(serde_json::from_str(&std::fs::read_to_string(&path)?)?)
    };
    let mut w1 = Vec::new();
    let mut w2 = Vec::new();
    for i in 0..runs {
        eprintln!("== run {} of {runs}", i + 1);
        w1.push(run(
            "bench-w1",
            &[
                rows.to_string(),
                "--tables".into(),
                "2".into(),
                "--seconds".into(),
                seconds.to_string(),
            ],
            "w1.json",
        )?);
        // mongo-java-server keeps every document and oplog entry in its heap and slows down as
        // it fills: the test bed's is started afresh for each run (as tests/run.sh does).
        if sluice_tests::mongo_source_url().contains(":27117/") {
            let testbed =
                std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/testbed.sh");
            for step in ["stop", "start"] {
                let ok = Command::new(&testbed)
                    .args([step, "mongo"])
                    .stdout(std::process::Stdio::null())
                    .status()?
                    .success();
                anyhow::ensure!(ok, "deploy/testbed.sh {step} mongo failed");
            }
        }
        w2.push(run("bench-w2", &[docs.to_string()], "w2.json")?);
    }
    let recovery = run(
        "bench-recovery",
        &["--runs".into(), runs.to_string()],
        "recovery.json",
    )?;

    let machine = sluice_bench::measure::machine();
    let mut md = String::new();
    let mut line = |s: String| {
        println!("{s}");
        md.push_str(&s);
        md.push('\n');
    };
    let servers = &w1[0]["servers"];
    line(format!(
        "Machine: {} cores ({}), {:.1} GiB; MariaDB {}, ClickHouse {}, Kafka at {}, \
         mongo-java-server (W2's source and target); every server on the same machine. \
         `bench-report --runs {runs} --rows {rows} --docs {docs} --seconds {seconds}`.",
        machine.cores,
        machine.cpu,
        machine.memory_gib,
        servers["mariadb"].as_str().unwrap_or("?"),
        servers["clickhouse"].as_str().unwrap_or("?"),
        servers["kafka"].as_str().unwrap_or("?"),
    ));
    line(String::new());
    line("| stage | what | per CPU second (each run) | median | goal | peak RSS, VmHWM (each run) | goal |".into());
    line("|---|---|---|---|---|---|---|".into());
    let w2_stage = |r: &Value, name: &str| -> Option<(f64, f64)> {
        let s = r.as_array()?.iter().find(|s| s["stage"] == name)?;
        let events = s["events"].as_f64()?;
        Some((
            events / s["cpu_s"].as_f64()?.max(0.01),
            s["peak_rss_bytes"].as_f64()?,
        ))
    };
    let w1_stage = |r: &Value, key: &str| -> Option<(f64, f64)> {
        let s = &r[key];
        Some((
            s["rows_per_cpu_second"].as_f64()?,
            s["peak_rss_bytes"].as_f64()?,
        ))
    };
    let mut goals = Vec::new();
    // (stage, what it did, per run its rate per CPU second and peak bytes, the rate's goal)
    type Figures = Vec<Option<(f64, f64)>>;
    let stages: [(&str, String, Figures, f64); 4] = [
        (
            "capture-mysql",
            format!("binlog → Kafka, a backlog of {rows} W1 rows"),
            w1.iter().map(|r| w1_stage(r, "capture_catch_up")).collect(),
            300e3,
        ),
        (
            "apply-clickhouse",
            format!("Kafka → ClickHouse 18.16, the same {rows} rows"),
            w1.iter().map(|r| w1_stage(r, "apply_drain")).collect(),
            500e3,
        ),
        (
            "capture-mongo",
            "oplog → Kafka, W2's changes".into(),
            w2.iter().map(|r| w2_stage(r, "capture-mongo")).collect(),
            300e3,
        ),
        (
            "apply-mongo",
            "Kafka → MongoDB, the same changes".into(),
            w2.iter().map(|r| w2_stage(r, "apply-mongo")).collect(),
            300e3,
        ),
    ];
    for (name, what, figures, goal) in &stages {
        let per: Vec<f64> = figures.iter().flatten().map(|f| f.0).collect();
        let rss: Vec<f64> = figures.iter().flatten().map(|f| f.1 / MIB).collect();
        let med = median(&per);
        let peak = rss.iter().cloned().fold(0.0, f64::max);
        line(format!(
            "| {name} | {what} | {} | {:.0} k | ≥ {} k: {} | {} MiB | ≤ 64 MiB: {} |",
            each(&per, |v| format!("{:.0} k", v / 1e3)),
            med / 1e3,
            goal / 1e3,
            met(med >= *goal),
            each(&rss, |v| format!("{v:.1}")),
            met(peak <= 64.0),
        ));
        goals.push(json!({"stage": name, "per_cpu_second": per, "median": med, "goal": goal, "peak_rss_mib": rss}));
    }
    line(String::new());

    // The floor: what the client libraries alone cost per record, over the same records
    // (sluice_bench::floor), against each stage's budget at its goal.
    line(
        "The floor under each stage: microseconds of CPU per record that the client libraries \
         alone cost over the same records, in the benchmark's own process after its last step \
         (`sluice_bench::floor`: Kafka's consumer with the appliers' settings, its producer with \
         the captures', the events read as the appliers read them, the oplog read and \
         `insert_many` with the official driver), beside what the stage's goal allows per record."
            .into(),
    );
    line(String::new());
    line("| step | µs per record (each run) | median |".into());
    line("|---|---|---|".into());
    let w1_floor = |r: &Value, step: &str| r["kafka_floor"][step]["cpu_micros_per_record"].as_f64();
    let w2_floor = |r: &Value, step: &str| {
        r.as_array()?.iter().find(|s| s["stage"] == "kafka_floor")?["floor"][step]
            ["cpu_micros_per_record"]
            .as_f64()
    };
    let mut floors = Vec::new();
    let mut floor_median = std::collections::BTreeMap::new();
    for (w, src, step, what) in [
        (
            "W1",
            &w1,
            "stream",
            "consume, `StreamConsumer::recv` (as the appliers)",
        ),
        (
            "W1",
            &w1,
            "batch",
            "consume, `rd_kafka_consume_batch_queue`",
        ),
        (
            "W1",
            &w1,
            "decode",
            "decode the events (`sluice_proto::view`)",
        ),
        ("W1", &w1, "produce", "produce, the captures' settings"),
        (
            "W2",
            &w2,
            "stream",
            "consume, `StreamConsumer::recv` (as the appliers)",
        ),
        (
            "W2",
            &w2,
            "batch",
            "consume, `rd_kafka_consume_batch_queue`",
        ),
        (
            "W2",
            &w2,
            "decode",
            "decode the events (`sluice_proto::view`)",
        ),
        ("W2", &w2, "produce", "produce, the captures' settings"),
        ("W2", &w2, "source_read", "the oplog read, official driver"),
        (
            "W2",
            &w2,
            "target_write",
            "`insert_many`, official driver, 500 documents each",
        ),
    ] {
        let v: Vec<f64> = src
            .iter()
            .filter_map(|r| {
                if w == "W1" {
                    w1_floor(r, step)
                } else {
                    w2_floor(r, step)
                }
            })
            .collect();
        let med = median(&v);
        line(format!(
            "| {w}: {what} | {} | {med:.2} |",
            each(&v, |x| format!("{x:.2}"))
        ));
        floor_median.insert((w, step), med);
        floors.push(json!({"workload": w, "step": step, "micros": v, "median": med}));
    }
    line(String::new());
    line("| stage | µs per record at its goal | its floor (medians above) | left for the stage's own work | the stage now (median) |".into());
    line("|---|---|---|---|---|".into());
    let f = |w, step| floor_median.get(&(w, step)).copied().unwrap_or(f64::NAN);
    for ((name, _, _, goal), (parts, sum)) in stages.iter().zip([
        ("produce", f("W1", "produce")),
        ("consume + decode", f("W1", "stream") + f("W1", "decode")),
        (
            "oplog read + produce",
            f("W2", "source_read") + f("W2", "produce"),
        ),
        (
            "consume + decode + insert_many",
            f("W2", "stream") + f("W2", "decode") + f("W2", "target_write"),
        ),
    ]) {
        let budget = 1e6 / goal;
        let now = goals
            .iter()
            .find(|g| g["stage"] == *name)
            .and_then(|g| g["median"].as_f64())
            .map_or(f64::NAN, |m| 1e6 / m);
        line(format!(
            "| {name} | {budget:.2} | {parts}: {sum:.2} | {:.2} | {now:.2} |",
            budget - sum
        ));
    }
    line(String::new());

    // Under load: 20 000 rows/s, the target's CPU, the latency, the first row.
    line(format!(
        "Under load, both stages running: W1 at 20 000 rows/s (two tables, 1000 rows every 100 ms \
         each, {seconds} s), W2 at 10 000 documents/s (10 s). The report's Bifrost paid ClickHouse 14 CPU \
         seconds for a minute of the same load (11.7 s per million rows) at a p99 of 0.67 – 0.72 s, \
         and showed the first row 0.1 – 0.3 s after it started."
    ));
    line(String::new());
    line("| measure | each run | median | goal |".into());
    line("|---|---|---|---|".into());
    let s = |r: &Value, k: &str| r["sustained"][k].as_f64();
    let series = |f: &dyn Fn(&Value) -> Option<f64>, src: &[Value]| -> Vec<f64> {
        src.iter().filter_map(f).collect()
    };
    // (measure, each run, its format, the goal, the bound the median must keep, if any)
    type Row<'a> = (&'a str, Vec<f64>, String, String, Option<f64>);
    let rows_table: Vec<Row> = vec![
        (
            "W1 rows/s achieved",
            series(&|r| s(r, "achieved_rows_per_second"), &w1),
            "{:.0}".into(),
            "20 000".into(),
            None,
        ),
        (
            "ClickHouse CPU s per million rows",
            series(
                &|r| s(r, "clickhouse_write_cpu_seconds_per_million_rows"),
                &w1,
            ),
            "{:.1}".into(),
            "≤ 11.7 (Bifrost's)".into(),
            Some(11.7),
        ),
        (
            "W1 latency p50, s",
            series(&|r| s(r, "latency_p50_seconds"), &w1),
            "{:.2}".into(),
            String::new(),
            None,
        ),
        (
            "W1 latency p99, s",
            series(&|r| s(r, "latency_p99_seconds"), &w1),
            "{:.2}".into(),
            "≤ 0.72 (Bifrost's), ≤ 1".into(),
            Some(0.72),
        ),
        (
            "first row visible after both stages start, s",
            series(&|r| s(r, "first_row_seconds"), &w1),
            "{:.2}".into(),
            "Bifrost 0.1 – 0.3".into(),
            None,
        ),
        (
            "capture-mysql peak RSS, MiB",
            series(&|r| s(r, "capture_peak_rss_bytes").map(|b| b / MIB), &w1),
            "{:.1}".into(),
            "≤ 64".into(),
            Some(64.0),
        ),
        (
            "apply-clickhouse peak RSS, MiB",
            series(&|r| s(r, "apply_peak_rss_bytes").map(|b| b / MIB), &w1),
            "{:.1}".into(),
            "≤ 64".into(),
            Some(64.0),
        ),
    ];
    let w2_sustained = |r: &Value, k: &str| -> Option<f64> {
        r.as_array()?.iter().find(|s| s["stage"] == "sustained")?[k].as_f64()
    };
    let more: Vec<Row> = vec![
        (
            "W2 latency p99, s",
            series(&|r| w2_sustained(r, "latency_p99_s"), &w2),
            "{:.2}".into(),
            String::new(),
            None,
        ),
        (
            "capture-mongo peak RSS under load, MiB",
            series(
                &|r| w2_sustained(r, "capture_peak_rss_bytes").map(|b| b / MIB),
                &w2,
            ),
            "{:.1}".into(),
            "≤ 64".into(),
            Some(64.0),
        ),
        (
            "apply-mongo peak RSS under load, MiB",
            series(
                &|r| w2_sustained(r, "apply_peak_rss_bytes").map(|b| b / MIB),
                &w2,
            ),
            "{:.1}".into(),
            "≤ 64".into(),
            Some(64.0),
        ),
    ];
    let fmt = |pattern: &str, v: f64| match pattern {
        "{:.0}" => format!("{v:.0}"),
        "{:.1}" => format!("{v:.1}"),
        _ => format!("{v:.2}"),
    };
    let mut under_load = Vec::new();
    for (name, values, pattern, goal, bound) in rows_table.iter().chain(more.iter()) {
        let verdict = match bound {
            Some(b) if !values.is_empty() => format!(": {}", met(median(values) <= *b)),
            _ => String::new(),
        };
        line(format!(
            "| {name} | {} | {} | {goal}{verdict} |",
            each(values, |v| fmt(pattern, v)),
            if values.is_empty() {
                "not measured".to_string()
            } else {
                fmt(pattern, median(values))
            },
        ));
        under_load.push(json!({"measure": name, "each": values, "goal": goal}));
    }
    line(String::new());

    line("Recovery (`bench-recovery`: 500 rows/s offered, every row checked in ClickHouse after each run): seconds from the kill (or the broker's stop) until rows flow again.".into());
    line(String::new());
    line("| what | each run, s | goal |".into());
    line("|---|---|---|".into());
    for case in recovery["cases"].as_array().into_iter().flatten() {
        let name = case["name"].as_str().unwrap_or("?");
        let secs: Vec<f64> = case["seconds"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_f64)
            .collect();
        let goal = case["goal_seconds"]
            .as_f64()
            .map(|g| {
                let worst = secs.iter().cloned().fold(0.0, f64::max);
                format!("under {g:.0} s: {}", met(worst < g))
            })
            .unwrap_or_default();
        line(format!(
            "| {name} | {} | {goal} |",
            each(&secs, |v| format!("{v:.1}"))
        ));
    }
    std::fs::write(out.join("report.md"), &md)?;
    sluice_bench::measure::write_json(
        "report.json",
        &json!({
            "machine": machine.json(),
            "runs": runs,
            "per_cpu_second": goals,
            "floor": floors,
            "under_load": under_load,
            "w1": w1,
            "w2": w2,
            "recovery": recovery,
        }),
    )?;
    eprintln!("written: target/bench/report.md, target/bench/report.json");
    Ok(())
}

fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(|a, b| a.total_cmp(b));
    match s.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => s[n / 2],
        n => (s[n / 2 - 1] + s[n / 2]) / 2.0,
    }
}

fn each(v: &[f64], f: impl Fn(f64) -> String) -> String {
    if v.is_empty() {
        return "not measured".into();
    }
    v.iter().map(|x| f(*x)).collect::<Vec<_>>().join(" / ")
}

fn met(yes: bool) -> &'static str {
    if yes {
        "met"
    } else {
        "**not met**"
    }
}
