//! The ClickHouse server of the test bed, through the write path apply will use: RowBinary
//! inserts (LZ4-compressed) into a ReplacingMergeTree with a version column, read back FINAL.

use serde::{Deserialize, Serialize};
use sluice_tests::{clickhouse_url, unique};

#[derive(Debug, Clone, PartialEq, clickhouse::Row, Serialize, Deserialize)]
struct Row {
    id: u64,
    name: String,
    amount: i64,
    version: u64,
    deleted: u8,
}

fn client() -> clickhouse::Client {
    // Validation needs RowBinaryWithNamesAndTypes, which ClickHouse 18.16 lacks.
    clickhouse::Client::default()
        .with_url(clickhouse_url())
        .with_validation(false)
        .with_compression(clickhouse::Compression::Lz4)
}

#[tokio::test]
async fn replacing_merge_tree_keeps_the_newest_version() {
    let db = unique("sluice_t_ch");
    let ch = client();
    ch.query(&format!("CREATE DATABASE {db}"))
        .execute()
        .await
        .unwrap();
    ch.query(&format!(
        "CREATE TABLE {db}.t (id UInt64, name String, amount Int64, version UInt64, deleted UInt8) \
         ENGINE = ReplacingMergeTree(version) ORDER BY id"
    ))
    .execute()
    .await
    .unwrap();
    // No background merge while the test counts what the inserts stored.
    ch.query(&format!("SYSTEM STOP MERGES {db}.t"))
        .execute()
        .await
        .unwrap();

    let row = |id, name: &str, amount, version, deleted| Row {
        id,
        name: name.into(),
        amount,
        version,
        deleted,
    };
    // Two batches, the second replaying part of the first (as after a crash) out of order.
    for batch in [
        vec![
            row(1, "a", 10, 1, 0),
            row(2, "b", 20, 2, 0),
            row(1, "a2", -5, 3, 0),
        ],
        vec![
            row(2, "b", 20, 2, 0),
            row(2, "b", 20, 4, 1),
            row(1, "stale", 0, 1, 0),
        ],
    ] {
        // The insert quotes its table name as one identifier: name the database on the
        // client, not as "db.t".
        let ch = ch.clone().with_database(&db);
        let mut insert = ch.insert::<Row>("t").await.unwrap();
        for r in &batch {
            insert.write(r).await.unwrap();
        }
        insert.end().await.unwrap();
    }

    let rows = ch
        .query(&format!(
            "SELECT ?fields FROM {db}.t FINAL WHERE deleted = 0 ORDER BY id"
        ))
        .fetch_all::<Row>()
        .await
        .unwrap();
    assert_eq!(rows, vec![row(1, "a2", -5, 3, 0)]);
    let all: u64 = ch
        .query(&format!("SELECT count() FROM {db}.t"))
        .fetch_one()
        .await
        .unwrap();
    // Servers from 21.1 collapse each inserted block as a merge would (`optimize_on_insert`,
    // on by default): each batch keeps one row per key. 18.16 stores every row until a merge
    // (stopped above).
    let on_insert: u64 = ch
        .query(
            "SELECT count() FROM system.settings WHERE name = 'optimize_on_insert' AND value = '1'",
        )
        .fetch_one()
        .await
        .unwrap();
    let want = if on_insert == 1 { 4 } else { 6 };
    assert_eq!(
        all, want,
        "rows stored before a merge (optimize_on_insert: {on_insert})"
    );
    ch.query(&format!("DROP DATABASE {db}"))
        .execute()
        .await
        .unwrap();
}
