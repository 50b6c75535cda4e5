//! What a MySQL `ALTER TABLE` statement says beyond the schema after it: which columns it
//! renames, and the default an added column gives the rows that were there before it.
//!
//! The schemas before and after an ALTER tell which columns went and came, not whether one
//! became the other, nor the value the existing rows took for a new column (MySQL fills them
//! with the column's default, which no binlog row event carries). The statement, as the source
//! logged it, says both for its own position, whatever happened to the table since.

use super::mysql::{qualified_at, tokens, Token};

/// The top-level clauses of an `ALTER TABLE t ...`: the tokens between commas outside
/// parentheses, after the table name. Empty for other statements.
fn clauses(sql: &str) -> Vec<Vec<Token>> {
    let t = tokens(sql);
    let mut i = 0;
    if !t.first().is_some_and(|x| x.is("ALTER")) {
        return Vec::new();
    }
    i += 1;
    while t
        .get(i)
        .is_some_and(|x| x.is("ONLINE") || x.is("OFFLINE") || x.is("IGNORE"))
    {
        i += 1;
    }
    if !t.get(i).is_some_and(|x| x.is("TABLE")) {
        return Vec::new();
    }
    i += 1;
    if t.get(i).is_some_and(|x| x.is("IF")) {
        i += 2; // IF EXISTS
    }
    // The table name, qualified or not.
    let Some((_, after)) = qualified_at(&t, i) else {
        return Vec::new();
    };
    i = after;
    let mut out = Vec::new();
    let mut cur = Vec::new();
    let mut depth = 0usize;
    for tok in &t[i.min(t.len())..] {
        match tok {
            Token::Punct('(') => depth += 1,
            Token::Punct(')') => depth = depth.saturating_sub(1),
            Token::Punct(',') if depth == 0 => {
                out.push(std::mem::take(&mut cur));
                continue;
            }
            Token::Punct(';') if depth == 0 => break,
            _ => {}
        }
        cur.push(tok.clone());
    }
    if !cur.is_empty() {
        out.push(cur);
    }
    out
}

/// What one clause of an ALTER changes, as far as the table's rows are concerned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Clause {
    /// Nothing a row holds: an index, a default for later rows, a comment, the engine, the
    /// table's options.
    Metadata,
    /// A column: added, dropped, redefined or renamed.
    Column,
    /// The primary key: added or dropped.
    Key,
    /// The stored values of every text column, converted (`CONVERT TO CHARACTER SET`), or
    /// something this reading does not know: rows may have changed.
    Rows,
}

/// Each clause of an `ALTER TABLE` (none for another statement), by what it changes.
pub fn clause_kinds(sql: &str) -> Vec<Clause> {
    clauses(sql).iter().map(|c| clause_kind(c)).collect()
}

fn clause_kind(c: &[Token]) -> Clause {
    let w = |i: usize| {
        c.get(i).map_or(String::new(), |t| match t {
            Token::Word(w) => w.to_ascii_uppercase(),
            Token::Punct(p) => p.to_string(),
            _ => String::new(),
        })
    };
    // `CONSTRAINT [name]` before a key or a check.
    let after_constraint = |i: usize| {
        if w(i) == "CONSTRAINT" {
            if matches!(
                w(i + 1).as_str(),
                "PRIMARY" | "UNIQUE" | "FOREIGN" | "CHECK"
            ) {
                i + 1
            } else {
                i + 2
            }
        } else {
            i
        }
    };
    match w(0).as_str() {
        "ADD" => {
            let i = after_constraint(1);
            match w(i).as_str() {
                "PRIMARY" => Clause::Key,
                "INDEX" | "KEY" | "UNIQUE" | "FULLTEXT" | "SPATIAL" | "FOREIGN" | "CHECK"
                | "PERIOD" | "SYSTEM" | "PARTITION" | "VECTOR" => Clause::Metadata,
                _ => Clause::Column,
            }
        }
        "DROP" => match w(after_constraint(1)).as_str() {
            "PRIMARY" => Clause::Key,
            "INDEX" | "KEY" | "FOREIGN" | "CHECK" | "CONSTRAINT" | "PARTITION" | "PERIOD"
            | "SYSTEM" => Clause::Metadata,
            _ => Clause::Column,
        },
        "MODIFY" | "CHANGE" => Clause::Column,
        // ALTER [COLUMN] c SET DEFAULT ... / DROP DEFAULT / [NOT] INVISIBLE (later rows only),
        // ALTER INDEX ... [NOT] IGNORED, ALTER CHECK ...
        "ALTER" => Clause::Metadata,
        "RENAME" => match w(1).as_str() {
            "COLUMN" => Clause::Column,
            _ => Clause::Metadata, // an index, a key, or the table (told apart elsewhere)
        },
        "CONVERT" => Clause::Rows,
        "ORDER" | "ENGINE" | "COMMENT" | "AUTO_INCREMENT" | "ALGORITHM" | "LOCK" | "FORCE"
        | "DISABLE" | "ENABLE" | "ROW_FORMAT" | "KEY_BLOCK_SIZE" | "DEFAULT" | "CHARACTER"
        | "CHARSET" | "COLLATE" | "PACK_KEYS" | "CHECKSUM" | "STATS_PERSISTENT"
        | "STATS_AUTO_RECALC" | "STATS_SAMPLE_PAGES" | "AVG_ROW_LENGTH" | "MAX_ROWS"
        | "MIN_ROWS" | "DELAY_KEY_WRITE" | "INSERT_METHOD" | "PAGE_CHECKSUM" | "TRANSACTIONAL"
        | "ENCRYPTED" | "ENCRYPTION_KEY_ID" | "IETF_QUOTES" | "SEQUENCE" | "WITH" | "WITHOUT"
        | "TABLESPACE" | "DISCARD" | "IMPORT" | "COALESCE" | "REORGANIZE" | "ANALYZE" | "CHECK"
        | "OPTIMIZE" | "REBUILD" | "REPAIR" | "REMOVE" | "TRUNCATE" | "EXCHANGE" | "UPGRADE"
        | "NOWAIT" | "WAIT" | "UNION" | "DATA" | "INDEX" | "STATS" | "PARTITION" => {
            Clause::Metadata
        }
        _ => Clause::Rows,
    }
}

/// Skip `IF EXISTS` / `IF NOT EXISTS` at `i`.
fn skip_if(c: &[Token], mut i: usize) -> usize {
    if c.get(i).is_some_and(|x| x.is("IF")) {
        i += 1;
        if c.get(i).is_some_and(|x| x.is("NOT")) {
            i += 1;
        }
        i += 1; // EXISTS
    }
    i
}

/// The columns an ALTER renames, old name to new: `RENAME COLUMN a TO b` and `CHANGE [COLUMN]
/// a b <definition>` with two different names.
pub fn renames(sql: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for c in clauses(sql) {
        let from_to = if c.first().is_some_and(|x| x.is("RENAME"))
            && c.get(1).is_some_and(|x| x.is("COLUMN"))
        {
            let i = skip_if(&c, 2);
            match (c.get(i).and_then(Token::name), c.get(i + 1), c.get(i + 2)) {
                (Some(a), Some(to), Some(b)) if to.is("TO") => b.name().map(|b| (a, b)),
                _ => None,
            }
        } else if c.first().is_some_and(|x| x.is("CHANGE")) {
            let mut i = 1;
            if c.get(i).is_some_and(|x| x.is("COLUMN")) {
                i += 1;
            }
            i = skip_if(&c, i);
            match (
                c.get(i).and_then(Token::name),
                c.get(i + 1).and_then(Token::name),
            ) {
                (Some(a), Some(b)) => Some((a, b)),
                _ => None,
            }
        } else {
            None
        };
        if let Some((a, b)) = from_to {
            if a != b {
                out.push((a.to_string(), b.to_string()));
            }
        }
    }
    out
}

/// The columns an ALTER drops by name: `DROP [COLUMN] [IF EXISTS] a` (not an index, key,
/// constraint or partition).
pub fn drops(sql: &str) -> Vec<String> {
    let mut out = Vec::new();
    for c in clauses(sql) {
        if !c.first().is_some_and(|x| x.is("DROP")) {
            continue;
        }
        let mut i = 1;
        let not_a_column = [
            "INDEX",
            "KEY",
            "PRIMARY",
            "FOREIGN",
            "CONSTRAINT",
            "CHECK",
            "PARTITION",
            "SYSTEM",
            "PERIOD",
            "DEFAULT",
        ];
        if c.get(i)
            .is_some_and(|x| not_a_column.iter().any(|k| x.is(k)))
        {
            continue;
        }
        if c.get(i).is_some_and(|x| x.is("COLUMN")) {
            i += 1;
        }
        i = skip_if(&c, i);
        if let Some(name) = c.get(i).and_then(Token::name) {
            out.push(name.to_string());
        }
    }
    out
}

/// Several statements of one table, in order (a capture behind the server publishes them as
/// one event): the renames they make, composed (`a` to `b` then `b` to `c`: `a` to `c`).
pub fn renames_in(statements: &[String]) -> Vec<(String, String)> {
    let mut chain: Vec<(String, String)> = Vec::new();
    for s in statements {
        for (from, to) in renames(s) {
            match chain.iter_mut().find(|(_, now)| *now == from) {
                Some(link) => link.1 = to,
                None => chain.push((from, to)),
            }
        }
    }
    chain.retain(|(a, b)| a != b);
    chain
}

/// The default the rows there took for `column` (its name after every statement), from the
/// last statement that added it, followed back through renames.
pub fn added_in(statements: &[String], column: &str) -> Option<Added> {
    let mut name = column.to_string();
    for s in statements.iter().rev() {
        if let Some(a) = added(s, &name) {
            return Some(a);
        }
        if let Some((from, _)) = renames(s).into_iter().find(|(_, to)| *to == name) {
            name = from;
        }
    }
    None
}

/// Whether some statement drops `column` by name.
pub fn drops_in(statements: &[String], column: &str) -> bool {
    statements
        .iter()
        .any(|s| drops(s).iter().any(|d| d.eq_ignore_ascii_case(column)))
}

/// Whether the ALTER redefines `column` (its name after the statement): `MODIFY [COLUMN] [IF
/// EXISTS] column <definition>` or `CHANGE [COLUMN] [IF EXISTS] a column <definition>`.
pub fn modifies(sql: &str, column: &str) -> bool {
    clauses(sql).iter().any(|c| {
        let change = c.first().is_some_and(|x| x.is("CHANGE"));
        if !change && !c.first().is_some_and(|x| x.is("MODIFY")) {
            return false;
        }
        let mut i = 1;
        if c.get(i).is_some_and(|x| x.is("COLUMN")) {
            i += 1;
        }
        i = skip_if(c, i);
        if change {
            i += 1; // the old name
        }
        c.get(i)
            .and_then(Token::name)
            .is_some_and(|n| n.eq_ignore_ascii_case(column))
    })
}

/// Whether some statement redefines `column` ([`modifies`]).
pub fn modifies_in(statements: &[String], column: &str) -> bool {
    statements.iter().any(|s| modifies(s, column))
}

/// The type an ALTER declares for `column` (its name after the statement) in `ADD [COLUMN]`
/// (one or a parenthesised list), `MODIFY [COLUMN]` or `CHANGE [COLUMN] old`: its first word,
/// upper-cased (`INET4`, `VARCHAR`); `None` where the statement defines no such column.
pub fn declared_type(sql: &str, column: &str) -> Option<String> {
    let word = |t: Option<&Token>| match t {
        Some(Token::Word(w)) => Some(w.to_ascii_uppercase()),
        _ => None,
    };
    let mut found = None;
    for c in clauses(sql) {
        let first = word(c.first()).unwrap_or_default();
        if !matches!(first.as_str(), "ADD" | "MODIFY" | "CHANGE") {
            continue;
        }
        let mut i = 1;
        if c.get(i).is_some_and(|x| x.is("COLUMN")) {
            i += 1;
        }
        i = skip_if(&c, i);
        let mut definitions: Vec<&[Token]> = Vec::new();
        if first == "ADD" && matches!(c.get(i), Some(Token::Punct('('))) {
            let (mut depth, mut start) = (0usize, i + 1);
            for (k, t) in c.iter().enumerate().skip(i + 1) {
                match t {
                    Token::Punct('(') => depth += 1,
                    Token::Punct(')') if depth == 0 => {
                        definitions.push(&c[start..k]);
                        break;
                    }
                    Token::Punct(')') => depth -= 1,
                    Token::Punct(',') if depth == 0 => {
                        definitions.push(&c[start..k]);
                        start = k + 1;
                    }
                    _ => {}
                }
            }
        } else {
            if first == "CHANGE" {
                i += 1; // the old name
            }
            definitions.push(c.get(i..).unwrap_or_default());
        }
        for d in definitions {
            if d.first()
                .and_then(Token::name)
                .is_some_and(|n| n.eq_ignore_ascii_case(column))
            {
                found = word(d.get(1)).or(found);
            }
        }
    }
    found
}

/// The type the last of `statements` that defines `column` declares ([`declared_type`]).
pub fn declared_type_in(statements: &[String], column: &str) -> Option<String> {
    statements
        .iter()
        .rev()
        .find_map(|s| declared_type(s, column))
}

/// What the rows already in a table took for a column an ALTER added.
#[derive(Debug, Clone, PartialEq)]
pub enum Added {
    /// No DEFAULT clause: NULL for a nullable column, else the type's implicit default.
    NoDefault,
    /// `DEFAULT NULL`.
    Null,
    /// A constant: the literal's text (a string's unescaped value, or a number).
    Constant(String),
    /// Anything else (`CURRENT_TIMESTAMP`, `(expr)`, `b'1'` ...): the existing rows' value is
    /// not known from the statement alone.
    Expression(String),
    /// A generated column (`AS (expr)`, `GENERATED ALWAYS AS (expr)`, VIRTUAL, STORED or
    /// PERSISTENT): each row's value is computed from its other columns.
    Generated(String),
}

/// The default the statement gives column `column` it adds (`ADD [COLUMN] [IF NOT EXISTS]
/// column <definition>`, or one of `ADD [COLUMN] (a ..., b ...)`); `None` if it adds no such
/// column.
pub fn added(sql: &str, column: &str) -> Option<Added> {
    for c in clauses(sql) {
        if !c.first().is_some_and(|x| x.is("ADD")) {
            continue;
        }
        let mut i = 1;
        if c.get(i).is_some_and(|x| x.is("COLUMN")) {
            i += 1;
        }
        i = skip_if(&c, i);
        // ADD (a INT, b INT): split the parenthesised list.
        let definitions: Vec<&[Token]> = if matches!(c.get(i), Some(Token::Punct('('))) {
            let inner = &c[i + 1..c.len().saturating_sub(1).max(i + 1)];
            let mut parts = Vec::new();
            let (mut depth, mut start) = (0usize, 0usize);
            for (k, t) in inner.iter().enumerate() {
                match t {
                    Token::Punct('(') => depth += 1,
                    Token::Punct(')') => depth = depth.saturating_sub(1),
                    Token::Punct(',') if depth == 0 => {
                        parts.push(&inner[start..k]);
                        start = k + 1;
                    }
                    _ => {}
                }
            }
            parts.push(&inner[start..]);
            parts
        } else {
            vec![&c[i..]]
        };
        for d in definitions {
            let Some(name) = d.first().and_then(Token::name) else {
                continue;
            };
            if !name.eq_ignore_ascii_case(column) {
                continue;
            }
            // `AS (` at the top level: a generated column, whatever else it says.
            let mut depth = 0usize;
            for (k, t) in d.iter().enumerate() {
                match t {
                    Token::Punct('(') => depth += 1,
                    Token::Punct(')') => depth = depth.saturating_sub(1),
                    t if depth == 0 && t.is("AS") && d.get(k + 1).is_some_and(|n| n.punct('(')) => {
                        return Some(Added::Generated(text_of(&d[k..])));
                    }
                    _ => {}
                }
            }
            // A word `DEFAULT` (not in a nested parenthesis: an ENUM member is a string).
            let mut depth = 0usize;
            for (k, t) in d.iter().enumerate() {
                match t {
                    Token::Punct('(') => depth += 1,
                    Token::Punct(')') => depth = depth.saturating_sub(1),
                    t if depth == 0 && t.is("DEFAULT") => return Some(default_at(&d[k + 1..])),
                    _ => {}
                }
            }
            return Some(Added::NoDefault);
        }
    }
    None
}

/// The start of `tokens` as text, for a message.
fn text_of(tokens: &[Token]) -> String {
    tokens
        .iter()
        .take(8)
        .map(|t| match t {
            Token::Word(w) | Token::Name(w) => w.clone(),
            Token::Str(s) => format!("'{s}'"),
            Token::Punct(p) => p.to_string(),
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// The DEFAULT value starting at `rest`.
fn default_at(rest: &[Token]) -> Added {
    let text = || text_of(&rest[..rest.len().min(4)]);
    match rest {
        [Token::Word(w), ..] if w.eq_ignore_ascii_case("NULL") => Added::Null,
        // A string, not followed by more of an expression ('a' 'b' concatenates, COLLATE ...).
        [Token::Str(s), next @ ..] if ends_definition(next) => Added::Constant(s.clone()),
        // A number, signed or not.
        [Token::Punct(sign @ ('-' | '+')), Token::Word(n), next @ ..]
            if is_number(n) && ends_definition(next) =>
        {
            Added::Constant(if *sign == '-' {
                format!("-{n}")
            } else {
                n.clone()
            })
        }
        [Token::Word(n), next @ ..] if is_number(n) && ends_definition(next) => {
            Added::Constant(n.clone())
        }
        _ => Added::Expression(text()),
    }
}

/// Whether the tokens after a default value go on with the column definition (or end it),
/// rather than with the value itself.
fn ends_definition(next: &[Token]) -> bool {
    match next.first() {
        None => true,
        Some(Token::Word(w)) => matches!(
            w.to_ascii_uppercase().as_str(),
            "NOT"
                | "NULL"
                | "COMMENT"
                | "AFTER"
                | "FIRST"
                | "UNIQUE"
                | "PRIMARY"
                | "KEY"
                | "CHECK"
                | "INVISIBLE"
                | "VISIBLE"
                | "REFERENCES"
                | "CONSTRAINT"
                | "COLLATE"
                | "CHARACTER"
                | "CHARSET"
        ),
        Some(_) => false,
    }
}

fn is_number(w: &str) -> bool {
    !w.is_empty()
        && w.chars()
            .next()
            .is_some_and(|c| c.is_ascii_digit() || c == '.')
        && w.parse::<f64>().is_ok()
        && !w.to_ascii_lowercase().contains("inf")
        && !w.to_ascii_lowercase().contains("nan")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modify_and_change_name_the_column_they_redefine() {
        assert!(modifies("ALTER TABLE t MODIFY COLUMN `a` BIGINT NULL", "a"));
        assert!(modifies("alter table t modify a bigint", "A"));
        assert!(modifies("ALTER TABLE t MODIFY COLUMN IF EXISTS a INT", "a"));
        assert!(modifies("ALTER TABLE t CHANGE COLUMN a b BIGINT", "b"));
        assert!(!modifies("ALTER TABLE t CHANGE COLUMN a b BIGINT", "a"));
        assert!(!modifies(
            "ALTER TABLE t ADD COLUMN a INT, MODIFY b INT",
            "a"
        ));
        assert!(modifies(
            "ALTER TABLE t ADD COLUMN a INT, MODIFY b INT",
            "b"
        ));
        assert!(!modifies("ALTER TABLE t DROP COLUMN a", "a"));
        assert!(modifies_in(
            &[
                "ALTER TABLE t ADD c INT".into(),
                "ALTER TABLE t MODIFY a INT".into()
            ],
            "a"
        ));
    }

    #[test]
    fn renamed_columns_are_read_from_the_statement() {
        assert_eq!(
            renames("ALTER TABLE t RENAME COLUMN score TO points"),
            vec![("score".into(), "points".into())]
        );
        assert_eq!(
            renames(
                "alter table `db`.`t` change `a` `b` bigint not null, CHANGE COLUMN c c INT, \
                 rename column if exists `x y` to z"
            ),
            vec![("a".into(), "b".into()), ("x y".into(), "z".into())]
        );
        assert_eq!(
            renames("ALTER TABLE t ADD COLUMN rename_me INT COMMENT 'RENAME COLUMN a TO b'"),
            vec![]
        );
        assert_eq!(renames("ALTER TABLE t RENAME TO u"), vec![]);
        assert_eq!(
            renames("ALTER TABLE db.`t` RENAME COLUMN a TO b"),
            vec![("a".into(), "b".into())]
        );
        assert_eq!(renames("RENAME TABLE a TO b"), vec![]);
    }

    #[test]
    fn several_statements_compose() {
        let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
        let stmts = s(&[
            "ALTER TABLE t ADD COLUMN c INT NOT NULL DEFAULT 5",
            "ALTER TABLE t RENAME COLUMN c TO d, RENAME COLUMN x TO y",
            "ALTER TABLE t CHANGE d e INT NOT NULL, DROP COLUMN z, DROP INDEX i, DROP PRIMARY KEY",
        ]);
        assert_eq!(
            renames_in(&stmts),
            vec![("c".to_string(), "e".to_string()), ("x".into(), "y".into())]
        );
        assert_eq!(added_in(&stmts, "e"), Some(Added::Constant("5".into())));
        assert_eq!(added_in(&stmts, "y"), None);
        assert!(drops_in(&stmts, "z"));
        assert!(!drops_in(&stmts, "i") && !drops_in(&stmts, "x"));
        assert_eq!(
            drops("ALTER TABLE t DROP IF EXISTS `a b`, DROP COLUMN c, DROP CONSTRAINT k"),
            vec!["a b".to_string(), "c".to_string()]
        );
        // Added, dropped and added again: the last one's default.
        let again = s(&[
            "ALTER TABLE t ADD c INT DEFAULT 1",
            "ALTER TABLE t DROP c",
            "ALTER TABLE t ADD c INT DEFAULT 2",
        ]);
        assert_eq!(added_in(&again, "c"), Some(Added::Constant("2".into())));
    }

    #[test]
    fn an_added_columns_default_is_read_from_the_statement() {
        let sql = "ALTER TABLE t ADD COLUMN email VARCHAR(50) DEFAULT 'none@x', \
                   ADD n INT NOT NULL DEFAULT -5 COMMENT 'x', ADD COLUMN m INT, \
                   ADD COLUMN IF NOT EXISTS d DECIMAL(5,2) DEFAULT '1.50' NOT NULL, \
                   ADD ts TIMESTAMP NOT NULL DEFAULT CURRENT_TIMESTAMP, \
                   ADD e ENUM('a','DEFAULT','c') NOT NULL, ADD q VARCHAR(5) DEFAULT NULL, \
                   ADD `it's` VARCHAR(9) DEFAULT 'it''s \\'ok\\'', ADD f DOUBLE DEFAULT 1.5e3, \
                   ADD x INT DEFAULT (1 + 1), ADD s VARCHAR(9) DEFAULT 'a' 'b'";
        assert_eq!(added(sql, "email"), Some(Added::Constant("none@x".into())));
        assert_eq!(added(sql, "n"), Some(Added::Constant("-5".into())));
        assert_eq!(added(sql, "m"), Some(Added::NoDefault));
        assert_eq!(added(sql, "d"), Some(Added::Constant("1.50".into())));
        assert!(
            matches!(added(sql, "ts"), Some(Added::Expression(e)) if e.contains("CURRENT_TIMESTAMP"))
        );
        assert_eq!(added(sql, "e"), Some(Added::NoDefault));
        assert_eq!(added(sql, "q"), Some(Added::Null));
        assert_eq!(
            added(sql, "it's"),
            Some(Added::Constant("it's 'ok'".into()))
        );
        assert_eq!(added(sql, "f"), Some(Added::Constant("1.5e3".into())));
        assert!(matches!(added(sql, "x"), Some(Added::Expression(_))));
        assert!(matches!(added(sql, "s"), Some(Added::Expression(_))));
        assert_eq!(added(sql, "nope"), None);
        let list = "ALTER TABLE db.t ADD COLUMN (a INT DEFAULT 1, b VARCHAR(3) DEFAULT 'x,y')";
        assert_eq!(added(list, "a"), Some(Added::Constant("1".into())));
        assert_eq!(added(list, "b"), Some(Added::Constant("x,y".into())));
        // Other clauses are not additions.
        assert_eq!(
            added("ALTER TABLE t ADD INDEX email (email)", "email"),
            None
        );
        assert_eq!(
            added("ALTER TABLE t MODIFY email VARCHAR(9) DEFAULT 'a'", "email"),
            None
        );
    }

    #[test]
    fn the_type_an_alter_declares_for_a_column() {
        let sql = "ALTER TABLE t ADD COLUMN `a` INET4 NOT NULL DEFAULT '1.2.3.4' AFTER id, \
                   MODIFY COLUMN b inet6 NULL, CHANGE c `d` UUID, ADD (e JSON, f INT(11)), \
                   ADD INDEX i (a), DROP COLUMN g";
        assert_eq!(declared_type(sql, "a").as_deref(), Some("INET4"));
        assert_eq!(declared_type(sql, "B").as_deref(), Some("INET6"));
        assert_eq!(declared_type(sql, "d").as_deref(), Some("UUID"));
        assert_eq!(declared_type(sql, "c"), None, "renamed away");
        assert_eq!(declared_type(sql, "e").as_deref(), Some("JSON"));
        assert_eq!(declared_type(sql, "f").as_deref(), Some("INT"));
        assert_eq!(declared_type(sql, "g"), None);
        assert_eq!(declared_type("CREATE TABLE t (a INET4)", "a"), None);
        let later = vec![
            sql.to_string(),
            "ALTER TABLE t MODIFY a BINARY(4)".to_string(),
        ];
        assert_eq!(declared_type_in(&later, "a").as_deref(), Some("BINARY"));
        assert_eq!(declared_type_in(&later, "b").as_deref(), Some("INET6"));
    }
}
