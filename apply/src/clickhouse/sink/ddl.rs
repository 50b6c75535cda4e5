//! Source DDL applied to the target, in order with the rows of its partition (the batch before
//! it is written first, see [`Sink::apply_event`]).
//!
//! - ALTER: worked out from the source schemas before (carried by the event) and after it, and
//!   the statements' text ([`ColumnChanges`], [`super::statement`]): columns the source had and
//!   no longer has are dropped, renamed columns renamed (`RENAME COLUMN`, 20.4+), columns whose
//!   new type the target cannot hold widened (`MODIFY COLUMN`, only where no value changes),
//!   added columns added with the default the rows already there took. Target columns no
//!   source schema had (the bookkeeping columns, columns the user added) are never touched, and
//!   a statement that changes no column (an index) changes nothing. What cannot be applied
//!   exactly stops the table, the statement named. Each ALTER is applied once: the copies from
//!   other partitions and replays are known by its version, kept in `tables.ddl_table` with
//!   what it renamed and dropped.
//! - TRUNCATE, DROP and RENAME of the source table follow `tables.truncate` and `tables.drop`
//!   (rows older than the statement deleted, kept, or the table stopped); the new name of a
//!   renamed table loses the rows older than the rename ("renamed", before its snapshot).
//! - A statement ClickHouse refuses, or one that cannot be applied exactly, stops its table
//!   (`super::stopped`): its later events are dead-lettered with the reason, while other tables
//!   go on. An unreachable ClickHouse is waited for.

use std::collections::{BTreeMap, HashSet};

use sluice_proto::v1::{Column, Rebuild, TableSchema};
use sluice_proto::ChangeEvent;

use super::target::Target;
use super::{Refusal, Sink};
use crate::clickhouse::types::{map_column, ChType, Features};
use crate::clickhouse::{OnDrop, OnTruncate};
use crate::error::{ApplyError, BadEvent, Reason};
use sluice_common::sql::clickhouse::string;

/// What an ALTER does to the target, worked out from the source schemas before and after it
/// (and, for renames and the defaults of added columns, from its statement).
#[derive(Debug, Default, PartialEq)]
pub(super) struct ColumnChanges {
    /// Target columns the source had and no longer has.
    pub(super) dropped: Vec<String>,
    /// Target columns the statement renames, old name -> new.
    pub(super) renamed: Vec<(String, String)>,
    /// Target columns that must widen to hold the new source type (`MODIFY COLUMN`), by their
    /// name after the statement.
    pub(super) widened: Vec<(String, ChType)>,
    /// Source columns the statement adds (the target lacks them), with the ClickHouse literal
    /// of the value the rows already there took (none: the type's default, or NULL).
    pub(super) added: Vec<(Column, Option<String>)>,
    /// The statement makes the name another table's: every column before it is gone (kept in
    /// `tables.ddl_table` as [`super::applied::BORN`] among the dropped).
    pub(super) born: bool,
    /// The capture reads the table again after the statement (kept as [`super::applied::REBUILT`]).
    pub(super) rebuilt: bool,
}

impl ColumnChanges {
    /// No column of the target changes.
    pub(super) fn is_empty(&self) -> bool {
        self.dropped.is_empty()
            && self.renamed.is_empty()
            && self.widened.is_empty()
            && self.added.is_empty()
    }
}

impl Sink {
    /// The target's changes for an ALTER of `database.table` to schema `new`, against the
    /// schema before it that the event carries (else the source schema last written, or, after
    /// a restart, every earlier schema of the table the schema topic holds): see
    /// [`column_changes`].
    fn alter_changes(
        &self,
        target: &Target,
        database: &str,
        table: &str,
        new: &TableSchema,
        statements: &[String],
        said_before: Option<&TableSchema>,
    ) -> Result<ColumnChanges, String> {
        // The schema before the statement as the capture says it; else the one last written
        // since start; else every other schema's columns the schema topic holds (a guess:
        // after a restart it holds the table's later schemas too).
        let (before, exact): (Vec<Column>, bool) = match (said_before, &target.source) {
            (Some(s), _) => (s.columns.clone(), true),
            (None, Some(s)) => (s.columns.clone(), true),
            (None, None) => (
                self.schemas.columns_ever(database, table, new.schema_id),
                false,
            ),
        };
        column_changes(
            &target.columns,
            &Before {
                columns: &before,
                exact,
            },
            new,
            statements,
            self.features_for(database, table),
            self.config.tables.create,
        )
    }

    /// Apply a source DDL to its target. A statement ClickHouse refuses stops that table; an
    /// unreachable ClickHouse is waited for.
    pub(super) async fn apply_ddl(&mut self, event: &ChangeEvent) -> Result<(), ApplyError> {
        let Some(ddl) = &event.ddl else {
            return Ok(());
        };
        // Target columns may change: plans are worked out again.
        self.plans.clear();
        let name = self.target_name(&event.database, &event.table);
        let statement = ddl.statement.clone();
        // (a stopped table's DDL is dead-lettered before it gets here)
        let result: Result<(), Refusal> = async {
            match ddl.kind.as_str() {
                "alter" => {
                    let Some(new) = &ddl.schema else { return Ok(()) };
                    if self.applied.get(&name).is_none_or(|s| s.version < event.version) {
                        // Another instance may have applied it (from its own partitions'
                        // copy): what ClickHouse holds of the table decides, not this cache.
                        self.read_applied(&name).await?;
                        if self.applied.get(&name).is_some_and(|s| s.version >= event.version) {
                            self.targets.remove(&name);
                        }
                    }
                    let mut done = self.applied.get(&name).is_some_and(|s| s.version >= event.version);
                    if !done && !self.claim_alter(&name, event.version).await? {
                        // Applied by another instance meanwhile (its record read): as a later
                        // copy, with the target read again.
                        done = true;
                        self.targets.remove(&name);
                    }
                    if ddl.rebuild() != Rebuild::None {
                        // The capture reads the table again: the target fits the new schema,
                        // the values come with the rows (see `rebuild`).
                        self.schemas.remember(new);
                        if !done && self.applied.get(&name).is_some_and(|s| s.seen_elsewhere) {
                            self.targets.remove(&name);
                        }
                        let statements = if ddl.statements.is_empty() {
                            vec![ddl.statement.clone()]
                        } else {
                            ddl.statements.clone()
                        };
                        let change = self
                            .apply_rebuild(
                                &name,
                                ddl.rebuild(),
                                "rebuild",
                                event.version,
                                new,
                                ddl.before.as_ref(),
                                &statements,
                                !done,
                            )
                            .await?;
                        if let Some(change) = change {
                            let change = ColumnChanges {
                                rebuilt: true,
                                ..change
                            };
                            self.record_applied(&name, event.version, &change).await?;
                        }
                        tracing::info!(table = %name, rebuild = ?ddl.rebuild(), reason = %ddl.rebuild_reason, "ALTER applied; the capture reads the table again");
                        return Ok(());
                    }
                    if done {
                        // Applied from another partition's copy, or before a restart.
                        self.schemas.remember(new);
                        return Ok(());
                    }
                    // Changed by another instance since it was read: read it again.
                    if self.applied.get(&name).is_some_and(|s| s.seen_elsewhere) {
                        self.targets.remove(&name);
                        if let Some(s) = self.applied.get_mut(&name) {
                            s.seen_elsewhere = false;
                        }
                    }
                    // The target as the server has it (read now if not since start; made from
                    // this schema if missing, with nothing then left to change).
                    if !self.targets.contains_key(&name)
                        && !self.config.tables.create
                        && self.describe(&name).await?.is_empty()
                    {
                        self.schemas.remember(new);
                        return Ok(()); // no target, and none to make
                    }
                    let mut target = self.target(new, event.version).await?;
                    let statements = if ddl.statements.is_empty() {
                        vec![ddl.statement.clone()]
                    } else {
                        ddl.statements.clone()
                    };
                    let change = self.alter_changes(
                        &target,
                        &event.database,
                        &event.table,
                        new,
                        &statements,
                        ddl.before.as_ref(),
                    );
                    self.schemas.remember(new);
                    let change = change.map_err(|why| {
                        Refusal::Bad(BadEvent::new(Reason::Ddl, why))
                    })?;
                    for col in &change.dropped {
                        self.drop_column(&name, col).await?;
                        target.columns.remove(col);
                        target.dropped.insert(col.clone());
                    }
                    for (from, to) in &change.renamed {
                        let t = target.columns.get(from).cloned().unwrap_or(ChType::String);
                        self.rename_column(&name, from, to, &t, event.version)
                            .await?;
                        if let Some(t) = target.columns.remove(from) {
                            target.columns.insert(to.clone(), t);
                        }
                        target.renamed.insert(from.clone(), to.clone());
                    }
                    for (col, t) in &change.widened {
                        self.modify_column(&name, col, t).await?;
                        target.columns.insert(col.clone(), t.clone());
                    }
                    for (col, default) in &change.added {
                        let f = self.features_for(&event.database, &event.table);
                        let t = self.add_column(&name, col, default.as_deref(), f).await?;
                        target.columns.insert(col.name.clone(), t);
                        target.dropped.remove(&col.name);
                    }
                    let mut change = change;
                    if target.created_at == Some(event.version) {
                        // Made here from the schema after the statement: rows of the schema
                        // before it (read later from another partition) find their renamed
                        // columns, and leave the dropped ones out.
                        let before = ddl.before.as_ref().map(|b| b.columns.as_slice());
                        remember_history(
                            &mut target,
                            &mut change,
                            before.unwrap_or_default(),
                            new,
                            &statements,
                        );
                    }
                    if !change.is_empty() {
                        // The rows are written by the types the server has, not by what was
                        // asked of it.
                        target.columns = self.describe(&name).await?;
                    }
                    target.source = Some(std::sync::Arc::new(new.clone()));
                    self.targets.insert(name.clone(), target);
                    self.record_applied(&name, event.version, &change).await?;
                    Ok(())
                }
                "refused" => Err(Refusal::Bad(BadEvent::new(
                    Reason::Ddl,
                    format!("the source refused it: {}", ddl.reason),
                ))),
                "truncate" | "drop" | "rename" => {
                    let source = format!("{}.{}", event.database, event.table);
                    let (apply, stop) = if ddl.kind == "truncate" {
                        let p = self.config.tables.truncate_of(&source);
                        (p == OnTruncate::Apply, p == OnTruncate::Stop)
                    } else {
                        let p = self.config.tables.drop_of(&source);
                        (p == OnDrop::Delete, p == OnDrop::Stop)
                    };
                    if stop {
                        let key = if ddl.kind == "truncate" { "truncate" } else { "drop" };
                        // (a renamed table's old name: as a dropped table)
                        return Err(Refusal::Bad(BadEvent::new(
                            Reason::Ddl,
                            format!(
                                "tables.{key} is \"stop\" for {source}. Bring the target to \
                                 the source's state by hand, then restart apply-clickhouse"
                            ),
                        )));
                    }
                    if apply {
                        self.remove_rows_before(&name, &ddl.kind, event.version, false)
                            .await
                    } else {
                        let key = if ddl.kind == "truncate" { "truncate" } else { "drop" };
                        tracing::warn!(table = %name, kind = %ddl.kind, statement = %statement, "source statement not applied: the target keeps its rows (tables.{key})");
                        Ok(())
                    }
                }
                "renamed" => {
                    // A table renamed to this name: its target holds it from here on (the
                    // capture snapshots it under this name); rows older than the rename are
                    // of another table that had the name, if any: deleted from a mirror, and
                    // in a change log marked by a row of op "rename" at the statement. A
                    // target made for another table (other columns, another key or kind) is
                    // made again for this one.
                    let born = ColumnChanges {
                        born: true,
                        ..ColumnChanges::default()
                    };
                    let Some(new) = &ddl.schema else {
                        return self
                            .remove_rows_before(&name, "rename", event.version, false)
                            .await;
                    };
                    self.schemas.remember(new);
                    if self.applied.get(&name).is_none_or(|s| s.version < event.version) {
                        self.read_applied(&name).await?;
                    }
                    let done = self.applied.get(&name).is_some_and(|s| s.version >= event.version);
                    let columns = match self.targets.get(&name) {
                        Some(t) => t.columns.clone(),
                        None => self.describe(&name).await?,
                    };
                    let fits = columns.is_empty()
                        || !self.config.tables.create
                        || (self.orders_as(&name, new).await?
                            && columns.keys().all(|c| {
                                self.config.tables.is_bookkeeping(c)
                                    || c == &self.config.cluster.shard_column
                                    || new.columns.iter().any(|n| &n.name == c)
                            }));
                    if done || fits {
                        self.remove_rows_before(&name, "rename", event.version, false)
                            .await?;
                        if !done {
                            self.record_applied(&name, event.version, &born).await?;
                        }
                        return Ok(());
                    }
                    self.made_again(&name, "rename", event.version, new).await
                }
                "create" => {
                    let Some(new) = &ddl.schema else { return Ok(()) };
                    self.schemas.remember(new);
                    if self.applied.get(&name).is_none_or(|s| s.version < event.version) {
                        self.read_applied(&name).await?;
                    }
                    let done = self.applied.get(&name).is_some_and(|s| s.version >= event.version);
                    let exists = self.targets.contains_key(&name)
                        || !self.describe(&name).await?.is_empty();
                    // A target holding no row older than the statement (made ahead of the
                    // source table, by hand or by the stage), ordered as this table needs and
                    // with its columns (or not the stage's to change), is this table's
                    // already; one of other columns or another order is made again, empty.
                    let empty = exists && !done && self.rows_before(&name, event.version).await? == 0;
                    let mut kept = !exists || done;
                    if empty {
                        let columns = match self.targets.get(&name) {
                            Some(t) => t.columns.clone(),
                            None => self.describe(&name).await?,
                        };
                        let same_columns = columns.keys().all(|c| {
                            self.config.tables.is_bookkeeping(c)
                                || c == &self.config.cluster.shard_column
                                || new.columns.iter().any(|n| &n.name == c)
                        }) && new.columns.iter().all(|n| columns.contains_key(&n.name));
                        kept = !self.config.tables.create
                            || (same_columns && self.orders_as(&name, new).await?);
                        if !kept {
                            if self.claim_remake(&name, event.version).await? {
                                self.drop_target(&name).await?;
                                self.targets.remove(&name);
                                self.target(new, event.version).await?;
                            } else {
                                // Made again by another instance meanwhile: as a later copy.
                                self.remove_rows_before(&name, "create", event.version, true)
                                    .await?;
                            }
                            kept = true;
                        }
                    }
                    if kept {
                        // A table new to the target (made at its first row), or seen: noted, so
                        // that a copy read later (another partition's, or again after a
                        // restart) finds the target made for this very table.
                        if !exists && !done && self.config.tables.create {
                            // Made now, not at its first row: an empty table is in the
                            // mirror too.
                            self.target(new, event.version).await?;
                        }
                        if !done {
                            let born = ColumnChanges {
                                born: true,
                                ..ColumnChanges::default()
                            };
                            self.record_applied(&name, event.version, &born).await?;
                        } else if exists {
                            // Rows of this partition older than the statement, written into
                            // the target made for the new table by an instance ahead.
                            self.remove_rows_before(&name, "create", event.version, true)
                                .await?;
                        }
                        return Ok(());
                    }
                    // A table of this name made again in the source while its target holds
                    // another's rows (a DROP the target kept, or missed while both stages were
                    // down): the target is made again for it.
                    self.made_again(&name, "create", event.version, new).await
                }
                _ => Ok(()),
            }
        }
        .await;
        match result {
            Ok(()) => {
                self.count_ddl(&ddl.kind, "applied");
                Ok(())
            }
            Err(Refusal::Stop(e)) => Err(e),
            Err(Refusal::Bad(e)) => {
                if let Some(again) = self.changed_meanwhile(&name, &e.to_string()).await {
                    return Err(again);
                }
                self.count_ddl(&ddl.kind, "stopped");
                tracing::error!(table = %name, statement = %statement, error = %e, "DDL failed: stopping this table");
                let reason = if ddl.kind == "refused" {
                    format!("{e} (at {statement:?})")
                } else {
                    format!("DDL {statement:?} failed: {e}")
                };
                self.stop_table(&name, &reason).await?;
                Ok(())
            }
        }
    }
}

impl Sink {
    /// Target `name` made again for the table statement `kind` (`version`) put under its name
    /// (schema `new`), and noted as born there.
    async fn made_again(
        &mut self,
        name: &str,
        kind: &str,
        version: u64,
        new: &TableSchema,
    ) -> Result<(), Refusal> {
        let change = self
            .apply_rebuild(name, Rebuild::Table, kind, version, new, None, &[], true)
            .await?;
        let change = ColumnChanges {
            born: true,
            ..change.unwrap_or_default()
        };
        self.record_applied(name, version, &change).await?;
        Ok(())
    }

    /// `sluice_apply_ddl_total{kind, outcome}`.
    pub(super) fn count_ddl(&self, kind: &str, outcome: &str) {
        self.metrics.ddl.with_label_values(&[kind, outcome]).inc();
    }
}

/// What an ALTER from source columns `before` to `new` renamed (old name -> new) and dropped,
/// noted in `target` (made from `new`, so holding neither) and in `change` (to be recorded, not
/// applied): rows of the schema before it, read later from another partition, then write into
/// the renamed columns and leave the dropped ones out.
pub(super) fn remember_history(
    target: &mut Target,
    change: &mut ColumnChanges,
    before: &[Column],
    new: &TableSchema,
    statements: &[String],
) {
    let has = |n: &str| new.columns.iter().any(|c| c.name == n);
    // (`before` empty: not known; the statements alone say what they renamed and dropped)
    let had = |n: &str| before.is_empty() || before.iter().any(|c| c.name == n);
    for (from, to) in sluice_common::sql::alter::renames_in(statements) {
        if had(&from) && has(&to) && !has(&from) {
            target.renamed.insert(from.clone(), to.clone());
            change.renamed.push((from, to));
        }
    }
    let named_dropped: Vec<String> = statements
        .iter()
        .flat_map(|s| sluice_common::sql::alter::drops(s))
        .collect();
    let gone = before
        .iter()
        .map(|c| c.name.clone())
        .chain(if before.is_empty() {
            named_dropped
        } else {
            Vec::new()
        });
    for c in gone {
        if !has(&c) && !target.renamed.contains_key(&c) && !change.dropped.contains(&c) {
            target.dropped.insert(c.clone());
            change.dropped.push(c);
        }
    }
}

/// The source columns before an ALTER: the schema before it (`exact`), or only a set of
/// definitions the table's columns have had (before or after it).
struct Before<'a> {
    columns: &'a [Column],
    exact: bool,
}

/// What an ALTER to source schema `new` does to a target with `columns`, given the column
/// definitions the source had before it (`before`: the previous schema's, or every earlier
/// schema's) and the `statement`. `Err` names what cannot be applied exactly, and the table
/// stops:
/// - columns removed and added in one statement that does not rename them (a rename cannot be
///   told from a drop and an add otherwise, and dropping would lose the column's values);
/// - a column whose definition changed to a type the target column cannot hold, where
///   widening it would change values or the table is not the stage's to change (`create` off);
/// - an added column whose value in the rows already there the statement does not say
///   exactly (a default that is an expression, such as `CURRENT_TIMESTAMP`).
///
/// Only columns whose source definition changed (or, when `before` is only a guess, that the
/// statement redefines) are looked at for their type: a target made
/// by hand, or before a server upgrade, may hold a column in another type than the mapping
/// gives, and values are converted by the target's type as before. Target columns no source
/// schema had (added by the user) are never touched.
fn column_changes(
    columns: &BTreeMap<String, ChType>,
    before: &Before<'_>,
    new: &TableSchema,
    statements: &[String],
    features: Features,
    create: bool,
) -> Result<ColumnChanges, String> {
    let (exact, before) = (before.exact, before.columns);
    let names: HashSet<&str> = before.iter().map(|c| c.name.as_str()).collect();
    let after: HashSet<&str> = new.columns.iter().map(|c| c.name.as_str()).collect();
    let mut dropped: Vec<String> = columns
        .keys()
        .filter(|c| names.contains(c.as_str()) && !after.contains(c.as_str()))
        .cloned()
        .collect(); // (a BTreeMap's keys: sorted)
    let mut added: Vec<&str> = new
        .columns
        .iter()
        .map(|c| c.name.as_str())
        .filter(|c| !names.contains(*c))
        .collect();
    // Renames the statement names, of a column that went to one that came.
    let chain = sluice_common::sql::alter::renames_in(statements);
    let mut renamed = Vec::new();
    for (from, to) in chain.clone() {
        if let (Some(d), Some(a)) = (
            dropped.iter().position(|c| *c == from),
            added.iter().position(|c| *c == to),
        ) {
            dropped.remove(d);
            added.remove(a);
            renamed.push((from, to));
        }
    }
    // A column the statements drop by name is dropped, whatever else they add.
    // (or renamed, then dropped under its new name)
    let unexplained: Vec<&String> = dropped
        .iter()
        .filter(|d| {
            let now = chain
                .iter()
                .find(|(a, _)| a == *d)
                .map_or(d.as_str(), |(_, b)| b.as_str());
            !sluice_common::sql::alter::drops_in(statements, now)
        })
        .collect();
    if !unexplained.is_empty() && !added.is_empty() {
        return Err(format!(
            "it removes column(s) {} and adds {} at once: a rename cannot be told from a drop \
             and an add, and a drop would lose the column's values. Rename (or drop and add) \
             the target's columns by hand, then restart apply-clickhouse and replay this \
             table's dead letters",
            dropped.join(", "),
            added.join(", ")
        ));
    }
    let mut widened = Vec::new();
    for c in &new.columns {
        // The target column it was: under its old name if renamed.
        let was = renamed
            .iter()
            .find(|(_, to)| *to == c.name)
            .map(|(from, _)| from.as_str())
            .unwrap_or(&c.name);
        let Some(have) = columns.get(was) else {
            continue;
        };
        // Unchanged if the source had this very definition before (under its old name).
        // Not when the definitions are only a guess and the statement redefines the column:
        // a definition the guess holds may be a later one (a MODIFY read again after a
        // restart), and the target is then checked against the new type below.
        let redefined = !exact && sluice_common::sql::alter::modifies_in(statements, &c.name);
        if !redefined
            && before.iter().any(|b| {
                b.name == was
                    && Column {
                        name: c.name.clone(),
                        ..b.clone()
                    } == *c
            })
        {
            continue;
        }
        let want = map_column(c, features);
        if want.widens_to(have) {
            continue; // the target holds every value of the new type
        }
        if create && have.widens_to(&want) {
            widened.push((c.name.clone(), want));
            continue;
        }
        return Err(format!(
            "column {} is now {} in the source, which target column type {} cannot hold \
             exactly{}. Change the target column (ALTER TABLE ... MODIFY COLUMN {} {}) or map \
             it by hand, then restart apply-clickhouse and replay this table's dead letters",
            c.name,
            c.sql_type,
            have.sql(),
            if create {
                " (and changing it could alter values)"
            } else {
                " (tables.create is off: the target is not changed)"
            },
            c.name,
            want.sql()
        ));
    }
    let mut with_defaults = Vec::new();
    if create {
        for name in added {
            if columns.contains_key(name) {
                continue;
            }
            let c = new
                .columns
                .iter()
                .find(|c| c.name == name)
                .expect("added: a column of the new schema");
            with_defaults.push((c.clone(), existing_rows_value(c, statements)?));
        }
    }
    Ok(ColumnChanges {
        dropped,
        renamed,
        widened,
        added: with_defaults,
        born: false,
        rebuilt: false,
    })
}

/// The ClickHouse DEFAULT that gives the rows already in the target the value MySQL gave the
/// rows already in the source when `statement` added column `c` (none: the target type's own
/// default, which is the same).
fn existing_rows_value(c: &Column, statements: &[String]) -> Result<Option<String>, String> {
    use sluice_common::sql::alter::Added;
    use sluice_proto::v1::ColumnType as T;
    let refuse = |what: &str| {
        Err(format!(
            "it adds column {} {what}, so the value the rows already there took is not known \
             from the statement. Re-snapshot the table (capture-mysql's snapshot.request_id \
             and snapshot.tables) after restarting apply-clickhouse",
            c.name
        ))
    };
    match sluice_common::sql::alter::added_in(statements, &c.name) {
        None => refuse("without an ADD clause this stage can read"),
        Some(Added::Expression(e)) => refuse(&format!("with the default {e}")),
        Some(Added::Generated(e)) => refuse(&format!("generated ({e})")),
        Some(Added::Null) => Ok(None),
        // The value as text: ClickHouse casts a DEFAULT to the column's type.
        Some(Added::Constant(v)) => Ok(Some(string(&v))),
        Some(Added::NoDefault) if c.nullable => Ok(None),
        Some(Added::NoDefault) => match c.r#type() {
            // MySQL's implicit default of a NOT NULL ENUM is its first member.
            T::Enum => Ok(c.members.first().map(|m| string(m))),
            // A NOT NULL TIMESTAMP without a default may take the ALTER's time.
            T::Timestamp => refuse("as a NOT NULL TIMESTAMP without a default"),
            T::Json => refuse("as a NOT NULL JSON"),
            // Zero, the empty string, the zero date: the target type's default too.
            _ => Ok(None),
        },
    }
}

#[cfg(test)]
mod tests;
