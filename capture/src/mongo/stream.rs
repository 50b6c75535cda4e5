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
    /// The snapshot being taken, with each collection's last published `_id`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshot: Option<SnapshotProgress>,
    /// Snapshots finished (`initial`, re-snapshot request ids).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub snapshots_done: Vec<String>,
}

/// A snapshot under way: per `database.collection`, where its copy stands.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapshotProgress {
    pub id: String,
    pub collections: std::collections::BTreeMap<String, CollectionProgress>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CollectionProgress {
    /// The last `_id` published, as hex of the BSON document `{v: _id}`; empty before the first.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub after: String,
    pub docs: u64,
    #[serde(default)]
    pub done: bool,
}

fn hex_bytes(hex: &str) -> Result<Vec<u8>, String> {
    (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(hex.get(i..i + 2).unwrap_or("zz"), 16))
        .collect::<Result<Vec<u8>, _>>()
        .map_err(|e| format!("{hex:?} is not hex: {e}"))
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
    counters: [IntCounter; 5], // insert, update, delete, ddl, snapshot_read
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
    /// The filter's answer per database and collection (it formats the name and runs regexes).
    wanted: HashMap<String, HashMap<String, bool>>,
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
    snapshot: Option<SnapshotProgress>,
    snapshots_done: Vec<String>,
    snapshot_metrics: crate::snapshot::SnapshotMetrics,
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
        let (progress, snapshots_done) = checkpoint
            .as_ref()
            .map(|c| (c.snapshot.clone(), c.snapshots_done.clone()))
            .unwrap_or_default();
        let snapshot_metrics =
            crate::snapshot::SnapshotMetrics::new(registry).expect("metrics register once");
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
            wanted: HashMap::new(),
            resume,
            end,
            tx: None,
            since_mark: 0,
            last_ts: None,
            last_token: None,
            marked: None,
            partial_txn: Vec::new(),
            buf: Vec::with_capacity(4096),
            snapshot: progress,
            snapshots_done,
            snapshot_metrics,
            config,
        })
    }

    /// Read until shutdown (or `[mongodb] end`), then wait for every event to be acknowledged
    /// and store the last checkpoint.
    pub async fn run(mut self, shutdown: Shutdown) -> Result<(), CaptureError> {
        let result = match self.snapshots(&shutdown).await {
            Ok(()) if shutdown.is_triggered() => Ok(()),
            Ok(()) if self.config.snapshot.stop_after() => {
                tracing::info!("snapshot published: stopping (snapshot.mode = \"snapshot\")");
                Ok(())
            }
            Ok(()) => match self.config.mongodb.mode {
                Mode::ChangeStream => self.read_change_stream(&shutdown).await,
                Mode::Oplog => self.read_oplog(&shutdown).await,
            },
            Err(e) => Err(e),
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
        if self.last_ts.is_none() && !inclusive {
            // A new capture stores where it starts before anything else: killed before its
            // first change is checkpointed, it must not start again at a later "now".
            self.advance(from);
            self.mark().await?;
        }
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
                        let parsed =
                            change::from_oplog(cursor.current()).map_err(CaptureError::Definite)?;
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
                    Ok(Ok(false)) => break,
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
                snapshot: self.snapshot.clone(),
                snapshots_done: self.snapshots_done.clone(),
            })
            .await?;
        self.since_mark = 0;
        self.marked = Some((ts, self.last_token.clone()));
        Ok(())
    }

    /// Take the snapshots that are due, one after the other, before streaming: an unfinished
    /// one from the checkpoint, the initial one, a re-snapshot request not yet served. The
    /// stream then starts from where it stood before the copy (for the initial snapshot: the
    /// source's operation time read before the first document), so every change made during
    /// the copy is replayed over the copied documents, which converge.
    async fn snapshots(&mut self, shutdown: &Shutdown) -> Result<(), CaptureError> {
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
                let mut collections = std::collections::BTreeMap::new();
                for name in self.list_collections(&only).await? {
                    collections.insert(name, CollectionProgress::default());
                }
                self.snapshot = Some(SnapshotProgress { id, collections });
            }
            self.snapshot_start_point().await?;
            let snap = self.snapshot.clone().expect("set above");
            tracing::info!(snapshot = %snap.id, collections = snap.collections.len(), "snapshot starts");
            for (name, progress) in &snap.collections {
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
            Resume::At(ts) => {
                // "At" is inclusive: stand just before it.
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
        Err(CaptureError::Definite(
            "the source reports no operation time (operationTime) and has no oplog: a snapshot              needs a replica set to know where to stream from"
                .into(),
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
        let progress = self.snapshot.as_ref().expect("running").collections[name].clone();
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
            .map(|s| s.collections.values().filter(|c| !c.done).count())
            .unwrap_or(0);
        self.snapshot_metrics.tables_remaining.set(remaining as i64);
        if progress.after.is_empty() && self.config.snapshot.copy_indexes {
            self.publish_collection_ddl(&db, &coll, ts).await?;
        }
        let mut filter = doc! {};
        if !progress.after.is_empty() {
            let bytes = hex_bytes(&progress.after).map_err(CaptureError::Definite)?;
            let wrapped = Document::from_reader(bytes.as_slice())
                .map_err(|e| CaptureError::Definite(format!("snapshot position of {name}: {e}")))?;
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
        let mut docs = progress.docs;
        let mut last_log = std::time::Instant::now();
        let mut since = 0u64;
        while let Some(doc) = cursor.next().await {
            let doc = doc?;
            let id = doc
                .get("_id")
                .map_err(|e| CaptureError::Definite(format!("{name}: {e}")))?
                .ok_or_else(|| CaptureError::Definite(format!("{name}: a document without _id")))?;
            let mut key = RawDocumentBuf::new();
            key.append_ref("_id", id);
            let mut wrapped = RawDocumentBuf::new();
            wrapped.append_ref("v", id);
            let mut c = Change::new(OpKind::SnapshotRead, "snapshot", &db, &coll, ts);
            c.document_key = Some(key);
            c.full_document = Some(doc.clone());
            self.publish(c, None).await?;
            rows.inc();
            docs += 1;
            since += 1;
            if since >= u64::from(batch) || last_log.elapsed().as_secs() >= 5 {
                let p = self
                    .snapshot
                    .as_mut()
                    .and_then(|s| s.collections.get_mut(name))
                    .expect("running");
                p.after = wrapped
                    .as_bytes()
                    .iter()
                    .map(|b| format!("{b:02x}"))
                    .collect();
                p.docs = docs;
                since = 0;
                self.mark().await?;
                if last_log.elapsed().as_secs() >= 5 {
                    last_log = std::time::Instant::now();
                    let rate = (docs - progress.docs) as f64 / started.elapsed().as_secs_f64();
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
        }
        let p = self
            .snapshot
            .as_mut()
            .and_then(|s| s.collections.get_mut(name))
            .expect("running");
        p.docs = docs;
        p.done = true;
        self.mark().await?;
        tracing::info!(collection = %name, docs, seconds = started.elapsed().as_secs_f64(), "collection copied");
        Ok(true)
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
        let indexes = database
            .run_command(doc! { "listIndexes": coll })
            .await
            .ok()
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
                counter("snapshot_read"),
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
            self.wants(&c.database, &c.collection)
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
        let now = now_micros();
        let lag = (now / 1_000_000 - i64::from(c.ts.time)).max(0);
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
            OpKind::SnapshotRead => Op::SnapshotRead,
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
        self.ensure_namespace(&c.database, &c.collection).await?;
        let mut key = Vec::with_capacity(64);
        append_event_key(
            &self.namespaces[&c.database][&c.collection].key_prefix,
            &key_values,
            &mut key,
        );
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
            database: std::mem::take(&mut c.database),
            table: std::mem::take(&mut c.collection),
            version: mongo_version(c.ts.time, c.ts.increment),
            position: Some(v1::Position {
                kind: Some(v1::position::Kind::Oplog(v1::OplogPosition {
                    ts_seconds: c.ts.time,
                    ts_increment: c.ts.increment,
                    resume_token: token_bytes,
                })),
            }),
            commit_time_micros,
            capture_time_micros: now,
            transaction,
            key: (!key_values.is_empty()).then_some(v1::Row { values: key_values }),
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
                operation_type: std::mem::take(&mut c.operation_type),
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
        let ns = &self.namespaces[&event.database][&event.table];
        ns.bytes.inc_by(payload.len() as u64);
        ns.counters[match c.op {
            OpKind::Insert => 0,
            OpKind::Update | OpKind::Replace => 1,
            OpKind::Delete => 2,
            OpKind::Ddl => 3,
            OpKind::SnapshotRead => 4,
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
            self.publisher.send(&ns.topic, &key, &payload, None).await?;
        }
        self.buf = payload;
        self.since_mark += 1;
        Ok(())
    }

    /// [`Filter::wants`], remembered per collection.
    fn wants(&mut self, db: &str, coll: &str) -> bool {
        if let Some(w) = self.wanted.get(db).and_then(|m| m.get(coll)) {
            return *w;
        }
        let w = self.filter.wants(db, coll);
        self.wanted
            .entry(db.to_string())
            .or_default()
            .insert(coll.to_string(), w);
        w
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
            snapshot: None,
            snapshots_done: vec![],
        };
        let json = serde_json::to_string(&c).unwrap();
        assert!(!json.contains("snapshot"));
        assert_eq!(serde_json::from_str::<Checkpoint>(&json).unwrap(), c);
        // A snapshot under way: the last _id as hex of {v: _id}.
        let mut wrapped = RawDocumentBuf::new();
        wrapped.append("v", "k-42");
        let after: String = wrapped
            .as_bytes()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        let mut collections = std::collections::BTreeMap::new();
        collections.insert(
            "db.c".to_string(),
            CollectionProgress {
                after: after.clone(),
                docs: 7,
                done: false,
            },
        );
        let c = Checkpoint {
            snapshot: Some(SnapshotProgress {
                id: "initial".into(),
                collections,
            }),
            ..c
        };
        let json = serde_json::to_string(&c).unwrap();
        assert_eq!(serde_json::from_str::<Checkpoint>(&json).unwrap(), c);
        let back = Document::from_reader(hex_bytes(&after).unwrap().as_slice()).unwrap();
        assert_eq!(back.get_str("v").unwrap(), "k-42");
        assert!(hex_bytes("0g").is_err());
        assert!(token_from_hex("zz").is_err());
    }
}
