//! Every value exact, or its table refused: MariaDB -> capture-mysql -> Kafka ->
//! apply-clickhouse, through both capture paths (the rows of the snapshot, then the same rows
//! again through the binlog) and into both table modes (a mirror and a change log with the
//! server's date types, a change log with dates as text), on whichever server `SLUICE_CLICKHOUSE_URL` names (the
//! suite runs it against ClickHouse 18.16 and 26.9). Every cell is compared with MariaDB's own
//! rendering of it (`CAST(c AS CHAR)`, `CONVERT(c USING utf8mb4)`), as hex, so no printing
//! rule of either side can hide a difference.
//!
//! The classes of issue "every value exact": dates and times at and past each server's range,
//! dates MySQL keeps but the calendar has not (`2026-02-30`, `2026-05-00`), decimals of 18, 38
//! and 65 digits, text in every character set the server lists (with the characters whose
//! mappings differ between tables of the same name, such as WAVE DASH in `sjis`), and MariaDB's
//! INET4, INET6 and UUID. A value the target type cannot hold stops its table, the row, the
//! column and the remedy named, while the other tables flow.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use mysql_async::prelude::Queryable;
use sluice_tests::capture::{clickhouse_tsv, metric_at, CaptureProcess};
use sluice_tests::{mysql_url, unique};

async fn ch(sql: &str) -> String {
    clickhouse_tsv(sql)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"))
}

/// Characters whose mappings differ between the common tables of a charset (Japanese tilde,
/// dash and yen signs; Windows' and ISO's upper halves; box drawing), and some of every
/// script a charset on the server may hold. Converted to each charset by the server: what a
/// charset lacks becomes `?`, the rest is that charset's own bytes.
const SAMPLE: &str = "aZ09 ~\\¥‾〜～－−‐―‖∥¢£¬¦ éàüßçñøÆŒœŠšŽžŸ€‚ƒ„…†‡ˆ‰‹›•–—˜™ \
    «»°±²³µ¶·¹º¼½¾¿×÷ αβγΩ абвЖЯ กขฃ אבג عربي ░▒▓│┤╬ 亜アｱ①㈱ 啊一丂 가각 €ĀāĂ 😀";

/// A column per character set the server lists (`binary` is a byte string, not text).
async fn charsets(c: &mut mysql_async::Conn) -> Vec<String> {
    let all: Vec<String> = c
        .query("SELECT CHARACTER_SET_NAME FROM information_schema.CHARACTER_SETS ORDER BY 1")
        .await
        .unwrap();
    all.into_iter().filter(|cs| cs != "binary").collect()
}

/// The tables, created and filled with rows `base + 1 ..`.
fn rows(db: &str, cs: &[String], base: u32) -> Vec<String> {
    let id = |n: u32| base + n;
    let mut out = vec![
        // Dates every server's types hold (the zero date: ClickHouse's zero, documented).
        format!(
            "INSERT INTO `{db}`.dates_in VALUES
             ({}, '1970-01-01', '1970-01-01 00:00:00', '1970-01-01 00:00:00.000001', '1970-01-01 00:00:01', '2000-01-01 00:00:00.5'),
             ({}, '2024-02-29', '2024-02-29 23:59:59', '2024-02-29 12:34:56.789012', '2038-01-19 03:14:07', '2038-01-19 03:14:07.999999'),
             ({}, '2106-02-06', '2106-02-06 23:59:59', '2106-02-06 23:59:59.999999', '2001-09-09 01:46:40', '2001-09-09 01:46:40.000001'),
             ({}, '0000-00-00', '0000-00-00 00:00:00', '0000-00-00 00:00:00.000000', '0000-00-00 00:00:00', '0000-00-00 00:00:00.000000')",
            id(1), id(2), id(3), id(4)
        ),
        // Dates only the widest types hold: 26.8+ holds them all; 18.16 none.
        format!(
            "INSERT INTO `{db}`.dates_far VALUES
             ({}, '1000-01-01', '1000-01-01 00:00:00', '1000-01-01 00:00:00.000001'),
             ({}, '9999-12-31', '9999-12-31 23:59:59', '9999-12-31 23:59:59.999999'),
             ({}, '1969-12-31', '1969-12-31 23:59:59', '1900-01-01 00:00:00.000000'),
             ({}, '2149-06-06', '2106-02-07 06:28:15', '2299-12-31 23:59:59.999999')",
            id(1), id(2), id(3), id(4)
        ),
        // Dates MySQL keeps (ALLOW_INVALID_DATES, no NO_ZERO_IN_DATE) and no date type holds.
        format!(
            "INSERT INTO `{db}`.odd_dates VALUES
             ({}, '2026-02-30', '2026-04-31 10:00:00'),
             ({}, '2026-00-15', '2026-05-00 00:00:00'),
             ({}, '2026-02-28', '0000-00-00 10:00:00')",
            id(1), id(2), id(3)
        ),
        format!(
            "INSERT INTO `{db}`.decimals VALUES
             ({}, '-99999999999999.9999', '-9999999999999999999999999999.9999999999', '-{n35}.{n30}'),
             ({}, '0.0001', '0.0000000001', '0.{z29}1'),
             ({}, '12.5000', '1.5', '12.5')",
            id(1), id(2), id(3),
            n35 = "9".repeat(35), n30 = "9".repeat(30), z29 = "0".repeat(29)
        ),
        format!(
            "INSERT INTO `{db}`.mariadb_types VALUES
             ({}, '127.0.0.1', '::ffff:1.2.3.4', '6ccd780c-baba-1026-9564-5b8c656024db'),
             ({}, '255.254.0.1', '2001:db8::ff00:42:8329', '00112233-4455-4677-8899-aabbccddeeff'),
             ({}, '0.0.0.0', '::1.2.3.4', '00000000-0000-0000-0000-000000000000'),
             ({}, '10.0.0.0', '1:0:0:1:0:0:1:1', 'ffffffff-ffff-ffff-ffff-ffffffffffff'),
             ({}, NULL, '::', NULL)",
            id(1), id(2), id(3), id(4), id(5)
        ),
    ];
    // Text: the sample in each charset, and every byte from 0x80 for one-byte charsets.
    let sample = |n: &str| {
        cs.iter()
            .map(|c| format!("CONVERT({n} USING {c})"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let high: Vec<String> = (0x80..=0xff).map(|b| format!("{b}")).collect();
    let high = cs
        .iter()
        .map(|c| {
            format!(
                "IFNULL(CHAR({} USING {c}), CONVERT('' USING {c}))",
                high.join(", ")
            )
        })
        .collect::<Vec<_>>()
        .join(", ");
    out.push(format!(
        "INSERT INTO `{db}`.texts VALUES ({}, {}), ({}, {high})",
        id(1),
        sample(&format!("'{}'", SAMPLE.replace('\\', "\\\\"))),
        id(2)
    ));
    out
}

fn create(db: &str, cs: &[String]) -> Vec<String> {
    let text_columns = cs
        .iter()
        .map(|c| format!("`t_{c}` VARCHAR(200) CHARACTER SET {c}"))
        .collect::<Vec<_>>()
        .join(", ");
    vec![
        format!("CREATE DATABASE `{db}`"),
        format!(
            "CREATE TABLE `{db}`.dates_in (id INT PRIMARY KEY, d DATE, dt DATETIME, \
             dt6 DATETIME(6), ts TIMESTAMP NULL, ts6 TIMESTAMP(6) NULL)"
        ),
        format!(
            "CREATE TABLE `{db}`.dates_far (id INT PRIMARY KEY, d DATE, dt DATETIME, \
             dt6 DATETIME(6))"
        ),
        format!("CREATE TABLE `{db}`.odd_dates (id INT PRIMARY KEY, d DATE, dt DATETIME)"),
        format!(
            "CREATE TABLE `{db}`.decimals (id INT PRIMARY KEY, d18 DECIMAL(18,4), \
             d38 DECIMAL(38,10), d65 DECIMAL(65,30))"
        ),
        format!(
            "CREATE TABLE `{db}`.mariadb_types (id INT PRIMARY KEY, a INET4, b INET6 NOT NULL, \
             u UUID)"
        ),
        format!("CREATE TABLE `{db}`.texts (id INT PRIMARY KEY, {text_columns})"),
    ]
}

/// MariaDB's rendering of a column, as hex of UTF-8: `(column, SQL)`.
fn mysql_columns(table: &str, cs: &[String]) -> Vec<(String, String)> {
    let plain = |cols: &[&str]| {
        cols.iter()
            .map(|c| (c.to_string(), format!("HEX(CAST(`{c}` AS CHAR))")))
            .collect::<Vec<_>>()
    };
    match table {
        "dates_in" => plain(&["d", "dt", "dt6", "ts", "ts6"]),
        "dates_far" => plain(&["d", "dt", "dt6"]),
        "odd_dates" => plain(&["d", "dt"]),
        "decimals" => ["d18", "d38", "d65"]
            .iter()
            .map(|c| {
                // Without trailing zeros (current ClickHouse prints none).
                let t = format!("CAST(`{c}` AS CHAR)");
                let trimmed = format!(
                    "IF(LOCATE('.', {t}) > 0, TRIM(TRAILING '.' FROM TRIM(TRAILING '0' FROM {t})), {t})"
                );
                (c.to_string(), format!("HEX({trimmed})"))
            })
            .collect(),
        "mariadb_types" => plain(&["a", "b", "u"]),
        "texts" => cs
            .iter()
            .map(|c| {
                (
                    format!("t_{c}"),
                    format!("HEX(CONVERT(`t_{c}` USING utf8mb4))"),
                )
            })
            .collect(),
        _ => unreachable!(),
    }
}

/// The same in ClickHouse: 18.16 prints its day 0 as `0000-00-00`, which is 1970-01-01.
fn clickhouse_column(table: &str, column: &str, native: bool) -> String {
    let c = format!("`{column}`");
    match table {
        "decimals" => format!(
            "hex(if(position(toString({c}), '.') > 0, \
             replaceRegexpOne(replaceRegexpOne(toString({c}), '0+$', ''), '[.]$', ''), toString({c})))"
        ),
        "dates_in" | "dates_far" | "odd_dates" if native => {
            format!("hex(replaceOne(toString({c}), '0000-00-00', '1970-01-01'))")
        }
        _ => format!("hex(toString({c}))"),
    }
}

/// What the target holds for a cell whose source reads `mysql` (hex), by the documented
/// mapping: dates as the server's types read the zero date as the epoch.
fn expected(table: &str, column: &str, mysql: &str, native_dates: bool) -> String {
    let text = String::from_utf8(sluice_common::hex::decode(mysql).unwrap()).unwrap();
    let text = if native_dates && table.starts_with("dates") && text.starts_with("0000-00-00") {
        text.replacen("0000-00-00", "1970-01-01", 1)
    } else {
        text
    };
    let _ = column;
    sluice_common::hex::encode(text.as_bytes()).to_uppercase()
}

fn short(s: &str) -> &str {
    &s[..s.char_indices().nth(120).map_or(s.len(), |(i, _)| i)]
}

const TABLES: [&str; 6] = [
    "dates_in",
    "dates_far",
    "odd_dates",
    "decimals",
    "mariadb_types",
    "texts",
];

#[tokio::test(flavor = "multi_thread")]
async fn every_value_arrives_exactly_through_both_paths_or_its_table_stops() {
    let db = unique("sluice_t_exact");
    let mut c = mysql_async::Conn::new(mysql_async::Opts::from_url(&mysql_url()).unwrap())
        .await
        .unwrap();
    c.query_drop("SET SESSION sql_mode = 'ALLOW_INVALID_DATES', time_zone = '+00:00'")
        .await
        .unwrap();
    let cs = charsets(&mut c).await;
    for s in create(&db, &cs).into_iter().chain(rows(&db, &cs, 0)) {
        c.query_drop(&s)
            .await
            .unwrap_or_else(|e| panic!("{}...: {e}", short(&s)));
    }
    let version = ch("SELECT version()").await;
    let mut parts = version
        .trim()
        .split('.')
        .map(|p| p.parse::<u32>().unwrap_or(0));
    let v = (parts.next().unwrap_or(0), parts.next().unwrap_or(0));
    println!(
        "ClickHouse {} (version {v:?}), charsets {cs:?}",
        version.trim()
    );

    // The snapshot path: the rows above; then the binlog path: the same rows again.
    let mut cap = CaptureProcess::spawn(CaptureProcess::config(
        &db,
        "end",
        "[snapshot]\nmode = \"snapshot+stream\"\n",
    ));
    let (m_db, c_db, n_db) = (format!("{db}_m"), format!("{db}_c"), format!("{db}_n"));
    for d in [&m_db, &c_db, &n_db] {
        ch(&format!("CREATE DATABASE {d}")).await;
    }
    let mut mirror =
        CaptureProcess::apply_clickhouse_with(&cap.prefix, &m_db, &unique("dlq"), "", "");
    let mut log = CaptureProcess::apply_clickhouse_with(
        &cap.prefix,
        &c_db,
        &unique("dlq"),
        "",
        "[tables]\nmode = \"changelog\"\ntemporal = \"text\"\n",
    );
    // A change log with the server's date types: it stops what the mirror stops.
    let mut native_log = CaptureProcess::apply_clickhouse_with(
        &cap.prefix,
        &n_db,
        &unique("dlq"),
        "",
        "[tables]\nmode = \"changelog\"\n",
    );
    let limit = Instant::now() + Duration::from_secs(120);
    while metric_at(cap.metrics_port, "sluice_capture_snapshot_tables_remaining") != Some(0.0)
        || metric_at(cap.metrics_port, "sluice_capture_snapshot_rows_total").unwrap_or(0.0) < 1.0
    {
        if Instant::now() > limit || cap.child.try_wait().unwrap().is_some() {
            let out = cap.stop().1;
            let tail: Vec<&str> = out.lines().rev().take(8).collect();
            panic!("the snapshot did not finish: {tail:#?}");
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    for s in rows(&db, &cs, 1000) {
        c.query_drop(&s)
            .await
            .unwrap_or_else(|e| panic!("{}...: {e}", short(&s)));
    }

    // Which tables the mirror (the server's date types) must stop: the values no type of this
    // server holds. The change log keeps dates as text: it stops none.
    let full_dates = v >= (26, 8);
    let mut stops: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    // (Which row stops the table first depends on the partitions' order: any of them.)
    stops.insert(
        "odd_dates",
        vec![
            "not a day of the calendar",
            "partial date",
            "zero date with a time of day",
        ],
    );
    if !full_dates {
        stops.insert("dates_far", vec!["is outside what ClickHouse"]);
    }
    let counts: BTreeMap<&str, usize> = [
        ("dates_in", 8),
        ("dates_far", 8),
        ("odd_dates", 6),
        ("decimals", 6),
        ("mariadb_types", 10),
        ("texts", 4),
    ]
    .into_iter()
    .collect();

    // Wait for every table: written whole, or stopped (the mirror).
    let deadline = Instant::now() + Duration::from_secs(150);
    // (target, whether its dates are the server's types)
    let targets = [(&m_db, true), (&c_db, false), (&n_db, true)];
    for (target_db, native) in targets {
        for t in TABLES {
            let stopped = native && stops.contains_key(t);
            loop {
                let done = if stopped {
                    ch(&format!(
                        "SELECT count() FROM system.tables WHERE database = '{target_db}' \
                         AND name = '_sluice_stopped'"
                    ))
                    .await
                    .trim()
                        == "1"
                        && ch(&format!(
                            "SELECT count() FROM {target_db}._sluice_stopped WHERE target = '{t}'"
                        ))
                        .await
                        .trim()
                            != "0"
                } else {
                    ch(&format!(
                        "SELECT count() FROM system.tables WHERE database = '{target_db}' AND name = '{t}'"
                    ))
                    .await
                    .trim()
                        == "1"
                        && ch(&format!("SELECT count() FROM {target_db}.`{t}` FINAL"))
                            .await
                            .trim()
                            == counts[t].to_string()
                };
                if done {
                    break;
                }
                assert!(
                    Instant::now() < deadline,
                    "{target_db}.{t} neither written whole nor stopped"
                );
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        }
    }

    // The stops name the row, the column, the reason and the remedy; the mirror and the
    // change log with the server's types stop the same tables.
    for target_db in [&m_db, &n_db] {
        let reasons = ch(&format!(
            "SELECT target, reason FROM {target_db}._sluice_stopped ORDER BY target"
        ))
        .await;
        for (t, wants) in &stops {
            let line = reasons
                .lines()
                .find(|l| l.starts_with(&format!("{t}\t")))
                .unwrap_or_else(|| panic!("{t} is not stopped: {reasons}"));
            assert!(wants.iter().any(|w| line.contains(w)), "{t}: {line}");
            assert!(
                line.contains(&format!("{t} row (id=")) && line.contains(" column d"),
                "the row and column: {line}"
            );
            assert!(line.contains("temporal_tables"), "the remedy: {line}");
        }
        assert_eq!(
            reasons.lines().count(),
            stops.len(),
            "only those tables stop: {reasons}"
        );
    }
    let log_stops = ch(&format!(
        "SELECT count() FROM system.tables WHERE database = '{c_db}' AND name = '_sluice_stopped'"
    ))
    .await;
    if log_stops.trim() == "1" {
        assert_eq!(
            ch(&format!("SELECT count() FROM {c_db}._sluice_stopped"))
                .await
                .trim(),
            "0",
            "the change log, dates as text, stops nothing"
        );
    }

    // Every cell of every written table equals MariaDB's rendering.
    let mut compared = 0;
    for (target_db, native) in targets {
        let log = target_db != &m_db;
        for t in TABLES {
            if native && stops.contains_key(t) {
                continue;
            }
            let cols = mysql_columns(t, &cs);
            let my_sql = format!(
                "SELECT CONCAT_WS(',', id, {}) FROM `{db}`.`{t}` ORDER BY id",
                cols.iter()
                    .map(|(_, s)| format!("IFNULL({s}, 'N')"))
                    .collect::<Vec<_>>()
                    .join(", ")
            );
            let source: Vec<String> = c.query(&my_sql).await.unwrap();
            let filter = if log {
                " WHERE _op IN ('snapshot', 'insert')"
            } else {
                ""
            };
            let ch_sql = format!(
                "SELECT arrayStringConcat([toString(id), {}], ',') FROM {target_db}.`{t}` FINAL{filter} ORDER BY id",
                cols.iter()
                    .map(|(name, _)| format!("ifNull({}, 'N')", clickhouse_column(t, name, native)))
                    .collect::<Vec<_>>()
                    .join(", ")
            );
            let target: Vec<String> = ch(&ch_sql).await.lines().map(str::to_string).collect();
            assert_eq!(source.len(), target.len(), "{target_db}.{t}: {target:?}");
            for (s, g) in source.iter().zip(&target) {
                let (sv, gv): (Vec<&str>, Vec<&str>) =
                    (s.split(',').collect(), g.split(',').collect());
                assert_eq!(sv[0], gv[0], "{target_db}.{t}: row order");
                for (i, (name, _)) in cols.iter().enumerate() {
                    let want = match sv[i + 1] {
                        "N" => "N".to_string(),
                        hex => expected(t, name, hex, native),
                    };
                    let path = if sv[0].parse::<u32>().unwrap() > 1000 {
                        "binlog"
                    } else {
                        "snapshot"
                    };
                    assert_eq!(
                        gv[i + 1],
                        want,
                        "{target_db}.{t} id {} ({path}) column {name}: target {:?}, source {:?}",
                        sv[0],
                        String::from_utf8_lossy(
                            &sluice_common::hex::decode(gv[i + 1]).unwrap_or_default()
                        ),
                        String::from_utf8_lossy(
                            &sluice_common::hex::decode(&want).unwrap_or_default()
                        ),
                    );
                    compared += 1;
                }
            }
        }
    }
    println!("{compared} cells equal MariaDB's rendering");
    // `sluice verify` renders each type on both servers alike: it finds the mirror equal.
    let names: Vec<String> = TABLES
        .iter()
        .filter(|t| !stops.contains_key(*t))
        .map(|t| format!("{db}.{t}"))
        .collect();
    let mut args: Vec<&str> = Vec::new();
    for n in &names {
        args.extend(["--table", n.as_str()]);
    }
    let (code, report, err) = sluice_tests::capture::verify(&cap, &mirror, &args);
    assert_eq!(code, Some(0), "{report:#}\n{err}");
    assert_eq!(report["result"], "equal", "{report:#}");
    // The types the target got, per server (docs/apply-clickhouse.md, "Type mapping").
    let types = ch(&format!(
        "SELECT table, name, type FROM system.columns WHERE database = '{m_db}' \
         AND table IN ('dates_in', 'decimals', 'mariadb_types') ORDER BY table, name"
    ))
    .await;
    println!("{types}");
    let type_of = |t: &str, col: &str| {
        types
            .lines()
            .find(|l| l.starts_with(&format!("{t}\t{col}\t")))
            .map(|l| l.rsplit('\t').next().unwrap().to_string())
            .unwrap_or_default()
    };
    if v >= (26, 8) {
        assert_eq!(type_of("dates_in", "d"), "Nullable(Date32)");
        assert_eq!(
            type_of("dates_in", "dt"),
            "Nullable(DateTime64(0, \\'UTC\\'))"
        );
        assert_eq!(type_of("decimals", "d65"), "Nullable(Decimal(65, 30))");
        assert_eq!(type_of("mariadb_types", "b"), "IPv6");
        assert_eq!(type_of("mariadb_types", "u"), "Nullable(UUID)");
    } else if v < (20, 1) {
        assert_eq!(type_of("dates_in", "d"), "Nullable(Date)");
        assert_eq!(type_of("decimals", "d38"), "Nullable(String)");
        assert_eq!(type_of("mariadb_types", "b"), "String");
    }

    for p in [&mut cap, &mut mirror, &mut log, &mut native_log] {
        p.stop_ok();
    }
    for d in [&m_db, &c_db, &n_db] {
        ch(&format!("DROP DATABASE {d}")).await;
    }
    c.query_drop(format!("DROP DATABASE `{db}`")).await.unwrap();
}
