//! The randomized whole-pipeline test's machinery: a scenario is a seeded random sequence of
//! *actions* drawn from one registry ([`actions::REGISTRY`]) and run against the real servers
//! (MariaDB -> capture-mysql -> Kafka -> apply-clickhouse), and the oracle is the source itself:
//! at checkpoints and at the end `sluice verify` compares every table cell for cell, and each
//! one must be equal to its source or stopped for a reason on the list of the impossible in
//! docs/apply-clickhouse.md (*What stops a table*); no other event may be dead-lettered.
//!
//! A feature adds its actions to the registry, so that it is tested against every other one.
//!
//! Settings (environment):
//! - `SLUICE_TEST_SEED`: replays a run (the seed is printed at the start and in every failure);
//!   `SLUICE_SCENARIO_SEED` and `SLUICE_SCENARIO_STEPS` set this test's seed and steps alone
//!   (before `SLUICE_TEST_SEED` and `SLUICE_TEST_STEPS`, which other seeded tests read too);
//! - `SLUICE_TEST_STEPS` and `SLUICE_TEST_SECONDS`: the run ends at whichever comes first (with
//!   neither, after 120 s; the longer mode is `SLUICE_TEST_SECONDS=3600`); a run prints how many
//!   steps it took, so that `SLUICE_TEST_SEED` with `SLUICE_TEST_STEPS` replays it;
//! - `SLUICE_TEST_CHECK_EVERY` (default 100; 0: none): a checkpoint (every stage up, every table
//!   compared) after every so many steps, besides the one at the end;
//! - `SLUICE_TEST_ACTIONS`: a comma-separated list of action names, the only ones drawn (to
//!   shrink a failing seed: the same seed draws the same steps among fewer kinds).

pub mod actions;
pub mod model;
pub mod values;

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::time::{Duration, Instant};

use mysql_async::prelude::Queryable;

use crate::capture::{binlog_end, clickhouse_tsv, dead_letters, verify, CaptureProcess};
use crate::relay::Relay;
use crate::{mysql_url, unique, Rng};
use model::{Key, Table};

/// What a step does to the model once its statements succeeded.
pub type AfterStep = Box<dyn FnOnce(&mut Vec<Table>)>;

/// The source tables whose values the target cannot hold are written marked
/// (`tables.unheld = "mark"`); the others stop on them.
pub const MARKED: [&str; 2] = ["t0", "t2"];

/// The statements of a step and what they do to the model.
#[derive(Default)]
pub struct Plan {
    pub statements: Vec<String>,
    /// The server may refuse one (a conversion strict mode rejects, a key the rows do not
    /// fit): then nothing changed, and the model neither.
    pub may_fail: bool,
    pub after: Option<AfterStep>,
}

impl Plan {
    pub fn sql(statements: Vec<String>) -> Self {
        Plan {
            statements,
            ..Plan::default()
        }
    }
}

pub type Step<'a> = Pin<Box<dyn Future<Output = Plan> + 'a>>;

/// One kind of action: its name (for `SLUICE_TEST_ACTIONS` and the log), how often it is
/// drawn against the others, and whether it may run while an XA transaction is prepared and
/// not yet committed (one that writes rows or changes a schema may not: it would wait for the
/// prepared transaction's locks).
pub struct Action {
    pub name: &'static str,
    pub weight: u64,
    pub beside_xa: bool,
    pub run: for<'a> fn(&'a mut World) -> Step<'a>,
}

/// Where a stage's process is.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum State {
    Up,
    /// Stopped (SIGTERM) or killed (SIGKILL).
    Down,
    /// SIGSTOP: alive, holding its connections and its group membership, doing nothing.
    Paused,
}

pub struct Stage {
    pub p: CaptureProcess,
    pub state: State,
}

impl Stage {
    fn new(p: CaptureProcess) -> Self {
        Stage {
            p,
            state: State::Up,
        }
    }

    /// SIGTERM (its log kept for a failure's message) or SIGKILL, as `rng` draws.
    pub fn halt(&mut self, rng: &mut Rng) -> &'static str {
        if self.state == State::Paused {
            self.p.signal("-CONT");
        }
        self.state = State::Down;
        if rng.chance(50) {
            let (_, log) = self.p.stop();
            self.p.keep_log(log);
            "stopped"
        } else {
            self.p.kill();
            "killed"
        }
    }

    pub fn pause(&mut self) {
        self.p.signal("-STOP");
        self.state = State::Paused;
    }

    /// Running again, whatever it was: continued, or started.
    pub fn up(&mut self) {
        match self.state {
            State::Up => {}
            State::Paused => self.p.signal("-CONT"),
            State::Down => self.p.restart(),
        }
        self.state = State::Up;
    }
}

pub struct World {
    pub seed: u64,
    pub rng: Rng,
    pub step: u64,
    pub db: String,
    pub ch_db: String,
    pub my: mysql_async::Conn,
    /// The connection of the XA transactions, and the one prepared and not yet ended.
    pub xa: Option<mysql_async::Conn>,
    pub xa_open: Option<String>,
    pub tables: Vec<Table>,
    pub next_col: u32,
    /// The next `id` no row has had (rows moved or inserted in bulk take fresh ones).
    pub next_id: u64,
    pub capture: Stage,
    /// The capture's config without a `[snapshot]` section.
    pub capture_config: String,
    /// The first applier, then those that joined its group.
    pub appliers: Vec<Stage>,
    /// Every applier reaches ClickHouse through it.
    pub relay: Relay,
    pub target_cut: bool,
    pub dlq: String,
    pub group: String,
    /// Topics given more partitions: their counts now.
    pub partitions: BTreeMap<String, usize>,
    pub log: Vec<String>,
    /// Phrases of docs/apply-clickhouse.md's *What stops a table*.
    impossible: Vec<String>,
    /// Keys `sluice verify` found differing only in values marked as not held, at the last check.
    marked_keys: usize,
}

impl World {
    pub fn note(&mut self, what: impl std::fmt::Display) {
        self.log.push(format!("{}: {what}", self.step));
    }

    /// An applier of the pipeline's group, reaching ClickHouse through the relay.
    pub fn applier(&self) -> CaptureProcess {
        let marked: String = MARKED
            .iter()
            .map(|t| format!("\"{}.{t}\" = \"mark\"\n", self.db))
            .collect();
        CaptureProcess::apply_clickhouse_via(
            &self.relay.http_url(),
            &self.capture.p.prefix,
            &self.ch_db,
            &self.dlq,
            &self.group,
            &format!("[tables.unheld_tables]\n{marked}"),
        )
    }

    /// Whether the appliers mark the values table `name`'s target cannot hold.
    pub fn marked(&self, name: &str) -> bool {
        MARKED.contains(&name)
    }

    /// The capture's config with `snapshot` (a `[snapshot]` section, or nothing) after it.
    pub fn set_capture_snapshot(&mut self, snapshot: &str) {
        std::fs::write(
            self.capture.p.config_path(),
            format!("{}\n{snapshot}", self.capture_config),
        )
        .unwrap();
    }

    /// The prepared XA transaction committed (or, one in five, rolled back).
    pub async fn end_xa(&mut self) {
        let Some(xid) = self.xa_open.take() else {
            return;
        };
        let how = if self.rng.chance(20) {
            "ROLLBACK"
        } else {
            "COMMIT"
        };
        let sql = format!("XA {how} '{xid}'");
        let conn = self.xa.as_mut().expect("the XA connection");
        conn.query_drop(&sql)
            .await
            .unwrap_or_else(|e| panic!("seed {}: {sql}: {e}", self.seed));
        self.note(sql);
    }

    /// A stage that exited on its own is started again, as its container would be (an applier
    /// stops once after it stops a table ClickHouse refused rows of); the log says so, and a
    /// table stopped for a reason not listed fails the test at the end.
    fn restart_exited(&mut self) {
        if self.capture.state == State::Up && self.capture.p.exited() {
            self.capture.p.restart();
            self.note("capture had exited; restarted");
        }
        for i in 0..self.appliers.len() {
            if self.appliers[i].state == State::Up && self.appliers[i].p.exited() {
                self.appliers[i].p.restart();
                self.note(format!("applier {i} had exited; restarted"));
            }
        }
    }

    /// Every stage running and reaching its servers.
    async fn all_up(&mut self) {
        self.end_xa().await;
        if self.target_cut {
            self.relay.restore();
            self.target_cut = false;
            self.note("ClickHouse reachable again");
        }
        self.capture.up();
        for a in &mut self.appliers {
            a.up();
        }
        self.restart_exited();
    }

    /// The oracle: every table equal to its source or stopped for a listed reason, and no
    /// dead letter of any other table. `end`: keyless tables are given a key first (verify
    /// compares keyed tables); at a checkpoint they are left as they are, unverified.
    async fn check(&mut self, end: bool) -> (usize, BTreeMap<String, String>) {
        self.all_up().await;
        if end {
            // The rows are unique by (id, k).
            for i in 0..self.tables.len() {
                if self.tables[i].key == Key::None {
                    let sql = format!(
                        "ALTER TABLE `{}`.`{}` ADD PRIMARY KEY (id, k)",
                        self.db, self.tables[i].name
                    );
                    self.my
                        .query_drop(&sql)
                        .await
                        .unwrap_or_else(|e| panic!("seed {}: {sql}: {e}", self.seed));
                    self.note(&sql);
                    self.tables[i].key = Key::IdK;
                }
            }
        }
        let (code, report, err) =
            tokio::task::block_in_place(|| verify(&self.capture.p, &self.appliers[0].p, &[]));
        let letters = tokio::task::spawn_blocking({
            let dlq = self.dlq.clone();
            move || dead_letters(&dlq, usize::MAX)
        })
        .await
        .unwrap();
        let keyless: Vec<String> = self
            .tables
            .iter()
            .filter(|t| t.key == Key::None)
            .map(|t| format!("{}.{}", self.db, t.name))
            .collect();
        let mut problems: Vec<String> = Vec::new();
        let mut stopped: BTreeMap<String, String> = BTreeMap::new();
        let mut equal = 0;
        let mut marked_keys = 0;
        for t in report["tables"].as_array().cloned().unwrap_or_default() {
            let source = t["source"].as_str().unwrap_or_default().to_string();
            let result = t["result"].as_str().unwrap_or_default();
            let reason = t["reason"].as_str().unwrap_or_default().to_string();
            let not_compared = &t["columns_not_compared"];
            // Keys that differ only in values marked as not held: only where the appliers mark.
            let marked = t["marked"].as_array().map_or(0, Vec::len);
            if marked > 0 {
                let table = source.rsplit('.').next().unwrap_or_default();
                if !self.marked(table) {
                    problems.push(format!(
                        "{source}: {marked} key(s) marked, but its appliers do not mark"
                    ));
                }
            }
            marked_keys += marked;
            match result {
                "equal" if not_compared.as_array().is_none_or(|a| a.is_empty()) => equal += 1,
                "equal" => problems.push(format!(
                    "{source}: columns missing from the target: {not_compared}"
                )),
                "not verified" if reason.starts_with("the apply stage stopped this table") => {
                    if self.impossible.iter().any(|p| reason.contains(p.as_str())) {
                        stopped.insert(source, reason);
                    } else {
                        problems.push(format!(
                            "{source}: stopped for a reason not listed: {reason}"
                        ));
                    }
                }
                "not verified"
                    if reason.starts_with("no primary key") && keyless.contains(&source) => {}
                _ => problems.push(format!("{source}: {result}: {t:#}")),
            }
        }
        // A keyless table is not compared (its target is a change log): whether it is stopped,
        // and why, is read from the stopped tables' table.
        let rows = clickhouse_tsv(&format!(
            "SELECT target, argMax(reason, at) FROM {}._sluice_stopped GROUP BY target",
            self.ch_db
        ))
        .await
        .unwrap_or_default();
        for line in rows.lines() {
            let Some((target, reason)) = line.split_once('\t') else {
                continue;
            };
            let source = format!("{}.{target}", self.db);
            if !keyless.contains(&source) {
                continue;
            }
            if self.impossible.iter().any(|p| reason.contains(p.as_str())) {
                stopped.insert(
                    source,
                    format!("the apply stage stopped this table: {reason}"),
                );
            } else {
                problems.push(format!(
                    "{source}: stopped for a reason not listed: {reason}"
                ));
            }
        }
        if report["tables"].as_array().map_or(0, |a| a.len()) < self.tables.len() {
            problems.push(format!(
                "verify compared fewer tables than the {} made",
                self.tables.len()
            ));
        }
        for (_, reason) in &letters {
            let of_stopped = stopped.keys().any(|s| {
                let t = s.rsplit('.').next().unwrap_or_default();
                reason.starts_with(&format!("table {t} is stopped"))
                    || reason.starts_with(&format!("{s} row (version"))
                    || reason.contains(s.as_str())
            }) || self.resynced_letter(reason);
            if !of_stopped {
                problems.push(format!(
                    "a dead letter that is no stopped table's: {reason}"
                ));
            }
        }
        if !problems.is_empty() || (code != Some(0) && stopped.is_empty() && keyless.is_empty()) {
            // Each problem once, with how many times it was found.
            let mut counted: Vec<(String, usize)> = Vec::new();
            for p in problems {
                match counted.iter_mut().find(|(q, _)| *q == p) {
                    Some((_, n)) => *n += 1,
                    None => counted.push((p, 1)),
                }
            }
            let problems: Vec<String> = counted
                .into_iter()
                .map(|(p, n)| if n > 1 { format!("{p} ({n} times)") } else { p })
                .collect();
            let logs = self.keep_logs();
            panic!(
                "seed {} (SLUICE_TEST_STEPS={}): {}\nverify ({code:?}): {report:#}\n{err}\n\
                 steps:\n{}\n(the stages' logs: {logs})",
                self.seed,
                self.step + 1,
                problems.join("\n"),
                self.log.join("\n")
            );
        }
        self.note(format!(
            "checkpoint: {equal} of {} tables equal ({marked_keys} keys marked as not held), {} stopped",
            self.tables.len(),
            stopped.len()
        ));
        self.marked_keys = marked_keys;
        (equal, stopped)
    }

    /// A dead letter of a table that was stopped and taken up again since (the stop's reason
    /// was listed then): the letters of a stop stay on the topic after its table is resynced.
    fn resynced_letter(&self, reason: &str) -> bool {
        self.log
            .iter()
            .filter_map(|l| l.split_once(": resync of ").map(|(_, t)| t))
            .any(|t| {
                let t = t.split(' ').next().unwrap_or_default();
                reason.starts_with(&format!("table {t} is stopped")) || reason.contains(t)
            })
    }

    /// Stop every stage and keep their logs in files for a failure's message: the paths.
    fn keep_logs(&mut self) -> String {
        let dir = std::env::temp_dir();
        let mut paths = Vec::new();
        let seed = self.seed;
        let stages = std::iter::once(("capture".to_string(), &mut self.capture)).chain(
            self.appliers
                .iter_mut()
                .enumerate()
                .map(|(i, a)| (format!("apply{i}"), a)),
        );
        for (name, s) in stages {
            if s.state == State::Paused {
                s.up();
            }
            let (_, text) = s.p.stop();
            let path = dir.join(format!("sluice-random-{seed}-{name}.log"));
            std::fs::write(&path, text).unwrap();
            paths.push(path.display().to_string());
        }
        paths.join(", ")
    }
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

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|s| s.parse().ok())
}

/// The actions drawn: the registry, or those `SLUICE_TEST_ACTIONS` names.
fn drawn() -> Vec<&'static Action> {
    let only = std::env::var("SLUICE_TEST_ACTIONS").unwrap_or_default();
    let only: Vec<&str> = only
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .collect();
    for name in &only {
        assert!(
            actions::REGISTRY.iter().any(|a| a.name == *name),
            "SLUICE_TEST_ACTIONS: no action {name:?}; the actions: {}",
            actions::REGISTRY
                .iter()
                .map(|a| a.name)
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    actions::REGISTRY
        .iter()
        .filter(|a| only.is_empty() || only.contains(&a.name))
        .collect()
}

/// Run one scenario against `SLUICE_CLICKHOUSE_URL`: setup, steps, checkpoints, the end.
pub async fn run() {
    // `SLUICE_SCENARIO_SEED` and `SLUICE_SCENARIO_STEPS` (this test's own, so that a suite can
    // pin it without pinning the other seeded tests) come before the shared names.
    let seed = env_u64("SLUICE_SCENARIO_SEED").unwrap_or_else(crate::seed);
    let steps_given = env_u64("SLUICE_SCENARIO_STEPS").or_else(|| env_u64("SLUICE_TEST_STEPS"));
    let (steps, seconds) = match (steps_given, env_u64("SLUICE_TEST_SECONDS")) {
        (None, None) => (u64::MAX, Some(120)),
        (steps, seconds) => (steps.unwrap_or(u64::MAX), seconds),
    };
    let check_every = env_u64("SLUICE_TEST_CHECK_EVERY").unwrap_or(100);
    let kinds = drawn();
    println!(
        "SLUICE_TEST_SEED={seed} (steps: {}, seconds: {}, ClickHouse {})",
        if steps == u64::MAX {
            "any".to_string()
        } else {
            steps.to_string()
        },
        seconds.map_or("any".to_string(), |s| s.to_string()),
        crate::clickhouse_url()
    );
    let started = Instant::now();
    let db = unique("sluice_t_random");
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
    let capture = CaptureProcess::spawn(CaptureProcess::config(&db, &binlog_end().await, ""));
    let capture_config = std::fs::read_to_string(capture.config_path()).unwrap();
    let relay = Relay::to(&crate::clickhouse_url()).await;
    let mut w = World {
        seed,
        rng: Rng(seed),
        step: 0,
        db: db.clone(),
        ch_db: ch_db.clone(),
        my,
        xa: None,
        xa_open: None,
        tables: Vec::new(),
        next_col: 0,
        next_id: 1000,
        capture: Stage::new(capture),
        capture_config,
        appliers: Vec::new(),
        relay,
        target_cut: false,
        dlq: unique("dlq"),
        group: unique("g"),
        partitions: BTreeMap::new(),
        log: Vec::new(),
        impossible: impossible(),
        marked_keys: 0,
    };
    let first = w.applier();
    w.appliers.push(Stage::new(first));
    for i in 0..4 {
        let (t, sql) =
            model::new_table(&mut w.my, &mut w.rng, &db, format!("t{i}"), &mut w.next_col).await;
        w.my.query_drop(&sql)
            .await
            .unwrap_or_else(|e| panic!("seed {seed}: {sql}: {e}"));
        w.log.push(format!("-: {sql}"));
        w.tables.push(t);
    }
    let total: u64 = kinds.iter().map(|a| a.weight).sum();
    let mut counts: BTreeMap<&str, u64> = BTreeMap::new();
    let mut checkpoints = 0;
    let mut ran = 0;
    for step in 0..steps {
        if seconds.is_some_and(|s| started.elapsed() >= Duration::from_secs(s)) {
            break;
        }
        w.step = step;
        ran = step + 1;
        w.restart_exited();
        let mut roll = w.rng.below(total);
        let action = kinds
            .iter()
            .find(|a| {
                if roll < a.weight {
                    true
                } else {
                    roll -= a.weight;
                    false
                }
            })
            .expect("a weight drawn");
        if !action.beside_xa {
            w.end_xa().await;
        }
        *counts.entry(action.name).or_default() += 1;
        let plan = (action.run)(&mut w).await;
        execute(&mut w, plan).await;
        if w.rng.chance(20) {
            tokio::time::sleep(Duration::from_millis(w.rng.below(400))).await;
        }
        if check_every > 0 && (step + 1) % check_every == 0 && step + 1 < steps {
            w.check(false).await;
            checkpoints += 1;
        }
    }
    w.step = ran;
    let (equal, stopped) = w.check(true).await;
    println!(
        "seed {seed}: {ran} steps (SLUICE_TEST_STEPS={ran} replays them) in {:.0} s ({checkpoints} checkpoints and the end; actions: {}); \
         {equal} of {} tables equal to their source ({} keys differing only in values marked as not held), {} stopped ({} taken up again on the way){}",
        started.elapsed().as_secs_f64(),
        counts
            .iter()
            .map(|(a, n)| format!("{a} {n}"))
            .collect::<Vec<_>>()
            .join(", "),
        w.tables.len(),
        w.marked_keys,
        stopped.len(),
        w.log.iter().filter(|l| l.contains(": resync of ")).count(),
        stopped
            .iter()
            .map(|(t, r)| format!("\n  {t}: {r}"))
            .collect::<String>()
    );
    w.capture.p.stop_ok();
    for a in &mut w.appliers {
        a.p.stop_ok();
    }
    clickhouse_tsv(&format!("DROP DATABASE {ch_db}"))
        .await
        .unwrap();
    w.my.query_drop(format!("DROP DATABASE `{db}`"))
        .await
        .unwrap();
}

/// Run a step's statements; on a refusal the server may make, the rest is left out and the
/// model unchanged.
async fn execute(w: &mut World, plan: Plan) {
    let mut failed = false;
    for sql in &plan.statements {
        match w.my.query_drop(sql).await {
            Ok(()) => w.note(sql),
            Err(e) if plan.may_fail => {
                w.note(format!("{sql} -- refused: {e}"));
                failed = true;
                break;
            }
            Err(e) => panic!(
                "seed {} step {}: {sql}: {e}\n{}",
                w.seed,
                w.step,
                w.log.join("\n")
            ),
        }
    }
    if plan.statements.iter().any(|s| s.starts_with("SET SESSION")) {
        w.my.query_drop("SET SESSION sql_mode = DEFAULT")
            .await
            .unwrap();
    }
    if !failed {
        if let Some(f) = plan.after {
            f(&mut w.tables);
        }
    }
}
