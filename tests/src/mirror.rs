//! A source table `t (id BIGINT PRIMARY KEY, v INT, s VARCHAR(40))` and its ClickHouse mirror,
//! for the tests that run a pipeline under load and compare the two at the end.

use std::collections::BTreeMap;

use mysql_async::prelude::Queryable;

use crate::{clickhouse_url, mysql_url};

/// `(id, v, s)`.
pub type Row = (u64, i64, String);

/// Source database `db` with table `t`, and ClickHouse database `{db}_m`: a connection to the
/// source and a client of the target.
pub async fn make(db: &str) -> (mysql_async::Conn, clickhouse::Client) {
    let mut c = mysql_async::Conn::new(mysql_async::Opts::from_url(&mysql_url()).unwrap())
        .await
        .unwrap();
    c.query_drop(format!("CREATE DATABASE `{db}`"))
        .await
        .unwrap();
    c.query_drop(format!(
        "CREATE TABLE `{db}`.t (id BIGINT PRIMARY KEY, v INT NOT NULL, s VARCHAR(40) NOT NULL)"
    ))
    .await
    .unwrap();
    let ch = clickhouse::Client::default()
        .with_url(clickhouse_url())
        .with_validation(false);
    ch.query(&format!("CREATE DATABASE {db}_m"))
        .execute()
        .await
        .unwrap();
    (c, ch)
}

/// The source's rows, by id.
pub async fn source(db: &str) -> Vec<Row> {
    let mut c = mysql_async::Conn::new(mysql_async::Opts::from_url(&mysql_url()).unwrap())
        .await
        .unwrap();
    c.query(format!("SELECT id, v, s FROM `{db}`.t ORDER BY id"))
        .await
        .unwrap()
}

/// The mirror's live rows, by id (none while it cannot be read).
pub async fn mirror(ch: &clickhouse::Client, ch_db: &str) -> Vec<Row> {
    ch.query(&format!(
        "SELECT id, toInt64(v), s FROM {ch_db}.t FINAL WHERE _deleted = 0 ORDER BY id"
    ))
    .fetch_all::<Row>()
    .await
    .unwrap_or_default()
}

/// How `got` differs from `want`: a few missing, extra and stale rows.
pub fn differences(got: &[Row], want: &[Row]) -> String {
    let g: BTreeMap<u64, &Row> = got.iter().map(|r| (r.0, r)).collect();
    let w: BTreeMap<u64, &Row> = want.iter().map(|r| (r.0, r)).collect();
    let missing: Vec<_> = w.keys().filter(|k| !g.contains_key(k)).take(5).collect();
    let extra: Vec<_> = g.keys().filter(|k| !w.contains_key(k)).take(5).collect();
    let stale: Vec<_> = w
        .iter()
        .filter_map(|(k, v)| g.get(k).filter(|x| *x != v).map(|x| (v, *x)))
        .take(5)
        .collect();
    format!(
        "mirror {} rows, source {}; missing {missing:?}, extra {extra:?}, stale (source, \
         mirror) {stale:?}",
        got.len(),
        want.len()
    )
}
