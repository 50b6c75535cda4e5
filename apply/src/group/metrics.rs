//! The metrics every apply binary serves about its consumer group and its writes: partitions
//! held, the lag in events (watched every 5 s) and in seconds, rejoins, stale records; and per
//! sink, batches, retries, dead letters and the end-to-end latency.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use prometheus::{
    Histogram, HistogramOpts, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry,
};
use rdkafka::consumer::{Consumer, ConsumerContext, StreamConsumer};

use super::offsets::Offsets;

/// The consumer group metrics every apply binary serves.
#[derive(Clone)]
pub struct GroupMetrics {
    pub lag: IntGaugeVec,
    pub assigned: IntGauge,
    /// `sluice_apply_unheld_partitions`: partitions of the subscribed topics no member of the
    /// group holds ([`super::membership`]).
    pub unheld: IntGauge,
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
        let unheld = IntGauge::new(
            "sluice_apply_unheld_partitions",
            "Partitions of the subscribed topics that no member of the consumer group holds, as \
             the broker says (looked at every 5 s): above 0 for long, their events are not \
             being written.",
        )?;
        r.register(Box::new(lag.clone()))?;
        r.register(Box::new(assigned.clone()))?;
        r.register(Box::new(unheld.clone()))?;
        let rejoins = IntCounter::new(
            "sluice_apply_consumer_rejoins_total",
            "Times the Kafka consumer was replaced and a new one joined the group: after a fatal \
             error (fenced: another member with the same consumer.instance_id, or a session that \
             timed out), or out of its group for 30 s while partitions were held by no member.",
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
            unheld,
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
pub(super) async fn watch_lag<C: ConsumerContext + 'static>(
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

#[cfg(test)]
mod tests {
    use super::*;

    const S: i64 = 1_000_000;

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
