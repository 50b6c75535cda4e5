//! What apply-clickhouse counts (the names are in docs/apply-clickhouse.md), besides the
//! consumer group's own ([`GroupMetrics`]).

use prometheus::{Histogram, HistogramOpts, IntCounter, IntCounterVec, Opts, Registry};

use crate::group::GroupMetrics;

#[derive(Clone)]
pub(super) struct Metrics {
    pub(super) rows: IntCounterVec,
    pub(super) batch_rows: Histogram,
    pub(super) batch_seconds: Histogram,
    pub(super) retries: IntCounter,
    /// By [`crate::error::Reason::label`].
    pub(super) dead_letters: IntCounterVec,
    pub(super) latency: Histogram,
    pub(super) group: GroupMetrics,
}

impl Metrics {
    pub(super) fn new(r: &Registry) -> prometheus::Result<Self> {
        let rows = IntCounterVec::new(
            Opts::new(
                "sluice_apply_rows_total",
                "Rows written to ClickHouse, by target table.",
            ),
            &["table"],
        )?;
        let batch_rows = Histogram::with_opts(
            HistogramOpts::new("sluice_apply_batch_rows", "Rows per written batch.")
                .buckets(vec![1.0, 10.0, 100.0, 1e3, 1e4, 5e4, 1e5, 2e5, 5e5, 1e6]),
        )?;
        let batch_seconds = Histogram::with_opts(HistogramOpts::new(
            "sluice_apply_batch_duration_seconds",
            "Time to write one batch (every table's INSERT), retries included.",
        ))?;
        let retries = IntCounter::new(
            "sluice_apply_retries_total",
            "Statements retried because ClickHouse did not answer: INSERTs, and the lookups and changes of target tables.",
        )?;
        let dead_letters = IntCounterVec::new(
            Opts::new(
                "sluice_apply_dead_letters_total",
                "Events sent to the dead-letter topic, by reason.",
            ),
            &["reason"],
        )?;
        let latency = Histogram::with_opts(
            HistogramOpts::new(
                "sluice_apply_end_to_end_latency_seconds",
                "Source commit to the batch acknowledged by ClickHouse.",
            )
            .buckets(vec![
                0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 300.0,
            ]),
        )?;
        r.register(Box::new(rows.clone()))?;
        r.register(Box::new(batch_rows.clone()))?;
        r.register(Box::new(batch_seconds.clone()))?;
        r.register(Box::new(retries.clone()))?;
        r.register(Box::new(dead_letters.clone()))?;
        r.register(Box::new(latency.clone()))?;
        Ok(Self {
            rows,
            batch_rows,
            batch_seconds,
            retries,
            dead_letters,
            latency,
            group: GroupMetrics::new(r)?,
        })
    }
}
