//! The registry of actions a scenario draws from (see the module above). Each action is a
//! function of the world: statements for the source (with what they do to the model), or a
//! change to the pipeline itself (a stage stopped, paused, joined; the target cut off; a
//! snapshot requested; a stopped table taken up again; the broker restarted; partitions added).
//!
//! A new feature adds its actions here.

use std::time::Duration;

use mysql_async::prelude::Queryable;

use super::model::{self, value, Key, Table};
use super::values::pick;
use super::{Action, Plan, Stage, State, Step, World};
use crate::capture::clickhouse_tsv;

pub const REGISTRY: &[Action] = &[
    // Rows.
    act("upsert", 30, false, |w| Box::pin(upsert(w))),
    act("update", 7, false, |w| Box::pin(update(w))),
    act("delete", 4, false, |w| Box::pin(delete(w))),
    act("key_move", 3, false, |w| Box::pin(key_move(w))),
    act("bulk", 2, false, |w| Box::pin(bulk(w))),
    act("xa", 4, true, |w| Box::pin(xa(w))),
    // Schemas.
    act("alter", 25, false, |w| Box::pin(alter(w))),
    act("key_type", 2, false, |w| Box::pin(key_type(w))),
    act("primary_key", 4, false, |w| Box::pin(primary_key(w))),
    act("truncate", 2, false, |w| Box::pin(truncate(w))),
    act("recreate", 3, false, |w| Box::pin(recreate(w))),
    act("swap", 3, false, |w| Box::pin(swap(w))),
    act("copy", 2, false, |w| Box::pin(copy(w))),
    act("index", 1, false, |w| Box::pin(index(w))),
    act("partitions", 3, false, |w| Box::pin(partitions(w))),
    act("unheld", 2, false, |w| Box::pin(unheld(w))),
    // The pipeline.
    act("capture_halt", 5, true, |w| Box::pin(capture_halt(w))),
    act("capture_pause", 2, true, |w| Box::pin(capture_pause(w))),
    act("apply_halt", 6, true, |w| Box::pin(apply_halt(w))),
    act("apply_pause", 2, true, |w| Box::pin(apply_pause(w))),
    act("applier_joins", 2, true, |w| Box::pin(applier_joins(w))),
    act("target_outage", 2, true, |w| Box::pin(target_outage(w))),
    act("snapshot", 2, true, |w| Box::pin(snapshot(w))),
    act("stop_table", 1, false, |w| Box::pin(stop_table(w))),
    act("resync", 3, true, |w| Box::pin(resync(w))),
    act("broker_restart", 1, true, |w| Box::pin(broker_restart(w))),
    act("add_partitions", 1, true, |w| Box::pin(add_partitions(w))),
];

const fn act(
    name: &'static str,
    weight: u64,
    beside_xa: bool,
    run: for<'a> fn(&'a mut World) -> Step<'a>,
) -> Action {
    Action {
        name,
        weight,
        beside_xa,
        run,
    }
}

/// A table of the model, drawn: its index and its quoted name.
fn table(w: &mut World) -> (usize, String) {
    let ti = w.rng.below(w.tables.len() as u64) as usize;
    (ti, format!("`{}`.`{}`", w.db, w.tables[ti].name))
}

/// One to three rows written (inserted or replaced).
async fn upsert(w: &mut World) -> Plan {
    let (ti, _) = table(w);
    let mut statements = Vec::new();
    for _ in 0..1 + w.rng.below(3) {
        statements.extend(model::upsert(&mut w.rng, &w.db, &w.tables[ti]));
    }
    Plan::sql(statements)
}

/// One column of a third of the rows set to one value.
async fn update(w: &mut World) -> Plan {
    let (ti, name) = table(w);
    let t = &w.tables[ti];
    let cols = t.writable();
    let Some(c) = cols.get(w.rng.below(cols.len().max(1) as u64) as usize) else {
        return Plan::default();
    };
    let v = value(&mut w.rng, c);
    let sql = format!(
        "UPDATE {name} SET `{}` = {v} WHERE id % 3 = {}",
        c.name,
        w.rng.below(3)
    );
    Plan::sql(vec![sql])
}

async fn delete(w: &mut World) -> Plan {
    let (_, name) = table(w);
    Plan::sql(vec![format!(
        "DELETE FROM {name} WHERE id = {}",
        w.rng.below(40)
    )])
}

/// A row's key changed: it moves to an `id` no row had (an update of the key is a delete and an
/// insert in the mirror, maybe on two partitions).
async fn key_move(w: &mut World) -> Plan {
    let (_, name) = table(w);
    let to = w.next_id;
    w.next_id += 1;
    Plan::sql(vec![format!(
        "UPDATE {name} SET id = {to} WHERE id = {} AND k = {}",
        w.rng.below(40),
        w.rng.below(2)
    )])
}

/// One transaction of hundreds of rows inserted, then half of them updated.
async fn bulk(w: &mut World) -> Plan {
    let (ti, name) = table(w);
    let n = 200 + w.rng.below(1300);
    let base = w.next_id;
    w.next_id += n;
    let t = &w.tables[ti];
    let mut names = vec!["`id`".to_string(), "`k`".to_string()];
    let mut values = vec![format!("{base} + n"), "n % 2".to_string()];
    for c in t.writable() {
        names.push(format!("`{}`", c.name));
        values.push(value(&mut w.rng, c));
    }
    let digits = "(SELECT 0 d UNION ALL SELECT 1 UNION ALL SELECT 2 UNION ALL SELECT 3 UNION ALL \
                  SELECT 4 UNION ALL SELECT 5 UNION ALL SELECT 6 UNION ALL SELECT 7 UNION ALL \
                  SELECT 8 UNION ALL SELECT 9)";
    let insert = format!(
        "INSERT INTO {name} ({}) SELECT {} FROM (SELECT a.d + 10 * b.d + 100 * c.d + 1000 * e.d \
         AS n FROM {digits} a, {digits} b, {digits} c, {digits} e) s WHERE n < {n}",
        names.join(", "),
        values.join(", ")
    );
    let mut statements = vec!["BEGIN".to_string(), insert];
    let cols = t.writable();
    if let Some(c) = cols.get(w.rng.below(cols.len().max(1) as u64) as usize) {
        let v = value(&mut w.rng, c);
        statements.push(format!(
            "UPDATE {name} SET `{}` = {v} WHERE id >= {base} AND id % 2 = 0",
            c.name
        ));
    }
    statements.push("COMMIT".into());
    Plan::sql(statements)
}

/// An XA transaction: one prepared and not ended yet is ended (committed, or rolled back); else
/// a new one writes rows of one or two tables and is prepared, and left so (ended by a later
/// step, or before any step that writes or changes a schema) or ended at once.
async fn xa(w: &mut World) -> Plan {
    if w.xa_open.is_some() {
        w.end_xa().await;
        return Plan::default();
    }
    if w.xa.is_none() {
        let opts = mysql_async::Opts::from_url(&crate::mysql_url()).unwrap();
        w.xa = Some(mysql_async::Conn::new(opts).await.unwrap());
    }
    let xid = format!("x{}-{}", w.seed % 100_000, w.step);
    let mut statements = vec![format!("XA START '{xid}'")];
    for _ in 0..1 + w.rng.below(2) {
        let (ti, _) = table(w);
        for _ in 0..1 + w.rng.below(3) {
            statements.extend(model::upsert(&mut w.rng, &w.db, &w.tables[ti]));
        }
    }
    statements.push(format!("XA END '{xid}'"));
    statements.push(format!("XA PREPARE '{xid}'"));
    let conn = w.xa.as_mut().unwrap();
    for sql in &statements {
        if let Err(e) = conn.query_drop(sql).await {
            panic!("seed {} step {}: {sql}: {e}", w.seed, w.step);
        }
    }
    let n = statements.len();
    w.note(format!("XA '{xid}' prepared ({} statements)", n - 3));
    w.xa_open = Some(xid);
    if w.rng.chance(40) {
        w.end_xa().await;
    }
    Plan::default()
}

/// An ALTER of one to three clauses, each on a column of its own: ADD (any type, DEFAULT in any
/// form, generated, FIRST or AFTER), DROP, MODIFY, RENAME COLUMN, CHANGE COLUMN; under a
/// permissive `sql_mode` a third of the time (the server converts what strict mode refuses).
async fn alter(w: &mut World) -> Plan {
    let (ti, name) = table(w);
    let rng = &mut w.rng;
    let mut t = w.tables[ti].clone();
    let mut clauses = Vec::new();
    let mut touched: Vec<String> = Vec::new();
    for _ in 0..1 + rng.below(3) {
        let free: Vec<usize> = (0..t.cols.len())
            .filter(|i| !touched.contains(&t.cols[*i].name))
            .collect();
        let what = rng.below(100);
        if what < 35 || free.is_empty() {
            w.next_col += 1;
            let generated = rng.chance(12);
            let (c, def) = model::definition(rng, format!("c{}", w.next_col), generated);
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
        let i = *pick(rng, &free);
        if what < 50 && t.cols.len() > 1 {
            let c = t.cols.remove(i);
            clauses.push(format!("DROP COLUMN `{}`", c.name));
            touched.push(c.name);
        } else if what < 75 && t.cols[i].ty.is_some() {
            let (c, def) = model::definition(rng, t.cols[i].name.clone(), false);
            clauses.push(format!("MODIFY COLUMN `{}` {def}", c.name));
            touched.push(c.name.clone());
            t.cols[i] = c;
        } else if what < 88 {
            w.next_col += 1;
            let new = format!("r{}", w.next_col);
            let old = std::mem::replace(&mut t.cols[i].name, new.clone());
            clauses.push(format!("RENAME COLUMN `{old}` TO `{new}`"));
            touched.push(old);
            touched.push(new);
        } else if t.cols[i].ty.is_some() {
            w.next_col += 1;
            let (c, def) = model::definition(rng, format!("r{}", w.next_col), false);
            let old = std::mem::replace(&mut t.cols[i], c);
            clauses.push(format!(
                "CHANGE COLUMN `{}` `{}` {def}",
                old.name, t.cols[i].name
            ));
            touched.push(old.name);
            touched.push(t.cols[i].name.clone());
        }
    }
    if clauses.is_empty() {
        return Plan::default();
    }
    let mut statements = Vec::new();
    if rng.chance(35) {
        statements.push("SET SESSION sql_mode = ''".into());
    }
    statements.push(format!("ALTER TABLE {name} {}", clauses.join(", ")));
    Plan {
        statements,
        may_fail: true,
        after: Some(Box::new(move |ts: &mut Vec<Table>| ts[ti] = t)),
    }
}

/// A value no ClickHouse date type holds (a day the month has not, a zero month or day)
/// written into a DATE column (added first where the table has none) of a table whose
/// appliers mark such values: its rows flow, the value named in `_sluice_unheld`, and `sluice
/// verify` takes keys that differ only there as marked. Other tables are not drawn: there the
/// same value stops the table, as `stop_table` already tries.
async fn unheld(w: &mut World) -> Plan {
    let marked: Vec<usize> = (0..w.tables.len())
        .filter(|i| w.marked(&w.tables[*i].name))
        .collect();
    let Some(&ti) = (!marked.is_empty()).then(|| pick(&mut w.rng, &marked)) else {
        return Plan::default();
    };
    let date = super::values::TYPES
        .iter()
        .position(|t| t.sql == "DATE")
        .expect("DATE is among the types");
    let t = &w.tables[ti];
    let name = format!("`{}`.`{}`", w.db, t.name);
    let mut statements = vec!["SET SESSION sql_mode = 'ALLOW_INVALID_DATES'".to_string()];
    let mut added = None;
    let column = match t.cols.iter().find(|c| c.ty == Some(date)) {
        Some(c) => c.name.clone(),
        None => {
            w.next_col += 1;
            let c = format!("c{}", w.next_col);
            statements.push(format!("ALTER TABLE {name} ADD COLUMN `{c}` DATE NULL"));
            added = Some(model::Col {
                name: c.clone(),
                ty: Some(date),
                nullable: true,
            });
            c
        }
    };
    let v = *pick(
        &mut w.rng,
        &["'2026-02-30'", "'2026-00-15'", "'2026-04-00'"],
    );
    statements.push(format!(
        "UPDATE {name} SET `{column}` = {v} WHERE id % 3 = {}",
        w.rng.below(3)
    ));
    Plan {
        statements,
        may_fail: true,
        after: added.map(|c| -> super::AfterStep {
            Box::new(move |ts: &mut Vec<Table>| ts[ti].cols.push(c))
        }),
    }
}

/// The key column's type changed.
async fn key_type(w: &mut World) -> Plan {
    let (_, name) = table(w);
    let ty = if w.rng.chance(50) { "BIGINT" } else { "INT" };
    Plan {
        statements: vec![format!("ALTER TABLE {name} MODIFY id {ty} NOT NULL")],
        may_fail: true,
        after: None,
    }
}

/// The primary key: (id), (id, k) or none.
async fn primary_key(w: &mut World) -> Plan {
    let (ti, name) = table(w);
    let from = w.tables[ti].key;
    let to = *pick(&mut w.rng, &[Key::Id, Key::IdK, Key::None]);
    if to == from {
        return Plan::default();
    }
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
    let clauses: Vec<&str> = [drop, add].into_iter().filter(|s| !s.is_empty()).collect();
    Plan {
        statements: vec![format!("ALTER TABLE {name} {}", clauses.join(", "))],
        may_fail: true,
        after: Some(Box::new(move |ts: &mut Vec<Table>| ts[ti].key = to)),
    }
}

async fn truncate(w: &mut World) -> Plan {
    let (_, name) = table(w);
    Plan::sql(vec![format!("TRUNCATE TABLE {name}")])
}

/// Dropped and made again under its name, with other columns.
async fn recreate(w: &mut World) -> Plan {
    let (ti, name) = table(w);
    let again = w.tables[ti].name.clone();
    let (t, sql) = model::new_table(&mut w.my, &mut w.rng, &w.db, again, &mut w.next_col).await;
    Plan {
        statements: vec![format!("DROP TABLE {name}"), sql],
        may_fail: false,
        after: Some(Box::new(move |ts: &mut Vec<Table>| ts[ti] = t)),
    }
}

/// Two tables swap names.
async fn swap(w: &mut World) -> Plan {
    let (ti, _) = table(w);
    let (tj, _) = table(w);
    if tj == ti {
        return Plan::default();
    }
    let db = &w.db;
    let (a, b) = (w.tables[ti].name.clone(), w.tables[tj].name.clone());
    Plan {
        statements: vec![format!(
            "RENAME TABLE `{db}`.`{a}` TO `{db}`.`swap_tmp`, `{db}`.`{b}` TO `{db}`.`{a}`, \
             `{db}`.`swap_tmp` TO `{db}`.`{b}`"
        )],
        may_fail: false,
        after: Some(Box::new(move |ts: &mut Vec<Table>| {
            ts.swap(ti, tj);
            ts[ti].name = a;
            ts[tj].name = b;
        })),
    }
}

/// A copy: CREATE TABLE ... LIKE, then its rows.
async fn copy(w: &mut World) -> Plan {
    if w.tables.len() >= 6 {
        return Plan::default();
    }
    let (ti, name) = table(w);
    let src = w.tables[ti].clone();
    let copy = format!("t{}", w.tables.len());
    let cols: Vec<String> = ["id".to_string(), "k".to_string()]
        .into_iter()
        .chain(src.writable().iter().map(|c| c.name.clone()))
        .map(|c| format!("`{c}`"))
        .collect();
    let db = &w.db;
    Plan {
        statements: vec![
            format!("CREATE TABLE `{db}`.`{copy}` LIKE {name}"),
            format!(
                "INSERT INTO `{db}`.`{copy}` ({0}) SELECT {0} FROM {name}",
                cols.join(", ")
            ),
        ],
        may_fail: false,
        after: Some(Box::new(move |ts: &mut Vec<Table>| {
            ts.push(Table { name: copy, ..src })
        })),
    }
}

async fn index(w: &mut World) -> Plan {
    let (_, name) = table(w);
    Plan::sql(vec![format!("CREATE INDEX i{} ON {name} (k)", w.step)])
}

/// Partitions: a table partitioned by range of `id`; rows removed or moved without row events
/// (a partition truncated, dropped, exchanged with a new table); partitioning removed.
/// (Partitions p0, p1 or p2 may be gone already: the server refuses, nothing changed.)
async fn partitions(w: &mut World) -> Plan {
    let (ti, _) = table(w);
    let rng = &mut w.rng;
    let partitioned: Vec<usize> = (0..w.tables.len())
        .filter(|&i| w.tables[i].partitioned)
        .collect();
    // Mostly a table partitioned already.
    let ti = if !partitioned.is_empty() && rng.chance(75) {
        *pick(rng, &partitioned)
    } else {
        ti
    };
    let db = &w.db;
    let name = format!("`{db}`.`{}`", w.tables[ti].name);
    let mut plan = Plan {
        may_fail: true,
        ..Plan::default()
    };
    if !w.tables[ti].partitioned {
        plan.statements.push(format!(
            "ALTER TABLE {name} PARTITION BY RANGE (id) (PARTITION p0 VALUES LESS THAN (13), \
             PARTITION p1 VALUES LESS THAN (26), PARTITION p2 VALUES LESS THAN MAXVALUE)"
        ));
        plan.after = Some(Box::new(move |ts: &mut Vec<Table>| {
            ts[ti].partitioned = true
        }));
        return plan;
    }
    match rng.below(8) {
        0..=3 => plan.statements.push(format!(
            "ALTER TABLE {name} TRUNCATE PARTITION p{}",
            rng.below(3)
        )),
        4 => plan.statements.push(format!(
            "ALTER TABLE {name} DROP PARTITION p{}",
            rng.below(2)
        )),
        5 | 6 => {
            // Partition p1 exchanged with a new empty table: its rows move there.
            let x = format!("x{}", w.step);
            plan.statements
                .push(format!("CREATE TABLE `{db}`.`{x}` LIKE {name}"));
            plan.statements
                .push(format!("ALTER TABLE `{db}`.`{x}` REMOVE PARTITIONING"));
            plan.statements.push(format!(
                "ALTER TABLE {name} EXCHANGE PARTITION p1 WITH TABLE `{db}`.`{x}`"
            ));
            let t = w.tables[ti].clone();
            plan.after = Some(Box::new(move |ts: &mut Vec<Table>| {
                ts.push(Table {
                    name: x,
                    partitioned: false,
                    ..t
                })
            }));
        }
        _ => {
            plan.statements
                .push(format!("ALTER TABLE {name} REMOVE PARTITIONING"));
            plan.after = Some(Box::new(move |ts: &mut Vec<Table>| {
                ts[ti].partitioned = false
            }));
        }
    }
    plan
}

/// Stopped (SIGTERM) or killed; or, when it is not running, started again.
async fn capture_halt(w: &mut World) -> Plan {
    let what = if w.capture.state == State::Down {
        w.capture.up();
        "capture started again".to_string()
    } else {
        format!("capture {}", w.capture.halt(&mut w.rng))
    };
    w.note(what);
    Plan::default()
}

/// SIGSTOP (it holds its connections and does nothing, past its sessions' timeouts), or SIGCONT.
async fn capture_pause(w: &mut World) -> Plan {
    let what = match w.capture.state {
        State::Up => {
            w.capture.pause();
            "capture paused (SIGSTOP)"
        }
        State::Paused => {
            w.capture.up();
            "capture continued (SIGCONT)"
        }
        State::Down => return Plan::default(),
    };
    w.note(what);
    Plan::default()
}

/// An applier drawn.
fn applier(w: &mut World) -> usize {
    w.rng.below(w.appliers.len() as u64) as usize
}

/// An applier stopped (SIGTERM) or killed; or, when it is not running, started again.
async fn apply_halt(w: &mut World) -> Plan {
    let i = applier(w);
    let what = if w.appliers[i].state == State::Down {
        w.appliers[i].up();
        format!("applier {i} started again")
    } else {
        format!("applier {i} {}", w.appliers[i].halt(&mut w.rng))
    };
    w.note(what);
    Plan::default()
}

/// An applier paused (SIGSTOP: its group session runs out, another member takes its
/// partitions), or continued.
async fn apply_pause(w: &mut World) -> Plan {
    let i = applier(w);
    let what = match w.appliers[i].state {
        State::Up => {
            w.appliers[i].pause();
            format!("applier {i} paused (SIGSTOP)")
        }
        State::Paused => {
            w.appliers[i].up();
            format!("applier {i} continued (SIGCONT)")
        }
        State::Down => return Plan::default(),
    };
    w.note(what);
    Plan::default()
}

/// A second or third applier joins the group; or the last one that joined leaves (stopped or
/// killed).
async fn applier_joins(w: &mut World) -> Plan {
    if w.appliers.len() < 3 && (w.appliers.len() == 1 || w.rng.chance(50)) {
        let a = w.applier();
        w.appliers.push(Stage::new(a));
        let n = w.appliers.len() - 1;
        w.note(format!("applier {n} joins the group"));
    } else if w.appliers.len() > 1 {
        let mut a = w.appliers.pop().unwrap();
        let how = if a.state == State::Down {
            "stopped already"
        } else {
            a.halt(&mut w.rng)
        };
        let n = w.appliers.len();
        w.note(format!("applier {n} leaves the group ({how})"));
    }
    Plan::default()
}

/// ClickHouse cut off from every applier (connections closed, new ones refused), or reachable
/// again.
async fn target_outage(w: &mut World) -> Plan {
    if w.target_cut {
        w.relay.restore();
        w.target_cut = false;
        w.note("ClickHouse reachable again");
    } else {
        w.relay.cut();
        w.target_cut = true;
        w.note("ClickHouse cut off");
    }
    Plan::default()
}

/// A snapshot of one or two tables requested (`[snapshot]` with a new request id), which the
/// capture serves at its next start: now, if it runs.
async fn snapshot(w: &mut World) -> Plan {
    let (a, _) = table(w);
    let (b, _) = table(w);
    let mut names = vec![format!("\"{}.{}\"", w.db, w.tables[a].name)];
    if b != a {
        names.push(format!("\"{}.{}\"", w.db, w.tables[b].name));
    }
    request_snapshot(w, &names);
    Plan::default()
}

fn request_snapshot(w: &mut World, names: &[String]) {
    let section = format!(
        "[snapshot]\ntables = [{}]\nrequest_id = \"r{}\"\n",
        names.join(", "),
        w.step
    );
    w.set_capture_snapshot(&section);
    let when = match w.capture.state {
        State::Down => "at its next start",
        _ => {
            w.capture.up();
            let (_, log) = w.capture.p.stop();
            w.capture.p.keep_log(log);
            w.capture.p.restart();
            "capture restarted"
        }
    };
    w.note(format!(
        "snapshot of {} requested ({when})",
        names.join(", ")
    ));
}

/// A row change logged as a statement (a session with `binlog_format = STATEMENT`): the
/// capture cannot carry it exactly, so the table stops (`the source refused it`), until a
/// `resync` takes it up again.
async fn stop_table(w: &mut World) -> Plan {
    let (_, name) = table(w);
    Plan::sql(vec![
        "SET SESSION binlog_format = 'STATEMENT'".into(),
        format!("DELETE FROM {name} WHERE id = {}", w.rng.below(40)),
        "SET SESSION binlog_format = 'ROW'".into(),
    ])
}

/// A stopped table taken up again by the steps `sluice status` gives: its mirror dropped (the
/// stage makes it again from the copy), its row deleted from the stopped tables' table, and
/// the table copied again.
async fn resync(w: &mut World) -> Plan {
    // A stop provoked and not yet taken up reaches the stopped tables' table within seconds.
    let provoked = w
        .log
        .iter()
        .filter(|l| l.contains("binlog_format = 'STATEMENT'"))
        .count();
    let taken = w.log.iter().filter(|l| l.contains(": resync of ")).count();
    let deadline =
        std::time::Instant::now() + Duration::from_secs(if provoked > taken { 15 } else { 0 });
    let stopped = loop {
        let stopped = clickhouse_tsv(&format!(
            "SELECT DISTINCT target FROM {}._sluice_stopped",
            w.ch_db
        ))
        .await
        .unwrap_or_default();
        if !stopped.trim().is_empty() || std::time::Instant::now() >= deadline {
            break stopped;
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    };
    let targets: Vec<&str> = stopped.lines().filter(|l| !l.is_empty()).collect();
    let Some(target) = targets
        .iter()
        .find(|t| w.tables.iter().any(|m| m.name == **t))
        .map(|t| t.to_string())
    else {
        return Plan::default();
    };
    let ch = &w.ch_db;
    clickhouse_tsv(&format!("DROP TABLE IF EXISTS {ch}.`{target}`"))
        .await
        .unwrap_or_else(|e| panic!("seed {}: dropping {ch}.{target}: {e}", w.seed));
    clickhouse_tsv(&format!(
        "ALTER TABLE {ch}._sluice_stopped DELETE WHERE target = '{target}'"
    ))
    .await
    .unwrap_or_else(|e| panic!("seed {}: taking up {ch}.{target}: {e}", w.seed));
    // The delete is a mutation: it is done when no row is left.
    for _ in 0..100 {
        let left = clickhouse_tsv(&format!(
            "SELECT count() FROM {ch}._sluice_stopped WHERE target = '{target}'"
        ))
        .await
        .unwrap_or_default();
        if left.trim() == "0" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    w.note(format!("resync of {target} ({}.{target})", w.db));
    // Running appliers take it up within 5 s; its rows are copied after that.
    tokio::time::sleep(Duration::from_secs(6)).await;
    let name = format!("\"{}.{target}\"", w.db);
    request_snapshot(w, &[name]);
    Plan::default()
}

/// The test bed's broker stopped and started again (only the test bed's: a broker given by
/// `SLUICE_KAFKA_BROKERS` is not restarted).
async fn broker_restart(w: &mut World) -> Plan {
    if !crate::faults::testbed_broker() || std::env::var_os("SLUICE_KAFKA_BROKERS").is_some() {
        return Plan::default();
    }
    let down = Duration::from_millis(w.rng.below(8000));
    tokio::task::spawn_blocking(move || {
        crate::faults::testbed(&["stop", "kafka"]);
        std::thread::sleep(down);
        crate::faults::testbed(&["start", "kafka"]);
    })
    .await
    .unwrap();
    w.note(format!(
        "broker restarted (down {down:?} more than its stop)"
    ));
    Plan::default()
}

/// A table's topic given one or two partitions more (its keys must stay on their partitions).
async fn add_partitions(w: &mut World) -> Plan {
    use rdkafka::admin::{AdminClient, AdminOptions, NewPartitions};
    let (ti, _) = table(w);
    let topic = w.capture.p.topic(&w.db, &w.tables[ti].name);
    let now = *w.partitions.get(&topic).unwrap_or(&3);
    let to = now + 1 + w.rng.below(2) as usize;
    let admin: AdminClient<rdkafka::client::DefaultClientContext> = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", crate::kafka_brokers())
        .create()
        .unwrap();
    let r = admin
        .create_partitions(
            &[NewPartitions::new(&topic, to)],
            &AdminOptions::new().operation_timeout(Some(Duration::from_secs(10))),
        )
        .await;
    match r.as_deref() {
        Ok([Ok(_)]) => {
            w.partitions.insert(topic.clone(), to);
            w.note(format!("{topic}: {to} partitions"));
        }
        other => w.note(format!("{topic}: no partitions added ({other:?})")),
    }
    Plan::default()
}
