//! A standby pair of captures under load, one connector's two instances (`[standby] enabled`)
//! while a writer inserts, updates and deletes:
//! - MariaDB -> capture-mysql ×2 -> Kafka -> apply-clickhouse -> ClickHouse;
//! - MongoDB -> capture-mongo ×2 (oplog mode) -> Kafka -> apply-mongo -> MongoDB (a real server
//!   by SLUICE_MONGO_SOURCE_URL, a replica set, and SLUICE_MONGO_TARGET_URL).
//!
//! 1. The active one is killed (-9): the standby takes over within the session timeout and
//!    rows flow again.
//! 2. The killed one comes back as a standby; the active one is paused (SIGSTOP) until the
//!    other took over, then resumed: it must find itself no longer active (or fenced) and exit 1,
//!    without a checkpoint of its own after its successor's start.
//! 3. The writer stops, and the target equals the source: nothing lost, nothing extra, nothing
//!    stale.
//!
//! capture-mysql runs 1 and 2 in one test; capture-mongo each in its own. Whether a paused
//! capture still holds records when it resumes is up to timing; the last test sends such a
//! late record by hand.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use mongodb::bson::{doc, Document};
use mysql_async::prelude::Queryable;
use sluice_tests::capture::{binlog_end, metric_at, CaptureProcess};
use sluice_tests::{
    mirror, mongo, mongo_source_url, mongo_target_url, mysql_url, seed, unique, Rng,
};

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

/// Wait until `max()`, the largest id in the target, reaches `from` (a row the writer inserted
/// at or after it); how long that took.
async fn until_flowing<F, Fut>(max: F, from: u64, limit: Duration, what: &str) -> Duration
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = u64>,
{
    let t0 = Instant::now();
    loop {
        if max().await >= from {
            return t0.elapsed();
        }
        assert!(t0.elapsed() < limit, "{what}: no new row after {limit:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Two instances of one connector of `binary`, from one config whose `[standby]` names instance
/// "a" (the other is "b"): "a" is active, "b" a standby serving its metrics.
async fn start_pair(
    binary: &'static str,
    (text, connector, prefix): (String, String, String),
) -> (CaptureProcess, CaptureProcess) {
    let config_of = |name: &str| {
        (
            text.replace("instance = \"a\"", &format!("instance = \"{name}\"")),
            connector.clone(),
            prefix.clone(),
        )
    };
    let mut a = CaptureProcess::spawn_binary(binary, config_of("a"));
    until_active(&mut a, Duration::from_secs(60), "the first instance").await;
    let b = CaptureProcess::spawn_binary(binary, config_of("b"));
    let t0 = Instant::now();
    while active(&b).is_none() {
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "the second instance does not serve its metrics"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    (a, b)
}

/// The `[standby]` section of both instances ("a"; [`start_pair`] names the other).
fn standby_section() -> String {
    format!(
        "[standby]\nenabled = true\ninstance = \"a\"\nsession_timeout_ms = {}\n",
        SESSION.as_millis()
    )
}

/// Step 1 of the module's doc, on a pair (`a` active, `b` a standby) under a writer whose next
/// id is `next_id`; `max` reads the largest id the target has. At the end `b` is active and `a`,
/// started again after its kill, a standby.
async fn kill_active<F, Fut>(
    seed: u64,
    (a, b): (&mut CaptureProcess, &mut CaptureProcess),
    next_id: &AtomicU64,
    max: F,
) where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = u64>,
{
    assert_eq!(active(b), Some(false), "the second instance is a standby");
    a.kill();
    let killed = Instant::now();
    let killed_at = next_id.load(Ordering::SeqCst);
    let takeover = until_active(b, SESSION + Duration::from_secs(20), "the standby").await;
    until_flowing(
        &max,
        killed_at,
        SESSION + Duration::from_secs(30),
        "after the kill",
    )
    .await;
    let flowing = killed.elapsed();
    eprintln!(
        "seed {seed}: kill -9 of the active capture: the standby active after {takeover:?}, \
         rows written after the kill in the target {flowing:?} after it"
    );
    a.restart();
    let t0 = Instant::now();
    while active(a) != Some(false) {
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "the restarted one is no standby"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(active(b), Some(true), "one active instance");
}

/// Step 2 of the module's doc: `a`, the active one, paused past the session timeout until `b`,
/// the standby, took over and rows flow, then resumed: `a` must stop (exit 1), saying why.
async fn pause_active<F, Fut>(
    seed: u64,
    connector: &str,
    (a, b): (&mut CaptureProcess, &mut CaptureProcess),
    next_id: &AtomicU64,
    max: F,
) where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = u64>,
{
    assert_eq!(active(a), Some(true), "the first one is active");
    a.signal("-STOP");
    let paused_at = next_id.load(Ordering::SeqCst);
    let takeover = until_active(b, SESSION + Duration::from_secs(20), "the standby").await;
    until_flowing(
        &max,
        paused_at,
        SESSION + Duration::from_secs(30),
        "after the pause",
    )
    .await;
    eprintln!("seed {seed}: the paused capture replaced after {takeover:?}");
    tokio::time::sleep(Duration::from_secs(1)).await;
    a.signal("-CONT");
    let (code, log) = a.wait(Duration::from_secs(40));
    assert_eq!(code, Some(1), "the revived instance must stop: {log}");
    assert!(
        log.contains("is no longer the active capture")
            || log.contains("another capture was started with the same connector name"),
        "why it stopped: {log}"
    );
    assert!(log.contains(connector), "{log}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_standby_capture_takes_over_from_a_killed_one_and_a_revived_one_cannot_write() {
    let seed = seed();
    let db = unique("sluice_standby");
    let ch_db = format!("{db}_m");
    let (mut c, ch) = mirror::make(&db).await;

    // Two instances of one connector, one configuration but for the instance name (the same
    // server_id too, as two pods of one Deployment have).
    let (text, connector, prefix) =
        CaptureProcess::config(&db, &binlog_end().await, &standby_section());
    let (mut a, mut b) =
        start_pair("capture-mysql", (text, connector.clone(), prefix.clone())).await;
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
    until_flowing(
        || mirror_max(&ch, &ch_db),
        20,
        Duration::from_secs(60),
        "the start",
    )
    .await;
    tokio::time::sleep(Duration::from_millis(500 + Rng(seed).below(2000))).await;

    kill_active(seed, (&mut a, &mut b), &next_id, || mirror_max(&ch, &ch_db)).await;
    pause_active(seed, &connector, (&mut b, &mut a), &next_id, || {
        mirror_max(&ch, &ch_db)
    })
    .await;

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
    let log = a.stop_ok();
    assert!(
        log.contains("this instance is now the active capture"),
        "{log}"
    );
    apply.stop_ok();
    c.query_drop(format!("DROP DATABASE `{db}`")).await.unwrap();
}

/// The largest `_id` of the target collection (0 when it has none yet).
async fn target_max(c: &mongodb::Client, db: &str) -> u64 {
    let newest = c
        .database(db)
        .collection::<Document>("c")
        .find_one(doc! {})
        .sort(doc! { "_id": -1 })
        .await
        .ok()
        .flatten();
    newest
        .and_then(|d| d.get_i64("_id").ok())
        .map_or(0, |id| id as u64)
}

/// Clients of the MongoDB source and target.
async fn mongo_clients() -> (mongodb::Client, mongodb::Client) {
    let src = mongodb::Client::with_uri_str(mongo_source_url())
        .await
        .unwrap();
    let dst = mongodb::Client::with_uri_str(mongo_target_url())
        .await
        .unwrap();
    (src, dst)
}

/// What happens to the active one of a capture-mongo pair.
#[derive(Clone, Copy, PartialEq)]
enum Fault {
    /// kill -9 (step 1 of the module's doc).
    Kill,
    /// SIGSTOP past the session timeout, then SIGCONT (step 2).
    Pause,
}

#[tokio::test(flavor = "multi_thread")]
async fn a_standby_mongo_capture_takes_over_from_a_killed_one() {
    mongo_pair(Fault::Kill).await;
}

/// The change records a paused capture had handed to its Kafka producer before the pause may
/// reach their partitions after its successor's records of the same changes and of later
/// ones; apply-mongo, which writes in record order, must skip them (their incarnation is below
/// the successor's) or the document is left at an older state (seen before that: seed
/// 1796390341015828401, one document of 2 398 a version behind).
#[tokio::test(flavor = "multi_thread")]
async fn a_paused_mongo_capture_revived_after_its_successor_leaves_nothing_stale() {
    mongo_pair(Fault::Pause).await;
}

/// A capture-mongo pair under a writer, `fault` done to the active one, then the target
/// compared with the source.
async fn mongo_pair(fault: Fault) {
    let seed = seed();
    let db = unique("sluice_m_standby");
    let (src, dst) = mongo_clients().await;
    let (text, connector, prefix) =
        mongo::capture_config(&mongo_source_url(), &db, "mode = \"oplog\"", "", "");
    let (mut a, mut b) = start_pair(
        "capture-mongo",
        (
            format!("{text}\n{}", standby_section()),
            connector.clone(),
            prefix.clone(),
        ),
    )
    .await;
    mongo::started(&a, true).await;
    let mut apply = mongo::apply_at(
        &mongo_target_url(),
        &unique("meta"),
        &prefix,
        &unique("g"),
        "",
    );

    // The load: each round a few inserts and updates of random documents, sometimes a delete
    // (never of the newest ten, whose arrival in the target tells that rows flow).
    let stop = Arc::new(AtomicBool::new(false));
    let next_id = Arc::new(AtomicU64::new(1));
    let writer = {
        let (stop, next_id) = (stop.clone(), next_id.clone());
        let c = src.database(&db).collection::<Document>("c");
        let mut rng = Rng(seed ^ 0x2545_f491_4f6c_dd1d);
        tokio::spawn(async move {
            let mut rounds = 0u64;
            while !stop.load(Ordering::SeqCst) {
                let next = next_id.load(Ordering::SeqCst);
                let n = 1 + rng.below(5);
                let docs: Vec<Document> = (next..next + n)
                    .map(|id| {
                        doc! { "_id": id as i64, "v": rng.below(1000) as i64, "s": format!("s{id}") }
                    })
                    .collect();
                c.insert_many(docs).await.unwrap();
                let top = next + n - 1;
                for _ in 0..2 {
                    c.update_one(
                        doc! { "_id": (1 + rng.below(top)) as i64 },
                        doc! { "$inc": { "v": 1 }, "$set": { "s": format!("u{}", rng.below(1_000_000)) } },
                    )
                    .await
                    .unwrap();
                }
                if top > 10 && rng.chance(30) {
                    let id = 1 + rng.below(top - 10);
                    c.delete_one(doc! { "_id": id as i64 }).await.unwrap();
                }
                next_id.store(next + n, Ordering::SeqCst);
                rounds += 1;
                tokio::time::sleep(Duration::from_millis(10 + rng.below(20))).await;
            }
            rounds
        })
    };
    until_flowing(
        || target_max(&dst, &db),
        20,
        Duration::from_secs(60),
        "the start",
    )
    .await;
    tokio::time::sleep(Duration::from_millis(500 + Rng(seed).below(2000))).await;

    match fault {
        Fault::Kill => {
            kill_active(seed, (&mut a, &mut b), &next_id, || target_max(&dst, &db)).await
        }
        Fault::Pause => {
            pause_active(seed, &connector, (&mut a, &mut b), &next_id, || {
                target_max(&dst, &db)
            })
            .await
        }
    }

    // 3. The writer stops; the target equals the source.
    tokio::time::sleep(Duration::from_secs(2)).await;
    stop.store(true, Ordering::SeqCst);
    let rounds = writer.await.unwrap();
    let want = mongo::documents(&src, &db, "c").await;
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let got = mongo::documents(&dst, &db, "c").await;
        if got == want {
            break;
        }
        if Instant::now() > deadline {
            let differ: Vec<_> = want
                .iter()
                .zip(got.iter())
                .filter(|(w, g)| w != g)
                .take(5)
                .collect();
            panic!(
                "seed {seed}: target {} documents, source {}; the first that differ (source, \
                 target): {differ:?}\nactive capture:\n{}\napply:\n{}",
                got.len(),
                want.len(),
                b.stop().1,
                apply.stop().1
            );
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    eprintln!(
        "seed {seed}: {rounds} writer rounds, {} documents",
        want.len()
    );
    // The standby first: stopped after the active one, it would take over at once.
    if fault == Fault::Kill {
        let (code, log) = a.stop();
        assert_eq!(code, Some(0), "the standby: {log}");
        assert!(log.contains("stopped while a standby"), "{log}");
    }
    let log = b.stop_ok();
    assert!(
        log.contains("this instance is now the active capture"),
        "{log}"
    );
    apply.stop_ok();
    for (c, what) in [(&src, "source"), (&dst, "target")] {
        if let Err(e) = c.database(&db).drop().await {
            eprintln!("dropping the {what} database {db}: {e}");
        }
    }
}

/// The first record of `topic` (any partition) holding `needle` in its payload, copied with
/// its partition and headers; waits up to 30 s. Blocking.
fn record_with(topic: &str, needle: &[u8]) -> rdkafka::message::OwnedMessage {
    use rdkafka::consumer::{BaseConsumer, Consumer};
    use rdkafka::Message;
    let consumer: BaseConsumer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", sluice_tests::kafka_brokers())
        .set("group.id", unique("reader"))
        .set("enable.auto.commit", "false")
        .set("auto.offset.reset", "earliest")
        .create()
        .unwrap();
    consumer.subscribe(&[topic]).unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while Instant::now() < deadline {
        if let Some(Ok(m)) = consumer.poll(Duration::from_millis(200)) {
            if m.payload()
                .is_some_and(|p| p.windows(needle.len()).any(|w| w == needle))
            {
                return m.detach();
            }
        }
    }
    panic!("no record of {topic} holds {needle:?}");
}

/// The incarnation header of a record, split: (connector, number).
fn incarnation_of(m: &rdkafka::message::OwnedMessage) -> (String, u64) {
    use rdkafka::message::Headers;
    use rdkafka::Message;
    let h = m
        .headers()
        .and_then(|h| h.iter().find(|h| h.key == "sluice.incarnation"))
        .and_then(|h| h.value)
        .expect("every capture record carries sluice.incarnation");
    let v = std::str::from_utf8(h).unwrap();
    let (c, n) = v.rsplit_once('/').expect("<connector>/<n>");
    (c.to_string(), n.parse().expect("a number"))
}

/// Send `m` again, as it was (partition, key, payload, headers).
async fn resend(m: &rdkafka::message::OwnedMessage) {
    use rdkafka::producer::{FutureProducer, FutureRecord};
    use rdkafka::Message;
    let producer: FutureProducer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", sluice_tests::kafka_brokers())
        .create()
        .unwrap();
    let mut r = FutureRecord::to(m.topic())
        .partition(m.partition())
        .key(m.key().unwrap())
        .payload(m.payload().unwrap());
    if let Some(h) = m.headers() {
        r = r.headers(h.clone());
    }
    producer
        .send(r, Duration::from_secs(10))
        .await
        .map_err(|(e, _)| e)
        .unwrap();
}

/// The value `v` of document 1 of the target's collection `c` (None while it is absent).
async fn target_v(dst: &mongodb::Client, db: &str) -> Option<i64> {
    let d = dst
        .database(db)
        .collection::<Document>("c")
        .find_one(doc! { "_id": 1i64 })
        .await
        .ok()
        .flatten()?;
    d.get_i64("v").ok()
}

async fn until_target_v(dst: &mongodb::Client, db: &str, want: i64, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while target_v(dst, db).await != Some(want) {
        assert!(
            Instant::now() < deadline,
            "{what}: v = {want} never reached the target"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// A process's `sluice_apply_stale_capture_records_total` reaching `n` (within 30 s).
async fn until_skipped(apply: &mut sluice_tests::capture::CaptureProcess, n: f64, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let got = metric_at(
            apply.metrics_port,
            "sluice_apply_stale_capture_records_total",
        );
        if got == Some(n) {
            return;
        }
        if Instant::now() > deadline {
            panic!(
                "{what}: {got:?} records skipped, not {n}:\n{}",
                apply.stop().1
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The deterministic form of a revived capture's late record: a record of the capture's first
/// start, sent again after its second start wrote the same document, is skipped by apply-mongo
/// (the document keeps the newer value), and still skipped by the applier restarted from its
/// commit (whose metadata carries the incarnation reached); what the capture writes next flows.
#[tokio::test(flavor = "multi_thread")]
async fn a_record_of_an_earlier_capture_start_arriving_late_is_skipped_also_after_a_restart() {
    use rdkafka::consumer::{BaseConsumer, Consumer};
    let db = unique("sluice_m_incarnation");
    let (src, dst) = mongo_clients().await;
    let coll = src.database(&db).collection::<Document>("c");
    let mut cap = mongo::capture_with(&mongo_source_url(), &db, "mode = \"oplog\"", "", "");
    mongo::started(&cap, true).await;
    let group = unique("g");
    let mut apply = mongo::apply_at(
        &mongo_target_url(),
        &unique("meta"),
        &cap.prefix,
        &group,
        "",
    );
    coll.insert_one(doc! { "_id": 1i64, "v": 100i64, "s": "first start" })
        .await
        .unwrap();
    until_target_v(&dst, &db, 100, "the first start").await;
    let topic = cap.topic(&db, "c");
    let t = topic.clone();
    let old = tokio::task::spawn_blocking(move || record_with(&t, b"first start"))
        .await
        .unwrap();
    let (connector, first) = incarnation_of(&old);
    assert_eq!(connector, cap.connector);

    // The capture's second start writes the document.
    cap.stop_ok();
    cap.restart();
    tokio::time::sleep(Duration::from_secs(2)).await;
    coll.update_one(
        doc! { "_id": 1i64 },
        doc! { "$set": { "v": 200i64, "s": "second start" } },
    )
    .await
    .unwrap();
    until_target_v(&dst, &db, 200, "the second start").await;
    let t = topic.clone();
    let new = tokio::task::spawn_blocking(move || record_with(&t, b"second start"))
        .await
        .unwrap();
    let (_, second) = incarnation_of(&new);
    assert!(second > first, "incarnations {first} then {second}");
    assert_eq!(
        rdkafka::Message::partition(&old),
        rdkafka::Message::partition(&new),
        "one key, one partition"
    );

    // The first start's record, late: skipped.
    resend(&old).await;
    until_skipped(&mut apply, 1.0, "the late record").await;
    assert_eq!(
        target_v(&dst, &db).await,
        Some(200),
        "the late record was written"
    );

    // Committed with the incarnation reached; a restarted applier skips it too.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (g, t) = (group.clone(), topic.clone());
        let lag = tokio::task::spawn_blocking(move || sluice_tests::capture::group_lag(&g, &t))
            .await
            .unwrap();
        if lag == 0 {
            break;
        }
        assert!(Instant::now() < deadline, "{lag} records never committed");
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let (g, t, p) = (
        group.clone(),
        topic.clone(),
        rdkafka::Message::partition(&old),
    );
    let metadata = tokio::task::spawn_blocking(move || {
        let c: BaseConsumer = rdkafka::ClientConfig::new()
            .set("bootstrap.servers", sluice_tests::kafka_brokers())
            .set("group.id", &g)
            .create()
            .unwrap();
        let mut tpl = rdkafka::TopicPartitionList::new();
        tpl.add_partition(&t, p);
        let committed = c.committed_offsets(tpl, Duration::from_secs(10)).unwrap();
        let e = committed.find_partition(&t, p).unwrap();
        e.metadata().to_string()
    })
    .await
    .unwrap();
    assert_eq!(
        metadata,
        format!("sluice.incarnation={{\"{connector}\":{second}}}"),
        "the commit's metadata"
    );
    let log = apply.stop_ok();
    assert!(
        log.contains("skipping records of a capture that was taken over")
            && log.contains(&format!("successor={second}")),
        "{log}"
    );
    apply.restart();
    resend(&old).await;
    until_skipped(&mut apply, 1.0, "the late record after a restart").await;
    coll.update_one(doc! { "_id": 1i64 }, doc! { "$set": { "v": 300i64 } })
        .await
        .unwrap();
    until_target_v(&dst, &db, 300, "after the restart").await;
    assert_eq!(
        mongo::documents(&dst, &db, "c").await,
        mongo::documents(&src, &db, "c").await
    );
    for p in [&mut cap, &mut apply] {
        p.stop_ok();
    }
    for c in [&src, &dst] {
        let _ = c.database(&db).drop().await;
    }
}
