//! Reading a change stream (`mode = "change_stream"`): one event at a time, each published with
//! its resume token.
//!
//! The stream is opened on the configured scope (a collection, a database or the cluster) with
//! `startAfter` the resume token, or `startAtOperationTime` when only a time is known, and with
//! MongoDB 6.0+'s expanded events (create, createIndexes, dropIndexes, modify) where the server
//! has them. An `invalidate` (the watched collection or database dropped or renamed) reopens it
//! after the invalidating event. An empty batch moves the position to the server's post-batch
//! resume token.
//!
//! After a transient failure the stream is opened again after the last change published
//! (`startAfter` its token, or the idle batch's), with the same options, and the transaction
//! under way keeps its event count, so the events after it carry the indexes they would have
//! had. A stream opened at `now` remembers the server's first post-batch token, so a failure
//! before the first change reopens there rather than at a later "now" (a server that gives no
//! such token, as mongo-java-server, reopens at "now"). A resume point the server no longer
//! has, or a scope it does not serve, is a definite error ([`history_error`]) that says what to
//! do.

use std::time::Duration;

use mongodb::bson::raw::RawDocumentBuf;
use mongodb::bson::{doc, Document, Timestamp};
use mongodb::change_stream::ChangeStream;
use mongodb::options::{ChangeStreamOptions, FullDocumentBeforeChangeType, FullDocumentType};
use sluice_common::Shutdown;

use super::checkpoint::{token_document, Resume, MARK_EVERY, ZERO};
use super::copy::just_before;
use super::Capture;
use crate::error::{CaptureError, Origin};
use crate::mongo::change::{self, StreamEvent};
use crate::mongo::{BeforeChange, FullDocument};

impl Capture {
    async fn open_change_stream(
        &mut self,
        resume: &Resume,
    ) -> Result<ChangeStream<RawDocumentBuf>, CaptureError> {
        let expanded = self.expanded_events().await?;
        let m = &self.config.mongodb;
        let mut opts = ChangeStreamOptions::default();
        opts.batch_size = Some(m.batch_size);
        opts.max_await_time = Some(Duration::from_millis(m.max_await_ms));
        opts.full_document = match m.full_document {
            FullDocument::Default => None,
            FullDocument::UpdateLookup => Some(FullDocumentType::UpdateLookup),
            FullDocument::WhenAvailable => Some(FullDocumentType::WhenAvailable),
            FullDocument::Required => Some(FullDocumentType::Required),
        };
        opts.full_document_before_change = match m.full_document_before_change {
            BeforeChange::Off => None,
            BeforeChange::WhenAvailable => Some(FullDocumentBeforeChangeType::WhenAvailable),
            BeforeChange::Required => Some(FullDocumentBeforeChangeType::Required),
        };
        if expanded {
            opts.show_expanded_events = Some(true);
        }
        match resume {
            Resume::Token(t, _) => opts.start_after = Some(t.clone()),
            Resume::After(ts) => {
                opts.start_at_operation_time = Some(Timestamp {
                    time: ts.time,
                    increment: ts.increment.saturating_add(1),
                })
            }
            Resume::At(ts) => opts.start_at_operation_time = Some(*ts),
            Resume::Now => {}
        }
        let stream = match self.scope() {
            (Some(db), Some(coll)) => {
                self.client
                    .database(db)
                    .collection::<Document>(coll)
                    .watch()
                    .with_options(opts)
                    .await
            }
            (Some(db), None) => self.client.database(db).watch().with_options(opts).await,
            _ => self.client.watch().with_options(opts).await,
        }
        .map_err(|e| history_error(e, &self.resume, &self.config.connector))?;
        Ok(stream.with_type::<RawDocumentBuf>())
    }

    /// MongoDB 6.0+ (wire version 17) reports create, createIndexes, dropIndexes and modify
    /// (collMod) events when asked. The first answer is kept: a reopen asks for the same events.
    /// No answer is the stream's failure (a transient one reopens it): a stream opened without
    /// them would leave those events out unsaid.
    async fn expanded_events(&mut self) -> Result<bool, CaptureError> {
        if let Some(known) = self.expanded {
            return Ok(known);
        }
        let hello = self
            .client
            .database("admin")
            .run_command(doc! { "isMaster": 1 })
            .await?;
        let expanded = hello.get_i32("maxWireVersion").unwrap_or(0) >= 17;
        self.expanded = Some(expanded);
        Ok(expanded)
    }

    pub(super) async fn read_change_stream(
        &mut self,
        shutdown: &Shutdown,
    ) -> Result<(), CaptureError> {
        let mut resume = self.resume.clone();
        let mut stream = self.open_change_stream(&resume).await?;
        tracing::info!(from = %self.resume_description(), scope = ?self.scope(), "reading the change stream");
        if self.resume == Resume::Now {
            // Where "now" was (the server's first post-batch token): a reopen before the first
            // change goes on from here, not from a later "now".
            if let Some(t) = stream.resume_token() {
                let ts = token_document(&t).as_ref().and_then(change::token_time);
                self.resume = Resume::Token(t.clone(), ts.unwrap_or(ZERO));
                if let (None, Some(ts)) = (self.last_ts, ts) {
                    // A new capture stores where it starts, committed before anything is
                    // published: killed before its first change is checkpointed, it must not
                    // start again at a later "now".
                    self.last_token = Some(t);
                    self.advance(ts);
                    self.store().await?;
                }
            }
        }
        let scope = {
            let (a, b) = self.scope();
            (a.map(String::from), b.map(String::from))
        };
        loop {
            if shutdown.is_triggered() || self.publisher.failed() {
                return Ok(());
            }
            let next = tokio::select! {
                biased;
                _ = shutdown.wait() => return Ok(()),
                n = stream.next_if_any() => n,
            };
            match next.map_err(|e| history_error(e, &self.resume, &self.config.connector))? {
                Some(raw) => {
                    let token = stream.resume_token();
                    let ev =
                        change::from_change_stream(&raw, (scope.0.as_deref(), scope.1.as_deref()))
                            .map_err(|e| CaptureError::definite(Origin::Decode, e))?;
                    match ev {
                        StreamEvent::Invalidate => {
                            // The watched collection or database is gone: go on after it.
                            let t = token.ok_or_else(|| {
                                CaptureError::source("invalidate event without a token")
                            })?;
                            tracing::info!(
                                "change stream invalidated (drop or rename); reopening after it"
                            );
                            resume = Resume::Token(t, self.last_ts.unwrap_or(ZERO));
                            stream = self.open_change_stream(&resume).await?;
                        }
                        StreamEvent::Change(c) => {
                            if self.past_end(c.ts) {
                                tracing::info!(end = %self.config.mongodb.end, "reached the end time");
                                return Ok(());
                            }
                            let ts = c.ts;
                            if self.last_ts.is_none() && self.resume == Resume::Now {
                                // Started at "now" on a server that gave no post-batch token:
                                // the position just before this first change is committed
                                // before it is published (a restart reads from there by
                                // `startAtOperationTime`, not from a later "now").
                                self.advance(just_before(ts));
                                self.store().await?;
                            }
                            let mut c = *c;
                            if c.lookup {
                                // An update described with a path no update can name (never
                                // MongoDB's own): its document as it is now, as updateLookup.
                                self.look_up(std::slice::from_mut(&mut c)).await?;
                            }
                            self.publish(c, token.as_ref()).await?;
                            // Published: a checkpoint, or a reopen, goes on after it.
                            self.last_token = token;
                            self.advance(ts);
                            if self.since_mark >= MARK_EVERY {
                                self.mark().await?;
                            }
                        }
                    }
                }
                None => {
                    // Caught up: the post-batch token is the stream's position now.
                    if let Some(t) = stream.resume_token() {
                        if let Some(ts) = token_document(&t).as_ref().and_then(change::token_time) {
                            self.advance(ts);
                        }
                        self.last_token = Some(t);
                    }
                    if self.idle(false).await? {
                        return Ok(());
                    }
                }
            }
        }
    }
}

/// A resume point the server no longer has, or a scope it does not serve, is definite and says
/// what to do; anything else is classified as any MongoDB error (a network failure or an election
/// is transient).
fn history_error(e: mongodb::error::Error, resume: &Resume, connector: &str) -> CaptureError {
    if let mongodb::error::ErrorKind::Command(c) = &*e.kind {
        if c.code == 59 {
            return CaptureError::definite(
                Origin::Config,
                format!(
                    "the server does not serve change streams at this scope ({}): set \
                     mongodb.database and mongodb.collection, or use mode = \"oplog\"",
                    c.message
                ),
            );
        }
        // ChangeStreamHistoryLost, ChangeStreamFatalError, InvalidResumeToken.
        if matches!(c.code, 286 | 280 | 260) {
            return CaptureError::source(format!(
                "the change stream cannot resume from {} ({}: {}): the source no longer has \
                 that part of its oplog. Re-snapshot, or remove the checkpoint of connector \
                 {connector:?} to start at mongodb.start.",
                resume.describe(),
                c.code_name,
                c.message,
            ));
        }
    }
    e.into()
}

#[cfg(test)]
mod tests {
    use super::*;
    use mongodb::error::{Error, ErrorKind};

    fn command(code: i32) -> Error {
        let reply = doc! { "ok": 0, "code": code, "codeName": "X", "errmsg": "m" };
        let c: mongodb::error::CommandError = mongodb::bson::from_document(reply).unwrap();
        Error::from(ErrorKind::Command(c))
    }

    #[test]
    fn lost_history_stops_and_a_lost_connection_reopens() {
        let at = Resume::After(Timestamp {
            time: 5,
            increment: 1,
        });
        // ChangeStreamHistoryLost, ChangeStreamFatalError, InvalidResumeToken: definite, named.
        for code in [286, 280, 260] {
            let e = history_error(command(code), &at, "c1");
            assert!(!e.is_transient(), "{code}");
            assert_eq!(e.label(), "source");
            let m = e.to_string();
            assert!(m.contains("oplog time 5.1") && m.contains("\"c1\""), "{m}");
        }
        // Not served at this scope: the remedy is a setting.
        let e = history_error(command(59), &at, "c1");
        assert_eq!((e.is_transient(), e.label()), (false, "config"));
        assert!(e.to_string().contains("mongodb.collection"), "{e}");
        // Shutdown, a stepped-down primary, an election, a cursor lost in a fail-over, a
        // network failure: reopen.
        for code in [91, 189, 10107, 11602, 43] {
            let e = history_error(command(code), &at, "c1");
            assert!(e.is_transient(), "{code}");
            assert_eq!(e.label(), "mongodb");
        }
        let io = Error::from(ErrorKind::Io(std::sync::Arc::new(std::io::Error::other(
            "reset",
        ))));
        assert!(history_error(io, &at, "c1").is_transient());
        // Anything else MongoDB refuses (unauthorized) stops as a MongoDB error.
        let e = history_error(command(13), &at, "c1");
        assert_eq!((e.is_transient(), e.label()), (false, "mongodb"));
        assert!(e.to_string().starts_with("MongoDB: "), "{e}");
    }
}
