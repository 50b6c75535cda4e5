//! Statements sent to ClickHouse, and their retries.
//!
//! - [`Writer::insert_once`]: one table's part of a batch, one INSERT in RowBinary, its pieces
//!   sent as they are. On servers that know `insert_deduplication_token` (22.2+) it carries a
//!   hash of the part, so an INSERT repeated after a crash or a lost answer is dropped at once.
//! - With `cluster.write = "shards"` a part goes into its shard's per-shard table, on the first
//!   of the shard's replicas that answers ([`Shards`]).
//! - [`insert`]: that INSERT retried with backoff (0.5 s to 5 s) while ClickHouse is
//!   unreachable or overloaded, until written, refused for good, or shut down.
//! - [`Sink::answered`]: the same retries for the bookkeeping around writes (reading, creating
//!   or changing a target table): an unreachable ClickHouse never makes an event "bad".
//!
//! Which failures are retried is decided by the client's failure kind and the server's
//! exception code ([`clickhouse_transient`]), never by the message text.

use std::time::Duration;

use bytes::Bytes;
use prometheus::IntCounterVec;
use sluice_common::Shutdown;
use sluice_proto::{fnv1a, FNV_START};

use super::metrics::Metrics;
use super::part::TableBatch;
use super::{refused, Sink};
use crate::error::{clickhouse_transient, ApplyError, Origin};
use sluice_common::sql::clickhouse::ident;

/// Writes one table's part of a batch: one INSERT. Shared by the sink and the rebalance
/// callback (which writes the batch in hand before partitions are let go).
#[derive(Clone)]
pub(super) struct Writer {
    pub(super) client: clickhouse::Client,
    pub(super) database: String,
    pub(super) dedup_token: bool,
    /// The server knows `async_insert`: the INSERTs turn it off.
    pub(super) async_insert_off: bool,
    /// Rows go into Distributed tables (`cluster.distributed`): each INSERT returns once every
    /// shard has its rows (`insert_distributed_sync`), not when they are queued on this server.
    pub(super) distributed: bool,
    /// With `cluster.write = "shards"`: the shards, parts are written to.
    pub(super) shards: Option<std::sync::Arc<Shards>>,
    /// `cluster.local_suffix` (the per-shard tables' names), with `shards`.
    pub(super) local_suffix: String,
    /// `tables.version_column`: an INSERT without it is not deduplicated (below).
    pub(super) version_column: String,
    pub(super) rows: IntCounterVec,
    /// Failures in a row, for `/healthz`.
    pub(super) outage: std::sync::Arc<crate::group::Outage>,
    /// The server's URL (a password in it masked), named in the failures logged while
    /// retrying.
    pub(super) server: String,
}

/// The shards of `cluster.write = "shards"`: which shard a row goes to, and per shard its
/// replicas (URL with the password masked, client), in the order `cluster.shards` gives.
pub(crate) struct Shards {
    pub(super) slots: crate::clickhouse::cluster::Slots,
    pub(super) replicas: Vec<Vec<(String, clickhouse::Client)>>,
}

impl Writer {
    /// One table's part, one INSERT: into `name` on the server of `[clickhouse]`, or into the
    /// per-shard table on its shard's replicas (the next one when one does not answer; the
    /// last failure returned).
    pub(super) async fn insert_once(
        &self,
        name: &str,
        tb: &TableBatch,
    ) -> Result<(), clickhouse::error::Error> {
        let (Some(shards), Some(shard)) = (&self.shards, tb.shard) else {
            self.insert_into(&self.client, name, tb).await?;
            self.rows.with_label_values(&[name]).inc_by(tb.rows as u64);
            return Ok(());
        };
        let local = format!("{name}{}", self.local_suffix);
        let mut last = None;
        for (url, client) in &shards.replicas[shard] {
            match self.insert_into(client, &local, tb).await {
                Ok(()) => {
                    self.rows.with_label_values(&[name]).inc_by(tb.rows as u64);
                    return Ok(());
                }
                Err(e) if clickhouse_transient(&e) => {
                    tracing::warn!(table = %local, shard = shard + 1, server = %url, error = %e, "INSERT into a shard's replica failed; trying the next one");
                    last = Some(e);
                }
                Err(e) => return Err(e),
            }
        }
        Err(last.expect("a shard has a replica"))
    }

    async fn insert_into(
        &self,
        client: &clickhouse::Client,
        table: &str,
        tb: &TableBatch,
    ) -> Result<(), clickhouse::error::Error> {
        let sql = format!(
            "INSERT INTO {}.{} ({}) FORMAT RowBinary",
            ident(&self.database),
            ident(table),
            tb.columns
                .iter()
                .map(|c| ident(c))
                .collect::<Vec<_>>()
                .join(", ")
        );
        // The full pieces are shared, not copied; the one being filled is copied (at most about
        // a piece).
        let tail = Bytes::copy_from_slice(&tb.body);
        let pieces = tb.done.iter().chain(std::iter::once(&tail));
        let mut insert = client.insert_formatted_with(sql);
        if self.async_insert_off {
            // A batch already: written and acknowledged now, not queued by the server
            // (`async_insert` is on by default from ClickHouse 26.2).
            insert = insert.with_setting("async_insert", "0");
        }
        if self.distributed && tb.shard.is_none() {
            insert = insert.with_setting("insert_distributed_sync", "1");
        }
        // Every row the stage writes with its version is unique, so equal INSERTs are replays
        // and may be dropped. Without the version (a table made by hand without it) two equal
        // INSERTs can be two real changes (a value set back to what it was): ClickHouse's own
        // deduplication of equal blocks (on by default in Replicated tables) is turned off for
        // them, and no token is sent.
        let versioned = tb.columns.contains(&self.version_column);
        if !versioned {
            insert = insert.with_setting("insert_deduplicate", "0");
        }
        if self.dedup_token && versioned {
            // Only servers that know the setting get a token (hashing the batch costs CPU).
            let (hash, len) = pieces
                .clone()
                .fold((FNV_START, 0usize), |(h, n), p| (fnv1a(h, p), n + p.len()));
            let token = format!("{hash:016x}-{len}");
            insert = insert.with_setting("insert_deduplication_token", token);
        }
        for piece in pieces {
            if !piece.is_empty() {
                insert.send(piece.clone()).await?;
            }
        }
        insert.end().await?;
        Ok(())
    }
}

/// One table's part, retried until written, refused for good (an error the data will always
/// get) or shut down.
pub(super) async fn insert(
    writer: &Writer,
    metrics: &Metrics,
    name: &str,
    tb: TableBatch,
    shutdown: &Shutdown,
) -> Result<(), ApplyError> {
    let mut backoff = Duration::from_millis(500);
    loop {
        match writer.insert_once(name, &tb).await {
            Ok(()) => {
                writer.outage.ok();
                return Ok(());
            }
            Err(e) if !clickhouse_transient(&e) => {
                return Err(refused(format_args!("INSERT into {name} refused: {e}")))
            }
            Err(e) => {
                metrics.retries.inc();
                writer.outage.failing(&format!(
                    "ClickHouse {}: INSERT into {name}: {e}",
                    writer.server
                ));
                tracing::warn!(table = name, server = %writer.server, error = %e, retry_in = ?backoff, "INSERT failed; retrying");
                if shutdown.is_triggered() {
                    return Err(ApplyError::transient(
                        Origin::ClickHouse,
                        format!(
                            "ClickHouse: stopping with an unwritten batch for {name} (it is read again on restart): {e}"
                        ),
                    ));
                }
                tokio::select! {
                    _ = shutdown.wait() => {}
                    _ = tokio::time::sleep(backoff) => {}
                }
                backoff = (backoff * 2).min(sluice_common::RETRY_MAX);
            }
        }
    }
}

impl Sink {
    /// Run a statement of the bookkeeping around writes (reading or changing a target) until
    /// ClickHouse answers: unreachable or overloaded, it is retried with backoff as INSERTs
    /// are; its answer, success or refusal, is returned. A shutdown during the wait stops the
    /// sink.
    pub(super) async fn answered<T, F>(
        &self,
        what: &str,
        mut attempt: impl FnMut() -> F,
    ) -> Result<Result<T, clickhouse::error::Error>, ApplyError>
    where
        F: std::future::Future<Output = Result<T, clickhouse::error::Error>>,
    {
        let mut backoff = Duration::from_millis(500);
        loop {
            match attempt().await {
                Err(e) if clickhouse_transient(&e) => {
                    self.metrics.retries.inc();
                    self.writer
                        .outage
                        .failing(&format!("ClickHouse {}: {what}: {e}", self.writer.server));
                    tracing::warn!(what, server = %self.writer.server, error = %e, retry_in = ?backoff, "ClickHouse did not answer; retrying");
                    if self.shutdown.is_triggered() {
                        return Err(ApplyError::transient(
                            Origin::ClickHouse,
                            format!(
                                "ClickHouse: stopping while {what} waits for ClickHouse (read again on restart): {e}"
                            ),
                        ));
                    }
                    tokio::select! {
                        _ = self.shutdown.wait() => {}
                        _ = tokio::time::sleep(backoff) => {}
                    }
                    backoff = (backoff * 2).min(sluice_common::RETRY_MAX);
                }
                answer => {
                    self.writer.outage.ok();
                    return Ok(answer);
                }
            }
        }
    }
}
