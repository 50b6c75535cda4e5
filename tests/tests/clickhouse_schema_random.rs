//! Random interleavings of DDL and DML on several tables (MariaDB -> capture-mysql -> Kafka ->
//! apply-clickhouse, on whichever server `SLUICE_CLICKHOUSE_URL` names), with the capture and
//! the apply stage stopped (SIGTERM or SIGKILL), left behind and restarted at random points. At
//! the end every table's mirror equals the source, every cell of every source column, or the
//! table is stopped with a named error; no other event is dead-lettered.
//!
//! Seeded: `SLUICE_TEST_SEED=<n>` replays a run (the seed is printed at the start, and in
//! every failure). `SLUICE_TEST_STEPS` sets the number of steps (default 120).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use mysql_async::prelude::Queryable;
use sluice_tests::capture::{binlog_end, clickhouse_tsv, dead_letters, metric_at, CaptureProcess};
use sluice_tests::{clickhouse_url, mysql_url, unique, Rng};

#[derive(Clone, Debug)]
enum Kind {
    Int,
    Big,
    Text,
}

#[derive(Clone, Debug)]
struct Col {
    name: String,
    kind: Kind,
    nullable: bool,
}

impl Col {
    fn sql_type(&self) -> &'static str {
        match self.kind {
            Kind::Int => "INT",
            Kind::Big => "BIGINT",
            Kind::Text => "VARCHAR(20)",
        }
    }

    fn value(&self, rng: &mut Rng) -> String {
        if self.nullable && rng.chance(15) {
            return "NULL".into();
        }
        match self.kind {
            Kind::Int => format!("{}", rng.below(2_000_000_000) as i64 - 1_000_000_000),
            Kind::Big => format!("{}", rng.next() as i64 / 3),
            Kind::Text => format!("'v{}'", rng.below(100_000)),
        }
    }
}

struct Table {
    name: String,
    cols: Vec<Col>,
}

async fn ch(sql: &str) -> String {
    clickhouse_tsv(sql)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"))
}

/// The source's rows as TabSeparated text (NULL as \N), ordered by id.
async fn source_rows(c: &mut mysql_async::Conn, db: &str, t: &str, cols: &[String]) -> String {
    let list: Vec<String> = cols.iter().map(|c| format!("`{c}`")).collect();
    let rows: Vec<mysql_async::Row> = c
        .query(format!(
            "SELECT {} FROM `{db}`.`{t}` ORDER BY id",
            list.join(", ")
        ))
        .await
        .unwrap();
    let mut out = String::new();
    for r in rows {
        let cells: Vec<String> = (0..r.len())
            .map(|i| match r.as_ref(i).unwrap() {
                mysql_async::Value::NULL => "\\N".to_string(),
                mysql_async::Value::Bytes(b) => String::from_utf8_lossy(b).into_owned(),
                mysql_async::Value::Int(v) => v.to_string(),
                mysql_async::Value::UInt(v) => v.to_string(),
                other => panic!("unexpected {other:?}"),
            })
            .collect();
        out.push_str(&cells.join("\t"));
        out.push('\n');
    }
    out
}

/// A stage stopped now: SIGTERM or SIGKILL.
fn halt(p: &mut CaptureProcess, rng: &mut Rng) -> &'static str {
    if rng.chance(50) {
        let _ = p.stop();
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

#[tokio::test(flavor = "multi_thread")]
async fn random_schema_changes_under_restarts_leave_every_mirror_exact_or_stopped() {
    let seed = sluice_tests::seed();
    let steps: u64 = std::env::var("SLUICE_TEST_STEPS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(120);
    println!(
        "SLUICE_TEST_SEED={seed} (SLUICE_TEST_STEPS={steps}, ClickHouse {})",
        clickhouse_url()
    );
    let mut rng = Rng(seed);
    // RENAME COLUMN needs ClickHouse 20.4+; on older servers a rename stops its table (tested
    // on its own), which would leave little to compare here.
    let version = ch("SELECT version()").await;
    let mut parts = version
        .trim()
        .split('.')
        .map(|p| p.parse::<u32>().unwrap_or(0));
    let can_rename = (parts.next().unwrap_or(0), parts.next().unwrap_or(0)) >= (20, 4);
    let db = unique("sluice_t_ch_random");
    let ch_db = format!("{db}_m");
    ch(&format!("CREATE DATABASE {ch_db}")).await;
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
    let mut tables: Vec<Table> = Vec::new();
    for i in 0..3 {
        let t = Table {
            name: format!("t{i}"),
            cols: vec![
                Col {
                    name: "a".into(),
                    kind: Kind::Int,
                    nullable: true,
                },
                Col {
                    name: "b".into(),
                    kind: Kind::Text,
                    nullable: true,
                },
            ],
        };
        my.query_drop(format!(
            "CREATE TABLE `{db}`.`{}` (id INT PRIMARY KEY, a INT, b VARCHAR(20))",
            t.name
        ))
        .await
        .unwrap();
        tables.push(t);
    }
    let (mut capture_up, mut apply_up) = (true, true);
    let mut next_col = 0;
    let mut log: Vec<String> = Vec::new();
    for step in 0..steps {
        let ti = rng.below(tables.len() as u64) as usize;
        let t = &mut tables[ti];
        let name = format!("`{db}`.`{}`", t.name);
        let roll = rng.below(100);
        let sql = if roll < 40 {
            let id = rng.below(30);
            let cols: Vec<String> = t.cols.iter().map(|c| format!("`{}`", c.name)).collect();
            let values: Vec<String> = t.cols.clone().iter().map(|c| c.value(&mut rng)).collect();
            let updates: Vec<String> = cols.iter().map(|c| format!("{c} = VALUES({c})")).collect();
            Some(format!(
                "INSERT INTO {name} (id, {}) VALUES ({id}, {}) ON DUPLICATE KEY UPDATE {}",
                cols.join(", "),
                values.join(", "),
                updates.join(", ")
            ))
        } else if roll < 55 && !t.cols.is_empty() {
            let c = t.cols[rng.below(t.cols.len() as u64) as usize].clone();
            Some(format!(
                "UPDATE {name} SET `{}` = {} WHERE id % 3 = {}",
                c.name,
                c.value(&mut rng),
                rng.below(3)
            ))
        } else if roll < 62 {
            Some(format!("DELETE FROM {name} WHERE id = {}", rng.below(30)))
        } else if roll < 70 {
            next_col += 1;
            let c = Col {
                name: format!("c{next_col}"),
                kind: if rng.chance(50) {
                    Kind::Int
                } else {
                    Kind::Text
                },
                nullable: rng.chance(50),
            };
            let default = if c.nullable && rng.chance(50) {
                String::new()
            } else {
                let v = Col {
                    nullable: false,
                    ..c.clone()
                }
                .value(&mut rng);
                format!(" DEFAULT {v}")
            };
            let null = if c.nullable { "NULL" } else { "NOT NULL" };
            let sql = format!(
                "ALTER TABLE {name} ADD COLUMN `{}` {} {null}{default}",
                c.name,
                c.sql_type()
            );
            t.cols.push(c);
            Some(sql)
        } else if roll < 75 && t.cols.len() > 1 {
            let i = rng.below(t.cols.len() as u64) as usize;
            let c = t.cols.remove(i);
            Some(format!("ALTER TABLE {name} DROP COLUMN `{}`", c.name))
        } else if roll < 80 {
            let ints: Vec<usize> = (0..t.cols.len())
                .filter(|i| matches!(t.cols[*i].kind, Kind::Int))
                .collect();
            ints.first().map(|_| {
                let i = ints[rng.below(ints.len() as u64) as usize];
                t.cols[i].kind = Kind::Big;
                let c = &t.cols[i];
                format!(
                    "ALTER TABLE {name} MODIFY COLUMN `{}` BIGINT {}",
                    c.name,
                    if c.nullable { "NULL" } else { "NOT NULL" }
                )
            })
        } else if roll < 84 && can_rename && !t.cols.is_empty() {
            next_col += 1;
            let i = rng.below(t.cols.len() as u64) as usize;
            let new = format!("r{next_col}");
            let old = std::mem::replace(&mut t.cols[i].name, new.clone());
            Some(format!(
                "ALTER TABLE {name} RENAME COLUMN `{old}` TO `{new}`"
            ))
        } else if roll < 87 {
            Some(format!("TRUNCATE TABLE {name}"))
        } else if roll < 90 {
            Some(format!("CREATE INDEX i{step} ON {name} (id)"))
        } else if roll < 95 {
            let what = if capture_up {
                capture_up = false;
                format!("capture {}", halt(&mut capture, &mut rng))
            } else {
                capture.restart();
                capture_up = true;
                "capture restarted".into()
            };
            log.push(format!("{step}: {what}"));
            None
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
            None
        };
        if let Some(sql) = sql {
            my.query_drop(&sql)
                .await
                .unwrap_or_else(|e| panic!("seed {seed} step {step}: {sql}: {e}"));
            log.push(format!("{step}: {sql}"));
        }
        if rng.chance(20) {
            tokio::time::sleep(Duration::from_millis(rng.below(400))).await;
        }
    }
    if !capture_up {
        capture.restart();
    }
    if !apply_up {
        apply.restart();
    }
    // Wait until everything is applied: a last row in every table, then the apply stage's lag.
    for t in &tables {
        let cols: Vec<String> = t.cols.iter().map(|c| format!("`{}`", c.name)).collect();
        let values: Vec<String> = t
            .cols
            .iter()
            .map(|c| {
                Col {
                    nullable: false,
                    ..c.clone()
                }
                .value(&mut rng)
            })
            .collect();
        let mut sql = format!("INSERT INTO `{db}`.`{}` (id", t.name);
        for c in &cols {
            sql.push_str(", ");
            sql.push_str(c);
        }
        sql.push_str(") VALUES (1000");
        for v in &values {
            sql.push_str(", ");
            sql.push_str(v);
        }
        sql.push(')');
        my.query_drop(&sql)
            .await
            .unwrap_or_else(|e| panic!("seed {seed}: {sql}: {e}"));
    }
    // (A stopped table never gets it: apply-clickhouse keeps stopped tables in _sluice_stopped.)
    let deadline = Instant::now() + Duration::from_secs(180);
    for t in &tables {
        let q = format!(
            "SELECT (SELECT count() FROM {ch_db}.`{}` FINAL WHERE id = 1000) + \
             (SELECT count() FROM {ch_db}._sluice_stopped WHERE target = '{}')",
            t.name, t.name
        );
        while clickhouse_tsv(&q).await.unwrap_or_default().trim() == "0" {
            if Instant::now() > deadline {
                break; // told below, by what differs
            }
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    }
    // Every partition assigned (after a kill the group waits out the dead member's session
    // before handing its partitions on, and the lag covers assigned partitions only), then no
    // lag.
    let partitions = 3.0 * tables.len() as f64; // publish.partitions = 3
    let started = Instant::now();
    let mut assigned_since: Option<Instant> = None;
    loop {
        let assigned = metric_at(apply.metrics_port, "sluice_apply_assigned_partitions");
        if assigned == Some(partitions) {
            assigned_since.get_or_insert_with(Instant::now);
        } else {
            assigned_since = None;
        }
        let lag = metric_at(apply.metrics_port, "sluice_apply_consumer_lag_messages");
        if lag == Some(0.0) && assigned_since.is_some_and(|t| t.elapsed() > Duration::from_secs(6))
        {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(180),
            "seed {seed}: apply lag {lag:?}, {assigned:?} of {partitions} partitions after 180 s"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let letters = tokio::task::spawn_blocking({
        let dlq = dlq.clone();
        move || dead_letters(&dlq, usize::MAX)
    })
    .await
    .unwrap();
    let mut stopped: BTreeMap<String, String> = BTreeMap::new();
    for (_, reason) in &letters {
        let t = tables.iter().find(|t| {
            reason.starts_with(&format!("table {} is stopped", t.name))
                    // The row that stopped it (a row of a schema older than the target's).
                    || reason.starts_with(&format!("{db}.{} row (version", t.name))
        });
        match t {
            Some(t) => {
                stopped
                    .entry(t.name.clone())
                    .or_insert_with(|| reason.clone());
            }
            None => {
                let logs = keep_logs(&mut capture, &mut apply, seed);
                panic!(
                    "seed {seed}: a dead letter that is no stopped table's: {reason}\n{}\n\
                     (the stages' logs: {logs})",
                    log.join("\n")
                )
            }
        }
    }
    let mut compared = 0;
    for t in &tables {
        if let Some(why) = stopped.get(&t.name) {
            println!("{}: stopped: {why}", t.name);
            continue;
        }
        let mut cols = vec!["id".to_string()];
        cols.extend(t.cols.iter().map(|c| c.name.clone()));
        let want = source_rows(&mut my, &db, &t.name, &cols).await;
        let list: Vec<String> = cols.iter().map(|c| format!("`{c}`")).collect();
        let got = ch(&format!(
            "SELECT {} FROM {ch_db}.`{}` FINAL WHERE _deleted = 0 ORDER BY id",
            list.join(", "),
            t.name
        ))
        .await;
        if got != want {
            let logs = keep_logs(&mut capture, &mut apply, seed);
            assert_eq!(
                got,
                want,
                "seed {seed}: {} differs from its source (columns {cols:?})\n{}\n\
                 (the stages' logs: {logs})",
                t.name,
                log.join("\n")
            );
        }
        compared += 1;
    }
    println!(
        "seed {seed}: {compared} of {} tables equal to their source, {} stopped",
        tables.len(),
        stopped.len()
    );
    if stopped.is_empty() {
        for p in [&mut capture, &mut apply] {
            let (code, out) = p.stop();
            assert_eq!(code, Some(0), "seed {seed}: {out}");
        }
    } else {
        println!(
            "the stages' logs: {}",
            keep_logs(&mut capture, &mut apply, seed)
        );
    }
    ch(&format!("DROP DATABASE {ch_db}")).await;
    my.query_drop(format!("DROP DATABASE `{db}`"))
        .await
        .unwrap();
}
