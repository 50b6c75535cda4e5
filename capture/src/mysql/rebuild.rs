//! Which ALTERs leave the rows already in a table with values no row event carries, and so are
//! followed by a rebuild: the table read again, every row published again as a snapshot read
//! at versions above the statement's, so that a target ends as the source is whatever the
//! statement did to the stored values.
//!
//! The binlog says what changes rows one by one; an ALTER changes the rows already there
//! without a row event: a column added with a default (or a generated one) takes a value in
//! every row, a narrowed type rewrites values, a key change reorders the table. Rather than
//! work out, type by type and server by server, what the server stored, the capture asks the
//! server for the rows themselves. Two kinds:
//! - [`Rebuild::Rows`]: stored values of some columns may have changed; the target keeps its
//!   table, and the rows read again overwrite the old ones (their versions are higher).
//! - [`Rebuild::Table`]: the primary key changed (added, dropped, other columns, a key column
//!   renamed or redefined): a target ordered by the old key cannot hold the new table, and is
//!   made again from the schema after the statement before the rows read again fill it. The
//!   same for partition clauses that remove, replace or add rows without row events
//!   (`TRUNCATE/DROP/EXCHANGE PARTITION`, `CONVERT PARTITION/TABLE`): no row event says which
//!   rows went.
//!
//! Statements that change no stored value (an index, a default for later rows, a column added
//! as NULL, a type widened so that every value stays as it was, a column renamed or dropped)
//! need none.

use sluice_common::sql::alter::{self, Added, Clause};
use sluice_proto::v1::{Column, ColumnType as T, TableSchema};

/// What follows an ALTER.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Rebuild {
    None,
    /// The table's rows are read again: why.
    Rows(String),
    /// The table is made again and its rows read again: why.
    Table(String),
}

impl Rebuild {
    /// The stronger of the two.
    fn and(self, other: Rebuild) -> Rebuild {
        match (self, other) {
            (t @ Rebuild::Table(_), _) | (_, t @ Rebuild::Table(_)) => t,
            (r @ Rebuild::Rows(_), _) | (_, r @ Rebuild::Rows(_)) => r,
            _ => Rebuild::None,
        }
    }
}

/// What follows `statements` (in order; one ALTER, or several a capture behind the server read
/// for the table) that took the table from `before` (where known) to `after`.
pub fn after_alter(
    before: Option<&TableSchema>,
    after: &TableSchema,
    statements: &[String],
) -> Rebuild {
    let kinds: Vec<Clause> = statements
        .iter()
        .flat_map(|s| alter::clause_kinds(s))
        .collect();
    let mut verdict = Rebuild::None;
    // Partition clauses that remove, replace or add rows without row events: the target made
    // again holds exactly the rows read again.
    if let Some(clause) = statements
        .iter()
        .find_map(|s| crate::mysql::ddl::rows_changed_without_row_events(s))
        .map(|(clause, _)| clause)
    {
        verdict = verdict.and(Rebuild::Table(format!(
            "{clause} adds or removes rows without row events"
        )));
    }
    if kinds.contains(&Clause::Rows) {
        verdict = verdict.and(Rebuild::Rows(
            "it may rewrite stored values (CONVERT TO CHARACTER SET, or a clause this capture \
             does not know)"
                .into(),
        ));
    }
    let Some(before) = before else {
        // The columns before it are not known: whatever it says of columns or the key.
        // A key column of the table after it, redefined (or given its name by a rename):
        // a sorting key's column cannot change in place in ClickHouse.
        let key_changed = after
            .primary_key
            .iter()
            .filter_map(|&i| after.columns.get(i as usize))
            .find(|c| {
                alter::modifies_in(statements, &c.name)
                    || alter::renames_in(statements)
                        .iter()
                        .any(|(_, to)| to.eq_ignore_ascii_case(&c.name))
            });
        if kinds.contains(&Clause::Key) {
            verdict = verdict.and(Rebuild::Table(
                "it adds or drops the primary key (the schema before it is not known)".into(),
            ));
        } else if let Some(c) = key_changed {
            verdict = verdict.and(Rebuild::Table(format!(
                "it redefines key column {} (the schema before it is not known)",
                c.name
            )));
        } else if kinds.contains(&Clause::Column) {
            verdict = verdict.and(Rebuild::Rows(
                "it changes columns, and the schema before it is not known".into(),
            ));
        }
        return verdict;
    };
    let renames = alter::renames_in(statements);
    // A column's name after the statements.
    let now = |name: &str| -> String {
        renames
            .iter()
            .find(|(from, _)| from == name)
            .map_or(name.to_string(), |(_, to)| to.clone())
    };
    let key = |s: &TableSchema, rename: bool| -> Vec<String> {
        s.primary_key
            .iter()
            .filter_map(|i| s.columns.get(*i as usize))
            .map(|c| if rename { now(&c.name) } else { c.name.clone() })
            .collect()
    };
    let (old_key, new_key) = (key(before, true), key(after, false));
    if old_key != new_key {
        return verdict.and(Rebuild::Table(format!(
            "the primary key changed from ({}) to ({})",
            key(before, false).join(", "),
            new_key.join(", ")
        )));
    }
    // Columns gone that the statements neither rename nor drop by name, while others came:
    // a rename cannot be told from a drop and an add, so the values come with the rows.
    let gone: Vec<&str> = before
        .columns
        .iter()
        .map(|c| c.name.as_str())
        .filter(|c| {
            let name = now(c);
            !after.columns.iter().any(|a| a.name == name) && !alter::drops_in(statements, &name)
        })
        .collect();
    let came = after
        .columns
        .iter()
        .any(|a| !before.columns.iter().any(|b| now(&b.name) == a.name));
    if !gone.is_empty() && came {
        verdict = verdict.and(Rebuild::Rows(format!(
            "column(s) {} went and others came without the statement naming a drop or a \
             rename",
            gone.join(", ")
        )));
    }
    for c in &before.columns {
        let name = now(&c.name);
        let Some(n) = after.columns.iter().find(|a| a.name == name) else {
            continue; // dropped
        };
        let is_key = new_key.contains(&name);
        if is_key && name != c.name {
            return verdict.and(Rebuild::Table(format!(
                "key column {} was renamed to {name}",
                c.name
            )));
        }
        // A sorting key's column cannot change type in place in ClickHouse, however wide.
        let redefined = definition(c) != definition(n);
        if is_key && redefined {
            return verdict.and(Rebuild::Table(format!(
                "key column {name} is now {} (was {})",
                n.sql_type, c.sql_type
            )));
        }
        if let Err(why) = keeps_values(c, n) {
            verdict = verdict.and(Rebuild::Rows(format!("column {name}: {why}")));
        }
    }
    for c in &after.columns {
        let was = before.columns.iter().any(|b| now(&b.name) == c.name);
        if was {
            continue;
        }
        let why = match alter::added_in(statements, &c.name) {
            Some(Added::Null) => None,
            Some(Added::NoDefault) if c.nullable => None,
            Some(Added::NoDefault) => Some(
                "NOT NULL without a default: every row took the \
                                            type's implicit value"
                    .to_string(),
            ),
            Some(Added::Constant(v)) => Some(format!("with the default {v:?}")),
            Some(Added::Expression(e)) => Some(format!("with the default {e}")),
            Some(Added::Generated(e)) => Some(format!("generated ({e})")),
            None => Some("by a clause this capture does not read".to_string()),
        };
        if let Some(why) = why {
            verdict = verdict.and(Rebuild::Rows(format!(
                "column {} added {why}: the rows already there took a value no row event \
                 carries",
                c.name
            )));
        }
    }
    verdict
}

/// What of a column's definition bears on the values it holds: not its name, its nullability
/// (told apart by the callers), nor how the server prints the type (`int` and `int(11)`, a
/// display width, are one type).
fn definition(c: &Column) -> Column {
    let integer = matches!(
        c.r#type(),
        T::Tinyint | T::Smallint | T::Mediumint | T::Int | T::Bigint
    );
    Column {
        name: String::new(),
        nullable: false,
        sql_type: String::new(),
        length: if integer { 0 } else { c.length },
        ..c.clone()
    }
}

/// Whether every value column `old` held is the same value under definition `new`, and why
/// not.
pub fn keeps_values(old: &Column, new: &Column) -> Result<(), String> {
    let same = |a: &Column, b: &Column| definition(a) == definition(b);
    if old.nullable && !new.nullable {
        return Err("now NOT NULL: the server turned its NULLs into the type's zero value".into());
    }
    if same(old, new) {
        return Ok(());
    }
    let changed = || {
        Err(format!(
            "its type changed from {} to {}, which may have rewritten stored values",
            old.sql_type, new.sql_type
        ))
    };
    if !old.charset.is_empty() && !new.charset.is_empty() && old.charset != new.charset {
        return changed();
    }
    let int_rank = |t: T| match t {
        T::Tinyint => Some(1),
        T::Smallint => Some(2),
        T::Mediumint => Some(3),
        T::Int => Some(4),
        T::Bigint => Some(5),
        _ => None,
    };
    let (o, n) = (old.r#type(), new.r#type());
    let kept = match (o, n) {
        _ if int_rank(o).is_some() && int_rank(n).is_some() => {
            let (ro, rn) = (int_rank(o).unwrap_or(0), int_rank(n).unwrap_or(0));
            (old.unsigned == new.unsigned && rn >= ro) || (old.unsigned && !new.unsigned && rn > ro)
        }
        (T::Decimal, T::Decimal) => {
            let digits = |c: &Column| c.length.saturating_sub(c.scale);
            digits(new) >= digits(old) && new.scale >= old.scale && (old.unsigned || !new.unsigned)
        }
        (T::Float, T::Double) => old.unsigned == new.unsigned || !new.unsigned,
        (T::Varchar, T::Varchar) | (T::Char, T::Char) | (T::Text, T::Text) => {
            new.length >= old.length
        }
        (T::Varchar, T::Text) => true,
        (T::Varbinary, T::Varbinary) | (T::Blob, T::Blob) => new.length >= old.length,
        (T::Varbinary, T::Blob) => true,
        (T::Datetime, T::Datetime) | (T::Time, T::Time) | (T::Timestamp, T::Timestamp) => {
            new.fsp >= old.fsp
        }
        (T::Enum, T::Enum) | (T::Set, T::Set) => new.members.starts_with(&old.members),
        (T::Bit, T::Bit) => new.length >= old.length,
        // Same type, another length or detail that holds no value (a display width).
        (a, b) if a == b => !matches!(a, T::Binary | T::Char | T::Decimal | T::Float),
        _ => false,
    };
    if kept {
        Ok(())
    } else {
        changed()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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

    fn schema(columns: Vec<Column>, key: &[u32]) -> TableSchema {
        TableSchema {
            database: "d".into(),
            table: "t".into(),
            columns,
            primary_key: key.to_vec(),
            schema_id: 0,
        }
    }

    fn id() -> Column {
        col("id", T::Int, "int", false)
    }

    fn alter(before: &TableSchema, after: &TableSchema, sql: &str) -> Rebuild {
        after_alter(Some(before), after, &[sql.to_string()])
    }

    fn is_rows(r: &Rebuild, needle: &str) -> bool {
        matches!(r, Rebuild::Rows(why) if why.contains(needle))
    }

    #[test]
    fn a_column_added_with_a_value_for_the_rows_there_rebuilds_them() {
        let before = schema(vec![id()], &[0]);
        let with = |c: Column| schema(vec![id(), c], &[0]);
        // NULL in every row: nothing to read again.
        let nullable = with(col("c", T::Int, "int", true));
        assert_eq!(
            alter(&before, &nullable, "ALTER TABLE t ADD c INT"),
            Rebuild::None
        );
        assert_eq!(
            alter(
                &before,
                &nullable,
                "ALTER TABLE t ADD COLUMN c INT DEFAULT NULL"
            ),
            Rebuild::None
        );
        // Whatever the default's form: the server's value, not the statement's text.
        for (sql, c) in [
            (
                "ALTER TABLE t ADD c INT DEFAULT 2.7",
                col("c", T::Int, "int", true),
            ),
            (
                "ALTER TABLE t ADD c TIME DEFAULT '10:00'",
                col("c", T::Time, "time", true),
            ),
            (
                "ALTER TABLE t ADD c INT NOT NULL",
                col("c", T::Int, "int", false),
            ),
            (
                "ALTER TABLE t ADD c TIMESTAMP NOT NULL DEFAULT CURRENT_TIMESTAMP",
                col("c", T::Timestamp, "timestamp", false),
            ),
            (
                "ALTER TABLE t ADD c INT AS (id * 2) VIRTUAL",
                col("c", T::Int, "int", true),
            ),
            (
                "ALTER TABLE t ADD c BOOLEAN DEFAULT TRUE",
                col("c", T::Tinyint, "tinyint(1)", true),
            ),
        ] {
            let r = alter(&before, &with(c), sql);
            assert!(is_rows(&r, "column c added"), "{sql}: {r:?}");
        }
    }

    #[test]
    fn a_changed_type_rebuilds_unless_every_value_stays() {
        let t = |c: Column| schema(vec![id(), c], &[0]);
        let int = col("c", T::Int, "int", true);
        let big = col("c", T::Bigint, "bigint", true);
        let modify = "ALTER TABLE t MODIFY c X";
        // How the server prints a type (a display width) is no change.
        let int11 = Column {
            sql_type: "int(11)".into(),
            length: 11,
            ..int.clone()
        };
        assert_eq!(alter(&t(int.clone()), &t(int11), modify), Rebuild::None);
        assert_eq!(
            alter(&t(int.clone()), &t(big.clone()), modify),
            Rebuild::None
        );
        assert!(is_rows(
            &alter(&t(big), &t(int.clone()), modify),
            "type changed"
        ));
        let not_null = Column {
            nullable: false,
            ..int.clone()
        };
        assert!(is_rows(
            &alter(&t(int.clone()), &t(not_null.clone()), modify),
            "NOT NULL"
        ));
        assert_eq!(alter(&t(not_null), &t(int), modify), Rebuild::None);
        let dec = |p: u32, s: u32| Column {
            length: p,
            scale: s,
            ..col("c", T::Decimal, &format!("decimal({p},{s})"), true)
        };
        assert_eq!(alter(&t(dec(6, 2)), &t(dec(10, 2)), modify), Rebuild::None);
        assert_eq!(alter(&t(dec(6, 2)), &t(dec(7, 3)), modify), Rebuild::None);
        assert!(is_rows(
            &alter(&t(dec(6, 2)), &t(dec(6, 1)), modify),
            "type"
        ));
        let time = |fsp: u32| Column {
            fsp,
            ..col("c", T::Time, "time", true)
        };
        assert!(is_rows(&alter(&t(time(3)), &t(time(0)), modify), "type"));
        assert_eq!(alter(&t(time(0)), &t(time(3)), modify), Rebuild::None);
        let float = col("c", T::Float, "float", true);
        let double = col("c", T::Double, "double", true);
        assert!(is_rows(
            &alter(&t(double.clone()), &t(float.clone()), modify),
            "type"
        ));
        assert_eq!(alter(&t(float), &t(double), modify), Rebuild::None);
        let varchar = |n: u32| Column {
            length: n,
            ..col("c", T::Varchar, &format!("varchar({n})"), true)
        };
        assert!(is_rows(
            &alter(&t(varchar(20)), &t(varchar(5)), modify),
            "type"
        ));
        assert_eq!(
            alter(&t(varchar(5)), &t(varchar(20)), modify),
            Rebuild::None
        );
        let date = col("c", T::Date, "date", true);
        let datetime = col("c", T::Datetime, "datetime", true);
        assert!(is_rows(&alter(&t(date), &t(datetime), modify), "type"));
        let members = |m: &[&str]| Column {
            members: m.iter().map(|s| s.to_string()).collect(),
            ..col("c", T::Enum, "enum", true)
        };
        assert_eq!(
            alter(
                &t(members(&["a", "b"])),
                &t(members(&["a", "b", "c"])),
                modify
            ),
            Rebuild::None
        );
        assert!(is_rows(
            &alter(&t(members(&["a", "b"])), &t(members(&["b", "a"])), modify),
            "type"
        ));
    }

    #[test]
    fn columns_gone_and_come_without_a_named_drop_or_rename_are_read_again() {
        let a = col("a", T::Int, "int", true);
        let b = col("b", T::Int, "int", true);
        let before = schema(vec![id(), a.clone()], &[0]);
        let after = schema(vec![id(), b.clone()], &[0]);
        // Named: a rename, or a drop and an add: the values are known.
        assert_eq!(
            alter(&before, &after, "ALTER TABLE t RENAME COLUMN a TO b"),
            Rebuild::None
        );
        assert_eq!(
            alter(
                &before,
                &after,
                "ALTER TABLE t DROP COLUMN a, ADD COLUMN b INT"
            ),
            Rebuild::None
        );
        // Not named (a statement this capture cannot read for columns): read again.
        assert!(matches!(
            alter(&before, &after, "ALTER TABLE t ENGINE = InnoDB"),
            Rebuild::Rows(why) if why.contains("column(s) a went")
        ));
    }

    #[test]
    fn partition_clauses_that_move_rows_make_the_table_again() {
        let t = schema(vec![id()], &[0]);
        for sql in [
            "ALTER TABLE t TRUNCATE PARTITION p0",
            "ALTER TABLE t DROP PARTITION p0, p1",
            "ALTER TABLE t EXCHANGE PARTITION p1 WITH TABLE x",
            "ALTER TABLE t CONVERT PARTITION p2 TO TABLE y",
            "ALTER TABLE t CONVERT TABLE c TO PARTITION p4 VALUES LESS THAN (50)",
        ] {
            assert!(
                matches!(alter(&t, &t, sql), Rebuild::Table(why) if why.contains("without row events")),
                "{sql}"
            );
            // Among statements read behind the server, and with the schema before unknown.
            let statements = ["ALTER TABLE t ADD INDEX (id)".to_string(), sql.to_string()];
            assert!(matches!(
                after_alter(None, &t, &statements),
                Rebuild::Table(_)
            ));
        }
        // Clauses that keep every row need nothing.
        for sql in [
            "ALTER TABLE t ADD PARTITION (PARTITION p9 VALUES LESS THAN (100))",
            "ALTER TABLE t REORGANIZE PARTITION p0 INTO (PARTITION a VALUES LESS THAN (5))",
            "ALTER TABLE t REMOVE PARTITIONING",
        ] {
            assert_eq!(alter(&t, &t, sql), Rebuild::None, "{sql}");
        }
    }

    #[test]
    fn a_key_change_makes_the_table_again() {
        let k = col("k", T::Int, "int", false);
        let v = col("v", T::Int, "int", false);
        let before = schema(vec![k.clone(), v.clone()], &[0]);
        let after = schema(vec![k.clone(), v.clone()], &[0, 1]);
        let r = alter(
            &before,
            &after,
            "ALTER TABLE t DROP PRIMARY KEY, ADD PRIMARY KEY (k, v)",
        );
        assert!(
            matches!(&r, Rebuild::Table(why) if why.contains("from (k) to (k, v)")),
            "{r:?}"
        );
        // A keyless table given one.
        let keyless = schema(vec![k.clone(), v.clone()], &[]);
        assert!(matches!(
            alter(&keyless, &before, "ALTER TABLE t ADD PRIMARY KEY (k)"),
            Rebuild::Table(_)
        ));
        // A key column printed otherwise (int(11)) is the same column.
        let printed = schema(
            vec![
                Column {
                    sql_type: "int(11)".into(),
                    length: 11,
                    ..k.clone()
                },
                v.clone(),
            ],
            &[0],
        );
        assert_eq!(
            alter(&before, &printed, "ALTER TABLE t DROP c"),
            Rebuild::None
        );
        // A key column widened or renamed: ClickHouse cannot change a sorting key in place.
        let big = schema(vec![col("k", T::Bigint, "bigint", false), v.clone()], &[0]);
        assert!(matches!(
            alter(&before, &big, "ALTER TABLE t MODIFY k BIGINT NOT NULL"),
            Rebuild::Table(why) if why.contains("key column k")
        ));
        let renamed = schema(vec![col("kk", T::Int, "int", false), v.clone()], &[0]);
        assert!(matches!(
            alter(&before, &renamed, "ALTER TABLE t RENAME COLUMN k TO kk"),
            Rebuild::Table(why) if why.contains("renamed")
        ));
        // A renamed value column keeps its values.
        let v2 = schema(vec![k.clone(), col("w", T::Int, "int", false)], &[0]);
        assert_eq!(
            alter(&before, &v2, "ALTER TABLE t CHANGE v w INT NOT NULL"),
            Rebuild::None
        );
    }

    #[test]
    fn without_the_schema_before_the_clauses_decide() {
        let after = schema(vec![id()], &[0]);
        let r = |sql: &str| after_alter(None, &after, &[sql.to_string()]);
        assert_eq!(r("CREATE INDEX i ON t (id)"), Rebuild::None);
        assert_eq!(
            r("ALTER TABLE t ADD INDEX i (id), COMMENT 'x'"),
            Rebuild::None
        );
        assert_eq!(
            r("ALTER TABLE t ALTER COLUMN c SET DEFAULT 5"),
            Rebuild::None
        );
        assert!(matches!(r("ALTER TABLE t ADD c INT"), Rebuild::Rows(_)));
        assert!(matches!(
            r("ALTER TABLE t DROP PRIMARY KEY, ADD PRIMARY KEY (id)"),
            Rebuild::Table(_)
        ));
        assert!(matches!(
            r("ALTER TABLE t CONVERT TO CHARACTER SET latin1"),
            Rebuild::Rows(_)
        ));
        // A key column redefined or renamed to: the key may have changed (found by
        // `pipeline_random`, seed 5 on 18.16: a widening of `id` read behind the server went
        // to the target as a column change, which ClickHouse refuses for a sorting key).
        assert!(matches!(
            r("ALTER TABLE t MODIFY id BIGINT NOT NULL"),
            Rebuild::Table(why) if why.contains("key column id")
        ));
        assert!(matches!(
            r("ALTER TABLE t CHANGE COLUMN x id BIGINT NOT NULL"),
            Rebuild::Table(_)
        ));
        assert!(matches!(
            r("ALTER TABLE t RENAME COLUMN x TO id"),
            Rebuild::Table(_)
        ));
        assert!(matches!(r("ALTER TABLE t MODIFY c INT"), Rebuild::Rows(_)));
    }
}
