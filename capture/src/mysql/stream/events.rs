//! One function per binlog event kind: what each does to the loop's state and what it
//! publishes.
//!
//! - rotate: the file being read (and, between transactions, the resume point);
//! - GTID (MySQL's, MariaDB's raw `0xa2`), anonymous GTID and `BEGIN`: a transaction begins;
//! - query: classified by [`crate::mysql::ddl::classify`]: COMMIT/ROLLBACK commit, a DDL
//!   statement is published (see `ddl`) and commits, a database statement drops its cached
//!   schemas;
//! - XID: commit;
//! - table map (`table_map`): the decoder of the rows that follow (schema, topic, counters,
//!   worked out once);
//! - rows: one event per row change, encoded from the row's bytes (see [`Image`]).
//!
//! A commit queues a mark (`marks`): the resume point after it. An event cut off by a lost
//! connection is read again, with the same versions, from the last commit.

use mysql_async::binlog::events::{
    Event, EventData, GtidEvent, QueryEvent, RotateEvent, RowsEventData, TableMapEvent,
};
use sluice_proto::v1::{self, Op};
use sluice_proto::EventHeader;

use super::context::Capture;
use crate::error::CaptureError;
use crate::mysql::ddl::{self, Statement, TxControl};
use crate::mysql::decode::{DecodeError, Image};
use crate::mysql::position::BinlogPos;

/// How often an idle capture checks that the server's binlog history is the one it read.
const HISTORY_CHECK_EVERY: std::time::Duration = std::time::Duration::from_secs(5);

/// Event type codes (the header's type byte) read here by number: mysql_common parses none of
/// MariaDB's own, nor these of MySQL's.
mod code {
    /// XA_PREPARE_LOG_EVENT (MySQL 5.7+, MariaDB 10.5+).
    pub(super) const XA_PREPARE: u8 = 38;
    /// MySQL 8.0.20+'s TRANSACTION_PAYLOAD_EVENT (`binlog_transaction_compression`).
    pub(super) const TRANSACTION_PAYLOAD: u8 = 40;
    /// MariaDB's ANNOTATE_ROWS_EVENT (the statement of the rows events after it).
    pub(super) const MARIADB_ANNOTATE_ROWS: u8 = 160;
    /// MariaDB's BINLOG_CHECKPOINT_EVENT.
    pub(super) const MARIADB_BINLOG_CHECKPOINT: u8 = 161;
    /// MariaDB's GTID_EVENT: a transaction begins.
    pub(super) const MARIADB_GTID: u8 = 162;
    /// MariaDB's GTID_LIST_EVENT (the GTIDs before a file).
    pub(super) const MARIADB_GTID_LIST: u8 = 163;
    /// MariaDB's START_ENCRYPTION_EVENT: the events after it are encrypted in the file (a
    /// server decrypts them for replicas, and sends no such event).
    pub(super) const MARIADB_START_ENCRYPTION: u8 = 164;
    /// MariaDB's compressed events (`log_bin_compress`): QUERY_COMPRESSED_EVENT, then the
    /// compressed WRITE/UPDATE/DELETE rows events, version 1 and 2.
    pub(super) const MARIADB_COMPRESSED: std::ops::RangeInclusive<u8> = 165..=171;
    /// Of those, the rows events: their post-header (the table id) is not compressed.
    pub(super) const MARIADB_COMPRESSED_ROWS: std::ops::RangeInclusive<u8> = 166..=171;
}

/// The table id a rows event's post-header starts with (6 bytes, little-endian).
fn rows_table_id(data: &[u8]) -> Option<u64> {
    let b = data.get(..6)?;
    Some(b.iter().rev().fold(0u64, |n, x| (n << 8) | u64::from(*x)))
}

/// Why an event of type `t` cannot be read, if it cannot: skipped, its rows would be lost, so
/// the capture stops at it.
fn unreadable(t: u8) -> Option<&'static str> {
    match t {
        // MySQL 8's compressed transaction: its events carry no position (log_pos 0).
        code::TRANSACTION_PAYLOAD => Some(
            "a compressed transaction (TRANSACTION_PAYLOAD event, written with \
             binlog_transaction_compression=ON); the capture does not decode these. Set \
             binlog_transaction_compression=OFF globally and in the sessions that turned it on; \
             then start the capture under a new connector name from a position past this event \
             (connector, mysql.start = FILE:POS) and re-snapshot the tables it wrote",
        ),
        t if code::MARIADB_COMPRESSED.contains(&t) => Some(
            "a compressed MariaDB binlog event (a query or rows event written while \
             log_bin_compress was ON: it stays in the binlog after the setting is turned off); \
             binlog compression is not supported: set log_bin_compress=OFF on the source",
        ),
        // A server decrypts its binlog for replicas and keeps this event to itself: events
        // after one would be read encrypted, as garbage.
        code::MARIADB_START_ENCRYPTION => Some(
            "a START_ENCRYPTION event, which a MariaDB server never sends to a replica: the \
             events after it would be read still encrypted. Read the binlog from the server \
             itself (mysql.url)",
        ),
        _ => None,
    }
}

/// One event a row change becomes: op, the image its key comes from, before, after.
type RowOut<'a> = (Op, &'a Image, Option<&'a Image>, Option<&'a Image>);

impl Capture {
    /// Dispatch one binlog event (its header's position and time first).
    pub(super) async fn handle(
        &mut self,
        event: &Event,
        table_map: Option<TableMapEvent<'static>>,
    ) -> Result<(), CaptureError> {
        let header = event.header();
        let end = u64::from(header.log_pos());
        let start = end.saturating_sub(u64::from(header.event_size()));
        let ts = header.timestamp();
        if ts != 0 {
            // The transaction's commit time where the server gives it (MySQL 8: microseconds,
            // from the GTID event), else the event's second.
            let micros = self
                .tx
                .as_ref()
                .map(|t| t.commit_time_micros)
                .filter(|&m| m > 0)
                .unwrap_or(i64::from(ts) * 1_000_000);
            self.publish_metrics
                .lag_seconds
                .set(crate::publish::lag_seconds(micros));
        }
        if end != 0 {
            self.metrics.offset.set(end as i64);
            self.read_to = end;
        }
        let t = header.event_type_raw();
        if code::MARIADB_COMPRESSED_ROWS.contains(&t) {
            // Rows of a table outside the filter: not this capture's to read, compressed or not.
            if let Some(id) = rows_table_id(event.data()).filter(|id| self.unwanted.contains(id)) {
                tracing::debug!(table_id = id, at = %format!("{}:{start}", self.file), "a compressed rows event of a table outside the filter, skipped");
                return Ok(());
            }
        }
        if let Some(why) = unreadable(t) {
            let past = if end > start {
                format!(
                    ". To go on past it (its changes never reach the targets: re-snapshot the \
                     tables it wrote), stop the capture and run `sluice position set --connector \
                     {} --binlog {}:{end}`, then start it again",
                    self.config.connector, self.file
                )
            } else {
                String::new()
            };
            return Err(CaptureError::source(format!(
                "{}:{start}: {why}{past}",
                self.file
            )));
        }
        match header.event_type_raw() {
            code::MARIADB_GTID => {
                self.on_mariadb_gtid(event.data(), header.server_id(), ts);
                return Ok(());
            }
            code::MARIADB_ANNOTATE_ROWS
            | code::MARIADB_BINLOG_CHECKPOINT
            | code::MARIADB_GTID_LIST => return Ok(()),
            // XA PREPARE: the rows read since XA START wait for the outcome (see `xa`).
            code::XA_PREPARE => {
                match super::xa::prepare_event(event.data()) {
                    Some((true, _)) => {
                        let rows = self.xa.finish_reading();
                        self.send_held(rows).await?;
                    }
                    Some((false, xid)) => {
                        tracing::info!(xid = %xid, at = %format!("{}:{start}", self.file), "XA transaction prepared: its rows wait for its XA COMMIT");
                        self.xa.prepare(xid);
                    }
                    None if self.xa.reading.is_some() => {
                        return Err(CaptureError::source(format!(
                            "{}:{start}: an XA_prepare event that cannot be read",
                            self.file
                        )))
                    }
                    None => {}
                }
                self.commit(end).await?;
                return Ok(());
            }
            _ => {}
        }
        let data = match event.read_data() {
            Ok(Some(d)) => d,
            Ok(None) => return Ok(()),
            Err(e) => {
                return Err(CaptureError::source(format!(
                    "cannot parse binlog event type {} at {}:{start}: {e}",
                    header.event_type_raw(),
                    self.file
                )))
            }
        };
        match data {
            EventData::RotateEvent(r) => self.on_rotate(&r),
            EventData::GtidEvent(g) => self.on_gtid(&g, ts),
            // At the head of a file read from its start (not a copy sent before a position
            // inside it): every transaction before the file.
            EventData::PreviousGtidsEvent(p)
                if self.tx.is_none()
                    && self.resume.file == self.file
                    && start >= self.resume.pos =>
            {
                self.gtid_set = Some(crate::mysql::gtid::from_previous_gtids(&p));
            }
            EventData::AnonymousGtidEvent(_) => {
                // A transaction without a GTID: the set no longer says what was read.
                if self.gtid_set.take().is_some_and(|s| !s.is_empty()) {
                    tracing::warn!(at = %format!("{}:{start}", self.file), "a transaction without a GTID (gtid_mode is not ON): a fail-over cannot resume by GTID set from here");
                }
                self.begin(
                    format!("{}:{start}", self.file),
                    String::new(),
                    i64::from(ts) * 1_000_000,
                );
            }
            EventData::QueryEvent(q) => self.on_query(&q, start, end, ts).await?,
            EventData::XidEvent(_) => {
                self.commit(end).await?;
                // (a rebuild queued by a statement published with this transaction's rows)
                self.start_queued_snapshot().await?;
            }
            // While skipping to a start time, a table map is not needed: a transaction
            // begins (ending the skip) before its own table maps.
            EventData::TableMapEvent(_) if self.skip_until.is_none() => {
                if let Some(tme) = table_map {
                    self.on_table_map(tme).await?;
                }
            }
            EventData::RowsEvent(rows) if self.skip_until.is_none() => {
                self.on_rows(&rows, start, ts).await?;
            }
            EventData::HeartbeatEvent if self.tx.is_none() => {
                // The server sends heartbeats only when it has nothing more to send.
                self.publish_metrics.lag_seconds.set(0.0);
                self.heartbeat().await?;
                // Idle, or stuck on a binlog deleted under the reader (RESET MASTER): the
                // server's history at the resume point is still the one read.
                if self
                    .history_checked
                    .is_none_or(|t| t.elapsed() >= HISTORY_CHECK_EVERY)
                {
                    self.history_checked = Some(std::time::Instant::now());
                    self.check_history(true).await?;
                }
                // Caught up: DDL still waiting for rows can take information_schema's schema,
                // if the server wrote nothing since it was read.
                if !self.ddl_pending.is_empty() && self.skip_until.is_none() {
                    let pending: Vec<(String, String)> = self
                        .ddl_pending
                        .iter()
                        .map(|p| (p.database.clone(), p.table.clone()))
                        .collect();
                    let mut schemas = Vec::new();
                    for (db, table) in pending {
                        self.schemas.remove(&(db.clone(), table.clone()));
                        let s = self.schema_of(&db, &table).await?;
                        schemas.push((db, table, s));
                    }
                    if self.caught_up(self.read_to).await? {
                        for (db, table, s) in schemas {
                            self.publish_pending_ddl(&db, &table, s).await?;
                        }
                        self.mark_now().await?;
                    }
                }
            }
            _ => {}
        }
        Ok(())
    }

    /// `XA START` (MySQL's), `XA COMMIT`, `XA ROLLBACK`: see `xa`. The outcome is a group of
    /// its own, which ends here.
    async fn on_xa(
        &mut self,
        x: super::xa::XaStatement,
        start: u64,
        end: u64,
    ) -> Result<(), CaptureError> {
        use super::xa::XaStatement;
        let at = format!("{}:{start}", self.file);
        match x {
            XaStatement::Start => {
                if self.skip_until.is_none() {
                    self.xa.start(self.resume.clone(), self.gtid_text());
                }
                return Ok(());
            }
            XaStatement::Commit {
                one_phase: true, ..
            } => {
                let rows = self.xa.finish_reading();
                self.send_held(rows).await?;
            }
            XaStatement::Commit { xid, .. } => match self.xa.take(&xid) {
                Some(rows) => {
                    tracing::info!(xid = %xid, at = %at, rows = rows.len(), "XA transaction committed: its rows are published");
                    self.send_held(rows).await?;
                }
                None if self.skip_until.is_none() => {
                    // Its rows are before the start: which tables it wrote is not known here
                    // (perhaps none the capture follows), so the stream goes on, loudly.
                    self.publish_metrics
                        .errors
                        .with_label_values(&["source"])
                        .inc();
                    tracing::error!(
                        xid = %xid,
                        at = %at,
                        "XA COMMIT of a transaction prepared before the capture's start \
                         position: its rows are not published; if it wrote captured tables, \
                         re-snapshot them"
                    )
                }
                None => {}
            },
            XaStatement::Rollback { xid } => {
                // Rolled back before its prepare: nothing of it was logged.
                if let Some(rows) = self.xa.take(&xid) {
                    tracing::info!(xid = %xid, at = %at, rows = rows.len(), "XA transaction rolled back: its rows are dropped");
                }
            }
        }
        self.commit(end).await
    }

    /// Publish rows held for an XA transaction's outcome.
    async fn send_held(&mut self, rows: Vec<super::xa::HeldRow>) -> Result<(), CaptureError> {
        for r in rows {
            // A keyless table whose snapshot is still to be read: it reads these rows (no
            // snapshot of a table is read while a prepared transaction holds rows of it).
            if r.keyless
                && self
                    .snapshot
                    .as_ref()
                    .is_some_and(|s| s.pending_table(&r.key_prefix))
            {
                continue;
            }
            // A chunk in flight leaves these keys out: read while the transaction was
            // prepared, it holds their values before it, at a later version.
            if let Some(s) = self.snapshot.as_mut() {
                s.touch(&r.key_prefix, &r.key);
            }
            r.counters.0.inc();
            r.counters.1.inc_by(r.payload.len() as u64);
            self.publisher
                .send(&r.topic, &r.key, &r.payload, None)
                .await?;
        }
        Ok(())
    }

    /// A new binlog file (or, first in a dump, the file the dump starts in).
    fn on_rotate(&mut self, r: &RotateEvent<'_>) {
        let mut name = r.name().to_string();
        if !self.server.binlogs.contains(&name) && name.len() > 4 {
            // The fake rotate's name may carry the checksum bytes at its end.
            let trimmed =
                String::from_utf8_lossy(&r.name_raw()[..r.name_raw().len() - 4]).to_string();
            if self.server.binlogs.contains(&trimmed)
                || sluice_proto::binlog_file_seq(&name).is_err()
            {
                name = trimmed;
            }
        }
        if !self.server.binlogs.contains(&name) {
            self.server.binlogs.push(name.clone());
        }
        if let Ok(seq) = sluice_proto::binlog_file_seq(&name) {
            self.metrics.file_number.set(seq as i64);
        }
        self.file = name;
        self.read_to = r.position().max(4);
        // A dump opened by GTID set (a `gtid:` start, a fail-over) stays resumable by that set
        // until its first commit: the server skips what the set holds, so the start of this
        // file is not where reading resumes (and its PREVIOUS_GTIDS is not what was read).
        if self.tx.is_none() && !self.resume.file.is_empty() {
            self.resume = BinlogPos {
                file: self.file.clone(),
                pos: r.position().max(4),
            };
        }
    }

    /// MariaDB's GTID event (raw bytes): seq_no u64, domain u32, flags u8.
    fn on_mariadb_gtid(&mut self, d: &[u8], server_id: u32, ts: u32) {
        if d.len() >= 13 {
            let seq = u64::from_le_bytes(d[0..8].try_into().expect("8 bytes"));
            let domain = u32::from_le_bytes(d[8..12].try_into().expect("4 bytes"));
            let gtid = format!("{domain}-{server_id}-{seq}");
            self.begin(gtid.clone(), gtid, i64::from(ts) * 1_000_000);
            // FL_PREPARED_XA: the group is an XA transaction up to its XA PREPARE.
            if d[12] & 0x40 != 0 {
                self.xa.start(self.resume.clone(), self.gtid_text());
            }
        }
    }

    /// MySQL's GTID event; MySQL 8 stamps it with the commit's microseconds.
    fn on_gtid(&mut self, g: &GtidEvent, ts: u32) {
        let gtid = crate::mysql::gtid::mysql_gtid(g.sid(), g.tag().map(|t| t.as_str()), g.gno());
        let commit = g.immediate_commit_timestamp();
        let micros = if commit > 0 {
            commit as i64
        } else {
            i64::from(ts) * 1_000_000
        };
        self.begin(gtid.clone(), gtid, micros);
    }

    /// A statement: transaction control, DDL, a database statement, or anything else (which
    /// commits when outside a transaction).
    async fn on_query(
        &mut self,
        q: &QueryEvent<'_>,
        start: u64,
        end: u64,
        ts: u32,
    ) -> Result<(), CaptureError> {
        let sql = q.query().to_string();
        let default_db = q.schema().to_string();
        if let Some(x) = super::xa::statement(&sql) {
            return self.on_xa(x, start, end).await;
        }
        match ddl::classify(&sql) {
            Statement::Transaction(TxControl::Begin) => {
                if self.tx.is_none() {
                    self.begin(
                        format!("{}:{start}", self.file),
                        String::new(),
                        i64::from(ts) * 1_000_000,
                    );
                }
            }
            Statement::Transaction(TxControl::Commit | TxControl::Rollback) => {
                self.commit(end).await?
            }
            Statement::Transaction(TxControl::Other) => {}
            Statement::Ddl {
                kind,
                tables,
                renamed_to,
            } => {
                if self.skip_until.is_none() {
                    let moved = ddl::rows_changed_without_row_events(&sql);
                    let mut refused = tables.clone();
                    self.apply_ddl(kind, &sql, &default_db, tables, renamed_to, start, end, ts)
                        .await?;
                    match moved {
                        // A tablespace discarded cannot be read (nor read again) until one
                        // is imported, whose rows come from a file: no rebuild can follow.
                        Some((clause, others)) if clause.contains("TABLESPACE") => {
                            let reason = format!(
                                "{clause} adds or removes rows without row events, and the \
                                 table cannot be read again meanwhile, so the target cannot \
                                 follow it. Once the tablespace is imported, empty the target \
                                 table, then re-snapshot the table (snapshot.request_id and \
                                 snapshot.tables in the capture's configuration) and restart \
                                 the apply stage"
                            );
                            refused.extend(others);
                            for t in &refused {
                                let db = t.database.clone().unwrap_or_else(|| default_db.clone());
                                self.refuse_table(&db, &t.table, &sql, &reason, start, ts)
                                    .await?;
                            }
                        }
                        // The statement's table is rebuilt (its ALTER event says so); the
                        // other table of an exchange, or a partition made a table, is too;
                        // a table made a partition is gone, as dropped.
                        Some((clause, others)) if !others.is_empty() => {
                            let kind = if clause == "CONVERT TABLE" {
                                "drop"
                            } else {
                                "alter"
                            };
                            self.apply_ddl(
                                kind,
                                &sql,
                                &default_db,
                                others,
                                Vec::new(),
                                start,
                                end,
                                ts,
                            )
                            .await?;
                        }
                        _ => {}
                    }
                }
                self.commit(end).await?;
                self.start_queued_snapshot().await?;
            }
            Statement::Database { kind, name } => {
                // Said at info for a database whose tables the capture has read; the other
                // databases' statements are none of its business.
                if self.schemas.keys().any(|(db, _)| db == &name) {
                    tracing::info!(kind, database = %name, "database statement");
                } else {
                    tracing::debug!(kind, database = %name, "database statement");
                }
                self.schemas.retain(|(db, _), _| db != &name);
                self.commit(end).await?;
            }
            Statement::Dml { tables } => {
                let reason = "a row change logged as a statement (the writing session's \
                    binlog_format was STATEMENT or MIXED, or the server emptied a MEMORY table) \
                    carries no row images, so its rows cannot be applied. Set binlog_format=ROW \
                    for every session that writes (SET GLOBAL binlog_format = 'ROW', then \
                    reconnect the clients) and re-snapshot the table";
                if self.skip_until.is_none() {
                    if tables.is_empty() {
                        return Err(CaptureError::source(format!(
                            "{}:{start}: {reason}; the statement names tables the capture \
                             cannot pick out, so it stops: {sql}",
                            self.file
                        )));
                    }
                    for t in &tables {
                        let db = t.database.clone().unwrap_or_else(|| default_db.clone());
                        self.refuse_table(&db, &t.table, &sql, reason, start, ts)
                            .await?;
                        // Through a view, or by a trigger: other tables changed too.
                        for (odb, ot) in self.tables_behind(&db, &t.table).await? {
                            let why = format!(
                                "{reason} (the statement wrote {db}.{}, a view or a table with \
                                 triggers whose definition names this table)",
                                t.table
                            );
                            self.refuse_table(&odb, &ot, &sql, &why, start, ts).await?;
                        }
                    }
                }
                if self.tx.is_none() {
                    self.commit(end).await?;
                }
            }
            Statement::Other => {
                if self.tx.is_none() {
                    self.commit(end).await?;
                }
            }
        }
        Ok(())
    }

    /// A rows event: one change event per row (two for a row whose key moved).
    async fn on_rows(
        &mut self,
        rows: &RowsEventData<'_>,
        start: u64,
        ts: u32,
    ) -> Result<(), CaptureError> {
        let Some(entry) = self.decoders.get(&rows.table_id()) else {
            return Ok(()); // a table the filter leaves out
        };
        if entry.schema.primary_key.is_empty()
            && self
                .snapshot
                .as_ref()
                .is_some_and(|r| r.pending_table(&entry.key_prefix))
            && self.xa.reading.is_none()
        {
            // A keyless table waiting for its snapshot: the snapshot, taken at a later
            // position, holds these rows; published here too they would be there twice. (Rows
            // of an XA transaction are held, so that the snapshot waits for its outcome: at the
            // commit they are dropped if the snapshot is still to be read, which sees them.)
            return Ok(());
        }
        let decoder = entry.decoder.clone();
        let schema = entry.schema.clone();
        let topic = entry.topic.clone();
        let key_prefix = entry.key_prefix.clone();
        let counters = entry.counters.clone();
        let bytes = entry.bytes.clone();
        self.publisher.ensure_topic(&topic, false).await?;
        let commit_time = self
            .tx
            .as_ref()
            .map(|t| t.commit_time_micros)
            .unwrap_or(i64::from(ts) * 1_000_000);
        // Everything but the row's own fields (op, version, row, transaction index, key and
        // images) is the same for every row of this event: encoded once, in `header`.
        let event = v1::ChangeEvent {
            transaction: self.transaction(false),
            schema_id: schema.schema_id,
            ..self.event(
                Op::Unspecified,
                (&schema.database, &schema.table),
                start,
                commit_time,
            )?
        };
        let header = EventHeader::new(&event);
        // The first row's version; row `r`'s is `r` more (checked for overflow per row).
        let base_version = self.version_at(&self.file, start, 0)?;
        let pk = &schema.primary_key;
        let mut payload = Vec::with_capacity(1024);
        let mut key_bytes = Vec::with_capacity(64);
        let mut key_row = Vec::with_capacity(32);
        let (mut before, mut after) = (Image::default(), Image::default());
        let mut changes = decoder.rows(rows);
        if let Some(image) = changes.partial_image() {
            // Checked per event (a bitmap): a session may set its own binlog_row_image.
            let (db, table) = (schema.database.clone(), schema.table.clone());
            let reason = format!(
                "its rows event at {}:{start} has a {image} image without every column (the \
                 writing session's binlog_row_image was MINIMAL or NOBLOB): the columns left out \
                 cannot be told from NULL. Set binlog_row_image=FULL for every session that \
                 writes (SET GLOBAL binlog_row_image = 'FULL', then reconnect the clients) and \
                 re-snapshot the table",
                self.file
            );
            self.refuse_table(&db, &table, "(a rows event)", &reason, start, ts)
                .await?;
            return Ok(());
        }
        let decode_error = |e: DecodeError| {
            CaptureError::decode(
                &format!("{}.{}", schema.database, schema.table),
                &format!("{}:{start}", self.file),
                e,
            )
        };
        let mut row = 0u32;
        while let Some(images) = changes
            .next_into(&mut before, &mut after)
            .map_err(decode_error)?
        {
            let version = if start + u64::from(row) < 1 << 32 {
                base_version + u64::from(row)
            } else {
                self.version_at(&self.file, start, row)?
            };
            // (op, the image the key comes from, before, after)
            let out: [Option<RowOut>; 2] = match images {
                (false, true) => [Some((Op::Insert, &after, None, Some(&after))), None],
                (true, false) => [Some((Op::Delete, &before, Some(&before), None)), None],
                (true, true) if !pk.is_empty() && !before.same_key(&after, pk) => [
                    // A moved row: delete the old key, insert the new one, each on its own
                    // key's partition.
                    Some((Op::Delete, &before, Some(&before), None)),
                    Some((Op::Insert, &after, None, Some(&after))),
                ],
                (true, true) => [
                    Some((Op::Update, &after, Some(&before), Some(&after))),
                    None,
                ],
                (false, false) => [None, None],
            };
            for (op, keyed, b, a) in out.into_iter().flatten() {
                let index = match self.tx.as_mut() {
                    Some(t) => {
                        t.index += 1;
                        t.index - 1
                    }
                    None => 0,
                };
                keyed.event_key(&key_prefix, pk, &mut key_bytes);
                // (a row held for an XA transaction's outcome touches its key when it is
                // published, at the XA COMMIT: see `xa`)
                if let (Some(s), None) = (self.snapshot.as_mut(), self.xa.reading.as_ref()) {
                    s.touch(&key_prefix, &key_bytes);
                }
                keyed.key_row(pk, &mut key_row);
                payload.clear();
                header.encode(
                    op,
                    version,
                    row,
                    index,
                    &key_row,
                    b.map(Image::bytes),
                    a.map(Image::bytes),
                    &mut payload,
                );
                if payload.len() + key_bytes.len() > self.config.publish.max_message_bytes {
                    let key: Vec<v1::Value> = pk.iter().map(|&i| keyed.value_of(i)).collect();
                    let names: Vec<String> = pk
                        .iter()
                        .map(|&i| schema.columns[i as usize].name.clone())
                        .collect();
                    let size = payload.len() + key_bytes.len();
                    let (db, table) = (schema.database.clone(), schema.table.clone());
                    self.refuse_oversized(&db, &table, size, &key, &names, start, ts)
                        .await?;
                    return Ok(());
                }
                let counter = &counters[match op {
                    Op::Insert => 0,
                    Op::Update => 1,
                    _ => 2,
                }];
                if self.xa.reading.is_some() {
                    // Counted when published, at the XA COMMIT.
                    self.xa.hold(super::xa::HeldRow {
                        topic: topic.clone(),
                        keyless: pk.is_empty(),
                        key_prefix: key_prefix.to_vec(),
                        key: key_bytes.clone(),
                        payload: payload.clone(),
                        counters: (counter.clone(), bytes.clone()),
                    });
                } else {
                    counter.inc();
                    bytes.inc_by(payload.len() as u64);
                    self.publisher
                        .send(&topic, &key_bytes, &payload, None)
                        .await?;
                }
            }
            row += 1;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rows_events_table_id_is_its_first_six_bytes() {
        assert_eq!(
            rows_table_id(&[0x12, 0x34, 0, 0, 0, 1, 0xff, 0xff]),
            Some(0x0100_0000_3412)
        );
        assert_eq!(rows_table_id(&[1, 2]), None);
    }

    #[test]
    fn compressed_and_encrypted_events_are_refused_not_skipped() {
        let refused: Vec<u8> = (0..=255).filter(|t| unreadable(*t).is_some()).collect();
        // MySQL's TRANSACTION_PAYLOAD; MariaDB's START_ENCRYPTION, QUERY_COMPRESSED and the
        // six compressed rows events (WRITE, UPDATE, DELETE; versions 1 and 2).
        let mut want = vec![40];
        want.extend(164..=171);
        assert_eq!(refused, want);
        assert!(unreadable(166).unwrap().contains("log_bin_compress=OFF"));
    }
}
