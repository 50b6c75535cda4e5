//! Benchmark: how long an apply stage's partitions stay unread after one instance is killed.
//!
//!     deploy/testbed.sh start && cargo build --release --bins
//!     cargo run --release -p sluice-bench --bin bench-recovery -- [--runs N] [--session-ms MS]
//!
//! capture-mysql runs, a writer inserts 50 rows into MariaDB every 100 ms, and two
//! apply-clickhouse instances of one group share the topic's 6 partitions. Then one instance is
//! killed (`kill -9`) and, at once, 100 probe rows are inserted (their keys fall on every
//! partition). "Kill → flowing" is the time from the kill until ClickHouse holds every probe
//! row: the killed instance's partitions are read again. Three ways, `--runs` times each:
//!
//! 1. killed and not restarted: the survivor takes the partitions once the broker gives up on the
//!    dead member (`session.timeout.ms`);
//! 2. killed and restarted at once with `consumer.instance_id` (static membership, as the
//!    Kubernetes manifests set it from the pod name);
//! 3. killed and restarted at once without it.
//!
//! Then, with one apply instance (static membership) reading every partition, two more:
//!
//! 4. capture-mysql killed (`kill -9`) and restarted at once: it takes its checkpoint back (the
//!    fencing of the killed producer included) and publishes the probe;
//! 5. the Kafka broker restarted (`deploy/testbed.sh stop kafka`, then `start kafka`; only when
//!    the test bed runs the broker): the figure runs from the stop's start, and the time the two
//!    commands took (the broker's own shutdown and start) is printed beside it, and when,
//!    sampled from both stages' metrics every 50 ms, the capture's deliveries were acknowledged
//!    again, its first checkpoint committed and apply's first rows written.
//!
//! `--only apply|capture|broker` runs one group of them.
//!
//! After each run, every row the writer had inserted is checked to be in ClickHouse (so a fast
//! wrong run cannot report). `--session-ms` sets `session.timeout.ms` in `[kafka.properties]`
//! (default: the stage's own default). Prints the figures and writes them to
//! `target/bench/recovery.json` (for `bench-report`).

use std::process::Child;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use mysql_async::prelude::Queryable;
use sluice_bench::measure::{metric, scrape, spawn_stage, stop_child};
use sluice_tests::{clickhouse_url, kafka_brokers, mysql_url, unique};

const PARTITIONS: u64 = 6;
const PROBE: u64 = 100;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = sluice_bench::measure::Args::from_env(
        "bench-recovery [--runs N] [--session-ms MS] [--only apply|capture|broker]",
        &["--runs", "--session-ms", "--only"],
        &[],
        false,
    );
    let runs = args.option("--runs", 1)?.max(1);
    let session_ms = args.option("--session-ms", 0)?;
    let only = args.text("--only");
    let runs_group = |g: &str| only.as_deref().is_none_or(|o| o == g);
    let release = sluice_bench::measure::release_dir(&["capture-mysql", "apply-clickhouse"])?;
    let db = unique("sluice_recovery");
    let mut c = mysql_async::Conn::new(mysql_async::Opts::from_url(&mysql_url())?).await?;
    c.query_drop(format!("CREATE DATABASE `{db}`")).await?;
    c.query_drop(format!(
        "CREATE TABLE `{db}`.t (id BIGINT PRIMARY KEY, v INT NOT NULL)"
    ))
    .await?;
    let prefix = unique("recovery");
    let capture_config = format!(
        "connector = \"{prefix}\"\n[mysql]\nssl_mode = \"disabled\"\nurl = \"{}\"\nstart = \"end\"\n\
         server_id = {}\n[filter]\ninclude = [\"{db}\\\\..*\"]\n[topics]\nprefix = \"{prefix}\"\n\
         [publish]\npartitions = {PARTITIONS}\nreplication_factor = 1\n[kafka]\nbrokers = \"{}\"\n",
        mysql_url(),
        sluice_tests::replica_server_id(),
        kafka_brokers(),
    );
    let (mut capture, mut capture_port, mut capture_file) =
        spawn_stage(&release.join("capture-mysql"), &capture_config)?;
    tokio::time::sleep(Duration::from_secs(2)).await;

    // The load: 50 rows every 100 ms, ids from 1; `acked` is the next id not yet acknowledged.
    let acked = Arc::new(AtomicU64::new(1));
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let (acked, stop, db) = (acked.clone(), stop.clone(), db.clone());
        tokio::spawn(async move {
            let mut c = mysql_async::Conn::new(mysql_async::Opts::from_url(&mysql_url())?).await?;
            while !stop.load(Ordering::SeqCst) {
                let from = acked.load(Ordering::SeqCst);
                c.query_drop(insert(&db, from, 50)).await?;
                acked.store(from + 50, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            anyhow::Ok(())
        })
    };

    let ch = clickhouse::Client::default()
        .with_url(clickhouse_url())
        .with_validation(false);
    let scenarios: [(&str, bool, bool); 3] = [
        ("killed, not restarted", false, false),
        (
            "killed, restarted at once, consumer.instance_id set",
            true,
            true,
        ),
        ("killed, restarted at once, no instance_id", true, false),
    ];
    let mut results: Vec<(&str, Vec<f64>)> = Vec::new();
    let mut others: Vec<(&str, Vec<String>)> = Vec::new();
    // Every case's seconds, for target/bench/recovery.json: (case, seconds, goal).
    let mut cases: Vec<serde_json::Value> = Vec::new();
    let mut probe = 1_000_000_000u64;
    for (name, restart, static_members) in scenarios {
        if !runs_group("apply") {
            break;
        }
        let mut times = Vec::new();
        for run in 0..runs {
            let (ch_db, group) = fresh_mirror(&ch).await?;
            let config = |member: &str| {
                apply_config(
                    &ch_db,
                    &group,
                    &prefix,
                    static_members.then_some(member),
                    session_ms,
                )
            };
            let apply = release.join("apply-clickhouse");
            let (a, a_port, _a_file) = spawn_stage(&apply, &config("a"))?;
            let (b, b_port, _b_file) = spawn_stage(&apply, &config("b"))?;
            // Both members hold partitions, and the mirror has caught up with the topic.
            wait_until(Duration::from_secs(120), "both instances assigned", || {
                let (na, nb) = (assigned(a_port), assigned(b_port));
                na > 0 && nb > 0 && na + nb == PARTITIONS
            })
            .await?;
            insert_probe(&mut c, &db, probe).await?;
            wait_probe(&ch, &ch_db, probe, Duration::from_secs(180)).await?;
            probe += PROBE;

            let mut a = a;
            a.kill()?;
            let killed = Instant::now();
            let _ = a.wait();
            let restarted: Option<(Child, tempfile::NamedTempFile)> = if restart {
                let (child, _, file) = spawn_stage(&apply, &config("a"))?;
                Some((child, file))
            } else {
                None
            };
            insert_probe(&mut c, &db, probe).await?;
            wait_probe(&ch, &ch_db, probe, Duration::from_secs(300)).await?;
            let took = killed.elapsed().as_secs_f64();
            probe += PROBE;
            eprintln!("{name}, run {}: {took:.2} s", run + 1);
            times.push(took);

            check_complete(&mut c, &ch, &db, &ch_db, &acked, name).await?;
            stop_child(b);
            if let Some((child, _file)) = restarted {
                stop_child(child);
            }
            ch.query(&format!("DROP DATABASE {ch_db}"))
                .execute()
                .await?;
        }
        cases.push(serde_json::json!({
            "name": format!("apply-clickhouse, one of two {name}"),
            "seconds": times,
            "goal_seconds": (restart && static_members).then_some(5.0),
        }));
        results.push((name, times));
    }
    // The capture and the broker, with one apply instance reading every partition.
    let mut breakdown: Vec<String> = Vec::new();
    for (name, group_name) in [
        ("capture-mysql killed, restarted at once", "capture"),
        ("Kafka broker restarted", "broker"),
    ] {
        if !runs_group(group_name) {
            continue;
        }
        // (the test bed's address, which `deploy/testbed.sh env` exports too)
        let testbed_broker = kafka_brokers() == "127.0.0.1:19092";
        if group_name == "broker" && !testbed_broker {
            eprintln!("{name}: left out (the broker is not the test bed's)");
            continue;
        }
        let mut times = Vec::new();
        let mut seconds = Vec::new();
        for run in 0..runs {
            let (ch_db, group) = fresh_mirror(&ch).await?;
            let config = apply_config(&ch_db, &group, &prefix, Some("a"), session_ms);
            let (a, a_port, _a_file) = spawn_stage(&release.join("apply-clickhouse"), &config)?;
            wait_until(Duration::from_secs(120), "the instance assigned", || {
                assigned(a_port) == PARTITIONS
            })
            .await?;
            insert_probe(&mut c, &db, probe).await?;
            wait_probe(&ch, &ch_db, probe, Duration::from_secs(180)).await?;
            probe += PROBE;

            let killed = Instant::now();
            let mut commands = 0.0;
            let mut phases: Option<std::thread::JoinHandle<Phases>> = None;
            if group_name == "capture" {
                capture.kill()?;
                let _ = capture.wait();
                (capture, capture_port, capture_file) =
                    spawn_stage(&release.join("capture-mysql"), &capture_config)?;
                insert_probe(&mut c, &db, probe).await?;
            } else {
                let testbed =
                    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/testbed.sh");
                let mut sampler = None;
                for step in ["stop", "start"] {
                    let status = std::process::Command::new(&testbed)
                        .args([step, "kafka"])
                        .stdout(std::process::Stdio::null())
                        .status()?;
                    anyhow::ensure!(status.success(), "deploy/testbed.sh {step} kafka failed");
                    if step == "stop" {
                        insert_probe(&mut c, &db, probe).await?;
                        sampler = Some(Phases::sample(capture_port, a_port, killed));
                    }
                }
                commands = killed.elapsed().as_secs_f64();
                phases = sampler;
            }
            wait_probe(&ch, &ch_db, probe, Duration::from_secs(300)).await?;
            let took = killed.elapsed().as_secs_f64();
            if let Some(p) = phases.take() {
                let p = p.join().expect("the sampler");
                eprintln!("{name}, run {}: {}", run + 1, p.describe(commands, took));
                breakdown.push(p.describe(commands, took));
            }
            probe += PROBE;
            eprintln!("{name}, run {}: {took:.2} s", run + 1);
            seconds.push(took);
            times.push(if commands > 0.0 {
                format!("{took:.1} (stop and start {commands:.1})")
            } else {
                format!("{took:.1}")
            });
            check_complete(&mut c, &ch, &db, &ch_db, &acked, name).await?;
            stop_child(a);
            ch.query(&format!("DROP DATABASE {ch_db}"))
                .execute()
                .await?;
        }
        cases.push(serde_json::json!({
            "name": name,
            "seconds": seconds,
            "goal_seconds": if group_name == "broker" { 10.0 } else { 5.0 },
        }));
        others.push((name, times));
    }
    drop(capture_file);
    stop.store(true, Ordering::SeqCst);
    writer.await??;
    stop_child(capture);
    c.query_drop(format!("DROP DATABASE `{db}`")).await?;

    let m = sluice_bench::measure::machine();
    println!(
        "{} cores, Kafka on the same machine, 6 partitions, 500 rows/s offered, \
         session.timeout.ms {}; checked: no row missing after each run",
        m.cores,
        if session_ms > 0 {
            session_ms.to_string()
        } else {
            "the stage's default".into()
        },
    );
    if !results.is_empty() {
        println!();
        println!("apply-clickhouse, kill -9 of one of two instances -> every partition read again");
        println!("| how | kill -> flowing, s (each run) |");
        println!("|---|---|");
    }
    for (name, times) in &results {
        let each: Vec<String> = times.iter().map(|t| format!("{t:.1}")).collect();
        println!("| {name} | {} |", each.join(" / "));
    }
    if !others.is_empty() {
        println!();
        println!(
            "The capture and the broker, one apply-clickhouse instance (static membership) \
             reading every partition: kill or stop -> the probe rows in ClickHouse"
        );
        println!("| how | -> flowing, s (each run) |");
        println!("|---|---|");
        for (name, times) in &others {
            println!("| {name} | {} |", times.join(" / "));
        }
    }
    sluice_bench::measure::write_json(
        "recovery.json",
        &serde_json::json!({
            "benchmark": "recovery: kill -9 of a stage, a broker restart",
            "machine": m.json(),
            "cases": cases,
            "broker_restart_breakdown": breakdown,
        }),
    )?;
    if !breakdown.is_empty() {
        println!();
        println!(
            "After the broker restart, from the stop's start (s): the broker back (the start \
             command returned), then the capture's first delivery acknowledged, its first \
             checkpoint committed, apply's first rows written, and the probe in ClickHouse"
        );
        for (run, b) in breakdown.iter().enumerate() {
            println!("- run {}: {b}", run + 1);
        }
    }
    Ok(())
}

/// A new mirror database, and a new consumer group name.
async fn fresh_mirror(ch: &clickhouse::Client) -> anyhow::Result<(String, String)> {
    let ch_db = format!("{}_mirror", unique("recovery"));
    ch.query(&format!("CREATE DATABASE {ch_db}"))
        .execute()
        .await?;
    Ok((ch_db, unique("recovery_group")))
}

/// An apply-clickhouse instance's config: static membership as `member` when given.
fn apply_config(
    ch_db: &str,
    group: &str,
    prefix: &str,
    member: Option<&str>,
    session_ms: u64,
) -> String {
    let mut text = format!(
        "[clickhouse]\nurl = \"{}\"\ndatabase = \"{ch_db}\"\n\
         [consumer]\ngroup_id = \"{group}\"\ntopics = [\"^{prefix}\\\\..*\"]\n",
        clickhouse_url(),
    );
    if let Some(member) = member {
        text.push_str(&format!("instance_id = \"{group}-{member}\"\n"));
    }
    text.push_str(&format!(
        "[batch]\nmax_wait_ms = 100\n[kafka]\nbrokers = \"{}\"\n",
        kafka_brokers()
    ));
    if session_ms > 0 {
        text.push_str(&format!(
            "[kafka.properties]\n\"session.timeout.ms\" = \"{session_ms}\"\n"
        ));
    }
    text
}

/// Nothing the writer had inserted (below `acked`) is missing from the mirror.
async fn check_complete(
    c: &mut mysql_async::Conn,
    ch: &clickhouse::Client,
    db: &str,
    ch_db: &str,
    acked: &AtomicU64,
    name: &str,
) -> anyhow::Result<()> {
    let upto = acked.load(Ordering::SeqCst);
    let want: u64 = c
        .query_first(format!("SELECT COUNT(*) FROM `{db}`.t WHERE id < {upto}"))
        .await?
        .unwrap_or(0);
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let got: u64 = ch
            .query(&format!(
                "SELECT count() FROM {ch_db}.t FINAL WHERE id < {upto}"
            ))
            .fetch_one()
            .await
            .unwrap_or(0);
        if got == want {
            return Ok(());
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "{name}: the mirror holds {got} of the {want} rows below id {upto}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn insert(db: &str, from: u64, n: u64) -> String {
    let values: Vec<String> = (from..from + n)
        .map(|i| format!("({i},{})", i % 97))
        .collect();
    format!("INSERT INTO `{db}`.t (id, v) VALUES {}", values.join(","))
}

async fn insert_probe(c: &mut mysql_async::Conn, db: &str, from: u64) -> anyhow::Result<()> {
    c.query_drop(insert(db, from, PROBE)).await?;
    Ok(())
}

/// Wait until ClickHouse holds every row of the probe starting at `from`.
async fn wait_probe(
    ch: &clickhouse::Client,
    ch_db: &str,
    from: u64,
    limit: Duration,
) -> anyhow::Result<()> {
    let deadline = Instant::now() + limit;
    loop {
        let n: u64 = ch
            .query(&format!(
                "SELECT count() FROM {ch_db}.t FINAL WHERE id >= {from} AND id < {}",
                from + PROBE
            ))
            .fetch_one()
            .await
            .unwrap_or(0); // the table may not exist yet
        if n == PROBE {
            return Ok(());
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "probe rows {from}.. not all in ClickHouse after {limit:?} ({n} of {PROBE})"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn assigned(port: u16) -> u64 {
    scrape(port)
        .map(|b| metric(&b, "sluice_apply_assigned_partitions") as u64)
        .unwrap_or(0)
}

async fn wait_until(
    limit: Duration,
    what: &str,
    mut ok: impl FnMut() -> bool,
) -> anyhow::Result<()> {
    let deadline = Instant::now() + limit;
    while !ok() {
        anyhow::ensure!(Instant::now() < deadline, "{what}: not after {limit:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Ok(())
}

/// When, after the broker went down, each stage did its first work again.
struct Phases {
    /// Seconds from the stop's start: the capture's first delivery acknowledged, its first
    /// checkpoint committed, apply's first rows written (None: not within 300 s).
    ack: Option<f64>,
    checkpoint: Option<f64>,
    rows: Option<f64>,
}

impl Phases {
    /// Poll both stages' metrics every 50 ms from now (the broker is down) until each of the
    /// three counters has grown, or 300 s.
    fn sample(capture: u16, apply: u16, from: Instant) -> std::thread::JoinHandle<Phases> {
        let read = move || {
            let c = scrape(capture).unwrap_or_default();
            let a = scrape(apply).unwrap_or_default();
            (
                metric(&c, "sluice_capture_produce_latency_seconds_count"),
                metric(&c, "sluice_capture_checkpoints_total"),
                metric(&a, "sluice_apply_rows_total"),
            )
        };
        std::thread::spawn(move || {
            let base = read();
            let mut p = Phases {
                ack: None,
                checkpoint: None,
                rows: None,
            };
            let deadline = Instant::now() + Duration::from_secs(300);
            while (p.ack.is_none() || p.checkpoint.is_none() || p.rows.is_none())
                && Instant::now() < deadline
            {
                std::thread::sleep(Duration::from_millis(50));
                let now = read();
                let t = from.elapsed().as_secs_f64();
                if p.ack.is_none() && now.0 > base.0 {
                    p.ack = Some(t);
                }
                if p.checkpoint.is_none() && now.1 > base.1 {
                    p.checkpoint = Some(t);
                }
                if p.rows.is_none() && now.2 > base.2 {
                    p.rows = Some(t);
                }
            }
            p
        })
    }

    fn describe(&self, back: f64, probe: f64) -> String {
        let f = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.1}"));
        format!(
            "broker back {back:.1}, capture acked {}, checkpoint {}, apply wrote {}, probe {probe:.1}",
            f(self.ack),
            f(self.checkpoint),
            f(self.rows)
        )
    }
}
