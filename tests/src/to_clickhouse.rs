//! The W1 table's pipeline into ClickHouse, for the tests that run one: the servers' clients,
//! an apply-clickhouse process, the source table and its mirror compared, a mixed load.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use mysql_async::prelude::Queryable;
use serde::Deserialize;

use crate::capture::{binlog_end, CaptureProcess};
use crate::{clickhouse_url, kafka_brokers, mysql_url, unique, w1_insert};

/// A client of `SLUICE_CLICKHOUSE_URL`.
pub fn ch() -> clickhouse::Client {
    clickhouse::Client::default()
        .with_url(clickhouse_url())
        .with_validation(false)
}

/// A connection to `SLUICE_MYSQL_URL`.
pub async fn mysql() -> mysql_async::Conn {
    mysql_async::Conn::new(mysql_async::Opts::from_url(&mysql_url()).unwrap())
        .await
        .unwrap()
}

/// An apply-clickhouse process reading the topics of `prefix` into ClickHouse database `ch_db`.
pub fn apply(prefix: &str, ch_db: &str, mode: &str, group: &str, extra: &str) -> CaptureProcess {
    apply_to(&clickhouse_url(), prefix, ch_db, mode, group, extra)
}

/// The same, writing to the ClickHouse server at `url`.
pub fn apply_to(
    url: &str,
    prefix: &str,
    ch_db: &str,
    mode: &str,
    group: &str,
    extra: &str,
) -> CaptureProcess {
    apply_to_with(url, prefix, ch_db, mode, group, extra, "")
}

/// [`apply_to`] with more `[consumer]` keys.
pub fn apply_to_with(
    url: &str,
    prefix: &str,
    ch_db: &str,
    mode: &str,
    group: &str,
    extra: &str,
    consumer: &str,
) -> CaptureProcess {
    let batch = if extra.contains("[batch]") {
        ""
    } else {
        "[batch]\nmax_wait_ms = 200\n"
    };
    // One [tables] section: the mode goes into the caller's when it has one.
    let (tables, extra) = if extra.contains("[tables]\n") {
        (
            String::new(),
            extra.replacen("[tables]\n", &format!("[tables]\nmode = \"{mode}\"\n"), 1),
        )
    } else {
        (format!("[tables]\nmode = \"{mode}\"\n"), extra.to_string())
    };
    let text = format!(
        "[clickhouse]\nurl = \"{}\"\ndatabase = \"{ch_db}\"\n\
         [consumer]\ngroup_id = \"{group}\"\ntopics = [\"^{}\\\\..*\"]\n{consumer}\n\
         {batch}{tables}\
         [kafka]\nbrokers = \"{}\"\n{extra}\n",
        url,
        prefix.replace('.', "\\\\."),
        kafka_brokers()
    );
    CaptureProcess::spawn_binary("apply-clickhouse", (text, String::new(), String::new()))
}

/// Source database `db` with the W1 table; the connection that made it.
pub async fn w1_source(db: &str) -> mysql_async::Conn {
    let mut c = mysql().await;
    c.query_drop(format!("CREATE DATABASE `{db}`"))
        .await
        .unwrap();
    c.query_drop(crate::w1_create_table(db)).await.unwrap();
    c
}

/// The columns compared between source and target, as text.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Deserialize, clickhouse::Row)]
pub struct Compared {
    pub id: u64,
    pub varchar: String,
    pub int: i64,
    pub ubig: u64,
    pub en: String,
    pub set: String,
    pub dec: String,
    pub time: String,
    pub dt: String,
}

pub async fn source_rows(db: &str) -> Vec<Compared> {
    let rows: Vec<mysql_async::Row> = mysql()
        .await
        .query(format!(
            "SELECT id, testvarchar, testint, test_unsinged_bigint, CAST(testenum AS CHAR), \
             CAST(testset AS CHAR), CAST(testdecimal AS CHAR), CAST(testtime AS CHAR), \
             CAST(testdatetime AS CHAR) FROM `{db}`.binlog_field_test_1 ORDER BY id"
        ))
        .await
        .unwrap();
    rows.into_iter()
        .map(|r| Compared {
            id: r.get(0).unwrap(),
            varchar: r.get(1).unwrap(),
            int: r.get(2).unwrap(),
            ubig: r.get(3).unwrap(),
            en: r.get(4).unwrap(),
            set: r.get(5).unwrap(),
            dec: r.get(6).unwrap(),
            time: r.get(7).unwrap(),
            dt: r.get(8).unwrap(),
        })
        .collect()
}

pub async fn mirror_rows(ch_db: &str) -> Vec<Compared> {
    ch().query(&format!(
        "SELECT id, testvarchar, toInt64(testint), test_unsinged_bigint, testenum, testset, \
         toString(testdecimal), testtime, toString(testdatetime) \
         FROM {ch_db}.binlog_field_test_1 FINAL WHERE _deleted = 0 ORDER BY id"
    ))
    .fetch_all::<Compared>()
    .await
    .unwrap_or_default()
}

/// Wait until the mirror equals the source (or fail with the difference).
pub async fn converge(db: &str, ch_db: &str, limit: Duration) {
    let want = source_rows(db).await;
    let deadline = Instant::now() + limit;
    loop {
        let got = mirror_rows(ch_db).await;
        if got == want {
            return;
        }
        if Instant::now() > deadline {
            let g: BTreeMap<u64, &Compared> = got.iter().map(|r| (r.id, r)).collect();
            let w: BTreeMap<u64, &Compared> = want.iter().map(|r| (r.id, r)).collect();
            let missing: Vec<_> = w.keys().filter(|k| !g.contains_key(k)).take(5).collect();
            let extra: Vec<_> = g.keys().filter(|k| !w.contains_key(k)).take(5).collect();
            let differ: Vec<_> = w
                .iter()
                .filter(|(k, v)| g.get(k).is_some_and(|x| x != *v))
                .take(3)
                .collect();
            panic!(
                "mirror {ch_db} != source {db}: {} vs {} rows; missing {missing:?}, extra \
                 {extra:?}, differing {differ:#?}",
                got.len(),
                want.len()
            );
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

/// The answer to `sql` as TabSeparated text (a refusal fails the test, naming the query).
pub async fn text(sql: &str) -> String {
    crate::capture::clickhouse_tsv(sql)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"))
}

pub async fn ch_exec(sql: String) {
    ch().query(&sql).execute().await.unwrap();
}

/// A test's source database, its ClickHouse database (`<db><suffix>`), and a capture of it.
pub async fn pipeline(name: &str, suffix: &str) -> (String, String, CaptureProcess) {
    let db = unique(name);
    let ch_db = format!("{db}{suffix}");
    ch_exec(format!("CREATE DATABASE {ch_db}")).await;
    let cap = CaptureProcess::spawn(CaptureProcess::config(&db, &binlog_end().await, ""));
    (db, ch_db, cap)
}

/// Stop every process (each must exit 0) and drop the source database.
pub async fn finish(db: &str, processes: &mut [&mut CaptureProcess]) {
    for p in processes.iter_mut() {
        p.stop_ok();
    }
    mysql()
        .await
        .query_drop(format!("DROP DATABASE `{db}`"))
        .await
        .unwrap();
}

/// A mixed load: inserts, updates, deletes, key changes.
pub async fn mixed_load(db: &str) -> usize {
    let mut c = mysql().await;
    for b in 0..3 {
        c.query_drop(w1_insert(db, 1 + b * 100, 100)).await.unwrap();
    }
    let t = format!("`{db}`.binlog_field_test_1");
    c.query_drop(format!(
        "UPDATE {t} SET testvarchar = CONCAT('u', id), testint = -id WHERE id % 5 = 0"
    ))
    .await
    .unwrap();
    c.query_drop(format!("DELETE FROM {t} WHERE id % 10 = 3"))
        .await
        .unwrap();
    c.query_drop(format!(
        "UPDATE {t} SET id = id + 10000 WHERE id IN (1, 2, 4, 6, 7)"
    ))
    .await
    .unwrap();
    300 + 60 + 30 + 10
}

/// A W1 source table with rows 1..=`rows`, captured and mirrored by apply-clickhouse in a new
/// group, converged: (source db, mirror db, capture, source connection, group, applier).
pub async fn mirrored_w1(
    name: &str,
    rows: u64,
) -> (
    String,
    String,
    CaptureProcess,
    mysql_async::Conn,
    String,
    CaptureProcess,
) {
    let (db, m_db, cap) = pipeline(name, "_mirror").await;
    let mut c = w1_source(&db).await;
    c.query_drop(w1_insert(&db, 1, rows)).await.unwrap();
    let group = unique("g");
    let a = apply(&cap.prefix, &m_db, "mirror", &group, "");
    converge(&db, &m_db, Duration::from_secs(60)).await;
    (db, m_db, cap, c, group, a)
}

/// The live rows of a mirror table, by its newest version of each id.
pub async fn target_count(ch_db: &str, table: &str) -> u64 {
    ch().query(&format!(
        "SELECT count() FROM (SELECT id, argMax(_deleted, _version) AS d FROM {ch_db}.{table} \
         GROUP BY id) WHERE d = 0"
    ))
    .fetch_one::<u64>()
    .await
    .unwrap_or(0)
}

/// Changes across the whole key range until `stop`: updates, deletes, inserts and primary-key
/// changes. Returns how many statements it ran.
pub fn concurrent_writer(
    db: &str,
    rows: u64,
    pause: Duration,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> tokio::task::JoinHandle<u64> {
    let db = db.to_string();
    tokio::spawn(async move {
        let mut c = mysql().await;
        let t = format!("`{db}`.binlog_field_test_1");
        let mut x: u64 = 0x2545_f491_4f6c_dd1d;
        let mut n = 0u64;
        while !stop.load(std::sync::atomic::Ordering::Relaxed) {
            // xorshift: deterministic, spread over the table.
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let id = 1 + x % rows;
            let sql = match n % 4 {
                0 => format!("UPDATE {t} SET testvarchar = 'w{n}', testint = {n} WHERE id = {id}"),
                1 => format!("DELETE FROM {t} WHERE id = {id}"),
                2 => w1_insert(&db, 1_000_000 + n, 1),
                _ => format!("UPDATE {t} SET id = {} WHERE id = {id}", 2_000_000 + n),
            };
            c.query_drop(sql).await.unwrap();
            n += 1;
            if !pause.is_zero() {
                tokio::time::sleep(pause).await;
            }
        }
        n
    })
}
