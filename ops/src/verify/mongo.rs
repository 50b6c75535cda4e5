//! `sluice verify` for MongoDB → MongoDB: each collection the capture's filter takes against
//! its target namespace, document by document.
//!
//! MongoDB has no hash of a document that every server computes alike (`dbHash` hashes whole
//! collections under a lock; `$toHashedIndexKey` and `$function` are not everywhere), so the
//! documents are read from both servers and compared here, field for field (the order of
//! fields does not count: the target may hold them in another order), in `_id` order, in
//! batches of `--chunk-rows`: first every source document against the target's documents of
//! the same `_id`s, then every target `_id` against the source, for the extra ones.
//!
//! A document that differs may be a change in flight. It is read again in rounds: the source's
//! document, then (once the target has caught up past the source's operation time after that
//! read) the target's, then the source's again. It is reported only when both source reads
//! agree and the target's differs from them: the source held that state from before the first
//! read to after the target was read, and the target had every change up to the first read.
//! A document that changed in every round is reported as unsettled, never as equal.

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use futures::TryStreamExt;
use mongodb::bson::{doc, Bson, Document, RawDocumentBuf, Timestamp};
use serde_json::Value as Json;
use sluice_capture::checkpoint::Checkpoint;

use super::{ColumnDiff, KeyDiff, Options, Pipeline, Report, TableReport};

/// The configurations read: capture-mongo's (source, filter, Kafka, connector) and
/// apply-mongo's (target, namespaces, group).
pub struct Setup {
    pub capture: sluice_capture::mongo::Config,
    pub apply: sluice_apply::mongo::Config,
}

/// A document for comparing: canonical extended JSON, whose objects are ordered by key.
fn canonical(d: &RawDocumentBuf) -> Result<Json, String> {
    let d = d
        .to_document()
        .map_err(|e| format!("a document that is not valid BSON: {e}"))?;
    Ok(Bson::Document(d).into_canonical_extjson())
}

fn relaxed(b: &Bson) -> String {
    b.clone().into_relaxed_extjson().to_string()
}

/// The state of one `_id` on one side: its canonical document, or absent.
type State = Option<Json>;

/// How one `_id` compares in a round.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Judged {
    Equal,
    Missing,
    Extra,
    Different,
    /// The source changed between its two reads: read again.
    Changed,
}

/// Judge one `_id` from the source's read before the target caught up (`before`), the target's
/// read after, and the source's read after that (`after`).
pub fn judge(before: &State, target: &State, after: &State) -> Judged {
    if before != after {
        return Judged::Changed;
    }
    match (before, target) {
        (a, b) if a == b => Judged::Equal,
        (Some(_), None) => Judged::Missing,
        (None, Some(_)) => Judged::Extra,
        _ => Judged::Different,
    }
}

struct Side {
    client: mongodb::Client,
}

impl Side {
    async fn open(uri: &str, what: &str) -> Result<Self, String> {
        let client = mongodb::Client::with_uri_str(uri).await.map_err(|e| {
            sluice_common::mongo::scrubbed(
                uri,
                format!(
                    "the {what} ({}): {e}",
                    sluice_common::secret::redact_uri(uri)
                ),
            )
        })?;
        Ok(Self { client })
    }

    fn coll(&self, db: &str, coll: &str) -> mongodb::Collection<RawDocumentBuf> {
        self.client.database(db).collection(coll)
    }

    /// The documents of these `_id`s, by their canonical `_id`.
    async fn by_ids(
        &self,
        db: &str,
        coll: &str,
        ids: &[Bson],
        only_id: bool,
    ) -> Result<HashMap<String, Json>, String> {
        let mut out = HashMap::new();
        for part in ids.chunks(1000) {
            let c = self.coll(db, coll);
            let mut find = c.find(doc! { "_id": { "$in": part.to_vec() } });
            if only_id {
                find = find.projection(doc! { "_id": 1 });
            }
            let mut cursor = find.await.map_err(|e| format!("{db}.{coll}: {e}"))?;
            while let Some(d) = cursor
                .try_next()
                .await
                .map_err(|e| format!("{db}.{coll}: {e}"))?
            {
                out.insert(key(&id_of(&d)), canonical(&d)?);
            }
        }
        Ok(out)
    }

    /// The server's operation time now: a reply's `operationTime` (replica sets), else the
    /// newest oplog entry, as capture-mongo reads it.
    async fn operation_time(&self) -> Result<Timestamp, String> {
        let reply = self
            .client
            .database("admin")
            .run_command(doc! { "ping": 1 })
            .await
            .map_err(|e| format!("the source: {e}"))?;
        if let Ok(ts) = reply.get_timestamp("operationTime") {
            return Ok(ts);
        }
        let last = self
            .client
            .database("local")
            .collection::<Document>("oplog.rs")
            .find_one(doc! {})
            .sort(doc! { "$natural": -1 })
            .await
            .ok()
            .flatten();
        last.and_then(|d| d.get_timestamp("ts").ok())
            .ok_or_else(|| {
                "the source reports no operation time and has no oplog: verify needs a replica set"
                    .to_string()
            })
    }
}

/// A document's `_id` (null for a document without one, which MongoDB does not store).
fn id_of(d: &RawDocumentBuf) -> Bson {
    d.get("_id")
        .ok()
        .flatten()
        .and_then(|v| Bson::try_from(v.to_raw_bson()).ok())
        .unwrap_or(Bson::Null)
}

/// An `_id` as text (canonical extended JSON): the key of the maps.
fn key(id: &Bson) -> String {
    id.clone().into_canonical_extjson().to_string()
}

/// Run the comparison.
pub async fn run(setup: &Setup, options: &Options) -> Result<Report, String> {
    let started = Instant::now();
    let filter = sluice_capture::filter::Filter::new(
        &setup.capture.filter,
        sluice_capture::mongo::SYSTEM_DATABASES,
    )
    .map_err(|(k, e)| format!("{k}: {e}"))?;
    let source = Side::open(setup.capture.mongodb.uri.expose(), "source").await?;
    let target = Side::open(setup.apply.mongodb.uri.expose(), "target").await?;
    let pipeline = std::sync::Arc::new(Pipeline::new(
        &setup.capture,
        &setup.apply.kafka,
        &setup.apply.consumer.group_id,
    )?);
    let mut names = Vec::new();
    let dbs = source
        .client
        .list_database_names()
        .await
        .map_err(|e| format!("listing the source's databases: {e}"))?;
    for db in dbs {
        if !filter.wants_database(&db) {
            continue;
        }
        let colls = source
            .client
            .database(&db)
            .list_collection_names()
            .await
            .map_err(|e| format!("listing the collections of {db}: {e}"))?;
        for c in colls {
            if !c.starts_with("system.") && filter.wants(&db, &c) {
                names.push((db.clone(), c));
            }
        }
    }
    names.sort();
    super::only_wanted(&mut names, &options.tables, "collection")?;
    // Collections the apply stage stopped, by namespace, with the reason.
    let mut stopped: HashMap<String, String> = HashMap::new();
    if let Ok(mut c) = target
        .client
        .database(&setup.apply.mongodb.meta_database)
        .collection::<Document>("stopped_collections")
        .find(doc! {})
        .await
    {
        while let Ok(Some(d)) = c.try_next().await {
            if let Ok(ns) = d.get_str("_id") {
                let reason = d.get_str("reason").unwrap_or("").to_string();
                stopped.insert(ns.to_string(), reason);
            }
        }
    }
    let mut reports = Vec::new();
    for (db, coll) in names {
        let (tdb, tcoll) = setup.apply.target(&db, &coll);
        let mut report = TableReport::new(format!("{db}.{coll}"), format!("{tdb}.{tcoll}"));
        let t0 = Instant::now();
        let stop = stopped
            .get(&format!("{tdb}.{tcoll}"))
            .or_else(|| stopped.get(&format!("{db}.{coll}")));
        let outcome = match stop {
            Some(reason) => Err(format!("the apply stage stopped this collection: {reason}")),
            None => {
                compare(
                    &source,
                    &target,
                    &pipeline,
                    options,
                    &db,
                    &coll,
                    &tdb,
                    &tcoll,
                    &mut report,
                )
                .await
            }
        };
        report.conclude(outcome);
        report.seconds = t0.elapsed().as_secs_f64();
        if options.progress {
            eprintln!("{}", super::summary_line(&report));
        }
        reports.push(report);
    }
    Ok(Report::of(reports, started))
}

#[allow(clippy::too_many_arguments)]
async fn compare(
    source: &Side,
    target: &Side,
    pipeline: &std::sync::Arc<Pipeline>,
    options: &Options,
    db: &str,
    coll: &str,
    tdb: &str,
    tcoll: &str,
    report: &mut TableReport,
) -> Result<(), String> {
    let batch = options.chunk_rows.clamp(1, 100_000) as usize;
    // Candidates: `_id` -> the value, for reading again.
    let mut open: BTreeMap<String, Bson> = BTreeMap::new();
    let mut last_progress = Instant::now();
    // Every source document against the target's of the same `_id`s.
    let mut cursor = source
        .coll(db, coll)
        .find(doc! {})
        .sort(doc! { "_id": 1 })
        .batch_size(batch as u32)
        .await
        .map_err(|e| format!("{db}.{coll}: {e}"))?;
    let mut docs: Vec<(Bson, Json)> = Vec::with_capacity(batch);
    loop {
        let next = cursor
            .try_next()
            .await
            .map_err(|e| format!("{db}.{coll}: {e}"))?;
        if let Some(d) = &next {
            docs.push((id_of(d), canonical(d)?));
        }
        if docs.len() == batch || (next.is_none() && !docs.is_empty()) {
            let ids: Vec<Bson> = docs.iter().map(|(i, _)| i.clone()).collect();
            let theirs = target.by_ids(tdb, tcoll, &ids, false).await?;
            report.rows += docs.len() as u64;
            report.chunks += 1;
            let before = open.len();
            for (id, d) in docs.drain(..) {
                if theirs.get(&key(&id)) != Some(&d) {
                    open.insert(key(&id), id);
                }
            }
            if open.len() > before {
                report.chunks_narrowed += 1;
            }
        }
        if options.progress && last_progress.elapsed() > Duration::from_secs(5) {
            last_progress = Instant::now();
            eprintln!(
                "verify: {db}.{coll}: {} documents, {} to read again",
                report.rows,
                open.len()
            );
        }
        if next.is_none() {
            break;
        }
    }
    // Every target `_id` against the source: the extra ones.
    let mut cursor = target
        .coll(tdb, tcoll)
        .find(doc! {})
        .projection(doc! { "_id": 1 })
        .sort(doc! { "_id": 1 })
        .batch_size(batch as u32)
        .await
        .map_err(|e| format!("{tdb}.{tcoll}: {e}"))?;
    let mut ids: Vec<Bson> = Vec::with_capacity(batch);
    loop {
        let next = cursor
            .try_next()
            .await
            .map_err(|e| format!("{tdb}.{tcoll}: {e}"))?;
        if let Some(d) = &next {
            ids.push(id_of(d));
        }
        if ids.len() == batch || (next.is_none() && !ids.is_empty()) {
            let mine = source.by_ids(db, coll, &ids, true).await?;
            for id in ids.drain(..) {
                if !mine.contains_key(&key(&id)) {
                    open.insert(key(&id), id);
                }
            }
        }
        if next.is_none() {
            break;
        }
    }
    // Rounds: source, catch-up, target, source again.
    for round in 0..options.rounds.max(1) {
        if open.is_empty() {
            break;
        }
        let ids: Vec<Bson> = open.values().cloned().collect();
        let before = source.by_ids(db, coll, &ids, false).await?;
        let ts = source.operation_time().await?;
        let pl = pipeline.clone();
        let (d, c, limit) = (db.to_string(), coll.to_string(), options.wait);
        tokio::task::spawn_blocking(move || {
            pl.wait_for(
                &|cp| match cp {
                    Checkpoint::Mongo(c) => (c.ts >= (ts.time, ts.increment), cp.position()),
                    other => (false, other.position()),
                },
                &format!("{}.{}", ts.time, ts.increment),
                &d,
                &c,
                limit,
            )
        })
        .await
        .map_err(|e| e.to_string())??;
        let theirs = target.by_ids(tdb, tcoll, &ids, false).await?;
        let after = source.by_ids(db, coll, &ids, false).await?;
        let mut next = BTreeMap::new();
        for (k, id) in std::mem::take(&mut open) {
            let (b, t, a) = (
                before.get(&k).cloned(),
                theirs.get(&k).cloned(),
                after.get(&k).cloned(),
            );
            let diff = |s: &State, t: &State| key_diff(&id, s, t);
            match judge(&b, &t, &a) {
                Judged::Equal => {}
                Judged::Changed => {
                    next.insert(k, id);
                }
                Judged::Missing => report.missing.push(diff(&b, &t)),
                Judged::Extra => report.extra.push(diff(&b, &t)),
                Judged::Different => report.different.push(diff(&b, &t)),
            }
        }
        open = next;
        if options.progress && !open.is_empty() {
            eprintln!(
                "verify: {db}.{coll}: round {}: {} documents changed while compared, read again",
                round + 1,
                open.len()
            );
        }
    }
    for id in open.values() {
        report.unsettled.push(KeyDiff {
            key: BTreeMap::from([("_id".to_string(), relaxed(id))]),
            columns: Vec::new(),
        });
    }
    Ok(())
}

/// A found `_id` with its fields: every field of a missing or extra document, the fields that
/// differ of a different one (as relaxed extended JSON).
fn key_diff(id: &Bson, source: &State, target: &State) -> KeyDiff {
    let fields = |s: &State| -> BTreeMap<String, Json> {
        s.as_ref()
            .and_then(Json::as_object)
            .map(|o| o.iter().map(|(k, v)| (k.clone(), v.clone())).collect())
            .unwrap_or_default()
    };
    let (s, t) = (fields(source), fields(target));
    let mut names: Vec<&String> = s.keys().chain(t.keys()).collect();
    names.sort();
    names.dedup();
    // Relaxed extended JSON, unless it reads the same on both sides (an int32 and an int64 of
    // one value): then canonical, which tells them apart.
    let relaxed_of = |v: Option<&Json>| {
        v.map(|v| {
            Bson::try_from(v.clone())
                .map(|b| b.into_relaxed_extjson().to_string())
                .unwrap_or_else(|_| v.to_string())
        })
    };
    let columns = names
        .into_iter()
        .filter(|n| *n != "_id" && s.get(*n) != t.get(*n))
        .map(|n| {
            let (mut a, mut b) = (relaxed_of(s.get(n)), relaxed_of(t.get(n)));
            if a == b {
                (a, b) = (s.get(n).map(Json::to_string), t.get(n).map(Json::to_string));
            }
            ColumnDiff {
                column: n.clone(),
                source: source.as_ref().map(|_| a.unwrap_or("(absent)".into())),
                target: target.as_ref().map(|_| b.unwrap_or("(absent)".into())),
            }
        })
        .collect();
    KeyDiff {
        key: BTreeMap::from([("_id".to_string(), relaxed(id))]),
        columns,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_document_differs_only_when_the_source_held_still_around_the_targets_read() {
        let a = Some(serde_json::json!({"_id": 1, "v": 1}));
        let b = Some(serde_json::json!({"_id": 1, "v": 2}));
        assert_eq!(judge(&a, &a, &a), Judged::Equal);
        assert_eq!(judge(&None, &None, &None), Judged::Equal);
        assert_eq!(judge(&a, &b, &a), Judged::Different);
        assert_eq!(judge(&a, &None, &a), Judged::Missing);
        assert_eq!(judge(&None, &a, &None), Judged::Extra);
        // The source moved between its reads: in flight, whatever the target holds.
        assert_eq!(judge(&a, &b, &b), Judged::Changed);
        assert_eq!(judge(&a, &a, &b), Judged::Changed);
        assert_eq!(judge(&None, &a, &a), Judged::Changed);
    }

    #[test]
    fn field_order_does_not_count_and_values_shown_are_relaxed_json() {
        let x = RawDocumentBuf::from_document(&doc! { "_id": 1, "a": 1, "b": "x" }).unwrap();
        let y = RawDocumentBuf::from_document(&doc! { "b": "x", "_id": 1, "a": 1 }).unwrap();
        assert_eq!(canonical(&x).unwrap(), canonical(&y).unwrap());
        let z = RawDocumentBuf::from_document(&doc! { "_id": 1, "a": 1i64, "b": "x" }).unwrap();
        assert_ne!(
            canonical(&x).unwrap(),
            canonical(&z).unwrap(),
            "int32 vs int64"
        );
        let d = key_diff(
            &Bson::Int32(1),
            &Some(canonical(&x).unwrap()),
            &Some(canonical(&z).unwrap()),
        );
        assert_eq!(d.key["_id"], "1");
        assert_eq!(d.columns.len(), 1);
        assert_eq!(d.columns[0].column, "a");
        // Equal as relaxed JSON: shown canonical, which tells an int32 from an int64.
        assert_eq!(
            d.columns[0].source.as_deref(),
            Some(r#"{"$numberInt":"1"}"#)
        );
        assert_eq!(
            d.columns[0].target.as_deref(),
            Some(r#"{"$numberLong":"1"}"#)
        );
    }
}
