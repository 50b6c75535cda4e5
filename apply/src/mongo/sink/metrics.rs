//! apply-mongo's metrics: what was written, how batches went, what was dead-lettered or
//! skipped, the source commands applied, and the end-to-end latency. The names are part of
//! the documented interface (docs/apply-mongo.md#metrics).

use prometheus::{Histogram, IntCounter, IntCounterVec, IntGauge, Opts, Registry};

use crate::group::{GroupMetrics, SinkMetrics};

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
    /// Target collections stopped (`stopped_collections`), as last read.
    pub(super) stopped: IntGauge,
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
        let SinkMetrics {
            batch_rows: batch_events,
            batch_seconds,
            retries,
            dead_letters,
            latency,
        } = SinkMetrics::new(
            r,
            "MongoDB",
            "every collection's commands",
            "Batches and source commands written again after a transient MongoDB failure.",
        )?;
        let stale = IntCounter::new(
            "sluice_apply_stale_events_total",
            "Row events skipped because a later drop or rename of their collection was applied.",
        )?;
        let ddl = IntCounterVec::new(
            Opts::new(
                "sluice_apply_ddl_total",
                "Source commands, by kind and outcome (applied, skipped, filtered, nothing_to_apply, failed, stopped).",
            ),
            &["kind", "outcome"],
        )?;
        for c in [&writes, &ddl] {
            r.register(Box::new(c.clone()))?;
        }
        r.register(Box::new(stale.clone()))?;
        let stopped = IntGauge::new(
            "sluice_apply_stopped_tables",
            "Target collections stopped (their events dead-lettered until their document is \
             deleted from stopped_collections), as this instance last read them.",
        )?;
        r.register(Box::new(stopped.clone()))?;
        Ok(Self {
            writes,
            batch_events,
            batch_seconds,
            retries,
            dead_letters,
            stale,
            ddl,
            latency,
            stopped,
            group: GroupMetrics::new(r)?,
        })
    }
}
