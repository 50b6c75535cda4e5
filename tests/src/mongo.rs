//! MongoDB pipelines for the tests: the servers' clients, capture-mongo and apply-mongo
//! processes, the wait for a capture's start, and a target compared with its source.

use std::time::{Duration, Instant};

use futures::StreamExt;
use mongodb::bson::raw::RawDocumentBuf;
use mongodb::bson::{doc, Bson, Document};
use mongodb::Client;

use crate::capture::CaptureProcess;
use crate::{kafka_brokers, mongo_source_url, mongo_target_url, unique};

/// capture-mongo reading `db` of `uri` (`mongodb` holds the `[mongodb]` keys beyond the URI,
/// `filter` more `[filter]` keys, `publish` more `[publish]` keys); 3 partitions.
pub fn capture_with(
    uri: &str,
    db: &str,
    mongodb: &str,
    filter: &str,
    publish: &str,
) -> CaptureProcess {
    CaptureProcess::spawn_binary(
        "capture-mongo",
        capture_config(uri, db, mongodb, filter, publish),
    )
}

/// The config of [`capture`], with its connector name and topic prefix, for a capture started
/// later (or several of one connector) by `CaptureProcess::spawn_binary("capture-mongo", ..)`;
/// sections may be appended to its text.
pub fn capture_config(
    uri: &str,
    db: &str,
    mongodb: &str,
    filter: &str,
    publish: &str,
) -> (String, String, String) {
    let connector = unique("mconn");
    let prefix = unique("mcdc");
    let text = format!(
        "connector = \"{connector}\"\n\
         [mongodb]\nuri = \"{}\"\nmax_await_ms = 200\n{mongodb}\n\
         [filter]\ninclude = [\"{db}\\\\..*\"]\n{filter}\n\
         [topics]\nprefix = \"{prefix}\"\n\
         [publish]\npartitions = 3\nreplication_factor = 1\ncheckpoint_interval_ms = 100\n{publish}\n\
         [kafka]\nbrokers = \"{}\"\n",
        uri,
        kafka_brokers()
    );
    (text, connector, prefix)
}

/// apply-mongo writing to `uri`, its own records in `meta`; `extra` starts inside
/// `[kafka.properties]`.
pub fn apply_at(uri: &str, meta: &str, prefix: &str, group: &str, extra: &str) -> CaptureProcess {
    let text = format!(
        "[mongodb]\nuri = \"{}\"\nmeta_database = \"{}\"\n\
         [consumer]\ngroup_id = \"{group}\"\ntopics = [\"^{}\\\\..*\"]\n\
         [batch]\nmax_wait_ms = 200\n\
         [kafka]\nbrokers = \"{}\"\n\
         [kafka.properties]\n\"session.timeout.ms\" = \"6000\"\n\"heartbeat.interval.ms\" = \"1000\"\n\
         {extra}\n",
        uri,
        meta,
        prefix.replace('.', "\\\\."),
        kafka_brokers()
    );
    CaptureProcess::spawn_binary("apply-mongo", (text, String::new(), String::new()))
}

/// Wait until a capture reading from "now" has fixed its start: in oplog mode it stores that
/// position as its first checkpoint; change streams get a few seconds to open.
///
/// On an empty oplog (a fresh server) "now" is a time, not an entry, and the capture stores
/// its position at the first entry it reads: a write elsewhere every second gives it one.
pub async fn started(cap: &CaptureProcess, oplog: bool) {
    if !oplog {
        tokio::time::sleep(Duration::from_secs(3)).await;
        return;
    }
    let source = Client::with_uri_str(mongo_source_url()).await.unwrap();
    let elsewhere = source
        .database(&unique("sluice_t_warm"))
        .collection::<mongodb::bson::Document>("c");
    let mut wrote = Instant::now() - Duration::from_secs(1);
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if wrote.elapsed() >= Duration::from_secs(1) {
            elsewhere.insert_one(doc! { "at": 1 }).await.unwrap();
            wrote = Instant::now();
        }
        let c = cap.connector.clone();
        let stored = tokio::task::spawn_blocking(move || crate::capture::last_checkpoint(&c))
            .await
            .unwrap();
        if stored.is_some() {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the capture stored no start position in 60 s"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

pub async fn client(url: String) -> Client {
    Client::with_uri_str(&url)
        .await
        .expect("MongoDB connection string")
}

/// capture-mongo reading `db` (`mongodb` holds the `[mongodb]` keys beyond the URI, `filter`
/// more `[filter]` keys).
pub fn capture(db: &str, mongodb: &str, filter: &str) -> CaptureProcess {
    capture_at(&mongo_source_url(), db, mongodb, filter)
}

/// [`capture`] reading the source at `uri`.
pub fn capture_at(uri: &str, db: &str, mongodb: &str, filter: &str) -> CaptureProcess {
    capture_with(uri, db, mongodb, filter, "")
}

/// apply-mongo reading the topics of `prefix` into the target server.
pub fn apply(prefix: &str, group: &str, extra: &str) -> CaptureProcess {
    apply_at(&mongo_target_url(), &unique("meta"), prefix, group, extra)
}

/// Every document of a collection, raw, in `_id` order (the server's own order of BSON values).
pub async fn documents(c: &Client, db: &str, coll: &str) -> Vec<RawDocumentBuf> {
    c.database(db)
        .collection::<RawDocumentBuf>(coll)
        .find(doc! {})
        .sort(doc! { "_id": 1 })
        .await
        .unwrap()
        .map(|d| d.unwrap())
        .collect()
        .await
}

/// Field for field: canonical extended JSON (so NaN equals NaN; field order does not count).
pub fn decoded(docs: &[RawDocumentBuf]) -> Vec<serde_json::Value> {
    docs.iter()
        .map(|d| Bson::Document(d.to_document().unwrap()).into_canonical_extjson())
        .collect()
}

/// Wait until the target collection equals the source one (field for field), or panic with
/// both after `limit`.
pub async fn converge(
    src: &Client,
    dst: &Client,
    db: &str,
    coll: &str,
    limit: Duration,
    procs: &mut [&mut CaptureProcess],
) {
    let deadline = Instant::now() + limit;
    loop {
        let (a, b) = (
            documents(src, db, coll).await,
            documents(dst, db, coll).await,
        );
        if decoded(&a) == decoded(&b) {
            return;
        }
        if Instant::now() > deadline {
            let logs: Vec<String> = procs.iter_mut().map(|p| p.stop().1).collect();
            let (a, b) = (decoded(&a), decoded(&b));
            let ids = |d: &[serde_json::Value]| -> Vec<String> {
                d.iter().map(|d| d["_id"].to_string()).collect()
            };
            let (ia, ib) = (ids(&a), ids(&b));
            let missing: Vec<_> = ia.iter().filter(|i| !ib.contains(i)).take(10).collect();
            let extra: Vec<_> = ib.iter().filter(|i| !ia.contains(i)).take(10).collect();
            let differ: Vec<_> = a
                .iter()
                .filter(|d| b.iter().any(|e| e["_id"] == d["_id"] && e != *d))
                .take(3)
                .collect();
            panic!(
                "{db}.{coll}: target differs after {limit:?}: source {} documents, target {}; \
                 missing _id {missing:?}, extra _id {extra:?}, differing (source side) \
                 {differ:?}\nlogs:\n{}",
                a.len(),
                b.len(),
                logs.join("\n----\n")
            );
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

/// Stop every stage; each must exit 0.
pub async fn stop_all(procs: &mut [&mut CaptureProcess]) {
    for p in procs.iter_mut() {
        let (code, log) = p.stop();
        assert_eq!(code, Some(0), "a stage failed:\n{log}");
    }
}

/// A unique index on `email` the source lacks: the target refuses a second document with the
/// same address.
pub async fn unique_email_index(target: &mongodb::Collection<Document>) {
    target
        .create_index(
            mongodb::IndexModel::builder()
                .keys(doc! { "email": 1 })
                .options(
                    mongodb::options::IndexOptions::builder()
                        .unique(true)
                        .build(),
                )
                .build(),
        )
        .await
        .unwrap();
}
