//! Appliers that lost their group session come back by themselves: the broker is stopped for
//! longer than the consumers' session timeout (every member's session times out and its
//! partitions are revoked as lost), then started again; each applier holds partitions again
//! within seconds, and the rows written meanwhile reach the mirror. The capture, whose records
//! are not acknowledged meanwhile, says it is stalled in `/healthz`, and moves on after.
//!
//! It restarts the broker, so it runs only against the test bed's own (skipped, and says so,
//! when `SLUICE_KAFKA_BROKERS` names another).

use std::time::{Duration, Instant};

use mysql_async::prelude::Queryable;
use sluice_tests::capture::{healthz, metric_at, CaptureProcess};
use sluice_tests::faults::{testbed, testbed_broker};
use sluice_tests::to_clickhouse::*;
use sluice_tests::{unique, w1_insert};

/// Both tests stop the one broker: one at a time.
static BROKER: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The partitions each applier holds now (its `sluice_apply_assigned_partitions`).
fn held(appliers: &[&CaptureProcess]) -> Vec<i64> {
    appliers
        .iter()
        .map(|a| {
            metric_at(a.metrics_port, "sluice_apply_assigned_partitions").unwrap_or(-1.0) as i64
        })
        .collect()
}

/// Wait until the appliers hold `total` partitions between them, each at least one; the time
/// it took.
async fn every_applier_holds_partitions(
    appliers: &mut [&mut CaptureProcess],
    total: i64,
    limit: Duration,
    what: &str,
) -> Duration {
    let start = Instant::now();
    loop {
        let now = held(&appliers.iter().map(|a| &**a).collect::<Vec<_>>());
        if now.iter().all(|&n| n > 0) && now.iter().sum::<i64>() == total {
            return start.elapsed();
        }
        if start.elapsed() > limit {
            let logs: Vec<String> = appliers.iter_mut().map(|a| a.stop().1).collect();
            panic!(
                "{what}: the appliers hold {now:?} partitions {:?} on (of {total}, each at least \
                 one); their logs:\n{}",
                start.elapsed(),
                logs.join("\n---- next applier ----\n")
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn appliers_whose_session_timed_out_while_the_broker_was_down_hold_partitions_again() {
    if !testbed_broker() {
        println!("skipped: it restarts the broker, and SLUICE_KAFKA_BROKERS names one the test bed did not start");
        return;
    }
    let _broker = BROKER.lock().await;
    // (`pipeline`, with a capture that says it is stalled 5 s after its records stop being
    // acknowledged)
    let db = unique("sluice_t_rejoin");
    let m_db = format!("{db}_mirror");
    ch_exec(format!("CREATE DATABASE {m_db}")).await;
    let (text, connector, prefix) =
        CaptureProcess::config(&db, &sluice_tests::capture::binlog_end().await, "");
    let text = text.replace(
        "heartbeat_ms = 1000\n",
        "heartbeat_ms = 1000\nstalled_after_ms = 5000\n",
    );
    let mut cap = CaptureProcess::spawn((text, connector, prefix));
    let mut c = w1_source(&db).await;
    c.query_drop(w1_insert(&db, 1, 100)).await.unwrap();
    let group = unique("g");
    // A session of 10 s (the default, 30 s, outlives an ordinary broker restart: the test below)
    // so that 30 s down loses it.
    let session = "[kafka.properties]\n\"session.timeout.ms\" = \"10000\"\n";
    let mut a = apply(&cap.prefix, &m_db, "mirror", &group, session);
    let mut b = apply(&cap.prefix, &m_db, "mirror", &group, session);
    converge(&db, &m_db, Duration::from_secs(60)).await;
    // The W1 topic has 3 partitions.
    every_applier_holds_partitions(&mut [&mut a, &mut b], 3, Duration::from_secs(60), "before")
        .await;

    // Down for three times their session timeout (10 s): each member's session times out, and
    // its partitions are lost.
    // (started again however the test ends: later tests need it; by a caller holding a file
    // open, which the broker must not inherit)
    let held = tempfile::NamedTempFile::new().unwrap();
    struct Restart(std::path::PathBuf);
    impl Drop for Restart {
        fn drop(&mut self) {
            let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy/testbed.sh");
            let ok = std::process::Command::new("bash")
                .arg("-c")
                .arg(format!(
                    "exec 9>>'{}' && bash '{script}' start kafka",
                    self.0.display()
                ))
                .status()
                .is_ok_and(|s| s.success());
            if !ok {
                testbed(&["start", "kafka"]);
            }
        }
    }
    tokio::task::spawn_blocking(|| testbed(&["stop", "kafka"]))
        .await
        .unwrap();
    let restart = Restart(held.path().to_path_buf());
    // Rows the capture reads and cannot hand over.
    c.query_drop(w1_insert(&db, 201, 10)).await.unwrap();
    // 15 s after the broker's last answer (looked for every 5 s, each look up to 3 s a
    // request), each applier's /healthz says so.
    let down = Instant::now();
    for (name, p) in [("a", &a), ("b", &b)] {
        loop {
            let h = healthz(p.metrics_port).unwrap_or_default();
            if h.starts_with("HTTP/1.1 503") && h.contains("no answer from the Kafka brokers") {
                break;
            }
            assert!(
                down.elapsed() < Duration::from_secs(28),
                "applier {name}'s /healthz {:?} into the outage: {h}",
                down.elapsed()
            );
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    }
    loop {
        let h = healthz(cap.metrics_port).unwrap_or_default();
        if h.starts_with("HTTP/1.1 503") && h.contains("the capture is stalled") {
            assert_eq!(
                metric_at(cap.metrics_port, "sluice_capture_stalled"),
                Some(1.0),
                "the stall in the metric too"
            );
            break;
        }
        assert!(
            down.elapsed() < Duration::from_secs(28),
            "the capture's /healthz {:?} into the outage, with rows to publish: {h}",
            down.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    tokio::time::sleep(Duration::from_secs(30).saturating_sub(down.elapsed())).await;
    c.query_drop(w1_insert(&db, 101, 50)).await.unwrap();
    tokio::task::spawn_blocking(move || drop(restart))
        .await
        .unwrap();
    let took = every_applier_holds_partitions(
        &mut [&mut a, &mut b],
        3,
        Duration::from_secs(90),
        "after the broker came back",
    )
    .await;
    println!("every applier held partitions again {took:?} after the broker was back");
    // The broker did not inherit the descriptor its starter held.
    let status = std::process::Command::new("bash")
        .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy/testbed.sh"))
        .arg("status")
        .output()
        .unwrap();
    let status = String::from_utf8_lossy(&status.stdout).into_owned();
    let pid = status
        .lines()
        .find(|l| l.starts_with("kafka "))
        .and_then(|l| l.split_whitespace().skip_while(|w| *w != "pid").nth(1))
        .unwrap_or_else(|| panic!("no kafka pid in {status}"))
        .to_string();
    let inherited: Vec<_> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .filter(|l| l == held.path())
        .collect();
    assert!(
        inherited.is_empty(),
        "the broker holds {inherited:?}, its starter's"
    );
    converge(&db, &m_db, Duration::from_secs(60)).await;
    // The capture moves again, and says so.
    let start = Instant::now();
    loop {
        let h = healthz(cap.metrics_port).unwrap_or_default();
        if h.starts_with("HTTP/1.1 200") {
            assert_eq!(
                metric_at(cap.metrics_port, "sluice_capture_stalled"),
                Some(0.0)
            );
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "the capture's /healthz after the outage: {h}"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    // Healthy again, and no partition left unheld.
    for (name, p) in [("a", &a), ("b", &b)] {
        let start = Instant::now();
        loop {
            let h = healthz(p.metrics_port).unwrap_or_default();
            let unheld = metric_at(p.metrics_port, "sluice_apply_unheld_partitions");
            if h.starts_with("HTTP/1.1 200") && unheld == Some(0.0) {
                break;
            }
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "applier {name}: {unheld:?} unheld partitions, /healthz: {h}"
            );
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    }
    for (name, p) in [("a", &mut a), ("b", &mut b)] {
        let log = p.stop_ok();
        let running = log.split("shutting down").next().unwrap_or_default();
        assert!(
            running.contains("the partitions were lost") || running.contains("rebalance: revoked"),
            "applier {name} never lost its partitions, so the test tried nothing:\n{log}"
        );
        // A broker outage is said, not shouted: librdkafka's transport failures (which it
        // retries by itself) are warnings, each kind once a minute.
        let errors: Vec<&str> = log.lines().filter(|l| l.contains(" ERROR ")).collect();
        assert!(
            errors.is_empty(),
            "applier {name} logged errors:\n{}",
            errors.join("\n")
        );
        let said = log
            .lines()
            .filter(|l| l.contains("librdkafka retries by itself"))
            .count();
        assert!(
            (1..=12).contains(&said),
            "applier {name}: {said} lines about the broker:\n{log}"
        );
    }
    let log = cap.stop_ok();
    assert!(
        log.contains("stalled") && log.contains("moving again after a stall"),
        "{log}"
    );
    finish(&db, &mut []).await;
}

/// A broker restart shorter than the session timeout (30 s, the stage's default) costs no
/// rebalance: the broker down for about 15 s (a stop, 6 s, a start), the applier keeps its
/// partitions throughout, never revoked or lost, and the rows written meanwhile arrive.
#[tokio::test(flavor = "multi_thread")]
async fn a_broker_restart_within_the_session_timeout_keeps_every_applier_in_its_group() {
    if !testbed_broker() {
        println!("skipped: it restarts the broker, and SLUICE_KAFKA_BROKERS names one the test bed did not start");
        return;
    }
    let _broker = BROKER.lock().await;
    let (db, m_db, mut cap) = pipeline("sluice_t_brokerbounce", "_mirror").await;
    let mut c = w1_source(&db).await;
    c.query_drop(w1_insert(&db, 1, 100)).await.unwrap();
    let mut a = apply(&cap.prefix, &m_db, "mirror", &unique("g"), "");
    converge(&db, &m_db, Duration::from_secs(60)).await;
    every_applier_holds_partitions(&mut [&mut a], 3, Duration::from_secs(60), "before").await;
    let down = Instant::now();
    tokio::task::spawn_blocking(|| {
        testbed(&["stop", "kafka"]);
        std::thread::sleep(Duration::from_secs(6));
        testbed(&["start", "kafka"]);
    })
    .await
    .unwrap();
    println!("the broker was down for {:?}", down.elapsed());
    c.query_drop(w1_insert(&db, 101, 50)).await.unwrap();
    converge(&db, &m_db, Duration::from_secs(60)).await;
    assert_eq!(held(&[&a]), [3], "partitions held after the restart");
    let log = a.stop_ok();
    // (up to the stop, whose own revocation ends every run)
    let running = log.split("shutting down").next().unwrap_or_default();
    assert!(
        !running.contains("rebalance: revoked") && !running.contains("the partitions were lost"),
        "a restart of {:?} cost a rebalance:\n{log}",
        down.elapsed()
    );
    // Said, not shouted: a few lines, not one per poll.
    let warnings = running.lines().filter(|l| l.contains(" WARN ")).count();
    assert!(warnings <= 6, "{warnings} warnings:\n{log}");
    finish(&db, &mut [&mut cap]).await;
}

/// capture-mongo, with the broker stopped while the source is written: its records go
/// unacknowledged, and its `/healthz` says it is stalled; once the broker is back it moves on
/// and says so, and every change reaches Kafka.
#[tokio::test(flavor = "multi_thread")]
async fn a_mongo_capture_whose_records_go_unacknowledged_says_it_is_stalled() {
    if !testbed_broker() {
        println!("skipped: it restarts the broker, and SLUICE_KAFKA_BROKERS names one the test bed did not start");
        return;
    }
    let _broker = BROKER.lock().await;
    use sluice_tests::mongo;
    let db = unique("sluice_m_stall");
    let src = mongo::client(sluice_tests::mongo_source_url()).await;
    let mut cap = mongo::capture(&db, "mode = \"oplog\"\nstalled_after_ms = 3000", "");
    mongo::started(&cap, true).await;
    let coll = src.database(&db).collection::<mongodb::bson::Document>("c");
    coll.insert_one(mongodb::bson::doc! { "_id": 0 })
        .await
        .unwrap();
    let healthy = |cap: &CaptureProcess, limit: Duration, what: &str| {
        let start = Instant::now();
        loop {
            let h = healthz(cap.metrics_port).unwrap_or_default();
            if h.starts_with("HTTP/1.1 200") {
                return;
            }
            assert!(start.elapsed() < limit, "{what}: {h}");
            std::thread::sleep(Duration::from_millis(300));
        }
    };
    tokio::task::block_in_place(|| healthy(&cap, Duration::from_secs(30), "before"));
    // (its topic made and its first record acknowledged before the broker goes)
    let topic = format!("{}.{db}.c", cap.prefix);
    tokio::task::spawn_blocking({
        let topic = topic.clone();
        move || {
            sluice_tests::capture::read_events(&topic, Duration::from_secs(30), |e| {
                sluice_tests::capture::count_rows(e) >= 1
            })
        }
    })
    .await
    .unwrap();
    tokio::task::spawn_blocking(|| testbed(&["stop", "kafka"]))
        .await
        .unwrap();
    let down = Instant::now();
    for i in 1..=20 {
        coll.insert_one(mongodb::bson::doc! { "_id": i })
            .await
            .unwrap();
    }
    let stalled = loop {
        let h = healthz(cap.metrics_port).unwrap_or_default();
        if h.starts_with("HTTP/1.1 503") && h.contains("the capture is stalled") {
            break h;
        }
        if down.elapsed() > Duration::from_secs(30) {
            testbed(&["start", "kafka"]);
            let (_, log) = cap.stop();
            panic!(
                "capture-mongo's /healthz 30 s into the outage, with changes to publish: {h}\n{log}"
            );
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    };
    tokio::task::spawn_blocking(|| testbed(&["start", "kafka"]))
        .await
        .unwrap();
    tokio::task::block_in_place(|| healthy(&cap, Duration::from_secs(60), "after the outage"));
    let log = cap.stop_ok();
    assert!(
        log.contains("moving again after a stall"),
        "{stalled}\n{log}"
    );
    let events = tokio::task::spawn_blocking({
        move || {
            let e = sluice_tests::capture::read_events(&topic, Duration::from_secs(30), |e| {
                sluice_tests::capture::count_rows(e) >= 21
            });
            sluice_tests::capture::count_rows(&e)
        }
    })
    .await
    .unwrap();
    assert_eq!(events, 21, "every insert published");
    src.database(&db).drop().await.unwrap();
}
