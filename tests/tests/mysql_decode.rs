//! Binlog row decoding against the real server: the edge-values table written by SQL comes
//! back from the binlog, through the capture's decoder, as exactly the contract values.

use std::time::Duration;

use futures::StreamExt;
use mysql_async::binlog::events::{EventData, RowsEventData};
use mysql_async::prelude::Queryable;
use mysql_async::{BinlogStreamRequest, Conn, Opts};
use prost::Message;
use sluice_capture::mysql::{
    decode::{Image, TableDecoder},
    schema,
};
use sluice_tests::{edge, mysql_url, unique};

async fn connect() -> Conn {
    Conn::new(Opts::from_url(&mysql_url()).expect("SLUICE_MYSQL_URL"))
        .await
        .expect("connect")
}

/// Write with `sql`, then read every row change of `db` from the binlog: (op, before, after).
async fn write_and_read(
    db: &str,
    sql: &[String],
    expected_changes: usize,
) -> Vec<(
    &'static str,
    Option<Vec<sluice_proto::Value>>,
    Option<Vec<sluice_proto::Value>>,
)> {
    let mut conn = connect().await;
    let (file, pos) = sluice_tests::capture::binlog_status(&mut conn).await;
    conn.query_drop(edge::SESSION).await.unwrap();
    for s in sql {
        conn.query_drop(s).await.unwrap();
    }
    let schema = schema::load(&mut conn, db, "edge")
        .await
        .unwrap()
        .expect("table exists");

    let reader = connect().await;
    let mut stream = reader
        .get_binlog_stream(
            BinlogStreamRequest::new(sluice_tests::replica_server_id())
                .with_filename(file.as_bytes())
                .with_pos(pos),
        )
        .await
        .unwrap();
    let mut changes = Vec::new();
    tokio::time::timeout(Duration::from_secs(30), async {
        while changes.len() < expected_changes {
            let event = stream.next().await.expect("stream open").expect("event");
            let Some(EventData::RowsEvent(rows)) = event.read_data().expect("decodes") else {
                continue;
            };
            let tme = stream.get_tme(rows.table_id()).expect("table map");
            if tme.database_name() != db {
                continue;
            }
            let op = match rows {
                RowsEventData::WriteRowsEvent(_) | RowsEventData::WriteRowsEventV1(_) => "insert",
                RowsEventData::UpdateRowsEvent(_) | RowsEventData::UpdateRowsEventV1(_) => "update",
                _ => "delete",
            };
            let decoder = TableDecoder::new(tme, &schema).expect("decoder");
            for (before, after) in decoder.decode_event(&rows).expect("rows decode") {
                changes.push((op, before.map(|r| r.values), after.map(|r| r.values)));
            }
            // The images are written without prost: they must be prost's own encoding, byte
            // for byte (so that every reader, and the row's key, sees one encoding per value).
            let mut images = decoder.rows(&rows);
            let (mut b, mut a) = (Image::default(), Image::default());
            while let Some((has_b, has_a)) = images.next_into(&mut b, &mut a).expect("rows decode")
            {
                for (has, image) in [(has_b, &b), (has_a, &a)] {
                    if has {
                        assert_eq!(image.to_row().encode_to_vec(), image.bytes());
                    }
                }
            }
        }
    })
    .await
    .expect("the row events arrived within 30 s");
    changes
}

#[tokio::test]
async fn every_type_decodes_to_the_source_value() {
    let db = unique("sluice_t_edge");
    let expected = edge::expected_rows();
    let sql = vec![
        format!("CREATE DATABASE `{db}`"),
        edge::create_table(&db),
        edge::insert_rows(&db),
    ];
    let changes = write_and_read(&db, &sql, expected.len()).await;
    assert_eq!(changes.len(), expected.len());
    for (i, (op, before, after)) in changes.into_iter().enumerate() {
        assert_eq!(op, "insert");
        assert!(before.is_none());
        let after = after.unwrap();
        let want = &expected[i];
        assert_eq!(after.len(), want.len(), "row {i}: column count");
        for (c, (got, want)) in after.iter().zip(want).enumerate() {
            // Compare NaN-free floats exactly, everything else by value.
            assert_eq!(got, want, "row {} column {c}", i + 1);
        }
    }
    connect()
        .await
        .query_drop(format!("DROP DATABASE `{db}`"))
        .await
        .unwrap();
}

#[tokio::test]
async fn updates_and_deletes_carry_both_images() {
    let db = unique("sluice_t_edge_upd");
    let expected = edge::expected_rows();
    let sql = vec![
        format!("CREATE DATABASE `{db}`"),
        edge::create_table(&db),
        edge::insert_rows(&db),
        // Row 1 becomes row 2's values (but keeps its id), then row 2 goes.
        format!(
            "UPDATE `{db}`.edge AS a JOIN `{db}`.edge AS b ON a.id = 1 AND b.id = 2 SET \
             a.biu = b.biu, a.d65 = b.d65, a.tm1 = b.tm1, a.ts6 = b.ts6, a.vc = b.vc, a.bin = b.bin"
        ),
        format!("DELETE FROM `{db}`.edge WHERE id = 2"),
    ];
    let changes = write_and_read(&db, &sql, expected.len() + 2).await;
    let (op, before, after) = &changes[expected.len()];
    assert_eq!(*op, "update");
    assert_eq!(before.as_ref().unwrap(), &expected[0]);
    let after = after.as_ref().unwrap();
    for c in [10usize, 11, 21, 26, 28, 31] {
        assert_eq!(after[c], expected[1][c], "updated column {c}");
    }
    assert_eq!(after[0], expected[0][0], "id kept");
    assert_eq!(after[1], expected[0][1], "untouched column kept");
    let (op, before, after) = &changes[expected.len() + 1];
    assert_eq!(*op, "delete");
    assert!(after.is_none());
    assert_eq!(before.as_ref().unwrap(), &expected[1]);
    connect()
        .await
        .query_drop(format!("DROP DATABASE `{db}`"))
        .await
        .unwrap();
}
