//! An ALTER the capture follows with a rebuild (the DDL event's `rebuild`): it reads the table
//! again and publishes every row at versions above the statement's, so the values the
//! statement gave the rows already there (a column added with a default, a type narrowed,
//! the key changed) come with those rows. Here the target only has to fit the schema after
//! the statement, and nothing is refused for what its values would be:
//! - `ROWS`: the target's columns are made to fit: dropped, renamed, widened in place, or
//!   dropped and added again in the new type where no widening holds the values; added ones
//!   take the type's default until the rows read again bring theirs. A change log gets a row
//!   of `_op = 'rebuild'` at the statement: the snapshot rows above it are the rows read again.
//! - `TABLE` (the key changed, or a partition clause removed or added rows): a mirror ordered by the old key cannot hold the new table; it
//!   is made again from the schema after the statement (a change log of a table that keeps no
//!   key keeps its rows, as it has no key to reorder). Rows of the table's other partitions
//!   older than the statement, written after the target was made again (an instance behind),
//!   are deleted when each partition's copy of the statement arrives.
//!
//! Between the statement and the end of the rebuild the target holds the rows already there
//! with provisional values (ROWS), or only the rows changed since (TABLE); `sluice status`
//! shows the capture's snapshot of the table under way.

use std::collections::BTreeMap;

use sluice_proto::v1::{Column, Rebuild, TableSchema};

use super::ddl::ColumnChanges;
use super::{Refusal, Sink};
use crate::clickhouse::types::{map_column, ChType, Features};
use crate::clickhouse::{Mode, OnDrop};
use crate::error::{BadEvent, Reason};
use sluice_common::sql::clickhouse::ident;

impl Sink {
    /// Apply ALTER `version` of target `name`, which the capture follows with `rebuild`, to
    /// schema `new` (from `before`, where the event says it). Called for every copy of the
    /// statement (one per partition); `first` for the one that changes the target.
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn apply_rebuild(
        &mut self,
        name: &str,
        rebuild: Rebuild,
        kind: &str,
        version: u64,
        new: &TableSchema,
        before: Option<&TableSchema>,
        statements: &[String],
        first: bool,
    ) -> Result<Option<ColumnChanges>, Refusal> {
        let source = format!("{}.{}", new.database, new.table);
        let mut mode = self.config.tables.mode_of(&source);
        if new.primary_key.is_empty() {
            mode = Mode::Changelog;
        }
        if rebuild == Rebuild::Table {
            let columns = match self.targets.get(name) {
                Some(t) => t.columns.clone(),
                None => self.describe(name).await?,
            };
            // A mirror ordered by another key, or a table of another kind (a keyless table
            // given a key, or the other way round), is made again.
            let was_mirror = columns.contains_key(&self.config.tables.deleted_column);
            let remake = !columns.is_empty() && (mode == Mode::Mirror || was_mirror);
            // Rows older than the statement are not the new table's: in a mirror made again,
            // those of another partition written after it was made (an instance behind) are
            // deleted by their own partition's copy; a change log is marked at the statement,
            // once per copy (the copies collapse into one row).
            if !(remake && first) {
                self.remove_rows_before(name, kind, version, false).await?;
            }
            if remake && first {
                if !self.remake(name, new, version, kind == "create").await? {
                    // Made again by another instance meanwhile (it recorded the statement):
                    // as a later copy.
                    self.remove_rows_before(name, kind, version, false).await?;
                    return Ok(None);
                }
                let mut change = ColumnChanges {
                    born: true,
                    ..ColumnChanges::default()
                };
                if let Some(target) = self.targets.get_mut(name) {
                    // Rows of the schema before (read later from another partition) leave
                    // the dropped columns out; renamed ones find their new names.
                    let was = before.map(|b| b.columns.as_slice()).unwrap_or_default();
                    super::ddl::remember_history(target, &mut change, was, new, statements);
                }
                return Ok(Some(change));
            }
        }
        if rebuild == Rebuild::Rows && mode == Mode::Changelog {
            // A change log keeps every row it had: a row of `_op = 'rebuild'` at the
            // statement tells the rows read again (snapshot rows above it) from changes. Once
            // per copy, as for a new key (the copies collapse into one row).
            let columns = match self.targets.get(name) {
                Some(t) => t.columns.clone(),
                None => self.describe(name).await?,
            };
            if !columns.is_empty() && !columns.contains_key(&self.config.tables.deleted_column) {
                self.remove_rows_before(name, kind, version, false).await?;
            }
        }
        if !first {
            return Ok(None);
        }
        let mut target = self.target(new, version).await?;
        if !self.config.tables.create {
            // Not the stage's to change: the rows read again are written into the columns
            // the target has.
            return Ok(Some(ColumnChanges::default()));
        }
        let was: Vec<Column> = before
            .map(|b| b.columns.clone())
            .or_else(|| target.source.as_ref().map(|s| s.columns.clone()))
            .unwrap_or_default();
        let f = self.features_for(&new.database, &new.table);
        let change = fit(&target.columns, &was, new, statements, f);
        // Renames first: a column renamed and given a type no target type shares with its old
        // one is dropped and added again under its new name, which only the rename makes.
        for (from, to) in &change.renamed {
            let t = target.columns.get(from).cloned().unwrap_or(ChType::String);
            self.rename_column(name, from, to, &t, version).await?;
            if let Some(t) = target.columns.remove(from) {
                target.columns.insert(to.clone(), t);
            }
            target.renamed.insert(from.clone(), to.clone());
        }
        for col in &change.dropped {
            self.drop_column(name, col).await?;
            target.columns.remove(col);
            target.dropped.insert(col.clone());
        }
        for (col, t) in &change.widened {
            self.modify_column(name, col, t).await?;
            target.columns.insert(col.clone(), t.clone());
        }
        for (col, _) in &change.added {
            let t = self.add_column(name, col, None, f).await?;
            target.columns.insert(col.name.clone(), t);
            target.dropped.remove(&col.name);
        }
        let mut change = change;
        if target.created_at == Some(version) {
            super::ddl::remember_history(&mut target, &mut change, &was, new, statements);
        }
        if !change.is_empty() {
            // The rows are written by the types the server has, not by what was asked of it.
            target.columns = self.describe(name).await?;
        }
        target.source = Some(std::sync::Arc::new(new.clone()));
        self.targets.insert(name.to_string(), target);
        Ok(Some(change))
    }

    /// Make target `name` again from schema `new`, at `version`: a table of another key (or a
    /// table of the same name made again in the source) cannot be changed into it. `created`:
    /// the source made a table of this name again; the rows of the one dropped, which
    /// `tables.drop = "keep"` kept, are kept in `<name>__dropped_<version>` (off a cluster:
    /// there a Replicated table's path is its name's, and the old one is dropped).
    async fn remake(
        &mut self,
        name: &str,
        new: &TableSchema,
        version: u64,
        created: bool,
    ) -> Result<bool, Refusal> {
        if !self.config.tables.create {
            return Err(BadEvent::new(
                Reason::Ddl,
                format!(
                    "{name} must be made again for the source's new table or key, and \
                     tables.create is off: make it by hand (ORDER BY the new key columns), then \
                     delete its row from {} and re-snapshot the table",
                    self.config.tables.stopped_table
                ),
            )
            .into());
        }
        if !self.claim_remake(name, version).await? {
            return Ok(false);
        }
        let source = format!("{}.{}", new.database, new.table);
        let keep = created
            && !self.config.cluster.enabled()
            && self.config.tables.drop_of(&source) == OnDrop::Keep;
        if keep {
            let db = ident(&self.config.clickhouse.database);
            let aside = format!("{name}__dropped_{version}");
            let sql = format!(
                "RENAME TABLE {db}.{} TO {db}.{}",
                ident(name),
                ident(&aside)
            );
            self.answered(&format!("setting {name} aside"), || {
                self.client.query(&sql).execute()
            })
            .await?
            .map_err(|e| BadEvent::new(Reason::Ddl, format!("{sql}: {e}")))?;
            tracing::warn!(table = %name, kept = %aside, "a table of this name was made again in the source: the dropped one's rows are kept aside");
        } else {
            self.drop_target(name).await?;
        }
        self.targets.remove(name);
        let mut target = self.target(new, version).await?;
        target.source = Some(std::sync::Arc::new(new.clone()));
        target.remade_at = Some(version);
        self.targets.insert(name.to_string(), target);
        tracing::warn!(table = %name, version, "target made again: its rows come from the source again");
        Ok(true)
    }

    /// Drop target `name` (its Distributed table and per-shard tables too, on a cluster).
    pub(super) async fn drop_target(&self, name: &str) -> Result<(), Refusal> {
        let cluster = &self.config.cluster;
        let db = ident(&self.config.clickhouse.database);
        let mut tables = vec![name.to_string()];
        if cluster.distributed {
            tables.push(cluster.local(name));
        }
        for t in tables {
            let sql = format!("DROP TABLE IF EXISTS {db}.{}{}", ident(&t), cluster.on());
            self.answered(&format!("dropping {t}"), || {
                self.client.query(&sql).execute()
            })
            .await?
            .map_err(|e| BadEvent::new(Reason::Ddl, format!("{sql}: {e}")))?;
        }
        Ok(())
    }
}

/// How a target with `columns` is made to fit schema `new` that `statements` made from the
/// source columns `was` (empty: not known), its values left to the rows read again: columns
/// `was` had and `new` has not are dropped; renamed ones renamed; each column of `new` kept when its target type holds every value
/// of the new type, widened in place when the target type widens to it, else dropped and added
/// again in the new type; missing ones added.
fn fit(
    columns: &BTreeMap<String, ChType>,
    was: &[Column],
    new: &TableSchema,
    statements: &[String],
    features: Features,
) -> ColumnChanges {
    let mut change = ColumnChanges::default();
    let mut have = columns.clone();
    for (from, to) in sluice_common::sql::alter::renames_in(statements) {
        if !have.contains_key(&from) || have.contains_key(&to) {
            continue;
        }
        if !new.columns.iter().any(|c| c.name == to) {
            continue;
        }
        let t = have.remove(&from).expect("checked");
        have.insert(to.clone(), t);
        change.renamed.push((from, to));
    }
    for c in was {
        if !new.columns.iter().any(|n| n.name == c.name) && have.remove(&c.name).is_some() {
            change.dropped.push(c.name.clone());
        }
    }
    for c in &new.columns {
        let want = map_column(c, features);
        match have.get(&c.name) {
            Some(t) if want.widens_to(t) => {}
            Some(t) if t.widens_to(&want) => change.widened.push((c.name.clone(), want)),
            Some(_) => {
                // No type holds both: dropped, added again (its values come again).
                change.dropped.push(c.name.clone());
                change.added.push((c.clone(), None));
            }
            None => change.added.push((c.clone(), None)),
        }
    }
    change
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_proto::v1::ColumnType as T;

    fn col(name: &str, t: T, sql: &str, nullable: bool) -> Column {
        let mut c = Column {
            name: name.into(),
            sql_type: sql.into(),
            nullable,
            ..Default::default()
        };
        c.set_type(t);
        c
    }

    #[test]
    fn a_target_fits_the_new_schema_and_leaves_values_to_the_rows_read_again() {
        let f = Features::of_version("18.16.1");
        let (id, a, b) = (
            col("id", T::Int, "int", false),
            col("a", T::Int, "int", true),
            col("b", T::Varchar, "varchar(20)", true),
        );
        let was = vec![id.clone(), a.clone(), b.clone()];
        let columns: BTreeMap<String, ChType> = was
            .iter()
            .map(|c| (c.name.clone(), map_column(c, f)))
            .chain([("_version".to_string(), ChType::UInt(64))])
            .collect();
        // a: INT -> DATE (no type holds both), b renamed to c, d added with a default.
        let new = TableSchema {
            columns: vec![
                id.clone(),
                col("a", T::Date, "date", true),
                col("c", T::Varchar, "varchar(20)", true),
                col("d", T::Int, "int", false),
            ],
            primary_key: vec![0],
            ..Default::default()
        };
        let statements = [
            "ALTER TABLE t MODIFY a DATE, RENAME COLUMN b TO c, ADD d INT NOT NULL \
                           DEFAULT 7"
                .to_string(),
        ];
        let change = fit(&columns, &was, &new, &statements, f);
        assert_eq!(change.renamed, vec![("b".to_string(), "c".to_string())]);
        // a: no type holds both INT and DATE: dropped, added again (its values come with the
        // rows read again); a bookkeeping column is never touched.
        assert_eq!(change.dropped, vec!["a".to_string()]);
        let added: Vec<(&str, Option<String>)> = change
            .added
            .iter()
            .map(|(c, d)| (c.name.as_str(), d.clone()))
            .collect();
        assert_eq!(added, vec![("a", None), ("d", None)]);
        assert!(change.widened.is_empty());
        // INT -> BIGINT widens in place.
        let wide = TableSchema {
            columns: vec![id.clone(), col("a", T::Bigint, "bigint", true), b.clone()],
            primary_key: vec![0],
            ..Default::default()
        };
        let change = fit(&columns, &was, &wide, &[], f);
        assert_eq!(change.widened.len(), 1, "{change:?}");
        assert!(change.dropped.is_empty() && change.added.is_empty());
    }
}
