//! Where the capture stands in the source's history, and the checkpoints that store it.
//!
//! Two positions are kept. [`Resume`] is where reading begins: from the checkpoint (after its
//! resume token or oplog time), else `[mongodb] start`. `last_ts` / `last_token` are the last
//! position reached: a change published (for the oplog, the last entry whose changes all were),
//! or an idle change stream's post-batch resume token. After a transient failure reading
//! begins again there ([`Resume::reopen`]), as a restart from a checkpoint queued at that
//! moment would.
//! [`Capture::mark`] queues a [`Checkpoint`] of the last position reached with the snapshot
//! progress; the publisher stores it once Kafka acknowledged every event sent before it, so a
//! restart from it loses nothing and repeats at most what came after. Resume tokens travel in
//! the checkpoint as hex of their BSON document.

use mongodb::bson::{self, Bson, Document, Timestamp};
use mongodb::change_stream::event::ResumeToken;
use sluice_common::clock::now_secs;
use sluice_common::hex;

use super::Capture;
pub use crate::checkpoint::mongo::Checkpoint;
use crate::error::CaptureError;
use crate::mongo::change::token_time;
use crate::mongo::Mode;

/// Changes published between two marks while the source keeps sending.
pub(super) const MARK_EVERY: usize = 1000;

impl Checkpoint {
    /// Where a capture resumes from this checkpoint, refused when it was written reading
    /// another replica set.
    pub(super) fn resume(
        &self,
        mode: Mode,
        replica_set: &str,
        connector: &str,
    ) -> Result<Resume, CaptureError> {
        if !self.replica_set.is_empty() && self.replica_set != replica_set {
            return Err(CaptureError::source(format!(
                "the checkpoint of connector {connector:?} was written reading replica set {:?}, \
                 but the source is {replica_set:?}: its positions mean nothing here. Use a new \
                 connector name (and re-snapshot) for a new source.",
                self.replica_set
            )));
        }
        let ts = Timestamp {
            time: self.ts.0,
            increment: self.ts.1,
        };
        tracing::info!(ts = %ts_string(ts), token = self.resume_token.is_some(), "resuming from the checkpoint");
        Ok(match (&self.resume_token, mode) {
            (Some(hex), Mode::ChangeStream) => {
                Resume::Token(token_from_hex(hex).map_err(CaptureError::source)?, ts)
            }
            _ => Resume::After(ts),
        })
    }
}

/// Where reading begins.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Resume {
    /// Change streams: after this token.
    Token(ResumeToken, Timestamp),
    /// After this oplog time (exclusive).
    After(Timestamp),
    /// At this oplog time (inclusive).
    At(Timestamp),
    Now,
}

impl Resume {
    /// For logs and errors: "oplog time 1700000000.4", "now", ...
    pub(super) fn describe(&self) -> String {
        match self {
            Resume::Token(_, ts) => {
                format!("the stored resume token (oplog time {})", ts_string(*ts))
            }
            Resume::After(ts) => format!("oplog time {}", ts_string(*ts)),
            Resume::At(ts) => format!("oplog time {} (mongodb.start)", ts_string(*ts)),
            Resume::Now => "now".into(),
        }
    }

    /// Where to read again after a transient failure: after the last position reached (the
    /// resume token for a change stream, else the oplog time), exactly what a checkpoint queued
    /// now would resume from; where this open began when nothing was reached since.
    pub(super) fn reopen(
        &self,
        mode: Mode,
        last_ts: Option<Timestamp>,
        last_token: Option<&ResumeToken>,
    ) -> Resume {
        match (mode, last_token, last_ts) {
            (Mode::ChangeStream, Some(t), ts) => {
                let ts = ts.or_else(|| token_document(t).as_ref().and_then(token_time));
                Resume::Token(t.clone(), ts.unwrap_or(ZERO))
            }
            (_, _, Some(ts)) => Resume::After(ts),
            _ => self.clone(),
        }
    }
}

/// The time of a token whose time is unknown (it only names the token in messages).
pub(super) const ZERO: Timestamp = Timestamp {
    time: 0,
    increment: 0,
};

pub(super) fn ts_string(t: Timestamp) -> String {
    format!("{}.{}", t.time, t.increment)
}

/// The token as hex of its BSON document, as the checkpoint stores it.
pub(super) fn token_hex(t: &ResumeToken) -> Option<String> {
    let doc = token_document(t)?;
    let bytes = bson::to_vec(&doc).ok()?;
    Some(hex::encode(&bytes))
}

pub(super) fn token_from_hex(text: &str) -> Result<ResumeToken, String> {
    let bytes = hex::decode(text).map_err(|e| format!("resume token {text:?}: {e}"))?;
    let doc = Document::from_reader(&mut bytes.as_slice())
        .map_err(|e| format!("resume token {text:?}: {e}"))?;
    bson::from_document(doc).map_err(|e| format!("resume token {text:?}: {e}"))
}

pub(super) fn token_document(t: &ResumeToken) -> Option<Document> {
    match bson::to_bson(t).ok()? {
        Bson::Document(d) => Some(d),
        _ => None,
    }
}

impl Capture {
    /// While idle: a heartbeat event with the oplog time reached
    /// (`publish.heartbeat_interval_ms`).
    pub(super) async fn heartbeat(&mut self) -> Result<(), CaptureError> {
        use sluice_proto::v1;
        let ts = self.last_ts.unwrap_or(Timestamp {
            time: 0,
            increment: 0,
        });
        let position = v1::Position {
            kind: Some(v1::position::Kind::Oplog(v1::OplogPosition {
                ts_seconds: ts.time,
                ts_increment: ts.increment,
                resume_token: Vec::new(),
            })),
        };
        let version = sluice_proto::mongo_version(ts.time, ts.increment);
        self.publisher
            .heartbeat(&self.config.topics.prefix, &self.source, version, position)
            .await?;
        Ok(())
    }

    pub(super) fn resume_description(&self) -> String {
        self.resume.describe()
    }

    /// Nothing new from the source: checkpoint where it stands (unless `in_transaction`, some
    /// of a transaction's oplog entries held, or not moved since the last mark). True when the
    /// end time has been reached.
    pub(super) async fn idle(&mut self, in_transaction: bool) -> Result<bool, CaptureError> {
        self.pulse
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.publish_metrics.lag_seconds.set(0.0);
        self.heartbeat().await?;
        let here = self.last_ts.map(|ts| (ts, self.last_token.clone()));
        if !in_transaction && here != self.marked {
            self.mark().await?;
        }
        let end = self.end_reached_when_idle();
        if end {
            tracing::info!(end = %self.config.mongodb.end, "reached the end time");
        }
        Ok(end)
    }

    pub(super) fn past_end(&self, ts: Timestamp) -> bool {
        self.end
            .is_some_and(|e| (ts.time, ts.increment) > (e.time, e.increment))
    }

    /// Idle, and the end time is behind us: every change up to it has been read.
    fn end_reached_when_idle(&self) -> bool {
        let Some(e) = self.end else { return false };
        now_secs() > u64::from(e.time) || self.last_ts.is_some_and(|t| self.past_end(t))
    }

    pub(super) fn advance(&mut self, ts: Timestamp) {
        self.pulse
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        if self
            .last_ts
            .is_none_or(|l| (ts.time, ts.increment) > (l.time, l.increment))
        {
            self.last_ts = Some(ts);
            self.metrics.oplog_time.set(i64::from(ts.time));
        }
    }

    /// Queue a checkpoint at the last position reached.
    pub(super) async fn mark(&mut self) -> Result<(), CaptureError> {
        self.checkpoint(false).await
    }

    /// Store a checkpoint at the last position reached and wait until it is committed: for a
    /// position nothing may be published before (a new capture's start, a snapshot's start).
    pub(super) async fn store(&mut self) -> Result<(), CaptureError> {
        self.checkpoint(true).await
    }

    async fn checkpoint(&mut self, wait: bool) -> Result<(), CaptureError> {
        let Some(ts) = self.last_ts else {
            return Ok(());
        };
        let resume_token = match self.config.mongodb.mode {
            Mode::ChangeStream => self.last_token.as_ref().and_then(token_hex),
            Mode::Oplog => None,
        };
        let checkpoint = Checkpoint {
            ts: (ts.time, ts.increment),
            resume_token,
            replica_set: self.source.server_uuid_or_replica_set.clone(),
            written_at: now_secs(),
            snapshot: self.snapshot.clone(),
            snapshots_done: self.snapshots_done.clone(),
            unknown: Default::default(),
        };
        if wait {
            self.publisher.store(checkpoint).await?;
        } else {
            self.publisher.mark(checkpoint).await?;
        }
        self.since_mark = 0;
        self.marked = Some((ts, self.last_token.clone()));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::snapshot::{SnapshotProgress, TableProgress};
    use mongodb::bson::doc;
    use mongodb::bson::raw::RawDocumentBuf;

    #[test]
    fn checkpoint_tokens_round_trip() {
        let token: ResumeToken =
            bson::from_document(doc! { "_data": "8265A1B2C3000000042B022C0100296E5A1004" })
                .unwrap();
        let hex = token_hex(&token).unwrap();
        assert_eq!(token_from_hex(&hex).unwrap(), token);
        let c = Checkpoint {
            ts: (1, 2),
            resume_token: Some(hex),
            replica_set: "rs0".into(),
            written_at: 3,
            snapshot: None,
            snapshots_done: vec![],
            unknown: Default::default(),
        };
        let json = serde_json::to_string(&c).unwrap();
        assert!(!json.contains("snapshot"));
        assert_eq!(serde_json::from_str::<Checkpoint>(&json).unwrap(), c);
        // A snapshot under way: the last _id as hex of {v: _id}.
        let mut wrapped = RawDocumentBuf::new();
        wrapped.append("v", "k-42");
        let after = hex::encode(wrapped.as_bytes());
        let mut tables = std::collections::BTreeMap::new();
        tables.insert(
            "db.c".to_string(),
            TableProgress {
                after: after.clone(),
                rows: 7,
                done: false,
            },
        );
        let c = Checkpoint {
            snapshot: Some(SnapshotProgress {
                id: "initial".into(),
                tables,
            }),
            ..c
        };
        let json = serde_json::to_string(&c).unwrap();
        assert_eq!(serde_json::from_str::<Checkpoint>(&json).unwrap(), c);
        let back = Document::from_reader(hex::decode(&after).unwrap().as_slice()).unwrap();
        assert_eq!(back.get_str("v").unwrap(), "k-42");
        assert!(hex::decode("0g").is_err());
        assert!(token_from_hex("zz").is_err());
    }

    #[test]
    fn a_reopen_goes_on_from_the_last_position_published() {
        let t = |time, increment| Timestamp { time, increment };
        let token: ResumeToken =
            bson::from_document(doc! { "_data": "8265A1B2C3000000042B022C0100296E5A1004" })
                .unwrap();
        let from_checkpoint = Resume::Token(token.clone(), t(1, 1));
        // Nothing published or reached since the open: the same start again.
        for start in [Resume::Now, Resume::At(t(5, 0)), from_checkpoint.clone()] {
            for mode in [Mode::ChangeStream, Mode::Oplog] {
                assert_eq!(start.reopen(mode, None, None), start);
            }
        }
        // A change stream: after the last change's (or idle batch's) token, with its time.
        let later: ResumeToken = bson::from_document(doc! { "_data": "6b0d2c8000000007" }).unwrap();
        assert_eq!(
            Resume::Now.reopen(Mode::ChangeStream, Some(t(9, 2)), Some(&later)),
            Resume::Token(later.clone(), t(9, 2))
        );
        // The time read from the token where none was reached.
        assert_eq!(
            from_checkpoint.reopen(Mode::ChangeStream, None, Some(&later)),
            Resume::Token(later.clone(), t(0x6b0d_2c80, 7))
        );
        // No token (a position from a snapshot's start, or a server without tokens): after the
        // time, as a restart from the checkpoint would.
        assert_eq!(
            Resume::At(t(5, 0)).reopen(Mode::ChangeStream, Some(t(9, 2)), None),
            Resume::After(t(9, 2))
        );
        // The oplog: after the last entry whose changes were all published; tokens play no part.
        assert_eq!(
            Resume::At(t(5, 0)).reopen(Mode::Oplog, Some(t(9, 2)), Some(&later)),
            Resume::After(t(9, 2))
        );
        // And it is what the checkpoint queued at that moment resumes from.
        let c = Checkpoint {
            ts: (9, 2),
            resume_token: token_hex(&later),
            replica_set: "rs0".into(),
            written_at: 0,
            snapshot: None,
            snapshots_done: vec![],
            unknown: Default::default(),
        };
        for mode in [Mode::ChangeStream, Mode::Oplog] {
            assert_eq!(
                c.resume(mode, "rs0", "c1").unwrap(),
                Resume::Now.reopen(mode, Some(t(9, 2)), Some(&later))
            );
        }
        let e = c.resume(Mode::Oplog, "rs1", "c1").unwrap_err();
        assert_eq!(e.label(), "source");
        assert!(!e.is_transient());
    }

    #[test]
    fn older_checkpoints_with_collections_and_docs_still_read() {
        // What capture-mongo wrote before the snapshot progress type was shared.
        let old = r#"{"ts":[1700000000,4],"resume_token":"1e000000025f64617461000c0000003832363541314232433300000000","replica_set":"rs0","written_at":1700000001,"snapshot":{"id":"initial","collections":{"shop.orders":{"after":"0f000000027600030000006b2d0000","docs":1200},"shop.users":{"docs":50,"done":true}}},"snapshots_done":["r0"]}"#;
        let c: Checkpoint = serde_json::from_str(old).unwrap();
        assert_eq!(c.ts, (1_700_000_000, 4));
        assert_eq!(c.snapshots_done, vec!["r0".to_string()]);
        let s = c.snapshot.as_ref().unwrap();
        assert_eq!(s.id, "initial");
        assert_eq!(
            s.tables["shop.orders"],
            TableProgress {
                after: "0f000000027600030000006b2d0000".into(),
                rows: 1200,
                done: false,
            }
        );
        let id = hex::decode(&s.tables["shop.orders"].after).unwrap();
        let id = Document::from_reader(id.as_slice()).unwrap();
        assert_eq!(id.get_str("v").unwrap(), "k-");
        assert!(s.tables["shop.users"].done);
        assert_eq!(s.tables["shop.users"].rows, 50);
        // Written again, it uses the shared names, and reads back the same.
        let json = serde_json::to_string(&c).unwrap();
        assert!(
            json.contains(r#""tables""#) && json.contains(r#""rows":1200"#),
            "{json}"
        );
        assert!(
            !json.contains("collections") && !json.contains("docs"),
            "{json}"
        );
        assert_eq!(serde_json::from_str::<Checkpoint>(&json).unwrap(), c);
    }
}
