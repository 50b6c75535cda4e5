//! The MongoDB reader: a change stream or the oplog, to change events on Kafka, resumable.
//!
//! [`Capture::run`] takes the snapshots that are due ([`copy`]), then reads the change stream
//! ([`change_stream`]) or tails the oplog ([`oplog`]). Every change goes to Kafka through
//! [`events`]; [`checkpoint`] keeps the position reached and queues the checkpoints.
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

mod change_stream;
mod checkpoint;
mod copy;
mod events;
mod oplog;

use std::collections::HashMap;

use mongodb::bson::Timestamp;
use mongodb::change_stream::event::ResumeToken;
use prometheus::{IntCounter, IntGauge, Registry};
use sluice_common::Shutdown;
use sluice_proto::v1;
use sluice_proto::TopicTemplate;

pub use checkpoint::Checkpoint;
use checkpoint::Resume;

use super::change::Change;
use super::{parse_point, Config, Mode, StartAt, SYSTEM_DATABASES};
use crate::error::{CaptureError, Origin};
use crate::filter::Filter;
use crate::publish::{read_checkpoint, PublishMetrics, Publisher};
use crate::snapshot::{SnapshotMetrics, SnapshotProgress};

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
    namespaces: HashMap<String, HashMap<String, events::Namespace>>,
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
    snapshot_metrics: SnapshotMetrics,
}

impl Capture {
    pub async fn start(config: Config, registry: &Registry) -> Result<Self, CaptureError> {
        let client = mongodb::Client::with_uri_str(&config.mongodb.uri).await?;
        let (_, hello) = sluice_common::mongo::describe_server(&config.mongodb.uri)
            .await
            .map_err(|e| CaptureError::definite(Origin::Mongo, e))?;
        let replica_set = hello.get_str("setName").unwrap_or_default().to_string();
        let filter = Filter::new(&config.filter, SYSTEM_DATABASES)
            .map_err(|(k, m)| CaptureError::definite(Origin::Config, format!("{k}: {m}")))?;
        let topics = config.topics.template()?;
        let point = |s: &str| parse_point(s).map_err(|e| CaptureError::definite(Origin::Config, e));
        let end = match config.mongodb.end.as_str() {
            "" => None,
            s => match point(s)? {
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
        let snapshot_metrics = SnapshotMetrics::new(registry).expect("metrics register once");
        let resume = match checkpoint {
            Some(c) => c.resume(config.mongodb.mode, &replica_set, &config.connector)?,
            None => match point(&config.mongodb.start)? {
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
        let result = self.read(&shutdown).await;
        if let Err(e) = &result {
            self.publish_metrics
                .errors
                .with_label_values(&[e.label()])
                .inc();
        }
        self.finish(result).await
    }

    /// The snapshots that are due, then the changes.
    async fn read(&mut self, shutdown: &Shutdown) -> Result<(), CaptureError> {
        self.snapshots(shutdown).await?;
        if shutdown.is_triggered() {
            return Ok(());
        }
        if self.config.snapshot.stop_after() {
            tracing::info!("snapshot published: stopping (snapshot.mode = \"snapshot\")");
            return Ok(());
        }
        match self.config.mongodb.mode {
            Mode::ChangeStream => self.read_change_stream(shutdown).await,
            Mode::Oplog => self.read_oplog(shutdown).await,
        }
    }

    /// After a clean stop, checkpoint where reading stood; then wait for every event to be
    /// acknowledged and the last checkpoint stored.
    async fn finish(mut self, result: Result<(), CaptureError>) -> Result<(), CaptureError> {
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

    /// The change stream's (database, collection), from `[mongodb]`.
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
}
