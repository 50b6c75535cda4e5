//! `sluice verify`: is the target right? Source (MySQL/MariaDB) and target (the ClickHouse
//! mirror) compared table by table, in primary-key chunks, each server hashing its own rows
//! (the canonical rendering of [`render`]), as pt-table-checksum does: rows cross the network
//! only for chunks whose checksums differ.
//!
//! It is right while the pipeline streams. A chunk whose checksums differ is narrowed down to
//! its keys: the source's rows are read in a consistent snapshot at a binlog position P, the
//! tool waits until the target has caught up past P (the capture's checkpoint at or past P, then
//! the apply group's committed offsets at the ends the table's topic had at that moment), and
//! only then reads the target's rows with their versions. A key on which they disagree is a
//! difference when the target's row is of a version before P (the target shows the state at P
//! and it is not the source's); a target row of a later version changed after the snapshot and
//! is read again in the next round. A key still changing after every round is reported as
//! unsettled, never as equal.
//!
//! One question a file: `plan` (what is compared, and the SQL of both sides), `source` (the
//! MySQL side), `target` (the ClickHouse side), `chunks` (the first pass, checksums of key
//! ranges), `catch_up` (waiting for the pipeline to pass a source position), `narrow` (the keys
//! of a differing chunk, over rounds), `render` (values in one canonical text on both servers),
//! `report` (the answer, as text and JSON); `mongo` compares MongoDB with MongoDB.

mod catch_up;
mod chunks;
pub mod mongo;
mod narrow;
mod plan;
pub mod render;
mod report;
mod source;
mod target;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

pub use report::{summary_line, text, ColumnDiff, KeyDiff, Outcome, Report, TableReport};

use catch_up::Pipeline;
use chunks::compare;
use plan::plan;
use source::Source;
use target::Target;

/// What `sluice verify` is asked.
#[derive(Debug, Clone)]
pub struct Options {
    /// Only these source tables (`database.table`); empty: every table the capture's filter
    /// takes.
    pub tables: Vec<String>,
    /// Rows per chunk.
    pub chunk_rows: u64,
    /// Chunks checksummed at the same time (each on a source connection of its own).
    pub parallel: usize,
    /// Rounds of re-reading keys that changed while they were compared.
    pub rounds: u32,
    /// How long to wait for the target to catch up with a source position.
    pub wait: Duration,
    /// Print progress on stderr.
    pub progress: bool,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            tables: Vec::new(),
            chunk_rows: 10_000,
            parallel: 1,
            rounds: 5,
            wait: Duration::from_secs(120),
            progress: true,
        }
    }
}

/// The configurations `sluice verify` reads: the capture's (source, filter, Kafka, checkpoint
/// topic, connector) and the apply stage's (target, table names, group).
pub struct Setup {
    pub capture: sluice_capture::mysql::Config,
    pub apply: sluice_apply::clickhouse::Config,
}

/// Run the comparison.
pub async fn run(setup: &Setup, options: &Options) -> Result<Report, String> {
    let started = Instant::now();
    let filter = sluice_capture::filter::Filter::new(
        &setup.capture.filter,
        sluice_capture::mysql::stream::SYSTEM_DATABASES,
    )
    .map_err(|(k, e)| format!("{k}: {e}"))?;
    let source = Source::open(&setup.capture.mysql).await?;
    let target = Target {
        client: setup.apply.clickhouse.client()?,
        database: setup.apply.clickhouse.database.clone(),
    };
    let pipeline = std::sync::Arc::new(Pipeline::new(
        &setup.capture,
        &setup.apply.kafka,
        &setup.apply.consumer.group_id,
    )?);
    let mut tables = source.tables(&filter).await?;
    only_wanted(&mut tables, &options.tables, "table")?;
    let stopped = target.stopped(&setup.apply.tables.stopped_table).await;
    let mut reports = Vec::new();
    for (db, table) in tables {
        let report = verify_table(
            &source, &target, &pipeline, setup, options, &stopped, &db, &table,
        )
        .await;
        if options.progress {
            eprintln!("{}", summary_line(&report));
        }
        reports.push(report);
    }
    Ok(Report::of(reports, started))
}

/// Keep only the `database.name`s of `--table` (all when none is given); a name that is not
/// among them is an error.
pub(crate) fn only_wanted(
    names: &mut Vec<(String, String)>,
    wanted: &[String],
    what: &str,
) -> Result<(), String> {
    if wanted.is_empty() {
        return Ok(());
    }
    for want in wanted {
        if !names.iter().any(|(d, t)| &format!("{d}.{t}") == want) {
            return Err(format!(
                "{want}: no such {what} in the source, or outside the capture's filter"
            ));
        }
    }
    names.retain(|(d, t)| wanted.contains(&format!("{d}.{t}")));
    Ok(())
}

#[allow(clippy::too_many_arguments)]
async fn verify_table(
    source: &Source,
    target: &Target,
    pipeline: &std::sync::Arc<Pipeline>,
    setup: &Setup,
    options: &Options,
    stopped: &BTreeMap<String, String>,
    db: &str,
    table: &str,
) -> TableReport {
    let started = Instant::now();
    let tables = &setup.apply.tables;
    let target_table = tables.name.replace("{db}", db).replace("{table}", table);
    let mut report = TableReport::new(
        format!("{db}.{table}"),
        format!("{}.{}", target.database, target_table),
    );
    let outcome = async {
        let mut planned = plan(source, target, setup, db, table, &target_table, stopped).await?;
        // A target not made yet, or without a column the source has, may only be behind (a
        // pipeline just restarted, an ALTER not applied yet): wait for it to pass where the
        // source is now, then look again (and at the stops, which may have come meanwhile).
        let behind = match &planned {
            Err(reason) => reason.starts_with("no target table"),
            Ok(plan) => plan
                .schema
                .columns
                .iter()
                .any(|c| !plan.columns.iter().any(|(p, _)| p.name == c.name)),
        };
        if behind {
            let mut conn = source.conn().await?;
            let now = source.position(&mut conn).await?;
            drop(conn);
            let (pl, name, limit) = (
                pipeline.clone(),
                (db.to_string(), table.to_string()),
                options.wait,
            );
            let waited =
                tokio::task::spawn_blocking(move || pl.wait(&now, &name.0, &name.1, limit))
                    .await
                    .map_err(|e| e.to_string())?;
            if waited.is_ok() {
                let stopped = target.stopped(&setup.apply.tables.stopped_table).await;
                planned = plan(source, target, setup, db, table, &target_table, &stopped).await?;
            }
        }
        let plan = match planned {
            Ok(plan) => plan,
            Err(reason) => {
                report.not_verified(reason);
                return Ok(());
            }
        };
        report.columns_not_compared = plan
            .schema
            .columns
            .iter()
            .filter(|c| !plan.columns.iter().any(|(p, _)| p.name == c.name))
            .map(|c| c.name.clone())
            .collect();
        compare(source, target, pipeline, options, &plan, &mut report).await
    }
    .await;
    report.conclude(outcome);
    if report.result == Outcome::Different {
        // Stopped while it was compared: what differs is what the stop left behind.
        let stopped = target.stopped(&setup.apply.tables.stopped_table).await;
        if let Some(reason) = stopped.get(&target_table) {
            report.not_verified(plan::stopped_reason(reason));
        }
    }
    report.seconds = started.elapsed().as_secs_f64();
    report
}
