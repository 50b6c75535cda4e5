//! Schema changes that change the rows already in a table without a row event, class by class:
//! the capture reads the table again after them (a rebuild) and the mirror ends equal to the
//! source, cell for cell, as `sluice verify` sees it (its canonical rendering on both servers).
//! Run against ClickHouse 18.16 and 26.9 (`tests/run.sh` runs this file twice).

use std::time::{Duration, Instant};

use mysql_async::prelude::Queryable;
use sluice_tests::capture::{clickhouse_tsv, dead_letters, verify, CaptureProcess};
use sluice_tests::to_clickhouse::*;
use sluice_tests::unique;

/// A source database with the pipeline into its mirror running; `tables` made and filled first.
struct Bed {
    db: String,
    ch_db: String,
    dlq: String,
    my: mysql_async::Conn,
    capture: CaptureProcess,
    apply: CaptureProcess,
}

impl Bed {
    async fn start(name: &str, tables: &[String]) -> Self {
        let (db, ch_db, capture) = pipeline(name, "_m").await;
        let mut my = mysql().await;
        my.query_drop(format!("CREATE DATABASE `{db}`"))
            .await
            .unwrap();
        for sql in tables {
            my.query_drop(sql.replace("{db}", &db))
                .await
                .unwrap_or_else(|e| panic!("{sql}: {e}"));
        }
        let dlq = unique("dlq");
        let apply = CaptureProcess::apply_clickhouse(&capture.prefix, &ch_db, &dlq);
        Bed {
            db,
            ch_db,
            dlq,
            my,
            capture,
            apply,
        }
    }

    async fn sql(&mut self, statements: &[&str]) {
        for s in statements {
            let s = s.replace("{db}", &self.db);
            self.my
                .query_drop(&s)
                .await
                .unwrap_or_else(|e| panic!("{s}: {e}"));
        }
    }

    /// Wait until target table `t` holds `n` rows (a mirror's deleted ones not counted: 18.16
    /// keeps them, marked, under `FINAL`); else fail with what it holds and both stages' logs.
    async fn rows(&mut self, t: &str, n: u64) {
        let db = &self.ch_db;
        let count = || async {
            let marked = format!(
                "SELECT count() FROM system.columns WHERE database = '{db}' AND table = '{t}' \
                 AND name = '_deleted'"
            );
            let live = match clickhouse_tsv(&marked).await.as_deref().map(str::trim) {
                Ok("1") => "WHERE _deleted = 0",
                _ => "",
            };
            let sql = format!("SELECT count() FROM {db}.`{t}` FINAL {live}");
            clickhouse_tsv(&sql).await.unwrap_or_else(|e| e.to_string())
        };
        let deadline = Instant::now() + Duration::from_secs(90);
        while count().await.trim() != n.to_string() {
            if Instant::now() > deadline {
                let all = format!("SELECT * FROM {}.`{t}` FINAL", self.ch_db);
                let held = clickhouse_tsv(&all).await.unwrap_or_else(|e| e.to_string());
                let (capture, apply) = (self.capture.stop().1, self.apply.stop().1);
                panic!(
                    "{t}: {} rows, not {n}; it holds:\n{held}\ncapture's log:\n{capture}\napply's log:\n{apply}",
                    count().await.trim()
                );
            }
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    }

    /// `sluice verify` finds every table equal (it waits for the capture's rebuilds and the
    /// applier to catch up), and nothing was dead-lettered.
    async fn equal(&mut self) {
        let (cap, a) = (&self.capture, &self.apply);
        let (code, report, err) = tokio::task::block_in_place(|| verify(cap, a, &[]));
        if code != Some(0) {
            let (capture, apply) = (self.capture.stop().1, self.apply.stop().1);
            panic!(
                "verify: {code:?}\n{report:#}\n{err}\ncapture's log:\n{capture}\napply's log:\n{apply}"
            );
        }
        let letters = tokio::task::spawn_blocking({
            let dlq = self.dlq.clone();
            move || dead_letters(&dlq, 1)
        })
        .await
        .unwrap();
        assert!(letters.is_empty(), "{letters:?}");
    }

    async fn finish(mut self) {
        self.capture.stop_ok();
        self.apply.stop_ok();
        ch_exec(format!("DROP DATABASE {}", self.ch_db)).await;
        self.my
            .query_drop(format!("DROP DATABASE `{}`", self.db))
            .await
            .unwrap();
    }
}

/// Class 1-3: a column added with a default (in every form a statement can give it), NOT NULL
/// without one (the type's implicit value), or generated: the rows already there read what the
/// server stored in them, not the statement's text.
#[tokio::test(flavor = "multi_thread")]
async fn added_columns_hold_what_the_server_stored_in_the_rows_there() {
    let mut b = Bed::start(
        "sluice_t_rb_add",
        &[
            "CREATE TABLE `{db}`.t (id INT PRIMARY KEY, x INT)".into(),
            "INSERT INTO `{db}`.t VALUES (1, 10), (2, 20), (3, NULL)".into(),
        ],
    )
    .await;
    b.rows("t", 3).await;
    b.sql(&[
        r"ALTER TABLE `{db}`.t ADD tm TIME DEFAULT '10:00', ADD y YEAR DEFAULT 99,
            ADD st SET('r','g','b') DEFAULT 'g,r', ADD en ENUM('low','mid') DEFAULT 'MID',
            ADD ch CHAR(5) DEFAULT 'ab  ', ADD bn BINARY(4) DEFAULT 'ab', ADD i INT DEFAULT 2.7,
            ADD dc DECIMAL(6,2) DEFAULT 1.555, ADD e1 VARCHAR(9) DEFAULT 'a\%b',
            ADD e2 VARCHAR(9) DEFAULT 'a\bc', ADD d DATE DEFAULT '20240102',
            ADD wide DECIMAL(25,3) DEFAULT 12.5, ADD dt DATETIME(6) DEFAULT '2024-01-02 03:04:05.5',
            ADD bo BOOLEAN DEFAULT TRUE",
        "INSERT INTO `{db}`.t (id, x) VALUES (4, 40)",
        "ALTER TABLE `{db}`.t ADD nt TIME NOT NULL, ADD nd DATE NOT NULL, ADD ni INT NOT NULL,
            ADD nb BINARY(3) NOT NULL, ADD nv VARCHAR(5) NOT NULL",
        "ALTER TABLE `{db}`.t ADD g INT AS (id * 2) PERSISTENT",
        "INSERT INTO `{db}`.t (id, x, nt, nd, ni, nb, nv) VALUES (5, 50, '01:02:03', \
         '2025-05-05', 5, 'xyz', 'five')",
    ])
    .await;
    b.rows("t", 5).await;
    b.equal().await;
    b.finish().await;
}

/// Class 4: a MODIFY that rewrites stored values (a narrower type, fewer fractional digits, a
/// scale cut, NULL to NOT NULL and a truncation under a permissive `sql_mode`): the values the
/// server rewrote come with the rows read again.
#[tokio::test(flavor = "multi_thread")]
async fn narrowing_changes_leave_the_values_the_server_rewrote() {
    let mut b = Bed::start(
        "sluice_t_rb_narrow",
        &[
            "CREATE TABLE `{db}`.t (id INT PRIMARY KEY, f DOUBLE, tm TIME(3), dt DATETIME(6), \
             dc DECIMAL(8,3), s VARCHAR(20), n INT, sm INT)"
                .into(),
            "INSERT INTO `{db}`.t VALUES \
             (1, 1.0000000001, '10:11:12.789', '2024-01-02 03:04:05.678901', 12.345, \
              'a long text here', NULL, 100000), \
             (2, -2.5e300, '-01:00:00.5', '2024-01-02 03:04:05.5', -1.005, 'short', 7, -5)"
                .into(),
        ],
    )
    .await;
    b.rows("t", 2).await;
    b.sql(&[
        "SET SESSION sql_mode = ''",
        "ALTER TABLE `{db}`.t MODIFY f FLOAT, MODIFY tm TIME, MODIFY dt DATETIME, \
         MODIFY dc DECIMAL(8,1), MODIFY s VARCHAR(5), MODIFY n INT NOT NULL, MODIFY sm SMALLINT",
        "SET SESSION sql_mode = DEFAULT",
        "INSERT INTO `{db}`.t VALUES (3, 3.5, '01:01:01', '2024-03-03 03:03:03', 1.5, 'abc', 3, 3)",
    ])
    .await;
    b.rows("t", 3).await;
    b.equal().await;
    b.finish().await;
}

/// Class 5: statements read while the applier was down, then a later one of the same column:
/// the column and its values arrive.
#[tokio::test(flavor = "multi_thread")]
async fn statements_read_while_the_applier_was_down_arrive_with_their_values() {
    let mut b = Bed::start(
        "sluice_t_rb_down",
        &[
            "CREATE TABLE `{db}`.t (id INT PRIMARY KEY, x INT)".into(),
            "INSERT INTO `{db}`.t VALUES (1, 1), (2, 2)".into(),
        ],
    )
    .await;
    b.rows("t", 2).await;
    b.apply.stop_ok();
    b.sql(&[
        "ALTER TABLE `{db}`.t ADD c INT NOT NULL DEFAULT 7",
        "ALTER TABLE `{db}`.t MODIFY c BIGINT NOT NULL DEFAULT 7",
        "INSERT INTO `{db}`.t VALUES (3, 3, 8000000000)",
    ])
    .await;
    b.apply.restart();
    b.rows("t", 3).await;
    b.equal().await;
    b.finish().await;
}

/// Class 6: the primary key changed (other columns; a keyless table given one): the mirror is
/// made again, ordered by the new key, and two rows that shared the old key are both there; a
/// DELETE after the change deletes.
#[tokio::test(flavor = "multi_thread")]
async fn a_new_primary_key_makes_the_mirror_again() {
    let mut b = Bed::start(
        "sluice_t_rb_key",
        &[
            "CREATE TABLE `{db}`.t (k INT NOT NULL, v INT NOT NULL, s VARCHAR(9), PRIMARY KEY (k))"
                .into(),
            "INSERT INTO `{db}`.t VALUES (1, 1, 'a'), (2, 1, 'b')".into(),
            "CREATE TABLE `{db}`.nk (a INT NOT NULL, b VARCHAR(9))".into(),
            "INSERT INTO `{db}`.nk VALUES (1, 'x'), (2, 'y')".into(),
        ],
    )
    .await;
    b.rows("t", 2).await;
    b.sql(&[
        "ALTER TABLE `{db}`.t DROP PRIMARY KEY, ADD PRIMARY KEY (k, v)",
        "INSERT INTO `{db}`.t VALUES (1, 2, 'c')",
        "ALTER TABLE `{db}`.nk ADD PRIMARY KEY (a)",
        "DELETE FROM `{db}`.nk WHERE a = 2",
        "INSERT INTO `{db}`.nk VALUES (3, 'z')",
    ])
    .await;
    b.rows("t", 3).await;
    b.rows("nk", 2).await;
    b.equal().await;
    b.finish().await;
}

/// Class 7: a table dropped and made again under its name: the mirror holds the new table's
/// rows and columns only (the dropped one's, which `tables.drop = "keep"` kept, are set aside
/// off a cluster); and a column added as UUID while both stages were down (class 8) arrives as
/// the server prints it.
#[tokio::test(flavor = "multi_thread")]
async fn a_table_made_again_and_a_type_added_while_both_stages_were_down() {
    let mut b = Bed::start(
        "sluice_t_rb_again",
        &[
            "CREATE TABLE `{db}`.t (id INT PRIMARY KEY, old_col INT)".into(),
            "INSERT INTO `{db}`.t VALUES (1, 1), (2, 2), (3, 3)".into(),
            "CREATE TABLE `{db}`.u (id INT PRIMARY KEY)".into(),
            "INSERT INTO `{db}`.u VALUES (1), (2)".into(),
        ],
    )
    .await;
    b.rows("t", 3).await;
    b.rows("u", 2).await;
    b.sql(&[
        "DROP TABLE `{db}`.t",
        "CREATE TABLE `{db}`.t (id INT PRIMARY KEY, new_col VARCHAR(9))",
        "INSERT INTO `{db}`.t VALUES (7, 'seven')",
    ])
    .await;
    b.rows("t", 1).await;
    let columns = text(&format!(
        "SELECT name FROM system.columns WHERE database = '{}' AND table = 't' ORDER BY name",
        b.ch_db
    ))
    .await;
    assert!(
        columns.contains("new_col") && !columns.contains("old_col"),
        "{columns}"
    );
    // A UUID column added while both stages are down (MariaDB 10.7+).
    b.capture.stop_ok();
    b.apply.stop_ok();
    let uuid =
        b.my.query_drop(format!(
            "ALTER TABLE `{}`.u ADD g UUID DEFAULT '6ccd780c-baba-1026-9564-5b8c656024db'",
            b.db
        ))
        .await;
    if uuid.is_ok() {
        b.sql(&["INSERT INTO `{db}`.u VALUES (3, 'ffffffff-0000-1111-2222-333333333333')"])
            .await;
    }
    b.capture.restart();
    b.apply.restart();
    if uuid.is_ok() {
        b.rows("u", 3).await;
    }
    b.equal().await;
    b.finish().await;
}

/// Class 7, read while behind: a table renamed to a name that a later table takes (dropped and
/// made again), all read by a capture that was down. The rename goes out with the schema the
/// renamed table had (not the later table's, which information_schema shows by then), so its
/// statements and rows apply, and the later table replaces it.
#[tokio::test(flavor = "multi_thread")]
async fn a_rename_read_behind_the_server_keeps_the_renamed_tables_schema() {
    let mut b = Bed::start(
        "sluice_t_rb_behind",
        &[
            "CREATE TABLE `{db}`.a (id INT PRIMARY KEY, x INT)".into(),
            "INSERT INTO `{db}`.a VALUES (1, 1), (2, 2)".into(),
        ],
    )
    .await;
    b.rows("a", 2).await;
    b.capture.stop_ok();
    b.sql(&[
        "RENAME TABLE `{db}`.a TO `{db}`.b",
        "CREATE INDEX ix ON `{db}`.b (x)",
        "INSERT INTO `{db}`.b VALUES (3, 3)",
        "DROP TABLE `{db}`.b",
        "CREATE TABLE `{db}`.b (id INT PRIMARY KEY, y VARCHAR(9), z DATE)",
        "INSERT INTO `{db}`.b VALUES (7, 'seven', '2024-07-07')",
    ])
    .await;
    b.capture.restart();
    b.rows("b", 1).await;
    b.equal().await;
    b.finish().await;
}

/// Two tables swapped by one RENAME, the one renamed in changed (a type whose values are
/// rewritten, a column renamed and retyped, one added and then retyped): read by an applier
/// that was down through all of it, in one burst.
#[tokio::test(flavor = "multi_thread")]
async fn a_swap_then_alters_read_in_one_burst_end_equal() {
    let mut b = Bed::start(
        "sluice_t_rb_swap",
        &[
            "CREATE TABLE `{db}`.t0 (id INT NOT NULL, k INT NOT NULL DEFAULT 0, \
             c1 SET('r','g','b') NULL DEFAULT 'g,r', c2 YEAR NOT NULL DEFAULT 99, PRIMARY KEY (id))"
                .into(),
            "CREATE TABLE `{db}`.t1 (id INT NOT NULL, k INT NOT NULL DEFAULT 0, \
             c3 VARCHAR(15) NULL DEFAULT '10.0.0.1', PRIMARY KEY (id))"
                .into(),
            "INSERT INTO `{db}`.t0 VALUES (33, 0, 'g,r', 2072), (1, 0, 'b', 1948), (24, 1, 'b', 2115)"
                .into(),
            "INSERT INTO `{db}`.t1 VALUES (25, 1, '195.211.5.82'), (5, 0, NULL)".into(),
        ],
    )
    .await;
    b.rows("t0", 3).await;
    b.rows("t1", 2).await;
    b.apply.kill();
    b.sql(&[
        "ALTER TABLE `{db}`.t1 ADD COLUMN c7 BINARY(4) NOT NULL DEFAULT 0x6162, \
         ADD COLUMN c8 TIME NOT NULL DEFAULT '26:29:34' FIRST",
        "INSERT INTO `{db}`.t0 VALUES (39, 0, 'r', 2067)",
        "RENAME TABLE `{db}`.t0 TO `{db}`.swap_tmp, `{db}`.t1 TO `{db}`.t0, \
         `{db}`.swap_tmp TO `{db}`.t1",
        "SET SESSION sql_mode = ''",
        "ALTER TABLE `{db}`.t1 MODIFY COLUMN c1 DECIMAL(25,3) NULL, CHANGE COLUMN c2 r9 TIME NULL, \
         ADD COLUMN c10 CHAR(5) NULL",
        "DELETE FROM `{db}`.t1 WHERE id = 1",
        "ALTER TABLE `{db}`.t1 DROP COLUMN c1",
        "ALTER TABLE `{db}`.t1 MODIFY COLUMN c10 YEAR NULL DEFAULT 2024",
        "INSERT INTO `{db}`.t1 (id, k, r9, c10) VALUES (6, 1, '694:40:24', 0)",
        "INSERT INTO `{db}`.t1 (id, k, r9, c10) VALUES (25, 0, '135:05:49', 2085)",
        "UPDATE `{db}`.t1 SET c10 = 1905 WHERE id % 3 = 2",
    ])
    .await;
    b.apply.restart();
    b.equal().await;
    b.finish().await;
}

/// An ALTER read behind the server and then a RENAME swap of its table: the ALTER applies to the
/// table under its new name (after the rename, whose schema is the one before the ALTER), on
/// both tables of the swap.
#[tokio::test(flavor = "multi_thread")]
async fn an_alter_read_behind_then_a_swap_reaches_the_renamed_table() {
    let mut b = Bed::start(
        "sluice_t_rb_altswap",
        &[
            "CREATE TABLE `{db}`.a (id INT PRIMARY KEY, x TINYINT NOT NULL)".into(),
            "CREATE TABLE `{db}`.b (id INT PRIMARY KEY, y VARCHAR(9))".into(),
            "INSERT INTO `{db}`.a VALUES (1, 1), (2, 2)".into(),
            "INSERT INTO `{db}`.b VALUES (1, 'one')".into(),
        ],
    )
    .await;
    b.rows("a", 2).await;
    b.rows("b", 1).await;
    // The capture, which knows both tables, kept busy with 30 000 rows of another table: it
    // reads the statements after them behind the server.
    b.sql(&[
        "CREATE TABLE `{db}`.bulk (id INT PRIMARY KEY, pad CHAR(100))",
        "INSERT INTO `{db}`.bulk SELECT seq, REPEAT('x', 100) FROM `{db}`.seq_1_to_30000",
        "ALTER TABLE `{db}`.a MODIFY COLUMN x CHAR(5) NOT NULL DEFAULT '7', \
         ADD COLUMN n INT NOT NULL DEFAULT 5",
        "ALTER TABLE `{db}`.a RENAME COLUMN n TO m",
        "ALTER TABLE `{db}`.b ADD COLUMN w DATE",
        "RENAME TABLE `{db}`.a TO `{db}`.tmp, `{db}`.b TO `{db}`.a, `{db}`.tmp TO `{db}`.b",
        "INSERT INTO `{db}`.b VALUES (3, 'three', 3)",
        "INSERT INTO `{db}`.a VALUES (4, 'four', '2024-04-04')",
    ])
    .await;
    b.rows("b", 3).await;
    b.rows("a", 2).await;
    b.equal().await;
    b.finish().await;
}

/// A statement read behind the server reaches the mirror at its place in the stream, not at its
/// table's next row: the table here gets no row after it, and the server is never idle (a
/// writer on another table every 20 ms), so neither a row nor a caught-up capture publishes it.
#[tokio::test(flavor = "multi_thread")]
async fn a_statement_read_behind_reaches_the_mirror_without_a_row_of_its_table() {
    let mut b = Bed::start(
        "sluice_t_rb_norow",
        &[
            "CREATE TABLE `{db}`.q (id INT PRIMARY KEY, x INT, gone INT)".into(),
            "CREATE TABLE `{db}`.busy (id INT AUTO_INCREMENT PRIMARY KEY, v INT)".into(),
            "INSERT INTO `{db}`.q VALUES (1, 10, 1), (2, 20, 2)".into(),
        ],
    )
    .await;
    b.rows("q", 2).await;
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writer = tokio::spawn({
        let (stop, db) = (stop.clone(), b.db.clone());
        async move {
            let mut my = mysql().await;
            let mut n = 0u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                my.query_drop(format!("INSERT INTO `{db}`.busy (v) VALUES (1)"))
                    .await
                    .unwrap();
                n += 1;
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            n
        }
    });
    b.sql(&[
        "CREATE TABLE `{db}`.bulk (id INT PRIMARY KEY, pad CHAR(100))",
        "INSERT INTO `{db}`.bulk SELECT seq, REPEAT('x', 100) FROM `{db}`.seq_1_to_30000",
        "ALTER TABLE `{db}`.q ADD COLUMN c VARCHAR(10) NULL, DROP COLUMN gone",
    ])
    .await;
    let sql = format!(
        "SELECT name FROM system.columns WHERE database = '{}' AND table = 'q' \
         AND name IN ('c', 'gone') ORDER BY name",
        b.ch_db
    );
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let names = clickhouse_tsv(&sql).await.unwrap_or_default();
        if names.trim() == "c" {
            break;
        }
        assert!(
            !writer.is_finished() && Instant::now() < deadline,
            "the mirror of q has {names:?} of (c, gone), not c alone, while the server is busy"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let n = writer.await.unwrap();
    assert!(n > 0);
    b.equal().await;
    b.finish().await;
}

/// Partition clauses that remove, replace or add rows without row events: the tables they
/// touch are read again into targets made again, so each ends with exactly its source's rows;
/// a table made a partition is as dropped, a partition made a table gets a target of its own.
#[tokio::test(flavor = "multi_thread")]
async fn partition_statements_are_followed_by_reading_their_tables_again() {
    let mut b = Bed::start(
        "sluice_t_rb_part",
        &[
            "CREATE TABLE `{db}`.p (id INT PRIMARY KEY, v VARCHAR(10)) PARTITION BY RANGE (id) \
             (PARTITION p0 VALUES LESS THAN (10), PARTITION p1 VALUES LESS THAN (20), \
             PARTITION p2 VALUES LESS THAN (30), PARTITION p3 VALUES LESS THAN (40))"
                .into(),
            "CREATE TABLE `{db}`.x (id INT PRIMARY KEY, v VARCHAR(10))".into(),
            "CREATE TABLE `{db}`.c (id INT PRIMARY KEY, v VARCHAR(10))".into(),
            "INSERT INTO `{db}`.p VALUES (1, 'a'), (5, 'b'), (12, 'c'), (15, 'd'), (22, 'e'), \
             (25, 'f'), (35, 'g')"
                .into(),
            "INSERT INTO `{db}`.x VALUES (11, 'x1'), (13, 'x2')".into(),
            "INSERT INTO `{db}`.c VALUES (41, 'c1'), (42, 'c2')".into(),
        ],
    )
    .await;
    b.rows("p", 7).await;
    b.rows("x", 2).await;
    b.rows("c", 2).await;
    b.sql(&[
        "ALTER TABLE `{db}`.p TRUNCATE PARTITION p0",
        "ALTER TABLE `{db}`.p EXCHANGE PARTITION p1 WITH TABLE `{db}`.x",
        "ALTER TABLE `{db}`.p CONVERT PARTITION p2 TO TABLE `{db}`.conv",
        "ALTER TABLE `{db}`.p CONVERT TABLE `{db}`.c TO PARTITION p4 VALUES LESS THAN (50)",
        "ALTER TABLE `{db}`.p DROP PARTITION p3",
        "INSERT INTO `{db}`.p VALUES (2, 'new')",
        "UPDATE `{db}`.x SET v = 'd2' WHERE id = 15",
        "INSERT INTO `{db}`.conv VALUES (29, 'conv')",
    ])
    .await;
    // p: 2, 11, 13 (from x), 41, 42 (from c); x: 12, 15 (from p); conv: 22, 25, 29.
    b.rows("p", 5).await;
    b.rows("x", 2).await;
    b.rows("conv", 3).await;
    b.equal().await;
    let sql = |t: &str| {
        format!(
            "SELECT id, v FROM {}.{t} FINAL WHERE _deleted = 0 ORDER BY id",
            b.ch_db
        )
    };
    assert_eq!(
        clickhouse_tsv(&sql("p")).await.unwrap(),
        "2\tnew\n11\tx1\n13\tx2\n41\tc1\n42\tc2\n"
    );
    assert_eq!(clickhouse_tsv(&sql("x")).await.unwrap(), "12\tc\n15\td2\n");
    assert_eq!(
        clickhouse_tsv(&sql("conv")).await.unwrap(),
        "22\te\n25\tf\n29\tconv\n"
    );
    // c is gone from the source, as dropped: its target keeps its rows (tables.drop = keep).
    assert_eq!(clickhouse_tsv(&sql("c")).await.unwrap(), "41\tc1\n42\tc2\n");
    b.finish().await;
}

/// A keyless table's change log, rebuilt after an ALTER that gave its rows a value: it keeps
/// every row it had, a row of `_op = 'rebuild'` marks the statement, and the rows above it are
/// the table's rows read again with the server's values, then the changes after.
#[tokio::test(flavor = "multi_thread")]
async fn a_change_log_marks_where_the_rows_read_again_begin() {
    let mut b = Bed::start(
        "sluice_t_rb_log",
        &[
            "CREATE TABLE `{db}`.l (v INT, s VARCHAR(5))".into(),
            "INSERT INTO `{db}`.l VALUES (1, 'a'), (2, 'b'), (2, 'b')".into(),
        ],
    )
    .await;
    b.rows("l", 3).await;
    b.sql(&[
        "ALTER TABLE `{db}`.l ADD COLUMN c INT NOT NULL DEFAULT 5",
        "INSERT INTO `{db}`.l VALUES (3, 'c', 6)",
    ])
    .await;
    // 3 rows before, the marker, the 3 rows read again, the new one (which the rebuild may
    // also have read: then it is there twice, once as a change and once read again).
    let after = |what: &str| {
        format!(
            "SELECT {what} FROM {ch}.l FINAL WHERE _version > (SELECT max(_version) FROM \
             {ch}.l WHERE _op = 'rebuild') ORDER BY v, _op",
            ch = b.ch_db
        )
    };
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let rows = clickhouse_tsv(&after("v, s, c, _op"))
            .await
            .unwrap_or_default();
        let read_again = "1\ta\t5\tsnapshot\n2\tb\t5\tsnapshot\n2\tb\t5\tsnapshot\n";
        if rows == format!("{read_again}3\tc\t6\tinsert\n")
            || rows == format!("{read_again}3\tc\t6\tinsert\n3\tc\t6\tsnapshot\n")
        {
            break;
        }
        assert!(Instant::now() < deadline, "after the marker: {rows:?}");
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let markers = format!(
        "SELECT count() FROM {}.l FINAL WHERE _op = 'rebuild'",
        b.ch_db
    );
    assert_eq!(clickhouse_tsv(&markers).await.unwrap().trim(), "1");
    let before = format!(
        "SELECT v, s, _op FROM {ch}.l FINAL WHERE _version < (SELECT max(_version) FROM \
         {ch}.l WHERE _op = 'rebuild') ORDER BY v",
        ch = b.ch_db
    );
    assert_eq!(
        clickhouse_tsv(&before).await.unwrap(),
        "1\ta\tinsert\n2\tb\tinsert\n2\tb\tinsert\n"
    );
    b.finish().await;
}

/// A table made and given a partition's rows by an exchange, all read behind the server before
/// any row of it: it is read once made, and holds those rows.
#[tokio::test(flavor = "multi_thread")]
async fn a_table_made_and_given_a_partition_while_behind_holds_its_rows() {
    let mut b = Bed::start(
        "sluice_t_rb_partbehind",
        &[
            "CREATE TABLE `{db}`.p (id INT PRIMARY KEY, v VARCHAR(10)) PARTITION BY RANGE (id) \
             (PARTITION p0 VALUES LESS THAN (10), PARTITION p1 VALUES LESS THAN MAXVALUE)"
                .into(),
            "INSERT INTO `{db}`.p VALUES (1, 'a'), (12, 'b'), (15, 'c')".into(),
        ],
    )
    .await;
    b.rows("p", 3).await;
    b.sql(&[
        "CREATE TABLE `{db}`.bulk (id INT PRIMARY KEY, pad CHAR(100))",
        "INSERT INTO `{db}`.bulk SELECT seq, REPEAT('x', 100) FROM `{db}`.seq_1_to_30000",
        "CREATE TABLE `{db}`.y LIKE `{db}`.p",
        "ALTER TABLE `{db}`.y REMOVE PARTITIONING",
        "ALTER TABLE `{db}`.p EXCHANGE PARTITION p1 WITH TABLE `{db}`.y",
    ])
    .await;
    b.rows("y", 2).await;
    b.rows("p", 1).await;
    b.equal().await;
    b.finish().await;
}

/// XA transactions prepared while a table is copied again (its mirror emptied, then a snapshot
/// requested, as `sluice status` says to take a table up again): a chunk read while one is
/// prepared holds the rows' values before it, at a version above it, so the chunk waits for
/// the transaction's outcome. The committed one's value is in the mirror, and the rolled back
/// one's row keeps its value from before (before, the committed value lost to the chunk's, and
/// a rolled back row could be left out of the copy).
#[tokio::test(flavor = "multi_thread")]
async fn a_copy_taken_while_xa_transactions_are_prepared_ends_as_their_outcomes() {
    let values: Vec<String> = (1..=20).map(|i| format!("({i}, 0)")).collect();
    let mut b = Bed::start(
        "sluice_t_ch_xa_copy",
        &[
            "CREATE TABLE `{db}`.t (id INT PRIMARY KEY, v INT NOT NULL)".into(),
            format!("INSERT INTO `{{db}}`.t VALUES {}", values.join(", ")),
        ],
    )
    .await;
    b.rows("t", 20).await;
    // Emptied, to be copied again: its rows now come from the copy only.
    ch_exec(format!("TRUNCATE TABLE {}.t", b.ch_db)).await;
    let t = format!("`{}`.t", b.db);
    let mut xa_a = mysql().await;
    let mut xa_b = mysql().await;
    for (c, xid, id, v) in [(&mut xa_a, "a", 5, 1), (&mut xa_b, "b", 6, 2)] {
        for sql in [
            format!("XA START '{xid}'"),
            format!("UPDATE {t} SET v = {v} WHERE id = {id}"),
            format!("XA END '{xid}'"),
            format!("XA PREPARE '{xid}'"),
        ] {
            c.query_drop(&sql)
                .await
                .unwrap_or_else(|e| panic!("{sql}: {e}"));
        }
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    b.capture.append_config(&format!(
        "[snapshot]\ntables = [\"{}.t\"]\nrequest_id = \"xa-1\"\n",
        b.db
    ));
    let (_, log) = b.capture.stop();
    b.capture.keep_log(log);
    b.capture.restart();
    // Time for a chunk to be read while both are prepared.
    tokio::time::sleep(Duration::from_secs(4)).await;
    xa_a.query_drop("XA COMMIT 'a'").await.unwrap();
    xa_b.query_drop("XA ROLLBACK 'b'").await.unwrap();
    b.rows("t", 20).await;
    b.equal().await;
    let v = |id: u32| format!("SELECT v FROM {}.t FINAL WHERE id = {id}", b.ch_db);
    assert_eq!(clickhouse_tsv(&v(5)).await.unwrap().trim(), "1");
    assert_eq!(clickhouse_tsv(&v(6)).await.unwrap().trim(), "0");
    let log = b.capture.stop_ok();
    assert!(
        log.contains("waits for a prepared XA transaction"),
        "the copy did not wait for the prepared transactions:\n{log}"
    );
    b.apply.stop_ok();
    ch_exec(format!("DROP DATABASE {}", b.ch_db)).await;
    b.my.query_drop(format!("DROP DATABASE `{}`", b.db))
        .await
        .unwrap();
}

/// A name's history starts over when it becomes another table's: `t0` drops its column `c`,
/// then `t1` (which has a `c` of its own) takes the name `t0` in a swap; the target, whose
/// columns the new table all has, is kept. The rows of the new `t0` keep their `c` (before, the drop recorded under the name left `c` out of every row of
/// the table that took it: found by `pipeline_random`, seed 2 on ClickHouse 18.16).
#[tokio::test(flavor = "multi_thread")]
async fn a_column_the_name_dropped_before_a_swap_is_kept_for_the_table_that_took_it() {
    let mut b = Bed::start(
        "sluice_t_ch_swap_history",
        &[
            "CREATE TABLE `{db}`.t0 (id INT PRIMARY KEY, c INT)".into(),
            "CREATE TABLE `{db}`.t1 (id INT PRIMARY KEY, c INT)".into(),
            "INSERT INTO `{db}`.t0 VALUES (1, 10), (2, 20)".into(),
            "INSERT INTO `{db}`.t1 VALUES (1, 1), (2, 2), (3, 3)".into(),
        ],
    )
    .await;
    b.rows("t0", 2).await;
    b.rows("t1", 3).await;
    b.sql(&["ALTER TABLE `{db}`.t0 DROP COLUMN c"]).await;
    b.sql(&[
        "RENAME TABLE `{db}`.t0 TO `{db}`.tmp, `{db}`.t1 TO `{db}`.t0, `{db}`.tmp TO `{db}`.t1",
        "INSERT INTO `{db}`.t0 VALUES (4, 4)",
    ])
    .await;
    b.rows("t0", 4).await;
    b.rows("t1", 2).await;
    b.equal().await;
    let c = format!("SELECT sum(c) FROM {}.t0 FINAL", b.ch_db);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let got = clickhouse_tsv(&c).await.unwrap_or_else(|e| e.to_string());
        if got.trim() == "10" {
            break;
        }
        assert!(Instant::now() < deadline, "t0.c in the mirror: {got}");
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    b.finish().await;
}

/// A keyless table copied again while an XA transaction that inserted into it is prepared: its
/// rows are not published while the copy is pending (the copy holds them), so the copy waits
/// for the transaction's outcome, and the committed row is in the change log exactly once
/// (before, the copy was read while the row was uncommitted, and the row was lost).
#[tokio::test(flavor = "multi_thread")]
async fn a_keyless_copy_taken_while_an_xa_insert_is_prepared_holds_its_row_once() {
    let mut b = Bed::start(
        "sluice_t_ch_xa_keyless",
        &[
            "CREATE TABLE `{db}`.k (a INT NOT NULL, b INT NOT NULL)".into(),
            "INSERT INTO `{db}`.k VALUES (1, 1), (2, 2), (3, 3)".into(),
        ],
    )
    .await;
    b.rows("k", 3).await;
    let mut xa = mysql().await;
    for sql in [
        "XA START 'k'".to_string(),
        format!("INSERT INTO `{}`.k VALUES (100, 100)", b.db),
        "XA END 'k'".into(),
        "XA PREPARE 'k'".into(),
    ] {
        xa.query_drop(&sql)
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"));
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    b.capture.append_config(&format!(
        "[snapshot]\ntables = [\"{}.k\"]\nrequest_id = \"xa-k\"\n",
        b.db
    ));
    let (_, log) = b.capture.stop();
    b.capture.keep_log(log);
    b.capture.restart();
    tokio::time::sleep(Duration::from_secs(4)).await;
    xa.query_drop("XA COMMIT 'k'").await.unwrap();
    // The copy's rows (the three, then the committed one) follow the streamed ones.
    let count = |cond: &str| format!("SELECT count() FROM {}.k WHERE {cond}", b.ch_db);
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let copied = clickhouse_tsv(&count("a = 3")).await.unwrap_or_default();
        let late = clickhouse_tsv(&count("a = 100")).await.unwrap_or_default();
        if copied.trim() == "2" && late.trim() == "1" {
            break;
        }
        if Instant::now() > deadline {
            let (capture, apply) = (b.capture.stop().1, b.apply.stop().1);
            panic!(
                "rows of a = 3: {copied}, of a = 100: {late}\ncapture's log:\n{capture}\n\
                 apply's log:\n{apply}"
            );
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    // Nothing more arrives.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(clickhouse_tsv(&count("a = 100")).await.unwrap().trim(), "1");
    b.finish().await;
}
