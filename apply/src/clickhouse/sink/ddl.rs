//! Source DDL applied to the target, in order with the rows of its partition (the batch before
//! it is written first, see [`Sink::apply_event`]).
//!
//! - ALTER: worked out from the source schemas before and after it ([`ColumnChanges`]):
//!   target columns the source had and no longer has are dropped, columns whose new type the
//!   target cannot hold are widened (`MODIFY COLUMN`, only where no value changes), added
//!   columns are added when the first row that has them arrives ([`super::target`]). Target
//!   columns no source schema had (the bookkeeping columns, columns the user added) are never
//!   touched, and a statement that changes no column (an index) changes nothing. What cannot
//!   be applied exactly (a rename, a narrowing) stops the table, the statement named.
//! - DROP, TRUNCATE and RENAME of the source table are logged and not applied: the data in
//!   ClickHouse is the operator's to keep or drop.
//! - A statement ClickHouse refuses stops that table: its later events are dead-lettered with
//!   the statement named, while other tables go on. An unreachable ClickHouse is waited for.
//!   The stop lives in memory only: after a restart the table's events are tried again (and
//!   the DDL itself, if its offset was not committed yet).

use std::collections::{BTreeMap, HashSet};

use sluice_proto::v1::{Column, TableSchema};
use sluice_proto::ChangeEvent;

use super::target::Target;
use super::{quote, Refusal, Sink};
use crate::clickhouse::types::{map_column, ChType, Features};
use crate::clickhouse::{OnDrop, OnTruncate};
use crate::error::{ApplyError, BadEvent, Origin, Reason};

/// What an ALTER does to the target, worked out from the source schemas before and after it.
#[derive(Debug, Default, PartialEq)]
struct ColumnChanges {
    /// Target columns the source had and no longer has.
    dropped: Vec<String>,
    /// Target columns that must widen to hold the new source type (`MODIFY COLUMN`).
    widened: Vec<(String, ChType)>,
}

impl Sink {
    /// The target's changes for an ALTER of `database.table` to schema `new`, against the
    /// source schema last written (or, after a restart, every earlier schema of the table the
    /// schema topic holds): see [`column_changes`].
    fn alter_changes(
        &self,
        target: &Target,
        database: &str,
        table: &str,
        new: &TableSchema,
    ) -> Result<ColumnChanges, String> {
        let before: Vec<Column> = match &target.source {
            Some(s) => s.columns.clone(),
            None => self.schemas.columns_ever(database, table, new.schema_id),
        };
        column_changes(
            &target.columns,
            &before,
            new,
            self.features,
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
        let result: Result<(), Refusal> = async {
            match ddl.kind.as_str() {
                "alter" => {
                    let Some(new) = &ddl.schema else { return Ok(()) };
                    let Some(mut target) = self.targets.get(&name).cloned() else {
                        self.schemas.remember(new);
                        return Ok(()); // made from the schema when its first row arrives
                    };
                    let change = self.alter_changes(&target, &event.database, &event.table, new);
                    self.schemas.remember(new);
                    let change = change.map_err(|why| {
                        Refusal::Bad(BadEvent::new(Reason::Ddl, why))
                    })?;
                    for col in &change.dropped {
                        self.drop_column(&name, col).await?;
                        target.columns.remove(col);
                    }
                    for (col, t) in &change.widened {
                        self.modify_column(&name, col, t).await?;
                        target.columns.insert(col.clone(), t.clone());
                    }
                    // Added columns are added when the first row that has them arrives.
                    target.source = Some(std::sync::Arc::new(new.clone()));
                    self.targets.insert(name.clone(), target);
                    Ok(())
                }
                "refused" => Err(Refusal::Bad(BadEvent::new(
                    Reason::Ddl,
                    format!("the source refused it: {}", ddl.reason),
                ))),
                "truncate" | "drop" => {
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
                        return Err(Refusal::Bad(BadEvent::new(
                            Reason::Ddl,
                            format!(
                                "tables.{key} is \"stop\" for {source}. Bring the target to \
                                 the source's state by hand, then restart apply-clickhouse"
                            ),
                        )));
                    }
                    if apply {
                        self.remove_rows_before(&name, &ddl.kind, event.version).await
                    } else {
                        tracing::warn!(table = %name, kind = %ddl.kind, statement = %statement, "source statement not applied: the target keeps its rows (tables.{})", ddl.kind);
                        Ok(())
                    }
                }
                "rename" => {
                    // Data in the target is kept; the operator decides what to do with it.
                    tracing::warn!(table = %name, kind = %ddl.kind, statement = %statement, "source DDL not applied to the target");
                    Ok(())
                }
                _ => Ok(()),
            }
        }
        .await;
        match result {
            Ok(()) => Ok(()),
            Err(Refusal::Stop(e)) => Err(e),
            Err(Refusal::Bad(e)) => {
                tracing::error!(table = %name, statement = %statement, error = %e, "DDL failed: stopping this table");
                let reason = if ddl.kind == "refused" {
                    format!("{e} (at {statement:?})")
                } else {
                    format!("DDL {statement:?} failed: {e}")
                };
                self.stopped.insert(name, reason);
                Ok(())
            }
        }
    }
}

impl Sink {
    /// A TRUNCATE (or a DROP under `tables.drop = "delete"`) at `version`: in a mirror every row
    /// older than it is deleted, and the mutation waited for; a change log gets one row with op
    /// `kind` at that version. The statement reaches every partition of the table's topic, and
    /// each copy deletes the rows older than the same version: rows of another partition
    /// written after the first copy are deleted by their own partition's copy, and a replay
    /// (a restart before the offsets were committed) reads the rows again before the
    /// statement again. Rows after the statement have higher versions and are never touched.
    async fn remove_rows_before(
        &mut self,
        name: &str,
        kind: &str,
        version: u64,
    ) -> Result<(), Refusal> {
        let columns = match self.targets.get(name) {
            Some(t) => t.columns.clone(),
            None => self.describe(name).await?,
        };
        if columns.is_empty() {
            return Ok(()); // no target yet: nothing to remove
        }
        let m = &self.config.tables;
        let db = quote(&self.config.clickhouse.database);
        if !columns.contains_key(&m.version_column) {
            return Err(Refusal::Bad(BadEvent::new(
                Reason::Ddl,
                format!(
                    "target {name} has no version column {}, so the rows before the statement \
                     cannot be told from those after it. Empty it by hand, then restart \
                     apply-clickhouse",
                    m.version_column
                ),
            )));
        }
        let (sql, what) = if columns.contains_key(&m.deleted_column) {
            (
                format!(
                    "ALTER TABLE {db}.{} DELETE WHERE {} < {version}",
                    quote(name),
                    quote(&m.version_column)
                ),
                format!("deleting the rows of {name} before a {kind}"),
            )
        } else {
            (
                format!(
                    "INSERT INTO {db}.{} ({}, {}) VALUES ({version}, '{kind}')",
                    quote(name),
                    quote(&m.version_column),
                    quote(&m.op_column)
                ),
                format!("logging a {kind} in {name}"),
            )
        };
        self.answered(&what, || self.client.query(&sql).execute())
            .await?
            .map_err(|e| BadEvent::new(Reason::Ddl, format!("{sql}: {e}")))?;
        if columns.contains_key(&m.deleted_column) {
            self.wait_for_mutations(name).await?;
        }
        tracing::info!(table = %name, kind, version, "rows before the statement removed");
        Ok(())
    }

    /// Wait until no mutation of target `name` is left to run.
    async fn wait_for_mutations(&self, name: &str) -> Result<(), Refusal> {
        let started = std::time::Instant::now();
        let mut said = started;
        loop {
            let what = format!("reading the mutations of {name}");
            let left: u64 = self
                .answered(&what, || {
                    self.client
                        .query(
                            "SELECT count() FROM system.mutations \
                             WHERE database = ? AND table = ? AND is_done = 0",
                        )
                        .bind(&self.config.clickhouse.database)
                        .bind(name)
                        .fetch_one::<u64>()
                })
                .await?
                .map_err(|e| BadEvent::new(Reason::Ddl, format!("{what}: {e}")))?;
            if left == 0 {
                return Ok(());
            }
            if self.shutdown.is_triggered() {
                return Err(Refusal::Stop(ApplyError::definite(
                    Origin::Sink,
                    format!("stopped while a mutation of {name} ran; the statement is read again"),
                )));
            }
            if said.elapsed() > std::time::Duration::from_secs(30) {
                tracing::warn!(table = %name, waited_s = started.elapsed().as_secs(), "waiting for a mutation to finish (see system.mutations)");
                said = std::time::Instant::now();
            }
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
    }
}

/// What an ALTER to source schema `new` does to a target with `columns`, given the column
/// definitions the source had before it (`before`: the previous schema's, or every earlier
/// schema's). `Err` names what cannot be applied exactly, and the table stops:
/// - columns removed and added in one statement (a rename cannot be told from a drop and an
///   add, and dropping would lose the column's values);
/// - a column whose definition changed to a type the target column cannot hold, where
///   widening it would change values or the table is not the stage's to change (`create` off).
///
/// Only columns whose source definition changed are looked at for their type: a target made
/// by hand, or before a server upgrade, may hold a column in another type than the mapping
/// gives, and values are converted by the target's type as before. Target columns no source
/// schema had (added by the user) are never touched.
fn column_changes(
    columns: &BTreeMap<String, ChType>,
    before: &[Column],
    new: &TableSchema,
    features: Features,
    create: bool,
) -> Result<ColumnChanges, String> {
    let names: HashSet<&str> = before.iter().map(|c| c.name.as_str()).collect();
    let after: HashSet<&str> = new.columns.iter().map(|c| c.name.as_str()).collect();
    let dropped: Vec<String> = columns
        .keys()
        .filter(|c| names.contains(c.as_str()) && !after.contains(c.as_str()))
        .cloned()
        .collect(); // (a BTreeMap's keys: sorted)
    let added: Vec<&str> = new
        .columns
        .iter()
        .map(|c| c.name.as_str())
        .filter(|c| !names.contains(*c))
        .collect();
    if !dropped.is_empty() && !added.is_empty() {
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
        let Some(have) = columns.get(&c.name) else {
            continue;
        };
        // Unchanged if the source had this very definition before.
        if before.iter().any(|b| b == c) {
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
    Ok(ColumnChanges { dropped, widened })
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_proto::v1::ColumnType;

    fn col(name: &str, t: ColumnType, sql: &str) -> Column {
        Column {
            name: name.into(),
            r#type: t as i32,
            sql_type: sql.into(),
            ..Default::default()
        }
    }

    fn schema(columns: Vec<Column>) -> TableSchema {
        TableSchema {
            columns,
            ..Default::default()
        }
    }

    #[test]
    fn an_alter_is_the_difference_of_two_schemas() {
        let f = Features::of_version("26.9.2.1");
        let id = col("id", ColumnType::Int, "int(11)");
        let n = col("n", ColumnType::Int, "int(11)");
        let big = col("n", ColumnType::Bigint, "bigint(20)");
        let price = Column {
            length: 10,
            scale: 2,
            ..col("price", ColumnType::Decimal, "decimal(10,2)")
        };
        // A target made by hand: price as Float64, and a column of its own.
        let target: BTreeMap<String, ChType> = [
            ("id", ChType::Int(32)),
            ("n", ChType::Int(32)),
            ("price", ChType::Float64),
            ("ingested_at", ChType::DateTime),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
        let before = vec![id.clone(), n.clone(), price.clone()];
        // CREATE INDEX: the same columns. Nothing changes, the hand-made types stand.
        let same = schema(before.clone());
        assert_eq!(
            column_changes(&target, &before, &same, f, false),
            Ok(ColumnChanges::default())
        );
        // INT -> BIGINT: widened where the stage may change the table, refused where not.
        let wider = schema(vec![id.clone(), big.clone(), price.clone()]);
        assert_eq!(
            column_changes(&target, &before, &wider, f, true)
                .unwrap()
                .widened,
            vec![("n".to_string(), ChType::Int(64))]
        );
        let e = column_changes(&target, &before, &wider, f, false).unwrap_err();
        assert!(
            e.contains("column n is now bigint(20)") && e.contains("tables.create is off"),
            "{e}"
        );
        // A dropped source column goes; the target's own column stays.
        let fewer = schema(vec![id.clone(), price.clone()]);
        assert_eq!(
            column_changes(&target, &before, &fewer, f, true)
                .unwrap()
                .dropped,
            vec!["n".to_string()]
        );
        // A rename: refused, nothing dropped.
        let renamed = schema(vec![
            id.clone(),
            col("m", ColumnType::Int, "int(11)"),
            price,
        ]);
        let e = column_changes(&target, &before, &renamed, f, true).unwrap_err();
        assert!(e.contains("removes column(s) n and adds m"), "{e}");
        // After a restart, the earlier schemas' definitions: an unchanged column is unchanged.
        let history = vec![id.clone(), n.clone(), id, big.clone()];
        let again = schema(history[2..].to_vec());
        let widened_target: BTreeMap<String, ChType> = [
            ("id".to_string(), ChType::Int(32)),
            ("n".to_string(), ChType::Int(64)),
        ]
        .into();
        assert_eq!(
            column_changes(&widened_target, &history, &again, f, false),
            Ok(ColumnChanges::default())
        );
    }
}
