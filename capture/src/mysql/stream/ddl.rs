//! DDL and TRUNCATE statements as events.
//!
//! A statement naming tables (see [`crate::mysql::ddl`]) drops their cached schemas and
//! decoders, tells a snapshot under way (its chunk in flight is read again; a dropped or renamed
//! table's snapshot ends), and, for each table the filter takes, publishes one DDL (or TRUNCATE)
//! event carrying the schema after the statement, to every partition of the table's topic: each
//! apply instance sees it in order with the rows of its own partitions. The statement then
//! commits like a transaction.

use prost::Message;
use sluice_proto::event_key;
use sluice_proto::v1::{self, Op};

use super::context::{Capture, DdlBracket};
use crate::checkpoint::mysql::{PendingDdl, PendingSnapshot};
use crate::error::CaptureError;
use crate::mysql::ddl::TableRef;
use crate::mysql::position::BinlogPos;
use crate::mysql::rebuild::{self, Rebuild};
use mysql_async::prelude::Queryable;

impl Capture {
    /// Publish a DDL statement `kind` on `tables` (renamed to `renamed_to`), read at `start`.
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn apply_ddl(
        &mut self,
        kind: &'static str,
        sql: &str,
        default_db: &str,
        tables: Vec<TableRef>,
        renamed_to: Vec<TableRef>,
        start: u64,
        end: u64,
        ts: u32,
    ) -> Result<(), CaptureError> {
        let resolve = |t: &TableRef| {
            (
                t.database.clone().unwrap_or_else(|| default_db.to_string()),
                t.table.clone(),
            )
        };
        for (i, t) in tables.iter().enumerate() {
            let (db, table) = resolve(t);
            let new_name = renamed_to.get(i).map(resolve);
            self.schemas.remove(&(db.clone(), table.clone()));
            self.decoders
                .retain(|_, d| !(d.database == db && d.table == table));
            if let Some(s) = self.snapshot.as_mut() {
                s.on_ddl(&db, &table, kind == "drop" || new_name.is_some());
            }
            // A table renamed into the captured set: its rows from before the rename are in
            // no topic of its new name, so it is snapshotted under that name (once the
            // snapshot running, if any, is done; kept in the checkpoint until then).
            if let Some((ndb, nt)) = &new_name {
                if self.filter.wants(ndb, nt) {
                    // On the new name's topic first, ahead of its snapshot and later rows:
                    // rows of an earlier table of that name come before it on every
                    // partition, so the apply stages can tell them apart.
                    let after = self.renamed_schema(&db, &table, ndb, nt, end).await?;
                    self.publish_ddl_event(ndb, nt, "renamed", sql, after, None, start, ts)
                        .await?;
                    let id = format!("rename {}:{start} {ndb}.{nt}", self.file);
                    if !self.snapshots_done.contains(&id)
                        && !self.snapshots_pending.iter().any(|p| p.id == id)
                    {
                        tracing::info!(from = %format!("{db}.{table}"), to = %format!("{ndb}.{nt}"), "renamed table: snapshot of its new name queued");
                        self.snapshots_pending.push(PendingSnapshot {
                            id,
                            tables: vec![format!("{ndb}.{nt}")],
                        });
                    }
                }
            }
            if !self.filter.wants(&db, &table) {
                continue;
            }
            let here = (db.clone(), table.clone());
            if kind == "drop" || new_name.is_some() {
                // Gone under this name: what was waiting for its next rows goes too.
                self.ddl_pending
                    .retain(|p| (p.database.as_str(), p.table.as_str()) != (&db, &table));
                self.ddl_schemas.remove(&here);
                self.last_schema.remove(&here);
            }
            if matches!(kind, "alter" | "create") {
                // The server's schema now is the one after this statement only if the capture
                // is not behind it: else the statement waits for the table's next rows.
                if let Some(p) = self
                    .ddl_pending
                    .iter_mut()
                    .find(|p| p.database == db && p.table == table)
                {
                    p.statements.push(sql.to_string());
                    (p.file, p.start, p.ts) = (self.file.clone(), start, ts);
                    p.generation = Some(self.generation);
                    continue;
                }
                let after = self.schema_of(&db, &table).await?;
                if self.caught_up(end).await? {
                    if let Some(s) = &after {
                        self.ddl_schemas.insert(here, s.clone());
                    }
                    self.publish_ddl_event(&db, &table, kind, sql, after, None, start, ts)
                        .await?;
                } else {
                    // (an earlier DDL's schema is not the next rows' to check against)
                    self.ddl_schemas.remove(&here);
                    tracing::info!(database = %db, table = %table, kind, "DDL read behind the server: published with the table's next rows, or once the stream reaches where its schema is known");
                    let before = self
                        .last_schema
                        .get(&here)
                        .map(|s| sluice_common::hex::encode(&s.encode_to_vec()))
                        .unwrap_or_default();
                    self.ddl_pending.push(PendingDdl {
                        database: db,
                        table,
                        before,
                        kind: kind.to_string(),
                        statements: vec![sql.to_string()],
                        file: self.file.clone(),
                        start,
                        ts,
                        generation: Some(self.generation),
                    });
                }
                continue;
            }
            // The schema after the statement: of the new name for renames, none for drops.
            let after = match (&new_name, kind) {
                (_, "drop") => None,
                (Some((ndb, nt)), _) => {
                    self.schemas.remove(&(ndb.clone(), nt.clone()));
                    self.schema_of(ndb, nt).await?
                }
                (None, _) => self.schema_of(&db, &table).await?,
            };
            self.publish_ddl_event(&db, &table, kind, sql, after, new_name, start, ts)
                .await?;
        }
        Ok(())
    }
    /// The schema of table `db.table` renamed to `ndb.nt`: the one its last rows or statement
    /// had (information_schema's may be of a later table of the new name, when the capture is
    /// behind), under its new name; information_schema's when none is known. Statements of
    /// the table waiting for its next rows go on waiting, under the new name, placed at `end`
    /// (just after the rename): the schema published with the rename is the one before them,
    /// so the apply stages must apply them after it, not take them for older statements of
    /// the table the rename replaced.
    async fn renamed_schema(
        &mut self,
        db: &str,
        table: &str,
        ndb: &str,
        nt: &str,
        end: u64,
    ) -> Result<Option<v1::TableSchema>, CaptureError> {
        let old = (db.to_string(), table.to_string());
        let new = (ndb.to_string(), nt.to_string());
        self.schemas.remove(&new);
        self.ddl_pending
            .retain(|p| (&p.database, &p.table) != (&new.0, &new.1));
        for p in self.ddl_pending.iter_mut() {
            if (&p.database, &p.table) == (&old.0, &old.1) {
                (p.database, p.table) = new.clone();
                (p.file, p.start) = (self.file.clone(), end);
                p.generation = Some(self.generation);
            }
        }
        let Some(mut s) = self.last_schema.get(&old).cloned() else {
            return self.schema_of(ndb, nt).await;
        };
        s.database = new.0.clone();
        s.table = new.1.clone();
        s.schema_id = sluice_proto::schema_id(&s);
        self.publish_schema(&s).await?;
        self.last_schema.insert(new.clone(), s.clone());
        if !self
            .ddl_pending
            .iter()
            .any(|p| (&p.database, &p.table) == (&new.0, &new.1))
        {
            self.schemas.insert(new, s.clone());
        }
        Ok(Some(s))
    }

    /// Whether the server has written nothing to its binlog past `end` of the file being read:
    /// what information_schema said before this was asked is the schema as of `end`.
    pub(super) async fn caught_up(&mut self, end: u64) -> Result<bool, CaptureError> {
        let row: Option<mysql_async::Row> =
            self.schema_conn.query_first(self.server.status_sql).await?;
        let at = row.and_then(|r| Some((r.get::<String, _>(0)?, r.get::<u64, _>(1)?)));
        Ok(at.is_some_and(|(file, pos)| file == self.file && pos == end))
    }

    /// Statements read behind the server wait for the table's next rows, whose table map says
    /// the schema after them; a table no row reaches would make them wait as long as the
    /// server is never idle. So each waiting table takes, once per change of what waits,
    /// information_schema's schema and then the server's binlog position: that schema holds at
    /// that position (a statement shows in information_schema only once it is logged). When
    /// the stream reaches the position with nothing more of the table read (a statement, a
    /// rename or a drop changes what waits and voids the bracket; rows publish the statements
    /// first), it is the schema after the statements, which are published with it: at their
    /// place among the table's events, within the capture's lag, without a row.
    pub(super) async fn publish_ddl_reached(&mut self) -> Result<(), CaptureError> {
        if self.ddl_pending.is_empty() || self.skip_until.is_some() {
            self.ddl_brackets.clear();
            return Ok(());
        }
        let here = BinlogPos {
            file: self.file.clone(),
            pos: self.read_to,
        };
        let (mut due, mut take) = (Vec::new(), Vec::new());
        for p in &self.ddl_pending {
            let key = (p.database.clone(), p.table.clone());
            match self.ddl_brackets.get(&key) {
                Some(b) if b.waiting == DdlBracket::waiting_of(p) => {
                    if !self.before_pos(&here, &b.at) {
                        due.push(key);
                    }
                }
                _ => take.push(key),
            }
        }
        self.ddl_brackets.retain(|k, _| {
            self.ddl_pending
                .iter()
                .any(|p| (&p.database, &p.table) == (&k.0, &k.1))
        });
        for key in take {
            self.schemas.remove(&key);
            let schema = self.schema_of(&key.0, &key.1).await?;
            let row: Option<mysql_async::Row> =
                self.schema_conn.query_first(self.server.status_sql).await?;
            let Some(at) = row.and_then(|r| {
                Some(BinlogPos {
                    file: r.get::<String, _>(0)?,
                    pos: r.get::<u64, _>(1)?,
                })
            }) else {
                continue;
            };
            let Some(p) = self
                .ddl_pending
                .iter()
                .find(|p| (&p.database, &p.table) == (&key.0, &key.1))
            else {
                continue;
            };
            tracing::debug!(database = %key.0, table = %key.1, at = %format!("{}:{}", at.file, at.pos), "statements read behind the server: published once the stream reaches the position their schema was read at");
            let waiting = DdlBracket::waiting_of(p);
            self.ddl_brackets.insert(
                key,
                DdlBracket {
                    at,
                    waiting,
                    schema,
                },
            );
        }
        for key in due {
            let Some(b) = self.ddl_brackets.remove(&key) else {
                continue;
            };
            if let Some(s) = &b.schema {
                // (checked against the table map of its next rows, as a caught-up DDL's)
                self.ddl_schemas.insert(key.clone(), s.clone());
            }
            self.publish_pending_ddl(&key.0, &key.1, b.schema).await?;
        }
        Ok(())
    }

    /// Publish the DDL of `db.table` read while behind the server, with the schema its next
    /// rows were written with (`schema`, from their table map; `None`: information_schema's,
    /// once the capture has caught up).
    pub(super) async fn publish_pending_ddl(
        &mut self,
        db: &str,
        table: &str,
        schema: Option<v1::TableSchema>,
    ) -> Result<(), CaptureError> {
        let Some(i) = self
            .ddl_pending
            .iter()
            .position(|p| p.database == db && p.table == table)
        else {
            return Ok(());
        };
        let p = self.ddl_pending.remove(i);
        let kind = if p.kind == "create" {
            "create"
        } else {
            "alter"
        };
        let before = sluice_common::hex::decode(&p.before)
            .ok()
            .filter(|b| !b.is_empty())
            .and_then(|b| v1::TableSchema::decode(b.as_slice()).ok());
        if let Some(s) = &schema {
            self.last_schema
                .insert((db.to_string(), table.to_string()), s.clone());
        }
        let last = p.statements.last().cloned().unwrap_or_default();
        let (rebuild, rebuild_reason) = match (kind, &schema) {
            ("alter", Some(after)) => {
                let r = rebuild::after_alter(before.as_ref(), after, &p.statements);
                self.queue_rebuild(db, table, r, &p.file, p.start)
            }
            // A table made and then given rows without row events (a partition exchanged into
            // it) before its first rows were read: read once it is made.
            ("create", Some(after))
                if p.statements
                    .iter()
                    .skip(1)
                    .any(|s| crate::mysql::ddl::rows_changed_without_row_events(s).is_some()) =>
            {
                let later = p.statements.get(1..).unwrap_or_default();
                let r = rebuild::after_alter(None, after, later);
                self.queue_rebuild(db, table, r, &p.file, p.start)
            }
            _ => (0, String::new()),
        };
        let at = (
            p.file.as_str(),
            p.start,
            p.generation.unwrap_or(self.generation),
            "",
        );
        let event = v1::ChangeEvent {
            schema_id: schema.as_ref().map(|s| s.schema_id).unwrap_or(0),
            schema: schema.clone(),
            ddl: Some(v1::Ddl {
                statement: last,
                schema,
                kind: kind.to_string(),
                statements: if p.statements.len() > 1 {
                    p.statements.clone()
                } else {
                    Vec::new()
                },
                before,
                rebuild,
                rebuild_reason,
                ..Default::default()
            }),
            ..self.event_at(Op::Ddl, (db, table), at, i64::from(p.ts) * 1_000_000)?
        };
        self.send_to_table(&event, "ddl").await?;
        tracing::info!(database = %db, table = %table, statements = p.statements.len(), "DDL read behind the server published");
        Ok(())
    }

    /// Publish one DDL (or TRUNCATE) event of `db.table` to every partition of its topic.
    #[allow(clippy::too_many_arguments)]
    async fn publish_ddl_event(
        &mut self,
        db: &str,
        table: &str,
        kind: &'static str,
        sql: &str,
        after: Option<v1::TableSchema>,
        new_name: Option<(String, String)>,
        start: u64,
        ts: u32,
    ) -> Result<(), CaptureError> {
        let here = (db.to_string(), table.to_string());
        let before = self.last_schema.get(&here).cloned();
        let (rebuild, rebuild_reason) = match (kind, &after) {
            ("alter", Some(a)) => {
                let r = rebuild::after_alter(before.as_ref(), a, &[sql.to_string()]);
                let file = self.file.clone();
                self.queue_rebuild(db, table, r, &file, start)
            }
            _ => (0, String::new()),
        };
        match &after {
            Some(s) if matches!(kind, "alter" | "create") => {
                self.last_schema.insert(here, s.clone());
            }
            _ => {}
        }
        let op = if kind == "truncate" {
            Op::Truncate
        } else {
            Op::Ddl
        };
        let event = v1::ChangeEvent {
            transaction: self.transaction(true),
            schema_id: after.as_ref().map(|s| s.schema_id).unwrap_or(0),
            schema: after.clone(),
            ddl: Some(v1::Ddl {
                statement: sql.to_string(),
                schema: after.clone(),
                new_database: new_name.as_ref().map(|n| n.0.clone()).unwrap_or_default(),
                new_table: new_name.as_ref().map(|n| n.1.clone()).unwrap_or_default(),
                kind: kind.to_string(),
                reason: String::new(),
                statements: Vec::new(),
                before,
                rebuild,
                rebuild_reason,
            }),
            ..self.event(op, (db, table), start, i64::from(ts) * 1_000_000)?
        };
        self.send_to_table(&event, op_label(op)).await?;
        tracing::info!(database = %db, table = %table, kind, "DDL published");
        Ok(())
    }
}

impl Capture {
    /// After an ALTER of `db.table` read at `file:start`: a rebuild (see [`rebuild`]) queued as
    /// a snapshot of the table, taken once the one running (if any) is done and kept in the
    /// checkpoint until then; the DDL event's `rebuild` and `rebuild_reason`.
    fn queue_rebuild(
        &mut self,
        db: &str,
        table: &str,
        r: Rebuild,
        file: &str,
        start: u64,
    ) -> (i32, String) {
        let (kind, why) = match r {
            Rebuild::None => return (v1::Rebuild::None as i32, String::new()),
            Rebuild::Rows(why) => (v1::Rebuild::Rows, why),
            Rebuild::Table(why) => (v1::Rebuild::Table, why),
        };
        let id = format!("rebuild {file}:{start} {db}.{table}");
        let name = format!("{db}.{table}");
        let running = self.snapshot.as_ref().map(|s| s.id.as_str());
        // A rebuild of the table queued and not yet begun is taken after this statement too:
        // its rows will carry versions above this one's, so it stands for both.
        let covered = self.snapshots_pending.iter().any(|p| {
            p.id.starts_with("rebuild ")
                && p.tables == [name.clone()]
                && Some(p.id.as_str()) != running
                && !self.snapshots_done.contains(&p.id)
        });
        if covered {
            tracing::info!(database = %db, table = %table, reason = %why, "the table is read again after an ALTER: a rebuild of it queued earlier, not yet begun, stands for this one too");
        } else if !self.snapshots_done.contains(&id)
            && !self.snapshots_pending.iter().any(|p| p.id == id)
        {
            tracing::warn!(database = %db, table = %table, reason = %why, "the table is read again after an ALTER (a rebuild): its rows' stored values may have changed without row events");
            self.snapshots_pending.push(PendingSnapshot {
                id,
                tables: vec![name],
            });
        }
        (kind as i32, why)
    }

    /// Refuse table `db.table` from `start` on: its changes cannot be carried exactly (a row
    /// change logged as a statement, an image without every column). A DDL event of kind
    /// `refused` with the statement and the reason goes to every partition of its topic, before
    /// any later event of the table, and the apply stages stop the table, naming both. Said once
    /// per table while the capture runs (again after a restart, which is harmless).
    pub(super) async fn refuse_table(
        &mut self,
        db: &str,
        table: &str,
        statement: &str,
        reason: &str,
        start: u64,
        ts: u32,
    ) -> Result<(), CaptureError> {
        if !self.filter.wants(db, table)
            || !self.refused.insert((db.to_string(), table.to_string()))
        {
            return Ok(());
        }
        tracing::error!(database = %db, table = %table, at = %format!("{}:{start}", self.file), statement, reason, "table refused: its changes cannot be carried exactly");
        let event = v1::ChangeEvent {
            ddl: Some(v1::Ddl {
                statement: statement.to_string(),
                kind: "refused".into(),
                reason: reason.to_string(),
                ..Default::default()
            }),
            ..self.event(Op::Ddl, (db, table), start, i64::from(ts) * 1_000_000)?
        };
        self.send_to_table(&event, "refused").await?;
        Ok(())
    }
}

impl Capture {
    /// The captured tables a row change of `db.table` logged as a statement may also have
    /// written: through it when it is a view (the tables its definition names), or by its
    /// triggers (the tables their bodies name), and so on through those; as information_schema
    /// has them now. Over-counted rather than missed: any name there that is a captured table.
    pub(super) async fn tables_behind(
        &mut self,
        db: &str,
        table: &str,
    ) -> Result<Vec<(String, String)>, CaptureError> {
        let mut todo = vec![(db.to_string(), table.to_string())];
        let mut seen: Vec<(String, String)> = todo.clone();
        let mut out = Vec::new();
        while let Some((d, t)) = todo.pop() {
            if seen.len() > 1000 {
                break;
            }
            let texts: Vec<String> = self
                .schema_conn
                .exec(
                    "SELECT VIEW_DEFINITION FROM information_schema.VIEWS \
                     WHERE TABLE_SCHEMA = ? AND TABLE_NAME = ? \
                     UNION ALL SELECT ACTION_STATEMENT FROM information_schema.TRIGGERS \
                     WHERE EVENT_OBJECT_SCHEMA = ? AND EVENT_OBJECT_TABLE = ?",
                    (&d, &t, &d, &t),
                )
                .await?;
            for text in texts {
                for n in crate::mysql::ddl::names_in(&text, &d) {
                    if seen.contains(&n) {
                        continue;
                    }
                    seen.push(n.clone());
                    // (a keyword or a column is no table)
                    let exists: Option<String> = self
                        .schema_conn
                        .exec_first(
                            "SELECT TABLE_TYPE FROM information_schema.TABLES \
                             WHERE TABLE_SCHEMA = ? AND TABLE_NAME = ?",
                            (&n.0, &n.1),
                        )
                        .await?;
                    if exists.is_none() {
                        continue;
                    }
                    if self.filter.wants(&n.0, &n.1) {
                        out.push(n.clone());
                    }
                    todo.push(n);
                }
            }
        }
        Ok(out)
    }
}

impl Capture {
    /// A row event of `db.table` larger than `publish.max_message_bytes` (`size` bytes, the
    /// row `key`, or its place when the table has no key): refused with the key named, rather
    /// than handed to the producer, whose failure would stop the capture at the same row after
    /// every restart.
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn refuse_oversized(
        &mut self,
        db: &str,
        table: &str,
        size: usize,
        key: &[v1::Value],
        key_columns: &[String],
        start: u64,
        ts: u32,
    ) -> Result<(), CaptureError> {
        let max = self.config.publish.max_message_bytes;
        let row = if key.is_empty() {
            format!(
                "a row of the event at {}:{start} (the table has no key)",
                self.file
            )
        } else {
            let parts: Vec<String> = key_columns
                .iter()
                .zip(key)
                .map(|(c, v)| match &v.kind {
                    Some(k) => format!("{c} = {k:?}"),
                    None => format!("{c} = NULL"),
                })
                .collect();
            format!(
                "the row with key {} (at {}:{start})",
                parts.join(", "),
                self.file
            )
        };
        let reason = format!(
            "{row} makes an event of {size} bytes, more than publish.max_message_bytes \
             ({max}). Raise publish.max_message_bytes (up to the broker's message.max.bytes \
             and the topic's max.message.bytes), restart the capture and re-snapshot the table"
        );
        self.refuse_table(
            db,
            table,
            "(a row too large to publish)",
            &reason,
            start,
            ts,
        )
        .await
    }

    /// Send a table-wide event (DDL, TRUNCATE, refusal) to every partition of its table's
    /// topic, counted under `label`.
    async fn send_to_table(
        &mut self,
        event: &v1::ChangeEvent,
        label: &str,
    ) -> Result<(), CaptureError> {
        let (db, table) = (event.database.as_str(), event.table.as_str());
        let topic = self.topics.topic(db, table)?;
        self.publisher
            .send_to_every_partition(&topic, &event_key(db, table, &[]), &event.encode_to_vec())
            .await?;
        self.publish_metrics
            .events
            .with_label_values(&[db, table, label])
            .inc();
        Ok(())
    }
}

/// The `op` label of an event counter.
fn op_label(op: Op) -> &'static str {
    match op {
        Op::Insert => "insert",
        Op::Update => "update",
        Op::Delete => "delete",
        Op::SnapshotRead => "snapshot_read",
        Op::Ddl => "ddl",
        Op::Truncate => "truncate",
        _ => "other",
    }
}
