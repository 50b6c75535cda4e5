//! Publishing change events to Kafka, and the checkpoints that make a restart lose nothing.
//!
//! Every record is handed to an idempotent `acks=all` producer without waiting, numbered in the
//! order it was handed over. librdkafka's delivery callbacks tick the numbers off in a
//! `Ledger`, which publishes how many records are acknowledged without a gap. At each
//! transaction commit the capture queues a *mark*: the checkpoint and the count of records sent
//! before it. One task (the acker) takes the marks in order; once the gap-free count reaches a
//! mark, every record before it is acknowledged, so the mark's position is safe to resume from.
//! The acker writes it to the checkpoint topic (compacted, key = connector name) at most every
//! `checkpoint_interval_ms`, and always when the capture stops.
//!
//! At most `max_in_flight` records are unacknowledged: a slow broker slows the reader instead
//! of growing memory. A record that cannot be delivered (librdkafka gave up) stops the capture; on restart
//! it resumes from the last checkpoint, and replays are harmless because events carry versions.
//!
//! Each start first takes the connector's next *incarnation* (stored in the checkpoint topic
//! by the checkpoint writer, whose transactional id fences the previous start) and stamps it on
//! every record ([`sluice_common::kafka::INCARNATION_HEADER`]): records a taken-over start
//! still delivers after its successor's are then known as late, and the appliers skip them.
//!
//! Children: `ledger` (numbering the records handed to the producer and ticking them off as
//! librdkafka acknowledges them), `publisher` (the [`Publisher`]: topics, sending with the
//! in-flight bounds, marks), `acker` (the task that turns marks into stored checkpoints) and
//! [`crate::checkpoint`] (the checkpoint topic: reading it back at start, the fenced writer).

mod acker;
pub mod keying;
mod ledger;
mod publisher;

use prometheus::{Histogram, HistogramOpts, IntCounterVec, Opts, Registry};
use rdkafka::error::KafkaError;
use serde::{Deserialize, Serialize};

pub use publisher::{Delivery, Publisher};

#[derive(Debug, thiserror::Error)]
pub enum PublishError {
    #[error("Kafka client: {0}")]
    Client(#[from] KafkaError),
    #[error("topic {topic}: cannot create it: {reason}")]
    CreateTopic { topic: String, reason: String },
    #[error("topic {topic}: {reason}")]
    Partitions { topic: String, reason: String },
    #[error("topic {topic}: delivery failed: {reason}")]
    Delivery { topic: String, reason: String },
    #[error(transparent)]
    Checkpoint(#[from] crate::checkpoint::CheckpointError),
    #[error("the acknowledgement task stopped")]
    AckerGone,
}

/// Kafka failures stop the capture: the idempotent producer has already retried delivery for
/// `delivery.timeout.ms`, and a broken delivery leaves a gap that only a restart from the
/// last checkpoint closes.
impl From<PublishError> for crate::error::CaptureError {
    fn from(e: PublishError) -> Self {
        crate::error::CaptureError::Definite(crate::error::Origin::Kafka, e.to_string())
    }
}

/// `[publish]`: how events and checkpoints are written.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, default)]
pub struct PublishConfig {
    /// Partitions of the change topics the capture creates; -1 takes the broker's
    /// `num.partitions`. Default -1.
    pub partitions: i32,
    /// Replication factor of the topics the capture creates; -1 takes the broker's
    /// `default.replication.factor`. Default -1.
    pub replication_factor: i32,
    /// The compacted topic of schema records. Default `_sluice_schemas`.
    pub schema_topic: String,
    /// The compacted topic of checkpoints (key = connector). Default `_sluice_checkpoints`.
    pub checkpoint_topic: String,
    /// Write a checkpoint at most this often, in milliseconds. Default 1000.
    pub checkpoint_interval_ms: u64,
    /// Records handed to the producer but not yet acknowledged, at most. Default 100000.
    pub max_in_flight: usize,
    /// Bytes (keys and values) handed to the producer but not yet acknowledged, at most; a
    /// larger record still goes, alone. Each byte in flight costs about two and a half of the
    /// process's memory (librdkafka's copy, its batches and their compression). Default
    /// 4194304 (4 MiB): at 230 000 W1 rows/s (100 MB/s) that is 40 ms of a broker's round trip;
    /// raise it for a distant broker (about the rate times the acknowledgement's round trip).
    pub max_in_flight_bytes: usize,
    /// How long a record may wait for its acknowledgement, in milliseconds
    /// (`message.timeout.ms`). Default 120000.
    pub delivery_timeout_ms: u64,
    /// Publish a heartbeat event (`OP_HEARTBEAT`, with the position reached) to topic
    /// `<topics.prefix>._heartbeat` at most this often while the source is idle, in
    /// milliseconds: a consumer tells an idle source from a stuck capture by them. 0: none.
    /// Default 0.
    pub heartbeat_interval_ms: u64,
    /// The largest event, in bytes: the producer's `message.max.bytes` and the
    /// `max.message.bytes` of the topics the capture creates (a MongoDB document may be 16 MiB,
    /// an event can carry it twice). Default 67108864 (64 MiB).
    pub max_message_bytes: usize,
    /// (capture-mysql) Make the topics of every table the filter takes at start, in one
    /// request, instead of each at its table's first row: for sources of many tables (a round
    /// trip per topic adds up to minutes), at the cost of topics for tables that never change.
    /// Default false.
    pub topics_at_start: bool,
}

impl Default for PublishConfig {
    fn default() -> Self {
        Self {
            partitions: -1,
            replication_factor: -1,
            schema_topic: "_sluice_schemas".into(),
            checkpoint_topic: "_sluice_checkpoints".into(),
            checkpoint_interval_ms: 1000,
            max_in_flight: 100_000,
            max_in_flight_bytes: 4 << 20,
            delivery_timeout_ms: 120_000,
            max_message_bytes: 64 << 20,
            heartbeat_interval_ms: 0,
            topics_at_start: false,
        }
    }
}

impl PublishConfig {
    pub fn validate(&self) -> Result<(), (String, String)> {
        let bad = |k: &str, m: &str| Err((format!("publish.{k}"), m.to_string()));
        if self.partitions == 0 || self.partitions < -1 {
            return bad("partitions", "must be -1 (broker default) or at least 1");
        }
        if self.replication_factor == 0 || self.replication_factor < -1 {
            return bad(
                "replication_factor",
                "must be -1 (broker default) or at least 1",
            );
        }
        if self.schema_topic.is_empty() || self.checkpoint_topic.is_empty() {
            return bad("schema_topic", "topic names must not be empty");
        }
        if self.max_in_flight == 0 {
            return bad("max_in_flight", "must be at least 1");
        }
        if self.max_in_flight_bytes < 1 << 16 {
            return bad("max_in_flight_bytes", "must be at least 65536");
        }
        if !(1 << 20..=1 << 30).contains(&self.max_message_bytes) {
            return bad("max_message_bytes", "must be between 1 MiB and 1 GiB");
        }
        if self.delivery_timeout_ms < 1000 {
            return bad("delivery_timeout_ms", "must be at least 1000");
        }
        Ok(())
    }
}

/// The topic of a capture's heartbeat events (`publish.heartbeat_interval_ms`).
pub fn heartbeat_topic(prefix: &str) -> String {
    format!("{prefix}._heartbeat")
}

/// Seconds from `commit_micros` (a source commit time) to now, never below 0.
pub fn lag_seconds(commit_micros: i64) -> f64 {
    (sluice_common::clock::now_micros() - commit_micros).max(0) as f64 / 1e6
}

/// The metrics every capture serves, whatever its source: events handed to Kafka, their
/// acknowledgement, checkpoints, the source lag and errors.
#[derive(Clone)]
pub struct PublishMetrics {
    pub lag_seconds: prometheus::Gauge,
    pub errors: IntCounterVec,
    pub events: IntCounterVec,
    pub bytes: IntCounterVec,
    pub produce_latency: Histogram,
    pub checkpoints: IntCounterVec,
}

impl PublishMetrics {
    pub fn new(registry: &Registry) -> prometheus::Result<Self> {
        let events = IntCounterVec::new(
            Opts::new(
                "sluice_capture_events_total",
                "Change events handed to Kafka, by database, table and operation.",
            ),
            &["database", "table", "op"],
        )?;
        let bytes = IntCounterVec::new(
            Opts::new(
                "sluice_capture_event_bytes_total",
                "Bytes of change event payloads handed to Kafka, by database and table.",
            ),
            &["database", "table"],
        )?;
        let produce_latency = Histogram::with_opts(
            HistogramOpts::new(
                "sluice_capture_produce_latency_seconds",
                "Time from handing a record to the producer to its acknowledgement.",
            )
            .buckets(vec![
                0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
            ]),
        )?;
        let checkpoints = IntCounterVec::new(
            Opts::new(
                "sluice_capture_checkpoints_total",
                "Checkpoints written to the checkpoint topic, by outcome.",
            ),
            &["outcome"],
        )?;
        let lag_seconds = prometheus::Gauge::new(
            "sluice_capture_lag_seconds",
            "Now minus the source commit time of the last change read, in seconds (0 once the \
             source has nothing more to send).",
        )?;
        let errors = IntCounterVec::new(
            Opts::new("sluice_capture_errors_total", "Errors by type."),
            &["error_type"],
        )?;
        // Every known label value from the start, at 0: rate() and alerts work before the
        // first failure.
        for origin in crate::error::Origin::ALL {
            errors.with_label_values(&[origin.label()]);
        }
        for outcome in ["ok", "error"] {
            checkpoints.with_label_values(&[outcome]);
        }
        registry.register(Box::new(lag_seconds.clone()))?;
        registry.register(Box::new(errors.clone()))?;
        registry.register(Box::new(events.clone()))?;
        registry.register(Box::new(bytes.clone()))?;
        registry.register(Box::new(produce_latency.clone()))?;
        registry.register(Box::new(checkpoints.clone()))?;
        Ok(Self {
            lag_seconds,
            errors,
            events,
            bytes,
            produce_latency,
            checkpoints,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Error and checkpoint counters exist at 0 for every known label from the start.
    #[test]
    fn labelled_counters_exist_at_zero() {
        let r = Registry::new();
        PublishMetrics::new(&r).unwrap();
        let labels = |name: &str| -> Vec<String> {
            let series = sluice_common::metrics::counter_series(&r, name);
            assert!(series.iter().all(|(_, v)| *v == 0.0), "{series:?}");
            series.into_iter().map(|(l, _)| l).collect()
        };
        assert_eq!(
            labels("sluice_capture_errors_total"),
            ["config", "decode", "kafka", "mongodb", "mysql", "source"]
        );
        assert_eq!(labels("sluice_capture_checkpoints_total"), ["error", "ok"]);
    }
}
