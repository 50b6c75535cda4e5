//! The MongoDB reader: a change stream or the oplog, to change events on Kafka, resumable.
//!
//! Progress and resumption:
//! - At start the capture reads its checkpoint (`[publish] checkpoint_topic`, key = connector):
//!   the change stream's resume token and the oplog time of the last change published. With one
//!   it resumes after it (change streams: `startAfter` the token, or `startAtOperationTime` when
//!   only a time is known; oplog: entries with a later `ts`); without one it starts at
//!   `[mongodb] start`. A resume point the source no longer has stops the capture with an error
//!   saying so: events would be missing.
//! - Changes are published as they are read; every 1000 changes, and whenever the source has
//!   nothing new (an empty batch), the capture queues a mark with the current position. On an
//!   idle change stream the position is the server's post-batch resume token, so the checkpoint
//!   keeps up with the cluster even when the captured collections do not change.
//! - A transaction written as several oplog entries (`partialTxn`) is held until its last entry,
//!   so a checkpoint never falls inside it.
//! - Key = database, collection and `_id`: one document's changes stay on one partition, in
//!   order. DDL events go to every partition of the collection's topic (a rename also to every
//!   partition of the new name's topic), so each partition sees them in order with its rows.

use std::collections::HashMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use futures::StreamExt;
use mongodb::bson::raw::RawDocumentBuf;
use mongodb::bson::{self, doc, Bson, Document, Timestamp};
use mongodb::change_stream::event::ResumeToken;
use mongodb::change_stream::ChangeStream;
use mongodb::options::{
    ChangeStreamOptions, CursorType, FindOneOptions, FindOptions, FullDocumentBeforeChangeType,
    FullDocumentType,
};
use prometheus::{IntCounter, IntGauge, Registry};
use prost::Message;
use serde::{Deserialize, Serialize};
use sluice_common::Shutdown;
use sluice_proto::v1::{self, Op};
use sluice_proto::{
    append_event_key, event_key_prefix, mongo_version, TopicTemplate, CONTRACT_VERSION,
};

use super::change::{self, Change, OpKind, StreamEvent};
use super::{parse_point, BeforeChange, Config, FullDocument, Mode, StartAt, SYSTEM_DATABASES};
use crate::filter::Filter;
use crate::publish::{read_checkpoint, PublishError, PublishMetrics, Publisher};

#[derive(Debug, thiserror::Error)]
pub enum CaptureError {
    #[error("MongoDB: {0}")]
    Mongo(#[from] mongodb::error::Error),
    #[error(transparent)]
    Publish(#[from] PublishError),
    #[error("{0}")]
    Definite(String),
}

/// A position in the source's history, as stored in Kafka.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Checkpoint {
    /// Oplog time of the last change published (or reached on an idle stream): seconds and
    /// increment.
    pub ts: (u32, u32),
    /// The change stream resume token there, as hex of its BSON document; absent when the
    /// capture read the oplog.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resume_token: Option<String>,
    /// The source's replica set name when the checkpoint was written (empty if it has none).
    #[serde(default)]
    pub replica_set: String,
    /// Wall-clock time of the write, seconds since the epoch.
    pub written_at: u64,
}

fn token_hex(t: &ResumeToken) -> Option<String> {
    let doc = match bson::to_bson(t).ok()? {
        Bson::Document(d) => d,
        _ => return None,
    };
    let bytes = bson::to_vec(&doc).ok()?;
    Some(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

fn token_from_hex(hex: &str) -> Result<ResumeToken, String> {
    let bytes: Vec<u8> = (0..hex.len() / 2)
        .map(|i| u8::from_str_radix(&hex[2 * i..2 * i + 2], 16))
        .collect::<Result<_, _>>()
        .map_err(|e| format!("resume token {hex:?}: {e}"))?;
    let doc = Document::from_reader(&mut bytes.as_slice())
        .map_err(|e| format!("resume token {hex:?}: {e}"))?;
    bson::from_document(doc).map_err(|e| format!("resume token {hex:?}: {e}"))
}

fn token_document(t: &ResumeToken) -> Option<Document> {
    match bson::to_bson(t).ok()? {
        Bson::Document(d) => Some(d),
        _ => None,
    }
}

struct StreamMetrics {
    oplog_time: IntGauge,
    lookups: IntCounter,
}

impl StreamMetrics {
    fn new(r: &Registry) -> prometheus::Result<Self> {
        let oplog_time = IntGauge::new(
            "sluice_capture_oplog_time_seconds",
            "Oplog time (seconds since the epoch) of the last change read or position reached.",
        )?;
        let lookups = IntCounter::new(
            "sluice_capture_document_lookups_total",
            "Documents read from the source because an oplog update could not be described.",
        )?;
        r.register(Box::new(oplog_time.clone()))?;
        r.register(Box::new(lookups.clone()))?;
        Ok(Self {
            oplog_time,
            lookups,
        })
    }
}

/// Worked out once per collection.
struct Namespace {
    topic: std::sync::Arc<str>,
    /// The record key's bytes before the `_id` ([`sluice_proto::event_key_prefix`]).
    key_prefix: Vec<u8>,
    partitions: i32,
    counters: [IntCounter; 4], // insert, update, delete, ddl
    bytes: IntCounter,
}

/// Where reading begins.
#[derive(Debug, Clone)]
enum Resume {
    /// Change streams: after this token.
    Token(ResumeToken, Timestamp),
    /// After this oplog time (exclusive).
    After(Timestamp),
    /// At this oplog time (inclusive).
    At(Timestamp),
    Now,
}

pub struct Capture {
    config: Config,
    client: mongodb::Client,
    publisher: Publisher<Checkpoint>,
    publish_metrics: PublishMetrics,
    metrics: StreamMetrics,
    filter: Filter,
    topics: TopicTemplate,
    source: v1::Source,
    /// database -> collection -> what is worked out once for it.
    namespaces: HashMap<String, HashMap<String, Namespace>>,
    resume: Resume,
    end: Option<Timestamp>,
    /// The transaction being published: its id and the next event's index in it.
    tx: Option<(String, u64)>,
    /// Changes read but not marked yet.
    since_mark: usize,
    /// The last position reached (published change or idle token).
    last_ts: Option<Timestamp>,
    last_token: Option<ResumeToken>,
    /// The position of the last mark: an idle source queues no new one until it moves.
    marked: Option<(Timestamp, Option<ResumeToken>)>,
    /// Oplog entries of a transaction whose last entry has not come yet.
    partial_txn: Vec<Change>,
    buf: Vec<u8>,
}

const MARK_EVERY: usize = 1000;

fn now_micros() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros() as i64)
        .unwrap_or(0)
}

fn ts_string(t: Timestamp) -> String {
    format!("{}.{}", t.time, t.increment)
}

impl Capture {
    pub async fn start(config: Config, registry: &Registry) -> Result<Self, CaptureError> {
        let client = mongodb::Client::with_uri_str(&config.mongodb.uri).await?;
        let (_, hello) = sluice_common::mongo::describe_server(&config.mongodb.uri)
            .await
            .map_err(CaptureError::Definite)?;
        let replica_set = hello.get_str("setName").unwrap_or_default().to_string();
        let filter = Filter::new(&config.filter, SYSTEM_DATABASES)
            .map_err(|(k, m)| CaptureError::Definite(format!("{k}: {m}")))?;
        let topics = config
            .topics
            .template()
            .map_err(|e| CaptureError::Definite(e.to_string()))?;
        let end = match config.mongodb.end.as_str() {
            "" => None,
            s => match parse_point(s).map_err(CaptureError::Definite)? {
                StartAt::Time(t) => Some(t),
                StartAt::Now => None,
            },
        };
        let publish_metrics = PublishMetrics::new(registry).expect("metrics register once");
        let metrics = StreamMetrics::new(registry).expect("metrics register once");
        let checkpoint: Option<Checkpoint> = read_checkpoint(
            &config.kafka,
            &config.publish.checkpoint_topic,
            &config.connector,
            "capture-mongo",
        )
        .await?;
        let publisher = Publisher::start(
            &config.kafka,
            &config.publish,
            "capture-mongo",
            &config.connector,
            publish_metrics.clone(),
        )
        .await?;
        let resume = match checkpoint {
            Some(c) => {
                if !c.replica_set.is_empty() && c.replica_set != replica_set {
                    return Err(CaptureError::Definite(format!(
                        "the checkpoint of connector {:?} was written reading replica set {:?}, \
                         but the source is {:?}: its positions mean nothing here. Use a new \
                         connector name (and re-snapshot) for a new source.",
                        config.connector, c.replica_set, replica_set
                    )));
                }
                let ts = Timestamp {
                    time: c.ts.0,
                    increment: c.ts.1,
                };
                tracing::info!(ts = %ts_string(ts), token = c.resume_token.is_some(), "resuming from the checkpoint");
                match (&c.resume_token, config.mongodb.mode) {
                    (Some(hex), Mode::ChangeStream) => {
                        Resume::Token(token_from_hex(hex).map_err(CaptureError::Definite)?, ts)
                    }
                    _ => Resume::After(ts),
                }
            }
            None => match parse_point(&config.mongodb.start).map_err(CaptureError::Definite)? {
                StartAt::Now => Resume::Now,
                StartAt::Time(t) => Resume::At(t),
            },
        };
        Ok(Self {
            source: v1::Source {
                kind: v1::SourceKind::Mongodb as i32,
                connector: config.connector.clone(),
                server_id: 0,
                server_uuid_or_replica_set: replica_set,
            },
            client,
            publisher,
            publish_metrics,
            metrics,
            filter,
            topics,
            namespaces: HashMap::new(),
            resume,
            end,
            tx: None,
            since_mark: 0,
            last_ts: None,
            last_token: None,
            marked: None,
            partial_txn: Vec::new(),
            buf: Vec::with_capacity(4096),
            config,
        })
    }

    /// Read until shutdown (or `[mongodb] end`), then wait for every event to be acknowledged
    /// and store the last checkpoint.
    pub async fn run(mut self, shutdown: Shutdown) -> Result<(), CaptureError> {
        let result = match self.config.mongodb.mode {
            Mode::ChangeStream => self.read_change_stream(&shutdown).await,
            Mode::Oplog => self.read_oplog(&shutdown).await,
        };
        if let Err(e) = &result {
            self.publish_metrics
                .errors
                .with_label_values(&[match e {
                    CaptureError::Mongo(_) => "mongodb",
                    CaptureError::Publish(_) => "kafka",
                    CaptureError::Definite(_) => "definite",
                }])
                .inc();
        }
        if result.is_ok() {
            self.mark().await?;
        }
        let last = self.publisher.finish().await;
        match (&result, last) {
            (_, Ok(Some(c))) => {
                tracing::info!(ts = %format!("{}.{}", c.ts.0, c.ts.1), "last checkpoint stored")
            }
            (_, Ok(None)) => {}
            (Ok(()), Err(e)) => return Err(e.into()),
            (Err(_), Err(e)) => tracing::error!(error = %e, "storing the last checkpoint failed"),
        }
        result
    }

    fn scope(&self) -> (Option<&str>, Option<&str>) {
        let m = &self.config.mongodb;
        fn opt(s: &str) -> Option<&str> {
            (!s.is_empty()).then_some(s)
        }
        (
            opt(&m.database),
            opt(&m.collection).filter(|_| !m.database.is_empty()),
        )
    }

    async fn open_change_stream(
        &self,
        resume: &Resume,
    ) -> Result<ChangeStream<RawDocumentBuf>, CaptureError> {
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
        if self.expanded_events().await {
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
        .map_err(|e| self.history_error(e))?;
        Ok(stream.with_type::<RawDocumentBuf>())
    }

    /// MongoDB 6.0+ (wire version 17) reports create, createIndexes and dropIndexes events when
    /// asked.
    async fn expanded_events(&self) -> bool {
        let hello = self
            .client
            .database("admin")
            .run_command(doc! { "isMaster": 1 })
            .await;
        matches!(hello.map(|h| h.get_i32("maxWireVersion").unwrap_or(0)), Ok(w) if w >= 17)
    }

    /// A resume point the server no longer has is definite; anything else is passed on.
    fn history_error(&self, e: mongodb::error::Error) -> CaptureError {
        if let mongodb::error::ErrorKind::Command(c) = &*e.kind {
            if c.code == 59 {
                return CaptureError::Definite(format!(
                    "the server does not serve change streams at this scope ({}): set \
                     mongodb.database and mongodb.collection, or use mode = \"oplog\"",
                    c.message
                ));
            }
            // ChangeStreamHistoryLost, ChangeStreamFatalError, InvalidResumeToken.
            if matches!(c.code, 286 | 280 | 260) {
                return CaptureError::Definite(format!(
                    "the change stream cannot resume from {} ({}: {}): the source no longer has \
                     that part of its oplog. Re-snapshot, or remove the checkpoint of connector \
                     {:?} to start at mongodb.start.",
                    self.resume_description(),
                    c.code_name,
                    c.message,
                    self.config.connector
                ));
            }
        }
        CaptureError::Mongo(e)
    }

    fn resume_description(&self) -> String {
        match &self.resume {
            Resume::Token(_, ts) => {
                format!("the stored resume token (oplog time {})", ts_string(*ts))
            }
            Resume::After(ts) => format!("oplog time {}", ts_string(*ts)),
            Resume::At(ts) => format!("oplog time {} (mongodb.start)", ts_string(*ts)),
            Resume::Now => "now".into(),
        }
    }

    async fn read_change_stream(&mut self, shutdown: &Shutdown) -> Result<(), CaptureError> {
        let mut resume = self.resume.clone();
        let mut stream = self.open_change_stream(&resume).await?;
        tracing::info!(from = %self.resume_description(), scope = ?self.scope(), "reading the change stream");
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
            match next.map_err(|e| self.history_error(e))? {
                Some(raw) => {
                    let token = stream.resume_token();
                    let ev =
                        change::from_change_stream(&raw, (scope.0.as_deref(), scope.1.as_deref()))
                            .map_err(CaptureError::Definite)?;
                    match ev {
                        StreamEvent::Invalidate => {
                            // The watched collection or database is gone: go on after it.
                            let t = token.ok_or_else(|| {
                                CaptureError::Definite("invalidate event without a token".into())
                            })?;
                            tracing::info!(
                                "change stream invalidated (drop or rename); reopening after it"
                            );
                            let ts = self.last_ts.unwrap_or(Timestamp {
                                time: 0,
                                increment: 0,
                            });
                            resume = Resume::Token(t, ts);
                            stream = self.open_change_stream(&resume).await?;
                        }
                        StreamEvent::Change(c) => {
                            if self.past_end(c.ts) {
                                tracing::info!(end = %self.config.mongodb.end, "reached the end time");
                                return Ok(());
                            }
                            self.last_token = token.clone();
                            self.publish(*c, token.as_ref()).await?;
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
                    if self.idle().await? {
                        return Ok(());
                    }
                }
            }
        }
    }

    /// Nothing new from the source: checkpoint where it stands (unless inside a transaction or
    /// not moved since the last mark). True when the end time has been reached.
    async fn idle(&mut self) -> Result<bool, CaptureError> {
        self.publish_metrics.lag_seconds.set(0);
        let here = self.last_ts.map(|ts| (ts, self.last_token.clone()));
        if self.partial_txn.is_empty() && here != self.marked {
            self.mark().await?;
        }
        let end = self.end_reached_when_idle();
        if end {
            tracing::info!(end = %self.config.mongodb.end, "reached the end time");
        }
        Ok(end)
    }

    fn past_end(&self, ts: Timestamp) -> bool {
        self.end
            .is_some_and(|e| (ts.time, ts.increment) > (e.time, e.increment))
    }

    /// Idle, and the end time is behind us: every change up to it has been read.
    fn end_reached_when_idle(&self) -> bool {
        let Some(e) = self.end else { return false };
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        now > u64::from(e.time) || self.last_ts.is_some_and(|t| self.past_end(t))
    }

    fn advance(&mut self, ts: Timestamp) {
        if self
            .last_ts
            .is_none_or(|l| (ts.time, ts.increment) > (l.time, l.increment))
        {
            self.last_ts = Some(ts);
            self.metrics.oplog_time.set(i64::from(ts.time));
        }
    }

    async fn read_oplog(&mut self, shutdown: &Shutdown) -> Result<(), CaptureError> {
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
                        let now = SystemTime::now()
                            .duration_since(UNIX_EPOCH)
                            .map(|d| d.as_secs() as u32)
                            .unwrap_or(0);
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
                    return Err(CaptureError::Definite(format!(
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
        let await_time = Duration::from_millis(self.config.mongodb.max_await_ms);
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
                let next = tokio::select! {
                    biased;
                    _ = shutdown.wait() => return Ok(()),
                    n = tokio::time::timeout(await_time * 2, cursor.next()) => n,
                };
                match next {
                    Ok(Some(entry)) => {
                        let entry = entry?;
                        let parsed = change::from_oplog(&entry).map_err(CaptureError::Definite)?;
                        if self.past_end(parsed.ts) {
                            tracing::info!(end = %self.config.mongodb.end, "reached the end time");
                            return Ok(());
                        }
                        from = parsed.ts;
                        inclusive = false;
                        if parsed.partial {
                            self.partial_txn.extend(parsed.changes);
                            continue;
                        }
                        let mut changes = std::mem::take(&mut self.partial_txn);
                        changes.extend(parsed.changes);
                        for c in changes {
                            self.publish(c, None).await?;
                        }
                        self.advance(parsed.ts);
                        if self.since_mark >= MARK_EVERY {
                            self.mark().await?;
                        }
                    }
                    // The cursor ended (a server without tailable cursors on the oplog, or the
                    // capped collection rolled over): query again from the last entry.
                    Ok(None) => break,
                    // Nothing new for a while.
                    Err(_) => {
                        if self.idle().await? {
                            return Ok(());
                        }
                    }
                }
            }
            if self.idle().await? {
                return Ok(());
            }
            tokio::select! {
                _ = shutdown.wait() => return Ok(()),
                _ = tokio::time::sleep(await_time.min(Duration::from_millis(200))) => {}
            }
        }
    }

    /// Queue a checkpoint at the last position reached.
    async fn mark(&mut self) -> Result<(), CaptureError> {
        let Some(ts) = self.last_ts else {
            return Ok(());
        };
        let resume_token = match self.config.mongodb.mode {
            Mode::ChangeStream => self.last_token.as_ref().and_then(token_hex),
            Mode::Oplog => None,
        };
        self.publisher
            .mark(Checkpoint {
                ts: (ts.time, ts.increment),
                resume_token,
                replica_set: self.source.server_uuid_or_replica_set.clone(),
                written_at: SystemTime::now()
                    .duration_since(UNIX_EPOCH)
                    .map(|d| d.as_secs())
                    .unwrap_or(0),
            })
            .await?;
        self.since_mark = 0;
        self.marked = Some((ts, self.last_token.clone()));
        Ok(())
    }

    /// Make sure the collection's topic exists and its metrics are there.
    async fn ensure_namespace(&mut self, db: &str, coll: &str) -> Result<(), CaptureError> {
        if self
            .namespaces
            .get(db)
            .is_some_and(|m| m.contains_key(coll))
        {
            return Ok(());
        }
        let topic = self
            .topics
            .topic(db, coll)
            .map_err(|e| CaptureError::Definite(e.to_string()))?;
        let partitions = self.publisher.ensure_topic(&topic, false).await?;
        let m = &self.publish_metrics;
        let counter = |op: &str| m.events.with_label_values(&[db, coll, op]);
        let ns = Namespace {
            topic: topic.into(),
            key_prefix: event_key_prefix(db, coll),
            partitions,
            counters: [
                counter("insert"),
                counter("update"),
                counter("delete"),
                counter("ddl"),
            ],
            bytes: m.bytes.with_label_values(&[db, coll]),
        };
        self.namespaces
            .entry(db.to_string())
            .or_default()
            .insert(coll.to_string(), ns);
        Ok(())
    }

    async fn publish(
        &mut self,
        mut c: Change,
        token: Option<&ResumeToken>,
    ) -> Result<(), CaptureError> {
        self.advance(c.ts);
        let wanted = if c.collection.is_empty() {
            self.filter.wants_database(&c.database)
        } else {
            self.filter.wants(&c.database, &c.collection)
                || c.ddl
                    .as_ref()
                    .and_then(|d| d.to.as_ref())
                    .is_some_and(|(db, coll)| self.filter.wants(db, coll))
        };
        if !wanted || c.collection.starts_with("system.") {
            self.tx = None;
            return Ok(());
        }
        if c.lookup {
            // Read the document as it is now (what `updateLookup` does on change streams).
            self.metrics.lookups.inc();
            let id = c.id().map(|i| i.to_raw_bson());
            let id = id.ok_or_else(|| CaptureError::Definite("update without _id".into()))?;
            let id = Bson::try_from(id).map_err(|e| CaptureError::Definite(e.to_string()))?;
            let found = self
                .client
                .database(&c.database)
                .collection::<RawDocumentBuf>(&c.collection)
                .find_one(doc! { "_id": id })
                .await?;
            c.full_document = found;
        }
        let lag = (now_micros() / 1_000_000 - i64::from(c.ts.time)).max(0);
        self.publish_metrics.lag_seconds.set(lag);
        let transaction = self.transaction(&c);
        let token_bytes = token
            .and_then(token_document)
            .and_then(|d| bson::to_vec(&d).ok())
            .unwrap_or_default();
        let commit_time_micros = c
            .wall_millis
            .map(|m| m * 1000)
            .unwrap_or(i64::from(c.ts.time) * 1_000_000);
        let op = match c.op {
            OpKind::Insert => Op::Insert,
            OpKind::Update | OpKind::Replace => Op::Update,
            OpKind::Delete => Op::Delete,
            OpKind::Ddl => Op::Ddl,
        };
        let key_values = match c.id() {
            Some(id) => {
                let mut wrapped = RawDocumentBuf::new();
                wrapped.append_ref("v", id);
                vec![sluice_proto::value::of(v1::value::Kind::Bson(
                    wrapped.into_bytes(),
                ))]
            }
            None => Vec::new(),
        };
        let update_description = c.update.take().map(|u| v1::UpdateDescription {
            updated_fields: u.updated.into_bytes(),
            removed_fields: u.removed,
            truncated_arrays: u
                .truncated
                .into_iter()
                .map(|(field, new_size)| v1::TruncatedArray { field, new_size })
                .collect(),
        });
        let ddl = c.ddl.take().map(|d| {
            let (new_database, new_table) = d.to.clone().unwrap_or_default();
            (
                v1::Ddl {
                    statement: Bson::Document(d.command)
                        .into_canonical_extjson()
                        .to_string(),
                    schema: None,
                    new_database,
                    new_table,
                    kind: d.kind.to_string(),
                },
                d.to,
            )
        });
        let rename_to = ddl.as_ref().and_then(|(_, to)| to.clone());
        let event = v1::ChangeEvent {
            contract: CONTRACT_VERSION,
            source: Some(self.source.clone()),
            op: op as i32,
            database: c.database.clone(),
            table: c.collection.clone(),
            version: mongo_version(c.ts.time, c.ts.increment),
            position: Some(v1::Position {
                kind: Some(v1::position::Kind::Oplog(v1::OplogPosition {
                    ts_seconds: c.ts.time,
                    ts_increment: c.ts.increment,
                    resume_token: token_bytes,
                })),
            }),
            commit_time_micros,
            capture_time_micros: now_micros(),
            transaction,
            key: (!key_values.is_empty()).then(|| v1::Row {
                values: key_values.clone(),
            }),
            ddl: ddl.map(|(d, _)| d),
            mongo: Some(v1::MongoChange {
                document_key: c
                    .document_key
                    .take()
                    .map(RawDocumentBuf::into_bytes)
                    .unwrap_or_default(),
                full_document: c
                    .full_document
                    .take()
                    .map(RawDocumentBuf::into_bytes)
                    .unwrap_or_default(),
                full_document_before_change: c
                    .before
                    .take()
                    .map(RawDocumentBuf::into_bytes)
                    .unwrap_or_default(),
                update_description,
                operation_type: c.operation_type.clone(),
                lsid: c
                    .lsid
                    .take()
                    .map(RawDocumentBuf::into_bytes)
                    .unwrap_or_default(),
                txn_number: c.txn_number.unwrap_or(0),
            }),
            ..Default::default()
        };
        self.buf.clear();
        event.encode(&mut self.buf).expect("Vec grows");
        let payload = std::mem::take(&mut self.buf);
        self.ensure_namespace(&c.database, &c.collection).await?;
        let ns = &self.namespaces[&c.database][&c.collection];
        let mut key = Vec::with_capacity(ns.key_prefix.len() + 32);
        append_event_key(&ns.key_prefix, &key_values, &mut key);
        ns.bytes.inc_by(payload.len() as u64);
        ns.counters[match c.op {
            OpKind::Insert => 0,
            OpKind::Update | OpKind::Replace => 1,
            OpKind::Delete => 2,
            OpKind::Ddl => 3,
        }]
        .inc();
        if op == Op::Ddl {
            // Every partition sees the command in order with its documents (a rename also
            // every partition of the new name's topic).
            let mut targets = vec![(ns.topic.clone(), ns.partitions)];
            if let Some((db, coll)) = rename_to.filter(|(_, coll)| !coll.is_empty()) {
                self.ensure_namespace(&db, &coll).await?;
                let to = &self.namespaces[&db][&coll];
                targets.push((to.topic.clone(), to.partitions));
            }
            for (topic, partitions) in targets {
                for p in 0..partitions {
                    self.publisher.send(&topic, &key, &payload, Some(p)).await?;
                }
            }
        } else {
            let topic = ns.topic.clone();
            self.publisher.send(&topic, &key, &payload, None).await?;
        }
        self.buf = payload;
        self.since_mark += 1;
        Ok(())
    }

    /// Transaction id (`<lsid.id as hex>:<txnNumber>`) and the event's index in it.
    fn transaction(&mut self, c: &Change) -> Option<v1::Transaction> {
        let (Some(lsid), Some(txn)) = (&c.lsid, c.txn_number) else {
            self.tx = None;
            return None;
        };
        let id_bytes = match lsid.get("id") {
            Ok(Some(bson::RawBsonRef::Binary(b))) => b.bytes.to_vec(),
            _ => lsid.as_bytes().to_vec(),
        };
        let id: String = id_bytes
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect::<String>()
            + ":"
            + &txn.to_string();
        let index = match &mut self.tx {
            Some((cur, n)) if *cur == id => {
                *n += 1;
                *n
            }
            _ => {
                self.tx = Some((id.clone(), 0));
                0
            }
        };
        Some(v1::Transaction {
            id,
            index,
            last: false,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        };
        let json = serde_json::to_string(&c).unwrap();
        assert_eq!(serde_json::from_str::<Checkpoint>(&json).unwrap(), c);
        assert!(token_from_hex("zz").is_err());
    }
}
