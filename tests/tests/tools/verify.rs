//! `sluice verify` of MySQL with its ClickHouse mirror: exact differences reported, nothing
//! reported for changes in flight.

use std::time::{Duration, Instant};

use mysql_async::prelude::Queryable;
use sluice_tests::to_clickhouse::*;

/// A table's part of a verify report, by source table name.
fn verified<'a>(report: &'a serde_json::Value, table: &str) -> &'a serde_json::Value {
    report["tables"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| {
            t["source"]
                .as_str()
                .unwrap()
                .ends_with(&format!(".{table}"))
        })
        .unwrap_or_else(|| panic!("{table} not in {report:#}"))
}

/// The keys of one kind (`missing`, `extra`, ...) of a table's report, as `id` values.
fn verified_ids(t: &serde_json::Value, kind: &str) -> Vec<String> {
    t[kind]
        .as_array()
        .unwrap()
        .iter()
        .map(|k| k["key"]["id"].as_str().unwrap().to_string())
        .collect()
}

/// Write a changed copy of target row `id` (`set`: column -> ClickHouse expression) one version
/// above the row's, as a broken pipeline would have left it.
async fn tamper(ch_db: &str, table: &str, id: u64, set: &[(&str, &str)]) {
    let cols: Vec<String> = ch()
        .query(&format!(
            "SELECT name FROM system.columns WHERE database = '{ch_db}' AND table = '{table}'"
        ))
        .fetch_all::<String>()
        .await
        .unwrap();
    let exprs: Vec<String> = cols
        .iter()
        .map(|c| match set.iter().find(|(n, _)| n == c) {
            Some((_, e)) => e.to_string(),
            None if c == "_version" => "_version + 1".into(),
            None => format!("`{c}`"),
        })
        .collect();
    ch_exec(format!(
        "INSERT INTO {ch_db}.{table} ({}) SELECT {} FROM {ch_db}.{table} FINAL WHERE id = {id}",
        cols.iter()
            .map(|c| format!("`{c}`"))
            .collect::<Vec<_>>()
            .join(", "),
        exprs.join(", ")
    ))
    .await;
}

/// The types table of the verify tests: every MySQL type the mapping names, at values whose
/// renderings differ between the servers (floats one ulp apart, decimals with trailing zeros,
/// zero dates, fractional seconds, bytes that are not UTF-8, NULLs).
async fn verify_types_table(c: &mut mysql_async::Conn, db: &str) -> u64 {
    c.query_drop("SET SESSION sql_mode = ''").await.unwrap();
    c.query_drop(format!(
        "CREATE TABLE `{db}`.types (id INT PRIMARY KEY, f FLOAT, d DOUBLE NOT NULL, \
         dec30 DECIMAL(30,10), dec0 DECIMAL(10,0), d6 DATETIME(6), dt DATETIME, ts TIMESTAMP(3) NULL, \
         dd DATE, tm TIME(3), y YEAR, b BINARY(4), vb VARBINARY(10), j JSON, l VARCHAR(20) \
         CHARACTER SET latin1, e ENUM('a','b'), s SET('x','y'), bits BIT(10), u BIGINT UNSIGNED, \
         txt VARCHAR(40) CHARACTER SET utf8mb4, n INT NULL)"
    ))
    .await
    .unwrap();
    c.query_drop(format!(
        "INSERT INTO `{db}`.types VALUES \
         (1, 0.1, 0.1, 12.5, 100, '2024-01-02 03:04:05.123456', '2024-01-02 03:04:05', \
          '2024-01-02 03:04:05.5', '2024-01-02', '-838:59:59.000', 2024, 'ab', 0x00ff, \
          '{{\"a\": [1, 2.5]}}', 'café', 'b', 'x,y', b'1010101010', 18446744073709551615, \
          'tea 🍵', NULL), \
         (2, -3.4e38, 1e300, -0.0000000001, -5, '1970-01-01 00:00:00', '2099-12-31 23:59:59', \
          NULL, '2099-12-31', '00:00:00.001', 1901, 0x00000000, '', 'null', '', 'a', '', 0, 0, '', 7), \
         (3, 1.17549435e-38, 5e-324, 0, 0, '2099-12-31 23:59:59.999999', '1970-01-01 00:00:01', \
          '2038-01-19 03:14:07.999', '1970-01-01', '838:59:59.999', 2155, 'abcd', 'a,b', '[]', \
          'x', 'b', 'y', 1023, 1, 'a\\tb', -1), \
         (4, NULL, 0.30000000000000004, 99999999999999999999.9999999999, 9999999999, NULL, NULL, \
          NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL)"
    ))
    .await
    .unwrap();
    4
}

/// `sluice verify` on a running pipeline: an exact mirror verifies clean, a W1 table in many
/// chunks and a table of every type at the values whose renderings differ between the
/// servers; then rows made missing, extra and different in the target (one by a float one
/// ulp off, which a comparison of printed values would miss) are reported with exactly those
/// keys and columns.
#[tokio::test(flavor = "multi_thread")]
async fn sluice_verify_reports_exactly_the_rows_the_target_lost_gained_or_changed() {
    let rows = 3000;
    let (db, m_db, mut cap, mut c, _group, mut a) = mirrored_w1("sluice_t_verify", rows).await;
    let types = verify_types_table(&mut c, &db).await;
    let deadline = Instant::now() + Duration::from_secs(60);
    while target_count(&m_db, "types").await < types {
        assert!(Instant::now() < deadline, "the types table did not arrive");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    let (code, report, err) = sluice_tests::capture::verify(&cap, &a, &["--chunk-rows", "400"]);
    assert_eq!(code, Some(0), "{report:#}\n{err}");
    assert_eq!(report["result"], "equal", "{report:#}");
    let w1 = verified(&report, "binlog_field_test_1");
    assert_eq!(w1["rows"], rows, "{report:#}");
    assert_eq!(w1["chunks"], rows / 400 + 1, "{report:#}");
    assert_eq!(verified(&report, "types")["rows"], types, "{report:#}");
    // With the environment overrides the README teaches, each config takes its own: the
    // capture's [mysql] and the applier's [clickhouse]; a section neither has is named.
    let verify_with = |env: &[(&str, String)]| {
        let mut cmd = std::process::Command::new(sluice_tests::bin("sluice"));
        cmd.args(["verify", "--quiet", "--capture-config"])
            .arg(cap.config_path())
            .arg("--apply-config")
            .arg(a.config_path())
            .env("SLUICE_KAFKA_BROKERS", sluice_tests::kafka_brokers());
        for (k, v) in env {
            cmd.env(k, v);
        }
        let out = cmd.output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned()
            + &String::from_utf8_lossy(&out.stderr);
        (out.status.code(), text)
    };
    let (code, out) = verify_with(&[
        ("SLUICE__MYSQL__URL", sluice_tests::mysql_url()),
        ("SLUICE__CLICKHOUSE__URL", sluice_tests::clickhouse_url()),
    ]);
    assert_eq!(code, Some(0), "{out}");
    let (code, out) = verify_with(&[("SLUICE__CLICKHOUS__URL", "http://x".into())]);
    assert_eq!(code, Some(2), "{out}");
    assert!(
        out.contains("SLUICE__CLICKHOUS__*: no config given has that section"),
        "{out}"
    );

    // A table it cannot find is no difference: exit 2, naming it.
    let (code, report, err) =
        sluice_tests::capture::verify_exit(&cap, &a, &["--table", "no_such_db.no_such_table"]);
    assert_eq!(code, Some(2), "{report}{err}");
    assert!(
        err.contains("no_such_db.no_such_table: no such table"),
        "{err}"
    );

    let w1_table = "binlog_field_test_1";
    tamper(&m_db, w1_table, 17, &[("_deleted", "1")]).await;
    tamper(&m_db, w1_table, 1234, &[("id", "999999")]).await;
    tamper(
        &m_db,
        w1_table,
        42,
        &[
            ("testvarchar", "'tampered'"),
            ("testdecimal", "toDecimal32(1.5, 2)"),
            ("testdatetime", "testdatetime + 1"),
        ],
    )
    .await;
    tamper(&m_db, "types", 1, &[("d", "d * 1.0000000000000002")]).await;
    let (code, report, err) = sluice_tests::capture::verify(&cap, &a, &["--chunk-rows", "400"]);
    assert_eq!(code, Some(1), "{report:#}\n{err}");
    assert_eq!(report["result"], "different", "{report:#}");
    let w1 = verified(&report, w1_table);
    assert_eq!(verified_ids(w1, "missing"), ["17"], "{w1:#}");
    assert_eq!(verified_ids(w1, "extra"), ["999999"], "{w1:#}");
    assert_eq!(verified_ids(w1, "different"), ["42"], "{w1:#}");
    assert!(verified_ids(w1, "unsettled").is_empty(), "{w1:#}");
    let changed: Vec<(&str, &str, &str)> = w1["different"][0]["columns"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            (
                c["column"].as_str().unwrap(),
                c["source"].as_str().unwrap(),
                c["target"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        changed,
        [
            ("testvarchar", "v42", "tampered"),
            ("testdatetime", "2024-01-02 03:04:05", "2024-01-02 03:04:06"),
            ("testdecimal", "42.25", "1.5"),
        ],
        "{w1:#}"
    );
    // Only the chunks holding those keys were read key by key.
    assert!(w1["chunks_narrowed"].as_u64().unwrap() <= 3, "{w1:#}");
    let t = verified(&report, "types");
    assert_eq!(verified_ids(t, "different"), ["1"], "{t:#}");
    assert_eq!(t["different"][0]["columns"][0]["column"], "d", "{t:#}");
    assert_eq!(t["different"][0]["columns"][0]["source"], "0.1", "{t:#}");
    // One or two ulps above 0.1 (18.16 parses the factor's literal less exactly).
    let off: f64 = t["different"][0]["columns"][0]["target"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(off > 0.1 && off < 0.1 + 1e-16, "{t:#}");

    // One table only, in text.
    let (code, out, err) = sluice_tests::capture::sluice(&[
        "verify",
        "--quiet",
        "--capture-config",
        cap.config_path().to_str().unwrap(),
        "--apply-config",
        a.config_path().to_str().unwrap(),
        "--table",
        &format!("{db}.types"),
    ]);
    assert_eq!(code, Some(1), "{out}{err}");
    assert!(
        out.contains("  different id=1\n    d: source \"0.1\", target \"0.1000000000000000"),
        "{out}"
    );
    assert!(!out.contains(w1_table), "{out}");
    assert!(
        out.contains(&format!("{db}.types -> {m_db}.types: different")),
        "{out}"
    );
    assert!(out.contains("different: 1 of 1 tables different;"), "{out}");
    // A capture that is not running is said, not waited for: once its last checkpoint is older
    // than a running capture's would be, verify stops with exit 2, naming it.
    cap.stop_ok();
    c.query_drop(sluice_tests::w1_insert(&db, 900_000, 1))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(31)).await;
    let started = Instant::now();
    let (code, out, err) = sluice_tests::capture::verify_exit(&cap, &a, &["--wait-secs", "600"]);
    assert_eq!(code, Some(2), "{out}{err}");
    assert!(err.contains("it is not running"), "{err}");
    println!("a stopped capture was said after {:?}", started.elapsed());
    finish(&db, &mut [&mut a]).await;
}

/// `sluice verify` while a writer updates, deletes, inserts and moves keys: rows changing during
/// the check are never reported (they are read again once the target has caught up), and a
/// row broken in the target meanwhile is.
#[tokio::test(flavor = "multi_thread")]
async fn sluice_verify_under_a_writer_reports_only_what_persists() {
    let rows = 20_000;
    let (db, m_db, mut cap, _c, _group, mut a) = mirrored_w1("sluice_t_verify_w", rows).await;
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    // The writer changes keys 1..=10000; key 15000 is left alone, and broken in the target.
    let writer = concurrent_writer(&db, rows / 2, Duration::from_millis(2), stop.clone());
    tokio::time::sleep(Duration::from_secs(1)).await;
    let (code, report, err) =
        sluice_tests::capture::verify(&cap, &a, &["--chunk-rows", "1000", "--parallel", "3"]);
    assert_eq!(code, Some(0), "{report:#}\n{err}");
    let w1 = verified(&report, "binlog_field_test_1");
    assert!(
        w1["chunks_narrowed"].as_u64().unwrap() > 0,
        "no chunk changed during the check: the test proves nothing: {w1:#}"
    );
    tamper(
        &m_db,
        "binlog_field_test_1",
        15000,
        &[("testint", "testint + 1")],
    )
    .await;
    let (code, report, err) =
        sluice_tests::capture::verify(&cap, &a, &["--chunk-rows", "1000", "--parallel", "3"]);
    assert_eq!(code, Some(1), "{report:#}\n{err}");
    let w1 = verified(&report, "binlog_field_test_1");
    assert_eq!(verified_ids(w1, "different"), ["15000"], "{w1:#}");
    assert!(verified_ids(w1, "missing").is_empty(), "{w1:#}");
    assert!(verified_ids(w1, "extra").is_empty(), "{w1:#}");
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let statements = writer.await.unwrap();
    eprintln!("the writer ran {statements} statements");
    finish(&db, &mut [&mut cap, &mut a]).await;
}
