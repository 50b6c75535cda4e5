//! The plan of one table: which columns are compared (with the target's type of each), its key,
//! whether it is compared in key ranges ([`Chunk`]), and the SQL that reads both sides; or why
//! the table cannot be verified.

use std::collections::BTreeMap;

use sluice_apply::clickhouse::Mode;
use sluice_common::sql::{clickhouse as ch, mysql as my};
use sluice_proto::v1::{Column, ColumnType, TableSchema};

use super::render;
use super::source::Source;
use super::target::Target;
use super::Setup;

/// One table's comparison plan.
pub(super) struct Plan {
    pub(super) db: String,
    pub(super) table: String,
    pub(super) target: String,
    pub(super) schema: TableSchema,
    /// Source columns compared, with the target's type of each.
    pub(super) columns: Vec<(Column, String)>,
    /// The primary key's columns, with their target types.
    pub(super) key: Vec<(Column, String)>,
    /// The key is one integer column: chunks are key ranges.
    pub(super) ranged: bool,
    pub(super) version_column: String,
    pub(super) deleted_column: Option<String>,
    /// The target's column of the columns a row does not hold (`tables.unheld_column`,
    /// `Array(String)`), where it has one: a key whose only differences are columns its
    /// newest row names there is reported as marked, not different.
    pub(super) unheld_column: Option<String>,
}

impl Plan {
    pub(super) fn source_name(&self) -> String {
        format!("{}.{}", my::ident(&self.db), my::ident(&self.table))
    }

    pub(super) fn my_row(&self) -> String {
        render::mysql_concat(
            &self
                .columns
                .iter()
                .map(|(c, t)| render::mysql_part(c, t))
                .collect::<Vec<_>>(),
        )
    }

    pub(super) fn my_key(&self) -> String {
        render::mysql_concat(
            &self
                .key
                .iter()
                .map(|(c, t)| render::mysql_part(c, t))
                .collect::<Vec<_>>(),
        )
    }

    pub(super) fn ch_row(&self) -> String {
        render::clickhouse_concat(
            &self
                .columns
                .iter()
                .map(|(c, t)| render::clickhouse_part(c, t))
                .collect::<Vec<_>>(),
        )
    }

    pub(super) fn ch_key(&self) -> String {
        render::clickhouse_concat(
            &self
                .key
                .iter()
                .map(|(c, t)| render::clickhouse_part(c, t))
                .collect::<Vec<_>>(),
        )
    }

    pub(super) fn ch_deleted(&self) -> String {
        match &self.deleted_column {
            Some(d) => format!("toUInt8({})", ch::ident(d)),
            None => "toUInt8(0)".into(),
        }
    }

    /// The `WHERE` of a chunk (`1` for the whole table); the same text on both servers.
    pub(super) fn range(&self, chunk: &Chunk, quote: fn(&str) -> String) -> String {
        if !self.ranged {
            return "1".into();
        }
        let k = quote(&self.key[0].0.name);
        let mut w = Vec::new();
        if let Some(lo) = &chunk.lo {
            w.push(format!("{k} > {lo}"));
        }
        if let Some(hi) = &chunk.hi {
            w.push(format!("{k} <= {hi}"));
        }
        if w.is_empty() {
            "1".into()
        } else {
            w.join(" AND ")
        }
    }

    /// The target's newest row of each key of a chunk.
    pub(super) fn ch_latest(&self, chunk: &Chunk) -> String {
        format!(
            "SELECT _sluice_k, argMax(_sluice_h, _sluice_v) AS _sluice_lh, max(_sluice_v) AS \
             _sluice_lv, argMax(_sluice_d, _sluice_v) AS _sluice_ld FROM (SELECT {key} AS _sluice_k, \
             {hash} AS _sluice_h, {ver} AS _sluice_v, {del} AS _sluice_d FROM {db}.{t} WHERE {range}) \
             GROUP BY _sluice_k",
            key = self.ch_key(),
            hash = render::clickhouse_hash(&self.ch_row()),
            ver = ch::ident(&self.version_column),
            del = self.ch_deleted(),
            db = ch::ident(&self.target_db()),
            t = ch::ident(self.target_table()),
            range = self.range(chunk, ch::ident),
        )
    }

    pub(super) fn target_db(&self) -> String {
        self.target
            .split_once('.')
            .map(|(d, _)| d)
            .unwrap_or("")
            .to_string()
    }

    pub(super) fn target_table(&self) -> &str {
        self.target
            .split_once('.')
            .map(|(_, t)| t)
            .unwrap_or(&self.target)
    }
}

/// A key range: keys above `lo` up to `hi` (integers as text); open where absent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Chunk {
    pub(super) lo: Option<String>,
    pub(super) hi: Option<String>,
}

/// The plan of one table, or why it cannot be verified.
pub(super) async fn plan(
    source: &Source,
    target: &Target,
    setup: &Setup,
    db: &str,
    table: &str,
    target_table: &str,
    stopped: &BTreeMap<String, String>,
) -> Result<Result<Plan, String>, String> {
    let tables = &setup.apply.tables;
    let name = format!("{db}.{table}");
    let mut conn = source.conn().await?;
    let Some(schema) = sluice_capture::mysql::schema::load(&mut conn, db, table)
        .await
        .map_err(|e| format!("reading the schema of {name}: {e}"))?
    else {
        return Ok(Err("the table no longer exists in the source".into()));
    };
    drop(conn);
    if schema.primary_key.is_empty() {
        return Ok(Err(
            "no primary key: its target is a change log, which verify does not compare".into(),
        ));
    }
    if tables.mode_of(&name) == Mode::Changelog {
        return Ok(Err(
            "a change-log table (tables.modes): verify compares mirrors".into(),
        ));
    }
    if let Some(reason) = stopped.get(target_table) {
        return Ok(Err(stopped_reason(reason)));
    }
    let target_columns: BTreeMap<String, String> = target
        .columns(&format!("{}.{target_table}", target.database))
        .await?
        .into_iter()
        .collect();
    if target_columns.is_empty() {
        return Ok(Err(format!(
            "no target table {}.{target_table}",
            target.database
        )));
    }
    if !target_columns.contains_key(&tables.version_column) {
        return Ok(Err(format!(
            "the target has no version column {:?} (tables.version_column)",
            tables.version_column
        )));
    }
    let columns: Vec<(Column, String)> = schema
        .columns
        .iter()
        .filter_map(|c| target_columns.get(&c.name).map(|t| (c.clone(), t.clone())))
        .collect();
    let mut key = Vec::new();
    for i in &schema.primary_key {
        let c = &schema.columns[*i as usize];
        match target_columns.get(&c.name) {
            Some(t) => key.push((c.clone(), t.clone())),
            None => {
                return Ok(Err(format!(
                    "the target has no column {:?} of the primary key",
                    c.name
                )))
            }
        }
    }
    let ranged = key.len() == 1
        && matches!(
            key[0].0.r#type(),
            ColumnType::Tinyint
                | ColumnType::Smallint
                | ColumnType::Mediumint
                | ColumnType::Int
                | ColumnType::Bigint
        );
    Ok(Ok(Plan {
        db: db.to_string(),
        table: table.to_string(),
        target: format!("{}.{target_table}", target.database),
        schema,
        columns,
        key,
        ranged,
        version_column: tables.version_column.clone(),
        deleted_column: target_columns
            .contains_key(&tables.deleted_column)
            .then(|| tables.deleted_column.clone()),
        unheld_column: (target_columns
            .get(&tables.unheld_column)
            .map(String::as_str)
            == Some("Array(String)"))
        .then(|| tables.unheld_column.clone()),
    }))
}

/// Why a table the apply stage stopped (for `reason`) is not verified.
pub(super) fn stopped_reason(reason: &str) -> String {
    format!(
        "the apply stage stopped this table: {reason} (docs/apply-clickhouse.md, Target tables)"
    )
}
