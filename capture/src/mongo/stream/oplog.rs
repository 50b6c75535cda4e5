//! Tailing `local.oplog.rs` (`mode = "oplog"`) with a tailable, awaiting cursor.
//!
//! Reading starts after the checkpoint's oplog time (or at `[mongodb] start`, or at the newest
//! entry for `now`, which a new capture checkpoints before anything else, so that a restart does
//! not begin at a later "now"). An oplog that no longer reaches back to the start is a definite
//! error: the changes in between are gone. Each entry becomes its changes
//! ([`change::from_oplog`]); the entries of a transaction split with `partialTxn` are held until
//! its last one (prepared ones until their commit), bounded in memory (`held`: past
//! `mongodb.max_held_bytes` they go to a file), and the position moves past an entry only once
//! all its changes are published.
//! The documents of updates the oplog cannot describe are read before any change of their entry
//! is published, so a transient failure (the reader then reopens the cursor after the last entry
//! published, and reads a held transaction again whole) never leaves an entry half published.
//! When the cursor ends (a server without tailable oplog cursors, or a rolled-over capped
//! collection) the reader queries again after the last entry.

use std::time::Duration;

use mongodb::bson::raw::RawDocumentBuf;
use mongodb::bson::{doc, Bson, Timestamp};
use mongodb::options::{CursorType, FindOneOptions, FindOptions};
use sluice_common::clock::now_secs;
use sluice_common::Shutdown;

use super::checkpoint::{ts_string, Resume, MARK_EVERY};
use super::copy::just_before;
use super::held::{Held, SpillConfig};
use super::Capture;
use crate::error::{CaptureError, Origin};
use crate::mongo::change::{self, Change};

impl Capture {
    pub(super) async fn read_oplog(&mut self, shutdown: &Shutdown) -> Result<(), CaptureError> {
        let oplog = self
            .client
            .database("local")
            .collection::<RawDocumentBuf>("oplog.rs");
        let first = oplog
            .find_one(doc! {})
            .with_options(
                FindOneOptions::builder()
                    .sort(doc! { "$natural": 1 })
                    .build(),
            )
            .await?;
        let first_ts = first.as_ref().and_then(|d| d.get_timestamp("ts").ok());
        // (position, inclusive)
        let (mut from, mut inclusive) = match &self.resume {
            Resume::Token(_, ts) | Resume::After(ts) => (*ts, false),
            Resume::At(ts) => (*ts, true),
            Resume::Now => {
                let last = oplog
                    .find_one(doc! {})
                    .with_options(
                        FindOneOptions::builder()
                            .sort(doc! { "$natural": -1 })
                            .build(),
                    )
                    .await?;
                match last.as_ref().and_then(|d| d.get_timestamp("ts").ok()) {
                    Some(ts) => (ts, false),
                    None => {
                        let now = now_secs() as u32;
                        (
                            Timestamp {
                                time: now,
                                increment: 0,
                            },
                            true,
                        )
                    }
                }
            }
        };
        if !matches!(self.resume, Resume::Now) {
            if let Some(f) = first_ts {
                let lost = if inclusive {
                    (f.time, f.increment) > (from.time, from.increment)
                } else {
                    (f.time, f.increment) > (from.time, from.increment.saturating_add(1))
                };
                if lost {
                    return Err(CaptureError::source(format!(
                        "cannot resume from {}: the oplog begins at {}, so changes in between are \
                         no longer there. Re-snapshot, or remove the checkpoint of connector {:?} \
                         to start at mongodb.start.",
                        self.resume_description(),
                        ts_string(f),
                        self.config.connector
                    )));
                }
            }
        }
        tracing::info!(from = %ts_string(from), inclusive, "tailing local.oplog.rs");
        if self.last_ts.is_none() && !inclusive {
            // A new capture stores where it starts before anything else, and waits for the
            // checkpoint's commit: killed before its first change is checkpointed, it must not
            // start again at a later "now" (what it published would stand without the changes
            // made in between).
            self.advance(from);
            self.store().await?;
        }
        let await_time = Duration::from_millis(self.config.mongodb.max_await_ms);
        // Entries of a transaction whose last entry has not come yet. Dropped with a failure:
        // the reopen reads them again, from before the transaction's first entry.
        let spill = self.spill_config();
        let mut partial_txn = Held::new();
        // The oplog time before the first entry of the transaction in `partial_txn`.
        let mut partial_before: Option<Timestamp> = None;
        // The first entry read by a capture with no position yet (started at "now" on an empty
        // oplog).
        let mut first_read: Option<Timestamp> = None;
        // Prepared transactions not committed or aborted yet, by session and transaction
        // number. Dropped with a failure too: the position stays before the first of them.
        let mut prepared = Prepared::default();
        loop {
            let filter = if inclusive {
                doc! { "ts": { "$gte": from } }
            } else {
                doc! { "ts": { "$gt": from } }
            };
            let opts = FindOptions::builder()
                .cursor_type(CursorType::TailableAwait)
                .max_await_time(await_time)
                .batch_size(self.config.mongodb.batch_size)
                .build();
            let mut cursor = oplog.find(filter).with_options(opts).await?;
            loop {
                if shutdown.is_triggered() || self.publisher.failed() {
                    return Ok(());
                }
                // `advance` + `current`: each entry is read where the cursor holds it, not
                // copied out once more first.
                let next = tokio::select! {
                    biased;
                    _ = shutdown.wait() => return Ok(()),
                    n = tokio::time::timeout(await_time * 2, cursor.advance()) => n,
                };
                match next {
                    Ok(Err(e)) => return Err(e.into()),
                    Ok(Ok(true)) => {
                        let raw = cursor.current();
                        let parsed = change::from_oplog(raw)
                            .map_err(|e| CaptureError::definite(Origin::Decode, e))?;
                        if self.past_end(parsed.ts) {
                            tracing::info!(end = %self.config.mongodb.end, "reached the end time");
                            return Ok(());
                        }
                        let before = from;
                        from = parsed.ts;
                        inclusive = false;
                        if self.last_ts.is_none() {
                            first_read.get_or_insert(parsed.ts);
                        }
                        if parsed.partial || parsed.prepared {
                            partial_before.get_or_insert(before);
                            partial_txn
                                .push(raw.to_raw_document_buf(), prepared.mem_bytes(), &spill)
                                .map_err(|e| spill_error(&spill, e))?;
                            if parsed.partial {
                                continue;
                            }
                        }
                        let first = partial_before.take().unwrap_or(before);
                        let key = (parsed.lsid.clone(), parsed.txn_number);
                        if parsed.prepared {
                            tracing::debug!(at = %ts_string(parsed.ts), "prepared transaction held until its commit");
                            prepared.hold(
                                key,
                                first,
                                std::mem::replace(&mut partial_txn, Held::new()),
                            );
                            continue;
                        }
                        // The entries whose changes are published now, the commit time they
                        // take (a prepared transaction's changes happen at its commit).
                        let (entries, at_commit) = match parsed.ends_prepared {
                            Some(true) => {
                                let held = prepared.take(&key);
                                if held.is_none() {
                                    self.publish_metrics
                                        .errors
                                        .with_label_values(&["source"])
                                        .inc();
                                    tracing::error!(
                                        at = %ts_string(parsed.ts),
                                        "commit of a prepared transaction whose prepare was not \
                                         read (before the capture's start): its changes are not \
                                         published; re-copy the collections it wrote \
                                         (snapshot.request_id) if they are captured"
                                    );
                                }
                                (held.unwrap_or_else(Held::new), Some(parsed.ts))
                            }
                            Some(false) => {
                                let dropped = prepared.take(&key);
                                tracing::info!(
                                    at = %ts_string(parsed.ts),
                                    entries = dropped.as_ref().map_or(0, Held::len),
                                    "prepared transaction aborted: its changes are not published"
                                );
                                (Held::new(), None)
                            }
                            None => (std::mem::replace(&mut partial_txn, Held::new()), None),
                        };
                        if let (None, Some(first)) = (self.last_ts, first_read) {
                            // Started at "now" on an empty oplog: the point just before the
                            // first entry read is committed before anything is published.
                            self.advance(just_before(first));
                            self.store().await?;
                        }
                        // The held entries' changes first, then this entry's own.
                        for e in entries.drain() {
                            let e = e.map_err(CaptureError::source)?;
                            let held = change::from_oplog(&e)
                                .map_err(|e| CaptureError::definite(Origin::Decode, e))?;
                            self.publish_changes(held.changes, at_commit).await?;
                        }
                        if parsed.ends_prepared.is_none() {
                            self.publish_changes(parsed.changes, None).await?;
                        }
                        // Not past a prepared transaction still open: a restart reads it again.
                        self.advance(prepared.before().unwrap_or(parsed.ts));
                        if self.since_mark >= MARK_EVERY {
                            self.mark().await?;
                        }
                    }
                    // The cursor ended (a server without tailable cursors on the oplog, or the
                    // capped collection rolled over): query again from the last entry.
                    Ok(Ok(false)) => break,
                    // Nothing new for a while.
                    Err(_) => {
                        if self
                            .idle(!partial_txn.is_empty() || !prepared.is_empty())
                            .await?
                        {
                            return Ok(());
                        }
                    }
                }
            }
            if self
                .idle(!partial_txn.is_empty() || !prepared.is_empty())
                .await?
            {
                return Ok(());
            }
            tokio::select! {
                _ = shutdown.wait() => return Ok(()),
                _ = tokio::time::sleep(await_time.min(Duration::from_millis(200))) => {}
            }
        }
    }

    /// Publish an entry's changes (at `at_commit` when given: a prepared transaction's changes
    /// take its commit's time), their documents read first where the oplog cannot describe
    /// the update.
    async fn publish_changes(
        &mut self,
        mut changes: Vec<Change>,
        at_commit: Option<Timestamp>,
    ) -> Result<(), CaptureError> {
        if let Some(ts) = at_commit {
            for c in &mut changes {
                c.ts = ts;
            }
        }
        if changes.iter().any(|c| c.lookup) {
            self.look_up(&mut changes).await?;
        }
        for c in changes {
            self.publish(c, None).await?;
        }
        Ok(())
    }

    fn spill_config(&self) -> SpillConfig {
        let dir = match self.config.mongodb.spill_dir.as_str() {
            "" => std::env::temp_dir(),
            d => std::path::PathBuf::from(d),
        };
        SpillConfig {
            dir,
            max_held_bytes: self.config.mongodb.max_held_bytes,
        }
    }

    /// Read the documents of the updates the source could not describe ([`Change::lookup`]) as
    /// they are now (what `updateLookup` does on change streams), for the changes that will be
    /// published; before any of them is, so that a failure here leaves the entry unpublished.
    /// A document deleted since is published as nothing to write (its delete follows).
    pub(super) async fn look_up(&mut self, changes: &mut [Change]) -> Result<(), CaptureError> {
        for c in changes.iter_mut() {
            if !c.lookup || !self.wanted(c) {
                continue;
            }
            self.metrics.lookups.inc();
            let id = c.id().map(|i| i.to_raw_bson());
            let id =
                id.ok_or_else(|| CaptureError::definite(Origin::Decode, "update without _id"))?;
            let id = Bson::try_from(id)
                .map_err(|e| CaptureError::definite(Origin::Decode, e.to_string()))?;
            c.full_document = self
                .client
                .database(&c.database)
                .collection::<RawDocumentBuf>(&c.collection)
                .find_one(doc! { "_id": id })
                .await?;
        }
        Ok(())
    }
}

fn spill_error(config: &SpillConfig, e: std::io::Error) -> CaptureError {
    CaptureError::definite(
        Origin::Config,
        format!(
            "cannot write held oplog entries to mongodb.spill_dir ({}): {e}. A transaction \
             larger than mongodb.max_held_bytes ({}) waits there for its commit: give the \
             capture a writable folder with room, or a larger bound",
            config.dir.display(),
            config.max_held_bytes
        ),
    )
}

/// A session (`lsid`) and transaction number: which transaction a commit or abort ends.
type TxnKey = (Option<RawDocumentBuf>, Option<i64>);

/// Prepared transactions read and not ended yet, each with the oplog time before its first
/// entry (where a restart must read from to see it whole).
#[derive(Default)]
pub(super) struct Prepared {
    held: Vec<(TxnKey, Timestamp, Held)>,
}

impl Prepared {
    pub(super) fn hold(&mut self, key: TxnKey, before: Timestamp, entries: Held) {
        self.held.push((key, before, entries));
    }

    /// The entries of the prepared transaction `key` (`None`: not read, e.g. prepared before
    /// the start), no longer held.
    pub(super) fn take(&mut self, key: &TxnKey) -> Option<Held> {
        let i = self.held.iter().position(|(k, _, _)| k == key)?;
        Some(self.held.remove(i).2)
    }

    /// Bytes their entries hold in memory.
    pub(super) fn mem_bytes(&self) -> usize {
        self.held.iter().map(|(_, _, h)| h.mem_bytes()).sum()
    }

    /// The oplog time before the first entry of the oldest held transaction.
    pub(super) fn before(&self) -> Option<Timestamp> {
        self.held
            .iter()
            .map(|(_, b, _)| *b)
            .min_by_key(|t| (t.time, t.increment))
    }

    pub(super) fn is_empty(&self) -> bool {
        self.held.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mongo::change::from_oplog;
    use mongodb::bson::{rawdoc, Document};

    fn ts(i: u32) -> Timestamp {
        Timestamp {
            time: 100,
            increment: i,
        }
    }

    fn entry(d: Document) -> change::OplogEntry {
        from_oplog(&RawDocumentBuf::from_document(&d).unwrap()).unwrap()
    }

    /// The changes of held entries, as they are published at the commit.
    fn changes_of(held: Held) -> Vec<Change> {
        held.drain()
            .flat_map(|e| from_oplog(&e.unwrap()).unwrap().changes)
            .collect()
    }

    /// A prepared transaction as a shard logs it (MongoDB's oplog format): the prepare's
    /// applyOps, then commitTransaction or abortTransaction with the same lsid and txnNumber.
    #[test]
    fn prepared_transactions_count_at_their_commit_and_not_at_all_when_aborted() {
        let lsid = doc! { "id": mongodb::bson::Binary { subtype: mongodb::bson::spec::BinarySubtype::Uuid, bytes: vec![7; 16] } };
        let spill = SpillConfig {
            dir: std::env::temp_dir(),
            max_held_bytes: 1 << 20,
        };
        let prepare = |t: u32, n: i64, id: i32| {
            let raw = RawDocumentBuf::from_document(&doc! {
                "ts": ts(t), "op": "c", "ns": "admin.$cmd", "lsid": lsid.clone(), "txnNumber": n,
                "o": { "applyOps": [{ "op": "i", "ns": "d.a", "o": { "_id": id } }], "prepare": true },
            })
            .unwrap();
            let mut held = Held::new();
            held.push(raw.clone(), 0, &spill).unwrap();
            (from_oplog(&raw).unwrap(), held)
        };
        let end = |t: u32, n: i64, what: &str| {
            entry(doc! {
                "ts": ts(t), "op": "c", "ns": "admin.$cmd", "lsid": lsid.clone(), "txnNumber": n,
                "o": { what: 1, "commitTimestamp": ts(t) },
            })
        };
        let (p1, h1) = prepare(1, 1, 10);
        assert!(p1.prepared && p1.ends_prepared.is_none());
        let (p2, h2) = prepare(2, 2, 20);
        let mut held = Prepared::default();
        held.hold((p1.lsid.clone(), p1.txn_number), ts(0), h1);
        held.hold((p2.lsid.clone(), p2.txn_number), ts(1), h2);
        assert_eq!(held.before(), Some(ts(0)));
        assert!(held.mem_bytes() > 0);
        let abort = end(3, 1, "abortTransaction");
        assert_eq!(abort.ends_prepared, Some(false));
        assert!(abort.changes.is_empty());
        let dropped = changes_of(held.take(&(abort.lsid.clone(), abort.txn_number)).unwrap());
        assert_eq!(dropped.len(), 1);
        assert_eq!(dropped[0].full_document, Some(rawdoc! { "_id": 10 }));
        // The position may now move up to just before the second.
        assert_eq!(held.before(), Some(ts(1)));
        let commit = end(4, 2, "commitTransaction");
        assert_eq!(commit.ends_prepared, Some(true));
        let committed = changes_of(
            held.take(&(commit.lsid.clone(), commit.txn_number))
                .unwrap(),
        );
        assert_eq!(committed.len(), 1);
        assert_eq!(committed[0].full_document, Some(rawdoc! { "_id": 20 }));
        assert!(held.is_empty() && held.before().is_none());
        // A commit of a transaction not held (prepared before the capture started): nothing.
        assert!(held.take(&(commit.lsid, Some(9))).is_none());
    }
}
