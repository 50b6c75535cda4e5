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
//! - A transient failure while reading (a network error, an election, a cursor lost in a
//!   fail-over, a change stream the driver could not resume itself:
//!   [`sluice_common::mongo::transient`]) reopens the change stream or the oplog cursor from the
//!   last position published, the one a checkpoint queued at that moment would hold (the last
//!   change's resume token, or the last oplog entry whose changes were all published), not the
//!   last one Kafka acknowledged: nothing is published again, nothing skipped. The transaction
//!   being published keeps its id and event count; a held `partialTxn` transaction is read again
//!   whole; an oplog entry's documents to look up are read before any of its changes is
//!   published. A snapshot copy goes on after the last document it published; a snapshot is
//!   never taken again. The wait is 0.5 s, doubling up to 5 s (0.5 s again once reading got
//!   further than at the previous failure), until shutdown. Definite errors stop the capture.
//!   (One gap: a change stream opened at `now` on a server that reports no resume token before
//!   its first change, as mongo-java-server, reopens at a later "now" if it fails before then.)
//! - Key = database, collection and `_id`: one document's changes stay on one partition, in
//!   order. DDL events go to every partition of the collection's topic (a rename also to every
//!   partition of the new name's topic), so each partition sees them in order with its rows.

mod change_stream;
mod checkpoint;
mod copy;
mod events;
mod held;
mod oplog;

use std::collections::HashMap;
use std::time::Duration;

use mongodb::bson::Timestamp;
use mongodb::change_stream::event::ResumeToken;
use prometheus::{IntCounter, IntGauge, Registry};
use sluice_common::Shutdown;
use sluice_proto::v1;
use sluice_proto::TopicTemplate;

pub use checkpoint::Checkpoint;
use checkpoint::Resume;

use super::{parse_point, Config, Mode, StartAt, SYSTEM_DATABASES};
use crate::error::{CaptureError, Origin};
use crate::filter::Filter;
use crate::publish::{PublishMetrics, Publisher};
use crate::snapshot::{SnapshotMetrics, SnapshotProgress};

struct StreamMetrics {
    oplog_time: IntGauge,
    lookups: IntCounter,
    reconnects: IntCounter,
    stalled: IntGauge,
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
        let reconnects = IntCounter::new(
            "sluice_capture_reconnects_total",
            "Change streams or oplog cursors re-opened after a transient failure.",
        )?;
        r.register(Box::new(oplog_time.clone()))?;
        r.register(Box::new(lookups.clone()))?;
        r.register(Box::new(reconnects.clone()))?;
        Ok(Self {
            oplog_time,
            lookups,
            reconnects,
            stalled: crate::stall::gauge(r)?,
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
    /// Collections refused since start (a change too large to publish): their later changes
    /// are not published.
    refused: std::collections::HashSet<(String, String)>,
    /// Where the next open reads from: the checkpoint's position or `[mongodb] start`; after a
    /// transient failure, the last position published.
    resume: Resume,
    end: Option<Timestamp>,
    /// Whether the server reports MongoDB 6.0's expanded change events, once it answered: a
    /// reopen asks for the same events as the first open.
    expanded: Option<bool>,
    /// The transaction being published: its id and the next event's index in it.
    tx: Option<(String, u64)>,
    /// Changes read but not marked yet.
    since_mark: usize,
    /// The last position reached: moved once a change is published (for the oplog, once all of
    /// an entry's changes are), or when the source reports an idle position. Checkpoints, and
    /// reopens after a transient failure, go on from here.
    last_ts: Option<Timestamp>,
    last_token: Option<ResumeToken>,
    /// The position of the last mark: an idle source queues no new one until it moves.
    marked: Option<(Timestamp, Option<ResumeToken>)>,
    buf: Vec<u8>,
    snapshot: Option<SnapshotProgress>,
    snapshots_done: Vec<String>,
    snapshot_metrics: SnapshotMetrics,
    /// What `/healthz` answers: a capture that stops moving says so ([`crate::stall`]).
    health: sluice_common::metrics::Health,
    /// Counts every change read and every idle answer from the source, for the stall watch.
    pulse: std::sync::Arc<std::sync::atomic::AtomicU64>,
}

impl Capture {
    pub async fn start(config: Config, registry: &Registry) -> Result<Self, CaptureError> {
        let client = mongodb::Client::with_uri_str(config.mongodb.uri.expose()).await?;
        let (_, hello) = sluice_common::mongo::describe_server(config.mongodb.uri.expose())
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
        // Starting the publisher fences an earlier capture of this connector, then reads the
        // checkpoint (which that one can no longer overwrite).
        let (publisher, checkpoint): (_, Option<Checkpoint>) = Publisher::start(
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
            refused: Default::default(),
            resume,
            end,
            expanded: None,
            tx: None,
            since_mark: 0,
            last_ts: None,
            last_token: None,
            marked: None,
            buf: Vec::with_capacity(4096),
            snapshot: progress,
            snapshots_done,
            snapshot_metrics,
            health: Default::default(),
            pulse: Default::default(),
            config,
        })
    }

    /// Read until shutdown (or `[mongodb] end`), then wait for every event to be acknowledged
    /// and store the last checkpoint. A transient failure reopens from the last position
    /// published, with backoff; a definite one stops.
    /// Report a stall in `health` (the process's `/healthz`) while running.
    pub fn watched(mut self, health: sluice_common::metrics::Health) -> Self {
        self.health = health;
        self
    }

    pub async fn run(mut self, shutdown: Shutdown) -> Result<(), CaptureError> {
        let watch = crate::stall::spawn(crate::stall::Watch {
            health: self.health.clone(),
            stalled: self.metrics.stalled.clone(),
            delivery: self.publisher.delivery(),
            after: std::time::Duration::from_millis(self.config.mongodb.stalled_after_ms),
            probe: probe(self.pulse.clone(), self.publisher.delivery()),
        });
        let result = self.read_until_shutdown(&shutdown).await;
        crate::stall::end(watch, &self.health, &self.metrics.stalled).await;
        self.finish(result).await
    }

    /// Read, reopening after transient failures, until shutdown (or the end) or a failure
    /// that is not.
    async fn read_until_shutdown(&mut self, shutdown: &Shutdown) -> Result<(), CaptureError> {
        let mut backoff = Backoff::default();
        let result = loop {
            let before = self.progress();
            let Err(e) = self.read(shutdown).await else {
                break Ok(());
            };
            self.publish_metrics
                .errors
                .with_label_values(&[e.label()])
                .inc();
            if !e.is_transient() || shutdown.is_triggered() {
                break Err(e);
            }
            self.metrics.reconnects.inc();
            self.resume = self.resume.reopen(
                self.config.mongodb.mode,
                self.last_ts,
                self.last_token.as_ref(),
            );
            let wait = backoff.next(self.progress() != before);
            tracing::warn!(server = %self.config.mongodb.uri, error = %e, from = %self.resume_description(), retry_in = ?wait, "reading MongoDB failed; reopening");
            tokio::select! {
                _ = shutdown.wait() => break Ok(()),
                _ = tokio::time::sleep(wait) => {}
            }
        };
        result
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

    /// How far reading got: the position reached, and the documents of the snapshot under way.
    fn progress(&self) -> (Option<Timestamp>, u64) {
        let copied = self
            .snapshot
            .as_ref()
            .map_or(0, |s| s.tables.values().map(|t| t.rows).sum());
        (self.last_ts, copied)
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

/// The wait before reading again after a transient failure: 0.5 s, doubling up to 5 s, and
/// 0.5 s again once reading got further than at the previous failure.
struct Backoff {
    next: Duration,
}

impl Backoff {
    const FIRST: Duration = Duration::from_millis(500);
    const MAX: Duration = sluice_common::RETRY_MAX;

    fn next(&mut self, progressed: bool) -> Duration {
        if progressed {
            self.next = Self::FIRST;
        }
        let wait = self.next;
        self.next = (wait * 2).min(Self::MAX);
        wait
    }
}

impl Default for Backoff {
    fn default() -> Self {
        Self { next: Self::FIRST }
    }
}

/// The stall watch's look ([`crate::stall`]): a reading stream has a change or an idle answer
/// from the server at least every `max_await_ms`, or hands records to Kafka (a snapshot); one
/// with none of these for the watch's time is stuck, whatever the source does.
fn probe(
    pulse: std::sync::Arc<std::sync::atomic::AtomicU64>,
    delivery: crate::publish::Delivery,
) -> crate::stall::Probe {
    Box::new(move || {
        let at = (
            pulse.load(std::sync::atomic::Ordering::Relaxed) as i64,
            delivery.counts().0 as i64,
        );
        Box::pin(async move {
            crate::stall::Read {
                at,
                caught_up: false,
                meanwhile: "from the source: no change, no idle answer (one comes every \
                            mongodb.max_await_ms) and no record handed to Kafka (a stuck cursor \
                            or server, or Kafka not taking records: see its log)"
                    .into(),
            }
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_to_five_seconds_and_starts_over_after_progress() {
        let mut b = Backoff::default();
        let waits: Vec<u64> = (0..6).map(|_| b.next(false).as_millis() as u64).collect();
        assert_eq!(waits, [500, 1000, 2000, 4000, 5000, 5000]);
        assert_eq!(b.next(true), Duration::from_millis(500));
        assert_eq!(b.next(false), Duration::from_secs(1));
    }
}
