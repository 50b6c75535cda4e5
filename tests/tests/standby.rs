//! A standby pair of captures under load: MariaDB -> capture-mysql ×2 (`[standby] enabled`,
//! one connector) -> Kafka -> apply-clickhouse -> ClickHouse, while a writer inserts, updates
//! and deletes.
//!
//! 1. The active one is killed (-9): the standby takes over within the session timeout and
//!    rows flow again.
//! 2. The killed one comes back as a standby; the active one is paused (SIGSTOP) until the
//!    other took over, then resumed: it must find itself no longer active (or fenced) and exit 1,
//!    without a checkpoint of its own after its successor's start.
//! 3. The writer stops, and the mirror equals the source: nothing lost, nothing extra, nothing
//!    stale.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use mysql_async::prelude::Queryable;
use sluice_tests::capture::{binlog_end, metric_at, CaptureProcess};
use sluice_tests::{mirror, mysql_url, seed, unique, Rng};

/// The election's session timeout the captures run with (the broker's minimum by default).
const SESSION: Duration = Duration::from_millis(6000);

/// The largest id the mirror has (deleted rows included).
async fn mirror_max(ch: &clickhouse::Client, ch_db: &str) -> u64 {
    ch.query(&format!("SELECT max(id) FROM {ch_db}.t"))
        .fetch_one::<u64>()
        .await
        .unwrap_or(0)
}

fn active(p: &CaptureProcess) -> Option<bool> {
    metric_at(p.metrics_port, "sluice_capture_active").map(|v| v == 1.0)
}

/// Wait until `p` says it is the active one; how long that took.
async fn until_active(p: &mut CaptureProcess, limit: Duration, what: &str) -> Duration {
    let t0 = Instant::now();
    loop {
        if active(p) == Some(true) {
            return t0.elapsed();
        }
        if p.exited() || t0.elapsed() > limit {
            panic!(
                "{what}: not active after {:?}; its log:\n{}",
                t0.elapsed(),
                p.stop().1
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Wait until the mirror has a row the writer inserted at or after `from`; how long that took.
async fn until_flowing(
    ch: &clickhouse::Client,
    ch_db: &str,
    from: u64,
    limit: Duration,
    what: &str,
) -> Duration {
    let t0 = Instant::now();
    loop {
        if mirror_max(ch, ch_db).await >= from {
            return t0.elapsed();
        }
        assert!(t0.elapsed() < limit, "{what}: no new row after {limit:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn signal(p: &CaptureProcess, sig: &str) {
    let ok = std::process::Command::new("kill")
        .args([sig, &p.child.id().to_string()])
        .status()
        .unwrap()
        .success();
    assert!(ok, "kill {sig}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_standby_capture_takes_over_from_a_killed_one_and_a_revived_one_cannot_write() {
    let seed = seed();
    let db = unique("sluice_standby");
    let ch_db = format!("{db}_m");
    let (mut c, ch) = mirror::make(&db).await;

    // Two instances of one connector, one configuration but for the instance name (the same
    // server_id too, as two pods of one Deployment have).
    let (text, connector, prefix) = CaptureProcess::config(
        &db,
        &binlog_end().await,
        &format!(
            "[standby]\nenabled = true\ninstance = \"a\"\nsession_timeout_ms = {}\n",
            SESSION.as_millis()
        ),
    );
    let config_of = |name: &str| {
        (
            text.replace("instance = \"a\"", &format!("instance = \"{name}\"")),
            connector.clone(),
            prefix.clone(),
        )
    };
    let mut a = CaptureProcess::spawn(config_of("a"));
    until_active(&mut a, Duration::from_secs(60), "the first instance").await;
    let mut b = CaptureProcess::spawn(config_of("b"));
    let t0 = Instant::now();
    while active(&b).is_none() {
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "the second instance does not serve its metrics"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let mut apply = CaptureProcess::apply_clickhouse(&prefix, &ch_db, &unique("dlq"));

    // The load.
    let stop = Arc::new(AtomicBool::new(false));
    let next_id = Arc::new(AtomicU64::new(1));
    let writer = {
        let (stop, db, next_id) = (stop.clone(), db.clone(), next_id.clone());
        let mut rng = Rng(seed ^ 0x5bd1_e995);
        tokio::spawn(async move {
            let mut c = mysql_async::Conn::new(mysql_async::Opts::from_url(&mysql_url()).unwrap())
                .await
                .unwrap();
            let mut rounds = 0u64;
            while !stop.load(Ordering::SeqCst) {
                let next = next_id.load(Ordering::SeqCst);
                let n = 1 + rng.below(5);
                let values: Vec<String> = (next..next + n)
                    .map(|id| format!("({id}, {}, 's{id}')", rng.below(1000)))
                    .collect();
                let mut sql = format!(
                    "START TRANSACTION;INSERT INTO `{db}`.t VALUES {};",
                    values.join(",")
                );
                let top = next + n - 1;
                for _ in 0..2 {
                    sql += &format!(
                        "UPDATE `{db}`.t SET v = v + 1, s = 'u{}' WHERE id = {};",
                        rng.below(1_000_000),
                        1 + rng.below(top)
                    );
                }
                if rng.chance(30) {
                    sql += &format!("DELETE FROM `{db}`.t WHERE id = {};", 1 + rng.below(top));
                }
                sql += "COMMIT";
                c.query_drop(sql).await.unwrap();
                next_id.store(next + n, Ordering::SeqCst);
                rounds += 1;
                tokio::time::sleep(Duration::from_millis(10 + rng.below(20))).await;
            }
            rounds
        })
    };
    until_flowing(&ch, &ch_db, 20, Duration::from_secs(60), "the start").await;
    tokio::time::sleep(Duration::from_millis(500 + Rng(seed).below(2000))).await;

    // 1. kill -9 of the active one.
    assert_eq!(active(&b), Some(false), "the second instance is a standby");
    a.kill();
    let killed = Instant::now();
    let killed_at = next_id.load(Ordering::SeqCst);
    let takeover = until_active(&mut b, SESSION + Duration::from_secs(20), "the standby").await;
    until_flowing(
        &ch,
        &ch_db,
        killed_at,
        SESSION + Duration::from_secs(30),
        "after the kill",
    )
    .await;
    let flowing = killed.elapsed();
    eprintln!(
        "seed {seed}: kill -9 of the active capture: the standby active after {takeover:?}, \
         rows written after the kill in ClickHouse {flowing:?} after it"
    );

    // 2. The killed one back, as a standby; the active one paused past the session timeout.
    a.restart();
    let t0 = Instant::now();
    while active(&a) != Some(false) {
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "the restarted one is no standby"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(active(&b), Some(true), "one active instance");
    signal(&b, "-STOP");
    let paused_at = next_id.load(Ordering::SeqCst);
    let takeover = until_active(
        &mut a,
        SESSION + Duration::from_secs(20),
        "the restarted one",
    )
    .await;
    until_flowing(
        &ch,
        &ch_db,
        paused_at,
        SESSION + Duration::from_secs(30),
        "after the pause",
    )
    .await;
    eprintln!("seed {seed}: the paused capture replaced after {takeover:?}");
    tokio::time::sleep(Duration::from_secs(1)).await;
    signal(&b, "-CONT");
    let (code, log) = b.wait(Duration::from_secs(40));
    assert_eq!(code, Some(1), "the revived instance must stop: {log}");
    assert!(
        log.contains("is no longer the active capture")
            || log.contains("another capture was started with the same connector name"),
        "why it stopped: {log}"
    );
    assert!(log.contains(&connector), "{log}");

    // 3. The writer stops; the mirror equals the source.
    tokio::time::sleep(Duration::from_secs(2)).await;
    stop.store(true, Ordering::SeqCst);
    let rounds = writer.await.unwrap();
    let want = mirror::source(&db).await;
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let got = mirror::mirror(&ch, &ch_db).await;
        if got == want {
            break;
        }
        if Instant::now() > deadline {
            panic!(
                "seed {seed}: {}\nactive capture:\n{}\napply:\n{}",
                mirror::differences(&got, &want),
                a.stop().1,
                apply.stop().1
            );
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    eprintln!("seed {seed}: {rounds} writer rounds, {} rows", want.len());
    let (code, log) = a.stop();
    assert_eq!(code, Some(0), "{log}");
    assert!(
        log.contains("this instance is now the active capture"),
        "{log}"
    );
    let (code, log) = apply.stop();
    assert_eq!(code, Some(0), "{log}");
    c.query_drop(format!("DROP DATABASE `{db}`")).await.unwrap();
}
