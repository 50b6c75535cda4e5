//! The type matrix into ClickHouse: every MySQL type at its edges (the edge table of
//! `sluice_tests::edge`), MariaDB -> capture-mysql -> Kafka -> apply-clickhouse, checked column
//! by column in the mirror table, on whichever server `SLUICE_CLICKHOUSE_URL` names (the test
//! suite runs it against ClickHouse 18.16 and a current one). A row holding a value the target
//! column cannot hold is not written: it goes to the dead-letter topic with the column named.
//! (On 26.8+ every date MySQL keeps fits `Date32`/`DateTime64`: nothing is refused there.)

use std::time::{Duration, Instant};

use mysql_async::prelude::Queryable;
use sluice_tests::capture::{binlog_end, dead_letters, CaptureProcess};
use sluice_tests::{edge, mysql_url, unique};

use sluice_tests::to_clickhouse::{ch, text};

/// Rows 5 and 6: rows 1 and 2 of the edge table with their dates and datetimes moved to the
/// edges of what every ClickHouse holds and reads back (18.16: Date and DateTime up to
/// 2106-02-07 and 2106-02-06 23:59:59; DateTime64 1900 .. 2299), so every other column's
/// extremes reach the target.
fn in_range_rows(db: &str) -> String {
    format!(
        "INSERT INTO `{db}`.edge SELECT id + 4, ti, tiu, si, siu, mi, miu, i, iu, bi, biu, d65, d10,
           f, db, b1, b64, e, s,
           IF(id = 1, '1970-01-01', '2106-02-07'), tm, tm1, tm2, tm6,
           IF(id = 1, '1900-01-01 00:00:00.000000', '2299-12-31 23:59:59.999999'),
           IF(id = 1, '1970-01-01 00:00:01', '2106-02-06 23:59:59'), ts6, y, vc, l1, ch, bin, vb,
           bl, tx, g, js
         FROM `{db}`.edge WHERE id IN (1, 2)"
    )
}

/// What is read back, column by column, in a form both servers print alike: days and seconds
/// for Date and DateTime, hex for bytes, text for the rest.
const SELECT: &str = "id, ti, tiu, si, siu, mi, miu, i, iu, bi, biu, d65, toInt64(d10 * 100), \
    toString(f), toString(db), b1, b64, e, s, toInt32(dt), tm, tm1, tm2, tm6, toString(dtm6), \
    toInt64(dtm0), toString(ts6), y, vc, l1, ch, hex(bin), hex(vb), hex(bl), tx, hex(g), js";

#[tokio::test(flavor = "multi_thread")]
async fn every_type_at_its_edges_into_clickhouse() {
    let db = unique("sluice_t_ch_types");
    let ch_db = format!("{db}_m");
    ch().query(&format!("CREATE DATABASE {ch_db}"))
        .execute()
        .await
        .unwrap();
    let mut cap = CaptureProcess::spawn(CaptureProcess::config(&db, &binlog_end().await, ""));
    let dlq = unique("dlq");
    // Dead letters, chosen: the rows around the refused ones are what this test reads.
    let mut apply = CaptureProcess::apply_clickhouse_with(
        &cap.prefix,
        &ch_db,
        &dlq,
        "",
        "[errors]\non_bad_event = \"dead_letter\"\n",
    );
    let mut c = mysql_async::Conn::new(mysql_async::Opts::from_url(&mysql_url()).unwrap())
        .await
        .unwrap();
    for s in [
        format!("CREATE DATABASE `{db}`"),
        edge::create_table(&db),
        edge::SESSION.to_string(),
        edge::insert_rows(&db),
        in_range_rows(&db),
    ] {
        c.query_drop(&s)
            .await
            .unwrap_or_else(|e| panic!("{s}: {e}"));
    }
    // Wait until every row is written or dead-lettered.
    let deadline = Instant::now() + Duration::from_secs(90);
    let mut written = String::new();
    while Instant::now() < deadline {
        written = text(&format!(
            "SELECT count() FROM system.tables WHERE database = '{ch_db}' AND name = 'edge'"
        ))
        .await;
        if written.trim() == "1" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    assert_eq!(written.trim(), "1", "the target table was never created");
    let version = text("SELECT version()").await;
    let mut parts = version
        .trim()
        .split('.')
        .map(|p| p.parse::<u32>().unwrap_or(0));
    let v = (parts.next().unwrap_or(0), parts.next().unwrap_or(0));
    // DateTime64 came with ClickHouse 20.1; from 26.8 Date32 and DateTime64 hold 0000..9999.
    let (current, full) = (v >= (20, 1), v >= (26, 8));
    // Rows 3 to 6 written, and 1 and 2 where every date fits (else refused, below).
    let want_rows = if full { "6" } else { "4" };
    while Instant::now() < deadline
        && text(&format!("SELECT count() FROM {ch_db}.edge FINAL"))
            .await
            .trim()
            != want_rows
    {
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let columns = text(&format!("DESCRIBE TABLE {ch_db}.edge")).await;
    let rows = text(&format!(
        "SELECT {SELECT} FROM {ch_db}.edge FINAL ORDER BY id"
    ))
    .await;
    let want_letters = if full { 0 } else { 2 };
    let letters: Vec<String> = tokio::task::spawn_blocking(move || {
        if want_letters == 0 {
            // Nothing refused: read for a while, to see that nothing comes.
            dead_letters(&dlq, 1)
        } else {
            dead_letters(&dlq, want_letters)
        }
    })
    .await
    .unwrap()
    .into_iter()
    .map(|(_, reason)| reason)
    .collect();
    println!(
        "ClickHouse {} (DateTime64: {current})\n{columns}",
        version.trim()
    );
    // The column types the mapping gives (docs/apply-clickhouse.md, "Type mapping").
    let types: Vec<&str> = columns
        .lines()
        .map(|l| l.split('\t').nth(1).unwrap_or(""))
        .collect();
    let fractional = if current {
        "Nullable(DateTime64(6, \\'UTC\\'))"
    } else {
        "Nullable(String)"
    };
    assert_eq!(types[24], fractional, "DATETIME(6): {columns}");
    assert_eq!(types[26], fractional, "TIMESTAMP(6): {columns}");
    let d256 = v >= (22, 8);
    let d65 = if d256 {
        "Nullable(Decimal(65, 30))"
    } else {
        "Nullable(String)"
    };
    assert_eq!(types[11], d65, "DECIMAL(65,30): {columns}");
    assert_eq!(
        types[12], "Nullable(Decimal(10, 2))",
        "DECIMAL(10,2): {columns}"
    );
    assert_eq!(types[10], "Nullable(UInt64)", "BIGINT UNSIGNED: {columns}");
    let (date, datetime) = if current {
        ("Nullable(Date32)", "Nullable(DateTime64(0, \\'UTC\\'))")
    } else {
        ("Nullable(Date)", "Nullable(DateTime(\\'UTC\\'))")
    };
    assert_eq!(types[19], date, "DATE: {columns}");
    assert_eq!(types[25], datetime, "DATETIME: {columns}");

    // The zero DATETIME(6) and TIMESTAMP(6): text as MySQL prints them where they travel as
    // text; ClickHouse's zero (the epoch) in DateTime64, as the zero DATE and DATETIME are
    // (the documented mapping).
    let zero6 = if current {
        "1970-01-01 00:00:00.000000"
    } else {
        "0000-00-00 00:00:00.000000"
    };
    let nines = format!("{}.{}", "9".repeat(35), "9".repeat(30));
    let neg_nines = format!("-{nines}");
    // A Decimal prints no trailing zeros on current servers; text keeps them.
    let zeros = if d256 {
        "0".to_string()
    } else {
        format!("0.{}", "0".repeat(30))
    };
    let row3: Vec<&str> = vec![
        "3", "0", "\\N", "\\N", "\\N", "\\N", "\\N", "\\N", "\\N", "\\N", "\\N", &zeros, "50",
        "\\N", "\\N", "\\N", "\\N", "b\\'q", "x,z", "0", "00:00:00", "\\N", "\\N", "\\N", zero6,
        "0", zero6, "0", "\\N", "\\N", "\\N", "\\N", "\\N", "\\N", "\\N", "\\N", "\\N",
    ];
    let mut row4 = vec!["4"];
    row4.extend(std::iter::repeat_n("\\N", 36));
    let row5: Vec<&str> = vec![
        "5",
        "-128",
        "0",
        "-32768",
        "0",
        "-8388608",
        "0",
        "-2147483648",
        "0",
        "-9223372036854775808",
        "0",
        &neg_nines,
        "-9999999999",
        "-1.5",
        "-1.7976931348623157e308",
        "0",
        "0",
        "a",
        "",
        "0",
        "-838:59:59",
        "-00:00:01.5",
        "-838:59:58.99",
        "-00:00:00.000001",
        "1900-01-01 00:00:00.000000",
        "1",
        "1970-01-01 00:00:01.000000",
        "1901",
        "",
        "café",
        "",
        "00000000",
        "0000",
        "",
        "",
        "0101000000000000000000F03F0000000000000040",
        "{}",
    ];
    let mut row6: Vec<&str> = vec![
        "6",
        "127",
        "255",
        "32767",
        "65535",
        "8388607",
        "16777215",
        "2147483647",
        "4294967295",
        "9223372036854775807",
        "18446744073709551615",
        &nines,
        "9999999999",
        "1.2676506e30",
        "2.2250738585072014e-308",
        "1",
        "18446744073709551615",
        "c",
        "x,y,z",
        "65535",
        "838:59:59",
        "838:59:58.9",
        "00:00:00.01",
        "838:59:58.999999",
        "2299-12-31 23:59:59.999999",
        "4294967295",
        "2038-01-19 03:14:07.999999",
        "2155",
        "emoji \u{1F600} utf8mb4",
        "\u{20ac}uro",
        "ten chars!",
        "FF00FF00",
        "00FF00",
        "000102FF",
        "text",
        "\\N",
        r#"{"a":[1,2.5,null,"x"],"b":{"c":true}}"#,
    ];
    // Row 6's DATE and DATETIME(0): 2106-02-07 (day 49710), 2106-02-06 23:59:59.
    row6[19] = "49710";
    row6[25] = "4294943999";
    let names: Vec<&str> = columns
        .lines()
        .map(|l| l.split('\t').next().unwrap_or(""))
        .collect();
    let got: Vec<Vec<&str>> = rows.lines().map(|l| l.split('\t').collect()).collect();
    let mut want = vec![row3, row4, row5.clone(), row6.clone()];
    if full {
        // Rows 1 and 2 are rows 5 and 6 with MySQL's first and last dates.
        let mut row1 = row5;
        row1[0] = "1";
        row1[19] = "-354285";
        row1[24] = "1000-01-01 00:00:00.000000";
        row1[25] = "-30610224000";
        let mut row2 = row6;
        row2[0] = "2";
        row2[19] = "2932896";
        row2[24] = "9999-12-31 23:59:59.999999";
        row2[25] = "253402300799";
        want.insert(0, row2);
        want.insert(0, row1);
    }
    assert_eq!(
        got.len(),
        want.len(),
        "rows 3 to 6 are written, 1 and 2 where every date fits (else refused):\n{rows}"
    );
    for (got, want) in got.iter().zip(&want) {
        assert_eq!(got.len(), want.len(), "{got:?}");
        for (i, (g, w)) in got.iter().zip(want).enumerate() {
            assert_eq!(g, w, "row {}, column {}", want[0], names[i]);
        }
    }
    // Below 26.8, rows 1 and 2 hold dates no date type of the server holds: each is refused,
    // with the row, the column and the reason named, and nothing of it is written.
    assert_eq!(letters.len(), want_letters, "{letters:#?}");
    for l in &letters {
        assert!(
            l.contains(".edge row (id=")
                && l.contains(" column dt: ")
                && l.contains("is outside what ClickHouse"),
            "{l}"
        );
    }
    if !full {
        assert!(
            letters.iter().any(|l| l.contains("1000-01-01")),
            "{letters:?}"
        );
        assert!(
            letters.iter().any(|l| l.contains("9999-12-31")),
            "{letters:?}"
        );
    }
    for p in [&mut cap, &mut apply] {
        p.stop_ok();
    }
    ch().query(&format!("DROP DATABASE {ch_db}"))
        .execute()
        .await
        .unwrap();
    c.query_drop(format!("DROP DATABASE `{db}`")).await.unwrap();
}
