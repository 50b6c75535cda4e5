//! The MariaDB (or MySQL) server of the test bed: its binlog settings are what a capture needs,
//! and a row written to a table can be read back as a row event from the binlog stream.

use std::time::Duration;

use futures::StreamExt;
use mysql_async::binlog::events::{EventData, RowsEventData};
use mysql_async::prelude::Queryable;
use mysql_async::{BinlogStreamRequest, Conn, Opts};
use sluice_tests::{mysql_url, unique};

async fn connect() -> Conn {
    Conn::new(Opts::from_url(&mysql_url()).expect("SLUICE_MYSQL_URL"))
        .await
        .expect("connect to MySQL/MariaDB")
}

#[tokio::test]
async fn binlog_is_on_in_row_format_with_full_images() {
    let mut conn = connect().await;
    let vars: Vec<(String, String)> = conn
        .query(
            "SHOW GLOBAL VARIABLES WHERE Variable_name IN \
             ('log_bin', 'binlog_format', 'binlog_row_image', 'server_id')",
        )
        .await
        .unwrap();
    let get = |n: &str| {
        vars.iter()
            .find(|(k, _)| k == n)
            .map(|(_, v)| v.clone())
            .unwrap_or_else(|| panic!("{n} not reported"))
    };
    assert_eq!(get("log_bin"), "ON");
    assert_eq!(get("binlog_format"), "ROW");
    assert_eq!(get("binlog_row_image"), "FULL");
    assert_ne!(get("server_id"), "0");
    // GTIDs are available: MariaDB always, MySQL with gtid_mode=ON.
    let version: String = conn.query_first("SELECT @@version").await.unwrap().unwrap();
    let gtid: Option<String> = if version.to_lowercase().contains("mariadb") {
        conn.query_first("SELECT @@gtid_binlog_pos").await.unwrap()
    } else {
        conn.query_first("SELECT @@gtid_mode").await.unwrap()
    };
    assert!(gtid.is_some(), "no GTID state reported");
}

#[tokio::test]
async fn a_written_row_comes_back_from_the_binlog() {
    let db = unique("sluice_t_db");
    let mut conn = connect().await;
    conn.query_drop(format!("CREATE DATABASE `{db}`"))
        .await
        .unwrap();
    conn.query_drop(format!(
        "CREATE TABLE `{db}`.t (id BIGINT UNSIGNED PRIMARY KEY, name VARCHAR(20)) ENGINE=InnoDB"
    ))
    .await
    .unwrap();
    // Where the binlog ends now: the stream starts there.
    let (file, pos) = sluice_tests::capture::binlog_status(&mut conn).await;
    conn.query_drop(format!(
        "INSERT INTO `{db}`.t VALUES (18446744073709551615, 'emoji 😀')"
    ))
    .await
    .unwrap();

    let reader = connect().await;
    let server_id = sluice_tests::replica_server_id();
    let mut stream = reader
        .get_binlog_stream(
            BinlogStreamRequest::new(server_id)
                .with_filename(file.as_bytes())
                .with_pos(pos),
        )
        .await
        .expect("binlog stream");
    let found = tokio::time::timeout(Duration::from_secs(30), async {
        while let Some(event) = stream.next().await {
            let event = event.expect("binlog event");
            // MariaDB writes v1 rows events, MySQL v2.
            if let Some(EventData::RowsEvent(
                rows @ (RowsEventData::WriteRowsEvent(_) | RowsEventData::WriteRowsEventV1(_)),
            )) = event.read_data().expect("event decodes")
            {
                let tme = stream
                    .get_tme(rows.table_id())
                    .expect("table map before rows");
                if tme.database_name() != db {
                    continue;
                }
                let mut values = Vec::new();
                for row in rows.rows(tme) {
                    let (_, after) = row.expect("row decodes");
                    values.push(after.expect("after image"));
                }
                return values;
            }
        }
        panic!("binlog stream ended");
    })
    .await
    .expect("the row event arrived within 30 s");
    assert_eq!(found.len(), 1);
    let row = &found[0];
    assert_eq!(row.len(), 2);
    // Without binlog_row_metadata=FULL the binlog has no signedness: the capture must take it
    // from the schema. The raw bits are all there.
    let id = row.as_ref(0).unwrap();
    assert!(
        matches!(
            id,
            mysql_async::binlog::value::BinlogValue::Value(mysql_async::Value::Int(-1))
                | mysql_async::binlog::value::BinlogValue::Value(mysql_async::Value::UInt(
                    u64::MAX
                ))
        ),
        "{id:?}"
    );
    let name = row.as_ref(1).unwrap();
    assert_eq!(
        name,
        &mysql_async::binlog::value::BinlogValue::Value(mysql_async::Value::Bytes(
            "emoji 😀".as_bytes().to_vec()
        ))
    );
    drop(stream);
    conn.query_drop(format!("DROP DATABASE `{db}`"))
        .await
        .unwrap();
}
