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

use std::collections::HashSet;

use sluice_proto::v1::TableSchema;
use sluice_proto::ChangeEvent;

use super::target::Target;
use super::{Refusal, Sink};
use crate::clickhouse::types::{map_column, ChType};
use crate::error::{ApplyError, BadEvent, Reason};

/// What an ALTER does to the target, worked out from the source schemas before and after it.
#[derive(Debug, Default, PartialEq)]
struct ColumnChanges {
    /// Target columns the source had and no longer has.
    dropped: Vec<String>,
    /// Target columns that must widen to hold the new source type (`MODIFY COLUMN`).
    widened: Vec<(String, ChType)>,
}

impl Sink {
    /// The target's changes for an ALTER to schema `new`: against the source schema last
    /// written (or, after a restart, every column a known schema of the table had). `Err`
    /// names what cannot be applied exactly, and the table stops:
    /// - columns removed and added in one statement (a rename cannot be told from a drop and
    ///   an add, and dropping would lose the column's values);
    /// - a column whose new type the target column cannot hold, where widening it would change
    ///   values or the table is not the stage's to change (`tables.create = false`).
    ///
    /// Target columns no source schema had (added by the user) are never touched.
    fn column_changes(
        &self,
        target: &Target,
        database: &str,
        table: &str,
        new: &TableSchema,
    ) -> Result<ColumnChanges, String> {
        let before: HashSet<String> = match &target.source {
            Some(s) => s.columns.iter().map(|c| c.name.clone()).collect(),
            None => self.schemas.columns_ever(database, table, new.schema_id),
        };
        let after: HashSet<&str> = new.columns.iter().map(|c| c.name.as_str()).collect();
        let mut dropped: Vec<String> = target
            .columns
            .keys()
            .filter(|c| before.contains(*c) && !after.contains(c.as_str()))
            .cloned()
            .collect();
        dropped.sort();
        let added: Vec<&str> = new
            .columns
            .iter()
            .map(|c| c.name.as_str())
            .filter(|c| !before.contains(*c))
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
            let Some(have) = target.columns.get(&c.name) else {
                continue;
            };
            let want = map_column(c, self.features);
            if want.widens_to(have) {
                continue; // the target holds every value of the new type
            }
            if self.config.tables.create && have.widens_to(&want) {
                widened.push((c.name.clone(), want));
                continue;
            }
            return Err(format!(
                "column {} is now {} in the source, which target column type {} cannot hold \
                 exactly{}. Change the target column (ALTER TABLE ... MODIFY COLUMN {} {}) or \
                 map it by hand, then restart apply-clickhouse and replay this table's dead \
                 letters",
                c.name,
                c.sql_type,
                have.sql(),
                if self.config.tables.create {
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
                    let change = self.column_changes(&target, &event.database, &event.table, new);
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
                "drop" | "truncate" | "rename" => {
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
