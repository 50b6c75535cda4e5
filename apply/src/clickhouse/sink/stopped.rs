//! The stopped tables: target tables whose later events are dead-lettered with the reason
//! (a statement ClickHouse refuses or that cannot be applied exactly, a row that can never be
//! written, a table the source refused), while the other tables go on. They are kept in
//! `tables.stopped_table`, so a table stays stopped after a restart, and read again every 5 s:
//! other instances stop tables too (a table's keys are on every partition), and an operator
//! takes a table up again by deleting its row.

use std::time::{Duration, Instant};

use super::{refused, Sink};
use crate::error::ApplyError;
use sluice_common::sql::clickhouse::ident;

/// How often the stopped tables are read again.
const REREAD_EVERY: Duration = Duration::from_secs(5);

impl Sink {
    /// The stopped tables kept in ClickHouse (`tables.stopped_table`, made if missing): a
    /// table stopped before a restart stays stopped.
    pub(super) async fn read_stopped(&mut self) -> Result<(), ApplyError> {
        let t = format!(
            "{}.{}",
            ident(&self.config.clickhouse.database),
            ident(&self.config.tables.stopped_table)
        );
        let cluster = &self.config.cluster;
        let create = format!(
            "CREATE TABLE IF NOT EXISTS {t}{} (target String, reason String, at DateTime) \
             ENGINE = {} ORDER BY target",
            cluster.on(),
            cluster.engine("ReplacingMergeTree", "at", true)
        );
        self.answered("creating the stopped tables' table", || {
            self.client.query(&create).execute()
        })
        .await?
        .map_err(|e| refused(format_args!("{create}: {e}")))?;
        self.reload_stopped(true).await
    }

    /// Read `tables.stopped_table` again: tables other instances stopped (a table's keys are
    /// on every partition), or taken up again by deleting their row.
    /// [`Self::reload_stopped`] once 5 s have gone by since the last read (or the last failed
    /// one: a target that is down is not asked at every row).
    pub(super) async fn reread_stopped_if_due(&mut self) {
        if self.stopped_read_at.elapsed() < REREAD_EVERY {
            return;
        }
        // One try: a target that is down is waited for where writes are, not here (a row taken
        // must not hold the stage from noticing what a rebalance left behind).
        if let Err(e) = self.reload_stopped(false).await {
            tracing::warn!(error = %e, "reading the stopped tables again failed; retrying in 5 s");
            self.stopped_read_at = Instant::now();
        }
    }

    /// Read the stopped tables (`retry`: until the target answers).
    pub(super) async fn reload_stopped(&mut self, retry: bool) -> Result<(), ApplyError> {
        let t = format!(
            "{}.{}",
            ident(&self.config.clickhouse.database),
            ident(&self.config.tables.stopped_table)
        );
        let select = format!("SELECT target, argMax(reason, at) FROM {t} GROUP BY target");
        let rows = if retry {
            self.answered("reading the stopped tables", || {
                self.client.query(&select).fetch_all::<(String, String)>()
            })
            .await?
            .map_err(|e| refused(format_args!("{select}: {e}")))?
        } else {
            self.client
                .query(&select)
                .fetch_all::<(String, String)>()
                .await
                .map_err(|e| ApplyError::from(e).context(format_args!("{select}")))?
        };
        let now: std::collections::HashMap<String, String> = rows.into_iter().collect();
        for (target, reason) in &now {
            if !self.stopped.contains_key(target) {
                tracing::warn!(table = %target, %reason, "table stopped: its events are dead-lettered (delete its row from {} to take it up again)", self.config.tables.stopped_table);
            }
        }
        for target in self.stopped.keys() {
            if !now.contains_key(target) {
                // Read again at its next row: the operator may have emptied, dropped or
                // changed it to take it up (made again from the copy's schema if dropped).
                self.targets.remove(target);
                tracing::info!(table = %target, "table taken up again (its row was deleted from {}): its events are written from here on; replay its dead letters (`sluice dead-letters replay --table ...`) or copy it again", self.config.tables.stopped_table);
            }
        }
        if now != self.stopped {
            // Cached plans would let a newly stopped table's rows through.
            self.plans.clear();
            self.stopped = now;
        }
        self.stopped_read_at = Instant::now();
        self.said_stopped();
        Ok(())
    }

    /// The stopped tables in the metric and in `/healthz`.
    fn said_stopped(&self) {
        self.metrics.stopped_tables.set(self.stopped.len() as i64);
        let why = (!self.stopped.is_empty()).then(|| {
            let mut names: Vec<&str> = self.stopped.keys().map(String::as_str).collect();
            names.sort_unstable();
            format!(
                "{} table(s) stopped: {} (why: {}.{}; its events are dead-lettered)",
                names.len(),
                names.join(", "),
                self.config.clickhouse.database,
                self.config.tables.stopped_table
            )
        });
        self.health.set("stopped", why);
    }

    /// Stop target `name` for `reason`: kept in memory and in ClickHouse.
    pub(super) async fn stop_table(&mut self, name: &str, reason: &str) -> Result<(), ApplyError> {
        let sql = format!(
            "INSERT INTO {}.{} (target, reason, at) VALUES (?, ?, now())",
            ident(&self.config.clickhouse.database),
            ident(&self.config.tables.stopped_table)
        );
        self.answered("recording a stopped table", || {
            self.client.query(&sql).bind(name).bind(reason).execute()
        })
        .await?
        .map_err(|e| refused(format_args!("{sql}: {e}")))?;
        self.stopped.insert(name.to_string(), reason.to_string());
        // Cached plans would let its later rows through.
        self.plans.clear();
        self.said_stopped();
        Ok(())
    }
}
