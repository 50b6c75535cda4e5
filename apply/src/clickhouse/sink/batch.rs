//! The batch: rows gathered per target table, written when full, its offsets stored once
//! ClickHouse acknowledged every table's part.
//!
//! - Rows are encoded straight into their table's part ([`TableBatch`]), in pieces that each
//!   end at a row's end; a row that fails is cut off again, and the event is refused.
//! - At most one batch is being written ([`InFlight`]) while the next is gathered; its offsets
//!   are stored before any later batch's, and a DDL event or a column list change waits for it
//!   ([`Sink::settle`]). A failed batch stores nothing, and nothing after it is stored either.
//! - Before partitions are let go, the rebalance callback writes both, the batch being written
//!   and then the one in hand ([`ChDrain`]), and stores their offsets; if that fails, nothing is
//!   stored, the next owner reads those events again (harmless: replays collapse), and the sink
//!   stops at its next step: a partition it keeps (or gets back) must never have a later offset
//!   stored over the events that were not written.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use rdkafka::consumer::{Consumer, StreamConsumer};
use rdkafka::message::BorrowedMessage;
use sluice_common::clock::now_micros;
use sluice_common::Shutdown;
use sluice_proto::v1::{Column, Op};
use sluice_proto::view::{self, RowEvent, ValueRef};

use super::part::TableBatch;
use super::writer::{insert, Writer};
use super::{undecodable, Context, Refusal, Sink};
use crate::clickhouse::rowbinary::{self, encode, text};
use crate::clickhouse::Mode;
use crate::error::{clickhouse_transient, ApplyError, BadEvent, Origin, Reason};
use crate::group::{block_on, BatchSink, Drain, Offsets};

/// Writes the batch in hand before partitions are let go (see [`crate::group`]).
pub(crate) struct ChDrain {
    pub(super) batch: Arc<Mutex<Batch>>,
    pub(super) in_flight: Arc<Mutex<InFlight>>,
    pub(super) writer: Writer,
    pub(super) runtime: tokio::runtime::Handle,
}

/// Appended to the refusal of a value a non-key column cannot hold.
const UNHELD_REMEDY: &str = "; or keep the table flowing with such values marked: \
    `[tables.unheld_tables] \"db.table\" = \"mark\"` writes NULL (or the type's zero) and names \
    the column in the row's `_sluice_unheld`; then take the table up again (`sluice status \
    --apply-config` lists the steps) and replay its dead letters";

/// The batch being written while the next one is gathered: at most one. Its offsets are
/// stored once it is written, before any later batch's.
#[derive(Default)]
pub(super) struct InFlight {
    task: Option<tokio::task::JoinHandle<Result<Offsets, ApplyError>>>,
    /// A write that failed where the sink did not see it (in the rebalance callback): the sink
    /// stops instead of storing later offsets past it.
    failed: Option<String>,
    /// A table whose rows ClickHouse refused for good, and its answer: stopped before the
    /// sink stops (see [`Sink::stop_refused`]).
    refused: Option<(String, String)>,
}

impl Drain for ChDrain {
    /// If the write fails, nothing is stored: the next owner reads those events again
    /// (harmless).
    fn drain(&self) -> Option<Offsets> {
        // First the batch being written: its offsets come before the batch in hand's.
        let task = self.in_flight.lock().expect("in-flight lock").task.take();
        let mut offsets = Offsets::default();
        if let Some(task) = task {
            match block_on(&self.runtime, task) {
                Ok(Ok(o)) => offsets = o,
                failed => {
                    let why = match failed {
                        Ok(Err(e)) => e.to_string(),
                        Err(e) => format!("the write task ended: {e}"),
                        Ok(Ok(_)) => unreachable!(),
                    };
                    tracing::warn!(error = %why, "the batch being written failed; its partitions' next owner reads it again");
                    self.in_flight.lock().expect("in-flight lock").failed = Some(why);
                    return None;
                }
            }
        }
        let mut taken = std::mem::take(&mut *self.batch.lock().expect("batch lock"));
        if taken.offsets.is_empty() {
            return (!offsets.is_empty()).then_some(offsets);
        }
        let dead = std::mem::take(&mut taken.dead);
        if let Err(e) = block_on(&self.runtime, crate::group::dead_letters_acknowledged(dead)) {
            tracing::warn!(error = %e, "a dead letter of the batch in hand was not acknowledged; its partitions' next owner reads it again");
            self.in_flight.lock().expect("in-flight lock").failed = Some(e);
            return None;
        }
        let write = async {
            for ((name, _), tb) in &taken.tables {
                if let Err(e) = self.writer.insert_once(name, tb).await {
                    if !clickhouse_transient(&e) {
                        self.in_flight.lock().expect("in-flight lock").refused =
                            Some((name.clone(), e.to_string()));
                    }
                    return Err(e);
                }
            }
            Ok::<(), clickhouse::error::Error>(())
        };
        match block_on(&self.runtime, write) {
            Ok(()) => {
                tracing::info!(
                    rows = taken.rows,
                    "wrote the batch in hand before letting partitions go"
                );
                offsets.merge(taken.offsets);
                Some(offsets)
            }
            Err(e) => {
                tracing::warn!(error = %e, rows = taken.rows,
                    "could not write the batch in hand before letting partitions go; their next owner reads it again");
                self.in_flight.lock().expect("in-flight lock").failed = Some(e.to_string());
                None
            }
        }
    }
}

#[derive(Default)]
pub(crate) struct Batch {
    /// Per target table and shard (0 unless rows go straight to the shards), its part.
    tables: BTreeMap<(String, usize), TableBatch>,
    /// The offsets stored once this batch is written.
    offsets: Offsets,
    rows: usize,
    bytes: usize,
    started: Option<Instant>,
    oldest_commit_micros: Option<i64>,
    /// Dead letters of this batch's events, handed to the producer: acknowledged before its
    /// offsets are stored.
    dead: Vec<crate::group::Pending>,
}

impl Sink {
    fn batch(&self) -> std::sync::MutexGuard<'_, Batch> {
        self.batch.lock().expect("batch lock")
    }

    fn full(&self) -> bool {
        let b = self.batch();
        b.rows >= self.config.batch.max_rows || b.bytes >= self.config.batch.max_bytes
    }

    /// Take one event: into the batch, or to the dead letters if it can never be written. Its
    /// offset is stored with the batch in hand's.
    async fn handle(
        &mut self,
        m: &BorrowedMessage<'_>,
        shutdown: &Shutdown,
    ) -> Result<(), ApplyError> {
        let dead = match self.apply_event(m, shutdown).await {
            Ok(()) => None,
            Err(Refusal::Bad(bad)) => {
                self.stop_table_for(m, &bad).await?;
                Some(self.dead_letter(m, &bad).await?)
            }
            Err(Refusal::Stop(e)) => return Err(e),
        };
        // The event belongs to the batch in hand now (one that a DDL began, if it flushed).
        let mut batch = self.batch();
        batch.dead.extend(dead);
        batch.started.get_or_insert_with(Instant::now);
        batch.offsets.record(m);
        Ok(())
    }

    /// Add the row of `event` (its image is read where it lies).
    pub(super) async fn add_row(&mut self, event: &RowEvent<'_>) -> Result<(), Refusal> {
        // Another instance may have stopped a table (its keys are on every partition): read
        // them again before taking a row, once 5 s have gone by.
        self.reread_stopped_if_due().await;
        let plan = match self.plans.get(&event.schema_id) {
            Some(p) if p.fits(event.version) => p.clone(),
            _ => {
                let p = self.plan(event).await?;
                self.plans.insert(event.schema_id, p.clone());
                p
            }
        };
        let op = event.op();
        let image = match op {
            Op::Delete => event.before,
            _ => event.after,
        }
        .ok_or_else(|| {
            BadEvent::new(Reason::Value, format!("{op:?} event without its row image"))
        })?;
        let schema = &plan.schema;
        // The row's shard hash, and the part it goes into.
        let shard_value = if plan.shard {
            Some(self.shard_value(event, &plan, image)?)
        } else {
            None
        };
        let shard = match (&self.writer.shards, shard_value) {
            (Some(s), Some(v)) => Some(s.slots.shard(v)),
            _ => None,
        };
        // (the key reused: the target's name copied into it, not a new string per row)
        let mut part = std::mem::take(&mut self.part_key);
        part.0.clear();
        part.0.push_str(&plan.target);
        part.1 = shard.unwrap_or(0);
        // One INSERT per table (and shard) per batch: a different column list (a schema
        // change) closes this table's parts first.
        let mut guard = loop {
            {
                // (the field, not `self.batch()`: `part_key` is put back while this is held)
                let guard = self.batch.lock().expect("batch lock");
                let other_columns = guard.tables.get(&part).is_some_and(|b| {
                    !Arc::ptr_eq(&b.columns, &plan.insert_columns)
                        && *b.columns != *plan.insert_columns
                });
                if !other_columns {
                    break guard;
                }
            }
            self.flush_table(&plan.target).await?;
        };
        let batch = &mut *guard;
        if !batch.tables.contains_key(&part) {
            batch.tables.insert(
                part.clone(),
                TableBatch {
                    columns: plan.insert_columns.clone(),
                    shard,
                    done: Vec::new(),
                    body: Vec::with_capacity(1 << 16),
                    rows: 0,
                },
            );
        }
        let tb = batch.tables.get_mut(&part).expect("made above");
        // Encode straight into the table's buffer; a failing row is cut off again.
        let start = tb.body.len();
        let value = |message: String| BadEvent::new(Reason::Value, message);
        let mut encode_row = || -> Result<Vec<&str>, BadEvent> {
            let mut n = 0;
            // The columns whose value the target does not hold (`tables.unheld = "mark"`).
            let mut unheld: Vec<&str> = Vec::new();
            for v in view::values(image) {
                let v = v.map_err(undecodable)?;
                let (Some(c), Some(t)) = (schema.columns.get(n), plan.types.get(n)) else {
                    return Err(value(format!(
                        "the row has more values than its schema's {} columns",
                        schema.columns.len()
                    )));
                };
                n += 1;
                if let Some(t) = t {
                    let is_key = schema.primary_key.contains(&(n as u32 - 1));
                    if let Some(e) = rowbinary::inexact_key(&v, t).filter(|_| is_key) {
                        return Err(value(format!(
                            "{}.{} row {} column {}: {e}",
                            event.database,
                            event.table,
                            key_text(schema, image),
                            c.name
                        )));
                    }
                    // Only a date or time its date column cannot hold (zero, partial, invalid,
                    // out of range) is marked; keys are exact or refused, and any other failure
                    // (a NULL into a non-Nullable column, a type the column does not take) is
                    // the target's shape, which stops the table as before.
                    let dated = rowbinary::date_into_date(&v, t);
                    let mark = plan.marked && !is_key && dated;
                    if mark && rowbinary::zero_date(&v, t) {
                        rowbinary::put_unheld(t, &mut tb.body);
                        unheld.push(&c.name);
                        continue;
                    }
                    let at = tb.body.len();
                    if let Err(e) = encode(v, c, t, &mut tb.body) {
                        if mark {
                            tb.body.truncate(at);
                            rowbinary::put_unheld(t, &mut tb.body);
                            unheld.push(&c.name);
                            continue;
                        }
                        let remedy = if is_key || !dated { "" } else { UNHELD_REMEDY };
                        return Err(value(format!(
                            "{}.{} row {} column {}: {e}{remedy}",
                            event.database,
                            event.table,
                            key_text(schema, image),
                            c.name
                        )));
                    }
                }
            }
            if n != schema.columns.len() {
                return Err(value(format!(
                    "the row has {n} values, its schema {} columns",
                    schema.columns.len()
                )));
            }
            let meta = Column::default();
            if let Some(t) = &plan.version {
                encode(ValueRef::Uint(event.version), &meta, t, &mut tb.body)
                    .map_err(|e| value(format!("version column: {e}")))?;
            }
            if let Some(t) = &plan.flag {
                let v = match plan.mode {
                    Mode::Mirror => ValueRef::Uint(u64::from(op == Op::Delete)),
                    Mode::Changelog => ValueRef::Text(op_name(op)),
                };
                encode(v, &meta, t, &mut tb.body)
                    .map_err(|e| value(format!("flag column: {e}")))?;
            }
            if let Some(t) = &plan.row {
                encode(
                    ValueRef::Uint(event.transaction_index),
                    &meta,
                    t,
                    &mut tb.body,
                )
                .map_err(|e| value(format!("row column: {e}")))?;
            }
            if plan.marked {
                rowbinary::put_strings(&unheld, &mut tb.body);
            }
            if let Some(v) = shard_value {
                tb.body.extend_from_slice(&v.to_le_bytes()); // UInt64
            }
            Ok(unheld)
        };
        let encoded = encode_row();
        self.part_key = part;
        let unheld = match encoded {
            Ok(unheld) => unheld,
            Err(bad) => {
                tb.body.truncate(start);
                return Err(Refusal::Bad(bad));
            }
        };
        for column in unheld {
            self.metrics
                .unheld
                .with_label_values(&[&plan.target, column])
                .inc();
            // Said once per column and process; the rows are those naming it.
            if self
                .unheld_said
                .insert((plan.target.clone(), column.to_string()))
            {
                tracing::warn!(
                    table = %plan.target,
                    column,
                    "a value the target column cannot hold was written as NULL (or the type's \
                     zero) and the column named in the row's {} (tables.unheld = \"mark\"); \
                     the rows: SELECT * FROM {}.{} WHERE has({}, '{}')",
                    self.config.tables.unheld_column,
                    self.config.clickhouse.database,
                    plan.target,
                    self.config.tables.unheld_column,
                    column.replace('\'', "\\'")
                );
            }
        }
        let len = tb.body.len() - start;
        tb.rows += 1;
        tb.row_done();
        batch.rows += 1;
        batch.bytes += len;
        if event.commit_time_micros > 0 {
            let o = batch
                .oldest_commit_micros
                .get_or_insert(event.commit_time_micros);
            *o = (*o).min(event.commit_time_micros);
        }
        Ok(())
    }

    /// The sharding value of a row of `plan` ([`shard_hash`]): of its key columns, each as
    /// RowBinary of its target column, in key order; of its version and transaction index for a
    /// table without a key.
    ///
    /// [`shard_hash`]: crate::clickhouse::cluster::shard_hash
    fn shard_value(
        &mut self,
        event: &RowEvent<'_>,
        plan: &super::target::Plan,
        image: &[u8],
    ) -> Result<u64, Refusal> {
        let schema = &plan.schema;
        let key = &schema.primary_key;
        let buf = &mut self.scratch;
        buf.clear();
        if key.is_empty() {
            buf.extend_from_slice(&event.version.to_le_bytes());
            buf.extend_from_slice(&event.transaction_index.to_le_bytes());
            return Ok(crate::clickhouse::cluster::shard_hash(buf));
        }
        let mut values: Vec<Option<ValueRef<'_>>> = vec![None; key.len()];
        for (n, v) in view::values(image).enumerate() {
            if let Some(k) = key.iter().position(|i| *i as usize == n) {
                values[k] = Some(v.map_err(undecodable)?);
            }
        }
        for (k, v) in key.iter().zip(values) {
            let n = *k as usize;
            let (Some(v), Some(c), Some(Some(t))) = (v, schema.columns.get(n), plan.types.get(n))
            else {
                return Err(BadEvent::new(
                    Reason::Value,
                    format!(
                        "{}.{}: key column {n} is missing from the row or the target {}, so \
                         the row's shard is not known",
                        event.database, event.table, plan.target
                    ),
                )
                .into());
            };
            encode(v, c, t, buf).map_err(|e| {
                BadEvent::new(
                    Reason::Value,
                    format!(
                        "{}.{} row {} key column {}: {e}",
                        event.database,
                        event.table,
                        key_text(schema, image),
                        c.name
                    ),
                )
            })?;
        }
        Ok(crate::clickhouse::cluster::shard_hash(buf))
    }

    /// Write one table's parts now (its column list changes), after the batch being written.
    pub(super) async fn flush_table(&mut self, name: &str) -> Result<(), ApplyError> {
        self.settle().await?;
        let parts: Vec<TableBatch> = {
            let mut b = self.batch();
            let keys: Vec<(String, usize)> = b
                .tables
                .range((name.to_string(), 0)..=(name.to_string(), usize::MAX))
                .map(|(k, _)| k.clone())
                .collect();
            keys.iter().filter_map(|k| b.tables.remove(k)).collect()
        };
        for tb in parts {
            self.pace.writing();
            if let Err(e) = insert(&self.writer, &self.metrics, name, tb, &self.shutdown).await {
                if e.is_transient() {
                    return Err(e);
                }
                return Err(self.stop_refused(name, &e.to_string()).await);
            }
        }
        Ok(())
    }

    /// ClickHouse refused the rows of target `name` for good (`why`): the table is stopped
    /// (kept in `tables.stopped_table`, so that every instance and the next start dead-letter
    /// its events), and the sink stops, nothing of the unwritten batch stored: after a restart
    /// the batch is read again, the stopped table's events going to the dead-letter topic and
    /// the other tables' rows written.
    pub(super) async fn stop_refused(&mut self, name: &str, why: &str) -> ApplyError {
        if let Some(e) = self.changed_meanwhile(name, why).await {
            return e;
        }
        let reason = format!(
            "ClickHouse refused the INSERT of its rows ({why}): the target's columns do not take \
             them. Remedy: make the target fit the source's schema (or drop it for the stage to \
             make it again), delete its row from {}, and re-snapshot the table",
            self.config.tables.stopped_table
        );
        if let Err(e) = self.stop_table(name, &reason).await {
            return e;
        }
        tracing::error!(table = %name, %reason, "table stopped");
        ApplyError::definite(
            Origin::ClickHouse,
            format!(
                "ClickHouse: table {name} stopped ({reason}); stopping, so that the batch not \
                 written is read again on restart: its events go to the dead-letter topic, the \
                 other tables' rows are written"
            ),
        )
    }

    /// Whether target `name` was changed by another instance since this one planned what it
    /// refused (`why`): an ALTER or a table made again, applied from that instance's own
    /// partitions' copy of a statement this one has not read yet, between this one's reading
    /// of the target and its write. Known by its record in `tables.ddl_table` having moved on
    /// (waited for a moment when the target's columns are found changed: the record follows
    /// the change), or by its claim to make the target again (waited for). Then the refusal is
    /// no reason to stop the table: the target is forgotten and the events not yet committed
    /// are read again ([`ApplyError::ReadAgain`]). A target changed by hand, with no record,
    /// stops as before. Five times a minute at most for one target; after that a refusal stops
    /// it.
    pub(super) async fn changed_meanwhile(&mut self, name: &str, why: &str) -> Option<ApplyError> {
        let now = std::time::Instant::now();
        let recent = self.read_again.entry(name.to_string()).or_default();
        recent.retain(|t| now.duration_since(*t) < std::time::Duration::from_secs(60));
        if recent.len() >= 5 {
            return None;
        }
        let known_version = self.applied.get(name).map_or(0, |s| s.version);
        let known_columns = self.targets.get(name).map(|t| t.columns.clone());
        // (another instance making it again: waited for)
        let remade = self.waited_for_remake(name).await;
        self.read_applied(name).await.ok()?;
        let recorded = |s: &Self| s.applied.get(name).map_or(0, |a| a.version) > known_version;
        let mut newer = remade || recorded(self);
        if !newer {
            // Columns not as this instance knew them, and no record of a statement yet: an
            // instance records what it applied right after applying it, so its record is
            // waited for a moment. None comes: the target was changed by hand, which stops
            // the table as before (re-adding a column dropped by hand would leave the rows
            // there without their values).
            let columns = self.describe(name).await.ok()?;
            let differs = known_columns.is_some_and(|k| k != columns);
            if differs {
                for _ in 0..20 {
                    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                    self.read_applied(name).await.ok()?;
                    if recorded(self) {
                        newer = true;
                        break;
                    }
                }
            }
        }
        if !newer {
            return None;
        }
        self.read_again
            .entry(name.to_string())
            .or_default()
            .push(now);
        self.targets.remove(name);
        self.plans.clear();
        Some(ApplyError::ReadAgain(
            Origin::ClickHouse,
            format!(
                "target {name} was changed by another instance while this one wrote it ({why}): \
                 read again with the target as it is now"
            ),
        ))
    }

    /// Start writing the batch in hand (after the one being written, whose offsets are stored
    /// first); the next batch is gathered meanwhile. Its offsets are stored once it is written.
    pub(super) async fn flush(&mut self, shutdown: &Shutdown) -> Result<(), ApplyError> {
        self.settle().await?;
        self.reread_stopped_if_due().await;
        let mut batch = std::mem::take(&mut *self.batch());
        if batch.tables.is_empty() {
            // Only events without rows (heartbeats, dead letters): nothing to wait for but the
            // dead letters' acknowledgements.
            crate::group::dead_letters_acknowledged(std::mem::take(&mut batch.dead))
                .await
                .map_err(|e| ApplyError::definite(Origin::Kafka, e))?;
            batch
                .offsets
                .store(&*self.consumer, &self.consumer.context().incarnations);
            self.metrics.group.written(&batch.offsets, None);
            return Ok(());
        }
        self.metrics.group.writing(batch.oldest_commit_micros);
        self.pace.writing();
        let (writer, metrics, shutdown) =
            (self.writer.clone(), self.metrics.clone(), shutdown.clone());
        let in_flight = self.in_flight.clone();
        let task = tokio::spawn(async move {
            let started = Instant::now();
            let mut batch = batch;
            for ((name, _), tb) in std::mem::take(&mut batch.tables) {
                // On failure nothing of this batch is stored; it is read again after a restart.
                if let Err(e) = insert(&writer, &metrics, &name, tb, &shutdown).await {
                    if !e.is_transient() {
                        in_flight.lock().expect("in-flight lock").refused =
                            Some((name.clone(), e.to_string()));
                    }
                    return Err(e);
                }
            }
            crate::group::dead_letters_acknowledged(std::mem::take(&mut batch.dead))
                .await
                .map_err(|e| ApplyError::definite(Origin::Kafka, e))?;
            metrics
                .group
                .written(&batch.offsets, batch.oldest_commit_micros);
            metrics.batch_rows.observe(batch.rows as f64);
            metrics
                .batch_seconds
                .observe(started.elapsed().as_secs_f64());
            if let Some(c) = batch.oldest_commit_micros {
                metrics
                    .latency
                    .observe((now_micros() - c).max(0) as f64 / 1e6);
            }
            Ok(batch.offsets)
        });
        self.in_flight.lock().expect("in-flight lock").task = Some(task);
        Ok(())
    }

    /// The table whose rows ClickHouse refused for good in the last write, and its answer.
    fn take_refused(&self) -> Option<(String, String)> {
        self.in_flight
            .lock()
            .expect("in-flight lock")
            .refused
            .take()
    }

    /// Wait for the batch being written, if any, and store its offsets.
    pub(super) async fn settle(&mut self) -> Result<(), ApplyError> {
        let (task, failed) = {
            let mut f = self.in_flight.lock().expect("in-flight lock");
            (f.task.take(), f.failed.take())
        };
        if let Some(why) = failed {
            if let Some((name, why)) = self.take_refused() {
                return Err(self.stop_refused(&name, &why).await);
            }
            return Err(ApplyError::definite(
                Origin::ClickHouse,
                format!("ClickHouse: a batch could not be written before a rebalance: {why}"),
            ));
        }
        if let Some(task) = task {
            let written = task.await.map_err(|e| {
                ApplyError::definite(
                    Origin::Sink,
                    format!("ClickHouse: the write task ended: {e}"),
                )
            })?;
            let offsets = match written {
                Ok(offsets) => offsets,
                Err(e) => {
                    return Err(match self.take_refused() {
                        Some((name, why)) => self.stop_refused(&name, &why).await,
                        None => e,
                    });
                }
            };
            offsets.store(&*self.consumer, &self.consumer.context().incarnations);
        }
        Ok(())
    }
}

fn op_name(op: Op) -> &'static str {
    match op {
        Op::Insert => "insert",
        Op::Update => "update",
        Op::Delete => "delete",
        Op::SnapshotRead => "snapshot",
        _ => "other",
    }
}

impl BatchSink for Sink {
    type Drain = ChDrain;

    fn consumer(&self) -> Arc<StreamConsumer<Context>> {
        self.consumer.clone()
    }

    fn batch_started(&self) -> Option<Instant> {
        self.batch().started
    }

    fn batch_full(&self) -> bool {
        self.full()
    }

    fn pace(&self) -> &crate::group::Pace {
        &self.pace
    }

    async fn on_message(
        &mut self,
        m: &BorrowedMessage<'_>,
        shutdown: &Shutdown,
    ) -> Result<(), ApplyError> {
        self.handle(m, shutdown).await
    }

    fn skip(&mut self, m: &BorrowedMessage<'_>) {
        let mut batch = self.batch();
        batch.started.get_or_insert_with(Instant::now);
        batch.offsets.record(m);
    }

    async fn write_held(&mut self, shutdown: &Shutdown) -> Result<(), ApplyError> {
        if self.batch().rows == 0 {
            // Idle: a table taken up again (or stopped by another instance) is seen without
            // waiting for a row (its /healthz and gauge with it).
            self.reread_stopped_if_due().await;
        }
        self.flush(shutdown).await
    }

    async fn settle(&mut self) -> Result<(), ApplyError> {
        Sink::settle(self).await
    }

    async fn rejoin(&mut self) -> Result<Arc<StreamConsumer<Context>>, ApplyError> {
        crate::group::retire(&self.consumer);
        // The write in flight ends first (written or not, nothing of it is stored: the new
        // consumer reads from the committed offsets, and a replay collapses).
        let task = self.in_flight.lock().expect("in-flight lock").task.take();
        if let Some(task) = task {
            let _ = task.await;
        }
        self.in_flight.lock().expect("in-flight lock").failed = None;
        let dropped = std::mem::take(&mut *self.batch.lock().expect("batch lock"));
        tracing::info!(
            rows = dropped.rows,
            "the batch in hand is dropped; its events are read again"
        );
        let new = super::consumer(
            &self.consumer_config,
            &self.config,
            &self.metrics,
            &self.batch,
            &self.in_flight,
            &self.writer,
            &self.health,
        )?;
        Ok(std::mem::replace(&mut self.consumer, Arc::new(new)))
    }
}

/// The row's primary key as `(a=1, b='x')` (every column without one), for messages.
fn key_text(schema: &sluice_proto::v1::TableSchema, image: &[u8]) -> String {
    let key: Vec<usize> = if schema.primary_key.is_empty() {
        (0..schema.columns.len()).collect()
    } else {
        schema.primary_key.iter().map(|i| *i as usize).collect()
    };
    let mut parts = Vec::new();
    for (i, v) in view::values(image).enumerate() {
        let (Ok(v), Some(c)) = (v, schema.columns.get(i)) else {
            break;
        };
        if key.contains(&i) {
            let mut t = text(&v, c);
            if let Some((i, _)) = t.char_indices().nth(64) {
                t.truncate(i);
                t.push('…');
            }
            let quoted = matches!(
                v,
                ValueRef::Text(_) | ValueRef::RawText { .. } | ValueRef::Bytes(_)
            );
            parts.push(if quoted {
                format!("{}='{}'", c.name, t.replace('\'', "''"))
            } else {
                format!("{}={t}", c.name)
            });
        }
    }
    format!("({})", parts.join(", "))
}
