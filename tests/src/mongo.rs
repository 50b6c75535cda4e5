//! MongoDB pipelines for the tests: capture-mongo and apply-mongo processes, and the wait for a
//! capture's start.

use std::time::{Duration, Instant};

use mongodb::bson::doc;
use mongodb::Client;

use crate::capture::CaptureProcess;
use crate::{kafka_brokers, mongo_source_url, unique};

/// capture-mongo reading `db` of `uri` (`mongodb` holds the `[mongodb]` keys beyond the URI,
/// `filter` more `[filter]` keys, `publish` more `[publish]` keys); 3 partitions.
pub fn capture(uri: &str, db: &str, mongodb: &str, filter: &str, publish: &str) -> CaptureProcess {
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

/// Every document of collection `coll` of `db`, by `_id` (none when a batch cannot be read).
pub async fn documents(c: &Client, db: &str, coll: &str) -> Vec<mongodb::bson::Document> {
    use futures::TryStreamExt;
    c.database(db)
        .collection::<mongodb::bson::Document>(coll)
        .find(doc! {})
        .sort(doc! { "_id": 1 })
        .await
        .unwrap()
        .try_collect()
        .await
        .unwrap_or_default()
}

/// apply-mongo writing to `uri`, its own records in `meta`; `extra` starts inside
/// `[kafka.properties]`.
pub fn apply(uri: &str, meta: &str, prefix: &str, group: &str, extra: &str) -> CaptureProcess {
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
