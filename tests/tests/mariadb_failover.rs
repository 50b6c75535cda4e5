//! A source's binlog history changing under the capture, with MariaDB servers of the test's own
//! (the shared Kafka and ClickHouse, the real binaries):
//!
//! - a fail-over: the capture, reading a primary, is pointed at its replica, and later the
//!   primary dies and the replica is promoted; the mirror in ClickHouse ends equal to the
//!   promoted server (primary and replica with GTIDs, strict mode, log_slave_updates);
//! - `RESET MASTER`, while the capture is stopped and while it runs: refused, with the next
//!   generation named, even though a binlog file of the checkpoint's name exists again.
//!
//! The primary's binlog is three files ahead of the replica's, so its positions (and versions
//! of the same generation) are above every one of the replica's: resuming there without the
//! next generation would leave the mirror with the primary's older rows.

use std::time::{Duration, Instant};

use mysql_async::prelude::Queryable;
use sluice_tests::capture::{clickhouse_tsv, last_checkpoint, CaptureProcess};
use sluice_tests::private_mariadb::PrivateMariaDb;
use sluice_tests::{mysql_url, unique};

/// Inserts, updates and deletes of table `t`, one per transaction, from a seeded generator;
/// it carries on from one server to the next.
struct Writer {
    db: String,
    next_id: i64,
    alive: Vec<i64>,
    rng: u64,
}

impl Writer {
    fn new(db: &str, seed: u64) -> Self {
        Self {
            db: db.to_string(),
            next_id: 1,
            alive: Vec::new(),
            rng: seed | 1,
        }
    }

    fn next(&mut self) -> u64 {
        // xorshift64
        self.rng ^= self.rng << 13;
        self.rng ^= self.rng >> 7;
        self.rng ^= self.rng << 17;
        self.rng
    }

    async fn run(&mut self, c: &mut mysql_async::Conn, n: usize) {
        let t = format!("`{}`.t", self.db);
        for _ in 0..n {
            let r = self.next();
            match r % 5 {
                0..=1 => {
                    let id = self.next_id;
                    self.next_id += 1;
                    c.exec_drop(
                        format!("INSERT INTO {t} (id, v, n) VALUES (?, ?, 0)"),
                        (id, format!("v{id}-{}", r % 1000)),
                    )
                    .await
                    .unwrap();
                    self.alive.push(id);
                }
                2..=3 if !self.alive.is_empty() => {
                    let id = self.alive[(r / 7) as usize % self.alive.len()];
                    c.exec_drop(
                        format!("UPDATE {t} SET n = n + 1, v = ? WHERE id = ?"),
                        (format!("u{}", r % 10_000), id),
                    )
                    .await
                    .unwrap();
                }
                _ if !self.alive.is_empty() => {
                    let i = (r / 7) as usize % self.alive.len();
                    let id = self.alive.swap_remove(i);
                    c.exec_drop(format!("DELETE FROM {t} WHERE id = ?"), (id,))
                        .await
                        .unwrap();
                }
                _ => {}
            }
        }
    }
}

async fn source_tsv(c: &mut mysql_async::Conn, db: &str) -> String {
    let rows: Vec<(i64, String, i64)> = c
        .query(format!("SELECT id, v, n FROM `{db}`.t ORDER BY id"))
        .await
        .unwrap();
    rows.iter()
        .map(|(id, v, n)| format!("{id}\t{v}\t{n}\n"))
        .collect()
}

async fn mirror_tsv(ch_db: &str) -> String {
    clickhouse_tsv(&format!(
        "SELECT toInt64(id), v, toInt64(n) FROM {ch_db}.t FINAL WHERE _deleted = 0 ORDER BY id"
    ))
    .await
    .unwrap_or_default()
}

/// Wait until the mirror equals the server's table, or fail showing both.
async fn converge(server: &PrivateMariaDb, db: &str, ch_db: &str, limit: Duration) {
    let want = source_tsv(&mut server.conn().await, db).await;
    let deadline = Instant::now() + limit;
    loop {
        let got = mirror_tsv(ch_db).await;
        if got == want {
            return;
        }
        if Instant::now() > deadline {
            let (g, w): (Vec<&str>, Vec<&str>) = (got.lines().collect(), want.lines().collect());
            let missing: Vec<_> = w.iter().filter(|l| !g.contains(l)).take(5).collect();
            let extra: Vec<_> = g.iter().filter(|l| !w.contains(l)).take(5).collect();
            panic!(
                "mirror {ch_db} != {db}: {} vs {} rows; in the source only {missing:?}, in the \
                 mirror only {extra:?}",
                g.len(),
                w.len()
            );
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

/// On `server`: a new database with the writer's table, its ClickHouse database, and a
/// capture of it from the binlog position before them. Returns the database, the ClickHouse
/// database, the binlog file the capture starts in, and the capture.
async fn table_and_capture(
    c: &mut mysql_async::Conn,
    server: &PrivateMariaDb,
    name: &str,
) -> (String, String, String, CaptureProcess) {
    let db = unique(name);
    let ch_db = format!("{db}_ch");
    clickhouse_tsv(&format!("CREATE DATABASE {ch_db}"))
        .await
        .unwrap();
    let (file, pos) = sluice_tests::capture::binlog_status(c).await;
    c.query_drop(format!("CREATE DATABASE `{db}`"))
        .await
        .unwrap();
    c.query_drop(format!(
        "CREATE TABLE `{db}`.t (id INT PRIMARY KEY, v VARCHAR(40) NOT NULL, n INT NOT NULL)"
    ))
    .await
    .unwrap();
    let (text, connector, prefix) = CaptureProcess::config(&db, &format!("{file}:{pos}"), "");
    let cap = CaptureProcess::spawn((text.replace(&mysql_url(), &server.url()), connector, prefix));
    (db, ch_db, file, cap)
}

/// Wait until the replica has applied everything the primary has written.
async fn caught_up(primary: &PrivateMariaDb, replica: &PrivateMariaDb) {
    let pos: String = primary
        .conn()
        .await
        .query_first("SELECT @@GLOBAL.gtid_binlog_pos")
        .await
        .unwrap()
        .unwrap();
    let waited: Option<i64> = replica
        .conn()
        .await
        .exec_first("SELECT MASTER_GTID_WAIT(?, 60)", (pos.clone(),))
        .await
        .unwrap();
    assert_eq!(
        waited,
        Some(0),
        "the replica did not reach {pos} within 60 s"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_capture_follows_a_fail_over_to_the_promoted_replica_by_gtid() {
    let Some(primary) = PrivateMariaDb::start(11) else {
        eprintln!("skipped: no mariadbd here (deploy/testbed.sh start mariadb installs it)");
        return;
    };
    let mut primary = primary;
    let replica = PrivateMariaDb::start(12).unwrap();
    let seed = sluice_tests::seed();

    // The primary's binlog files are numbered ahead of the replica's.
    let mut p = primary.conn().await;
    for _ in 0..3 {
        p.query_drop("FLUSH BINARY LOGS").await.unwrap();
    }
    replica.root_sql(&format!(
        "CHANGE MASTER TO MASTER_HOST = '127.0.0.1', MASTER_PORT = {}, MASTER_USER = 'sluice', \
         MASTER_PASSWORD = 'sluice', MASTER_USE_GTID = slave_pos; START SLAVE;",
        primary.port
    ));

    let (db, ch_db, _, mut cap) = table_and_capture(&mut p, &primary, "sluice_t_failover").await;
    let mut apply = CaptureProcess::apply_clickhouse(&cap.prefix, &ch_db, &unique("dlq"));

    // 1. The capture reads the primary.
    let mut w = Writer::new(&db, seed);
    w.run(&mut p, 300).await;
    converge(&primary, &db, &ch_db, Duration::from_secs(90)).await;

    // 2. A replica that lacks transactions the capture published is refused, with them named.
    replica.root_sql("STOP SLAVE");
    w.run(&mut p, 20).await;
    converge(&primary, &db, &ch_db, Duration::from_secs(60)).await;
    cap.kill();
    cap.edit_config(&primary.url(), &replica.url());
    cap.restart();
    let (code, log) = cap.wait(Duration::from_secs(60));
    assert_eq!(code, Some(1), "{log}");
    // (named as a range, or as the one GTID when a single transaction is missing: how many
    // the writer's statements made depends on the seed, as a statement changing no row writes
    // none)
    assert!(
        log.contains("has not got domain 0 seq") || log.contains("has not got 0-"),
        "{log}"
    );
    assert!(log.contains("log_slave_updates"), "{log}");

    // 3. The replica catches up, and the capture goes on from it. Its dump, opened by GTID
    // set, is cut before it reads any commit: it opens it again by the set (the start of the
    // replica's file is not where it read to).
    replica.root_sql("START SLAVE");
    caught_up(&primary, &replica).await;
    cap.restart();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let mut rc = replica.conn().await;
    let ids: Vec<u64> = rc
        .query("SELECT ID FROM information_schema.PROCESSLIST WHERE COMMAND LIKE 'Binlog Dump%'")
        .await
        .unwrap();
    assert!(!ids.is_empty(), "the capture reads the replica");
    for id in ids {
        rc.query_drop(format!("KILL {id}")).await.unwrap();
    }
    drop(rc);
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(
        !cap.exited(),
        "a dump by GTID set cut before its first commit is opened again:\n{}",
        cap.stop().1
    );
    // Then killed and started again while the primary is written.
    cap.kill();
    let writer = {
        let mut w = w;
        let mut p = primary.conn().await;
        tokio::spawn(async move {
            w.run(&mut p, 400).await;
            w
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    cap.restart();
    let mut w = writer.await.unwrap();

    // 4. The primary dies; the replica is promoted and written to.
    caught_up(&primary, &replica).await;
    converge(&primary, &db, &ch_db, Duration::from_secs(90)).await;
    drop(p);
    primary.kill();
    replica.root_sql("STOP SLAVE; RESET SLAVE ALL; SET GLOBAL read_only = 0;");
    let mut r = replica.conn().await;
    w.run(&mut r, 300).await;
    converge(&replica, &db, &ch_db, Duration::from_secs(90)).await;

    let checkpoint = last_checkpoint(&cap.connector).expect("a checkpoint");
    assert_eq!(checkpoint["server_id"], 12, "{checkpoint}");
    assert_eq!(checkpoint["generation"], 1, "{checkpoint}");
    let log = cap.stop_ok();
    assert!(log.contains("resuming from the GTID set"), "{log}");
    apply.stop_ok();
}

#[tokio::test(flavor = "multi_thread")]
async fn reset_master_is_refused_with_the_next_generation_named() {
    let Some(server) = PrivateMariaDb::start(21) else {
        eprintln!("skipped: no mariadbd here (deploy/testbed.sh start mariadb installs it)");
        return;
    };
    let seed = sluice_tests::seed();
    let mut c = server.conn().await;
    let (db, ch_db, file, mut cap) = table_and_capture(&mut c, &server, "sluice_t_reset").await;
    assert_eq!(file, "mysql-bin.000001");
    let prefix = cap.prefix.clone();
    let mut apply = CaptureProcess::apply_clickhouse(&prefix, &ch_db, &unique("dlq"));
    let mut w = Writer::new(&db, seed);
    w.run(&mut c, 200).await;
    converge(&server, &db, &ch_db, Duration::from_secs(90)).await;

    // 1. Stopped, RESET MASTER, written again: mysql-bin.000001 exists again, with other
    // events at other offsets. The capture must not read it as its own.
    cap.stop_ok();
    c.query_drop("RESET MASTER").await.unwrap();
    let t = format!("`{db}`.t");
    c.query_drop(format!("UPDATE {t} SET n = n + 100"))
        .await
        .unwrap();
    for k in 0..10 {
        c.exec_drop(
            format!("INSERT INTO {t} (id, v, n) VALUES (?, 'after reset', 1)"),
            (100_000 + k,),
        )
        .await
        .unwrap();
    }
    cap.restart();
    let (code, log) = cap.wait(Duration::from_secs(60));
    assert_eq!(code, Some(1), "{log}");
    assert!(log.contains("began again"), "{log}");
    assert!(log.contains("mysql.generation = 1"), "{log}");

    // 2. The remedy: a new connector in generation 1 that snapshots the tables. Its rows are
    // at positions below the old connector's, so only the generation puts them above.
    let (text, connector, _) =
        CaptureProcess::config(&db, "end", "[snapshot]\nmode = \"snapshot+stream\"\n");
    let text = text
        .replace(&mysql_url(), &server.url())
        .replace("[mysql]\n", "[mysql]\ngeneration = 1\n")
        .replacen(&text_prefix(&text), &prefix, 1);
    let mut cap = CaptureProcess::spawn((text, connector, prefix.clone()));
    converge(&server, &db, &ch_db, Duration::from_secs(90)).await;
    w.run(&mut c, 50).await;
    converge(&server, &db, &ch_db, Duration::from_secs(90)).await;

    // 3. RESET MASTER under the running capture: it stops at its next (re)connection or
    // read, naming the generation after its own.
    c.query_drop("RESET MASTER").await.unwrap();
    w.run(&mut c, 20).await;
    let (code, log) = cap.wait(Duration::from_secs(120));
    assert_eq!(code, Some(1), "{log}");
    assert!(log.contains("began again"), "{log}");
    assert!(log.contains("mysql.generation = 2"), "{log}");
    apply.stop_ok();
}

/// The topic prefix a capture config names.
fn text_prefix(text: &str) -> String {
    let line = text
        .lines()
        .find(|l| l.starts_with("prefix = "))
        .expect("a prefix line");
    line.trim_start_matches("prefix = ")
        .trim_matches('"')
        .to_string()
}
