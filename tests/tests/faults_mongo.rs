//! Faults under load, at random moments, MongoDB to MongoDB: capture-mongo (oplog mode) ->
//! Kafka -> two apply-mongo instances of one group (no instance ids: a killed member's
//! partitions go to the other after the session timeout, and the fence keeps a member that lost
//! them from writing) -> the target, reached through a relay that cuts it off. The faults are
//! `sluice_tests::faults`'s (appliers killed and stopped, the broker restarted, the target cut
//! off, partitions added), seeded (`SLUICE_TEST_SEED`). Then the writer stops, and the target
//! collection must equal the source's: nothing missing, stale or extra, no process that exited
//! on its own.
//!
//! Against real MongoDB: SLUICE_MONGO_SOURCE_URL (a replica set) and SLUICE_MONGO_TARGET_URL.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use mongodb::bson::{doc, Document};
use mongodb::Client;
use sluice_tests::relay::Relay;
use sluice_tests::{faults, mongo, mongo_source_url, mongo_target_url, seed, unique, Rng};

const FAULTS_FOR: Duration = Duration::from_secs(60);

#[tokio::test(flavor = "multi_thread")]
async fn the_target_equals_the_source_after_random_faults_under_load() {
    let seed = seed();
    let db = unique("sluice_m_faults");
    let src = Client::with_uri_str(mongo_source_url()).await.unwrap();
    let dst = Client::with_uri_str(mongo_target_url()).await.unwrap();
    let relay = Relay::to(&mongo_target_url()).await;
    let mut cap = mongo::capture_with(&mongo_source_url(), &db, "mode = \"oplog\"", "", "");
    let topic = cap.topic(&db, "c");
    let (group, meta) = (unique("g"), unique("meta"));
    let target = relay.url(&mongo_target_url());
    let mut appliers = [
        mongo::apply_at(&target, &meta, &cap.prefix, &group, ""),
        mongo::apply_at(&target, &meta, &cap.prefix, &group, ""),
    ];
    mongo::started(&cap, true).await;

    // The load: each round a few inserts, updates of random documents, sometimes a delete.
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let (stop, c) = (stop.clone(), src.database(&db).collection::<Document>("c"));
        let mut rng = Rng(seed ^ 0x9e37_79b9_7f4a_7c15);
        tokio::spawn(async move {
            let mut next = 1i64;
            let mut rounds = 0u64;
            while !stop.load(Ordering::SeqCst) {
                let n = 1 + rng.below(6) as i64;
                let docs: Vec<Document> = (next..next + n)
                    .map(
                        |id| doc! { "_id": id, "v": rng.below(1000) as i64, "s": format!("s{id}") },
                    )
                    .collect();
                c.insert_many(docs).await.unwrap();
                next += n;
                for _ in 0..3 {
                    let id = 1 + rng.below(next as u64 - 1) as i64;
                    c.update_one(
                        doc! { "_id": id },
                        doc! { "$inc": { "v": 1 }, "$set": { "s": format!("u{}", rng.below(1_000_000)) } },
                    )
                    .await
                    .unwrap();
                }
                if rng.chance(60) {
                    let id = 1 + rng.below(next as u64 - 1) as i64;
                    c.delete_one(doc! { "_id": id }).await.unwrap();
                }
                rounds += 1;
                tokio::time::sleep(Duration::from_millis(20 + rng.below(40))).await;
            }
            rounds
        })
    };

    let report = faults::inject(seed, FAULTS_FOR, &mut cap, &mut appliers, &relay, &topic, 3).await;
    stop.store(true, Ordering::SeqCst);
    let rounds = writer.await.unwrap();
    eprintln!(
        "seed {seed}: {rounds} writer rounds; faults:\n  {}",
        report.done.join("\n  ")
    );

    // (as documents: compared and shown field by field)
    let documents = |c: &Client| {
        let (c, db) = (c.clone(), db.clone());
        async move {
            mongo::documents(&c, &db, "c")
                .await
                .iter()
                .map(|d| d.to_document().expect("a document"))
                .collect::<Vec<Document>>()
        }
    };
    let want = documents(&src).await;
    let deadline = Instant::now() + Duration::from_secs(180);
    loop {
        let got = documents(&dst).await;
        if got == want {
            break;
        }
        if Instant::now() > deadline {
            let id = |d: &Document| d.get("_id").cloned();
            let missing: Vec<_> = want
                .iter()
                .filter(|w| !got.iter().any(|g| id(g) == id(w)))
                .take(5)
                .map(id)
                .collect();
            let extra: Vec<_> = got
                .iter()
                .filter(|g| !want.iter().any(|w| id(g) == id(w)))
                .take(5)
                .map(id)
                .collect();
            let stale: Vec<_> = want
                .iter()
                .filter_map(|w| {
                    got.iter()
                        .find(|g| id(g) == id(w) && *g != w)
                        .map(|g| (w, g))
                })
                .take(5)
                .collect();
            // The capture's log too: a capture that stopped after the last fault leaves the
            // target behind.
            let mut logs: Vec<String> = appliers.iter_mut().map(|p| p.stop().1).collect();
            let capture_exited = cap.exited();
            logs.push(format!(
                "the capture (exited by itself: {capture_exited}):\n{}",
                cap.stop().1
            ));
            panic!(
                "seed {seed}: target {} documents, source {}; missing {missing:?}, extra \
                 {extra:?}, stale (source, target) {stale:?}\nfaults:\n  {}\nunplanned exits: \
                 {:#?}\nlogs:\n{}",
                got.len(),
                want.len(),
                report.done.join("\n  "),
                report.unplanned,
                logs.join("\n----\n")
            );
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert!(
        report.unplanned.is_empty(),
        "seed {seed}: processes exited on their own:\n{:#?}",
        report.unplanned
    );
    for p in appliers.iter_mut().chain([&mut cap]) {
        let (code, log) = p.stop();
        assert_eq!(code, Some(0), "seed {seed}: {log}");
    }
    src.database(&db).drop().await.unwrap();
    dst.database(&db).drop().await.unwrap();
}
