//! `sluice verify` of MongoDB with MongoDB: exact differences reported, nothing reported for
//! changes in flight.

use std::time::Duration;

use mongodb::bson::{doc, Document};
use sluice_tests::mongo::*;
use sluice_tests::{mongo_source_url, mongo_target_url, unique};

/// `sluice verify` of MongoDB → MongoDB on a running pipeline: equal while a writer changes
/// documents (they are read again once the target has caught up); then documents deleted,
/// added and changed in the target (one only in its number type) are reported with exactly
/// those `_id`s and fields.
#[tokio::test(flavor = "multi_thread")]
async fn sluice_verify_reports_exactly_the_documents_the_target_lost_gained_or_changed() {
    let db = unique("sluice_m_verify");
    let (src, dst) = (
        client(mongo_source_url()).await,
        client(mongo_target_url()).await,
    );
    let mut cap = capture(&db, "mode = \"oplog\"", "");
    let group = unique("g");
    let mut app = apply(&cap.prefix, &group, "");
    started(&cap, true).await;
    let source = src.database(&db).collection::<Document>("c");
    let docs: Vec<Document> = (0..3000)
        .map(|k| doc! { "_id": k, "v": k, "n": 1, "sub": { "a": [k, "x"], "b": null } })
        .collect();
    source.insert_many(docs).await.unwrap();
    converge(
        &src,
        &dst,
        &db,
        "c",
        Duration::from_secs(60),
        &mut [&mut cap, &mut app],
    )
    .await;
    let ids = |r: &serde_json::Value, kind: &str| -> Vec<String> {
        r["tables"][0][kind]
            .as_array()
            .unwrap()
            .iter()
            .map(|k| k["key"]["_id"].as_str().unwrap().to_string())
            .collect()
    };

    // Under a writer on _id 0..1500 (each document changed every 7.5 s): equal, the changes
    // in flight read again.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writer = {
        let (source, stop) = (source.clone(), stop.clone());
        tokio::spawn(async move {
            let mut n = 0i32;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let id = (n * 37) % 1500;
                source
                    .update_one(doc! { "_id": id }, doc! { "$set": { "v": -n } })
                    .await
                    .unwrap();
                n += 1;
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            n
        })
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (code, report, err) = sluice_tests::capture::verify(&cap, &app, &["--chunk-rows", "1000"]);
    assert_eq!(code, Some(0), "{report:#}\n{err}");
    assert_eq!(report["tables"][0]["rows"], 3000, "{report:#}");
    assert!(
        report["tables"][0]["chunks_narrowed"].as_u64().unwrap() > 0,
        "no document changed during the check: the test proves nothing: {report:#}"
    );
    assert_eq!(
        report["tables"][0]["source"],
        format!("{db}.c"),
        "{report:#}"
    );
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let updates = writer.await.unwrap();
    assert!(updates > 10, "the writer made {updates} updates");
    converge(
        &src,
        &dst,
        &db,
        "c",
        Duration::from_secs(60),
        &mut [&mut cap, &mut app],
    )
    .await;

    // Broken in the target: one gone, one added, one changed, one an int64 where the source
    // holds an int32.
    let target = dst.database(&db).collection::<Document>("c");
    target.delete_one(doc! { "_id": 7 }).await.unwrap();
    target
        .insert_one(doc! { "_id": 9999, "v": 1 })
        .await
        .unwrap();
    target
        .update_one(doc! { "_id": 200 }, doc! { "$set": { "sub.a": [1] } })
        .await
        .unwrap();
    target
        .replace_one(
            doc! { "_id": 201 },
            doc! { "_id": 201, "v": 201, "n": 1i64, "sub": { "a": [201, "x"], "b": null } },
        )
        .await
        .unwrap();
    let (code, report, err) = sluice_tests::capture::verify(&cap, &app, &["--chunk-rows", "1000"]);
    assert_eq!(code, Some(1), "{report:#}\n{err}");
    assert_eq!(ids(&report, "missing"), ["7"], "{report:#}");
    assert_eq!(ids(&report, "extra"), ["9999"], "{report:#}");
    assert_eq!(ids(&report, "different"), ["200", "201"], "{report:#}");
    let different = &report["tables"][0]["different"];
    assert_eq!(different[0]["columns"][0]["column"], "sub", "{report:#}");
    assert_eq!(
        different[1]["columns"][0],
        serde_json::json!({"column": "n", "source": "{\"$numberInt\":\"1\"}", "target": "{\"$numberLong\":\"1\"}"}),
        "{report:#}"
    );
    stop_all(&mut [&mut cap, &mut app]).await;
    src.database(&db).drop().await.unwrap();
    dst.database(&db).drop().await.unwrap();
}
