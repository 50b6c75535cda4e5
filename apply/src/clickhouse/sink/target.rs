//! Target tables and how the rows of a source schema are written into them.
//!
//! - A source table's target is named by `tables.name`; what the server has of it (its columns
//!   and their types) is read once from `system.columns` and kept ([`Target`]). A missing
//!   table is created from the schema (`tables.create`, `super::create`). An existing mirror
//!   whose engine does not hide deleted rows under `FINAL` is said so in the log at first use
//!   (it needs `WHERE deleted = 0`).
//! - Source columns the target lacks are added before the first row that has them
//!   (`super::columns`, which also drops, renames and widens them for DDL events).
//! - A [`Plan`] is worked out once per schema id: per source column its target type (or none,
//!   when the target lacks it), and the INSERT's column list. Plans are dropped when a DDL
//!   arrives, since target columns may change.
//!
//! Every statement here waits for an unreachable ClickHouse ([`Sink::answered`]); only the
//! server refusing one makes the event bad.

use std::collections::BTreeMap;
use std::sync::Arc;

use prost::Message as _;
use sluice_proto::v1::{Column, TableSchema};
use sluice_proto::view::RowEvent;

use super::{refused, undecodable, Refusal, Sink};
use crate::clickhouse::types::{map_column, ChType, Features};
use crate::clickhouse::{Mode, OnUnheld};
use crate::error::{ApplyError, BadEvent, Origin, Reason};

/// Whether an `engine_full` is a ReplacingMergeTree whose `is_deleted` is `deleted`.
fn hides_deleted(engine: &str, deleted: &str) -> bool {
    let unquoted = |n: &str| n.trim().trim_matches('`').trim_matches('"').to_string();
    // A Replicated engine's first two arguments are its path and replica name.
    let (rest, skip) = match engine.strip_prefix("ReplicatedReplacingMergeTree(") {
        Some(rest) => (Some(rest), 2),
        None => (engine.strip_prefix("ReplacingMergeTree("), 0),
    };
    rest.and_then(|rest| rest.split(')').next())
        .and_then(|args| args.split(',').nth(1 + skip))
        .is_some_and(|a| unquoted(a) == unquoted(deleted))
}

/// What is known of a target table.
#[derive(Clone)]
pub(super) struct Target {
    pub(super) name: String,
    pub(super) mode: Mode,
    /// Column name -> ClickHouse type, as the server has them.
    pub(super) columns: BTreeMap<String, ChType>,
    /// The source schema last written into it (rows or an ALTER), when known since start: an
    /// ALTER's changes are worked out against it.
    pub(super) source: Option<Arc<TableSchema>>,
    /// Source columns an ALTER renamed since start, old name -> new: rows of a schema before
    /// the rename (read later from another partition) write into the renamed column.
    pub(super) renamed: BTreeMap<String, String>,
    /// Source columns an ALTER dropped since start: rows of a schema before the drop do not
    /// add them back.
    pub(super) dropped: std::collections::HashSet<String>,
    /// The version of the event whose schema this process created the table from: a row of an
    /// older schema with a column the target lacks had it renamed or dropped since, which the
    /// created table knows nothing of.
    pub(super) created_at: Option<u64>,
    /// The version of the statement this process made the table again for (`rebuild`): rows
    /// older than it are deleted by their own partition's copy of it.
    pub(super) remade_at: Option<u64>,
}

impl Target {
    /// The target column a source column `name` is written into, if the target has one.
    pub(super) fn column_of<'a>(&'a self, name: &'a str) -> Option<&'a str> {
        if self.columns.contains_key(name) {
            return Some(name);
        }
        let mut n = name;
        // a -> b -> c: follow the renames (a bounded walk: a cycle ends it).
        for _ in 0..self.renamed.len() {
            match self.renamed.get(n) {
                Some(next) if self.columns.contains_key(next) => return Some(next),
                Some(next) => n = next,
                None => break,
            }
        }
        None
    }

    /// Whether source column `name` was dropped by an ALTER applied since (itself, or under
    /// the name a rename gave it: `a` renamed to `b`, then `b` dropped). A row of an older
    /// schema, read late from another partition or replayed, must not add it back.
    pub(super) fn gone(&self, name: &str) -> bool {
        let mut n = name;
        for _ in 0..=self.renamed.len() {
            if self.dropped.contains(n) {
                return true;
            }
            match self.renamed.get(n) {
                Some(next) => n = next,
                None => break,
            }
        }
        false
    }
}

/// How the rows of one schema are written: worked out once per schema id.
pub(super) struct Plan {
    pub(super) target: String,
    pub(super) mode: Mode,
    pub(super) schema: Arc<TableSchema>,
    /// Per source column, in schema order: the target type, or `None` if the target lacks it.
    pub(super) types: Vec<Option<ChType>>,
    /// The bookkeeping columns' types, where the target has them.
    pub(super) version: Option<ChType>,
    pub(super) flag: Option<ChType>,
    /// A change log's row column (tables without a primary key), where the target has it.
    pub(super) row: Option<ChType>,
    /// The shard column (UInt64) is written: the row's [`shard_hash`].
    ///
    /// [`shard_hash`]: crate::clickhouse::cluster::shard_hash
    pub(super) shard: bool,
    /// `tables.unheld = "mark"` for this table (and the target has its `unheld_column`): a
    /// value a non-key column cannot hold is written as NULL (or the type's zero) and named.
    pub(super) marked: bool,
    /// The INSERT's column list.
    pub(super) insert_columns: Arc<Vec<String>>,
    /// Rows older than this version are superseded (of the table before, or read again later):
    /// their columns of another type than the target's are left out. The plan is for such
    /// rows when `superseded`, else for the others.
    pub(super) superseded_before: u64,
    pub(super) superseded: bool,
}

impl Plan {
    /// Whether this plan is the one for a row of `version`.
    pub(super) fn fits(&self, version: u64) -> bool {
        (version < self.superseded_before) == self.superseded
    }
}

impl Sink {
    /// The server's features with source table `db.table`'s `tables.temporal`.
    pub(super) fn features_for(&self, db: &str, table: &str) -> Features {
        self.features
            .with_temporal(self.config.tables.temporal_of(&format!("{db}.{table}")))
    }

    pub(super) fn target_name(&self, db: &str, table: &str) -> String {
        self.config
            .tables
            .name
            .replace("{db}", db)
            .replace("{table}", table)
    }

    /// The schema of `event`: carried inline, or from the schema topic.
    async fn schema(&mut self, event: &RowEvent<'_>) -> Result<TableSchema, Refusal> {
        if let Some(s) = event.schema {
            let s = TableSchema::decode(s).map_err(undecodable)?;
            self.schemas.remember(&s);
        }
        match self.schemas.get(event.schema_id).await {
            Ok(Some(s)) => {
                key_in_range(&s)?;
                Ok(s)
            }
            Ok(None) => Err(BadEvent::new(
                Reason::UnknownSchema,
                format!(
                    "schema {} of {}.{} is not on the schema topic {}",
                    sluice_proto::schema_record_key(event.schema_id),
                    event.database,
                    event.table,
                    self.config.schema_topic
                ),
            )
            .into()),
            // Kafka failing, not the event: stop rather than dead-letter what is readable.
            Err(e) => Err(ApplyError::definite(
                Origin::Kafka,
                format!("reading the schema topic {}: {e}", self.config.schema_topic),
            )
            .into()),
        }
    }

    /// The target of a source table: known, read from the server, or created.
    pub(super) async fn target(
        &mut self,
        schema: &TableSchema,
        version: u64,
    ) -> Result<Target, Refusal> {
        let name = self.target_name(&schema.database, &schema.table);
        if let Some(t) = self.targets.get(&name) {
            return Ok(t.clone());
        }
        let source = format!("{}.{}", schema.database, schema.table);
        let mut mode = self.config.tables.mode_of(&source);
        if mode == Mode::Mirror && schema.primary_key.is_empty() {
            tracing::warn!(table = %source, "no primary key: mirror mode impossible, writing a change log");
            mode = Mode::Changelog;
        }
        let mut columns = self.describe(&name).await?;
        let mut created_at = None;
        if columns.is_empty() {
            if !self.config.tables.create {
                return Err(BadEvent::new(
                    Reason::Value,
                    format!(
                        "target table {}.{name} does not exist and tables.create is off",
                        self.config.clickhouse.database
                    ),
                )
                .into());
            }
            self.create(&name, mode, schema).await?;
            columns = self.describe(&name).await?;
            created_at = Some(version);
        } else if mode == Mode::Mirror && self.features.is_deleted {
            self.warn_of_old_engine(&name).await?;
        }
        if self.config.cluster.to_shards() {
            self.check_sharding(&name, &columns).await?;
        }
        let t = Target {
            name: name.clone(),
            mode,
            columns,
            source: None,
            renamed: self
                .applied
                .get(&name)
                .map(|a| a.renamed.clone())
                .unwrap_or_default(),
            dropped: self
                .applied
                .get(&name)
                .map(|a| a.dropped.clone())
                .unwrap_or_default(),
            created_at,
            remade_at: None,
        };
        self.targets.insert(name, t.clone());
        Ok(t)
    }

    /// With `write = "shards"`: rows go where the Distributed table `name` would send them
    /// only if it is sharded by the shard column, over this cluster's per-shard tables, and
    /// that column holds UInt64. A table sharded otherwise (made by an earlier version with
    /// `cityHash64` of the key, or by hand) is refused: written straight to the shards, a row's
    /// versions could land on two of them and `FINAL` would show both.
    async fn check_sharding(
        &self,
        name: &str,
        columns: &BTreeMap<String, ChType>,
    ) -> Result<(), Refusal> {
        let cluster = &self.config.cluster;
        let engine = self
            .about::<String>(
                &format!("reading the engine of {name}"),
                "SELECT engine_full FROM system.tables WHERE database = ? AND name = ?",
                name,
            )
            .await?
            .pop()
            .unwrap_or_default();
        let args = crate::clickhouse::cluster::engine_args(&engine);
        let local = cluster.local(name);
        let column = &cluster.shard_column;
        let why = if !engine.starts_with("Distributed(") {
            Some(format!("it is not a Distributed table ({engine:?})"))
        } else if args.len() < 4
            || args[0] != cluster.name
            || args[1] != self.config.clickhouse.database
            || args[2] != local
        {
            Some(format!(
                "its engine {engine:?} is not a Distributed table over {local} of cluster {}",
                cluster.name
            ))
        } else if args[3] != *column {
            Some(format!(
                "it is sharded by {:?}, not by the shard column {column:?} the stage fills",
                args[3]
            ))
        } else if columns.get(column) != Some(&ChType::UInt(64)) {
            Some(format!("its shard column {column:?} is not UInt64"))
        } else {
            None
        };
        match why {
            None => Ok(()),
            Some(why) => Err(BadEvent::new(
                Reason::Value,
                format!(
                    "cluster.write = \"shards\" cannot write {name}: {why}. Written straight to \
                     the shards its rows would not land where the Distributed table puts them. \
                     Remedy: make it again (drop {name} and {local} ON CLUSTER and re-snapshot \
                     the table: the stage makes it sharded by {column}), or set cluster.write = \
                     \"distributed\" (for every table)"
                ),
            )
            .into()),
        }
    }

    /// A mirror made before ClickHouse 23.2 (or by hand) may be a `ReplacingMergeTree` without
    /// the deleted column as its `is_deleted`: `FINAL` alone then shows deleted rows, and its
    /// readers need `WHERE deleted = 0`. Said once, at the table's first use.
    async fn warn_of_old_engine(&self, name: &str) -> Result<(), Refusal> {
        let what = format!("reading the engine of {name}");
        let engine = self
            .answered(&what, || {
                self.client
                    .query("SELECT engine_full FROM system.tables WHERE database = ? AND name = ?")
                    .bind(&self.config.clickhouse.database)
                    .bind(self.config.cluster.local(name))
                    .fetch_optional::<String>()
            })
            .await?
            .map_err(|e| refused(format_args!("{what}: {e}")))?
            .unwrap_or_default();
        let deleted = &self.config.tables.deleted_column;
        if !hides_deleted(&engine, deleted) {
            tracing::warn!(
                table = name,
                engine = %engine,
                "this mirror's engine does not hide deleted rows under FINAL: read it with WHERE {deleted} = 0 (tables this version creates on 23.2+ are ReplacingMergeTree(version, deleted))"
            );
        }
        Ok(())
    }

    /// The rows `sql` (a query of a system table, bound to the target database and then to
    /// `name`) gives about table `name`, waiting for ClickHouse while it does not answer. The
    /// server refusing to show its own tables: no event of the table can be written.
    async fn about<T>(&self, what: &str, sql: &str, name: &str) -> Result<Vec<T>, Refusal>
    where
        T: clickhouse::RowOwned + clickhouse::RowRead,
    {
        self.answered(what, || {
            self.client
                .query(sql)
                .bind(&self.config.clickhouse.database)
                .bind(name)
                .fetch_all::<T>()
        })
        .await?
        .map_err(|e| refused(format_args!("{what}: {e}")).into())
    }

    pub(super) async fn describe(&self, name: &str) -> Result<BTreeMap<String, ChType>, Refusal> {
        #[derive(clickhouse::Row, serde::Deserialize)]
        struct Col {
            name: String,
            r#type: String,
        }
        let cols = self
            .about::<Col>(
                &format!("reading the columns of {name}"),
                "SELECT name, type FROM system.columns WHERE database = ? AND table = ?",
                name,
            )
            .await?;
        let mut out = BTreeMap::new();
        for c in cols {
            // Columns of types this stage cannot write are simply not written (defaults).
            if let Ok(t) = ChType::parse(&c.r#type, self.features) {
                out.insert(c.name, t);
            }
        }
        Ok(out)
    }

    /// Work out how rows of `event`'s schema are written: the target (created or extended as
    /// needed), and per column its target type.
    pub(super) async fn plan(&mut self, event: &RowEvent<'_>) -> Result<Arc<Plan>, Refusal> {
        let schema = self.schema(event).await?;
        let name = self.target_name(&schema.database, &schema.table);
        if let Some(why) = self.stopped.get(&name) {
            return Err(BadEvent::new(
                Reason::TableStopped,
                format!("table {name} is stopped: {why}"),
            )
            .into());
        }
        let f = self.features_for(&schema.database, &schema.table);
        // Source columns of another type than the target's column.
        let retyped = |target: &Target| {
            schema.columns.iter().any(|c| {
                target
                    .column_of(&c.name)
                    .and_then(|n| target.columns.get(n))
                    .is_some_and(|t| *t != map_column(c, f))
            })
        };
        let mut read_again = false;
        let (mut target, born, rebuilt) = loop {
            let target = self.target(&schema, event.version).await?;
            let (born, rebuilt) = self
                .applied
                .get(&target.name)
                .map_or((0, 0), |a| (a.born, a.rebuilt));
            let lacks = schema
                .columns
                .iter()
                .any(|c| target.column_of(&c.name).is_none() && !target.gone(&c.name));
            let current = event.version >= target.remade_at.unwrap_or(0).max(born).max(rebuilt);
            if read_again || !current || !(lacks || retyped(&target)) {
                break (target, born, rebuilt);
            }
            // Another instance may have applied a statement this one has not read yet: read
            // what it recorded, and the target again if it changed.
            read_again = true;
            let before = self.applied.get(&target.name).map_or(0, |a| a.version);
            self.read_applied(&target.name).await?;
            if self.applied.get(&target.name).map_or(0, |a| a.version) > before {
                self.targets.remove(&target.name);
            }
        };
        // New source columns: add them to the target first (not those an ALTER since start
        // dropped: this row is older than that ALTER).
        let mut missing: Vec<&Column> = schema
            .columns
            .iter()
            .filter(|c| target.column_of(&c.name).is_none() && !target.gone(&c.name))
            .collect();
        // A row the capture reads again later, or of the table before this one: whatever this
        // copy of it holds is replaced (or deleted) by a later event.
        let superseded_before = target.remade_at.unwrap_or(0).max(born).max(rebuilt);
        let superseded = event.version < superseded_before;
        if target.remade_at.is_some_and(|at| event.version < at) || event.version < born {
            // A row older than a statement the target was made again for (a new key, a table
            // made again in the source, another table renamed to this name): its partition's
            // copy of the statement deletes it, and the capture's rebuild (or snapshot) brings
            // the table's rows again; its columns the new table lacks are left out.
            missing.clear();
        }
        if let (Some(at), false) = (target.created_at, missing.is_empty()) {
            if event.version < at {
                let names: Vec<&str> = missing.iter().map(|c| c.name.as_str()).collect();
                return Err(BadEvent::new(
                    Reason::Value,
                    format!(
                        "{}.{} row (version {}) has columns {names:?} that target {} lacks: the \
                         target was created from a later schema (version {at}), so they were \
                         renamed or dropped since, and where their values belong is not known. \
                         Remedy: empty the target and re-snapshot the table",
                        schema.database, schema.table, event.version, target.name
                    ),
                )
                .into());
            }
        }
        if !missing.is_empty() && self.config.tables.create {
            self.flush_table(&target.name).await?;
            let f = self.features_for(&schema.database, &schema.table);
            for c in missing {
                let t = self.add_column(&target.name, c, None, f).await?;
                target.columns.insert(c.name.clone(), t);
            }
            self.targets.insert(target.name.clone(), target.clone());
        }
        let m = &self.config.tables;
        // Per source column, the target column it goes into (each at most once).
        let mut into: Vec<Option<String>> = Vec::with_capacity(schema.columns.len());
        for c in &schema.columns {
            let mut name = target.column_of(&c.name).map(str::to_string);
            if superseded
                && name
                    .as_ref()
                    .and_then(|n| target.columns.get(n))
                    .is_some_and(|t| *t != map_column(c, f))
            {
                // Of a type the column no longer has (changed by the statement the table is
                // read again for): left out, as the later row brings its value.
                name = None;
            }
            let taken = name
                .as_ref()
                .is_some_and(|n| into.iter().flatten().any(|x| x == n));
            into.push(if taken { None } else { name });
        }
        let types: Vec<Option<ChType>> = into
            .iter()
            .map(|n| n.as_ref().and_then(|n| target.columns.get(n).cloned()))
            .collect();
        let mut insert_columns: Vec<String> = into.iter().flatten().cloned().collect();
        let version = target.columns.get(&m.version_column).cloned();
        if version.is_some() {
            insert_columns.push(m.version_column.clone());
        }
        let flag_name = match target.mode {
            Mode::Mirror => &m.deleted_column,
            Mode::Changelog => &m.op_column,
        };
        let flag = target.columns.get(flag_name).cloned();
        if flag.is_some() {
            insert_columns.push(flag_name.clone());
        }
        let row = match target.mode {
            Mode::Changelog => target.columns.get(&m.row_column).cloned(),
            Mode::Mirror => None,
        };
        if row.is_some() {
            insert_columns.push(m.row_column.clone());
        }
        // Values the target cannot hold, marked (the column added to a target made before).
        let marked =
            m.unheld_of(&format!("{}.{}", schema.database, schema.table)) == OnUnheld::Mark;
        if marked && target.columns.get(&m.unheld_column) != Some(&ChType::Strings) {
            let column = m.unheld_column.clone();
            self.flush_table(&target.name).await?;
            self.add_unheld_column(&target.name, &column).await?;
            target.columns.insert(column, ChType::Strings);
            self.targets.insert(target.name.clone(), target.clone());
        }
        let m = &self.config.tables;
        if marked {
            insert_columns.push(m.unheld_column.clone());
        }
        // The Distributed table's sharding column, where the target has it.
        let shard = self.config.cluster.distributed
            && !self.config.cluster.shard_column.is_empty()
            && target.columns.get(&self.config.cluster.shard_column) == Some(&ChType::UInt(64));
        if shard {
            insert_columns.push(self.config.cluster.shard_column.clone());
        }
        let schema = Arc::new(schema);
        // The schema ALTERs are worked out against: set by ALTERs, or by the first rows since
        // start (rows of an older schema, read late from another partition, do not reset it).
        if let Some(t) = self.targets.get_mut(&target.name) {
            if t.source.is_none() {
                t.source = Some(schema.clone());
            }
        }
        Ok(Arc::new(Plan {
            target: target.name.clone(),
            mode: target.mode,
            schema,
            types,
            version,
            flag,
            row,
            shard,
            marked,
            insert_columns: Arc::new(insert_columns),
            superseded_before,
            superseded,
        }))
    }
}

/// A schema whose primary key names a column it does not have (a damaged or foreign schema
/// record) is refused for the event, not indexed out of range.
pub(super) fn key_in_range(s: &TableSchema) -> Result<(), Refusal> {
    match s
        .primary_key
        .iter()
        .find(|i| **i as usize >= s.columns.len())
    {
        Some(i) => Err(BadEvent::new(
            Reason::UnknownSchema,
            format!(
                "schema {} of {}.{} names column {i} in its primary key, but has {} columns: \
                 the schema record is damaged or not sluice's",
                sluice_proto::schema_record_key(s.schema_id),
                s.database,
                s.table,
                s.columns.len()
            ),
        )
        .into()),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_schema_whose_key_names_a_missing_column_is_refused() {
        let mut s = TableSchema {
            database: "db".into(),
            table: "t".into(),
            columns: vec![sluice_proto::v1::Column {
                name: "id".into(),
                ..Default::default()
            }],
            primary_key: vec![0],
            ..Default::default()
        };
        assert!(key_in_range(&s).is_ok());
        s.primary_key = vec![0, 3];
        match key_in_range(&s) {
            Err(Refusal::Bad(b)) => assert!(
                b.message.contains("names column 3") && b.message.contains("has 1 columns"),
                "{}",
                b.message
            ),
            other => panic!("{:?}", other.map_err(|_| ())),
        }
    }

    #[test]
    fn a_column_renamed_and_then_dropped_is_gone_under_its_first_name_too() {
        let mut t = Target {
            name: "t".into(),
            mode: Mode::Mirror,
            columns: BTreeMap::new(),
            source: None,
            remade_at: None,
            renamed: BTreeMap::new(),
            dropped: Default::default(),
            created_at: None,
        };
        t.columns.insert(
            "id".into(),
            ChType::parse("Int32", Features::default()).unwrap(),
        );
        t.columns.insert(
            "c".into(),
            ChType::parse("Int32", Features::default()).unwrap(),
        );
        // a -> r8, r8 dropped; b -> c (still there); x dropped.
        t.renamed.insert("a".into(), "r8".into());
        t.renamed.insert("b".into(), "c".into());
        t.dropped.insert("r8".into());
        t.dropped.insert("x".into());
        assert!(t.gone("a") && t.gone("r8") && t.gone("x"));
        assert!(!t.gone("b") && !t.gone("c") && !t.gone("new"));
        assert_eq!(t.column_of("b"), Some("c"));
        assert_eq!(t.column_of("a"), None);
        // A cycle of renames ends the walk.
        t.renamed.insert("p".into(), "q".into());
        t.renamed.insert("q".into(), "p".into());
        assert!(!t.gone("p"));
    }

    #[test]
    fn an_engine_hides_deleted_rows_only_with_the_deleted_column_as_is_deleted() {
        let e =
            "ReplacingMergeTree(_version, _deleted) ORDER BY id SETTINGS index_granularity = 8192";
        assert!(hides_deleted(e, "_deleted"));
        assert!(hides_deleted(
            "ReplacingMergeTree(`v`, `gone`) ORDER BY id",
            "gone"
        ));
        assert!(!hides_deleted(
            "ReplacingMergeTree(_version) ORDER BY id",
            "_deleted"
        ));
        assert!(!hides_deleted("ReplacingMergeTree ORDER BY id", "_deleted"));
        assert!(hides_deleted(
            "ReplicatedReplacingMergeTree('/clickhouse/tables/{shard}/db/t', '{replica}', _version, _deleted) ORDER BY id",
            "_deleted"
        ));
        assert!(!hides_deleted(
            "ReplicatedReplacingMergeTree('/clickhouse/tables/{shard}/db/t', '{replica}', _version) ORDER BY id",
            "_deleted"
        ));
        assert!(!hides_deleted(
            "ReplacingMergeTree(_version, other) ORDER BY id",
            "_deleted"
        ));
        assert!(!hides_deleted("MergeTree ORDER BY id", "_deleted"));
    }
}
