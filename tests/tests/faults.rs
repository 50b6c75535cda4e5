//! Faults under load, at random moments: MariaDB -> capture-mysql -> Kafka -> two
//! apply-clickhouse instances of one group -> ClickHouse, while a writer inserts, updates and
//! deletes. One after the other, in a seeded order and at seeded moments: an applier killed
//! (-9) and restarted, an applier stopped (SIGTERM, which must exit 0) and restarted, the Kafka
//! broker restarted, ClickHouse cut off for a while (a relay between the appliers and the
//! server), a partition added to the table's topic. Every kind happens at least once. Then the
//! writer stops, and the mirror must equal the source: nothing missing, nothing stale, nothing
//! extra, no dead letter, and no process that exited on its own.
//!
//! The broker restart needs the test bed's broker (`deploy/testbed.sh`); with a broker of one's
//! own (`SLUICE_KAFKA_BROKERS`) that fault is left out, and the test says so.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use mysql_async::prelude::Queryable;
use sluice_tests::capture::{binlog_end, CaptureProcess};
use sluice_tests::relay::Relay;
use sluice_tests::{clickhouse_url, faults, kafka_brokers, mirror, mysql_url, seed, unique, Rng};

const FAULTS_FOR: Duration = Duration::from_secs(60);

fn applier(
    prefix: &str,
    ch_url: &str,
    ch_db: &str,
    group: &str,
    name: &str,
    dlq: &str,
) -> CaptureProcess {
    let config = format!(
        "[clickhouse]\nurl = \"{ch_url}\"\ndatabase = \"{ch_db}\"\n\
         [consumer]\ngroup_id = \"{group}\"\ninstance_id = \"{name}\"\ntopics = [\"^{}\\\\..*\"]\n\
         [batch]\nmax_wait_ms = 200\n[errors]\ndead_letter_topic = \"{dlq}\"\n\
         [kafka]\nbrokers = \"{}\"\n",
        prefix.replace('.', "\\\\."),
        kafka_brokers()
    );
    CaptureProcess::spawn_binary("apply-clickhouse", (config, String::new(), String::new()))
}

#[tokio::test(flavor = "multi_thread")]
async fn the_mirror_equals_the_source_after_random_faults_under_load() {
    let seed = seed();
    let db = unique("sluice_faults");
    let ch_db = format!("{db}_m");
    let (mut c, ch) = mirror::make(&db).await;
    let relay = Relay::to(&clickhouse_url()).await;
    let mut cap = CaptureProcess::spawn(CaptureProcess::config(&db, &binlog_end().await, ""));
    let topic = cap.topic(&db, "t");
    let (group, dlq) = (unique("g"), unique("dlq"));
    let mut appliers = [
        applier(&cap.prefix, &relay.http_url(), &ch_db, &group, "a", &dlq),
        applier(&cap.prefix, &relay.http_url(), &ch_db, &group, "b", &dlq),
    ];

    // The load: each round a transaction of a few inserts, updates and a delete.
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let (stop, db) = (stop.clone(), db.clone());
        let mut rng = Rng(seed ^ 0x9e37_79b9_7f4a_7c15);
        tokio::spawn(async move {
            let mut c = mysql_async::Conn::new(mysql_async::Opts::from_url(&mysql_url()).unwrap())
                .await
                .unwrap();
            let mut next = 1u64;
            let mut rounds = 0u64;
            while !stop.load(Ordering::SeqCst) {
                let mut sql = String::from("START TRANSACTION;");
                let n = 1 + rng.below(8);
                let values: Vec<String> = (next..next + n)
                    .map(|id| format!("({id}, {}, 's{id}')", rng.below(1000)))
                    .collect();
                sql += &format!("INSERT INTO `{db}`.t VALUES {};", values.join(","));
                next += n;
                for _ in 0..3 {
                    let id = 1 + rng.below(next - 1);
                    sql += &format!(
                        "UPDATE `{db}`.t SET v = v + 1, s = 'u{}' WHERE id = {id};",
                        rng.below(1_000_000)
                    );
                }
                if rng.chance(60) {
                    sql += &format!(
                        "DELETE FROM `{db}`.t WHERE id = {};",
                        1 + rng.below(next - 1)
                    );
                }
                sql += "COMMIT";
                c.query_drop(sql).await.unwrap();
                rounds += 1;
                tokio::time::sleep(Duration::from_millis(20 + rng.below(40))).await;
            }
            rounds
        })
    };

    let report = faults::inject(seed, FAULTS_FOR, &mut cap, &mut appliers, &relay, &topic, 3).await;
    let (done, unplanned) = (report.done, report.unplanned);
    stop.store(true, Ordering::SeqCst);
    let rounds = writer.await.unwrap();
    eprintln!(
        "seed {seed}: {rounds} writer rounds; faults:\n  {}",
        done.join("\n  ")
    );

    // The mirror catches up and equals the source.
    let want = mirror::source(&db).await;
    let deadline = Instant::now() + Duration::from_secs(180);
    loop {
        let got = mirror::mirror(&ch, &ch_db).await;
        if got == want {
            break;
        }
        if Instant::now() > deadline {
            let diff = mirror::differences(&got, &want);
            // The capture's log too: a capture that stopped after the last fault leaves the
            // mirror behind.
            let mut logs: Vec<String> = appliers.iter_mut().map(|p| p.stop().1).collect();
            let capture_exited = cap.exited();
            logs.push(format!(
                "the capture (exited by itself: {capture_exited}):\n{}",
                cap.stop().1
            ));
            panic!(
                "seed {seed}: {diff}\nfaults:\n  {}\nunplanned exits: {unplanned:#?}\nlogs:\n{}",
                done.join("\n  "),
                logs.join("\n----\n")
            );
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let (code, out, err) =
        sluice_tests::capture::sluice(&["dead-letters", "list", "--topic", &dlq]);
    // (no dead letter: the topic may not even exist)
    assert!(
        code == Some(0) && out.is_empty() || err.contains("does not exist"),
        "seed {seed}: dead letters:\n{out}{err}"
    );
    assert!(
        unplanned.is_empty(),
        "seed {seed}: processes exited on their own:\n{unplanned:#?}"
    );
    for p in appliers.iter_mut().chain([&mut cap]) {
        let (code, log) = p.stop();
        assert_eq!(code, Some(0), "seed {seed}: {log}");
    }
    c.query_drop(format!("DROP DATABASE `{db}`")).await.unwrap();
}
