//! MongoDB -> capture-mongo -> Kafka -> apply-mongo -> MongoDB, end to end, with the real
//! binaries, a real Kafka broker and the test bed's MongoDB-protocol servers (or real MongoDB
//! replica sets, given SLUICE_MONGO_SOURCE_URL and SLUICE_MONGO_TARGET_URL).
//!
//! mongo-java-server serves change streams on one collection only, and its update events do not
//! follow MongoDB's format (docs/testbed.md); updates are therefore tested there in oplog mode,
//! and in both modes against MongoDB proper.

use std::time::{Duration, Instant};

use futures::StreamExt;
use mongodb::bson::raw::RawDocumentBuf;
use mongodb::bson::spec::BinarySubtype;
use mongodb::bson::{
    doc, oid::ObjectId, Binary, Bson, DateTime, Decimal128, Document, JavaScriptCodeWithScope,
    Regex, Timestamp,
};
use mongodb::Client;
use sluice_tests::capture::{
    kill_in_first_second, metric_at, wait_initial_snapshot_stored, wait_snapshot_done,
    wait_stored_snapshot_rows, CaptureProcess,
};
use sluice_tests::mongo::*;
use sluice_tests::relay::Relay;
use sluice_tests::{
    is_mongo_java_server, kafka_brokers, mongo_source_url, mongo_target_url, unique,
};

/// A document with every BSON type MongoDB stores. mongo-java-server (`mjs`) refuses binary
/// subtypes other than 0, 3 and 4 and JavaScript with scope, and stores subtype 0x80 as 0: those
/// are left out there (docs/testbed.md).
fn every_type(id: i32, mjs: bool) -> Document {
    let mut d = doc! {
        "_id": id,
        "double": -1.5e300f64,
        "nan": f64::NAN,
        "string": "utf8 😀 \u{0}inside",
        "doc": { "nested": { "deep": [1, 2, 3] }, "empty": {} },
        "array": [1, "two", { "three": 3 }, [4], Bson::Null],
        "bin_generic": Binary { subtype: BinarySubtype::Generic, bytes: vec![0, 1, 2, 255] },
        "bin_uuid_old": Binary { subtype: BinarySubtype::UuidOld, bytes: vec![3; 16] },
        "bin_uuid": Binary { subtype: BinarySubtype::Uuid, bytes: vec![4; 16] },
        "oid": ObjectId::parse_str("65a1b2c3d4e5f60718293a4b").unwrap(),
        "bool": true,
        "date": DateTime::from_millis(1_700_000_000_123),
        "date_1900": DateTime::from_millis(-2_208_988_800_000),
        "null": Bson::Null,
        "regex": Regex { pattern: "^a.*b$".into(), options: "imsx".into() },
        "int32": i32::MIN,
        "int64": i64::MAX,
        "decimal": Decimal128::from_bytes([0x01, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x40, 0x30]),
        "timestamp": Timestamp { time: 1_700_000_000, increment: 7 },
        "min": Bson::MinKey,
        "max": Bson::MaxKey,
        "js": Bson::JavaScriptCode("function () { return 1; }".into()),
    };
    if !mjs {
        d.insert(
            "bin_function",
            Binary {
                subtype: BinarySubtype::Function,
                bytes: vec![1],
            },
        );
        d.insert(
            "bin_old",
            Binary {
                subtype: BinarySubtype::BinaryOld,
                bytes: vec![2, 0, 0, 0, 9, 9],
            },
        );
        d.insert(
            "bin_md5",
            Binary {
                subtype: BinarySubtype::Md5,
                bytes: vec![5; 16],
            },
        );
        d.insert(
            "bin_user",
            Binary {
                subtype: BinarySubtype::UserDefined(0x80),
                bytes: vec![0x80],
            },
        );
        d.insert(
            "js_scope",
            Bson::JavaScriptCodeWithScope(JavaScriptCodeWithScope {
                code: "x".into(),
                scope: doc! { "x": 1 },
            }),
        );
    }
    d
}

#[tokio::test(flavor = "multi_thread")]
async fn every_bson_type_arrives_unchanged_through_a_change_stream() {
    let db = unique("sluice_m_types");
    let (src, dst) = (
        client(mongo_source_url()).await,
        client(mongo_target_url()).await,
    );
    let coll = src.database(&db).collection::<Document>("docs");
    coll.insert_one(doc! { "_id": 0 }).await.unwrap(); // the collection exists before the stream
    let mut cap = capture(
        &db,
        &format!("mode = \"change_stream\"\ndatabase = \"{db}\"\ncollection = \"docs\""),
        "",
    );
    let mut app = apply(&cap.prefix, &unique("g"), "");
    tokio::time::sleep(Duration::from_secs(3)).await;
    // Documents near the 16 MiB limit travel too.
    let big = doc! { "_id": 1_000_000, "blob": Binary { subtype: BinarySubtype::Generic, bytes: vec![7; 15 << 20] } };
    let mjs = is_mongo_java_server(&src).await;
    coll.insert_many((1..=20).map(|i| every_type(i, mjs)))
        .await
        .unwrap();
    coll.insert_one(big).await.unwrap();
    coll.delete_one(doc! { "_id": 2 }).await.unwrap();
    coll.insert_one(doc! { "_id": 0.5, "after": "delete" })
        .await
        .unwrap();
    // The documents before the capture started are not in the stream: copy that one by hand.
    dst.database(&db)
        .collection::<Document>("docs")
        .insert_one(doc! { "_id": 0 })
        .await
        .unwrap();
    converge(
        &src,
        &dst,
        &db,
        "docs",
        Duration::from_secs(90),
        &mut [&mut cap, &mut app],
    )
    .await;
    // Byte for byte, where the servers keep field order.
    let (a, b) = (
        documents(&src, &db, "docs").await,
        documents(&dst, &db, "docs").await,
    );
    for (x, y) in a.iter().zip(&b) {
        assert_eq!(
            x.as_bytes(),
            y.as_bytes(),
            "document {:?} changed",
            x.get("_id")
        );
    }
    stop_all(&mut [&mut cap, &mut app]).await;
    src.database(&db).drop().await.unwrap();
    dst.database(&db).drop().await.unwrap();
}

/// Inserts, updates of every kind, replacements, deletes and a collection drop, on two
/// collections, with a third left out by the filter.
async fn changes_of_every_kind(mode: &str) {
    let db = unique("sluice_m_ops");
    let (src, dst) = (
        client(mongo_source_url()).await,
        client(mongo_target_url()).await,
    );
    let (a, b) = (
        src.database(&db).collection::<Document>("a"),
        src.database(&db).collection::<Document>("b"),
    );
    let scope = if mode == "change_stream" && is_mongo_java_server(&src).await {
        a.insert_one(doc! { "_id": -1 }).await.unwrap();
        format!("database = \"{db}\"\ncollection = \"a\"")
    } else {
        String::new()
    };
    let mut cap = capture(
        &db,
        &format!("mode = \"{mode}\"\n{scope}"),
        &format!("exclude = [\"{db}\\\\.skipped\"]"),
    );
    let mut app = apply(&cap.prefix, &unique("g"), "");
    started(&cap, mode == "oplog").await;
    if !scope.is_empty() {
        dst.database(&db)
            .collection::<Document>("a")
            .insert_one(doc! { "_id": -1 })
            .await
            .unwrap();
    }
    for i in 0..50 {
        a.insert_one(
            doc! { "_id": i, "n": i, "nested": { "x": 1, "y": [1, 2, 3, 4] }, "tags": ["p", "q"] },
        )
        .await
        .unwrap();
    }
    a.update_one(
        doc! { "_id": 1 },
        doc! { "$set": { "n": 100, "nested.x": 2, "new": "field" } },
    )
    .await
    .unwrap();
    a.update_one(doc! { "_id": 2 }, doc! { "$unset": { "nested": "" } })
        .await
        .unwrap();
    a.update_one(
        doc! { "_id": 3 },
        doc! { "$set": { "tags.1": "changed" }, "$unset": { "n": 1 } },
    )
    .await
    .unwrap();
    a.update_one(doc! { "_id": 4 }, doc! { "$push": { "tags": "r" } })
        .await
        .unwrap();
    a.update_one(doc! { "_id": 5 }, doc! { "$pop": { "nested.y": 1 } })
        .await
        .unwrap();
    a.update_one(doc! { "_id": 6 }, doc! { "$inc": { "n": 5 } })
        .await
        .unwrap();
    a.replace_one(doc! { "_id": 7 }, doc! { "replaced": true })
        .await
        .unwrap();
    a.delete_one(doc! { "_id": 8 }).await.unwrap();
    a.update_many(
        doc! { "_id": { "$gte": 40 } },
        doc! { "$set": { "bulk": 1 } },
    )
    .await
    .unwrap();
    a.delete_many(doc! { "_id": { "$gte": 45 } }).await.unwrap();
    // The same document changed many times in a row: order per key.
    for k in 0..30 {
        a.update_one(doc! { "_id": 9 }, doc! { "$set": { "seq": k } })
            .await
            .unwrap();
    }
    if scope.is_empty() {
        for i in 0..10 {
            b.insert_one(doc! { "_id": format!("s{i}"), "v": i })
                .await
                .unwrap();
            src.database(&db)
                .collection::<Document>("skipped")
                .insert_one(doc! { "_id": i })
                .await
                .unwrap();
        }
        b.delete_one(doc! { "_id": "s3" }).await.unwrap();
    }
    converge(
        &src,
        &dst,
        &db,
        "a",
        Duration::from_secs(90),
        &mut [&mut cap, &mut app],
    )
    .await;
    if scope.is_empty() {
        converge(
            &src,
            &dst,
            &db,
            "b",
            Duration::from_secs(60),
            &mut [&mut cap, &mut app],
        )
        .await;
        // A dropped collection is dropped on the target, in order with its writes.
        b.drop().await.unwrap();
        a.insert_one(doc! { "_id": 1000, "after": "drop of b" })
            .await
            .unwrap();
        converge(
            &src,
            &dst,
            &db,
            "a",
            Duration::from_secs(60),
            &mut [&mut cap, &mut app],
        )
        .await;
        let deadline = Instant::now() + Duration::from_secs(30);
        while dst
            .database(&db)
            .list_collection_names()
            .await
            .unwrap()
            .contains(&"b".to_string())
        {
            assert!(
                Instant::now() < deadline,
                "collection b was not dropped on the target"
            );
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
        // The filter left `skipped` out.
        assert!(!dst
            .database(&db)
            .list_collection_names()
            .await
            .unwrap()
            .contains(&"skipped".to_string()));
    }
    stop_all(&mut [&mut cap, &mut app]).await;
    src.database(&db).drop().await.unwrap();
    dst.database(&db).drop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn changes_of_every_kind_through_the_oplog() {
    changes_of_every_kind("oplog").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn changes_of_every_kind_through_a_change_stream() {
    let src = client(mongo_source_url()).await;
    if is_mongo_java_server(&src).await {
        // Updates are not reported in MongoDB's format there: the capture refuses them by name.
        stand_in_change_stream_update_stops_the_capture(
            &src,
            doc! { "_id": 1, "x": 1 },
            doc! { "_id": 1 },
            doc! { "$set": { "x": 2 } },
        )
        .await;
        return;
    }
    changes_of_every_kind("change_stream").await;
}

/// On mongo-java-server, whose change streams do not describe updates (docs/testbed.md): the
/// capture, reading a change stream, stops at `update` by name (`use mode = "oplog"`) rather
/// than pass anything on.
async fn stand_in_change_stream_update_stops_the_capture(
    src: &mongodb::Client,
    first: Document,
    filter: Document,
    update: Document,
) {
    let db = unique("sluice_m_cs_upd");
    let coll = src.database(&db).collection::<Document>("a");
    coll.insert_one(first).await.unwrap();
    let mut cap = capture(
        &db,
        &format!("mode = \"change_stream\"\ndatabase = \"{db}\"\ncollection = \"a\""),
        "",
    );
    tokio::time::sleep(Duration::from_secs(3)).await;
    coll.update_one(filter, update).await.unwrap();
    let (code, log) = cap.wait(Duration::from_secs(30));
    assert_eq!(code, Some(1), "{log}");
    assert!(
        log.contains("use mode = \\\"oplog\\\"") || log.contains("use mode = \"oplog\""),
        "{log}"
    );
    src.database(&db).drop().await.unwrap();
}

/// capture-mongo killed (-9) at seeded moments of its first second, again and again,
/// during its first copy (`snapshot+stream`, oplog mode), while a writer deletes, updates and
/// inserts documents of the collection being copied; then it runs to the end, and the target
/// must equal the source, every document compared. A restart must go on from the snapshot's
/// stored start T0: one that began a new copy at a later time would leave on the target the
/// copies of documents deleted in between (their deletes never published).
#[tokio::test(flavor = "multi_thread")]
async fn kills_in_the_first_second_of_the_first_copy_leave_nothing_stale() {
    let seed = sluice_tests::seed();
    let mut rng = sluice_tests::Rng(seed);
    let (src, dst) = (
        client(mongo_source_url()).await,
        client(mongo_target_url()).await,
    );
    const DOCS: i64 = 10_000;
    for round in 0..3 {
        let db = unique("sluice_m_first");
        let coll = src.database(&db).collection::<Document>("c");
        let docs: Vec<Document> = (0..DOCS)
            .map(|i| doc! { "_id": i, "v": i, "s": format!("s{i}") })
            .collect();
        coll.insert_many(docs).await.unwrap();
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let writer = {
            let (stop, coll) = (stop.clone(), coll.clone());
            let mut rng = sluice_tests::Rng(seed ^ (round + 1));
            tokio::spawn(async move {
                let mut next = DOCS;
                let mut n = 0u64;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let id = rng.below(DOCS as u64) as i64;
                    coll.delete_one(doc! { "_id": id }).await.unwrap();
                    let id = rng.below(DOCS as u64) as i64;
                    coll.update_one(doc! { "_id": id }, doc! { "$inc": { "v": 1 } })
                        .await
                        .unwrap();
                    coll.insert_one(doc! { "_id": next, "v": 0 }).await.unwrap();
                    next += 1;
                    n += 1;
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
                n
            })
        };
        let mut cap = capture(
            &db,
            "mode = \"oplog\"",
            "[snapshot]\nmode = \"snapshot+stream\"\n",
        );
        let mut app = apply(&cap.prefix, &unique("g"), "");
        let kills = kill_in_first_second(&mut cap, &mut rng).await;
        eprintln!("round {round}: capture killed {kills:?}");
        wait_initial_snapshot_stored(&cap, Duration::from_secs(120)).await;
        tokio::time::sleep(Duration::from_millis(500)).await;
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let writes = writer.await.unwrap();
        assert!(writes > 10, "{writes} writes");
        converge(
            &src,
            &dst,
            &db,
            "c",
            Duration::from_secs(120),
            &mut [&mut cap, &mut app],
        )
        .await;
        stop_all(&mut [&mut cap, &mut app]).await;
        src.database(&db).drop().await.unwrap();
        dst.database(&db).drop().await.unwrap();
    }
}

/// kill -9 of capture and of apply while writes go on; after restarts the target equals the
/// source, document for document.
#[tokio::test(flavor = "multi_thread")]
async fn kill_nine_of_both_stages_under_load_loses_nothing() {
    let db = unique("sluice_m_kill");
    let (src, dst) = (
        client(mongo_source_url()).await,
        client(mongo_target_url()).await,
    );
    let mut cap = capture(&db, "mode = \"oplog\"", "");
    let group = unique("g");
    let mut app = apply(&cap.prefix, &group, "");
    started(&cap, true).await;
    let writer = {
        let src = src.clone();
        let db = db.clone();
        tokio::spawn(async move {
            let colls: Vec<_> = (0..3)
                .map(|i| src.database(&db).collection::<Document>(&format!("c{i}")))
                .collect();
            for round in 0..40 {
                for (ci, c) in colls.iter().enumerate() {
                    let docs: Vec<Document> = (0..50)
                        .map(|k| doc! { "_id": round * 50 + k, "v": k, "c": ci as i32 })
                        .collect();
                    c.insert_many(docs).await.unwrap();
                    c.update_many(
                        doc! { "_id": { "$mod": [7, round % 7] } },
                        doc! { "$set": { "u": round } },
                    )
                    .await
                    .unwrap();
                    c.delete_one(doc! { "_id": round * 50 + 3 }).await.unwrap();
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })
    };
    tokio::time::sleep(Duration::from_millis(800)).await;
    cap.kill();
    tokio::time::sleep(Duration::from_millis(500)).await;
    cap.restart();
    tokio::time::sleep(Duration::from_millis(800)).await;
    app.kill();
    tokio::time::sleep(Duration::from_millis(500)).await;
    app.restart();
    writer.await.unwrap();
    for i in 0..3 {
        converge(
            &src,
            &dst,
            &db,
            &format!("c{i}"),
            Duration::from_secs(120),
            &mut [&mut cap, &mut app],
        )
        .await;
    }
    stop_all(&mut [&mut cap, &mut app]).await;
    src.database(&db).drop().await.unwrap();
    dst.database(&db).drop().await.unwrap();
}

/// The capture's connection to the source cut under a writer (every socket closed, new ones
/// refused for 3 s), twice: it reopens after the last change it published, without exiting,
/// and the target ends equal to the source.
#[tokio::test(flavor = "multi_thread")]
async fn a_lost_source_connection_is_reopened_and_nothing_is_lost() {
    let db = unique("sluice_m_net");
    let (src, dst) = (
        client(mongo_source_url()).await,
        client(mongo_target_url()).await,
    );
    let relay = Relay::to(&mongo_source_url()).await;
    let mut cap = capture_at(
        &format!(
            "{}&serverSelectionTimeoutMS=2000",
            relay.url(&mongo_source_url())
        ),
        &db,
        "mode = \"oplog\"",
        "",
    );
    let mut app = apply(&cap.prefix, &unique("g"), "");
    started(&cap, true).await;
    let writer = {
        let src = src.clone();
        let db = db.clone();
        tokio::spawn(async move {
            let c = src.database(&db).collection::<Document>("c");
            for round in 0..60 {
                let docs: Vec<Document> = (0..20)
                    .map(|k| doc! { "_id": round * 20 + k, "v": k })
                    .collect();
                c.insert_many(docs).await.unwrap();
                c.update_many(
                    doc! { "_id": { "$mod": [5, round % 5] } },
                    doc! { "$set": { "u": round } },
                )
                .await
                .unwrap();
                c.delete_one(doc! { "_id": round * 20 + 7 }).await.unwrap();
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        })
    };
    for _ in 0..2 {
        tokio::time::sleep(Duration::from_millis(1000)).await;
        relay.cut();
        tokio::time::sleep(Duration::from_secs(3)).await;
        relay.restore();
    }
    writer.await.unwrap();
    converge(
        &src,
        &dst,
        &db,
        "c",
        Duration::from_secs(120),
        &mut [&mut cap, &mut app],
    )
    .await;
    let reconnects = metric_at(cap.metrics_port, "sluice_capture_reconnects_total");
    assert!(
        reconnects.is_some_and(|n| n >= 1.0),
        "the capture reopened its reading: {reconnects:?}"
    );
    stop_all(&mut [&mut cap, &mut app]).await;
    src.database(&db).drop().await.unwrap();
    dst.database(&db).drop().await.unwrap();
}

/// A member that lost its partitions while it retried an outage of its own (it went past
/// `max.poll.interval.ms`) must not write its old batch over what the new owner wrote since.
#[tokio::test(flavor = "multi_thread")]
async fn a_member_that_lost_its_partitions_while_retrying_never_overwrites_the_new_owner() {
    use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
    let db = unique("sluice_m_fence");
    let (src, dst) = (
        client(mongo_source_url()).await,
        client(mongo_target_url()).await,
    );
    let (group, meta) = (unique("g"), unique("meta"));
    let relay = Relay::to(&mongo_target_url()).await;
    let mut cap = capture(&db, "mode = \"oplog\"", "");
    // The collection's topic exists before any change, so member A is assigned its partitions
    // (and claims them) before it has written anything.
    let topic = cap.topic(&db, "c");
    let admin: AdminClient<rdkafka::client::DefaultClientContext> = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", kafka_brokers())
        .create()
        .unwrap();
    for r in admin
        .create_topics(
            &[NewTopic::new(&topic, 3, TopicReplication::Fixed(1))],
            &AdminOptions::new(),
        )
        .await
        .unwrap()
    {
        r.unwrap();
    }
    // Member A reaches the target through the relay; it may go 7 s without polling Kafka.
    let mut a = apply_at(
        &relay.url(&mongo_target_url()),
        &meta,
        &cap.prefix,
        &group,
        "\"max.poll.interval.ms\" = \"7000\"\n",
    );
    started(&cap, true).await;
    let deadline = Instant::now() + Duration::from_secs(60);
    while metric_at(a.metrics_port, "sluice_apply_assigned_partitions") != Some(3.0) {
        assert!(
            Instant::now() < deadline,
            "member A was never assigned the topic"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let c = src.database(&db).collection::<Document>("c");
    let t = dst.database(&db).collection::<Document>("c");
    let v_at_target = || async {
        t.find_one(doc! { "_id": 1 })
            .await
            .unwrap()
            .and_then(|d| d.get_i32("v").ok())
    };
    let wait_for = |want: i32, what: &'static str| {
        let v_at_target = &v_at_target;
        async move {
            let deadline = Instant::now() + Duration::from_secs(60);
            while v_at_target().await != Some(want) {
                assert!(
                    Instant::now() < deadline,
                    "{what}: target never had v = {want}"
                );
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    };
    // A's target goes away before its first write: A holds v = 1 and retries, past its poll
    // interval.
    relay.cut();
    c.insert_one(doc! { "_id": 1, "v": 1 }).await.unwrap();
    tokio::time::sleep(Duration::from_secs(10)).await;
    // Member B takes the partitions over and writes v = 1, then v = 2.
    let mut b = apply_at(&mongo_target_url(), &meta, &cap.prefix, &group, "");
    wait_for(1, "member B takes over").await;
    c.update_one(doc! { "_id": 1 }, doc! { "$set": { "v": 2 } })
        .await
        .unwrap();
    wait_for(2, "member B writes on").await;
    // A's target comes back: A must stop, not write v = 1 over v = 2.
    relay.restore();
    let deadline = Instant::now() + Duration::from_secs(90);
    while !a.exited() && Instant::now() < deadline {
        if v_at_target().await == Some(1) {
            let (_, log) = a.stop();
            panic!("member A wrote its old state over the new owner's:\n{log}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (code, log) = a.wait(Duration::from_secs(1));
    assert!(
        code.is_some_and(|c| c != 0) && log.contains("was taken over by"),
        "member A stops, naming the takeover (exit {code:?}):\n{log}"
    );
    assert_eq!(
        v_at_target().await,
        Some(2),
        "the new owner's write stands\n{log}"
    );
    c.update_one(doc! { "_id": 1 }, doc! { "$set": { "v": 3 } })
        .await
        .unwrap();
    wait_for(3, "member B goes on").await;
    stop_all(&mut [&mut cap, &mut b]).await;
    src.database(&db).drop().await.unwrap();
    dst.database(&db).drop().await.unwrap();
    dst.database(&meta).drop().await.unwrap();
}

/// `publish.heartbeat_interval_ms`: an idle capture publishes heartbeats with the oplog time
/// reached.
#[tokio::test(flavor = "multi_thread")]
async fn an_idle_capture_publishes_heartbeats() {
    let db = unique("sluice_m_beat");
    let mut cap = capture(&db, "mode = \"oplog\"", "");
    cap.stop();
    cap.edit_config(
        "checkpoint_interval_ms = 100\n",
        "checkpoint_interval_ms = 100\nheartbeat_interval_ms = 500\n",
    );
    cap.restart();
    let topic = sluice_capture::publish::heartbeat_topic(&cap.prefix);
    let beats = tokio::task::spawn_blocking(move || {
        sluice_tests::capture::read_events(&topic, Duration::from_secs(60), |m| {
            m.values().flatten().count() >= 2
        })
    })
    .await
    .unwrap();
    let beats: Vec<_> = beats.values().flatten().collect();
    assert!(beats.len() >= 2, "{beats:?}");
    for b in &beats {
        assert_eq!(b.op(), sluice_proto::v1::Op::Heartbeat);
        assert_eq!(b.source.as_ref().unwrap().connector, cap.connector);
        assert!(b.position.is_some());
    }
    cap.stop_ok();
}

/// By default (`errors.on_bad_event = "stop_table"`) a write the target refuses stops its
/// collection, named, across restarts: the collection without that change would differ from the
/// source. The other collections flow.
#[tokio::test(flavor = "multi_thread")]
async fn a_refused_write_stops_its_collection_and_the_rest_flows() {
    let db = unique("sluice_m_stop");
    let (src, dst) = (
        client(mongo_source_url()).await,
        client(mongo_target_url()).await,
    );
    let meta = unique("meta");
    let mut cap = capture(&db, "mode = \"oplog\"", "");
    let target = dst.database(&db).collection::<Document>("a");
    unique_email_index(&target).await;
    let group = unique("g");
    let mut app = apply_at(&mongo_target_url(), &meta, &cap.prefix, &group, "");
    started(&cap, true).await;
    let a = src.database(&db).collection::<Document>("a");
    let b = src.database(&db).collection::<Document>("b");
    a.insert_one(doc! { "_id": 1, "email": "x@example.com" })
        .await
        .unwrap();
    a.insert_one(doc! { "_id": 2, "email": "x@example.com" })
        .await
        .unwrap();
    // The stop is recorded with the refused event's version: whatever comes after it.
    let stopped = dst
        .database(&meta)
        .collection::<Document>("stopped_collections");
    let deadline = Instant::now() + Duration::from_secs(60);
    let reason = loop {
        if let Some(d) = stopped
            .find_one(doc! { "_id": format!("{db}.a") })
            .await
            .unwrap()
        {
            break d.get_str("reason").unwrap().to_string();
        }
        if Instant::now() > deadline {
            let (_, log) = app.stop();
            panic!("{db}.a never stopped:\n{log}");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert!(
        reason.contains("MongoDB refused the write") && reason.contains("dead_letter"),
        "the reason names the refusal and the remedy: {reason}"
    );
    for i in 3..10 {
        a.insert_one(doc! { "_id": i, "email": format!("{i}@example.com") })
            .await
            .unwrap();
        b.insert_one(doc! { "_id": i }).await.unwrap();
    }
    // Restarted, it keeps the collection stopped.
    let (code, _) = app.stop();
    assert_eq!(code, Some(0));
    app.restart();
    for i in 10..15 {
        a.insert_one(doc! { "_id": i, "email": format!("{i}@example.com") })
            .await
            .unwrap();
        b.insert_one(doc! { "_id": i }).await.unwrap();
    }
    let tb = dst.database(&db).collection::<Document>("b");
    let deadline = Instant::now() + Duration::from_secs(60);
    while tb.count_documents(doc! {}).await.unwrap() < 12 {
        if Instant::now() > deadline {
            let (_, log) = app.stop();
            panic!("the other collection did not flow:\n{log}");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(
        target
            .count_documents(doc! { "_id": { "$gte": 3 } })
            .await
            .unwrap(),
        0,
        "the stopped collection takes nothing after the refusal"
    );
    let log = app.stop_ok();
    assert!(log.contains("collection stopped"), "{log}");
    stop_all(&mut [&mut cap]).await;
    src.database(&db).drop().await.unwrap();
    dst.database(&db).drop().await.unwrap();
    dst.database(&meta).drop().await.unwrap();
}

/// A duplicate key on the target's unique index sends that event to the dead-letter topic
/// (`errors.on_bad_event = "dead_letter"`) and the rest flows on; the DDL filter and the
/// namespace map are obeyed.
#[tokio::test(flavor = "multi_thread")]
async fn refused_writes_are_dead_lettered_and_the_stream_goes_on() {
    let db = unique("sluice_m_dead");
    let mapped = unique("sluice_m_mapped");
    let (src, dst) = (
        client(mongo_source_url()).await,
        client(mongo_target_url()).await,
    );
    let dead_topic = unique("dead");
    let mut cap = capture(&db, "mode = \"oplog\"", "");
    // The target has a unique index the source lacks.
    let target = dst.database(&mapped).collection::<Document>("a");
    unique_email_index(&target).await;
    let mut app = apply(
        &cap.prefix,
        &unique("g"),
        &format!("[errors]\non_bad_event = \"dead_letter\"\ndead_letter_topic = \"{dead_topic}\"\n[namespaces]\n\"{db}\" = \"{mapped}\"\n"),
    );
    started(&cap, true).await;
    let a = src.database(&db).collection::<Document>("a");
    a.insert_one(doc! { "_id": 1, "email": "x@example.com" })
        .await
        .unwrap();
    a.insert_one(doc! { "_id": 2, "email": "x@example.com" })
        .await
        .unwrap();
    for i in 3..20 {
        a.insert_one(doc! { "_id": i, "email": format!("{i}@example.com") })
            .await
            .unwrap();
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let n = target.count_documents(doc! {}).await.unwrap();
        if n == 18 {
            break;
        }
        if Instant::now() > deadline {
            let (_, log) = app.stop();
            panic!("target has {n} documents, expected 18 (all but the duplicate)\n{log}");
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    // Documents 1 and 2 travel on different partitions, so which one the target takes first
    // is not fixed: exactly one of them is there.
    let present = target
        .count_documents(doc! { "_id": { "$in": [1, 2] } })
        .await
        .unwrap();
    assert_eq!(
        present, 1,
        "exactly one of the duplicate-email documents is written"
    );
    // The dead letter names the reason.
    let consumer: rdkafka::consumer::BaseConsumer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", kafka_brokers())
        .set("group.id", unique("dl"))
        .set("auto.offset.reset", "earliest")
        .create()
        .unwrap();
    use rdkafka::consumer::Consumer;
    use rdkafka::message::Headers;
    use rdkafka::Message;
    consumer.subscribe(&[&dead_topic]).unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    let reason = loop {
        if let Some(Ok(m)) = consumer.poll(Duration::from_millis(500)) {
            let h = m.headers().unwrap();
            let reason = (0..h.count())
                .map(|i| h.get(i))
                .find(|h| h.key == "sluice.reason")
                .and_then(|h| h.value.map(|v| String::from_utf8_lossy(v).to_string()))
                .unwrap();
            break reason;
        }
        assert!(Instant::now() < deadline, "no dead letter");
    };
    assert!(
        reason.contains("duplicate key") || reason.contains("11000"),
        "{reason}"
    );
    // Once: the insert refused as a duplicate is tried again as a replacement, refused again,
    // and the event is still sent once.
    let until = Instant::now() + Duration::from_secs(3);
    while Instant::now() < until {
        if let Some(Ok(m)) = consumer.poll(Duration::from_millis(300)) {
            panic!("a second dead letter, at offset {}", m.offset());
        }
    }
    stop_all(&mut [&mut cap, &mut app]).await;
    src.database(&db).drop().await.unwrap();
    dst.database(&mapped).drop().await.unwrap();
}

/// An insert whose document the target already holds (a replay, or a copy that outlived a
/// delete) leaves the inserted document, not the one that was there; the other inserts of the
/// same command are written as usual.
#[tokio::test(flavor = "multi_thread")]
async fn an_insert_over_a_document_the_target_holds_replaces_it() {
    let db = unique("sluice_m_over");
    let (src, dst) = (
        client(mongo_source_url()).await,
        client(mongo_target_url()).await,
    );
    let mut cap = capture(&db, "mode = \"oplog\"", "");
    let mut app = apply(&cap.prefix, &unique("g"), "");
    started(&cap, true).await;
    // Held in the target before the source has them: _id 2 with other fields, _id 4 equal.
    let target = dst.database(&db).collection::<Document>("c");
    target
        .insert_many([
            doc! { "_id": 2, "stale": true, "v": -1 },
            doc! { "_id": 4, "v": 4 },
        ])
        .await
        .unwrap();
    let source = src.database(&db).collection::<Document>("c");
    source
        .insert_many((0..8).map(|i| doc! { "_id": i, "v": i }))
        .await
        .unwrap();
    converge(
        &src,
        &dst,
        &db,
        "c",
        Duration::from_secs(60),
        &mut [&mut cap, &mut app],
    )
    .await;
    stop_all(&mut [&mut cap, &mut app]).await;
    src.database(&db).drop().await.unwrap();
    dst.database(&db).drop().await.unwrap();
}

/// The capture resumes from its checkpoint after a clean stop, starts at a given operation time,
/// stops at the end time, and refuses a resume point older than the oplog.
#[tokio::test(flavor = "multi_thread")]
async fn start_end_and_lost_history() {
    let db = unique("sluice_m_time");
    let src = client(mongo_source_url()).await;
    let a = src.database(&db).collection::<Document>("a");
    a.insert_one(doc! { "_id": 0 }).await.unwrap();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    tokio::time::sleep(Duration::from_millis(1100)).await;
    a.insert_one(doc! { "_id": 1 }).await.unwrap();
    // From a time: the document written after it, not the one before; and it stops at `end`
    // (far enough for the second insert to land before it on a loaded machine).
    let mut cap = capture(
        &db,
        &format!(
            "mode = \"oplog\"\nstart = \"time:{}\"\nend = \"time:{}\"",
            now + 1,
            now + 10
        ),
        "",
    );
    let (code, log) = cap.wait(Duration::from_secs(30));
    assert_eq!(code, Some(0), "{log}");
    assert!(log.contains("reached the end time"), "{log}");
    let events =
        sluice_tests::capture::read_events(&cap.topic(&db, "a"), Duration::from_secs(10), |e| {
            sluice_tests::capture::count_rows(e) >= 2
        });
    let ids: Vec<i32> = sluice_tests::capture::row_events(&events)
        .iter()
        .map(|e| {
            let k = e.mongo.as_ref().unwrap().document_key.clone();
            mongodb::bson::Document::from_reader(&mut k.as_slice())
                .unwrap()
                .get_i32("_id")
                .unwrap()
        })
        .collect();
    assert_eq!(ids, vec![1]);
    // A resume point before the oplog's first entry: refused, with the reason.
    let mut old = capture(&db, "mode = \"oplog\"\nstart = \"time:1\"", "");
    let (code, log) = old.wait(Duration::from_secs(30));
    assert_eq!(code, Some(1), "{log}");
    assert!(log.contains("no longer there"), "{log}");
    src.database(&db).drop().await.unwrap();
}

/// apply-mongo's DDL, fed with events written straight to Kafka (mongo-java-server logs no
/// createIndexes, dropIndexes or rename of its own): indexes made and dropped, a rename, a
/// filtered dropDatabase, and row events older than a drop or rename skipped.
#[tokio::test(flavor = "multi_thread")]
async fn ddl_is_applied_filtered_and_ordered_by_version() {
    use prost::Message as _;
    use rdkafka::producer::{FutureProducer, FutureRecord};
    use sluice_proto::v1::{self, ChangeEvent, Op};

    let db = unique("sluice_m_ddl");
    let prefix = unique("mddl");
    let dst = client(mongo_target_url()).await;
    let kafka = sluice_common::KafkaConfig {
        brokers: kafka_brokers(),
        ..Default::default()
    };
    let topic = |coll: &str| format!("{prefix}.{db}.{coll}");
    for coll in ["a", "b", "c", "d"] {
        kafka
            .ensure_topic("test", &topic(coll), 1, 1, false, None)
            .await
            .unwrap();
    }
    let raw = |d: Document| RawDocumentBuf::from_document(&d).unwrap().into_bytes();
    let row = |coll: &str, version: u64, d: Document| ChangeEvent {
        contract: 1,
        op: Op::Insert as i32,
        database: db.clone(),
        table: coll.into(),
        version,
        mongo: Some(v1::MongoChange {
            document_key: raw(doc! { "_id": d.get("_id").unwrap().clone() }),
            full_document: raw(d),
            operation_type: "insert".into(),
            ..Default::default()
        }),
        ..Default::default()
    };
    let ddl =
        |coll: &str, version: u64, kind: &str, command: Document, to: (&str, &str)| ChangeEvent {
            contract: 1,
            op: Op::Ddl as i32,
            database: db.clone(),
            table: coll.into(),
            version,
            ddl: Some(v1::Ddl {
                statement: Bson::Document(command).into_canonical_extjson().to_string(),
                kind: kind.into(),
                new_database: to.0.into(),
                new_table: to.1.into(),
                ..Default::default()
            }),
            ..Default::default()
        };
    let b_ns = format!("{db}.b");
    let events = vec![
        ("a", row("a", 10, doc! { "_id": 1, "k": 1, "m": 1 })),
        (
            "a",
            ddl(
                "a",
                11,
                "create_indexes",
                doc! { "createIndexes": "a", "indexes": [
                    { "v": 2, "key": { "k": 1 }, "name": "k_1", "unique": true },
                    { "v": 2, "key": { "m": -1 }, "name": "m_-1" },
                ] },
                ("", ""),
            ),
        ),
        (
            "a",
            ddl(
                "a",
                12,
                "drop_indexes",
                doc! { "dropIndexes": "a", "index": "m_-1" },
                ("", ""),
            ),
        ),
        ("a", row("a", 13, doc! { "_id": 2, "k": 2 })),
        (
            "a",
            ddl(
                "a",
                14,
                "rename",
                doc! { "renameCollection": format!("{db}.a"), "to": &b_ns },
                (&db, "b"),
            ),
        ),
        // Read after the rename but older than it: its effect went with the rename.
        ("a", row("a", 13, doc! { "_id": 3, "late": true })),
        // A TTL index, then collMod: a TTL change only (nothing the target keeps: ddl.ttl),
        // then a validator the documents already there fail (the apply bypasses it).
        ("d", row("d", 30, doc! { "_id": 1 })),
        (
            "d",
            ddl(
                "d",
                31,
                "create_indexes",
                doc! { "createIndexes": "d", "indexes": [
                    { "v": 2, "key": { "at": 1 }, "name": "at_1", "expireAfterSeconds": 1 },
                ] },
                ("", ""),
            ),
        ),
        (
            "d",
            ddl(
                "d",
                32,
                "modify",
                doc! { "collMod": "d", "index": { "name": "at_1", "expireAfterSeconds": 5 } },
                ("", ""),
            ),
        ),
        (
            "d",
            ddl(
                "d",
                33,
                "modify",
                doc! { "collMod": "d", "validator": { "never": { "$exists": true } }, "validationAction": "error" },
                ("", ""),
            ),
        ),
        ("d", row("d", 34, doc! { "_id": 2, "after": "validator" })),
        ("c", row("c", 15, doc! { "_id": 1 })),
        ("c", ddl("c", 20, "drop", doc! { "drop": "c" }, ("", ""))),
        ("c", row("c", 19, doc! { "_id": 2, "before": "drop" })),
        ("c", row("c", 21, doc! { "_id": 3, "after": "drop" })),
        (
            "c",
            ddl(
                "",
                22,
                "drop_database",
                doc! { "dropDatabase": 1 },
                ("", ""),
            ),
        ),
    ];
    let producer: FutureProducer = kafka.producer_config("test").create().unwrap();
    for (coll, e) in &events {
        producer
            .send(
                FutureRecord::to(&topic(coll))
                    .key("k")
                    .payload(&e.encode_to_vec()),
                Duration::from_secs(10),
            )
            .await
            .unwrap();
    }
    let dlq = unique("mddl_dead");
    let mut app = apply(
        &prefix,
        &unique("g"),
        &format!(
            "[errors]\ndead_letter_topic = \"{dlq}\"\n\
             [ddl]\napply = [\"create\", \"drop\", \"createIndexes\", \"dropIndexes\", \"collMod\", \
             \"renameCollection\"]\n"
        ),
    );
    // Whether this target knows collMod (a MongoDB server does; mongo-java-server does not).
    let probe = dst.database(&unique("sluice_m_probe"));
    probe.create_collection("p").await.unwrap();
    let has_coll_mod = probe
        .run_command(doc! { "collMod": "p", "validationLevel": "moderate" })
        .await
        .is_ok();
    probe.drop().await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    let target = dst.database(&db);
    loop {
        let b = documents(&dst, &db, "b").await;
        let c = documents(&dst, &db, "c").await;
        let d = documents(&dst, &db, "d").await;
        if b.len() == 2 && c.len() == 1 && d.len() == 2 {
            break;
        }
        if Instant::now() > deadline {
            let (_, log) = app.stop();
            panic!(
                "target: b {:?}, c {:?}, d {:?}\n{log}",
                decoded(&b),
                decoded(&c),
                decoded(&d)
            );
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    // Give the late events time to (wrongly) land, then look.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let names = target.list_collection_names().await.unwrap();
    assert!(
        !names.contains(&"a".to_string()),
        "the renamed collection came back: {names:?}"
    );
    assert_eq!(
        decoded(&documents(&dst, &db, "c").await),
        decoded(&[RawDocumentBuf::from_document(&doc! { "_id": 3, "after": "drop" }).unwrap()]),
        "only the write after the drop is in c"
    );
    let indexes: Vec<String> = target
        .collection::<Document>("b")
        .list_index_names()
        .await
        .unwrap();
    assert!(indexes.contains(&"k_1".to_string()), "{indexes:?}");
    assert!(!indexes.contains(&"m_-1".to_string()), "{indexes:?}");
    // The TTL index is there, without an expiry of its own (ddl.ttl = "without_expiry").
    let mut specs = target
        .collection::<Document>("d")
        .list_indexes()
        .await
        .unwrap();
    let mut ttl = None;
    while let Some(i) = specs.next().await {
        let i = i.unwrap();
        if i.options.as_ref().and_then(|o| o.name.as_deref()) == Some("at_1") {
            ttl = Some(i);
        }
    }
    let ttl = ttl.expect("index at_1 on the target");
    assert_eq!(
        ttl.options.and_then(|o| o.expire_after),
        None,
        "the target's copy of a TTL index expires nothing"
    );
    // The validator: applied where the target knows collMod (and the document written after
    // it arrived all the same); elsewhere dead-lettered, named, and the rest flowed.
    let letters = tokio::task::spawn_blocking({
        let dlq = dlq.clone();
        move || sluice_tests::capture::dead_letters(&dlq, 1)
    })
    .await
    .unwrap();
    if has_coll_mod {
        assert!(letters.is_empty(), "{letters:?}");
        let spec = target
            .run_command(doc! { "listCollections": 1, "filter": { "name": "d" } })
            .await
            .unwrap();
        let text = format!("{spec:?}");
        assert!(
            text.contains("never"),
            "the validator on the target: {text}"
        );
    } else {
        let reasons: Vec<&str> = letters.iter().map(|(_, r)| r.as_str()).collect();
        assert_eq!(letters.len(), 1, "{reasons:?}");
        assert!(
            reasons[0].contains("modify on") && reasons[0].contains("failed"),
            "{reasons:?}"
        );
        // The first dead letter is the validator's (version 33): the TTL-only collMod before
        // it was not sent to the target at all.
        let first = ChangeEvent::decode(&letters[0].0[..]).unwrap();
        assert_eq!(first.version, 33, "{reasons:?}");
    }
    // dropDatabase is not in the filter: the database is still there.
    let log = app.stop_ok();
    assert!(log.contains("not applied (ddl.apply)"), "{log}");
    assert_eq!(documents(&dst, &db, "b").await.len(), 2);
    dst.database(&db).drop().await.unwrap();
}

/// Snapshot + stream of a 100 000-document collection (W2-like documents) under a concurrent
/// writer, the capture killed in the middle of the copy and restarted: the copy goes on from the
/// stored `_id`, and the target ends equal to the source, indexes included. Also an empty
/// collection and one with string `_id`s.
#[tokio::test(flavor = "multi_thread")]
async fn snapshot_then_stream_survives_kill_9_mid_copy_under_a_writer() {
    let db = unique("sluice_m_snap");
    let (src, dst) = (
        client(mongo_source_url()).await,
        client(mongo_target_url()).await,
    );
    let n = 100_000i32;
    let big = src.database(&db).collection::<Document>("big");
    for b in 0..(n / 5000) {
        let docs: Vec<Document> = (b * 5000..(b + 1) * 5000)
            .map(|i| {
                doc! { "_id": i, "name": format!("name-{i}"), "age": i % 90, "city": "Lyon",
                       "score": f64::from(i) / 7.0, "tags": ["a", "b"], "at": mongodb::bson::DateTime::from_millis(1_700_000_000_000 + i64::from(i)) }
            })
            .collect();
        big.insert_many(docs).await.unwrap();
    }
    big.create_index(
        mongodb::IndexModel::builder()
            .keys(doc! { "city": 1, "age": -1 })
            .options(
                mongodb::options::IndexOptions::builder()
                    .name("city_age".to_string())
                    .build(),
            )
            .build(),
    )
    .await
    .unwrap();
    src.database(&db).create_collection("empty").await.unwrap();
    let strid = src.database(&db).collection::<Document>("strid");
    strid
        .insert_many(
            ["b", "a", "é", "Z", "", "aa"]
                .iter()
                .enumerate()
                .map(|(i, s)| doc! { "_id": *s, "i": i as i32 }),
        )
        .await
        .unwrap();

    let mut cap = capture(
        &db,
        "mode = \"oplog\"",
        "[snapshot]\nmode = \"snapshot+stream\"\nchunk_rows = 1000\n",
    );
    let mut app = apply(&cap.prefix, &unique("g"), "");
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writer = {
        let big = big.clone();
        let stop = stop.clone();
        tokio::spawn(async move {
            let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
            let mut k = 0i32;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let id = (x % n as u64) as i32;
                match k % 4 {
                    0 => {
                        big.update_one(
                            doc! { "_id": id },
                            doc! { "$set": { "name": format!("w{k}") }, "$unset": { "tags": "" } },
                        )
                        .await
                        .unwrap();
                    }
                    1 => {
                        big.delete_one(doc! { "_id": id }).await.unwrap();
                    }
                    2 => {
                        big.insert_one(doc! { "_id": n + k, "name": "new", "age": 1 })
                            .await
                            .unwrap();
                    }
                    _ => {
                        big.replace_one(doc! { "_id": id }, doc! { "name": "replaced", "k": k })
                            .await
                            .unwrap();
                    }
                }
                k += 1;
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
            k
        })
    };
    // Kill once the stored checkpoint says a good part was copied.
    let big_docs = format!("{db}.big");
    let before = wait_stored_snapshot_rows(&cap.connector, 20_000, Duration::from_secs(180), |c| {
        c["snapshot"]["tables"][&big_docs]["rows"]
            .as_u64()
            .unwrap_or(0)
    })
    .await;
    cap.kill();
    assert!(before < 80_000, "killed too late: {before}");
    cap.restart();
    wait_snapshot_done(cap.metrics_port, Duration::from_secs(300)).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let writes = writer.await.unwrap();
    assert!(writes > 20, "{writes} writes");
    // The restart went on from the stored _id: it copied well under the collection again.
    let second = metric_at(cap.metrics_port, "sluice_capture_snapshot_rows_total").unwrap();
    assert!(
        second < f64::from(n) - before as f64 / 2.0,
        "the restarted capture copied {second} documents after {before} were stored"
    );
    for coll in ["big", "empty", "strid"] {
        converge(
            &src,
            &dst,
            &db,
            coll,
            Duration::from_secs(240),
            &mut [&mut cap, &mut app],
        )
        .await;
    }
    // The empty collection and the index exist on the target.
    let names = dst.database(&db).list_collection_names().await.unwrap();
    assert!(names.contains(&"empty".to_string()), "{names:?}");
    let indexes = dst
        .database(&db)
        .collection::<Document>("big")
        .list_index_names()
        .await
        .unwrap();
    assert!(indexes.contains(&"city_age".to_string()), "{indexes:?}");
    stop_all(&mut [&mut cap, &mut app]).await;
    src.database(&db).drop().await.unwrap();
    dst.database(&db).drop().await.unwrap();
}

/// A re-snapshot on request: one collection copied again while the others stream, once per
/// request id.
#[tokio::test(flavor = "multi_thread")]
async fn a_collection_is_copied_again_on_request() {
    let db = unique("sluice_m_resnap");
    let (src, dst) = (
        client(mongo_source_url()).await,
        client(mongo_target_url()).await,
    );
    let (a, b) = (
        src.database(&db).collection::<Document>("a"),
        src.database(&db).collection::<Document>("b"),
    );
    a.insert_many((0..5).map(|i| doc! { "_id": i, "v": i }))
        .await
        .unwrap();
    let mut cap = capture(&db, "mode = \"oplog\"", "");
    let mut app = apply(&cap.prefix, &unique("g"), "");
    started(&cap, true).await;
    b.insert_one(doc! { "_id": 1, "v": 1 }).await.unwrap();
    converge(
        &src,
        &dst,
        &db,
        "b",
        Duration::from_secs(60),
        &mut [&mut cap, &mut app],
    )
    .await;
    // Streaming only: a's documents, written before the capture started, are not there.
    assert_eq!(
        dst.database(&db)
            .collection::<Document>("a")
            .count_documents(doc! {})
            .await
            .unwrap(),
        0
    );
    cap.stop_ok();

    cap.append_config(&format!(
        "[snapshot]\ntables = [\"{db}.a\"]\nrequest_id = \"again-1\"\n"
    ));
    cap.restart();
    b.insert_one(doc! { "_id": 2, "v": 2 }).await.unwrap();
    converge(
        &src,
        &dst,
        &db,
        "a",
        Duration::from_secs(60),
        &mut [&mut cap, &mut app],
    )
    .await;
    converge(
        &src,
        &dst,
        &db,
        "b",
        Duration::from_secs(60),
        &mut [&mut cap, &mut app],
    )
    .await;
    let log = cap.stop_ok();
    assert!(log.contains("snapshot finished"), "{log}");
    assert_eq!(
        lines_with(&log, "collection copied"),
        1,
        "only a is copied: {log}"
    );

    // Served once.
    cap.restart();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let log = cap.stop_ok();
    assert!(!log.contains("snapshot starts"), "{log}");
    stop_all(&mut [&mut app]).await;
    src.database(&db).drop().await.unwrap();
    dst.database(&db).drop().await.unwrap();
}

fn lines_with(log: &str, needle: &str) -> usize {
    log.lines().filter(|l| l.contains(needle)).count()
}

/// Oplog mode holds a transaction until its outcome: a `partialTxn` chain larger than
/// `mongodb.max_held_bytes` waits in a file until its last entry, a prepared transaction counts
/// at its commit (after a change written in between) and an aborted one not at all.
///
/// mongo-java-server writes no transactions, so on the test bed the entries are written, in
/// MongoDB's oplog format, into the oplog of a mongo-java-server of the test's own. Against a
/// real replica set (SLUICE_MONGO_SOURCE_URL) a real transaction of 21 MB (which MongoDB splits
/// into `partialTxn` entries) and an aborted one are written instead; prepared transactions
/// need a sharded cluster, and are left to the unit tests there.
#[tokio::test(flavor = "multi_thread")]
async fn held_transactions_spill_past_the_bound_and_count_only_at_their_commit() {
    let db = unique("sluice_m_held");
    let dst = client(mongo_target_url()).await;
    let shared = client(mongo_source_url()).await;
    let real = !is_mongo_java_server(&shared).await;
    let private = if real {
        None
    } else {
        match sluice_tests::private_mongo::PrivateMongo::start() {
            Some(p) => Some(p),
            None => {
                eprintln!("skipped: no mongo-java-server here (deploy/testbed.sh start mongo)");
                return;
            }
        }
    };
    let url = private.as_ref().map_or_else(mongo_source_url, |p| p.url());
    let src = client(url.clone()).await;
    let coll = src.database(&db).collection::<Document>("c");
    // An entry for "now" to be.
    coll.insert_one(doc! { "_id": -1 }).await.unwrap();
    let mut cap = capture_at(&url, &db, "mode = \"oplog\"\nmax_held_bytes = 4000", "");
    let mut app = apply(&cap.prefix, &unique("g"), "");
    let deadline = Instant::now() + Duration::from_secs(60);
    while sluice_tests::capture::last_checkpoint(&cap.connector).is_none() {
        assert!(Instant::now() < deadline, "no start position stored");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let pad = "x".repeat(400);
    if real {
        let big = "y".repeat(700 << 10);
        let mut s = src.start_session().await.unwrap();
        s.start_transaction().await.unwrap();
        for i in 0..30 {
            coll.insert_one(doc! { "_id": i, "big": &big })
                .session(&mut s)
                .await
                .unwrap();
        }
        s.commit_transaction().await.unwrap();
        s.start_transaction().await.unwrap();
        coll.insert_one(doc! { "_id": 300 })
            .session(&mut s)
            .await
            .unwrap();
        s.abort_transaction().await.unwrap();
        coll.delete_one(doc! { "_id": 0 }).await.unwrap();
        converge(
            &src,
            &dst,
            &db,
            "c",
            Duration::from_secs(120),
            &mut [&mut cap, &mut app],
        )
        .await;
    } else {
        let oplog = src.database("local").collection::<Document>("oplog.rs");
        let newest = oplog
            .find_one(doc! {})
            .sort(doc! { "$natural": -1 })
            .await
            .unwrap()
            .unwrap();
        let base = newest.get_timestamp("ts").unwrap();
        let mut n = 0u32;
        let mut ts = || {
            n += 1;
            Timestamp {
                time: base.time + 1,
                increment: n,
            }
        };
        let lsid = doc! { "id": Binary { subtype: BinarySubtype::Uuid, bytes: vec![9; 16] } };
        let ns = format!("{db}.c");
        let insert = |id: i32| doc! { "op": "i", "ns": &ns, "o": { "_id": id, "pad": &pad } };
        let txn = |ts: Timestamp, n: i64, o: Document| {
            doc! { "ts": ts, "t": 1i64, "op": "c", "ns": "admin.$cmd", "lsid": lsid.clone(), "txnNumber": n, "o": o }
        };
        let mut entries = Vec::new();
        // Transaction 1: three partial entries of five inserts each, then the last with two.
        for part in 0..3 {
            let ops: Vec<Document> = (0..5).map(|k| insert(part * 5 + k)).collect();
            entries.push(txn(ts(), 1, doc! { "applyOps": ops, "partialTxn": true }));
        }
        entries.push(txn(ts(), 1, doc! { "applyOps": [insert(15), insert(16)] }));
        // Transaction 2: partial, prepared; an ordinary insert; transaction 3 prepared and
        // aborted; transaction 2 committed; then a delete of a document of transaction 1.
        entries.push(txn(
            ts(),
            2,
            doc! { "applyOps": [insert(100)], "partialTxn": true },
        ));
        entries.push(txn(
            ts(),
            2,
            doc! { "applyOps": [insert(101)], "prepare": true },
        ));
        entries.push(doc! { "ts": ts(), "t": 1i64, "op": "i", "ns": &ns, "o": { "_id": 200 } });
        entries.push(txn(
            ts(),
            3,
            doc! { "applyOps": [insert(300)], "prepare": true },
        ));
        entries.push(txn(ts(), 3, doc! { "abortTransaction": 1 }));
        let commit = ts();
        entries.push(txn(
            commit,
            2,
            doc! { "commitTransaction": 1, "commitTimestamp": commit },
        ));
        entries.push(doc! { "ts": ts(), "t": 1i64, "op": "d", "ns": &ns, "o": { "_id": 0 } });
        oplog.insert_many(entries).await.unwrap();
        let target = dst.database(&db).collection::<Document>("c");
        let mut want: Vec<i32> = (1..=16).collect();
        want.extend([100, 101, 200]);
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let got: Vec<i32> = target
                .find(doc! {})
                .sort(doc! { "_id": 1 })
                .await
                .unwrap()
                .map(|d| d.unwrap().get_i32("_id").unwrap())
                .collect()
                .await;
            if got == want {
                break;
            }
            if Instant::now() > deadline {
                let logs = [cap.stop().1, app.stop().1].join("\n----\n");
                panic!("target {got:?}, want {want:?}\n{logs}");
            }
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
        let doc = target.find_one(doc! { "_id": 101 }).await.unwrap().unwrap();
        assert_eq!(doc.get_str("pad").unwrap(), pad);
    }
    let log = cap.stop_ok();
    assert!(log.contains("larger than mongodb.max_held_bytes"), "{log}");
    app.stop_ok();
    let _ = shared;
    dst.database(&db).drop().await.unwrap();
}

/// A change too large to publish refuses its collection (named with the document's `_id`),
/// which apply-mongo stops; the other collections flow and the capture goes on.
#[tokio::test(flavor = "multi_thread")]
async fn a_change_too_large_to_publish_refuses_its_collection_and_the_rest_flows() {
    let db = unique("sluice_m_large");
    let (src, dst) = (
        client(mongo_source_url()).await,
        client(mongo_target_url()).await,
    );
    let mut cap = capture_with(
        &mongo_source_url(),
        &db,
        "mode = \"oplog\"",
        "",
        "max_message_bytes = 1048576",
    );
    let mut app = apply(&cap.prefix, &unique("g"), "");
    started(&cap, true).await;
    let (big, small) = (
        src.database(&db).collection::<Document>("big"),
        src.database(&db).collection::<Document>("small"),
    );
    big.insert_many([doc! { "_id": 1 }, doc! { "_id": 2 }])
        .await
        .unwrap();
    small.insert_one(doc! { "_id": 1 }).await.unwrap();
    big.insert_one(doc! { "_id": 3, "blob": "z".repeat(1_300_000) })
        .await
        .unwrap();
    big.insert_one(doc! { "_id": 4 }).await.unwrap();
    small
        .insert_many([doc! { "_id": 2 }, doc! { "_id": 3 }])
        .await
        .unwrap();
    converge(
        &src,
        &dst,
        &db,
        "small",
        Duration::from_secs(60),
        &mut [&mut cap, &mut app],
    )
    .await;
    let ids = |docs: Vec<RawDocumentBuf>| -> Vec<i32> {
        docs.iter().map(|d| d.get_i32("_id").unwrap()).collect()
    };
    // Each partition of the collection's topic stops at the refusal, after what came before.
    let deadline = Instant::now() + Duration::from_secs(30);
    while ids(documents(&dst, &db, "big").await) != vec![1, 2] && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // And nothing after it arrives later.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(ids(documents(&dst, &db, "big").await), vec![1, 2]);
    let log = cap.stop_ok();
    assert!(log.contains("collection refused"), "{log}");
    assert!(log.contains("_id 3"), "{log}");
    assert!(log.contains("publish.max_message_bytes (1048576)"), "{log}");
    // The capture itself published nothing of the collection after the refusal (not only
    // apply-mongo's stop holding it back): its topic has the two inserts before it.
    let topic = cap.topic(&db, "big");
    let events = tokio::task::spawn_blocking(move || {
        sluice_tests::capture::read_events(&topic, Duration::from_secs(10), |_| false)
    })
    .await
    .unwrap();
    assert_eq!(
        sluice_tests::capture::count_rows(&events),
        2,
        "row events of the refused collection's topic"
    );
    let out = app.stop_ok();
    assert!(out.contains("collection stopped"), "{out}");
    src.database(&db).drop().await.unwrap();
    dst.database(&db).drop().await.unwrap();
}

/// A row event of a newer contract than this build's stops its collection (it would lack the
/// change), recorded in `stopped_collections`; the collection's later events are not written,
/// and another collection's are.
#[tokio::test(flavor = "multi_thread")]
async fn a_row_event_of_a_newer_contract_stops_its_collection() {
    use prost::Message as _;
    use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
    use rdkafka::producer::{FutureProducer, FutureRecord};
    use sluice_proto::v1::{ChangeEvent, MongoChange, Op};
    let db = unique("sluice_m_contract");
    let prefix = unique("mcdc");
    let (meta, group) = (unique("meta"), unique("g"));
    let config = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", kafka_brokers())
        .clone();
    let admin: AdminClient<rdkafka::client::DefaultClientContext> = config.create().unwrap();
    let topic = |coll: &str| format!("{prefix}.{db}.{coll}");
    let (tc, td) = (topic("c"), topic("d"));
    for r in admin
        .create_topics(
            &[
                NewTopic::new(&tc, 1, TopicReplication::Fixed(1)),
                NewTopic::new(&td, 1, TopicReplication::Fixed(1)),
            ],
            &AdminOptions::new(),
        )
        .await
        .unwrap()
    {
        r.unwrap();
    }
    let event = |coll: &str, contract: u32, id: i32, version: u64| {
        let key = mongodb::bson::to_vec(&doc! { "_id": id }).unwrap();
        ChangeEvent {
            contract,
            op: Op::Insert as i32,
            database: db.clone(),
            table: coll.into(),
            version,
            commit_time_micros: sluice_common::clock::now_micros(),
            mongo: Some(MongoChange {
                document_key: key,
                full_document: mongodb::bson::to_vec(&doc! { "_id": id, "v": id }).unwrap(),
                operation_type: "insert".into(),
                ..Default::default()
            }),
            ..Default::default()
        }
        .encode_to_vec()
    };
    let mut app = apply_at(&mongo_target_url(), &meta, &prefix, &group, "");
    let producer: FutureProducer = config.create().unwrap();
    for (t, payload) in [
        (&tc, event("c", 1, 1, 1)),
        (&tc, event("c", 99, 2, 2)),
        (&tc, event("c", 1, 3, 3)),
        (&td, event("d", 1, 1, 4)),
    ] {
        producer
            .send(
                FutureRecord::<(), _>::to(t).partition(0).payload(&payload),
                Duration::from_secs(10),
            )
            .await
            .unwrap();
    }
    let dst = client(mongo_target_url()).await;
    let (c, d) = (
        dst.database(&db).collection::<Document>("c"),
        dst.database(&db).collection::<Document>("d"),
    );
    let deadline = Instant::now() + Duration::from_secs(60);
    while d.count_documents(doc! {}).await.unwrap() < 1 {
        assert!(
            Instant::now() < deadline,
            "the other collection's document never arrived"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let stops = dst
        .database(&meta)
        .collection::<Document>("stopped_collections");
    let record = || stops.find_one(doc! { "_id": format!("{db}.c") });
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut stopped = record().await.unwrap();
    while stopped.is_none() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(200)).await;
        stopped = record().await.unwrap();
    }
    let stopped = stopped.expect("the collection is recorded as stopped");
    assert!(
        stopped
            .get_str("reason")
            .unwrap_or_default()
            .contains("contract version 99"),
        "{stopped:?}"
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    let ids: Vec<i32> = c
        .find(doc! {})
        .await
        .unwrap()
        .map(|d| d.unwrap().get_i32("_id").unwrap())
        .collect()
        .await;
    assert_eq!(ids, vec![1], "only the document before the refused event");
    // Seen: in /healthz and in a metric; gone when its record is deleted, and said.
    let healthz = |port: u16| {
        let out = std::process::Command::new("curl")
            .args(["-s", "-w", "\n%{http_code}"])
            .arg(format!("http://127.0.0.1:{port}/healthz"))
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let h = healthz(app.metrics_port);
    assert!(
        h.ends_with("503") && h.contains(&format!("1 collection(s) stopped: {db}.c")),
        "{h}"
    );
    assert_eq!(
        sluice_tests::capture::metric_at(app.metrics_port, "sluice_apply_stopped_tables"),
        Some(1.0)
    );
    // And in `sluice status` given the applier's config, with the steps to take it up again.
    let config = app.config_path().to_str().unwrap().to_string();
    let (code, out, err) =
        sluice_tests::capture::sluice(&["status", "--group", &group, "--apply-config", &config]);
    assert_eq!(code, Some(0), "{out}{err}");
    assert!(
        out.contains(&format!("  {db}.c (apply-mongo, group "))
            && out.contains("contract version 99")
            && out.contains(&format!(
                "stopped_collections.deleteOne({{_id: \"{db}.c\"}})"
            )),
        "{out}"
    );
    stops
        .delete_one(doc! { "_id": format!("{db}.c") })
        .await
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while !healthz(app.metrics_port).ends_with("200") {
        assert!(Instant::now() < deadline, "{}", healthz(app.metrics_port));
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(
        sluice_tests::capture::metric_at(app.metrics_port, "sluice_apply_stopped_tables"),
        Some(0.0)
    );
    let out = app.stop_ok();
    assert!(out.contains("collection taken up again"), "{out}");
    dst.database(&db).drop().await.unwrap();
}

/// One update of [`every_update_operator`]: its name, what the filter adds to `_id` (the
/// positional `$` needs the array matched), the update, its `arrayFilters`, and whether
/// mongo-java-server knows it.
struct UpdateCase {
    name: &'static str,
    filter: Document,
    update: Document,
    array_filters: Vec<Document>,
    mjs: bool,
}

fn case(name: &'static str, filter: Document, update: Document) -> UpdateCase {
    UpdateCase {
        name,
        filter,
        update,
        array_filters: Vec::new(),
        mjs: true,
    }
}

/// The update operators, each as a user writes it; positional paths and arrayFilters among
/// them.
fn update_cases() -> Vec<UpdateCase> {
    let mut cases = vec![
        case(
            "$set",
            doc! {},
            doc! { "$set": { "name": "y", "nested.x": 2, "arr.1": 20, "added": { "deep": true } } },
        ),
        case(
            "$unset",
            doc! {},
            doc! { "$unset": { "name": "", "nested.x": "", "objs.0.v": "" } },
        ),
        case(
            "$inc",
            doc! {},
            doc! { "$inc": { "n": 3, "f": 0.5, "nested.x": -1, "arr.0": 10, "fresh": 1 } },
        ),
        case(
            "$mul",
            doc! {},
            doc! { "$mul": { "n": 2, "f": 3, "missing": 5 } },
        ),
        case(
            "$min",
            doc! {},
            doc! { "$min": { "n": 1, "f": 10.0, "low": 7 } },
        ),
        case("$max", doc! {}, doc! { "$max": { "n": 50, "nested.x": 0 } }),
        case(
            "$rename",
            doc! {},
            doc! { "$rename": { "name": "title", "nested.x": "moved_x" } },
        ),
        case("$push", doc! {}, doc! { "$push": { "s": "c" } }),
        case(
            "$push $each $position $slice",
            doc! {},
            doc! { "$push": { "arr": { "$each": [7, 8, 9], "$position": 1, "$slice": 5 } } },
        ),
        case(
            "$push $each $slice -2",
            doc! {},
            doc! { "$push": { "objs": { "$each": [{ "k": 0, "v": 0 }], "$slice": -2 } } },
        ),
        case(
            "$pull",
            doc! {},
            doc! { "$pull": { "arr": 2, "objs": { "k": { "$gte": 2 } } } },
        ),
        case("$pullAll", doc! {}, doc! { "$pullAll": { "arr": [1, 3] } }),
        case(
            "$addToSet",
            doc! {},
            doc! { "$addToSet": { "s": "a", "arr": { "$each": [3, 4, 4] } } },
        ),
        case("$pop 1", doc! {}, doc! { "$pop": { "arr": 1 } }),
        case("$pop -1", doc! {}, doc! { "$pop": { "s": -1 } }),
        case(
            "$currentDate",
            doc! {},
            doc! { "$currentDate": { "touched": true, "stamp": { "$type": "timestamp" }, "d": { "$type": "date" } } },
        ),
        case(
            "$setOnInsert on a match",
            doc! {},
            doc! { "$setOnInsert": { "never": 1 }, "$set": { "seen": true } },
        ),
        case(
            "$ (positional) $set",
            doc! { "arr": 2 },
            doc! { "$set": { "arr.$": 20 } },
        ),
        case(
            "$ (positional) in documents",
            doc! { "objs.k": 2 },
            doc! { "$set": { "objs.$.v": 22 }, "$inc": { "n": 1 } },
        ),
        case(
            "$ (positional) $unset",
            doc! { "objs.k": 3 },
            doc! { "$unset": { "objs.$.v": "" } },
        ),
        case(
            "$ (positional) $inc",
            doc! { "objs.k": 1 },
            doc! { "$inc": { "objs.$.v": 5 } },
        ),
        case("$[] $set", doc! {}, doc! { "$set": { "arr.$[]": 0 } }),
        case("$[] $inc", doc! {}, doc! { "$inc": { "objs.$[].v": 100 } }),
        UpdateCase {
            array_filters: vec![doc! { "e.k": { "$gte": 2 } }],
            ..case("$[e] $set", doc! {}, doc! { "$set": { "objs.$[e].v": -1 } })
        },
        UpdateCase {
            array_filters: vec![doc! { "x": { "$gt": 1 } }],
            ..case("$[x] $mul", doc! {}, doc! { "$mul": { "arr.$[x]": 10 } })
        },
        UpdateCase {
            array_filters: vec![doc! { "l.k": 1 }],
            ..case(
                "$[l] $push nested",
                doc! {},
                doc! { "$push": { "nested.list.$[l].tags": 9 } },
            )
        },
        UpdateCase {
            array_filters: vec![doc! { "e.k": 2 }],
            ..case(
                "$[e] $unset",
                doc! {},
                doc! { "$unset": { "objs.$[e].v": "" } },
            )
        },
    ];
    cases.push(UpdateCase {
        mjs: false, // "Unsupported modifier: $bit"
        ..case("$bit", doc! {}, doc! { "$bit": { "n": { "or": 8 } } })
    });
    cases
}

fn base_document(id: i32) -> Document {
    doc! {
        "_id": id,
        "name": "x",
        "n": 5,
        "f": 2.5,
        "arr": [1, 2, 3, 2],
        "objs": [{ "k": 1, "v": 1 }, { "k": 2, "v": 2 }, { "k": 3, "v": 3 }],
        "s": ["a", "b"],
        "nested": { "x": 1, "list": [{ "k": 1, "tags": [1, 2] }, { "k": 2, "tags": [3] }] },
    }
}

/// Wait until every document of the target collection equals the source's of the same `_id`
/// (field for field, field order aside: canonical extended JSON compared as maps), or panic
/// naming each differing document (`names`: what was done to it) with both sides.
async fn converge_each(
    src: &Client,
    dst: &Client,
    db: &str,
    coll: &str,
    names: &std::collections::BTreeMap<i32, String>,
    limit: Duration,
    procs: &mut [&mut CaptureProcess],
) {
    let deadline = Instant::now() + limit;
    loop {
        let by_id =
            |docs: Vec<RawDocumentBuf>| -> std::collections::BTreeMap<String, serde_json::Value> {
                decoded(&docs)
                    .into_iter()
                    .map(|d| (d["_id"].to_string(), d))
                    .collect()
            };
        let (a, b) = (
            by_id(documents(src, db, coll).await),
            by_id(documents(dst, db, coll).await),
        );
        let mut differ = Vec::new();
        for (id, d) in &a {
            if b.get(id) != Some(d) {
                differ.push(format!(
                    "_id {id} ({}): source {d}, target {}",
                    serde_json::from_str::<serde_json::Value>(id)
                        .ok()
                        .and_then(|v| v["$numberInt"].as_str()?.parse::<i32>().ok())
                        .and_then(|i| names.get(&i).cloned())
                        .unwrap_or_default(),
                    b.get(id).map_or("missing".into(), |t| t.to_string())
                ));
            }
        }
        for id in b.keys().filter(|id| !a.contains_key(*id)) {
            differ.push(format!("_id {id}: only on the target"));
        }
        if differ.is_empty() {
            return;
        }
        if Instant::now() > deadline {
            let logs: Vec<String> = procs.iter_mut().map(|p| p.stop().1).collect();
            panic!(
                "{db}.{coll}: {} documents differ after {limit:?}:\n{}\nlogs:\n{}",
                differ.len(),
                differ.join("\n"),
                logs.join("\n----\n")
            );
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

/// Every update operator the source server knows, positional paths and arrayFilters included,
/// through capture-mongo, Kafka and apply-mongo: each on a document of its own, then all of them
/// in turn on one document (between them a `$set` the source describes, so looked-up and
/// described updates of one document interleave), and `$setOnInsert` by upserts. Every target
/// document must equal its source document; no collection is stopped.
async fn every_update_operator(mode: &str) {
    let db = unique("sluice_m_upd");
    let (src, dst) = (
        client(mongo_source_url()).await,
        client(mongo_target_url()).await,
    );
    let mjs = is_mongo_java_server(&src).await;
    let coll = src.database(&db).collection::<Document>("ops");
    let other = src.database(&db).collection::<Document>("other");
    let mut cap = capture(&db, &format!("mode = \"{mode}\""), "");
    let meta = unique("meta");
    let mut app = apply_at(&mongo_target_url(), &meta, &cap.prefix, &unique("g"), "");
    started(&cap, mode == "oplog").await;
    let cases: Vec<UpdateCase> = update_cases()
        .into_iter()
        .filter(|c| c.mjs || !mjs)
        .collect();
    const CHAIN: i32 = 1000;
    let mut names = std::collections::BTreeMap::new();
    names.insert(CHAIN, "every update in turn".to_string());
    for (i, c) in cases.iter().enumerate() {
        names.insert(i as i32, c.name.to_string());
        coll.insert_one(base_document(i as i32)).await.unwrap();
    }
    coll.insert_one(base_document(CHAIN)).await.unwrap();
    for (i, c) in cases.iter().enumerate() {
        for id in [i as i32, CHAIN] {
            // (On the chain's document the positional `$` may find no match by then: the
            // update then changes nothing, as on the source.)
            let mut filter = doc! { "_id": id };
            filter.extend(c.filter.clone());
            let mut update = coll.update_one(filter, c.update.clone());
            if !c.array_filters.is_empty() {
                update = update.array_filters(c.array_filters.clone());
            }
            if c.name.starts_with("$setOnInsert") {
                update = update.upsert(true);
            }
            let r = update
                .await
                .unwrap_or_else(|e| panic!("{} on _id {id}: {e}", c.name));
            if id != CHAIN {
                assert_eq!(r.modified_count, 1, "{} changed nothing", c.name);
            }
        }
        coll.update_one(doc! { "_id": CHAIN }, doc! { "$set": { "step": i as i32 } })
            .await
            .unwrap();
    }
    // $setOnInsert: an upsert that inserts (and a later one that matches it).
    for _ in 0..2 {
        coll.update_one(
            doc! { "_id": 2000 },
            doc! { "$setOnInsert": { "created": 1 }, "$inc": { "upserts": 1 } },
        )
        .upsert(true)
        .await
        .unwrap();
    }
    names.insert(2000, "$setOnInsert by an upsert".to_string());
    for i in 0..5 {
        other.insert_one(doc! { "_id": i }).await.unwrap();
    }
    converge_each(
        &src,
        &dst,
        &db,
        "ops",
        &names,
        Duration::from_secs(90),
        &mut [&mut cap, &mut app],
    )
    .await;
    converge(
        &src,
        &dst,
        &db,
        "other",
        Duration::from_secs(30),
        &mut [&mut cap, &mut app],
    )
    .await;
    let stopped: Vec<Document> = dst
        .database(&meta)
        .collection::<Document>("stopped_collections")
        .find(doc! {})
        .await
        .unwrap()
        .map(|d| d.unwrap())
        .collect()
        .await;
    assert!(stopped.is_empty(), "collections stopped: {stopped:?}");
    stop_all(&mut [&mut cap, &mut app]).await;
    src.database(&db).drop().await.unwrap();
    dst.database(&db).drop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn every_update_operator_arrives_as_the_source_has_it_through_the_oplog() {
    every_update_operator("oplog").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn every_update_operator_arrives_as_the_source_has_it_through_a_change_stream() {
    let src = client(mongo_source_url()).await;
    if is_mongo_java_server(&src).await {
        // A positional update, as any other, stops the capture by name there.
        stand_in_change_stream_update_stops_the_capture(
            &src,
            base_document(1),
            doc! { "_id": 1, "arr": 2 },
            doc! { "$set": { "arr.$": 20 } },
        )
        .await;
        return;
    }
    every_update_operator("change_stream").await;
}

/// Update events with a positional path in their description (`arr.$`: what a capture that
/// passed a wire-compatible server's update through as written published; MongoDB describes
/// `arr.1`), written into the topics by the test: one that carries its full document is written
/// as that document; one without it stops its collection, recorded with the path and the
/// remedy, and the collection's later events are not written, while another collection's are.
#[tokio::test(flavor = "multi_thread")]
async fn a_positional_update_without_its_document_stops_its_collection_and_the_rest_flows() {
    use prost::Message as _;
    use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
    use rdkafka::producer::{FutureProducer, FutureRecord};
    use sluice_proto::v1::{ChangeEvent, MongoChange, Op, UpdateDescription};
    let db = unique("sluice_m_positional");
    let prefix = unique("mcdc");
    let (meta, group) = (unique("meta"), unique("g"));
    let config = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", kafka_brokers())
        .clone();
    let admin: AdminClient<rdkafka::client::DefaultClientContext> = config.create().unwrap();
    let topic = |coll: &str| format!("{prefix}.{db}.{coll}");
    let (tc, td, te) = (topic("c"), topic("d"), topic("e"));
    for r in admin
        .create_topics(
            &[
                NewTopic::new(&tc, 1, TopicReplication::Fixed(1)),
                NewTopic::new(&td, 1, TopicReplication::Fixed(1)),
                NewTopic::new(&te, 1, TopicReplication::Fixed(1)),
            ],
            &AdminOptions::new(),
        )
        .await
        .unwrap()
    {
        r.unwrap();
    }
    let bson = |d: Document| mongodb::bson::to_vec(&d).unwrap();
    let event = |coll: &str, version: u64, id: i32, m: MongoChange, op: Op| {
        ChangeEvent {
            contract: 1,
            op: op as i32,
            database: db.clone(),
            table: coll.into(),
            version,
            commit_time_micros: sluice_common::clock::now_micros(),
            mongo: Some(MongoChange {
                document_key: bson(doc! { "_id": id }),
                ..m
            }),
            ..Default::default()
        }
        .encode_to_vec()
    };
    let insert = |coll: &str, version: u64, d: Document| {
        let id = d.get_i32("_id").unwrap();
        event(
            coll,
            version,
            id,
            MongoChange {
                full_document: bson(d),
                operation_type: "insert".into(),
                ..Default::default()
            },
            Op::Insert,
        )
    };
    let positional = |coll: &str, version: u64, full: Option<Document>| {
        event(
            coll,
            version,
            1,
            MongoChange {
                operation_type: "update".into(),
                update_description: Some(UpdateDescription {
                    updated_fields: bson(doc! { "arr.$": 20 }),
                    ..Default::default()
                }),
                full_document: full.map(bson).unwrap_or_default(),
                ..Default::default()
            },
            Op::Update,
        )
    };
    let mut app = apply_at(&mongo_target_url(), &meta, &prefix, &group, "");
    let producer: FutureProducer = config.create().unwrap();
    for (t, payload) in [
        (&tc, insert("c", 1, doc! { "_id": 1, "arr": [1, 2, 3] })),
        (&tc, positional("c", 2, None)),
        (&tc, insert("c", 3, doc! { "_id": 3 })),
        (&te, insert("e", 4, doc! { "_id": 1, "arr": [1, 2, 3] })),
        (
            &te,
            positional("e", 5, Some(doc! { "_id": 1, "arr": [1, 20, 3] })),
        ),
        (&td, insert("d", 6, doc! { "_id": 1 })),
    ] {
        producer
            .send(
                FutureRecord::<(), _>::to(t).partition(0).payload(&payload),
                Duration::from_secs(10),
            )
            .await
            .unwrap();
    }
    let dst = client(mongo_target_url()).await;
    let coll = |name: &str| dst.database(&db).collection::<Document>(name);
    let deadline = Instant::now() + Duration::from_secs(60);
    while coll("d").count_documents(doc! {}).await.unwrap() < 1
        || coll("e")
            .find_one(doc! { "_id": 1, "arr": [1, 20, 3] })
            .await
            .unwrap()
            .is_none()
    {
        assert!(
            Instant::now() < deadline,
            "the other collections' changes never arrived"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let stops = dst
        .database(&meta)
        .collection::<Document>("stopped_collections");
    let record = || stops.find_one(doc! { "_id": format!("{db}.c") });
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut stopped = record().await.unwrap();
    while stopped.is_none() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(200)).await;
        stopped = record().await.unwrap();
    }
    let stopped = stopped.expect("collection c is recorded as stopped");
    let reason = stopped.get_str("reason").unwrap_or_default();
    for said in [
        "an update that sets the path \"arr.$\"",
        "copy the collection again",
    ] {
        assert!(reason.contains(said), "{said:?} in {stopped:?}");
    }
    assert!(
        stops
            .find_one(doc! { "_id": format!("{db}.e") })
            .await
            .unwrap()
            .is_none(),
        "e carried its document and is not stopped"
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    let docs: Vec<Document> = coll("c")
        .find(doc! {})
        .await
        .unwrap()
        .map(|d| d.unwrap())
        .collect()
        .await;
    assert_eq!(
        docs,
        vec![doc! { "_id": 1, "arr": [1, 2, 3] }],
        "c: the document before the refused update, nothing after it"
    );
    let (_, log) = app.stop();
    assert!(
        log.contains("collection stopped") && log.contains("arr.$"),
        "{log}"
    );
    dst.database(&db).drop().await.unwrap();
}
