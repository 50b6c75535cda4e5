//! Collection copies (snapshots): every document of the collections a snapshot takes, as
//! `SNAPSHOT_READ` events at one oplog time, before the stream goes on from that time.
//!
//! The order that makes it exact: the source's operation time T0 is read first and becomes the
//! position, stored (committed) with the snapshot's progress before the first document is
//! published; each collection's options and indexes are published as `create` / `createIndexes`
//! DDL events (`snapshot.copy_indexes`), then its documents in `_id` order; then the stream
//! starts after T0, so every change made during the copy is replayed over the copied documents,
//! which converge. Every `chunk_rows` documents the checkpoint stores the collection's last
//! `_id` ([`crate::snapshot::TableProgress::after`], hex of `{v: _id}`): a capture stopped in
//! the middle goes on with `{_id: {$gt: last}}`, and a finished snapshot's id is kept in
//! `snapshots_done` so it is never taken again.
//!
//! A transient failure during a copy (a fail-over, a lost cursor) is retried by the run loop:
//! the copy goes on after the last document it published (the cursor's failure records it), so
//! no document is published twice; only a failure before a collection's first document
//! publishes its `create` / `createIndexes` events again, at the same version. The snapshot's
//! position stays T0 and finished collections are not copied again.

use futures::StreamExt;
use mongodb::bson::raw::RawDocumentBuf;
use mongodb::bson::{doc, Bson, Document, Timestamp};
use mongodb::options::FindOneOptions;
use sluice_common::hex;
use sluice_common::Shutdown;

use super::checkpoint::Resume;
use super::Capture;
use crate::error::{CaptureError, Origin};
use crate::mongo::change::{Change, OpKind};
use crate::mongo::Mode;
use crate::snapshot::{SnapshotProgress, TableProgress};

impl Capture {
    /// Take the snapshots that are due, one after the other, before streaming: an unfinished
    /// one from the checkpoint, the initial one, a re-snapshot request not yet served. The
    /// stream then starts from where it stood before the copy (for the initial snapshot: the
    /// source's operation time read before the first document), so every change made during
    /// the copy is replayed over the copied documents, which converge.
    pub(super) async fn snapshots(&mut self, shutdown: &Shutdown) -> Result<(), CaptureError> {
        use crate::snapshot::INITIAL;
        loop {
            if self.snapshot.is_none() {
                let c = &self.config.snapshot;
                let (id, only) = if c.initial() && !self.snapshots_done.iter().any(|d| d == INITIAL)
                {
                    (INITIAL.to_string(), Vec::new())
                } else if !c.request_id.is_empty() && !self.snapshots_done.contains(&c.request_id) {
                    (c.request_id.clone(), c.tables.clone())
                } else {
                    return Ok(());
                };
                let mut tables = std::collections::BTreeMap::new();
                for name in self.list_collections(&only).await? {
                    tables.insert(name, TableProgress::default());
                }
                self.snapshot = Some(SnapshotProgress { id, tables });
            }
            self.snapshot_start_point().await?;
            // The snapshot's position T0 and its progress are committed before its first
            // document is published: a capture killed during the copy goes on from them. One
            // that found copies on the topic but no stored T0 would start over at a later time,
            // and the deletes made in between would never reach the target.
            self.store().await?;
            let snap = self.snapshot.clone().expect("set above");
            tracing::info!(snapshot = %snap.id, collections = snap.tables.len(), "snapshot starts");
            for (name, progress) in &snap.tables {
                if progress.done {
                    continue;
                }
                if !self.copy_collection(name, shutdown).await? {
                    return Ok(()); // stopping
                }
            }
            tracing::info!(snapshot = %snap.id, "snapshot finished");
            self.snapshots_done.push(snap.id);
            self.snapshot = None;
            self.snapshot_metrics.tables_remaining.set(0);
            self.mark().await?;
        }
    }

    /// `database.collection` of every collection the snapshot takes (views and system
    /// collections left out), or of the listed ones that exist.
    async fn list_collections(&self, only: &[String]) -> Result<Vec<String>, CaptureError> {
        let mut out = Vec::new();
        for db in self.client.list_database_names().await? {
            if !self.filter.wants_database(&db) {
                continue;
            }
            let specs: Vec<Document> = self
                .client
                .database(&db)
                .run_command(doc! { "listCollections": 1, "nameOnly": false })
                .await
                .map(|r| {
                    r.get_document("cursor")
                        .and_then(|c| c.get_array("firstBatch"))
                        .map(|a| a.iter().filter_map(|b| b.as_document().cloned()).collect())
                        .unwrap_or_default()
                })?;
            for spec in specs {
                let Ok(coll) = spec.get_str("name") else {
                    continue;
                };
                let kind = spec.get_str("type").unwrap_or("collection");
                if kind != "collection" || coll.starts_with("system.") {
                    continue;
                }
                let name = format!("{db}.{coll}");
                if !self.filter.wants(&db, coll) {
                    continue;
                }
                if !only.is_empty() && !only.contains(&name) {
                    continue;
                }
                out.push(name);
            }
        }
        out.sort();
        Ok(out)
    }

    /// The point the stream starts from after the copy, set once per snapshot: without a
    /// position yet, the source's operation time now.
    async fn snapshot_start_point(&mut self) -> Result<(), CaptureError> {
        if self.last_ts.is_some() {
            return Ok(());
        }
        let ts = match &self.resume {
            Resume::Token(t, ts) => {
                self.last_token = Some(t.clone());
                *ts
            }
            Resume::After(ts) => *ts,
            // "At" is inclusive: stand just before it.
            Resume::At(ts) => just_before(*ts),
            Resume::Now => {
                let ts = self.operation_time().await?;
                self.resume = Resume::After(ts);
                ts
            }
        };
        self.last_ts = Some(ts);
        self.metrics.oplog_time.set(i64::from(ts.time));
        Ok(())
    }

    /// The source's operation time now: the newest oplog entry (oplog mode, or a server without
    /// `operationTime`), else the `operationTime` of a command's reply.
    async fn operation_time(&self) -> Result<Timestamp, CaptureError> {
        let from_oplog = || async {
            let last = self
                .client
                .database("local")
                .collection::<RawDocumentBuf>("oplog.rs")
                .find_one(doc! {})
                .with_options(
                    FindOneOptions::builder()
                        .sort(doc! { "$natural": -1 })
                        .build(),
                )
                .await
                .ok()
                .flatten();
            last.and_then(|d| d.get_timestamp("ts").ok())
        };
        if self.config.mongodb.mode == Mode::Oplog {
            if let Some(ts) = from_oplog().await {
                return Ok(ts);
            }
        }
        let reply = self
            .client
            .database("admin")
            .run_command(doc! { "ping": 1 })
            .await?;
        if let Ok(ts) = reply.get_timestamp("operationTime") {
            return Ok(ts);
        }
        if let Some(ts) = from_oplog().await {
            return Ok(ts);
        }
        Err(CaptureError::source(
            "the source reports no operation time (operationTime) and has no oplog: a snapshot \
             needs a replica set to know where to stream from",
        ))
    }

    /// Copy one collection: its options and indexes (as create / createIndexes DDL), then its
    /// documents in `_id` order as snapshot reads. Returns false when stopped midway.
    async fn copy_collection(
        &mut self,
        name: &str,
        shutdown: &Shutdown,
    ) -> Result<bool, CaptureError> {
        let (db, coll) = name.split_once('.').expect("listed as db.coll");
        let (db, coll) = (db.to_string(), coll.to_string());
        let ts = self.last_ts.expect("set before the copy");
        let progress = self.snapshot.as_ref().expect("running").tables[name].clone();
        let started = std::time::Instant::now();
        let estimate = self
            .client
            .database(&db)
            .collection::<RawDocumentBuf>(&coll)
            .estimated_document_count()
            .await
            .unwrap_or(0);
        self.snapshot_metrics
            .estimated
            .with_label_values(&[&db, &coll])
            .set(estimate as i64);
        let remaining = self
            .snapshot
            .as_ref()
            .map(|s| s.tables.values().filter(|c| !c.done).count())
            .unwrap_or(0);
        self.snapshot_metrics.tables_remaining.set(remaining as i64);
        if progress.after.is_empty() && self.config.snapshot.copy_indexes {
            self.publish_collection_ddl(&db, &coll, ts).await?;
        }
        let mut filter = doc! {};
        if !progress.after.is_empty() {
            let bytes = hex::decode(&progress.after).map_err(CaptureError::source)?;
            let wrapped = Document::from_reader(bytes.as_slice())
                .map_err(|e| CaptureError::source(format!("snapshot position of {name}: {e}")))?;
            let id = wrapped.get("v").cloned().unwrap_or(Bson::Null);
            filter = doc! { "_id": { "$gt": id } };
        }
        let batch = self.config.snapshot.chunk_rows.min(u64::from(u32::MAX)) as u32;
        let mut cursor = self
            .client
            .database(&db)
            .collection::<RawDocumentBuf>(&coll)
            .find(filter)
            .sort(doc! { "_id": 1 })
            .batch_size(batch)
            .await?;
        let rows = self.snapshot_metrics.rows.with_label_values(&[&db, &coll]);
        let mut docs = progress.rows;
        let mut last_log = std::time::Instant::now();
        let mut since = 0u64;
        // `{v: _id}` of the last document published.
        let mut last: Option<RawDocumentBuf> = None;
        while let Some(doc) = cursor.next().await {
            let doc = match doc {
                Ok(doc) => doc,
                Err(e) => {
                    // The cursor is lost (a fail-over, say): a retry goes on after the last
                    // document published.
                    if let Some(last) = &last {
                        self.copied_up_to(name, last, docs);
                    }
                    return Err(e.into());
                }
            };
            let id = doc
                .get("_id")
                .map_err(|e| CaptureError::definite(Origin::Decode, format!("{name}: {e}")))?
                .ok_or_else(|| {
                    CaptureError::definite(
                        Origin::Decode,
                        format!("{name}: a document without _id"),
                    )
                })?;
            let mut key = RawDocumentBuf::new();
            key.append_ref("_id", id);
            let mut wrapped = RawDocumentBuf::new();
            wrapped.append_ref("v", id);
            let mut c = Change::new(OpKind::SnapshotRead, "snapshot", &db, &coll, ts);
            c.document_key = Some(key);
            c.full_document = Some(doc);
            self.publish(c, None).await?;
            rows.inc();
            docs += 1;
            since += 1;
            if since >= u64::from(batch) || last_log.elapsed().as_secs() >= 5 {
                self.copied_up_to(name, &wrapped, docs);
                since = 0;
                self.mark().await?;
                if last_log.elapsed().as_secs() >= 5 {
                    last_log = std::time::Instant::now();
                    let rate = (docs - progress.rows) as f64 / started.elapsed().as_secs_f64();
                    tracing::info!(
                        collection = %name,
                        docs,
                        estimated = estimate,
                        docs_per_second = rate as u64,
                        eta = %format!("{:.0}s", estimate.saturating_sub(docs) as f64 / rate.max(1.0)),
                        "snapshot progress"
                    );
                }
                if shutdown.is_triggered() {
                    return Ok(false);
                }
            }
            last = Some(wrapped);
        }
        let p = self
            .snapshot
            .as_mut()
            .and_then(|s| s.tables.get_mut(name))
            .expect("running");
        p.rows = docs;
        p.done = true;
        self.mark().await?;
        tracing::info!(collection = %name, docs, seconds = started.elapsed().as_secs_f64(), "collection copied");
        Ok(true)
    }

    /// Where the copy of `name` stands: `docs` documents published, the last one's `{v: _id}`
    /// `wrapped` (checkpointed with the next mark).
    fn copied_up_to(&mut self, name: &str, wrapped: &RawDocumentBuf, docs: u64) {
        let p = self
            .snapshot
            .as_mut()
            .and_then(|s| s.tables.get_mut(name))
            .expect("running");
        p.after = hex::encode(wrapped.as_bytes());
        p.rows = docs;
    }

    /// The collection's options (`create`) and secondary indexes (`createIndexes`) as DDL
    /// events at the snapshot's position.
    async fn publish_collection_ddl(
        &mut self,
        db: &str,
        coll: &str,
        ts: Timestamp,
    ) -> Result<(), CaptureError> {
        let database = self.client.database(db);
        let listed = database
            .run_command(doc! { "listCollections": 1, "filter": { "name": coll } })
            .await?;
        let options = listed
            .get_document("cursor")
            .ok()
            .and_then(|c| c.get_array("firstBatch").ok())
            .and_then(|a| a.first())
            .and_then(|b| b.as_document())
            .and_then(|d| d.get_document("options").ok())
            .cloned()
            .unwrap_or_default();
        let mut create = doc! { "create": coll };
        for (k, v) in options {
            create.insert(k, v);
        }
        self.publish(Change::ddl("create", "create", db, coll, ts, create), None)
            .await?;
        // A collection dropped since it was listed has no indexes to copy (NamespaceNotFound);
        // any other failure is the copy's (a transient one retries it), never an index set
        // silently left out.
        let listed = match database.run_command(doc! { "listIndexes": coll }).await {
            Ok(r) => Some(r),
            Err(e) if matches!(&*e.kind, mongodb::error::ErrorKind::Command(c) if c.code == 26) => {
                None
            }
            Err(e) => return Err(e.into()),
        };
        // At most 64 indexes a collection: the first batch (101) holds them all.
        let indexes = listed
            .and_then(|r| {
                r.get_document("cursor")
                    .ok()
                    .and_then(|c| c.get_array("firstBatch").ok())
                    .cloned()
            })
            .unwrap_or_default();
        let indexes: Vec<Bson> = indexes
            .into_iter()
            .filter(|i| {
                i.as_document()
                    .and_then(|d| d.get_str("name").ok())
                    .is_some_and(|n| n != "_id_")
            })
            .collect();
        if !indexes.is_empty() {
            let command = doc! { "createIndexes": coll, "indexes": indexes };
            self.publish(
                Change::ddl("create_indexes", "createIndexes", db, coll, ts, command),
                None,
            )
            .await?;
        }
        Ok(())
    }
}

/// The oplog time just before `ts`: a position after which reading takes `ts` in.
pub(super) fn just_before(ts: Timestamp) -> Timestamp {
    if ts.increment > 0 {
        Timestamp {
            time: ts.time,
            increment: ts.increment - 1,
        }
    } else {
        Timestamp {
            time: ts.time.saturating_sub(1),
            increment: u32::MAX,
        }
    }
}
