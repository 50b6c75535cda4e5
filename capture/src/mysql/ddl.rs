//! What a statement in a binlog QUERY event does to the tables the capture follows.
//!
//! The capture does not need to understand a DDL statement fully: it needs to know which tables
//! it touches, so that it re-reads their schemas from the server, and what kind it is, for the
//! DDL event it publishes. Everything else in the statement is passed on verbatim.

use sluice_common::sql::mysql::{qualified_at, tokens, Token};

/// A table named in a statement, with its database when the statement qualified it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TableRef {
    pub database: Option<String>,
    pub table: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Statement {
    /// BEGIN, COMMIT, ROLLBACK, SAVEPOINT, XA ...: transaction control, no schema change.
    Transaction(TxControl),
    /// A schema change of these tables; `renamed_to` pairs for RENAME/ALTER ... RENAME.
    Ddl {
        kind: &'static str,
        tables: Vec<TableRef>,
        renamed_to: Vec<TableRef>,
    },
    /// CREATE/DROP DATABASE.
    Database { kind: &'static str, name: String },
    /// A row change logged as a statement (INSERT, REPLACE, UPDATE, DELETE, LOAD DATA): the
    /// writing session's `binlog_format` was STATEMENT or MIXED, or the server emptied a MEMORY
    /// table. It carries no row images. `tables` are those it names where they can be told
    /// (empty: it names tables this parser cannot pick out, such as a multi-table UPDATE).
    Dml { tables: Vec<TableRef> },
    /// Anything else (GRANT, CREATE USER, FLUSH, ...): no effect on captured tables.
    Other,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TxControl {
    Begin,
    Commit,
    Rollback,
    Other,
}

/// A statement's tokens, read by position: keywords in upper case, names qualified or not.
struct Words {
    t: Vec<Token>,
    upper: Vec<String>,
}

impl Words {
    fn new(sql: &str) -> Self {
        let t = tokens(sql);
        let upper = t
            .iter()
            .map(|x| match x {
                Token::Word(w) => w.to_ascii_uppercase(),
                Token::Punct(c) => c.to_string(),
                _ => String::new(),
            })
            .collect();
        Self { t, upper }
    }

    /// The keyword (or punctuation) at `i`; empty for names, strings and past the end.
    fn w(&self, i: usize) -> &str {
        self.upper.get(i).map(String::as_str).unwrap_or("")
    }

    /// The first keyword `k` at or after `from`.
    fn find(&self, from: usize, k: &str) -> Option<usize> {
        (from..self.upper.len()).find(|&i| self.w(i) == k)
    }

    /// The table named at `i`, and the index after its name.
    fn table(&self, i: usize) -> Option<(TableRef, usize)> {
        qualified_at(&self.t, i).map(|(q, next)| {
            (
                TableRef {
                    database: q.database,
                    table: q.name,
                },
                next,
            )
        })
    }

    /// Past `IF [NOT] EXISTS` at `i`.
    fn skip_if(&self, mut i: usize) -> usize {
        while matches!(self.w(i), "IF" | "NOT" | "EXISTS") {
            i += 1;
        }
        i
    }
}

/// Classify a statement of a QUERY event.
pub fn classify(sql: &str) -> Statement {
    let words = Words::new(sql);
    // `WITH cte AS (...) UPDATE/DELETE ...` (MySQL 8): the statement after the common table
    // expressions, at the top level (not the SELECTs inside them).
    if words.w(0) == "WITH" {
        let mut depth = 0i32;
        for k in 1..words.upper.len() {
            match words.w(k) {
                "(" => depth += 1,
                ")" => depth -= 1,
                "UPDATE" | "DELETE" | "INSERT" | "REPLACE" if depth == 0 => {
                    return classify_words(Words {
                        t: words.t[k..].to_vec(),
                        upper: words.upper[k..].to_vec(),
                    });
                }
                _ => {}
            }
        }
        return Statement::Other;
    }
    classify_words(words)
}

/// [`classify`], of a statement's tokens.
fn classify_words(words: Words) -> Statement {
    let w = |i: usize| words.w(i);
    match w(0) {
        "BEGIN" => return Statement::Transaction(TxControl::Begin),
        "COMMIT" => return Statement::Transaction(TxControl::Commit),
        "ROLLBACK" if w(1) != "TO" => return Statement::Transaction(TxControl::Rollback),
        "ROLLBACK" | "SAVEPOINT" | "RELEASE" | "XA" => {
            return Statement::Transaction(TxControl::Other)
        }
        _ => {}
    }
    // Skip modifiers between the verb and TABLE: CREATE OR REPLACE / TEMPORARY, ALTER ONLINE
    // IGNORE, DROP TEMPORARY ...
    let mut i = 1;
    let verb = w(0);
    while matches!(
        w(i),
        "OR" | "REPLACE" | "TEMPORARY" | "ONLINE" | "OFFLINE" | "IGNORE"
    ) {
        i += 1;
    }
    // CREATE [UNIQUE|FULLTEXT|SPATIAL] INDEX i ON t / DROP INDEX i ON t: may change the key.
    if matches!(verb, "CREATE" | "DROP") {
        let mut j = i;
        while matches!(w(j), "UNIQUE" | "FULLTEXT" | "SPATIAL") {
            j += 1;
        }
        if w(j) == "INDEX" {
            return match words.find(j, "ON").and_then(|k| words.table(k + 1)) {
                Some((table, _)) => Statement::Ddl {
                    kind: "alter",
                    tables: vec![table],
                    renamed_to: vec![],
                },
                None => Statement::Other,
            };
        }
    }
    match (verb, w(i)) {
        ("CREATE" | "DROP", "DATABASE" | "SCHEMA") => {
            match words.t.get(words.skip_if(i + 1)).and_then(Token::name) {
                Some(name) => Statement::Database {
                    kind: if verb == "CREATE" {
                        "create_database"
                    } else {
                        "drop_database"
                    },
                    name: name.to_string(),
                },
                None => Statement::Other,
            }
        }
        ("CREATE", "TABLE") | ("ALTER", "TABLE") | ("DROP", "TABLE") | ("TRUNCATE", _) => {
            let kind = match verb {
                "CREATE" => "create",
                "ALTER" => "alter",
                "DROP" => "drop",
                _ => "truncate",
            };
            let mut j = match (verb, w(1)) {
                ("TRUNCATE", "TABLE") => 2,
                ("TRUNCATE", _) => 1,
                _ => i + 1,
            };
            j = words.skip_if(j);
            let mut tables = Vec::new();
            // DROP TABLE a, b, c; others name one table.
            let mut after = j;
            while let Some((table, next)) = words.table(j) {
                tables.push(table);
                after = next;
                if verb == "DROP" && w(next) == "," {
                    j = next + 1;
                } else {
                    break;
                }
            }
            let mut renamed_to = Vec::new();
            if verb == "ALTER" {
                // ALTER TABLE a ... RENAME [TO|AS] b
                if let Some(k) = words.find(after, "RENAME") {
                    let mut k = k + 1;
                    if matches!(w(k), "TO" | "AS") {
                        k += 1;
                    }
                    if !matches!(w(k), "COLUMN" | "INDEX" | "KEY") {
                        if let Some((to, _)) = words.table(k) {
                            renamed_to.push(to);
                        }
                    }
                }
            }
            if tables.is_empty() {
                Statement::Other
            } else {
                Statement::Ddl {
                    kind: if renamed_to.is_empty() {
                        kind
                    } else {
                        "rename"
                    },
                    tables,
                    renamed_to,
                }
            }
        }
        ("RENAME", "TABLE") => {
            // RENAME TABLE a TO b, c TO d
            let mut tables = Vec::new();
            let mut renamed_to = Vec::new();
            let mut j = i + 1;
            while let Some((from, k)) = words.table(j) {
                let Some((to, next)) = words.table(k + 1).filter(|_| w(k) == "TO") else {
                    break;
                };
                tables.push(from);
                renamed_to.push(to);
                if w(next) != "," {
                    break;
                }
                j = next + 1;
            }
            if tables.is_empty() {
                Statement::Other
            } else {
                Statement::Ddl {
                    kind: "rename",
                    tables,
                    renamed_to,
                }
            }
        }
        ("INSERT" | "REPLACE" | "UPDATE" | "DELETE" | "LOAD", _) => {
            // The first table the statement writes: after its modifiers (and INTO / FROM /
            // DATA ... INTO TABLE). Multi-table forms name more than one: then none is sure.
            let skip = [
                "LOW_PRIORITY",
                "DELAYED",
                "HIGH_PRIORITY",
                "QUICK",
                "IGNORE",
                "CONCURRENT",
                "LOCAL",
            ];
            let mut j = 1;
            while skip.contains(&w(j)) {
                j += 1;
            }
            let target = match verb {
                "INSERT" | "REPLACE" => {
                    if w(j) == "INTO" {
                        j += 1;
                    }
                    words.table(j)
                }
                "DELETE" => {
                    if w(j) != "FROM" {
                        None // DELETE t1, t2 FROM ...: several tables
                    } else {
                        words.table(j + 1).filter(|(_, next)| {
                            !matches!(w(*next), "," | "USING" | "JOIN" | "INNER" | "LEFT")
                        })
                    }
                }
                "UPDATE" => words.table(j).filter(|(_, next)| {
                    !matches!(w(*next), "," | "JOIN" | "INNER" | "LEFT" | "STRAIGHT_JOIN")
                }),
                _ => words.find(1, "TABLE").and_then(|k| words.table(k + 1)),
            };
            Statement::Dml {
                tables: target.map(|(t, _)| vec![t]).unwrap_or_default(),
            }
        }
        _ => Statement::Other,
    }
}

/// Every name in `text` (a view's definition, a trigger's body) that could be a table: each
/// name, qualified by the one before it where a dot joins them, else in `default_db`. More
/// than the tables it writes (columns too): the caller keeps those it knows as tables.
pub fn names_in(text: &str, default_db: &str) -> Vec<(String, String)> {
    let t = tokens(text);
    let mut out = Vec::new();
    for i in 0..t.len() {
        if t[i].name().is_none() {
            continue;
        }
        if let Some((q, _)) = qualified_at(&t, i) {
            let db = q.database.unwrap_or_else(|| default_db.to_string());
            if !out.contains(&(db.clone(), q.name.clone())) {
                out.push((db, q.name));
            }
        }
    }
    out
}

/// The table `CREATE TABLE t LIKE src` (or `(LIKE src)`) copies the definition of: `src`.
/// `None` for any other statement.
pub fn created_like(sql: &str) -> Option<TableRef> {
    let words = Words::new(sql);
    let w = |i: usize| words.w(i);
    let mut i = 1;
    while matches!(w(i), "OR" | "REPLACE" | "TEMPORARY") {
        i += 1;
    }
    if w(0) != "CREATE" || w(i) != "TABLE" {
        return None;
    }
    let (_, next) = words.table(words.skip_if(i + 1))?;
    let at = if w(next) == "(" { next + 1 } else { next };
    if w(at) != "LIKE" {
        return None;
    }
    words.table(at + 1).map(|(t, _)| t)
}

/// An `ALTER TABLE` clause that removes, replaces or adds rows without logging them as row
/// events (`TRUNCATE/DROP/EXCHANGE PARTITION`, MariaDB's `CONVERT PARTITION/TABLE`, `DISCARD` or
/// `IMPORT TABLESPACE`): the clause, and the other tables whose rows it moves (`EXCHANGE
/// PARTITION p WITH TABLE t2`, `CONVERT PARTITION p TO TABLE t2`, `CONVERT TABLE t2 TO
/// PARTITION p`). `None` for every other statement: partition clauses that keep every row
/// (`ADD`, `REORGANIZE`, `COALESCE`, `REBUILD`, `REMOVE PARTITIONING` ...) change nothing a row
/// event would have said.
pub fn rows_changed_without_row_events(sql: &str) -> Option<(String, Vec<TableRef>)> {
    let words = Words::new(sql);
    let w = |i: usize| words.w(i);
    let mut i = 1;
    while matches!(w(i), "ONLINE" | "OFFLINE" | "IGNORE") {
        i += 1;
    }
    if w(0) != "ALTER" || w(i) != "TABLE" {
        return None;
    }
    for j in i + 1..words.upper.len() {
        let clause = match (w(j), w(j + 1)) {
            ("TRUNCATE" | "DROP" | "EXCHANGE", "PARTITION") => {
                format!("{} PARTITION", w(j))
            }
            ("CONVERT", "PARTITION" | "TABLE") => format!("CONVERT {}", w(j + 1)),
            ("DISCARD" | "IMPORT", "TABLESPACE") => format!("{} TABLESPACE", w(j)),
            ("DISCARD" | "IMPORT", "PARTITION") => format!("{} PARTITION ... TABLESPACE", w(j)),
            _ => continue,
        };
        let mut others = Vec::new();
        // EXCHANGE PARTITION p WITH TABLE t2 / CONVERT PARTITION p TO TABLE t2
        if let Some(k) = (j..words.upper.len().saturating_sub(1))
            .find(|&k| matches!(w(k), "WITH" | "TO") && w(k + 1) == "TABLE")
        {
            if let Some((t, _)) = words.table(k + 2) {
                others.push(t);
            }
        }
        // CONVERT TABLE t2 TO PARTITION p
        if clause == "CONVERT TABLE" {
            if let Some((t, _)) = words.table(j + 2) {
                others.push(t);
            }
        }
        return Some((clause, others));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(db: Option<&str>, table: &str) -> TableRef {
        TableRef {
            database: db.map(str::to_string),
            table: table.to_string(),
        }
    }

    #[test]
    fn the_names_a_view_or_a_trigger_may_write() {
        let names = names_in(
            "select `db`.`t`.`id` AS `id` from (`db`.`t` join `other`.`u`)",
            "db",
        );
        for want in [("db", "t"), ("other", "u")] {
            assert!(
                names.contains(&(want.0.to_string(), want.1.to_string())),
                "{names:?}"
            );
        }
        let names = names_in("BEGIN INSERT INTO audit VALUES (NEW.id); END", "db");
        assert!(
            names.contains(&("db".to_string(), "audit".to_string())),
            "{names:?}"
        );
    }

    #[test]
    fn names_beyond_ascii_are_read_whole() {
        assert_eq!(
            classify("TRUNCATE TABLE `db`.`café` /* ünïcode */"),
            Statement::Ddl {
                kind: "truncate",
                tables: vec![t(Some("db"), "café")],
                renamed_to: vec![],
            }
        );
        assert_eq!(
            classify("UPDATE `naïve` SET s = 'ça' WHERE id = 1"),
            Statement::Dml {
                tables: vec![t(None, "naïve")]
            }
        );
    }

    #[test]
    fn a_row_change_after_common_table_expressions_is_one() {
        assert_eq!(
            classify(
                "WITH c AS (SELECT id FROM db.src WHERE x > (SELECT 1)) \
                 UPDATE db.t SET v = 1 WHERE id IN (SELECT id FROM c)"
            ),
            Statement::Dml {
                tables: vec![t(Some("db"), "t")]
            }
        );
        assert_eq!(
            classify("with recursive c(n) as (select 1 union all select n + 1 from c where n < 5) delete from `t` where id in (select n from c)"),
            Statement::Dml {
                tables: vec![t(None, "t")]
            }
        );
        // A SELECT, and an UPDATE inside a CTE's parentheses only: not a row change.
        assert_eq!(
            classify("WITH c AS (SELECT 1) SELECT * FROM c"),
            Statement::Other
        );
    }

    #[test]
    fn the_table_a_create_like_copies() {
        assert_eq!(
            created_like("CREATE TABLE `db`.`t5` LIKE `db`.`t1`"),
            Some(t(Some("db"), "t1"))
        );
        assert_eq!(
            created_like("create table if not exists t5 (like t1)"),
            Some(t(None, "t1"))
        );
        assert_eq!(
            created_like("CREATE TABLE t5 (id INT) SELECT * FROM t1"),
            None
        );
        assert_eq!(created_like("CREATE TABLE t5 (likes INT)"), None);
        assert_eq!(created_like("ALTER TABLE t5 ADD COLUMN c INT"), None);
    }

    #[test]
    fn partition_clauses_that_change_rows_without_row_events() {
        let r = rows_changed_without_row_events;
        assert_eq!(
            r("ALTER TABLE t TRUNCATE PARTITION p0"),
            Some(("TRUNCATE PARTITION".into(), vec![]))
        );
        assert_eq!(
            r("alter table `db`.`t` drop partition p0, p1"),
            Some(("DROP PARTITION".into(), vec![]))
        );
        assert_eq!(
            r("ALTER TABLE t EXCHANGE PARTITION p0 WITH TABLE db2.t2 WITHOUT VALIDATION"),
            Some(("EXCHANGE PARTITION".into(), vec![t(Some("db2"), "t2")]))
        );
        assert_eq!(
            r("ALTER TABLE t CONVERT PARTITION p0 TO TABLE t_old"),
            Some(("CONVERT PARTITION".into(), vec![t(None, "t_old")]))
        );
        assert_eq!(
            r("ALTER TABLE t CONVERT TABLE t_new TO PARTITION p9 VALUES LESS THAN (10)"),
            Some(("CONVERT TABLE".into(), vec![t(None, "t_new")]))
        );
        assert_eq!(
            r("ALTER TABLE t IMPORT TABLESPACE"),
            Some(("IMPORT TABLESPACE".into(), vec![]))
        );
        // Clauses that keep every row, and other statements.
        for sql in [
            "ALTER TABLE t ADD PARTITION (PARTITION p9 VALUES LESS THAN (100))",
            "ALTER TABLE t REORGANIZE PARTITION p0 INTO (PARTITION a VALUES LESS THAN (5))",
            "ALTER TABLE t REMOVE PARTITIONING",
            "ALTER TABLE t DROP COLUMN partition_no",
            "ALTER TABLE t ADD COLUMN c INT /* DROP PARTITION */",
            "TRUNCATE TABLE t",
            "DROP TABLE t",
        ] {
            assert_eq!(r(sql), None, "{sql}");
        }
    }

    #[test]
    fn row_changes_logged_as_statements_are_told_with_their_table() {
        let t = |db: Option<&str>, table: &str| TableRef {
            database: db.map(String::from),
            table: table.into(),
        };
        let dml = |sql| match classify(sql) {
            Statement::Dml { tables } => tables,
            other => panic!("{sql}: {other:?}"),
        };
        assert_eq!(dml("INSERT INTO t VALUES (1)"), vec![t(None, "t")]);
        assert_eq!(
            dml("insert ignore into `d`.`t` (a) values (1)"),
            vec![t(Some("d"), "t")]
        );
        assert_eq!(dml("REPLACE t SET a = 1"), vec![t(None, "t")]);
        assert_eq!(
            dml("UPDATE LOW_PRIORITY d.t SET a = 2 WHERE b"),
            vec![t(Some("d"), "t")]
        );
        assert_eq!(dml("DELETE FROM `t` WHERE a = 1"), vec![t(None, "t")]);
        assert_eq!(dml("DELETE FROM `db`.`mem`"), vec![t(Some("db"), "mem")]);
        assert_eq!(
            dml("LOAD DATA LOCAL INFILE 'x' INTO TABLE d.t"),
            vec![t(Some("d"), "t")]
        );
        // Several tables: none is sure.
        assert!(dml("UPDATE a JOIN b ON a.id = b.id SET a.x = 1").is_empty());
        assert!(dml("UPDATE a, b SET a.x = b.x").is_empty());
        assert!(dml("DELETE a, b FROM a JOIN b").is_empty());
        assert!(dml("DELETE FROM a USING a JOIN b").is_empty());
        // Not row changes.
        assert_eq!(classify("GRANT SELECT ON *.* TO u"), Statement::Other);
    }

    #[test]
    fn transaction_control() {
        assert_eq!(classify("BEGIN"), Statement::Transaction(TxControl::Begin));
        assert_eq!(
            classify("COMMIT"),
            Statement::Transaction(TxControl::Commit)
        );
        assert_eq!(
            classify("ROLLBACK"),
            Statement::Transaction(TxControl::Rollback)
        );
        assert_eq!(
            classify("ROLLBACK TO SAVEPOINT a"),
            Statement::Transaction(TxControl::Other)
        );
    }

    #[test]
    fn table_ddl() {
        assert_eq!(
            classify("ALTER TABLE `shop`.`orders` ADD COLUMN note TEXT"),
            Statement::Ddl {
                kind: "alter",
                tables: vec![t(Some("shop"), "orders")],
                renamed_to: vec![]
            }
        );
        assert_eq!(
            classify("/* comment */ create table if not exists t1(id int primary key)"),
            Statement::Ddl {
                kind: "create",
                tables: vec![t(None, "t1")],
                renamed_to: vec![]
            }
        );
        assert_eq!(
            classify("DROP TABLE IF EXISTS `a`, b.c /* generated by server */"),
            Statement::Ddl {
                kind: "drop",
                tables: vec![t(None, "a"), t(Some("b"), "c")],
                renamed_to: vec![]
            }
        );
        assert_eq!(
            classify("TRUNCATE TABLE x.`we.ird`"),
            Statement::Ddl {
                kind: "truncate",
                tables: vec![t(Some("x"), "we.ird")],
                renamed_to: vec![]
            }
        );
        assert_eq!(
            classify("truncate y"),
            Statement::Ddl {
                kind: "truncate",
                tables: vec![t(None, "y")],
                renamed_to: vec![]
            }
        );
        assert_eq!(
            classify("RENAME TABLE a TO b, d.c TO d.e"),
            Statement::Ddl {
                kind: "rename",
                tables: vec![t(None, "a"), t(Some("d"), "c")],
                renamed_to: vec![t(None, "b"), t(Some("d"), "e")]
            }
        );
        assert_eq!(
            classify("ALTER TABLE a RENAME TO b"),
            Statement::Ddl {
                kind: "rename",
                tables: vec![t(None, "a")],
                renamed_to: vec![t(None, "b")]
            }
        );
        assert_eq!(
            classify("ALTER TABLE a RENAME COLUMN x TO y"),
            Statement::Ddl {
                kind: "alter",
                tables: vec![t(None, "a")],
                renamed_to: vec![]
            }
        );
        assert_eq!(
            classify("CREATE OR REPLACE TABLE t (a int)"),
            Statement::Ddl {
                kind: "create",
                tables: vec![t(None, "t")],
                renamed_to: vec![]
            }
        );
    }

    #[test]
    fn databases_and_others() {
        assert_eq!(
            classify("CREATE DATABASE IF NOT EXISTS `shop`"),
            Statement::Database {
                kind: "create_database",
                name: "shop".into()
            }
        );
        assert_eq!(
            classify("DROP SCHEMA shop"),
            Statement::Database {
                kind: "drop_database",
                name: "shop".into()
            }
        );
        assert_eq!(classify("GRANT SELECT ON *.* TO u"), Statement::Other);
        assert_eq!(classify("FLUSH PRIVILEGES"), Statement::Other);
        assert_eq!(
            classify("CREATE UNIQUE INDEX i ON d.t (a)"),
            Statement::Ddl {
                kind: "alter",
                tables: vec![t(Some("d"), "t")],
                renamed_to: vec![]
            }
        );
        assert_eq!(
            classify("DROP INDEX `PRIMARY` ON t"),
            Statement::Ddl {
                kind: "alter",
                tables: vec![t(None, "t")],
                renamed_to: vec![]
            }
        );
    }
}
