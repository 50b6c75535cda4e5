//! The snapshot, seen from the binlog loop: which snapshot is due, and the steps taken between
//! two transactions (publish the chunks the readers sent once the stream has read as far as
//! their snapshot, ask for the next ones, finish).
//!
//! How a chunk is reconciled with the stream, and the reader tasks, are described in
//! [`crate::mysql::snapshot`]. The progress (each table's last published key) travels in every
//! checkpoint written after a chunk is published: a restart goes on from there, and a finished
//! snapshot's id is listed in the checkpoint so that it is not taken again.

use std::collections::HashSet;
use std::time::Duration;

use prost::Message;
use sluice_common::clock::now_micros;
use sluice_proto::v1::{self, Op, TableSchema};

use super::context::Capture;
use crate::error::CaptureError;
use crate::mysql::position::BinlogPos;
use crate::mysql::snapshot::{self, InFlight, Msg, SnapshotRun, TableRun};
use crate::snapshot::{SnapshotProgress, INITIAL};

impl Capture {
    /// Between transactions: the next queued snapshot (a renamed table, a rebuild), unless one
    /// runs.
    pub(super) async fn start_queued_snapshot(&mut self) -> Result<(), CaptureError> {
        if self.snapshot.is_none() && !self.snapshots_pending.is_empty() {
            self.next_snapshot(None).await?;
        }
        Ok(())
    }

    /// Start the snapshot that is due: an unfinished one from the checkpoint, the initial one,
    /// or a re-snapshot request not yet served.
    pub(super) async fn next_snapshot(
        &mut self,
        resume: Option<SnapshotProgress>,
    ) -> Result<(), CaptureError> {
        let config = self.config.snapshot.clone();
        let (id, only, progress) = if let Some(p) = resume {
            let names: Vec<String> = p.tables.keys().cloned().collect();
            (p.id.clone(), names, Some(p))
        } else if config.initial() && !self.snapshots_done.iter().any(|d| d == INITIAL) {
            (INITIAL.to_string(), Vec::new(), None)
        } else if !config.request_id.is_empty() && !self.snapshots_done.contains(&config.request_id)
        {
            (config.request_id.clone(), config.tables.clone(), None)
        } else if let Some(p) = self
            .snapshots_pending
            .iter()
            .find(|p| !self.snapshots_done.contains(&p.id))
        {
            (p.id.clone(), p.tables.clone(), None)
        } else {
            return Ok(());
        };
        let filter = &self.filter;
        let listed =
            snapshot::list_tables(&mut self.schema_conn, |db, t| filter.wants(db, t), &only)
                .await?;
        if progress.is_none() && id == config.request_id {
            // A request naming a table the capture cannot take is refused whole, its id not
            // used up: corrected, it runs.
            let refused: Vec<String> = only
                .iter()
                .filter_map(|name| {
                    let why = match crate::snapshot::split_name(name) {
                        None => "not a `database.table` name",
                        Some((db, t)) if !filter.wants(&db, &t) => "outside the capture's [filter]",
                        Some((db, t)) if !listed.iter().any(|(d, x, _)| *d == db && *x == t) => {
                            "no such table on the server"
                        }
                        Some(_) => return None,
                    };
                    Some(format!("{name}: {why}"))
                })
                .collect();
            if !refused.is_empty() {
                return Err(CaptureError::definite(
                    crate::error::Origin::Config,
                    format!(
                        "snapshot.tables of request {:?} names tables the capture cannot copy \
                         ({}); correct snapshot.tables (the request id is not used up)",
                        config.request_id,
                        refused.join("; ")
                    ),
                ));
            }
        }
        let mut tables = Vec::new();
        match &progress {
            Some(p) => {
                for (name, tp) in &p.tables {
                    let Some((db, table)) = name.split_once('.') else {
                        continue;
                    };
                    let estimate = listed
                        .iter()
                        .find(|(d, t, _)| d == db && t == table)
                        .map(|x| x.2)
                        .unwrap_or(0);
                    let mut run = snapshot::new_table_run(db.into(), table.into(), estimate);
                    snapshot::decode_key(&tp.after).map_err(CaptureError::source)?;
                    run.progress = tp.clone();
                    run.rows_at_start = tp.rows;
                    tables.push(run);
                }
            }
            None => {
                for (db, table, estimate) in listed {
                    tables.push(snapshot::new_table_run(db, table, estimate));
                }
            }
        }
        tracing::info!(
            snapshot = %id,
            tables = tables.len(),
            resumed = progress.is_some(),
            "snapshot starts; streaming goes on meanwhile"
        );
        self.snapshot = Some(SnapshotRun::new(
            id,
            tables,
            &config,
            &self.opts,
            self.server.mariadb,
            self.snapshot_metrics.clone(),
        ));
        Ok(())
    }

    /// Between two transactions: the snapshot's step; true when the capture should stop
    /// (`snapshot.mode = "snapshot"` and nothing left to take).
    pub(super) async fn snapshot_between_transactions(&mut self) -> Result<bool, CaptureError> {
        if self.snapshot_step().await? && self.config.snapshot.stop_after() {
            tracing::info!("snapshot published: stopping (snapshot.mode = \"snapshot\")");
            return Ok(true);
        }
        if self.snapshot.is_none() && self.config.snapshot.stop_after() {
            tracing::info!("no snapshot left to take (snapshot.mode = \"snapshot\")");
            return Ok(true);
        }
        Ok(false)
    }

    /// A keyless table's snapshot holds the stream at its position: no event is read until
    /// its rows are published.
    pub(super) fn stream_held(&self) -> bool {
        match self.snapshot.as_ref().and_then(|s| s.hold()) {
            None => false,
            Some(None) => true,
            Some(Some(p)) => !self.before(&p),
        }
    }

    /// Publish the chunks read, ask for the next ones, finish the snapshot when every table is
    /// done. Returns true when a snapshot just finished.
    async fn snapshot_step(&mut self) -> Result<bool, CaptureError> {
        let due = self
            .snapshot
            .as_ref()
            .is_some_and(|r| r.dirty || r.wait_for.as_ref().is_some_and(|p| !self.before(p)));
        if !due {
            return Ok(false);
        }
        let Some(mut run) = self.snapshot.take() else {
            return Ok(false);
        };
        run.dirty = false;
        run.wait_for = None;
        let result = self.snapshot_work(&mut run).await;
        let finished = match result {
            Ok(()) => run.done(),
            Err(e) => {
                self.snapshot = Some(run);
                return Err(e);
            }
        };
        if !finished {
            self.snapshot = Some(run);
            return Ok(false);
        }
        tracing::info!(snapshot = %run.id, "snapshot finished");
        run.update_metrics();
        self.snapshots_done.push(run.id.clone());
        let done = &self.snapshots_done;
        self.snapshots_pending.retain(|p| !done.contains(&p.id));
        drop(run);
        self.mark_now().await?;
        self.next_snapshot(None).await?;
        Ok(true)
    }

    async fn snapshot_work(&mut self, run: &mut SnapshotRun) -> Result<(), CaptureError> {
        let mut progressed = false;
        for i in 0..run.tables.len() {
            progressed |= self.publish_chunk(run, i).await?;
            progressed |= self.publish_held_rows(run, i).await?;
        }
        progressed |= self.ask_for_chunks(run).await?;
        run.refresh_watch();
        if progressed {
            run.update_metrics();
            // The checkpoint carries the progress: a restart goes on from here.
            run.refresh_progress();
            let progress = Some(run.progress());
            self.mark_with(progress).await?;
        }
        Ok(())
    }

    /// Keyed chunk read: publish what the stream did not touch since it was asked for, once
    /// the stream has read as far as the chunk's snapshot. True when a chunk was published.
    async fn publish_chunk(
        &mut self,
        run: &mut SnapshotRun,
        i: usize,
    ) -> Result<bool, CaptureError> {
        let reached = |f: &InFlight| match &f.ready {
            Some((_, _, Some(p))) => !self.before(p),
            Some((_, _, None)) => true,
            None => false,
        };
        let ready = run.tables[i]
            .in_flight
            .as_mut()
            .filter(|f| reached(f))
            .and_then(|f| f.ready.take().map(|r| (r, std::mem::take(&mut f.touched))));
        if let Some(Some((_, _, Some(p)))) = run.tables[i].in_flight.as_ref().map(|f| &f.ready) {
            // Still ahead of the stream: look again when the stream gets there.
            if run.wait_for.as_ref().is_none_or(|w| self.before_pos(p, w)) {
                run.wait_for = Some(p.clone());
            }
        }
        let Some(((schema, rows, at), touched)) = ready else {
            return Ok(false);
        };
        // A key a prepared XA transaction holds: the chunk's value of it is from before the
        // transaction, at a later version. The chunk is dropped (its progress kept) and read
        // again once the transaction has ended (no chunk is asked for meanwhile).
        let topic = self
            .topics
            .topic(&run.tables[i].database, &run.tables[i].table)?;
        if let Some(xid) = self.xa.holding_topic(&topic).map(str::to_string) {
            let mut key_bytes = Vec::new();
            let held = rows.iter().any(|r| {
                let key = snapshot::key_of(&schema, r);
                sluice_proto::append_event_key(&run.tables[i].key_prefix, &key, &mut key_bytes);
                self.xa.holds(&topic, &key_bytes)
            });
            if held {
                tracing::info!(table = %run.tables[i].name, xid = %xid, "a snapshot chunk holds rows a prepared XA transaction changed: it is read again once the transaction ends");
                run.tables[i].in_flight = None;
                run.metrics.chunks.with_label_values(&["read_again"]).inc();
                return Ok(true);
            }
        }
        let full = rows.len() as u64 >= run.chunk_rows;
        let last = rows.last().map(|r| snapshot::key_of(&schema, r));
        let t = &mut run.tables[i];
        let sent = self
            .publish_snapshot_rows(t, &schema, rows, Some(&touched), at.as_ref())
            .await?;
        t.in_flight = None;
        if let Some(k) = last {
            t.progress.after = snapshot::encode_key(&k);
        }
        t.progress.rows += sent;
        t.progress.done = !full;
        run.metrics.chunks.with_label_values(&["published"]).inc();
        SnapshotRun::log_progress(t, t.progress.done);
        Ok(true)
    }

    /// Keyless table: publish its rows once the stream holds at the snapshot's position. True
    /// when the table's rows all went.
    async fn publish_held_rows(
        &mut self,
        run: &mut SnapshotRun,
        i: usize,
    ) -> Result<bool, CaptureError> {
        let hold = run.tables[i]
            .in_flight
            .as_ref()
            .and_then(|f| f.hold.clone())
            .flatten();
        let at_hold = match run.tables[i]
            .in_flight
            .as_ref()
            .and_then(|f| f.hold.clone())
        {
            Some(Some(p)) if self.before(&p) => {
                // The stream has still to get there: look again when it does (its rows
                // may all have come already, and no message would wake us).
                if run.wait_for.as_ref().is_none_or(|w| self.before_pos(&p, w)) {
                    run.wait_for = Some(p);
                }
                false
            }
            Some(Some(_)) => true,
            _ => false,
        };
        if !at_hold {
            return Ok(false);
        }
        let t = &mut run.tables[i];
        let f = t.in_flight.as_mut().expect("checked");
        let rows = std::mem::take(&mut f.pending);
        let schema = f.schema.clone().expect("set with the hold");
        let ended = f.ended;
        if !rows.is_empty() {
            let sent = self
                .publish_snapshot_rows(t, &schema, rows, None, hold.as_ref())
                .await?;
            t.progress.rows += sent;
            SnapshotRun::log_progress(t, false);
        }
        if !ended {
            return Ok(false);
        }
        t.in_flight = None;
        t.progress.done = true;
        run.metrics.chunks.with_label_values(&["published"]).inc();
        SnapshotRun::log_progress(t, true);
        Ok(true)
    }

    /// Ask for more: one chunk per table, `parallel_tables` tables at a time, one keyless
    /// table at a time (it holds the stream). True when a table turned out to be gone.
    async fn ask_for_chunks(&mut self, run: &mut SnapshotRun) -> Result<bool, CaptureError> {
        let mut progressed = false;
        let mut busy = run.tables.iter().filter(|t| t.in_flight.is_some()).count();
        for i in 0..run.tables.len() {
            if busy >= run.parallel {
                break;
            }
            if run.tables[i].progress.done || run.tables[i].in_flight.is_some() {
                continue;
            }
            let (db, table) = (run.tables[i].database.clone(), run.tables[i].table.clone());
            let Some(schema) = self.schema_of(&db, &table).await? else {
                tracing::info!(table = %run.tables[i].name, "table gone: nothing to snapshot");
                run.tables[i].progress.done = true;
                progressed = true;
                continue;
            };
            let keyless = schema.primary_key.is_empty();
            if keyless && run.hold().is_some() {
                continue;
            }
            // Not while a prepared XA transaction holds rows of the table (see `xa`).
            let topic = self.topics.topic(&db, &table)?;
            if let Some(xid) = self.xa.holding_topic(&topic) {
                if !run.tables[i].waiting_xa {
                    tracing::info!(table = %run.tables[i].name, xid = %xid, "the snapshot of this table waits for a prepared XA transaction that changed it to end (XA COMMIT or XA ROLLBACK)");
                    run.tables[i].waiting_xa = true;
                }
                continue;
            }
            run.tables[i].waiting_xa = false;
            let after = snapshot::decode_key(&run.tables[i].progress.after)
                .map_err(CaptureError::source)?;
            let chunk = run.next_chunk;
            run.next_chunk += 1;
            let t = &mut run.tables[i];
            if t.started.is_none() {
                t.started = Some(std::time::Instant::now());
                SnapshotRun::log_progress(t, true);
            }
            t.in_flight = Some(InFlight {
                chunk,
                asked_at: self.stream_pos(),
                touched: Default::default(),
                ready: None,
                hold: keyless.then_some(None),
                schema: None,
                pending: Vec::new(),
                ended: false,
            });
            tokio::spawn(snapshot::read_chunk(
                run.pool.clone(),
                run.tx.clone(),
                snapshot::ChunkRequest {
                    chunk,
                    database: db,
                    table,
                    after,
                    limit: run.chunk_rows,
                    mariadb: run.mariadb,
                },
            ));
            busy += 1;
        }
        Ok(progressed)
    }

    /// A message of a snapshot reader.
    pub(super) async fn on_snapshot_msg(&mut self, msg: Msg) -> Result<(), CaptureError> {
        let file = self.file.clone();
        let read_to = self.read_to;
        let Some(run) = self.snapshot.as_mut() else {
            return Ok(());
        };
        run.dirty = true;
        let seq = |f: &str| sluice_proto::binlog_file_seq(f).unwrap_or(0);
        let retry = |run: &mut SnapshotRun, chunk: u64, why: &str| {
            if let Some(t) = run.table_of(chunk) {
                tracing::info!(table = %t.name, why, "snapshot chunk read again");
                t.in_flight = None;
            }
            run.metrics.chunks.with_label_values(&["retried"]).inc();
            run.refresh_watch();
        };
        match msg {
            Msg::Chunk {
                chunk,
                schema,
                rows,
                at,
            } => {
                let Some(t) = run.table_of(chunk) else {
                    return Ok(());
                };
                let f = t.in_flight.as_mut().expect("found by chunk");
                if let Some(p) = &at {
                    // The snapshot must include everything the stream read before asking.
                    if (seq(&p.file) << 32 | p.pos) < f.asked_at {
                        retry(run, chunk, "the snapshot is older than the stream position");
                        return Ok(());
                    }
                }
                f.ready = Some((schema, rows, at));
                f.hold = None;
            }
            Msg::Began { chunk, schema, at } => {
                let Some(t) = run.table_of(chunk) else {
                    return Ok(());
                };
                let f = t.in_flight.as_mut().expect("found by chunk");
                if (seq(&file), read_to) > (seq(&at.file), at.pos) {
                    // The stream already read past the snapshot: it cannot hold there.
                    retry(run, chunk, "the stream is past the snapshot position");
                    return Ok(());
                }
                f.hold = Some(Some(at));
                f.schema = Some(schema);
            }
            Msg::Batch { chunk, rows } => {
                if let Some(t) = run.table_of(chunk) {
                    let f = t.in_flight.as_mut().expect("found by chunk");
                    f.pending.extend(rows);
                }
            }
            Msg::Ended { chunk } => {
                if let Some(t) = run.table_of(chunk) {
                    t.in_flight.as_mut().expect("found by chunk").ended = true;
                }
            }
            Msg::Failed { chunk, error } => {
                if !error.is_transient() {
                    return Err(error);
                }
                tracing::warn!(%error, "snapshot read failed; it is read again");
                retry(run, chunk, "a transient failure");
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        }
        Ok(())
    }

    /// Publish snapshot rows as SNAPSHOT_READ events at the stream's position, leaving out the
    /// keys in `touched`. Returns how many were published.
    async fn publish_snapshot_rows(
        &mut self,
        t: &TableRun,
        schema: &TableSchema,
        rows: Vec<v1::Row>,
        touched: Option<&HashSet<Vec<u8>>>,
        at: Option<&BinlogPos>,
    ) -> Result<u64, CaptureError> {
        // Statements of the table read while behind the server wait for its next rows: these
        // are, read at `at` (after the statements: the schema after them), so they go first.
        let due = self.ddl_pending.iter().any(|p| {
            (p.database.as_str(), p.table.as_str()) == (&t.database, &t.table)
                && at.is_some_and(|at| {
                    let last = BinlogPos {
                        file: p.file.clone(),
                        pos: p.start,
                    };
                    self.before_pos(&last, at)
                })
        });
        if due {
            let (db, table) = (t.database.clone(), t.table.clone());
            self.publish_pending_ddl(&db, &table, Some(schema.clone()))
                .await?;
        }
        self.publish_schema(schema).await?;
        let topic = self.topics.topic(&t.database, &t.table)?;
        self.publisher.ensure_topic(&topic, false).await?;
        let at = self.read_to.max(4) - 1;
        // Rows of the snapshot, read now: committed now, as far as the stream can tell.
        let mut event = v1::ChangeEvent {
            schema_id: schema.schema_id,
            ..self.event(Op::SnapshotRead, (&t.database, &t.table), at, now_micros())?
        };
        let counter = self.publish_metrics.events.with_label_values(&[
            &t.database,
            &t.table,
            "snapshot_read",
        ]);
        let bytes = self
            .publish_metrics
            .bytes
            .with_label_values(&[&t.database, &t.table]);
        let rows_counter = self
            .snapshot_metrics
            .rows
            .with_label_values(&[&t.database, &t.table]);
        let keyless = schema.primary_key.is_empty();
        let mut key_bytes = Vec::with_capacity(64);
        let mut payload = Vec::with_capacity(512);
        let mut sent = 0u64;
        let mut skipped = 0u64;
        for row in rows {
            let key = snapshot::key_of(schema, &row);
            sluice_proto::append_event_key(&t.key_prefix, &key, &mut key_bytes);
            if touched.is_some_and(|k| k.contains(&key_bytes)) {
                skipped += 1;
                continue;
            }
            if keyless {
                // Every row its own place: the rows of one chunk share a version, and without
                // a key nothing else tells two equal rows apart.
                event.transaction = Some(v1::Transaction {
                    id: format!("snapshot {}:{at}", self.file),
                    index: t.progress.rows + sent,
                    last: false,
                });
            }
            event.key = Some(v1::Row { values: key });
            event.after = Some(row);
            payload.clear();
            event.encode(&mut payload).expect("a Vec grows as needed");
            let size = payload.len() + key_bytes.len();
            if size > self.config.publish.max_message_bytes {
                let key = event.key.take().map(|k| k.values).unwrap_or_default();
                let names: Vec<String> = schema
                    .primary_key
                    .iter()
                    .map(|&i| schema.columns[i as usize].name.clone())
                    .collect();
                self.refuse_oversized(&t.database, &t.table, size, &key, &names, at, 0)
                    .await?;
                break;
            }
            self.publisher
                .send(&topic, &key_bytes, &payload, None)
                .await?;
            counter.inc();
            bytes.inc_by(payload.len() as u64);
            sent += 1;
        }
        rows_counter.inc_by(sent);
        if skipped > 0 {
            self.snapshot_metrics
                .left_to_stream
                .with_label_values(&[&t.database, &t.table])
                .inc_by(skipped);
        }
        Ok(sent)
    }
}

/// The next message of the running snapshot's readers; never, without a snapshot.
pub(super) async fn recv(run: &mut Option<SnapshotRun>) -> Option<Msg> {
    match run {
        Some(r) => r.rx.recv().await,
        None => std::future::pending().await,
    }
}
