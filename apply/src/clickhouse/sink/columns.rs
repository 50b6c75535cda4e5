//! A target's columns changed as its source's did (schema evolution): a column added before the
//! first row that has it, dropped, renamed or widened by a DDL event. A change the server
//! answers with "already done" (the column is there, or gone) is taken as done: after a crash
//! the same DDL or row is read again and must not stop the table.

use sluice_proto::v1::Column;

use super::{refused, Refusal, Sink};
use crate::clickhouse::types::{map_column, ChType, Features};
use crate::error::{clickhouse_code, BadEvent, Reason};
use sluice_common::sql::clickhouse::ident;

/// ClickHouse exception codes (`src/Common/ErrorCodes.cpp`) of the answers to schema changes
/// that mean "already done". ClickHouse 18.16 answers both an ADD COLUMN of a column that is
/// there and a DROP COLUMN of one that is not with `ILLEGAL_COLUMN`; current servers answer
/// `DUPLICATE_COLUMN` and `NOT_FOUND_COLUMN_IN_BLOCK` (or `NO_SUCH_COLUMN_IN_TABLE`), and give
/// `ILLEGAL_COLUMN` to other refusals: it counts as done only on servers before 20.1
/// ([`crate::clickhouse::types::Features::illegal_column_means_done`]).
mod code {
    pub const NOT_FOUND_COLUMN_IN_BLOCK: i32 = 10;
    pub const DUPLICATE_COLUMN: i32 = 15;
    pub const NO_SUCH_COLUMN_IN_TABLE: i32 = 16;
    pub const ILLEGAL_COLUMN: i32 = 44;
}

/// ADD COLUMN: the column is there already.
const COLUMN_EXISTS: &[i32] = &[code::DUPLICATE_COLUMN];
/// DROP COLUMN: the column is not there.
const COLUMN_MISSING: &[i32] = &[
    code::NOT_FOUND_COLUMN_IN_BLOCK,
    code::NO_SUCH_COLUMN_IN_TABLE,
];

/// Whether ClickHouse answered with one of `codes`, or with ILLEGAL_COLUMN where the server's
/// version gives that code the same meaning.
fn answered_with(e: &clickhouse::error::Error, codes: &[i32], illegal_column: bool) -> bool {
    clickhouse_code(e)
        .is_some_and(|c| codes.contains(&c) || (illegal_column && c == code::ILLEGAL_COLUMN))
}

impl Sink {
    /// Add source column `c` to target `table`, with the type [`map_column`] gives it and, for
    /// the rows already there, `default` (a ClickHouse literal; none: the type's default).
    pub(super) async fn add_column(
        &self,
        table: &str,
        c: &Column,
        default: Option<&str>,
        f: Features,
    ) -> Result<ChType, Refusal> {
        let t = map_column(c, f);
        let sql = format!(
            "ALTER TABLE {}.{}{} ADD COLUMN {} {}{}",
            ident(&self.config.clickhouse.database),
            ident(&self.config.cluster.local(table)),
            self.config.cluster.on(),
            ident(&c.name),
            t.sql(),
            default.map(|d| format!(" DEFAULT {d}")).unwrap_or_default()
        );
        let what = format!("adding column {} to {}", c.name, table);
        match self
            .answered(&what, || self.client.query(&sql).execute())
            .await?
        {
            Ok(()) => tracing::info!(table = %table, column = %c.name, "added column"),
            Err(e) if answered_with(&e, COLUMN_EXISTS, self.features.illegal_column_means_done) => {
                // There already (added by another instance, or kept from before): its type is
                // the server's, which rows are written by.
                self.refresh_distributed(table).await?;
                return match self.describe(table).await?.remove(&c.name) {
                    Some(have) => {
                        if have != t {
                            tracing::warn!(table = %table, column = %c.name, have = %have.sql(), wanted = %t.sql(), "column there already, of another type: rows are written by the type it has");
                        }
                        Ok(have)
                    }
                    None => Err(BadEvent::new(
                        Reason::Ddl,
                        format!("{sql}: {e}, and {table} has no column {} either", c.name),
                    )
                    .into()),
                };
            }
            Err(e) => return Err(BadEvent::new(Reason::Value, format!("{sql}: {e}")).into()),
        }
        self.refresh_distributed(table).await?;
        Ok(t)
    }

    /// Add the column of the columns a row does not hold (`tables.unheld_column`,
    /// `Array(String)`) to target `table`, made before its table was marked; there already
    /// (another instance added it) is done.
    pub(super) async fn add_unheld_column(&self, table: &str, col: &str) -> Result<(), Refusal> {
        let sql = format!(
            "ALTER TABLE {}.{}{} ADD COLUMN {} {}",
            ident(&self.config.clickhouse.database),
            ident(&self.config.cluster.local(table)),
            self.config.cluster.on(),
            ident(col),
            ChType::Strings.sql()
        );
        let what = format!("adding column {col} to {table}");
        match self
            .answered(&what, || self.client.query(&sql).execute())
            .await?
        {
            Ok(()) => tracing::info!(table = %table, column = %col, "added the column of values not held"),
            Err(e) if answered_with(&e, COLUMN_EXISTS, self.features.illegal_column_means_done) => {
                match self.describe(table).await?.remove(col) {
                    Some(ChType::Strings) => {}
                    have => {
                        return Err(BadEvent::new(
                            Reason::Ddl,
                            format!(
                                "{table} has a column {col} of type {}, not Array(String):                                  tables.unheld = \"mark\" names the columns a row does not hold                                  there. Remedy: set tables.unheld_column to a name the target                                  does not use",
                                have.map_or("that sluice cannot write".into(), |t| t.sql())
                            ),
                        )
                        .into())
                    }
                }
            }
            Err(e) => return Err(BadEvent::new(Reason::Ddl, format!("{sql}: {e}")).into()),
        }
        self.refresh_distributed(table).await
    }

    /// Drop column `col` of target `table` (its source column was dropped).
    pub(super) async fn drop_column(&self, table: &str, col: &str) -> Result<(), Refusal> {
        let sql = format!(
            "ALTER TABLE {}.{}{} DROP COLUMN {}",
            ident(&self.config.clickhouse.database),
            ident(&self.config.cluster.local(table)),
            self.config.cluster.on(),
            ident(col)
        );
        let what = format!("dropping column {col} of {table}");
        match self
            .answered(&what, || self.client.query(&sql).execute())
            .await?
        {
            Ok(()) => tracing::info!(table = %table, column = %col, "dropped column"),
            Err(e)
                if answered_with(&e, COLUMN_MISSING, self.features.illegal_column_means_done) => {}
            Err(e) => return Err(BadEvent::new(Reason::Ddl, format!("{sql}: {e}")).into()),
        }
        self.refresh_distributed(table).await
    }

    /// Rename column `from` of target `table` to `to` (of type `t`) at statement `version`:
    /// `RENAME COLUMN` (20.4+); before it, the column added under its new name, its values
    /// copied by a mutation (`ALTER TABLE ... UPDATE`, waited for) into the rows older than the
    /// statement (newer rows came with the new name's values: a statement replayed after
    /// them, or a rename cut short by a restart, keeps them), and the old one dropped. (With several
    /// instances, a row of the old name another instance writes between the copy and the drop
    /// loses that column's value: an ALTER that renames is best applied with one instance, or
    /// on a server with `RENAME COLUMN`.)
    pub(super) async fn rename_column(
        &self,
        table: &str,
        from: &str,
        to: &str,
        t: &ChType,
        version: u64,
    ) -> Result<(), Refusal> {
        let db = ident(&self.config.clickhouse.database);
        let local = ident(&self.config.cluster.local(table));
        let on = self.config.cluster.on();
        let versioned = self
            .targets
            .get(table)
            .is_some_and(|t| t.columns.contains_key(&self.config.tables.version_column));
        let older = if versioned {
            format!("{} < {version}", ident(&self.config.tables.version_column))
        } else {
            "1".to_string()
        };
        let steps = if self.features.rename_column {
            vec![format!(
                "ALTER TABLE {db}.{local}{on} RENAME COLUMN {} TO {}",
                ident(from),
                ident(to)
            )]
        } else {
            vec![
                format!(
                    "ALTER TABLE {db}.{local}{on} ADD COLUMN {} {}",
                    ident(to),
                    t.sql()
                ),
                format!(
                    "ALTER TABLE {db}.{local}{on} UPDATE {} = {} WHERE {older}",
                    ident(to),
                    ident(from)
                ),
                format!("ALTER TABLE {db}.{local}{on} DROP COLUMN {}", ident(from)),
            ]
        };
        let what = format!("renaming column {from} of {table}");
        for (i, sql) in steps.iter().enumerate() {
            match self
                .answered(&what, || self.client.query(sql).execute())
                .await?
            {
                Ok(()) => {}
                // (the new column there already: a rename cut short by a restart)
                Err(e)
                    if i == 0
                        && steps.len() > 1
                        && answered_with(
                            &e,
                            COLUMN_EXISTS,
                            self.features.illegal_column_means_done,
                        ) => {}
                Err(e) => return Err(BadEvent::new(Reason::Ddl, format!("{sql}: {e}")).into()),
            }
            if i == 1 {
                self.wait_for_mutations(table).await?;
            }
        }
        tracing::info!(table = %table, column = %from, to = %to, "renamed column");
        self.refresh_distributed(table).await
    }

    /// Change target column `col` of `table` to type `t` (a widening: no value changes).
    ///
    /// The column's default (`DEFAULT`, `MATERIALIZED`) is stated again: a server before 21.x
    /// drops it on a `MODIFY COLUMN` that gives only the type, and the rows of parts written
    /// before the column was added (which read that default) would then read NULL or zero.
    pub(super) async fn modify_column(
        &self,
        table: &str,
        col: &str,
        t: &ChType,
    ) -> Result<(), Refusal> {
        #[derive(clickhouse::Row, serde::Deserialize)]
        struct Default {
            default_kind: String,
            default_expression: String,
        }
        let what = format!("reading the default of column {col} of {table}");
        let default = self
            .answered(&what, || {
                self.client
                    .query(
                        "SELECT default_kind, default_expression FROM system.columns \
                         WHERE database = ? AND table = ? AND name = ?",
                    )
                    .bind(&self.config.clickhouse.database)
                    .bind(self.config.cluster.local(table))
                    .bind(col)
                    .fetch_all::<Default>()
            })
            .await?
            .map_err(|e| refused(format_args!("{what}: {e}")))?;
        let default = match default.first() {
            Some(d) if matches!(d.default_kind.as_str(), "DEFAULT" | "MATERIALIZED") => {
                format!(" {} {}", d.default_kind, d.default_expression)
            }
            _ => String::new(),
        };
        let db = ident(&self.config.clickhouse.database);
        let local = self.config.cluster.local(table);
        let on = self.config.cluster.on();
        let modify = |t_name: &str| {
            format!(
                "ALTER TABLE {db}.{}{on} MODIFY COLUMN {} {}{default}",
                ident(t_name),
                ident(col),
                t.sql()
            )
        };
        let what = format!("widening column {col} of {table}");
        if !self.features.modify_in_place && !self.config.cluster.enabled() {
            // A copy: the empty copy's column changed (no part to convert), the rows inserted
            // into it (converted on the way), and the two swapped by one RENAME.
            let (copy, old) = (
                format!("{local}__sluice_copy"),
                format!("{local}__sluice_old"),
            );
            let steps = [
                format!("DROP TABLE IF EXISTS {db}.{}", ident(&copy)),
                format!("DROP TABLE IF EXISTS {db}.{}", ident(&old)),
                format!(
                    "CREATE TABLE {db}.{} AS {db}.{}",
                    ident(&copy),
                    ident(&local)
                ),
                modify(&copy),
                format!(
                    "INSERT INTO {db}.{} SELECT * FROM {db}.{}",
                    ident(&copy),
                    ident(&local)
                ),
                format!(
                    "RENAME TABLE {db}.{l} TO {db}.{o}, {db}.{c} TO {db}.{l}",
                    l = ident(&local),
                    o = ident(&old),
                    c = ident(&copy)
                ),
                format!("DROP TABLE IF EXISTS {db}.{}", ident(&old)),
            ];
            for sql in &steps {
                self.answered(&what, || self.client.query(sql).execute())
                    .await?
                    .map_err(|e| BadEvent::new(Reason::Ddl, format!("{sql}: {e}")))?;
            }
        } else {
            let sql = modify(&local);
            self.answered(&what, || self.client.query(&sql).execute())
                .await?
                .map_err(|e| BadEvent::new(Reason::Ddl, format!("{sql}: {e}")))?;
        }
        tracing::info!(table = %table, column = %col, to = %t.sql(), "widened column");
        self.refresh_distributed(table).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clickhouse::error::Error;

    #[test]
    fn already_done_is_told_by_the_code() {
        let bad = |t: &str| Error::BadResponse(t.to_string());
        // ClickHouse 18.16: the same code for both.
        let add = bad("Code: 44, e.displayText() = DB::Exception: Cannot add column a: column with this name already exists, e.what() = DB::Exception");
        let drop = bad("Code: 44, e.displayText() = DB::Exception: Wrong column name. Cannot find column nope to drop, e.what() = DB::Exception");
        assert!(answered_with(&add, COLUMN_EXISTS, true));
        assert!(answered_with(&drop, COLUMN_MISSING, true));
        // On a current server ILLEGAL_COLUMN is some other refusal: not "done".
        assert!(!answered_with(&add, COLUMN_EXISTS, false));
        assert!(!answered_with(&drop, COLUMN_MISSING, false));
        // Current servers.
        let add = bad("Code: 15. DB::Exception: Cannot add column `a`: column with this name already exists. (DUPLICATE_COLUMN)");
        let drop = bad("Code: 10. DB::Exception: Wrong column name. Cannot find column `nope` to drop. (NOT_FOUND_COLUMN_IN_BLOCK)");
        assert!(answered_with(&add, COLUMN_EXISTS, false));
        assert!(answered_with(&drop, COLUMN_MISSING, false));
        assert!(!answered_with(&add, COLUMN_MISSING, false));
        // Other refusals are not "already done", whatever their text says.
        let other =
            bad("Code: 60. DB::Exception: Table db.t already exists or not. (UNKNOWN_TABLE)");
        assert!(!answered_with(&other, COLUMN_EXISTS, true));
        assert!(!answered_with(&Error::TimedOut, COLUMN_MISSING, true));
    }
}
