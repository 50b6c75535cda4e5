//! Source schema changes into a ClickHouse mirror (MariaDB -> capture-mysql -> Kafka ->
//! apply-clickhouse), on whichever server `SLUICE_CLICKHOUSE_URL` names: what can be applied
//! exactly is, what cannot stops the table with the statement named, and nothing is absorbed
//! into a wrong or missing value.

use std::time::{Duration, Instant};

use mysql_async::prelude::Queryable;
use sluice_tests::capture::{binlog_end, clickhouse_tsv, dead_letters, CaptureProcess};
use sluice_tests::{mysql_url, unique};

use sluice_tests::to_clickhouse::{ch, text};

/// Wait until `sql` answers `want` (90 s at most; the table may not be made yet); the last
/// answer.
async fn until(sql: &str, want: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let got = clickhouse_tsv(sql).await.unwrap_or_else(|e| e.to_string());
        if got.trim() == want || Instant::now() > deadline {
            return got.trim().to_string();
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

/// Wait until an apply stage has read every partition to its end (its consumer lag, which it
/// learns every 5 s, is 0 after at least 6 s).
async fn caught_up(metrics_port: u16) {
    let started = Instant::now();
    loop {
        let lag =
            sluice_tests::capture::metric_at(metrics_port, "sluice_apply_consumer_lag_messages");
        if lag == Some(0.0) && started.elapsed() > Duration::from_secs(6) {
            return;
        }
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "lag {lag:?} after 120 s"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

struct Pipeline {
    db: String,
    ch_db: String,
    dlq: String,
    mysql: mysql_async::Conn,
    capture: CaptureProcess,
    apply: CaptureProcess,
}

impl Pipeline {
    async fn start(name: &str) -> Self {
        Self::start_with(name, "").await
    }

    /// With `apply` TOML added to apply-clickhouse's configuration.
    /// (`{db}` in it: the source database.)
    async fn start_with(name: &str, apply: &str) -> Self {
        let db = unique(name);
        let apply = &apply.replace("{db}", &db);
        let ch_db = format!("{db}_m");
        ch().query(&format!("CREATE DATABASE {ch_db}"))
            .execute()
            .await
            .unwrap();
        let capture = CaptureProcess::spawn(CaptureProcess::config(&db, &binlog_end().await, ""));
        let dlq = unique("dlq");
        let apply = CaptureProcess::apply_clickhouse_with(&capture.prefix, &ch_db, &dlq, "", apply);
        let mut mysql = mysql_async::Conn::new(mysql_async::Opts::from_url(&mysql_url()).unwrap())
            .await
            .unwrap();
        mysql
            .query_drop(format!("CREATE DATABASE `{db}`"))
            .await
            .unwrap();
        Pipeline {
            db,
            ch_db,
            dlq,
            mysql,
            capture,
            apply,
        }
    }

    async fn sql(&mut self, statements: &[String]) {
        for s in statements {
            self.mysql
                .query_drop(s)
                .await
                .unwrap_or_else(|e| panic!("{s}: {e}"));
        }
    }

    async fn finish(mut self) {
        for p in [&mut self.capture, &mut self.apply] {
            p.stop_ok();
        }
        ch().query(&format!("DROP DATABASE {}", self.ch_db))
            .execute()
            .await
            .unwrap();
        self.mysql
            .query_drop(format!("DROP DATABASE `{}`", self.db))
            .await
            .unwrap();
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_widened_column_is_widened_and_a_column_of_the_targets_own_is_kept() {
    let mut p = Pipeline::start("sluice_t_ch_widen").await;
    let t = format!("`{}`.t", p.db);
    p.sql(&[
        format!("CREATE TABLE {t} (id INT PRIMARY KEY, n INT NOT NULL, v VARCHAR(10))"),
        format!("INSERT INTO {t} VALUES (1, 2147483647, 'a'), (2, -5, 'b')"),
    ])
    .await;
    let m = format!("{}.t", p.ch_db);
    let q = format!("SELECT count() FROM {m} FINAL");
    assert_eq!(until(&q, "2").await, "2");
    // A column the target has and the source never had: the user's own.
    ch().query(&format!(
        "ALTER TABLE {m} ADD COLUMN ingested_at DateTime DEFAULT now()"
    ))
    .execute()
    .await
    .unwrap();
    // A column added with a default (rows 1 and 2 read it from the ALTER on), widened once the
    // target has it: rows 1 and 2 still read the default.
    p.sql(&[format!(
        "ALTER TABLE {t} ADD COLUMN d INT NOT NULL DEFAULT 7"
    )])
    .await;
    let has_d = format!(
        "SELECT count() FROM system.columns WHERE database = '{}' AND table = 't' AND name = 'd'",
        p.ch_db
    );
    assert_eq!(until(&has_d, "1").await, "1", "column d added");
    p.sql(&[
        format!("CREATE INDEX iv ON {t} (v)"),
        format!("ALTER TABLE {t} MODIFY COLUMN n BIGINT NOT NULL"),
        format!("ALTER TABLE {t} MODIFY COLUMN d BIGINT NOT NULL DEFAULT 7"),
        format!("INSERT INTO {t} (id, n, v) VALUES (3, 5000000000, 'c')"),
        format!("ALTER TABLE {t} DROP COLUMN v"),
        format!("INSERT INTO {t} VALUES (4, -5000000000, 8000000000)"),
    ])
    .await;
    let q = format!("SELECT count() FROM {m} FINAL");
    assert_eq!(until(&q, "4").await, "4", "every row in the mirror");
    let rows = text(&format!("SELECT id, n, d FROM {m} FINAL ORDER BY id")).await;
    assert_eq!(
        rows, "1\t2147483647\t7\n2\t-5\t7\n3\t5000000000\t7\n4\t-5000000000\t8000000000\n",
        "the widened columns hold the old and the new values, and the rows from before the \
         ADD COLUMN keep its default"
    );
    let columns = text(&format!(
        "SELECT name, type FROM system.columns WHERE database = '{}' AND table = 't' ORDER BY name",
        p.ch_db
    ))
    .await;
    assert!(columns.contains("n\tInt64\n"), "{columns}");
    assert!(columns.contains("d\tInt64\n"), "{columns}");
    assert!(
        columns.contains("ingested_at\tDateTime"),
        "the target's own column stays: {columns}"
    );
    assert!(
        !columns.contains("v\t"),
        "the dropped source column is dropped: {columns}"
    );
    let letters = tokio::task::spawn_blocking({
        let dlq = p.dlq.clone();
        move || dead_letters(&dlq, 1)
    })
    .await
    .unwrap();
    assert!(letters.is_empty(), "{letters:?}");
    p.finish().await;
}

/// Renamed columns keep their values (`RENAME COLUMN` on 20.4+, a copy before), and added
/// columns read in the rows already there what the source stored in them, whatever the
/// default: a constant, the type's implicit value of a NOT NULL column, or an expression
/// (`CURRENT_TIMESTAMP`, the ALTER's time), which the capture reads again from the source (a
/// rebuild). Nothing is stopped or dead-lettered.
#[tokio::test(flavor = "multi_thread")]
async fn renamed_and_added_columns_keep_every_value() {
    let mut p = Pipeline::start("sluice_t_ch_rename").await;
    let db = p.db.clone();
    let t = |x: &str| format!("`{db}`.{x}");
    p.sql(&[
        format!("CREATE TABLE {} (id INT PRIMARY KEY, score INT)", t("t")),
        format!("CREATE TABLE {} (id INT PRIMARY KEY, x INT)", t("u")),
        format!("CREATE TABLE {} (id INT PRIMARY KEY)", t("v")),
        format!("INSERT INTO {} VALUES (1, 10), (2, 20)", t("t")),
        format!("INSERT INTO {} VALUES (1, 1)", t("u")),
        format!("INSERT INTO {} VALUES (1)", t("v")),
    ])
    .await;
    let ch_db = p.ch_db.clone();
    let count = |x: &str| format!("SELECT count() FROM {ch_db}.{x} FINAL");
    assert_eq!(until(&count("t"), "2").await, "2");
    assert_eq!(until(&count("u"), "1").await, "1");
    assert_eq!(until(&count("v"), "1").await, "1");
    p.sql(&[
        format!("ALTER TABLE {} RENAME COLUMN score TO points", t("t")),
        format!("INSERT INTO {} VALUES (3, 30)", t("t")),
        format!(
            "ALTER TABLE {} ADD COLUMN email VARCHAR(50) DEFAULT 'none@x', \
             ADD COLUMN n INT NOT NULL DEFAULT -7, ADD COLUMN e ENUM('x', 'y') NOT NULL, \
             ADD COLUMN z INT",
            t("u")
        ),
        format!("INSERT INTO {} VALUES (2, 2, 'a@b', 8, 'y', 9)", t("u")),
        format!(
            "ALTER TABLE {} ADD COLUMN ts TIMESTAMP NOT NULL DEFAULT CURRENT_TIMESTAMP",
            t("v")
        ),
        format!("INSERT INTO {} (id) VALUES (2)", t("v")),
    ])
    .await;
    // Added columns: the rows already there read what the source gave them.
    let u = format!("SELECT id, x, email, n, e, z FROM {ch_db}.u FINAL ORDER BY id");
    let want_u = "1\t1\tnone@x\t-7\tx\t\\N\n2\t2\ta@b\t8\ty\t9\n";
    assert_eq!(until(&u, want_u.trim()).await, want_u.trim());
    // CURRENT_TIMESTAMP: the value the server stored in each row, read again.
    let stamps: Vec<(i64, i64)> = p
        .mysql
        .query(format!(
            "SELECT id, UNIX_TIMESTAMP(ts) FROM {} ORDER BY id",
            t("v")
        ))
        .await
        .unwrap();
    let want_v: String = stamps.iter().map(|(i, s)| format!("{i}\t{s}\n")).collect();
    let v = format!("SELECT id, toUnixTimestamp(ts) FROM {ch_db}.v FINAL ORDER BY id");
    assert_eq!(until(&v, want_v.trim()).await, want_v.trim());
    // Renamed: the rows written before keep their values under the new name.
    let t_rows = format!("SELECT id, points FROM {ch_db}.t FINAL ORDER BY id");
    let want_t = "1\t10\n2\t20\n3\t30\n";
    assert_eq!(until(&t_rows, want_t.trim()).await, want_t.trim());
    caught_up(p.apply.metrics_port).await;
    let letters = tokio::task::spawn_blocking({
        let dlq = p.dlq.clone();
        move || dead_letters(&dlq, 1)
    })
    .await
    .unwrap();
    assert!(letters.is_empty(), "{letters:?}");
    p.finish().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn rows_without_images_stop_their_table_and_say_why() {
    let mut p = Pipeline::start("sluice_t_ch_images").await;
    let (t, u, v) = (
        format!("`{}`.t", p.db),
        format!("`{}`.u", p.db),
        format!("`{}`.v", p.db),
    );
    p.sql(&[
        format!("CREATE TABLE {t} (id INT PRIMARY KEY, a VARCHAR(10))"),
        format!("CREATE TABLE {u} (id INT PRIMARY KEY, a VARCHAR(10), b INT)"),
        format!("CREATE TABLE {v} (id INT PRIMARY KEY)"),
        format!("INSERT INTO {t} VALUES (1, 'a')"),
        format!("INSERT INTO {u} VALUES (1, 'a', 1)"),
        format!("INSERT INTO {v} VALUES (1)"),
    ])
    .await;
    let ch_db = p.ch_db.clone();
    let m = |x: &str| format!("SELECT count() FROM {ch_db}.{x} FINAL");
    for x in ["t", "u", "v"] {
        assert_eq!(until(&m(x), "1").await, "1", "{x}");
    }
    // A session writing statements, another writing images without every column.
    p.sql(&[
        "SET SESSION binlog_format = 'STATEMENT'".into(),
        format!("INSERT INTO {t} VALUES (2, 'b')"),
        "SET SESSION binlog_format = 'ROW'".into(),
        "SET SESSION binlog_row_image = 'MINIMAL'".into(),
        format!("UPDATE {u} SET b = 2 WHERE id = 1"),
        "SET SESSION binlog_row_image = 'FULL'".into(),
        format!("INSERT INTO {t} VALUES (3, 'c')"),
        format!("INSERT INTO {u} VALUES (3, 'c', 3)"),
        format!("INSERT INTO {v} VALUES (3)"),
    ])
    .await;
    // The third table flows on.
    assert_eq!(until(&m("v"), "2").await, "2");
    // The other two are stopped: their later rows (and the other partitions' copies of the
    // refusal) are refused with the reason.
    let letters = tokio::task::spawn_blocking({
        let dlq = p.dlq.clone();
        move || dead_letters(&dlq, 6)
    })
    .await
    .unwrap();
    let reasons: Vec<&str> = letters.iter().map(|(_, r)| r.as_str()).collect();
    assert!(
        reasons.iter().any(|r| r.starts_with("table t is stopped")
            && r.contains("binlog_format was STATEMENT or MIXED")
            && r.contains("INSERT INTO")),
        "{reasons:#?}"
    );
    assert!(
        reasons
            .iter()
            .any(|r| r.starts_with("table u is stopped")
                && r.contains("binlog_row_image was MINIMAL")),
        "{reasons:#?}"
    );
    // Nothing wrong was written: the mirrors hold what they held.
    assert_eq!(
        text(&format!(
            "SELECT id, a FROM {}.t FINAL ORDER BY id",
            p.ch_db
        ))
        .await,
        "1\ta\n"
    );
    assert_eq!(
        text(&format!(
            "SELECT id, a, b FROM {}.u FINAL ORDER BY id",
            p.ch_db
        ))
        .await,
        "1\ta\t1\n"
    );
    p.finish().await;
}

/// A row change logged as a statement through a view, or into a table whose trigger writes
/// another: the tables behind it changed too, without row events, and stop with it; a table
/// neither names flows on.
#[tokio::test(flavor = "multi_thread")]
async fn rows_written_through_a_view_or_a_trigger_stop_those_tables_too() {
    let mut p = Pipeline::start("sluice_t_ch_behind").await;
    let db = p.db.clone();
    p.sql(&[
        format!("CREATE TABLE `{db}`.w (id INT PRIMARY KEY, a VARCHAR(10))"),
        format!("CREATE TABLE `{db}`.x (id INT PRIMARY KEY)"),
        format!("CREATE TABLE `{db}`.aud (id INT PRIMARY KEY)"),
        format!("CREATE TABLE `{db}`.other (id INT PRIMARY KEY)"),
        format!("CREATE VIEW `{db}`.vw AS SELECT id, a FROM `{db}`.w"),
        format!(
            "CREATE TRIGGER `{db}`.tx AFTER INSERT ON `{db}`.x FOR EACH ROW \
             INSERT INTO aud VALUES (NEW.id)"
        ),
        format!("INSERT INTO `{db}`.w VALUES (1, 'a')"),
        format!("INSERT INTO `{db}`.other VALUES (1)"),
    ])
    .await;
    let ch_db = p.ch_db.clone();
    let m = |x: &str| format!("SELECT count() FROM {ch_db}.{x} FINAL");
    assert_eq!(until(&m("w"), "1").await, "1");
    p.sql(&[
        "SET SESSION binlog_format = 'STATEMENT'".into(),
        format!("UPDATE `{db}`.vw SET a = 'z' WHERE id = 1"),
        format!("INSERT INTO `{db}`.x VALUES (2)"),
        "SET SESSION binlog_format = 'ROW'".into(),
        format!("INSERT INTO `{db}`.other VALUES (2)"),
    ])
    .await;
    assert_eq!(
        until(&m("other"), "2").await,
        "2",
        "the other table flows on"
    );
    let stopped = format!("SELECT target FROM {ch_db}._sluice_stopped ORDER BY target");
    assert_eq!(
        until(&stopped, "aud\nvw\nw\nx").await,
        "aud\nvw\nw\nx",
        "the view, the table behind it, the table with the trigger and the one it writes"
    );
    // Nothing wrong was written: w holds what it held.
    assert_eq!(
        text(&format!("SELECT id, a FROM {ch_db}.w FINAL ORDER BY id")).await,
        "1\ta\n"
    );
    p.finish().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn truncate_and_drop_follow_their_policy_and_no_replay_brings_rows_back() {
    // t: TRUNCATE applied (the default). e: DROP deletes (per table). d: DROP keeps (the
    // default). p: a partition truncated, which has no row events: the table is read again
    // (clickhouse_rebuild.rs has every partition clause).
    let extra = "[tables]\ndrop_tables = { \"{db}.e\" = \"delete\" }\n";
    let mut p = Pipeline::start_with("sluice_t_ch_truncate", extra).await;
    let db = p.db.clone();
    let t = |x: &str| format!("`{db}`.{x}");
    p.sql(&[
        format!(
            "CREATE TABLE {} (id INT PRIMARY KEY, v VARCHAR(10))",
            t("t")
        ),
        format!("CREATE TABLE {} (id INT PRIMARY KEY)", t("d")),
        format!("CREATE TABLE {} (id INT PRIMARY KEY)", t("e")),
        format!(
            "CREATE TABLE {} (id INT PRIMARY KEY) PARTITION BY RANGE (id) \
             (PARTITION p0 VALUES LESS THAN (10), PARTITION p1 VALUES LESS THAN MAXVALUE)",
            t("p")
        ),
        format!(
            "INSERT INTO {} WITH RECURSIVE s(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM s \
             WHERE n < 1000) SELECT n, 'old' FROM s",
            t("t")
        ),
        format!("INSERT INTO {} VALUES (1), (2)", t("d")),
        format!("INSERT INTO {} VALUES (1), (2)", t("e")),
        format!("INSERT INTO {} VALUES (1), (15)", t("p")),
    ])
    .await;
    let ch_db = p.ch_db.clone();
    let count = |x: &str| format!("SELECT count() FROM {ch_db}.{x} FINAL");
    assert_eq!(until(&count("t"), "1000").await, "1000");
    for x in ["d", "e", "p"] {
        assert_eq!(until(&count(x), "2").await, "2", "{x}");
    }
    p.sql(&[
        format!("UPDATE {} SET v = 'updated' WHERE id <= 10", t("t")),
        format!("TRUNCATE TABLE {}", t("t")),
        format!("INSERT INTO {} VALUES (7, 'new')", t("t")),
        format!("DROP TABLE {}", t("d")),
        format!("DROP TABLE {}", t("e")),
        format!("ALTER TABLE {} TRUNCATE PARTITION p0", t("p")),
        format!("INSERT INTO {} VALUES (20)", t("p")),
    ])
    .await;
    let rows = |x: &str| {
        let columns = if x == "t" { "id, v" } else { "id" };
        format!("SELECT {columns} FROM {ch_db}.{x} FINAL ORDER BY id")
    };
    assert_eq!(
        until(&count("t"), "1").await,
        "1",
        "the mirror equals the source"
    );
    assert_eq!(text(&rows("t")).await, "7\tnew\n");
    assert_eq!(until(&count("e"), "0").await, "0", "drop = delete");
    assert_eq!(until(&rows("p"), "15\n20").await, "15\n20");
    assert_eq!(
        text(&count("d")).await.trim(),
        "2",
        "drop = keep (the default)"
    );
    // Every event read again from the start, by a second apply stage in a new group: the
    // rows before the TRUNCATE (and the DROP) come back only to be removed again.
    p.apply.stop_ok();
    let extra = extra.replace("{db}", &p.db);
    p.apply =
        CaptureProcess::apply_clickhouse_with(&p.capture.prefix, &p.ch_db, &p.dlq, "", &extra);
    caught_up(p.apply.metrics_port).await;
    assert_eq!(text(&count("t")).await.trim(), "1", "after the replay");
    assert_eq!(text(&count("e")).await.trim(), "0", "after the replay");
    assert_eq!(text(&rows("p")).await, "15\n20\n", "after the replay");
    let letters = tokio::task::spawn_blocking({
        let dlq = p.dlq.clone();
        move || dead_letters(&dlq, 1)
    })
    .await
    .unwrap();
    assert!(letters.is_empty(), "{letters:?}");
    p.finish().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_keyless_tables_change_log_keeps_every_row_under_final() {
    let db = unique("sluice_t_ch_keyless");
    let ch_db = format!("{db}_m");
    ch().query(&format!("CREATE DATABASE {ch_db}"))
        .execute()
        .await
        .unwrap();
    let mut mysql = mysql_async::Conn::new(mysql_async::Opts::from_url(&mysql_url()).unwrap())
        .await
        .unwrap();
    mysql
        .query_drop(format!(
            "CREATE DATABASE `{db}`; CREATE TABLE `{db}`.nopk \
             (v INT, at DATETIME, pad VARCHAR(10))"
        ))
        .await
        .unwrap();
    // Every row twice: equal rows must stay two rows.
    let values: Vec<String> = (0..1000)
        .map(|n| format!("({}, '2024-02-29 12:34:56', 'row')", n / 2))
        .collect();
    mysql
        .query_drop(format!(
            "INSERT INTO `{db}`.nopk VALUES {}",
            values.join(",")
        ))
        .await
        .unwrap();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writer = {
        let (db, stop) = (db.clone(), stop.clone());
        tokio::spawn(async move {
            let mut c = mysql_async::Conn::new(mysql_async::Opts::from_url(&mysql_url()).unwrap())
                .await
                .unwrap();
            let mut n = 0;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                c.query_drop(format!(
                    "INSERT INTO `{db}`.nopk VALUES ({v}, NOW(), 'new'), ({v}, NOW(), 'new')",
                    v = 10_000 + n
                ))
                .await
                .unwrap();
                n += 1;
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
            n
        })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    let mut capture = CaptureProcess::spawn(CaptureProcess::config(
        &db,
        "end",
        "[snapshot]\nmode = \"snapshot+stream\"\nchunk_rows = 100\n",
    ));
    let dlq = unique("dlq");
    let mut apply = CaptureProcess::apply_clickhouse(&capture.prefix, &ch_db, &dlq);
    sluice_tests::capture::wait_snapshot_done(capture.metrics_port, Duration::from_secs(120)).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let inserted = writer.await.unwrap();
    assert!(inserted > 5, "the writer inserted {inserted} pairs");
    let want: Vec<(i64, String)> = mysql
        .query(format!("SELECT v, pad FROM `{db}`.nopk ORDER BY v, pad"))
        .await
        .unwrap();
    let want: String = want.iter().map(|(v, p)| format!("{v}\t{p}\n")).collect();
    let n = want.lines().count();
    let q = format!("SELECT count() FROM {ch_db}.nopk FINAL");
    assert_eq!(
        until(&q, &n.to_string()).await,
        n.to_string(),
        "every row, FINAL or not"
    );
    assert_eq!(
        text(&format!(
            "SELECT v, pad FROM {ch_db}.nopk FINAL ORDER BY v, pad"
        ))
        .await,
        want
    );
    assert_eq!(
        text(&format!(
            "SELECT toString(at) FROM {ch_db}.nopk FINAL WHERE pad = 'row' LIMIT 1"
        ))
        .await,
        "2024-02-29 12:34:56\n"
    );
    for p in [&mut capture, &mut apply] {
        p.stop_ok();
    }
    ch().query(&format!("DROP DATABASE {ch_db}"))
        .execute()
        .await
        .unwrap();
    mysql
        .query_drop(format!("DROP DATABASE `{db}`"))
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_renamed_table_is_followed_by_its_target_with_every_row() {
    let mut p = Pipeline::start("sluice_t_ch_rename_table").await;
    let db = p.db.clone();
    let t = |x: &str| format!("`{db}`.{x}");
    p.sql(&[
        format!("CREATE TABLE {} (id INT PRIMARY KEY, v VARCHAR(5))", t("a")),
        format!("CREATE TABLE {} (id INT PRIMARY KEY, v VARCHAR(5))", t("b")),
        format!(
            "INSERT INTO {} VALUES (1, 'a1'), (2, 'a2'), (3, 'a3')",
            t("a")
        ),
        format!("INSERT INTO {} VALUES (10, 'b10'), (11, 'b11')", t("b")),
    ])
    .await;
    let ch_db = p.ch_db.clone();
    let count = |x: &str| format!("SELECT count() FROM {ch_db}.{x} FINAL");
    assert_eq!(until(&count("a"), "3").await, "3");
    assert_eq!(until(&count("b"), "2").await, "2");
    p.sql(&[
        format!("RENAME TABLE {} TO {}", t("a"), t("c")),
        format!("INSERT INTO {} VALUES (4, 'c4')", t("c")),
        // A swap: b and c change places.
        format!(
            "RENAME TABLE {} TO {}, {} TO {}, {} TO {}",
            t("b"),
            t("tmp"),
            t("c"),
            t("b"),
            t("tmp"),
            t("c")
        ),
        format!("INSERT INTO {} VALUES (5, 'b5')", t("b")),
        format!("UPDATE {} SET v = 'c10' WHERE id = 10", t("c")),
    ])
    .await;
    let rows = |x: &str| format!("SELECT id, v FROM {ch_db}.{x} FINAL ORDER BY id");
    assert_eq!(until(&count("b"), "5").await, "5");
    assert_eq!(
        text(&rows("b")).await,
        "1\ta1\n2\ta2\n3\ta3\n4\tc4\n5\tb5\n",
        "b holds what was a, every row"
    );
    assert_eq!(until(&count("c"), "2").await, "2");
    assert_eq!(
        until(&rows("c"), "10\tc10\n11\tb11").await,
        "10\tc10\n11\tb11"
    );
    // The old name's target is kept (tables.drop = "keep").
    assert_eq!(text(&rows("a")).await, "1\ta1\n2\ta2\n3\ta3\n");
    let letters = tokio::task::spawn_blocking({
        let dlq = p.dlq.clone();
        move || dead_letters(&dlq, 1)
    })
    .await
    .unwrap();
    assert!(letters.is_empty(), "{letters:?}");
    p.finish().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn tables_made_like_another_or_from_a_select_arrive_whole() {
    let mut p = Pipeline::start("sluice_t_ch_create_like").await;
    let db = p.db.clone();
    let t = |x: &str| format!("`{db}`.{x}");
    p.sql(&[
        format!(
            "CREATE TABLE {} (id INT PRIMARY KEY, v VARCHAR(5), d DECIMAL(5,2))",
            t("a")
        ),
        format!(
            "INSERT INTO {} VALUES (1, 'x', 1.50), (2, 'y', -2.25)",
            t("a")
        ),
        format!("CREATE TABLE {} LIKE {}", t("l"), t("a")),
        format!("INSERT INTO {} VALUES (7, 'l', 0.01)", t("l")),
        format!(
            "CREATE TABLE {} (PRIMARY KEY (id)) AS SELECT * FROM {}",
            t("s"),
            t("a")
        ),
        format!(
            "CREATE TABLE {} SELECT id, v FROM {} WHERE id = 2",
            t("k"),
            t("a")
        ),
        // Empty ones: in the mirror too, without waiting for a row.
        format!("CREATE TABLE {} LIKE {}", t("e"), t("a")),
        format!("CREATE TABLE {} (id INT PRIMARY KEY, w DATE)", t("e2")),
    ])
    .await;
    let ch_db = p.ch_db.clone();
    let rows = |x: &str, cols: &str| format!("SELECT {cols} FROM {ch_db}.{x} FINAL ORDER BY id");
    // (decimals as hundredths: current servers print 1.50 as 1.5)
    let cols = "id, v, toInt64(d * 100)";
    assert_eq!(until(&rows("l", cols), "7\tl\t1").await, "7\tl\t1");
    assert_eq!(
        until(&rows("s", cols), "1\tx\t150\n2\ty\t-225").await,
        "1\tx\t150\n2\ty\t-225",
        "CREATE TABLE ... AS SELECT: its rows arrive as row events"
    );
    // A keyless table made from a SELECT: a change log, its row there once.
    assert_eq!(until(&rows("k", "id, v"), "2\ty").await, "2\ty");
    let made = format!(
        "SELECT name FROM system.tables WHERE database = '{ch_db}' AND name IN ('e', 'e2') \
         ORDER BY name"
    );
    assert_eq!(until(&made, "e\ne2").await, "e\ne2");
    p.finish().await;
}

/// Two appliers of one group; one is paused (SIGSTOP, shorter than its group session) while
/// the other applies a column rename from its own partitions' copy of the statement. Continued,
/// the paused one writes rows of the schema before the rename by the plan it made before:
/// ClickHouse refuses them (the column has its new name). The target was changed by another
/// instance meanwhile, so that is no reason to stop the table: the events are read again and
/// written under the new name (found by `pipeline_random`, seed 4 on ClickHouse 18.16, where
/// the table was stopped).
#[tokio::test(flavor = "multi_thread")]
async fn rows_planned_before_another_appliers_rename_are_written_not_stopped() {
    let (db, ch_db, mut cap) =
        sluice_tests::to_clickhouse::pipeline("sluice_t_ch_race", "_m").await;
    let mut my = sluice_tests::to_clickhouse::mysql().await;
    my.query_drop(format!("CREATE DATABASE `{db}`"))
        .await
        .unwrap();
    let (dlq, group) = (unique("dlq"), unique("g"));
    let mut a = CaptureProcess::apply_clickhouse_with(&cap.prefix, &ch_db, &dlq, &group, "");
    let mut b = CaptureProcess::apply_clickhouse_with(&cap.prefix, &ch_db, &dlq, &group, "");
    let t = format!("`{db}`.t");
    let rows = |from: u32, to: u32| -> String {
        let v: Vec<String> = (from..to).map(|i| format!("({i}, {})", i * 10)).collect();
        format!("INSERT INTO {t} VALUES {}", v.join(", "))
    };
    my.query_drop(format!("CREATE TABLE {t} (id INT PRIMARY KEY, score INT)"))
        .await
        .unwrap();
    my.query_drop(rows(0, 30)).await.unwrap();
    let count = format!("SELECT count() FROM {ch_db}.t FINAL");
    assert_eq!(until(&count, "30").await, "30");
    // Both hold partitions of the table (the second one's share comes with a rebalance), and
    // both have written rows of it (its keys are on every partition): each has planned the
    // target with `score`.
    let held = |p: &CaptureProcess| {
        sluice_tests::capture::metric_at(p.metrics_port, "sluice_apply_assigned_partitions")
            .unwrap_or(0.0)
    };
    let started = Instant::now();
    while held(&a) < 1.0 || held(&b) < 1.0 {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "each applier holds a partition: {} {}",
            held(&a),
            held(&b)
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    my.query_drop(rows(100, 130)).await.unwrap();
    assert_eq!(until(&count, "60").await, "60");
    b.signal("-STOP");
    let paused = Instant::now();
    my.query_drop(rows(30, 60)).await.unwrap();
    my.query_drop(format!("ALTER TABLE {t} RENAME COLUMN score TO points"))
        .await
        .unwrap();
    my.query_drop(rows(60, 90)).await.unwrap();
    // The running one applies the rename (its partitions' copy of the statement): `points`
    // there and `score` gone (on 18.16 a rename is a copy, and a row of the old schema written
    // between the copy and the drop loses that value: the limitation docs/apply-clickhouse.md
    // names for several instances; here the write comes after).
    let renamed = format!(
        "SELECT groupArray(name) FROM system.columns WHERE database = '{ch_db}' AND table = 't' \
         AND name IN ('points', 'score')"
    );
    while clickhouse_tsv(&renamed).await.unwrap().trim() != "['points']" {
        assert!(
            paused.elapsed() < Duration::from_secs(7),
            "the running applier did not rename the column"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    b.signal("-CONT");
    assert_eq!(until(&count, "120").await, "120");
    let want: u64 = (0..90).chain(100..130).map(|i| i * 10).sum();
    let sum = format!("SELECT sum(points) FROM {ch_db}.t FINAL");
    assert_eq!(until(&sum, &want.to_string()).await, want.to_string());
    let stopped = clickhouse_tsv(&format!("SELECT count() FROM {ch_db}._sluice_stopped"))
        .await
        .unwrap();
    assert_eq!(stopped.trim(), "0", "a table was stopped");
    let (code, report, err) =
        tokio::task::block_in_place(|| sluice_tests::capture::verify(&cap, &a, &[]));
    assert_eq!(code, Some(0), "{report:#}\n{err}");
    let out_b = b.stop_ok();
    assert!(
        out_b.contains("reading the events not yet committed again")
            || paused.elapsed() > Duration::from_secs(9),
        "the continued applier did not read its events again:\n{out_b}"
    );
    a.stop_ok();
    cap.stop_ok();
    clickhouse_tsv(&format!("DROP DATABASE {ch_db}"))
        .await
        .unwrap();
    my.query_drop(format!("DROP DATABASE `{db}`"))
        .await
        .unwrap();
}

/// An ALTER ClickHouse refuses (here: the target replaced by hand with a view, which takes no
/// ALTER) stops its table at once, with the statement named: the claim the instance took to
/// apply it is its own, no other instance's work to wait for (a process that waited on its own
/// claim read the statement again every two minutes and never stopped the table).
#[tokio::test(flavor = "multi_thread")]
async fn an_alter_the_target_refuses_stops_its_table_at_once() {
    let mut p = Pipeline::start("sluice_t_ch_alter_refused").await;
    let (db, ch_db) = (p.db.clone(), p.ch_db.clone());
    p.sql(&[
        format!("CREATE TABLE `{db}`.t (id INT PRIMARY KEY, v INT)"),
        format!("INSERT INTO `{db}`.t VALUES (1, 1)"),
    ])
    .await;
    assert_eq!(
        until(&format!("SELECT count() FROM {ch_db}.t FINAL"), "1").await,
        "1"
    );
    // Every copy of the CREATE read (one per partition), then the target swapped for a view.
    caught_up(p.apply.metrics_port).await;
    for sql in [
        format!("RENAME TABLE {ch_db}.t TO {ch_db}.t_real"),
        format!("CREATE VIEW {ch_db}.t AS SELECT * FROM {ch_db}.t_real"),
    ] {
        clickhouse_tsv(&sql).await.unwrap();
    }
    p.sql(&[format!("ALTER TABLE `{db}`.t ADD COLUMN z INT NULL")])
        .await;
    let stopped = until(
        &format!("SELECT count() FROM {ch_db}._sluice_stopped WHERE target = 't'"),
        "1",
    )
    .await;
    assert_eq!(stopped, "1", "the table was not stopped");
    let reason = clickhouse_tsv(&format!(
        "SELECT reason FROM {ch_db}._sluice_stopped WHERE target = 't'"
    ))
    .await
    .unwrap();
    assert!(reason.contains("ADD COLUMN z"), "{reason}");
    p.finish().await;
}
