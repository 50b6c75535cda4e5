//! apply-mongo's metrics: what was written, how batches went, what was dead-lettered or
//! skipped, the source commands applied, and the end-to-end latency. The names are part of
//! the documented interface (docs/apply-mongo.md#metrics).

use prometheus::{Histogram, HistogramOpts, IntCounter, IntCounterVec, Opts, Registry};

use crate::group::GroupMetrics;

#[derive(Clone)]
pub(super) struct Metrics {
    pub(super) writes: IntCounterVec,
    pub(super) batch_events: Histogram,
    pub(super) batch_seconds: Histogram,
    pub(super) retries: IntCounter,
    pub(super) dead_letters: IntCounterVec,
    pub(super) stale: IntCounter,
    pub(super) ddl: IntCounterVec,
    pub(super) latency: Histogram,
    pub(super) group: GroupMetrics,
}

impl Metrics {
    pub(super) fn new(r: &Registry) -> prometheus::Result<Self> {
        let writes = IntCounterVec::new(
            Opts::new(
                "sluice_apply_writes_total",
                "Document writes acknowledged by MongoDB, by target namespace and kind.",
            ),
            &["namespace", "kind"],
        )?;
        let batch_events = Histogram::with_opts(
            HistogramOpts::new("sluice_apply_batch_rows", "Events per written batch.")
                .buckets(vec![1.0, 10.0, 100.0, 1e3, 1e4, 5e4, 1e5, 2e5, 5e5, 1e6]),
        )?;
        let batch_seconds = Histogram::with_opts(HistogramOpts::new(
            "sluice_apply_batch_duration_seconds",
            "Time to write one batch, retries included.",
        ))?;
        let retries = IntCounter::new(
            "sluice_apply_retries_total",
            "Batches written again after a MongoDB failure.",
        )?;
        let dead_letters = IntCounterVec::new(
            Opts::new(
                "sluice_apply_dead_letters_total",
                "Events sent to the dead-letter topic, by reason.",
            ),
            &["reason"],
        )?;
        let stale = IntCounter::new(
            "sluice_apply_stale_events_total",
            "Row events skipped because a later drop or rename of their collection was applied.",
        )?;
        let ddl = IntCounterVec::new(
            Opts::new(
                "sluice_apply_ddl_total",
                "Source commands, by kind and outcome (applied, skipped, filtered, failed).",
            ),
            &["kind", "outcome"],
        )?;
        let latency = Histogram::with_opts(
            HistogramOpts::new(
                "sluice_apply_end_to_end_latency_seconds",
                "Source commit to the batch acknowledged by MongoDB.",
            )
            .buckets(vec![
                0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 300.0,
            ]),
        )?;
        for c in [&writes, &dead_letters, &ddl] {
            r.register(Box::new(c.clone()))?;
        }
        r.register(Box::new(batch_events.clone()))?;
        r.register(Box::new(batch_seconds.clone()))?;
        r.register(Box::new(retries.clone()))?;
        r.register(Box::new(stale.clone()))?;
        r.register(Box::new(latency.clone()))?;
        Ok(Self {
            writes,
            batch_events,
            batch_seconds,
            retries,
            dead_letters,
            stale,
            ddl,
            latency,
            group: GroupMetrics::new(r)?,
        })
    }
}
