//! The tables as a scenario knows them, and the statements that write them.

use mysql_async::prelude::Queryable;

use super::values::{pick, GENERATED, TYPES};
use crate::Rng;

#[derive(Clone, Debug)]
pub struct Col {
    pub name: String,
    /// Index into [`TYPES`]; `None` for a generated column.
    pub ty: Option<usize>,
    pub nullable: bool,
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Key {
    Id,
    IdK,
    None,
}

/// A table as the test knows it: `id INT NOT NULL`, `k INT NOT NULL` (never changed), then
/// `cols`. Rows are unique by (id, k) whatever the key, so a key can always be given back.
#[derive(Clone, Debug)]
pub struct Table {
    pub name: String,
    pub cols: Vec<Col>,
    pub key: Key,
    /// Partitioned by range of `id` (partitions p0, p1, p2: some may be dropped since).
    pub partitioned: bool,
}

impl Table {
    pub fn writable(&self) -> Vec<&Col> {
        self.cols.iter().filter(|c| c.ty.is_some()).collect()
    }
}

/// A new column definition: type, NULL or not, and maybe a DEFAULT in any form (or generated).
pub fn definition(rng: &mut Rng, name: String, generated: bool) -> (Col, String) {
    if generated {
        let (ty, expr) = *pick(rng, GENERATED);
        let kind = if rng.chance(50) {
            "VIRTUAL"
        } else {
            "PERSISTENT"
        };
        let col = Col {
            name,
            ty: None,
            nullable: true,
        };
        return (col, format!("{ty} AS ({expr}) {kind}"));
    }
    let i = rng.below(TYPES.len() as u64) as usize;
    let ty = &TYPES[i];
    let nullable = rng.chance(50);
    let mut sql = ty.sql.to_string();
    sql.push_str(if nullable { " NULL" } else { " NOT NULL" });
    let roll = rng.below(100);
    if roll < 55 {
        sql.push_str(" DEFAULT ");
        sql.push_str(pick::<&str>(rng, ty.defaults));
    } else if roll < 65 && nullable {
        sql.push_str(" DEFAULT NULL");
    } else if roll < 75 {
        sql.push_str(" DEFAULT ");
        sql.push_str(&(ty.value)(rng));
    }
    (
        Col {
            name,
            ty: Some(i),
            nullable,
        },
        sql,
    )
}

pub fn value(rng: &mut Rng, c: &Col) -> String {
    if c.nullable && rng.chance(15) {
        return "NULL".into();
    }
    (TYPES[c.ty.expect("a written column")].value)(rng)
}

/// The statements that write row (id, k): an upsert where a key makes one, else a delete of
/// the pair and an insert (the rows stay unique by (id, k)).
pub fn upsert(rng: &mut Rng, db: &str, t: &Table) -> Vec<String> {
    let id = rng.below(40);
    let k = rng.below(2);
    upsert_row(rng, db, t, id, k)
}

/// [`upsert`] of row (`id`, `k`).
pub fn upsert_row(rng: &mut Rng, db: &str, t: &Table, id: u64, k: u64) -> Vec<String> {
    let cols = t.writable();
    let mut names = vec!["`id`".to_string(), "`k`".to_string()];
    let mut values = vec![id.to_string(), k.to_string()];
    for c in &cols {
        names.push(format!("`{}`", c.name));
        values.push(value(rng, c));
    }
    let insert = format!(
        "INSERT INTO `{db}`.`{}` ({}) VALUES ({})",
        t.name,
        names.join(", "),
        values.join(", ")
    );
    match t.key {
        Key::None => vec![
            format!(
                "DELETE FROM `{db}`.`{}` WHERE id = {id} AND k = {k}",
                t.name
            ),
            insert,
        ],
        Key::Id | Key::IdK => {
            let updates: Vec<String> = names[1..]
                .iter()
                .map(|c| format!("{c} = VALUES({c})"))
                .collect();
            vec![format!(
                "{insert} ON DUPLICATE KEY UPDATE {}",
                updates.join(", ")
            )]
        }
    }
}

/// Whether the server takes CREATE TABLE `sql` of `db`.`table` (a DEFAULT drawn may be one
/// strict mode refuses): tried as a temporary table, which a row-format binlog does not log.
pub async fn accepted(my: &mut mysql_async::Conn, sql: &str, db: &str, table: &str) -> bool {
    let probe = sql.replacen(
        &format!("CREATE TABLE `{db}`.`{table}`"),
        &format!("CREATE TEMPORARY TABLE `{db}`.`probe`"),
        1,
    );
    assert_ne!(probe, sql);
    let ok = my.query_drop(&probe).await.is_ok();
    if ok {
        my.query_drop(format!("DROP TEMPORARY TABLE `{db}`.`probe`"))
            .await
            .unwrap();
    }
    ok
}

/// A new table `name` of database `db`: `id`, `k`, one to three columns drawn, keyed by `(id)`
/// or `(id, k)`; the model and its CREATE TABLE.
pub fn create_table(rng: &mut Rng, db: &str, name: String, next_col: &mut u32) -> (Table, String) {
    let mut cols = Vec::new();
    let mut defs = Vec::new();
    for _ in 0..1 + rng.below(3) {
        *next_col += 1;
        let generated = rng.chance(10);
        let (c, def) = definition(rng, format!("c{next_col}"), generated);
        defs.push(format!("`{}` {def}", c.name));
        cols.push(c);
    }
    let key = if rng.chance(80) { Key::Id } else { Key::IdK };
    let pk = if key == Key::Id { "id" } else { "id, k" };
    let sql = format!(
        "CREATE TABLE `{db}`.`{name}` (id INT NOT NULL, k INT NOT NULL DEFAULT 0, {}, \
         PRIMARY KEY ({pk}))",
        defs.join(", ")
    );
    let t = Table {
        name,
        cols,
        key,
        partitioned: false,
    };
    (t, sql)
}

/// [`create_table`] until the server takes the statement ([`accepted`]).
pub async fn new_table(
    my: &mut mysql_async::Conn,
    rng: &mut Rng,
    db: &str,
    name: String,
    next_col: &mut u32,
) -> (Table, String) {
    loop {
        let (t, sql) = create_table(rng, db, name.clone(), next_col);
        if accepted(my, &sql, db, &t.name).await {
            return (t, sql);
        }
    }
}
