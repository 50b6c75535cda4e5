//! What both apply binaries do with Kafka: the consumer group's context (lag metrics, the
//! batch in hand written before partitions are let go), offsets stored after the write, and
//! dead letters.

use std::collections::HashMap;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use prometheus::{
    Histogram, HistogramOpts, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry,
};
use rdkafka::consumer::{
    BaseConsumer, CommitMode, Consumer, ConsumerContext, Rebalance, StreamConsumer,
};
use rdkafka::error::KafkaResult;
use rdkafka::message::{BorrowedMessage, Header, OwnedHeaders};
use rdkafka::producer::{BaseProducer, FutureProducer, FutureRecord};
use rdkafka::ClientConfig;
use rdkafka::{ClientContext, Message};
use sluice_common::Shutdown;

/// topic -> partition -> offset of the last event handled. Stored once the batch holding it is
/// written: librdkafka's `rd_kafka_offset_store` commits that offset + 1, the next to read.
#[derive(Debug, Default, Clone)]
// (foldhash, not SipHash: every record's offset is recorded here)
pub struct Offsets(pub foldhash::HashMap<String, foldhash::HashMap<i32, i64>>);

impl Offsets {
    pub fn record<M: Message>(&mut self, m: &M) {
        match self.0.get_mut(m.topic()) {
            Some(p) => {
                p.insert(m.partition(), m.offset());
            }
            None => {
                self.0.insert(
                    m.topic().to_string(),
                    [(m.partition(), m.offset())].into_iter().collect(),
                );
            }
        }
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Add `later`'s offsets (of events after these): per partition the later one wins.
    pub fn merge(&mut self, later: Offsets) {
        for (topic, partitions) in later.0 {
            self.0.entry(topic).or_default().extend(partitions);
        }
    }

    /// Store every partition's offset, with the capture incarnations reached there as the
    /// commit's metadata ([`crate::incarnation`]).
    pub fn store<D, C>(&self, consumer: &C)
    where
        D: Drain,
        C: Consumer<GroupContext<D>>,
    {
        let incarnations = &consumer.context().incarnations;
        for (topic, partitions) in &self.0 {
            for (partition, last) in partitions {
                let stored = match incarnations
                    .at(topic, *partition, *last)
                    .and_then(|known| crate::incarnation::metadata(&known))
                {
                    None => consumer.store_offset(topic, *partition, *last),
                    Some(metadata) => {
                        let mut tpl = rdkafka::TopicPartitionList::with_capacity(1);
                        tpl.add_partition_offset(
                            topic,
                            *partition,
                            rdkafka::Offset::Offset(*last + 1),
                        )
                        .and_then(|()| {
                            let mut e = tpl
                                .find_partition(topic, *partition)
                                .expect("the partition just added");
                            e.set_metadata(metadata);
                            consumer.store_offsets(&tpl)
                        })
                    }
                };
                if let Err(e) = stored {
                    // The partition was revoked meanwhile: its next owner reads it again.
                    tracing::debug!(topic, partition, error = %e, "offset not stored");
                }
            }
        }
    }
}

/// What a sink does when its partitions are about to go: write the batch in hand and return
/// its offsets, or `None` when there was nothing (or the write failed, so the next owner reads
/// those events again).
pub trait Drain: Send + Sync + 'static {
    fn drain(&self) -> Option<Offsets>;

    /// Partitions were just assigned (from the rebalance callback, before any of their events
    /// is delivered).
    fn assigned(&self, _partitions: &rdkafka::TopicPartitionList) {}
}

/// The consumer group metrics every apply binary serves.
#[derive(Clone)]
pub struct GroupMetrics {
    pub lag: IntGaugeVec,
    pub assigned: IntGauge,
    /// `sluice_apply_lag_seconds`: how far behind the source the target is.
    pub lag_seconds: prometheus::Gauge,
    /// `sluice_apply_consumer_rejoins_total`: consumers replaced after a fatal error.
    pub rejoins: IntCounter,
    /// `sluice_apply_stale_capture_records_total`: a taken-over capture's late records skipped.
    pub stale_capture_records: IntCounter,
    /// What the sink wrote, per partition, and what it is writing: for the lag in seconds.
    progress: Arc<std::sync::Mutex<Progress>>,
}

/// What the sink wrote and is writing, as the lag in seconds needs it.
#[derive(Default)]
struct Progress {
    /// Per partition: the last offset written, and the oldest source commit time (µs) of the
    /// batch that wrote it (a bound below every event of the partition not yet written).
    written: HashMap<(String, i32), (i64, Option<i64>)>,
    /// The oldest source commit time (µs) of the batch being written (0: none is).
    writing_since: i64,
}

impl GroupMetrics {
    pub fn new(r: &Registry) -> prometheus::Result<Self> {
        let lag = IntGaugeVec::new(
            Opts::new(
                "sluice_apply_consumer_lag_messages",
                "Messages behind the partition's end, by topic and partition.",
            ),
            &["topic", "partition"],
        )?;
        let assigned = IntGauge::new(
            "sluice_apply_assigned_partitions",
            "Partitions this instance holds in its consumer group.",
        )?;
        let lag_seconds = prometheus::Gauge::new(
            "sluice_apply_lag_seconds",
            "How old the oldest event not yet written is, over the partitions this instance \
             holds (0 when every event is written); it grows while the target refuses writes.",
        )?;
        r.register(Box::new(lag.clone()))?;
        r.register(Box::new(assigned.clone()))?;
        let rejoins = IntCounter::new(
            "sluice_apply_consumer_rejoins_total",
            "Times the Kafka consumer hit a fatal error (fenced: another member with the same \
             consumer.instance_id, or a session that timed out) and a new one joined the group.",
        )?;
        let stale_capture_records = IntCounter::new(
            "sluice_apply_stale_capture_records_total",
            "Records skipped because a later incarnation of their capture (a standby that took \
             over, or a restart) had already written to the partition: a revived old capture's \
             late records, whose content the successor re-sent.",
        )?;
        r.register(Box::new(lag_seconds.clone()))?;
        r.register(Box::new(rejoins.clone()))?;
        r.register(Box::new(stale_capture_records.clone()))?;
        Ok(Self {
            lag,
            assigned,
            lag_seconds,
            rejoins,
            stale_capture_records,
            progress: Arc::default(),
        })
    }

    /// A batch whose oldest event has source commit time `oldest` (µs) is being written.
    pub fn writing(&self, oldest: Option<i64>) {
        let mut p = self.progress.lock().expect("progress lock");
        if let Some(o) = oldest.filter(|o| *o > 0) {
            p.writing_since = if p.writing_since == 0 {
                o
            } else {
                p.writing_since.min(o)
            };
        }
    }

    /// The batch with these offsets, whose oldest event has source commit time `oldest`, is
    /// written.
    pub fn written(&self, offsets: &Offsets, oldest: Option<i64>) {
        let mut p = self.progress.lock().expect("progress lock");
        p.writing_since = 0;
        let oldest = oldest.filter(|o| *o > 0);
        for (topic, partitions) in &offsets.0 {
            for (partition, offset) in partitions {
                // (a batch of heartbeats alone moves the offset, not the time)
                let e = p
                    .written
                    .entry((topic.clone(), *partition))
                    .or_insert((*offset, None));
                *e = (*offset, oldest.or(e.1));
            }
        }
    }
}

/// The lag in seconds of one partition, from what is known of it (times in µs): none when
/// nothing is left to write; else the smaller of the age of the oldest event of the last batch
/// written on it and the time since it was last seen with nothing left; unknown when neither
/// is known (a partition not written since the start: the batch being written says it then).
fn partition_lag(
    now: i64,
    left: bool,
    written_oldest: Option<i64>,
    caught_up_at: Option<i64>,
) -> Option<i64> {
    if !left {
        return Some(0);
    }
    match (written_oldest, caught_up_at) {
        (None, None) => None,
        (a, b) => Some(now - a.unwrap_or(i64::MIN).max(b.unwrap_or(i64::MIN))),
    }
}

/// The stage's lag in seconds: the largest of its partitions' and the age of the batch being
/// written.
fn lag_seconds(
    now: i64,
    partitions: impl IntoIterator<Item = Option<i64>>,
    writing_since: i64,
) -> f64 {
    let mut worst = partitions.into_iter().flatten().max().unwrap_or(0);
    if writing_since > 0 {
        worst = worst.max(now - writing_since);
    }
    worst.max(0) as f64 / 1e6
}

/// Every 5 s, the lag of each assigned partition (its end minus the committed offset, or minus
/// its start when nothing is committed yet), computed here rather than from librdkafka's
/// statistics: those are served only while the stage polls, and say nothing before a first
/// commit, so a stage stuck on its target would show no lag at all.
async fn watch_lag<C: ConsumerContext + 'static>(
    consumer: Arc<StreamConsumer<C>>,
    metrics: GroupMetrics,
    timeout: Duration,
) {
    // Per partition: when it was last seen with nothing left to write (µs).
    let mut caught_up: HashMap<(String, i32), i64> = HashMap::new();
    loop {
        tokio::time::sleep(Duration::from_secs(5)).await;
        let c = consumer.clone();
        let lags = tokio::task::spawn_blocking(move || -> Vec<(String, i32, i64, i64)> {
            let Ok(assigned) = c.assignment() else {
                return Vec::new();
            };
            let committed = c.committed_offsets(assigned.clone(), timeout).ok();
            let mut out = Vec::new();
            for e in assigned.elements() {
                let Ok((low, high)) = c.fetch_watermarks(e.topic(), e.partition(), timeout) else {
                    continue;
                };
                let at = committed
                    .as_ref()
                    .and_then(|t| t.find_partition(e.topic(), e.partition()))
                    .and_then(|p| match p.offset() {
                        rdkafka::Offset::Offset(n) => Some(n),
                        _ => None,
                    })
                    .unwrap_or(low);
                out.push((
                    e.topic().to_string(),
                    e.partition(),
                    (high - at).max(0),
                    high,
                ));
            }
            out
        })
        .await
        .unwrap_or_default();
        if lags.is_empty() {
            continue;
        }
        let now = sluice_common::clock::now_micros();
        let (written, writing_since) = {
            let p = metrics.progress.lock().expect("progress lock");
            let written: Vec<Option<(i64, Option<i64>)>> = lags
                .iter()
                .map(|(t, part, ..)| p.written.get(&(t.clone(), *part)).copied())
                .collect();
            (written, p.writing_since)
        };
        let mut each = Vec::with_capacity(lags.len());
        for ((topic, partition, lag, high), written) in lags.iter().zip(written) {
            metrics
                .lag
                .with_label_values(&[topic, &partition.to_string()])
                .set(*lag);
            // Left to write: past the last offset written (the committed offset trails it by
            // up to the commit interval), or past the committed one when nothing was written.
            let left = match written {
                Some((offset, _)) => *high > offset + 1,
                None => *lag > 0,
            };
            let key = (topic.clone(), *partition);
            if !left {
                caught_up.insert(key.clone(), now);
            }
            each.push(partition_lag(
                now,
                left,
                written.and_then(|(_, t)| t),
                caught_up.get(&key).copied(),
            ));
        }
        metrics
            .lag_seconds
            .set(lag_seconds(now, each, writing_since));
    }
}

/// The metrics every sink serves, under the same names (docs/apply-clickhouse.md and
/// docs/apply-mongo.md), with help texts that name the target.
pub struct SinkMetrics {
    /// `sluice_apply_batch_rows`: events per written batch.
    pub batch_rows: Histogram,
    /// `sluice_apply_batch_duration_seconds`.
    pub batch_seconds: Histogram,
    /// `sluice_apply_retries_total`.
    pub retries: IntCounter,
    /// `sluice_apply_dead_letters_total`, by [`crate::error::Reason::label`].
    pub dead_letters: IntCounterVec,
    /// `sluice_apply_end_to_end_latency_seconds`.
    pub latency: Histogram,
}

impl SinkMetrics {
    /// Register them in `r`. `target` names the server in the help texts ("ClickHouse"),
    /// `batch` says what a batch write is and `retries` what is retried.
    pub fn new(r: &Registry, target: &str, batch: &str, retries: &str) -> prometheus::Result<Self> {
        let batch_rows = Histogram::with_opts(
            HistogramOpts::new(
                "sluice_apply_batch_rows",
                "Rows (events) per written batch.",
            )
            .buckets(vec![1.0, 10.0, 100.0, 1e3, 1e4, 5e4, 1e5, 2e5, 5e5, 1e6]),
        )?;
        let batch_seconds = Histogram::with_opts(HistogramOpts::new(
            "sluice_apply_batch_duration_seconds",
            format!("Time to write one batch ({batch}), retries included."),
        ))?;
        let retries = IntCounter::new("sluice_apply_retries_total", retries)?;
        let dead_letters = IntCounterVec::new(
            Opts::new(
                "sluice_apply_dead_letters_total",
                "Events sent to the dead-letter topic, by reason.",
            ),
            &["reason"],
        )?;
        for reason in crate::error::Reason::ALL {
            dead_letters.with_label_values(&[reason.label()]);
        }
        let latency = Histogram::with_opts(
            HistogramOpts::new(
                "sluice_apply_end_to_end_latency_seconds",
                format!("Source commit to the batch acknowledged by {target}."),
            )
            .buckets(vec![
                0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 300.0,
            ]),
        )?;
        r.register(Box::new(batch_rows.clone()))?;
        r.register(Box::new(batch_seconds.clone()))?;
        r.register(Box::new(retries.clone()))?;
        r.register(Box::new(dead_letters.clone()))?;
        r.register(Box::new(latency.clone()))?;
        Ok(Self {
            batch_rows,
            batch_seconds,
            retries,
            dead_letters,
            latency,
        })
    }
}

/// Consumer context: publishes the lag from librdkafka's statistics, logs rebalances, and
/// drains the sink before partitions are revoked.
pub struct GroupContext<D> {
    pub metrics: GroupMetrics,
    pub drain: D,
    /// Set at an assignment when a partition's committed offset is below its first offset:
    /// the events in between expired (retention) before they were written. The stage stops
    /// before it handles any event.
    pub expired: Arc<std::sync::Mutex<Option<String>>>,
    expired_flag: std::sync::atomic::AtomicBool,
    /// Set once this consumer is replaced ([`BatchSink::rejoin`]): its callbacks no longer
    /// touch the sink's batch, which belongs to the new consumer.
    retired: std::sync::atomic::AtomicBool,
    /// The capture incarnations seen per partition: records of a taken-over capture arriving
    /// after its successor's are skipped ([`crate::incarnation`]).
    pub incarnations: crate::incarnation::Incarnations,
}

impl<D> GroupContext<D> {
    pub fn new(metrics: GroupMetrics, drain: D) -> Self {
        Self {
            metrics,
            drain,
            expired: Default::default(),
            expired_flag: Default::default(),
            retired: Default::default(),
            incarnations: Default::default(),
        }
    }

    /// This consumer is being replaced: from now on its rebalances leave the sink alone.
    pub fn retire(&self) {
        self.retired
            .store(true, std::sync::atomic::Ordering::SeqCst);
    }

    fn is_retired(&self) -> bool {
        self.retired.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Why the stage must stop (events expired unread), if it must.
    fn expired(&self) -> Option<String> {
        if !self.expired_flag.load(std::sync::atomic::Ordering::Relaxed) {
            return None;
        }
        self.expired.lock().expect("expired lock").clone()
    }

    /// Partitions of `tpl` whose committed offset is below their first offset, with both.
    /// Learns on the way the capture incarnations each committed offset carries.
    fn expired_in(
        &self,
        consumer: &BaseConsumer<Self>,
        tpl: &rdkafka::TopicPartitionList,
    ) -> Result<Vec<String>, String>
    where
        Self: ConsumerContext,
    {
        let timeout = Duration::from_secs(10);
        // Each request tried three times: unanswered, the check cannot be skipped (librdkafka
        // would reset to the earliest offset without a word).
        fn tried<T>(mut f: impl FnMut() -> KafkaResult<T>) -> KafkaResult<T> {
            let mut last = f();
            for _ in 0..2 {
                if last.is_ok() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(500));
                last = f();
            }
            last
        }
        let committed = tried(|| consumer.committed_offsets(tpl.clone(), timeout))
            .map_err(|e| format!("the committed offsets: {e}"))?;
        let mut out = Vec::new();
        for e in committed.elements() {
            if let Some(known) = crate::incarnation::from_metadata(e.metadata()) {
                self.incarnations.assigned(e.topic(), e.partition(), known);
            }
            let rdkafka::Offset::Offset(at) = e.offset() else {
                continue; // nothing committed: a new group starts at the beginning
            };
            let (low, _) = tried(|| consumer.fetch_watermarks(e.topic(), e.partition(), timeout))
                .map_err(|err| {
                format!(
                    "the first offset of {} partition {}: {err}",
                    e.topic(),
                    e.partition()
                )
            })?;
            if at < low {
                out.push(format!(
                    "{} partition {}: committed offset {at}, first offset now {low} ({} events expired unread)",
                    e.topic(),
                    e.partition(),
                    low - at
                ));
            }
        }
        Ok(out)
    }
}

/// "No topic matches the subscription yet": the normal start of a new pipeline, before the
/// capture created its topics (they are found at the next metadata refresh).
fn no_topic_yet(e: &rdkafka::error::KafkaError) -> bool {
    e.rdkafka_error_code() == Some(rdkafka::types::RDKafkaErrorCode::UnknownTopicOrPartition)
}

impl<D: Drain> ClientContext for GroupContext<D> {
    fn error(&self, error: rdkafka::error::KafkaError, reason: &str) {
        if no_topic_yet(&error) {
            tracing::info!(%reason, "no topic of the subscription exists yet (a new pipeline: the capture creates them); waiting");
        } else {
            tracing::error!("librdkafka: {error}: {reason}");
        }
    }
}

impl<D: Drain> ConsumerContext for GroupContext<D> {
    fn pre_rebalance(&self, consumer: &BaseConsumer<Self>, r: &Rebalance<'_>) {
        tracing::info!("rebalance: {}", describe_rebalance(r));
        if self.is_retired() {
            return;
        }
        if let Rebalance::Revoke(_) = r {
            let drained = self.drain.drain();
            if consumer.assignment_lost() {
                // The session timed out: the partitions may already be another member's, and
                // this member's id is gone. What was written is not stored (the next owner
                // reads it again, harmlessly); a commit now would carry the old member id,
                // which the broker refuses, for a static member (`consumer.instance_id`) with
                // a fatal error.
                tracing::warn!(
                    "the group session timed out: the partitions were lost; the batch in hand \
                     was written, and its events are read again by their next owner"
                );
            } else if let Some(offsets) = drained {
                offsets.store(consumer);
                if let Err(e) = consumer.commit_consumer_state(CommitMode::Sync) {
                    tracing::warn!(error = %e, "commit before letting partitions go failed");
                }
            }
        }
    }

    fn post_rebalance(&self, consumer: &BaseConsumer<Self>, r: &Rebalance<'_>) {
        if self.is_retired() {
            return;
        }
        match r {
            Rebalance::Assign(tpl) => {
                self.metrics.assigned.set(tpl.count() as i64);
                self.drain.assigned(tpl);
                let why = match self.expired_in(consumer, tpl) {
                    Ok(expired) if expired.is_empty() => None,
                    Ok(expired) => Some(format!(
                        "events expired from Kafka (the topic's retention) before this group \
                         wrote them: {}. Reading on would skip them. Re-snapshot the tables \
                         (the capture's snapshot.request_id and snapshot.tables), then reset the \
                         group's offsets (kafka-consumer-groups --reset-offsets --to-earliest) \
                         and start again; keep outages of the apply stage shorter than the \
                         retention",
                        expired.join("; ")
                    )),
                    Err(what) => Some(format!(
                        "could not read {what} at the assignment, so whether events expired from \
                         Kafka before this group wrote them is unknown; stopping rather than let \
                         the consumer reset past them. Start again once the brokers answer"
                    )),
                };
                if let Some(why) = why {
                    tracing::error!(%why, "offsets past the retention, or not checked");
                    *self.expired.lock().expect("expired lock") = Some(why);
                    self.expired_flag
                        .store(true, std::sync::atomic::Ordering::Relaxed);
                }
            }
            Rebalance::Revoke(_) => {
                self.metrics.assigned.set(0);
                self.incarnations.clear();
            }
            Rebalance::Error(_) => {}
        }
    }
}

/// A rebalance for the log: `assigned partitions=topic[0,1,2] other[0]`,
/// `revoked partitions=...`, or the error.
fn describe_rebalance(r: &Rebalance<'_>) -> String {
    match r {
        Rebalance::Assign(tpl) => format!("assigned partitions={}", partition_list(tpl)),
        Rebalance::Revoke(tpl) => format!("revoked partitions={}", partition_list(tpl)),
        Rebalance::Error(e) => format!("error: {e}"),
    }
}

/// `topic[0,1,2] other[0]`, topics in name order, partitions in number order; `none` when
/// empty.
fn partition_list(tpl: &rdkafka::TopicPartitionList) -> String {
    let mut by_topic: std::collections::BTreeMap<String, Vec<i32>> = Default::default();
    for e in tpl.elements() {
        by_topic
            .entry(e.topic().to_string())
            .or_default()
            .push(e.partition());
    }
    if by_topic.is_empty() {
        return "none".into();
    }
    by_topic
        .into_iter()
        .map(|(topic, mut ps)| {
            ps.sort_unstable();
            let ps: Vec<String> = ps.iter().map(ToString::to_string).collect();
            format!("{topic}[{}]", ps.join(","))
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// The target failing for a while: after `after`, `/healthz` says degraded with the last
/// failure; the next success makes it healthy again.
pub struct Outage {
    health: sluice_common::metrics::Health,
    after: Duration,
    since: std::sync::Mutex<Option<Instant>>,
}

impl Outage {
    pub fn new(health: sluice_common::metrics::Health, after: Duration) -> Arc<Self> {
        Arc::new(Self {
            health,
            after,
            since: std::sync::Mutex::new(None),
        })
    }

    /// A write or statement failed for now (it is retried).
    pub fn failing(&self, what: &str) {
        let mut since = self.since.lock().expect("outage lock");
        let start = *since.get_or_insert_with(Instant::now);
        if start.elapsed() >= self.after {
            self.health.degrade(format!(
                "the target has not taken a write for {} s: {what}",
                start.elapsed().as_secs()
            ));
        }
    }

    /// A write or statement succeeded.
    pub fn ok(&self) {
        let mut since = self.since.lock().expect("outage lock");
        if since.take().is_some() {
            self.health.restore();
        }
    }
}

/// How long closing the Kafka consumer (leaving the group) may take at shutdown.
pub const CLOSE_WITHIN: Duration = Duration::from_secs(20);

/// Drop `sink` (closing its consumer: leaving the group, librdkafka's own teardown) on a
/// thread of its own, waiting at most [`CLOSE_WITHIN`]. The offsets are committed before (the
/// run's end), so a close that hangs loses nothing: the stage exits without waiting for it
/// (its partitions go to another member once the session times out) rather than hang a
/// shutdown.
pub async fn close_within<S: Send + 'static>(sink: S, what: &str) {
    let (tx, rx) = tokio::sync::oneshot::channel();
    let spawned = std::thread::Builder::new()
        .name("consumer-close".into())
        .spawn(move || {
            drop(sink);
            let _ = tx.send(());
        });
    if spawned.is_err() {
        return;
    }
    if tokio::time::timeout(CLOSE_WITHIN, rx).await.is_err() {
        tracing::warn!(
            within = ?CLOSE_WITHIN,
            "closing the {what} Kafka consumer did not finish in time; exiting without waiting (the offsets are committed)"
        );
    }
}

/// Whether consumer group `group` has run before: the broker knows it (with members, or with
/// committed offsets only). A stage of such a group that cannot reach its target at start is
/// restarting during an outage, and waits; a first start fails fast (a wrong address).
pub async fn group_has_run(
    kafka: &sluice_common::KafkaConfig,
    client_id: &str,
    group: &str,
) -> bool {
    let config = kafka.client_config(client_id);
    let (group, timeout) = (group.to_string(), kafka.request_timeout());
    tokio::task::spawn_blocking(move || {
        let consumer: BaseConsumer = match config.create() {
            Ok(c) => c,
            Err(_) => return false,
        };
        consumer
            .fetch_group_list(Some(&group), timeout)
            .map(|l| {
                l.groups()
                    .iter()
                    .any(|g| g.name() == group && g.state() != "Dead" && !g.state().is_empty())
            })
            .unwrap_or(false)
    })
    .await
    .unwrap_or(false)
}

/// Run `fut` to completion from a rebalance callback: those run inside the consumer's poll,
/// either on a runtime worker (block in place) or on a plain thread.
pub fn block_on<F: std::future::Future>(runtime: &tokio::runtime::Handle, fut: F) -> F::Output {
    if tokio::runtime::Handle::try_current().is_ok() {
        tokio::task::block_in_place(|| runtime.block_on(fut))
    } else {
        runtime.block_on(fut)
    }
}

/// The largest dead letter: as large as the largest event a capture writes.
pub const DEAD_LETTER_MAX_BYTES: usize = 64 << 20;

/// Sends events that can never be written to the dead-letter topic, with the reason and where
/// they came from in headers (`sluice.reason`, its label `sluice.reason.kind`, `sluice.topic`,
/// `sluice.partition`, `sluice.offset`); the payload and key are the original ones
/// ([`crate::replay`] reads them back).
///
/// The producer is made at the first dead letter. rdkafka's producer keeps a thread polling
/// in 100 ms slices, and each slice's last millisecond spins (the remaining time is rounded
/// down to 0 ms): about 1 % of a core for a producer that, here, mostly never sends.
#[derive(Clone)]
pub struct DeadLetters {
    config: ClientConfig,
    producer: Arc<OnceLock<FutureProducer>>,
    topic: Arc<str>,
}

impl DeadLetters {
    /// Checks the producer's settings now (librdkafka refuses bad ones when a client is made),
    /// so that a mistake stops the stage at start, not at its first dead letter.
    pub fn new(config: ClientConfig, topic: &str) -> KafkaResult<Self> {
        let _check: BaseProducer = config.create()?;
        Ok(DeadLetters {
            config,
            producer: Arc::new(OnceLock::new()),
            topic: topic.into(),
        })
    }

    /// The dead-letter topic of a stage: its producer's settings checked, and the topic made
    /// (one partition, sized for [`DEAD_LETTER_MAX_BYTES`]) unless it exists.
    pub async fn start(
        kafka: &sluice_common::KafkaConfig,
        client_id: &str,
        topic: &str,
    ) -> Result<Self, crate::error::ApplyError> {
        use crate::error::{ApplyError, Origin};
        let dead = DeadLetters::new(
            kafka
                .producer_config(client_id)
                .set("message.max.bytes", DEAD_LETTER_MAX_BYTES.to_string())
                .clone(),
            topic,
        )?;
        kafka
            .ensure_topic(client_id, topic, 1, -1, false, Some(DEAD_LETTER_MAX_BYTES))
            .await
            .map_err(|e| ApplyError::definite(Origin::Kafka, e))?;
        Ok(dead)
    }

    fn producer(&self) -> Result<&FutureProducer, String> {
        if let Some(p) = self.producer.get() {
            return Ok(p);
        }
        let p = self
            .config
            .create()
            .map_err(|e| format!("could not make the dead-letter producer: {e}"))?;
        // Another task may have made one meanwhile: either serves.
        let _ = self.producer.set(p);
        Ok(self.producer.get().expect("set just now"))
    }

    pub async fn send<M: Message>(
        &self,
        m: &M,
        bad: &crate::error::BadEvent,
    ) -> Result<(), String> {
        let reason = bad.message.as_str();
        let where_ = format!("{}/{}@{}", m.topic(), m.partition(), m.offset());
        tracing::warn!(at = %where_, reason, "dead-lettering an event");
        let partition = m.partition().to_string();
        let offset = m.offset().to_string();
        let headers = OwnedHeaders::new()
            .insert(Header {
                key: "sluice.reason",
                value: Some(reason),
            })
            .insert(Header {
                key: "sluice.reason.kind",
                value: Some(bad.reason.label()),
            })
            .insert(Header {
                key: "sluice.topic",
                value: Some(m.topic()),
            })
            .insert(Header {
                key: "sluice.partition",
                value: Some(&partition),
            })
            .insert(Header {
                key: "sluice.offset",
                value: Some(&offset),
            });
        let mut record = FutureRecord::to(&self.topic)
            .payload(m.payload().unwrap_or_default())
            .headers(headers);
        if let Some(k) = m.key() {
            record = record.key(k);
        }
        self.producer()?
            .send(record, Duration::from_secs(60))
            .await
            .map(|_| ())
            .map_err(|(e, _)| {
                format!(
                    "could not write the dead letter for {where_} to {}: {e}",
                    self.topic
                )
            })
    }
}

/// A sink that gathers the events of its consumer group into batches; [`run`] drives it.
#[allow(async_fn_in_trait)]
pub(crate) trait BatchSink {
    type Drain: Drain;
    type Error;
    /// The group's consumer (shared, so that a message can borrow it while the sink handles
    /// the message).
    fn consumer(&self) -> Arc<StreamConsumer<GroupContext<Self::Drain>>>;
    /// When the batch in hand got its first event, if it has any.
    fn batch_started(&self) -> Option<Instant>;
    /// The batch in hand reached its size limits.
    fn batch_full(&self) -> bool;
    /// When the last write to the target began (of rows or documents, from any path: a batch,
    /// the batch before a DDL event, a table's part before a column change). A batch of
    /// offsets only (heartbeats, DDL events, skipped or dead-lettered records) costs the target
    /// nothing and does not count.
    fn last_write(&self) -> Option<Instant>;
    /// How long a batch may wait after its first event.
    fn max_wait(&self) -> Duration;
    /// Take one event into the batch (its offset is stored once the batch is written). The
    /// message is librdkafka's own, not copied; a sink that keeps it detaches it.
    async fn on_message(
        &mut self,
        m: &BorrowedMessage<'_>,
        shutdown: &Shutdown,
    ) -> Result<(), Self::Error>;
    /// Skip one record (of a taken-over capture, [`crate::incarnation`]): its offset is
    /// stored with the batch in hand, as if it had been handled.
    fn skip(&mut self, m: &BorrowedMessage<'_>);
    /// Write the batch in hand (or start writing it); its offsets are stored once written.
    async fn write_held(&mut self, shutdown: &Shutdown) -> Result<(), Self::Error>;
    /// Wait for every write started, storing their offsets.
    async fn settle(&mut self) -> Result<(), Self::Error> {
        Ok(())
    }
    /// The error that stops the stage for `why` (Kafka's state, not an event).
    fn fatal(&self, why: String) -> Self::Error;
    /// The consumer hit a fatal error: replace it with a new one of the same settings,
    /// subscribed, as a restart would ([`retire`] the old one). What it held is dropped
    /// unstored: the new consumer reads on from the committed offsets.
    /// Returns the old consumer, [`retire`]d, for the caller to close.
    async fn rejoin(
        &mut self,
    ) -> Result<Arc<StreamConsumer<GroupContext<Self::Drain>>>, Self::Error>;
}

/// How long a stage waits before a new consumer joins after a fatal error: a member fenced by
/// another with the same `consumer.instance_id` must not take the partitions back at once.
const REJOIN_AFTER: Duration = Duration::from_secs(5);

/// Why the consumer can no longer be used, if it cannot: librdkafka's fatal errors (a static
/// member fenced, KIP-345) leave it dead, every later call failing.
fn fatal_error<C: ConsumerContext>(
    consumer: &StreamConsumer<C>,
    e: &rdkafka::error::KafkaError,
) -> Option<String> {
    let fatal = consumer.client().fatal_error();
    if !matches!(e, rdkafka::error::KafkaError::MessageConsumptionFatal(_)) && fatal.is_none() {
        return None;
    }
    Some(match fatal {
        Some((code, reason)) => format!("{code:?}: {reason}"),
        None => e.to_string(),
    })
}

/// A consumer being replaced: from now on its rebalances (its last one comes when it is
/// closed) leave the sink's batch alone, which is the new consumer's.
pub(crate) fn retire<D: Drain>(old: &StreamConsumer<GroupContext<D>>) {
    old.context().retire();
}

/// Consume until shutdown or an error: a batch is written when full, or once it holds an event
/// and `max_wait` has passed since the previous write began ([`due`]). On shutdown what is held
/// is written and the offsets committed before leaving the group.
pub(crate) async fn run<S: BatchSink>(sink: &mut S, shutdown: &Shutdown) -> Result<(), S::Error> {
    let max_wait = sink.max_wait();
    run_loop(sink, shutdown, max_wait).await
}

/// When a batch that got its first event at `started` is written, the previous write having
/// begun at `last_write`: at once (as soon as no more events are ready) if that write began
/// `max_wait` ago or more, otherwise `max_wait` after it began. So an event waits at most
/// `max_wait`, and only while writes would otherwise follow each other faster than one per
/// `max_wait`: the first row after a quiet spell is written at once, while a steady stream is
/// gathered into one write per `max_wait` (fewer, larger parts for the target to merge), and a
/// write that takes long makes the next batch larger. (A full batch is written at once; a
/// write of offsets only, of heartbeats or DDL events, does not count as the previous write.)
pub(crate) fn due(started: Instant, last_write: Option<Instant>, max_wait: Duration) -> Instant {
    match last_write {
        Some(w) => started.max(w + max_wait),
        None => started,
    }
}

/// The lag watcher of one consumer and its topic finder ([`find_topics`]), stopped when
/// dropped.
struct Watcher {
    lag: Option<tokio::task::JoinHandle<()>>,
    finder: Option<tokio::task::JoinHandle<()>>,
    /// Tells the finder to stop (it ends a metadata request in flight first, which holds the
    /// consumer).
    stop: Arc<std::sync::atomic::AtomicBool>,
}

impl Watcher {
    fn start<D: Drain>(consumer: &Arc<StreamConsumer<GroupContext<D>>>) -> Self {
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        Watcher {
            lag: Some(tokio::spawn(watch_lag(
                consumer.clone(),
                consumer.context().metrics.clone(),
                Duration::from_secs(10),
            ))),
            finder: Some(tokio::spawn(find_topics(consumer.clone(), stop.clone()))),
            stop,
        }
    }

    /// Stop both, and wait until they let go of their consumer.
    async fn stop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        if let Some(task) = self.lag.take() {
            task.abort();
            let _ = task.await;
        }
        if let Some(task) = self.finder.take() {
            let _ = task.await;
        }
    }
}

impl Drop for Watcher {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        if let Some(task) = &self.lag {
            task.abort();
        }
    }
}

/// How often [`find_topics`] asks for the topics, for how long after a consumer is made, and
/// for how long more while it holds no partition.
const FIND_TOPICS_EVERY: Duration = Duration::from_millis(250);
const FIND_TOPICS_FOR: Duration = Duration::from_secs(30);
const FIND_TOPICS_UNASSIGNED_FOR: Duration = Duration::from_secs(60);

/// The cluster's topics, every 250 ms, for the first 30 s of a consumer (and on to a minute
/// while it holds no partition). A pattern subscription (`^prefix\..*`) matches the topics of
/// the metadata librdkafka last read, which it refreshes every
/// `topic.metadata.refresh.interval.ms` (3 s): on a new pipeline, whose capture makes its topics
/// as their tables' first rows come, those rows would wait up to that long to be seen. A
/// metadata request for every topic makes librdkafka check the subscription against it at once
/// and join with the new topics. Later, the periodic refresh finds new tables' topics.
async fn find_topics<D: Drain>(
    consumer: Arc<StreamConsumer<GroupContext<D>>>,
    stop: Arc<std::sync::atomic::AtomicBool>,
) {
    let started = Instant::now();
    let due = |c: &StreamConsumer<GroupContext<D>>| {
        let since = started.elapsed();
        since < FIND_TOPICS_FOR
            || (since < FIND_TOPICS_UNASSIGNED_FOR && c.context().metrics.assigned.get() == 0)
    };
    while due(&consumer) && !stop.load(std::sync::atomic::Ordering::Relaxed) {
        let c = consumer.clone();
        // (a blocking call of librdkafka's, off the runtime's threads)
        let asked = tokio::task::spawn_blocking(move || {
            c.fetch_metadata(None, Duration::from_secs(2)).map(|_| ())
        })
        .await;
        if let Ok(Err(e)) = asked {
            tracing::debug!(error = %e, "asking for the cluster's topics");
        }
        tokio::time::sleep(FIND_TOPICS_EVERY).await;
    }
}

async fn run_loop<S: BatchSink>(
    sink: &mut S,
    shutdown: &Shutdown,
    max_wait: Duration,
) -> Result<(), S::Error> {
    let mut consumer = sink.consumer();
    let mut watcher = Watcher::start(&consumer);
    // Messages taken without waiting since the clock was last read.
    let mut unclocked = 0u32;
    let result = loop {
        if shutdown.is_triggered() {
            break Ok(());
        }
        // Events expired unread at the assignment: nothing more is handled or stored.
        if let Some(why) = consumer.context().expired() {
            return Err(sink.fatal(why));
        }
        // A message already fetched is taken without arming a timer; the batch's deadline is
        // checked against the clock only every 64 such messages (it is a bound on waiting, not
        // a beat: past it by at most 63 messages' handling; when none is ready the wait below
        // is bounded by the deadline).
        let ready = futures::FutureExt::now_or_never(consumer.recv());
        let step = match ready {
            Some(m) => {
                unclocked = unclocked.saturating_add(1);
                let overdue = unclocked >= 64
                    && sink.batch_started().is_some_and(|s| {
                        unclocked = 0;
                        Instant::now() >= due(s, sink.last_write(), max_wait)
                    });
                if overdue {
                    if let Err(e) = sink.write_held(shutdown).await {
                        break Err(e);
                    }
                }
                Some(m)
            }
            None => {
                let deadline = sink
                    .batch_started()
                    .map(|s| due(s, sink.last_write(), max_wait))
                    .unwrap_or_else(|| Instant::now() + max_wait);
                tokio::select! {
                    biased;
                    _ = shutdown.wait() => break Ok(()),
                    _ = tokio::time::sleep_until(deadline.into()) => None,
                    m = consumer.recv() => Some(m),
                }
            }
        };
        let mut fatal = None;
        let r = match step {
            None => sink.write_held(shutdown).await,
            Some(Err(e)) if no_topic_yet(&e) => {
                tracing::debug!(error = %e, "no topic of the subscription yet");
                Ok(())
            }
            Some(Err(e)) => match fatal_error(&consumer, &e) {
                Some(why) => {
                    fatal = Some(why);
                    Ok(())
                }
                None => {
                    tracing::warn!(error = %e, "consumer error");
                    Ok(())
                }
            },
            // (the assignment that found it came inside this very receive)
            Some(Ok(_)) if consumer.context().expired().is_some() => {
                return Err(sink.fatal(consumer.context().expired().unwrap_or_default()));
            }
            Some(Ok(m)) => {
                let stamp = crate::incarnation::of(&m);
                let admit = consumer.context().incarnations.admit(
                    m.topic(),
                    m.partition(),
                    m.offset(),
                    stamp,
                );
                match admit {
                    crate::incarnation::Admit::Stale { seen, first } => {
                        consumer.context().metrics.stale_capture_records.inc();
                        if first {
                            let (connector, incarnation) = stamp.unwrap_or_default();
                            tracing::warn!(
                                topic = m.topic(),
                                partition = m.partition(),
                                offset = m.offset(),
                                connector,
                                incarnation,
                                successor = seen,
                                "skipping records of a capture that was taken over: they \
                                 reached Kafka after its successor's, which re-sent all they \
                                 hold (sluice_apply_stale_capture_records_total counts them)"
                            );
                        }
                        sink.skip(&m);
                        Ok(())
                    }
                    crate::incarnation::Admit::Yes => match sink.on_message(&m, shutdown).await {
                        Ok(()) if sink.batch_full() => sink.write_held(shutdown).await,
                        other => other,
                    },
                }
            }
        };
        if let Err(e) = r {
            break Err(e);
        }
        if let Some(why) = fatal {
            tracing::error!(
                error = %why,
                "the Kafka consumer hit a fatal error and cannot go on: fenced by another member \
                 with the same consumer.instance_id (each instance needs its own), or its group \
                 session timed out. A new consumer joins the group in {REJOIN_AFTER:?}, as a \
                 restart would; the events not yet committed are read and written again"
            );
            tokio::select! {
                _ = shutdown.wait() => break Ok(()),
                _ = tokio::time::sleep(REJOIN_AFTER) => {}
            }
            watcher.stop().await;
            let old = match sink.rejoin().await {
                Ok(old) => old,
                Err(e) => break Err(e),
            };
            consumer = sink.consumer();
            // (the last reference: closing it leaves the group, on a thread of its own)
            close_within(old, "replaced").await;
            consumer.context().metrics.rejoins.inc();
            watcher = Watcher::start(&consumer);
            tracing::info!("a new Kafka consumer joined the group");
        }
    };
    watcher.stop().await;
    if result.is_ok() {
        // Write what is held (no longer interruptible), then commit synchronously.
        sink.write_held(&Shutdown::new()).await?;
        sink.settle().await?;
        if let Err(e) = sink.consumer().commit_consumer_state(CommitMode::Sync) {
            tracing::debug!(error = %e, "final commit (nothing to commit?)");
        }
    }
    result
}

#[cfg(test)]
mod tests {

    #[test]
    fn rebalances_are_logged_as_topic_and_partition_lists() {
        let mut tpl = rdkafka::TopicPartitionList::new();
        tpl.add_partition("cdc.db.b", 2);
        tpl.add_partition("cdc.db.a", 1);
        tpl.add_partition("cdc.db.b", 0);
        assert_eq!(
            describe_rebalance(&Rebalance::Assign(&tpl)),
            "assigned partitions=cdc.db.a[1] cdc.db.b[0,2]"
        );
        assert_eq!(
            describe_rebalance(&Rebalance::Revoke(&rdkafka::TopicPartitionList::new())),
            "revoked partitions=none"
        );
    }

    use super::*;

    const S: i64 = 1_000_000;

    #[test]
    fn a_batch_waits_only_while_writes_would_come_faster_than_one_per_max_wait() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let wait = ms(500);
        // The first batch since the start: at once.
        assert_eq!(due(t0, None, wait), t0);
        // After a quiet spell (the last write began longer ago than max_wait): at once.
        assert_eq!(due(t0 + ms(900), Some(t0), wait), t0 + ms(900));
        assert_eq!(due(t0 + ms(500), Some(t0), wait), t0 + ms(500));
        // In a steady stream: max_wait after the last write began, so never longer than
        // max_wait after the batch's own first event.
        assert_eq!(due(t0 + ms(10), Some(t0), wait), t0 + ms(500));
        assert_eq!(due(t0, Some(t0), wait), t0 + ms(500));
    }

    /// A partition behind shows the age of what it last wrote, or the time since it was last
    /// seen caught up if that is shorter (an idle partition that just got an event is not
    /// "an hour behind"); one caught up shows 0; one never written nor seen caught up is
    /// unknown.
    #[test]
    fn a_partitions_lag_is_bounded_by_what_is_known_of_it() {
        let now = 10_000 * S;
        assert_eq!(
            partition_lag(now, false, Some(now - 3600 * S), None),
            Some(0)
        );
        assert_eq!(
            partition_lag(now, true, Some(now - 30 * S), None),
            Some(30 * S)
        );
        assert_eq!(
            partition_lag(now, true, Some(now - 3600 * S), Some(now - 5 * S)),
            Some(5 * S)
        );
        assert_eq!(
            partition_lag(now, true, None, Some(now - 5 * S)),
            Some(5 * S)
        );
        assert_eq!(partition_lag(now, true, None, None), None);
    }

    /// The stage's lag is its worst partition's (one current partition does not hide a stuck
    /// one), or the age of the batch being written when that is older (after a restart,
    /// before any write, while the target is down).
    #[test]
    fn the_stage_lag_is_the_worst_of_its_partitions_and_the_batch_being_written() {
        let now = 10_000 * S;
        assert_eq!(lag_seconds(now, [Some(0), Some(40 * S), None], 0), 40.0);
        assert_eq!(lag_seconds(now, [None, Some(0)], now - 90 * S), 90.0);
        assert_eq!(lag_seconds(now, [Some(0), Some(0)], 0), 0.0);
        assert_eq!(lag_seconds(now, [None], 0), 0.0);
    }

    /// A written batch moves each of its partitions' offset; its oldest time (or, for a batch
    /// of heartbeats alone, the time known before) goes with it, and nothing is being written.
    #[test]
    fn written_batches_move_each_partitions_offset_and_time() {
        let r = Registry::new();
        let m = GroupMetrics::new(&r).unwrap();
        let offsets = |o: i64| {
            Offsets(
                [("t".to_string(), [(0, o), (1, o + 1)].into_iter().collect())]
                    .into_iter()
                    .collect(),
            )
        };
        m.writing(Some(50));
        m.writing(Some(40));
        assert_eq!(m.progress.lock().unwrap().writing_since, 40);
        m.written(&offsets(7), Some(40));
        m.written(&offsets(9), None);
        let p = m.progress.lock().unwrap();
        assert_eq!(p.writing_since, 0);
        assert_eq!(p.written[&("t".to_string(), 0)], (9, Some(40)));
        assert_eq!(p.written[&("t".to_string(), 1)], (10, Some(40)));
    }

    /// Every dead-letter reason is exported at 0 from the start (rate() and alerts over a
    /// series that does not exist yet see nothing).
    #[test]
    fn dead_letter_counters_exist_at_zero_for_every_reason() {
        let r = Registry::new();
        SinkMetrics::new(&r, "X", "every table's part", "retries").unwrap();
        let series = sluice_common::metrics::counter_series(&r, "sluice_apply_dead_letters_total");
        assert!(series.iter().all(|(_, v)| *v == 0.0), "{series:?}");
        let reasons: Vec<String> = series.into_iter().map(|(l, _)| l).collect();
        let mut want: Vec<String> = crate::error::Reason::ALL
            .iter()
            .map(|r| r.label().to_string())
            .collect();
        want.sort();
        assert_eq!(reasons, want);
    }
}
