//! A storm of schema changes of every class, mixed with writes, on several tables (MariaDB ->
//! capture-mysql -> Kafka -> apply-clickhouse, on whichever server `SLUICE_CLICKHOUSE_URL`
//! names), with the capture and the apply stage stopped (SIGTERM or SIGKILL), left behind and
//! restarted at random points. Drawn: every MySQL type this stage maps as the type of a column
//! added or modified, its DEFAULT in every form a statement can give it (literals MariaDB
//! converts, expressions, `CURRENT_TIMESTAMP`), NOT NULL without one, generated columns
//! (VIRTUAL and PERSISTENT), narrowing MODIFYs under a permissive `sql_mode`, renames, drops,
//! several clauses in one ALTER, primary key changes (other columns, none, back), TRUNCATE, DROP
//! then CREATE, RENAME TABLE swaps, `CREATE TABLE ... LIKE` copies, and partitions (a table
//! partitioned by range, partitions truncated, dropped or exchanged with a new table,
//! partitioning removed).
//!
//! At the end `sluice verify` compares every table cell for cell: each one is equal to its
//! source (every source column in the target), or stopped for a reason on the list of the
//! impossible in docs/apply-clickhouse.md (*What stops a table*), read from that file; no other
//! event is dead-lettered.
//!
//! Seeded: `SLUICE_TEST_SEED=<n>` replays a run (the seed is printed at the start, and in
//! every failure). `SLUICE_TEST_STEPS` sets the number of steps (default 100).

use std::collections::BTreeMap;
use std::time::Duration;

use mysql_async::prelude::Queryable;
use sluice_tests::capture::{binlog_end, clickhouse_tsv, dead_letters, verify, CaptureProcess};
use sluice_tests::{clickhouse_url, mysql_url, unique, Rng};

/// A column type drawn: its SQL, a value of it, and the DEFAULTs a statement may give it.
struct Ty {
    sql: &'static str,
    value: fn(&mut Rng) -> String,
    defaults: &'static [&'static str],
}

fn pick<'a, T>(rng: &mut Rng, items: &'a [T]) -> &'a T {
    &items[rng.below(items.len() as u64) as usize]
}

fn signed(rng: &mut Rng, below: u64) -> i64 {
    rng.below(2 * below) as i64 - below as i64
}

fn text(rng: &mut Rng, max: u64) -> String {
    const PIECES: &[&str] = &[
        "a", "b", "Z", " ", "é", "日", "\\\\", "%", "''", "_", "0", "x y",
    ];
    let n = rng.below(max + 1);
    let mut s = String::new();
    let mut chars = 0;
    while chars < n {
        let p = *pick(rng, PIECES);
        let len = if p == "\\\\" || p == "''" {
            1
        } else {
            p.chars().count() as u64
        };
        if chars + len > max {
            break;
        }
        s.push_str(p);
        chars += len;
    }
    format!("'{s}'")
}

fn bytes(rng: &mut Rng, max: u64) -> String {
    let n = rng.below(max + 1);
    let hex: String = (0..n).map(|_| format!("{:02x}", rng.below(256))).collect();
    if hex.is_empty() {
        "''".into()
    } else {
        format!("X'{hex}'")
    }
}

fn date(rng: &mut Rng) -> String {
    if rng.chance(3) {
        return "'0000-00-00'".into();
    }
    // Years every ClickHouse server's Date and DateTime hold (a value outside stops its table,
    // tested with the types).
    format!(
        "'{:04}-{:02}-{:02}'",
        1971 + rng.below(130),
        1 + rng.below(12),
        1 + rng.below(28)
    )
}

/// `H:MM:SS` with `hours` below the bound, and `fsp` fractional digits.
fn hms(rng: &mut Rng, hours: u64, fsp: usize) -> String {
    let mut s = format!(
        "{:02}:{:02}:{:02}",
        rng.below(hours),
        rng.below(60),
        rng.below(60)
    );
    if fsp > 0 {
        let f = format!("{:06}", rng.below(1_000_000));
        s.push('.');
        s.push_str(&f[..fsp]);
    }
    s
}

fn clock(rng: &mut Rng, fsp: usize) -> String {
    hms(rng, 24, fsp)
}

fn datetime(rng: &mut Rng, fsp: usize, first_year: u64, years: u64) -> String {
    format!(
        "'{:04}-{:02}-{:02} {}'",
        first_year + rng.below(years),
        1 + rng.below(12),
        1 + rng.below(28),
        clock(rng, fsp)
    )
}

fn time(rng: &mut Rng, fsp: usize) -> String {
    let sign = if rng.chance(30) { "-" } else { "" };
    format!("'{sign}{}'", hms(rng, 839, fsp))
}

const TYPES: &[Ty] = &[
    Ty {
        sql: "TINYINT",
        value: |r| signed(r, 128).to_string(),
        defaults: &["5", "'7'", "2.7", "-3", "TRUE", "(id % 100)"],
    },
    Ty {
        sql: "SMALLINT UNSIGNED",
        value: |r| r.below(65536).to_string(),
        defaults: &["65535", "'12'", "1e2", "(id + 1)"],
    },
    Ty {
        sql: "INT",
        value: |r| signed(r, 2_000_000_000).to_string(),
        defaults: &["2.7", "'-4'", "0", "(id * 3)", "-2147483648"],
    },
    Ty {
        sql: "BIGINT",
        value: |r| (r.next() as i64 / 3).to_string(),
        defaults: &["9007199254740993", "'-1'", "(id - 7)"],
    },
    Ty {
        sql: "BIGINT UNSIGNED",
        value: |r| r.next().to_string(),
        defaults: &["18446744073709551615", "'3'"],
    },
    Ty {
        sql: "DECIMAL(6,2)",
        value: |r| format!("{}.{:02}", signed(r, 10_000), r.below(100)),
        defaults: &["1.555", "'3.1'", "-0.005", "12", "(id / 3)"],
    },
    Ty {
        sql: "DECIMAL(25,3)",
        value: |r| format!("{}.{:03}", signed(r, 1_000_000_000_000_000), r.below(1000)),
        defaults: &["12.5", "'1e3'", "-99999999999999999999.999"],
    },
    Ty {
        sql: "FLOAT",
        value: |r| format!("{}", signed(r, 1_000_000) as f64 / 64.0),
        defaults: &["1.5", "'0.1'", "-3e10"],
    },
    Ty {
        sql: "DOUBLE",
        value: |r| format!("{:e}", signed(r, 1 << 52) as f64 * 1e-7),
        defaults: &["2.5e300", "'-0.25'", "(id / 7)"],
    },
    Ty {
        sql: "BIT(5)",
        value: |r| format!("b'{:b}'", r.below(32)),
        defaults: &["b'101'", "5"],
    },
    Ty {
        sql: "CHAR(5)",
        value: |r| text(r, 5),
        defaults: &["'ab  '", "'x'", "''", "7"],
    },
    Ty {
        sql: "VARCHAR(20)",
        value: |r| text(r, 20),
        defaults: &[
            r"'a\%b'",
            r"'a\bc'",
            "'it''s'",
            "'é'",
            "(CONCAT('d', id))",
            "12.50",
        ],
    },
    Ty {
        sql: "TEXT",
        value: |r| text(r, 60),
        defaults: &["'t'", "(REPEAT('x', id % 5))"],
    },
    Ty {
        sql: "BINARY(4)",
        value: |r| bytes(r, 4),
        defaults: &["'ab'", "0x6162", "''"],
    },
    Ty {
        sql: "VARBINARY(8)",
        value: |r| bytes(r, 8),
        defaults: &["'xyz'", "X'00ff'"],
    },
    Ty {
        sql: "BLOB",
        value: |r| bytes(r, 20),
        defaults: &["'b'"],
    },
    Ty {
        sql: "DATE",
        value: date,
        defaults: &[
            "'20240102'",
            "'2024-1-2'",
            "20240102",
            "(CURRENT_DATE)",
            "'0000-00-00'",
        ],
    },
    Ty {
        sql: "TIME",
        value: |r| time(r, 0),
        defaults: &["'10:00'", "'1 02:03'", "100", "'-01:00:00'", "'838:59:59'"],
    },
    Ty {
        sql: "TIME(3)",
        value: |r| time(r, 3),
        defaults: &["'10:00:00.5'", "'-00:00:01.25'", "'12:34:56.7891'"],
    },
    Ty {
        sql: "DATETIME",
        value: |r| datetime(r, 0, 1971, 130),
        defaults: &[
            "'2024-01-02 03:04:05'",
            "'20240102030405'",
            "CURRENT_TIMESTAMP",
        ],
    },
    Ty {
        sql: "DATETIME(6)",
        value: |r| datetime(r, 6, 1971, 130),
        defaults: &[
            "'2024-01-02 03:04:05.5'",
            "CURRENT_TIMESTAMP(6)",
            "'2024-01-02'",
        ],
    },
    Ty {
        sql: "TIMESTAMP(3)",
        value: |r| datetime(r, 3, 1971, 60),
        defaults: &["'2024-01-02 03:04:05.123'", "CURRENT_TIMESTAMP(3)"],
    },
    Ty {
        sql: "YEAR",
        value: |r| {
            if r.chance(5) {
                "0".into()
            } else {
                (1901 + r.below(255)).to_string()
            }
        },
        defaults: &["99", "'5'", "2024", "0"],
    },
    Ty {
        sql: "ENUM('low','mid','high')",
        value: |r| pick(r, &["'low'", "'mid'", "'high'"]).to_string(),
        defaults: &["'MID'", "'high'", "2"],
    },
    Ty {
        sql: "SET('r','g','b')",
        value: |r| pick(r, &["''", "'r'", "'g,r'", "'b,g,r'", "'b'"]).to_string(),
        defaults: &["'g,r'", "'b'", "3", "''"],
    },
    Ty {
        sql: "JSON",
        value: |r| format!("'{{\"a\": {}, \"b\": [true, null, \"s\"]}}'", r.below(1000)),
        defaults: &["'{\"a\": 1}'", "'[]'"],
    },
    Ty {
        sql: "UUID",
        value: |r| {
            // RFC 4122 (MariaDB refuses other versions and variants): version 4, variant 10.
            let h = format!("{:016x}{:016x}", r.next(), r.next());
            format!(
                "'{}-{}-4{}-{:x}{}-{}'",
                &h[0..8],
                &h[8..12],
                &h[13..16],
                8 + r.below(4),
                &h[17..20],
                &h[20..32]
            )
        },
        defaults: &["'6ccd780c-baba-1026-9564-5b8c656024db'"],
    },
    Ty {
        sql: "INET6",
        value: |r| {
            if r.chance(30) {
                format!(
                    "'::ffff:{}.{}.{}.{}'",
                    r.below(256),
                    r.below(256),
                    r.below(256),
                    r.below(256)
                )
            } else {
                format!(
                    "'{:x}::{:x}:{:x}'",
                    r.below(65536),
                    r.below(65536),
                    r.below(65536)
                )
            }
        },
        defaults: &["'::1'", "'::ffff:1.2.3.4'"],
    },
    Ty {
        sql: "INET4",
        value: |r| {
            format!(
                "'{}.{}.{}.{}'",
                r.below(256),
                r.below(256),
                r.below(256),
                r.below(256)
            )
        },
        defaults: &["'10.0.0.1'"],
    },
    Ty {
        sql: "BOOLEAN",
        value: |r| pick(r, &["TRUE", "FALSE", "1", "0"]).to_string(),
        defaults: &["TRUE", "FALSE", "1"],
    },
];

/// The generated columns drawn: type and expression (of the fixed columns only, which no
/// statement drops).
const GENERATED: &[(&str, &str)] = &[
    ("INT", "id * 2"),
    ("VARCHAR(40)", "CONCAT('g', id, '-', k)"),
    ("BIGINT", "id * k - 5"),
    ("DOUBLE", "id / 7"),
];

#[derive(Clone, Debug)]
struct Col {
    name: String,
    /// Index into [`TYPES`]; `None` for a generated column.
    ty: Option<usize>,
    nullable: bool,
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Key {
    Id,
    IdK,
    None,
}

/// A table as the test knows it: `id INT NOT NULL`, `k INT NOT NULL` (never changed), then
/// `cols`. Rows are unique by (id, k) whatever the key, so a key can always be given back.
#[derive(Clone, Debug)]
struct Table {
    name: String,
    cols: Vec<Col>,
    key: Key,
    /// Partitioned by range of `id` (partitions p0, p1, p2: some may be dropped since).
    partitioned: bool,
}

impl Table {
    fn writable(&self) -> Vec<&Col> {
        self.cols.iter().filter(|c| c.ty.is_some()).collect()
    }
}

/// A new column definition: type, NULL or not, and maybe a DEFAULT in any form (or generated).
fn definition(rng: &mut Rng, name: String, generated: bool) -> (Col, String) {
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

fn value(rng: &mut Rng, c: &Col) -> String {
    if c.nullable && rng.chance(15) {
        return "NULL".into();
    }
    (TYPES[c.ty.expect("a written column")].value)(rng)
}

/// The statements that write row (id, k): an upsert where a key makes one, else a delete of
/// the pair and an insert (the rows stay unique by (id, k)).
fn upsert(rng: &mut Rng, db: &str, t: &Table) -> Vec<String> {
    let id = rng.below(40);
    let k = rng.below(2);
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

/// A stage stopped now: SIGTERM or SIGKILL.
/// Whether the server takes CREATE TABLE `sql` of `db`.`table` (a DEFAULT drawn may be one
/// strict mode refuses): tried as a temporary table, which a row-format binlog does not log.
async fn accepted(my: &mut mysql_async::Conn, sql: &str, db: &str, table: &str) -> bool {
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

fn halt(p: &mut CaptureProcess, rng: &mut Rng) -> &'static str {
    if rng.chance(50) {
        // Its log is kept for a failure's message, with the next run's.
        let (_, log) = p.stop();
        p.keep_log(log);
        "stopped"
    } else {
        p.kill();
        "killed"
    }
}

/// Stop both stages and keep their logs in files for a failure's message: the paths.
fn keep_logs(capture: &mut CaptureProcess, apply: &mut CaptureProcess, seed: u64) -> String {
    let dir = std::env::temp_dir();
    let mut paths = Vec::new();
    for (name, p) in [("capture", capture), ("apply", apply)] {
        let (_, text) = p.stop();
        let path = dir.join(format!("sluice-random-{seed}-{name}.log"));
        std::fs::write(&path, text).unwrap();
        paths.push(path.display().to_string());
    }
    paths.join(", ")
}

/// The reasons a table may be stopped for: the phrases listed under *What stops a table* in
/// docs/apply-clickhouse.md (each item's first `code span`).
fn impossible() -> Vec<String> {
    let doc = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../docs/apply-clickhouse.md"
    ))
    .unwrap();
    let section = doc
        .split("\n### What stops a table\n")
        .nth(1)
        .expect("docs/apply-clickhouse.md has a section \"What stops a table\"");
    let section = section.split("\n#").next().unwrap();
    let phrases: Vec<String> = section
        .lines()
        .filter(|l| l.starts_with("- "))
        .filter_map(|l| l.split('`').nth(1).map(str::to_string))
        .collect();
    assert!(!phrases.is_empty(), "no reasons listed: {section}");
    phrases
}

/// What a step does to the model once its statements succeeded.
type AfterStep = Box<dyn FnOnce(&mut Vec<Table>)>;

#[tokio::test(flavor = "multi_thread")]
async fn a_storm_of_schema_changes_leaves_every_table_equal_or_stopped_for_a_listed_reason() {
    let seed = sluice_tests::seed();
    let steps: u64 = std::env::var("SLUICE_TEST_STEPS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(100);
    println!(
        "SLUICE_TEST_SEED={seed} (SLUICE_TEST_STEPS={steps}, ClickHouse {})",
        clickhouse_url()
    );
    let impossible = impossible();
    let mut rng = Rng(seed);
    let db = unique("sluice_t_ch_random");
    let ch_db = format!("{db}_m");
    clickhouse_tsv(&format!("CREATE DATABASE {ch_db}"))
        .await
        .unwrap();
    let mut my = mysql_async::Conn::new(mysql_async::Opts::from_url(&mysql_url()).unwrap())
        .await
        .unwrap();
    my.query_drop(format!("CREATE DATABASE `{db}`"))
        .await
        .unwrap();
    let mut capture = CaptureProcess::spawn(CaptureProcess::config(&db, &binlog_end().await, ""));
    let dlq = unique("dlq");
    let group = unique("g");
    let mut apply =
        CaptureProcess::apply_clickhouse_with(&capture.prefix, &ch_db, &dlq, &group, "");
    let mut next_col = 0u32;
    let mut tables: Vec<Table> = Vec::new();
    let mut log: Vec<String> = Vec::new();
    let create = |rng: &mut Rng, name: String, next_col: &mut u32| -> (Table, String) {
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
        (
            Table {
                name,
                cols,
                key,
                partitioned: false,
            },
            sql,
        )
    };
    for i in 0..4 {
        let (t, sql) = loop {
            let (t, sql) = create(&mut rng, format!("t{i}"), &mut next_col);
            if accepted(&mut my, &sql, &db, &t.name).await {
                break (t, sql);
            }
        };
        my.query_drop(&sql)
            .await
            .unwrap_or_else(|e| panic!("seed {seed}: {sql}: {e}"));
        log.push(format!("-: {sql}"));
        tables.push(t);
    }
    let (mut capture_up, mut apply_up) = (true, true);
    for step in 0..steps {
        // A stage that exited on its own is started again, as its container would be (an
        // applier stops once after it stops a table ClickHouse refused rows of); the log says
        // so, and a table stopped for a reason not listed fails the test at the end.
        if capture_up && capture.exited() {
            capture.restart();
            log.push(format!("{step}: capture had exited; restarted"));
        }
        if apply_up && apply.exited() {
            apply.restart();
            log.push(format!("{step}: apply had exited; restarted"));
        }
        let ti = rng.below(tables.len() as u64) as usize;
        let name = format!("`{db}`.`{}`", tables[ti].name);
        let roll = rng.below(100);
        // Statements, and whether the server may refuse them (a conversion strict mode
        // rejects, a key the rows do not fit): then nothing changed, and the model neither.
        let mut statements: Vec<String> = Vec::new();
        let mut may_fail = false;
        let mut after: Option<AfterStep> = None;
        if roll < 30 {
            for _ in 0..1 + rng.below(3) {
                statements.extend(upsert(&mut rng, &db, &tables[ti]));
            }
        } else if roll < 37 {
            let t = &tables[ti];
            let cols = t.writable();
            if let Some(c) = cols.get(rng.below(cols.len().max(1) as u64) as usize) {
                let v = value(&mut rng, c);
                statements.push(format!(
                    "UPDATE {name} SET `{}` = {v} WHERE id % 3 = {}",
                    c.name,
                    rng.below(3)
                ));
            }
        } else if roll < 41 {
            statements.push(format!("DELETE FROM {name} WHERE id = {}", rng.below(40)));
        } else if roll < 66 {
            // An ALTER of one to three clauses, each on a column of its own.
            let mut t = tables[ti].clone();
            let mut clauses = Vec::new();
            let mut touched: Vec<String> = Vec::new();
            for _ in 0..1 + rng.below(3) {
                let free: Vec<usize> = (0..t.cols.len())
                    .filter(|i| !touched.contains(&t.cols[*i].name))
                    .collect();
                let what = rng.below(100);
                if what < 35 || free.is_empty() {
                    next_col += 1;
                    let generated = rng.chance(12);
                    let (c, def) = definition(&mut rng, format!("c{next_col}"), generated);
                    let place = match rng.below(6) {
                        0 => " FIRST".to_string(),
                        1 => " AFTER `id`".to_string(),
                        _ => String::new(),
                    };
                    clauses.push(format!("ADD COLUMN `{}` {def}{place}", c.name));
                    touched.push(c.name.clone());
                    t.cols.push(c);
                    continue;
                }
                let i = *pick(&mut rng, &free);
                if what < 50 && t.cols.len() > 1 {
                    let c = t.cols.remove(i);
                    clauses.push(format!("DROP COLUMN `{}`", c.name));
                    touched.push(c.name);
                } else if what < 75 && t.cols[i].ty.is_some() {
                    let (c, def) = definition(&mut rng, t.cols[i].name.clone(), false);
                    clauses.push(format!("MODIFY COLUMN `{}` {def}", c.name));
                    touched.push(c.name.clone());
                    t.cols[i] = c;
                } else if what < 88 {
                    next_col += 1;
                    let new = format!("r{next_col}");
                    let old = std::mem::replace(&mut t.cols[i].name, new.clone());
                    clauses.push(format!("RENAME COLUMN `{old}` TO `{new}`"));
                    touched.push(old);
                    touched.push(new);
                } else if t.cols[i].ty.is_some() {
                    next_col += 1;
                    let (c, def) = definition(&mut rng, format!("r{next_col}"), false);
                    let old = std::mem::replace(&mut t.cols[i], c);
                    clauses.push(format!(
                        "CHANGE COLUMN `{}` `{}` {def}",
                        old.name, t.cols[i].name
                    ));
                    touched.push(old.name);
                    touched.push(t.cols[i].name.clone());
                }
            }
            if !clauses.is_empty() {
                // A permissive sql_mode: the server converts what strict mode refuses.
                let lax = rng.chance(35);
                if lax {
                    statements.push("SET SESSION sql_mode = ''".into());
                }
                statements.push(format!("ALTER TABLE {name} {}", clauses.join(", ")));
                may_fail = true;
                after = Some(Box::new(move |ts: &mut Vec<Table>| ts[ti] = t));
            }
        } else if roll < 72 && rng.chance(25) {
            // A key column's type changed.
            let ty = if rng.chance(50) { "BIGINT" } else { "INT" };
            statements.push(format!("ALTER TABLE {name} MODIFY id {ty} NOT NULL"));
        } else if roll < 72 {
            // The primary key: (id), (id, k) or none.
            let from = tables[ti].key;
            let to = *pick(&mut rng, &[Key::Id, Key::IdK, Key::None]);
            if to != from {
                let drop = if from == Key::None {
                    ""
                } else {
                    "DROP PRIMARY KEY"
                };
                let add = match to {
                    Key::Id => "ADD PRIMARY KEY (id)",
                    Key::IdK => "ADD PRIMARY KEY (id, k)",
                    Key::None => "",
                };
                let clauses: Vec<&str> =
                    [drop, add].into_iter().filter(|s| !s.is_empty()).collect();
                statements.push(format!("ALTER TABLE {name} {}", clauses.join(", ")));
                may_fail = true;
                after = Some(Box::new(move |ts: &mut Vec<Table>| ts[ti].key = to));
            }
        } else if roll < 74 {
            statements.push(format!("TRUNCATE TABLE {name}"));
        } else if roll < 77 {
            // Dropped and made again under its name, with other columns.
            let (t, sql) = loop {
                let (t, sql) = create(&mut rng, tables[ti].name.clone(), &mut next_col);
                if accepted(&mut my, &sql, &db, &t.name).await {
                    break (t, sql);
                }
            };
            statements.push(format!("DROP TABLE {name}"));
            statements.push(sql);
            after = Some(Box::new(move |ts: &mut Vec<Table>| ts[ti] = t));
        } else if roll < 80 {
            // Two tables swap names.
            let tj = rng.below(tables.len() as u64) as usize;
            if tj != ti {
                let (a, b) = (tables[ti].name.clone(), tables[tj].name.clone());
                statements.push(format!(
                    "RENAME TABLE `{db}`.`{a}` TO `{db}`.`swap_tmp`, `{db}`.`{b}` TO `{db}`.`{a}`, \
                     `{db}`.`swap_tmp` TO `{db}`.`{b}`"
                ));
                after = Some(Box::new(move |ts: &mut Vec<Table>| {
                    ts.swap(ti, tj);
                    ts[ti].name = a;
                    ts[tj].name = b;
                }));
            }
        } else if roll < 82 && tables.len() < 6 {
            // A copy: CREATE TABLE ... LIKE, then its rows.
            let src = tables[ti].clone();
            let copy = format!("t{}", tables.len());
            let cols: Vec<String> = ["id".to_string(), "k".to_string()]
                .into_iter()
                .chain(src.writable().iter().map(|c| c.name.clone()))
                .map(|c| format!("`{c}`"))
                .collect();
            statements.push(format!("CREATE TABLE `{db}`.`{copy}` LIKE {name}"));
            statements.push(format!(
                "INSERT INTO `{db}`.`{copy}` ({0}) SELECT {0} FROM {name}",
                cols.join(", ")
            ));
            after = Some(Box::new(move |ts: &mut Vec<Table>| {
                ts.push(Table { name: copy, ..src })
            }));
        } else if roll < 83 {
            statements.push(format!("CREATE INDEX i{step} ON {name} (k)"));
        } else if roll < 86 {
            // Partitions: rows removed or moved without row events (p0, p1 or p2 may be gone
            // already: the server refuses, nothing changed).
            may_fail = true;
            // Mostly a table partitioned already.
            let partitioned: Vec<usize> = (0..tables.len())
                .filter(|&i| tables[i].partitioned)
                .collect();
            let ti = if !partitioned.is_empty() && rng.chance(75) {
                *pick(&mut rng, &partitioned)
            } else {
                ti
            };
            let name = format!("`{db}`.`{}`", tables[ti].name);
            if !tables[ti].partitioned {
                statements.push(format!(
                    "ALTER TABLE {name} PARTITION BY RANGE (id) (PARTITION p0 VALUES LESS THAN \
                     (13), PARTITION p1 VALUES LESS THAN (26), PARTITION p2 VALUES LESS THAN \
                     MAXVALUE)"
                ));
                after = Some(Box::new(move |ts: &mut Vec<Table>| {
                    ts[ti].partitioned = true
                }));
            } else {
                match rng.below(8) {
                    0..=3 => statements.push(format!(
                        "ALTER TABLE {name} TRUNCATE PARTITION p{}",
                        rng.below(3)
                    )),
                    4 => statements.push(format!(
                        "ALTER TABLE {name} DROP PARTITION p{}",
                        rng.below(2)
                    )),
                    5 | 6 => {
                        // Partition p1 exchanged with a new empty table: its rows move there.
                        let x = format!("x{step}");
                        statements.push(format!("CREATE TABLE `{db}`.`{x}` LIKE {name}"));
                        statements.push(format!("ALTER TABLE `{db}`.`{x}` REMOVE PARTITIONING"));
                        statements.push(format!(
                            "ALTER TABLE {name} EXCHANGE PARTITION p1 WITH TABLE `{db}`.`{x}`"
                        ));
                        let t = tables[ti].clone();
                        after = Some(Box::new(move |ts: &mut Vec<Table>| {
                            ts.push(Table {
                                name: x,
                                partitioned: false,
                                ..t
                            })
                        }));
                    }
                    _ => {
                        statements.push(format!("ALTER TABLE {name} REMOVE PARTITIONING"));
                        after = Some(Box::new(move |ts: &mut Vec<Table>| {
                            ts[ti].partitioned = false
                        }));
                    }
                }
            }
        } else if roll < 92 {
            let what = if capture_up {
                capture_up = false;
                format!("capture {}", halt(&mut capture, &mut rng))
            } else {
                capture.restart();
                capture_up = true;
                "capture restarted".into()
            };
            log.push(format!("{step}: {what}"));
        } else {
            let what = if apply_up {
                apply_up = false;
                format!("apply {}", halt(&mut apply, &mut rng))
            } else {
                apply.restart();
                apply_up = true;
                "apply restarted".into()
            };
            log.push(format!("{step}: {what}"));
        }
        let mut failed = None;
        for sql in &statements {
            match my.query_drop(sql).await {
                Ok(()) => log.push(format!("{step}: {sql}")),
                Err(e) if may_fail => {
                    log.push(format!("{step}: {sql} -- refused: {e}"));
                    failed = Some(e);
                    break;
                }
                Err(e) => panic!("seed {seed} step {step}: {sql}: {e}\n{}", log.join("\n")),
            }
        }
        if statements.iter().any(|s| s.starts_with("SET SESSION")) {
            my.query_drop("SET SESSION sql_mode = DEFAULT")
                .await
                .unwrap();
        }
        if failed.is_none() {
            if let Some(f) = after {
                f(&mut tables);
            }
        }
        if rng.chance(20) {
            tokio::time::sleep(Duration::from_millis(rng.below(400))).await;
        }
    }
    // Every table given a key back (verify compares tables with one): the rows are unique by
    // (id, k).
    for t in &mut tables {
        if t.key == Key::None {
            let sql = format!("ALTER TABLE `{db}`.`{}` ADD PRIMARY KEY (id, k)", t.name);
            my.query_drop(&sql)
                .await
                .unwrap_or_else(|e| panic!("seed {seed}: {sql}: {e}"));
            log.push(format!("end: {sql}"));
            t.key = Key::IdK;
        }
    }
    if !capture_up || capture.exited() {
        capture.restart();
    }
    if !apply_up || apply.exited() {
        apply.restart();
    }
    let (code, report, err) = tokio::task::block_in_place(|| verify(&capture, &apply, &[]));
    let letters = tokio::task::spawn_blocking({
        let dlq = dlq.clone();
        move || dead_letters(&dlq, usize::MAX)
    })
    .await
    .unwrap();
    let mut problems: Vec<String> = Vec::new();
    let mut stopped: BTreeMap<String, String> = BTreeMap::new();
    let mut equal = 0;
    for t in report["tables"].as_array().cloned().unwrap_or_default() {
        let source = t["source"].as_str().unwrap_or_default().to_string();
        let result = t["result"].as_str().unwrap_or_default();
        let reason = t["reason"].as_str().unwrap_or_default().to_string();
        let not_compared = &t["columns_not_compared"];
        match result {
            "equal" if not_compared.as_array().is_none_or(|a| a.is_empty()) => equal += 1,
            "equal" => problems.push(format!(
                "{source}: columns missing from the target: {not_compared}"
            )),
            "not verified" if reason.starts_with("the apply stage stopped this table") => {
                if impossible.iter().any(|p| reason.contains(p.as_str())) {
                    stopped.insert(source, reason);
                } else {
                    problems.push(format!(
                        "{source}: stopped for a reason not listed: {reason}"
                    ));
                }
            }
            _ => problems.push(format!("{source}: {result}: {t:#}")),
        }
    }
    if report["tables"].as_array().map_or(0, |a| a.len()) < tables.len() {
        problems.push(format!(
            "verify compared fewer tables than the {} made",
            tables.len()
        ));
    }
    for (_, reason) in &letters {
        let of_stopped = stopped.keys().any(|s| {
            let t = s.rsplit('.').next().unwrap_or_default();
            reason.starts_with(&format!("table {t} is stopped"))
                || reason.starts_with(&format!("{s} row (version"))
                || reason.contains(s.as_str())
        });
        if !of_stopped {
            problems.push(format!(
                "a dead letter that is no stopped table's: {reason}"
            ));
        }
    }
    if !problems.is_empty() || (code != Some(0) && stopped.is_empty()) {
        let logs = keep_logs(&mut capture, &mut apply, seed);
        panic!(
            "seed {seed}: {}\nverify ({code:?}): {report:#}\n{err}\nstatements:\n{}\n\
             (the stages' logs: {logs})",
            problems.join("\n"),
            log.join("\n")
        );
    }
    println!(
        "seed {seed}: {equal} of {} tables equal to their source, {} stopped{}",
        tables.len(),
        stopped.len(),
        stopped
            .iter()
            .map(|(t, r)| format!("\n  {t}: {r}"))
            .collect::<String>()
    );
    capture.stop_ok();
    apply.stop_ok();
    clickhouse_tsv(&format!("DROP DATABASE {ch_db}"))
        .await
        .unwrap();
    my.query_drop(format!("DROP DATABASE `{db}`"))
        .await
        .unwrap();
}
