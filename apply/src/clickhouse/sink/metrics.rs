//! What apply-clickhouse counts (the names are in docs/apply-clickhouse.md), besides the
//! consumer group's own ([`GroupMetrics`]).

use prometheus::{Histogram, IntCounter, IntCounterVec, IntGauge, Opts, Registry};

use crate::group::{GroupMetrics, SinkMetrics};

#[derive(Clone)]
pub(super) struct Metrics {
    pub(super) rows: IntCounterVec,
    pub(super) batch_rows: Histogram,
    pub(super) batch_seconds: Histogram,
    pub(super) retries: IntCounter,
    /// By [`crate::error::Reason::label`].
    pub(super) dead_letters: IntCounterVec,
    pub(super) latency: Histogram,
    /// DDL and TRUNCATE events, by `kind` (the event's: alter, truncate, drop, rename,
    /// renamed, create, refused) and `outcome` (applied, stopped, skipped).
    pub(super) ddl: IntCounterVec,
    /// Target tables stopped (`tables.stopped_table`), as last read.
    pub(super) stopped_tables: IntGauge,
    /// Values written as NULL (or the type's zero) because the target column cannot hold
    /// them (`tables.unheld = "mark"`), by target table and column.
    pub(super) unheld: IntCounterVec,
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
        let SinkMetrics {
            batch_rows,
            batch_seconds,
            retries,
            dead_letters,
            latency,
        } = SinkMetrics::new(
            r,
            "ClickHouse",
            "every table's INSERT",
            "Statements retried because ClickHouse did not answer: INSERTs, and the lookups and changes of target tables.",
        )?;
        let ddl = IntCounterVec::new(
            Opts::new(
                "sluice_apply_ddl_total",
                "DDL and TRUNCATE events, by kind and outcome (applied; stopped: the table was \
                 stopped by it; skipped: its table was stopped already).",
            ),
            &["kind", "outcome"],
        )?;
        let stopped_tables = IntGauge::new(
            "sluice_apply_stopped_tables",
            "Target tables stopped (their events dead-lettered until their row is deleted from \
             tables.stopped_table), as this instance last read them.",
        )?;
        let unheld = IntCounterVec::new(
            Opts::new(
                "sluice_apply_unheld_values_total",
                "Values a target column cannot hold, written as NULL (or the type's zero) and \
                 named in the row's tables.unheld_column (tables.unheld = \"mark\"), by target \
                 table and column.",
            ),
            &["table", "column"],
        )?;
        r.register(Box::new(unheld.clone()))?;
        r.register(Box::new(rows.clone()))?;
        r.register(Box::new(ddl.clone()))?;
        r.register(Box::new(stopped_tables.clone()))?;
        Ok(Self {
            rows,
            batch_rows,
            batch_seconds,
            retries,
            dead_letters,
            latency,
            ddl,
            stopped_tables,
            unheld,
            group: GroupMetrics::new(r)?,
        })
    }
}
