//! capture-mysql end to end, as a user runs it: SQL on the real server, the binary capturing,
//! and the events read back from the real Kafka broker.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use mysql_async::prelude::Queryable;
use prost::Message;
use rdkafka::producer::{FutureProducer, FutureRecord};
use sluice_proto::v1::{value::Kind, Op, SchemaRecord};
use sluice_proto::{value, ChangeEvent};
use sluice_tests::capture::{
    binlog_end, count_rows, read_events, row_events, wait_first_checkpoint, CaptureProcess,
};
use sluice_tests::{edge, kafka_brokers, mysql_url, unique};

async fn sql(statements: &[String]) {
    let mut c = mysql_async::Conn::new(mysql_async::Opts::from_url(&mysql_url()).unwrap())
        .await
        .unwrap();
    for s in statements {
        c.query_drop(s).await.unwrap_or_else(|e| panic!("{s}: {e}"));
    }
}

async fn events_of(
    topic: String,
    until: impl Fn(&BTreeMap<i32, Vec<ChangeEvent>>) -> bool + Send + 'static,
) -> BTreeMap<i32, Vec<ChangeEvent>> {
    tokio::task::spawn_blocking(move || read_events(&topic, Duration::from_secs(60), until))
        .await
        .unwrap()
}

fn int_key(e: &ChangeEvent) -> i64 {
    match e.key.as_ref().unwrap().values[0].kind {
        Some(Kind::Int(i)) => i,
        ref other => panic!("key {other:?}"),
    }
}

fn op(e: &ChangeEvent) -> Op {
    e.op()
}

#[tokio::test(flavor = "multi_thread")]
async fn every_type_arrives_in_kafka_exactly() {
    let db = unique("sluice_t_cap_edge");
    let mut cap = CaptureProcess::spawn(CaptureProcess::config(&db, &binlog_end().await, ""));
    sql(&[
        format!("CREATE DATABASE `{db}`"),
        edge::create_table(&db),
        edge::SESSION.to_string(),
        edge::insert_rows(&db),
    ])
    .await;
    // (The session settings only matter on the connection that inserts.)
    let events = events_of(cap.topic(&db, "edge"), |m| count_rows(m) >= 4).await;
    let rows = row_events(&events);
    let expected = edge::expected_rows();
    assert_eq!(rows.len(), expected.len(), "{rows:#?}");
    for (e, want) in rows.iter().zip(&expected) {
        assert_eq!(op(e), Op::Insert);
        assert_eq!(e.database, db);
        assert_eq!(e.table, "edge");
        assert_eq!(e.key.as_ref().unwrap().values, vec![want[0].clone()]);
        let got = &e.after.as_ref().unwrap().values;
        for (c, (g, w)) in got.iter().zip(want).enumerate() {
            assert_eq!(g, w, "id {} column {c}", int_key(e));
        }
        assert!(e.before.is_none());
        assert_ne!(e.schema_id, 0);
        assert!(e.commit_time_micros > 0);
    }
    // Versions grow with the binlog, rows of one statement included.
    assert!(rows.windows(2).all(|w| w[0].version < w[1].version));

    // The schema the events point at is on the schema topic.
    let schema_id = rows[0].schema_id;
    let schema_topic = "_sluice_schemas".to_string();
    let key = sluice_proto::schema_record_key(schema_id);
    let found = tokio::task::spawn_blocking(move || {
        use rdkafka::consumer::{BaseConsumer, Consumer};
        use rdkafka::Message as _;
        let c: BaseConsumer = rdkafka::ClientConfig::new()
            .set("bootstrap.servers", kafka_brokers())
            .set("group.id", unique("schemas"))
            .set("auto.offset.reset", "earliest")
            .create()
            .unwrap();
        c.subscribe(&[&schema_topic]).unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while std::time::Instant::now() < deadline {
            if let Some(Ok(m)) = c.poll(Duration::from_millis(200)) {
                if m.key() == Some(key.as_bytes()) {
                    return Some(SchemaRecord::decode(m.payload().unwrap()).unwrap());
                }
            }
        }
        None
    })
    .await
    .unwrap()
    .expect("schema record published");
    let schema = found.schema.unwrap();
    assert_eq!(schema.schema_id, schema_id);
    assert_eq!(schema.columns.len(), 37);
    assert_eq!(
        schema.columns[36].r#type(),
        sluice_proto::v1::ColumnType::Json
    );
    assert_eq!(schema.columns[2].name, "tiu");
    assert!(schema.columns[2].unsigned);
    assert_eq!(schema.primary_key, vec![0]);

    cap.stop_ok();
    sql(&[format!("DROP DATABASE `{db}`")]).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn transactions_key_changes_and_alters_in_order() {
    let db = unique("sluice_t_cap_ops");
    let mut cap = CaptureProcess::spawn(CaptureProcess::config(&db, &binlog_end().await, ""));
    let t = format!("`{db}`.ops");
    // Multi-statement transactions need one connection.
    let mut c = mysql_async::Conn::new(mysql_async::Opts::from_url(&mysql_url()).unwrap())
        .await
        .unwrap();
    for s in [
        format!("CREATE DATABASE `{db}`"),
        format!("CREATE TABLE {t} (id INT PRIMARY KEY, v VARCHAR(20)) ENGINE=InnoDB"),
        format!("INSERT INTO {t} VALUES (1,'a'),(2,'b'),(3,'c')"),
        "BEGIN".into(),
        format!("UPDATE {t} SET v='a2' WHERE id=1"),
        format!("DELETE FROM {t} WHERE id=3"),
        format!("INSERT INTO {t} VALUES (4,'d')"),
        "COMMIT".into(),
        "BEGIN".into(),
        format!("INSERT INTO {t} VALUES (99,'never')"),
        "ROLLBACK".into(),
        format!("UPDATE {t} SET id=20 WHERE id=2"),
        format!("ALTER TABLE {t} ADD COLUMN n INT DEFAULT 7"),
        format!("INSERT INTO {t} VALUES (5,'e',8)"),
        format!("UPDATE {t} SET n=9 WHERE id=1"),
        format!("ALTER TABLE {t} DROP COLUMN v"),
        format!("INSERT INTO {t} VALUES (6,10)"),
    ] {
        c.query_drop(&s)
            .await
            .unwrap_or_else(|e| panic!("{s}: {e}"));
    }
    // 11 row changes, 3 DDL statements on each of the 3 partitions, and the rows read again
    // after the ADD COLUMN with a default (no row event carries the 7 the server gave every
    // row it had): 1, 4 and 20, and 5 and 6 if the read came after their inserts.
    let read_again = |m: &BTreeMap<i32, Vec<ChangeEvent>>| -> Vec<i64> {
        let mut keys: Vec<i64> = row_events(m)
            .iter()
            .filter(|e| op(e) == Op::SnapshotRead)
            .map(int_key)
            .collect();
        keys.sort();
        keys
    };
    let events = events_of(cap.topic(&db, "ops"), move |m| {
        let again = read_again(m);
        count_rows(m) - again.len() >= 11
            && m.values().flatten().filter(|e| e.op() == Op::Ddl).count() >= 9
            && [1, 4, 20].iter().all(|k| again.contains(k))
    })
    .await;
    let again = read_again(&events);
    assert!(
        [vec![1, 4, 20], vec![1, 4, 5, 20], vec![1, 4, 5, 6, 20]].contains(&again),
        "each row once, as the table held them when read: {again:?}"
    );
    for e in row_events(&events) {
        if op(&e) == Op::SnapshotRead && [4, 20].contains(&int_key(&e)) {
            let values = &e.after.as_ref().unwrap().values;
            assert_eq!(values.last(), Some(&value::int(7)), "{e:?}");
        }
    }
    let rows: Vec<ChangeEvent> = row_events(&events)
        .into_iter()
        .filter(|e| op(e) != Op::SnapshotRead)
        .collect();
    let summary: Vec<(Op, i64)> = rows.iter().map(|e| (op(e), int_key(e))).collect();
    assert_eq!(
        summary,
        vec![
            (Op::Insert, 1),
            (Op::Insert, 2),
            (Op::Insert, 3),
            (Op::Update, 1),
            (Op::Delete, 3),
            (Op::Insert, 4),
            (Op::Delete, 2),  // the key change: old key deleted ...
            (Op::Insert, 20), // ... new key inserted
            (Op::Insert, 5),
            (Op::Update, 1),
            (Op::Insert, 6),
        ]
    );
    // The three statements of one transaction share its id, numbered in order.
    let tx: Vec<_> = rows[3..6]
        .iter()
        .map(|e| e.transaction.clone().unwrap())
        .collect();
    assert!(tx.iter().all(|t| t.id == tx[0].id && !t.id.is_empty()));
    assert_eq!(
        tx.iter().map(|t| t.index).collect::<Vec<_>>(),
        vec![0, 1, 2]
    );
    // Images follow the schema of their time.
    assert_eq!(rows[3].before.as_ref().unwrap().values[1], value::text("a"));
    assert_eq!(rows[3].after.as_ref().unwrap().values[1], value::text("a2"));
    assert_eq!(rows[7].after.as_ref().unwrap().values[1], value::text("b"));
    assert_eq!(
        rows[8].after.as_ref().unwrap().values,
        vec![value::int(5), value::text("e"), value::int(8)]
    );
    assert_eq!(rows[9].before.as_ref().unwrap().values[2], value::int(7));
    assert_eq!(rows[9].after.as_ref().unwrap().values[2], value::int(9));
    assert_eq!(
        rows[10].after.as_ref().unwrap().values,
        vec![value::int(6), value::int(10)]
    );
    // Each ALTER reached every partition, with the schema after it, before the rows that need it.
    for (p, evs) in &events {
        let ddl: Vec<&ChangeEvent> = evs.iter().filter(|e| op(e) == Op::Ddl).collect();
        // (The schema a DDL event carries is read when the capture meets the statement, so it
        // can be a later one; rows carry the exact schema of their own time in schema_id.)
        let kinds: Vec<&str> = ddl
            .iter()
            .map(|e| e.ddl.as_ref().unwrap().kind.as_str())
            .collect();
        assert_eq!(
            kinds,
            vec!["create", "alter", "alter"],
            "partition {p}: {ddl:#?}"
        );
        for w in evs.windows(2) {
            assert!(w[0].version <= w[1].version, "partition {p} out of order");
        }
    }
    assert_ne!(rows[8].schema_id, rows[0].schema_id);
    assert_ne!(rows[10].schema_id, rows[8].schema_id);
    cap.stop_ok();
    sql(&[format!("DROP DATABASE `{db}`")]).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn w1_table_load() {
    let db = unique("sluice_t_cap_w1");
    // At most 64 KiB in flight: the load waits for acknowledgements, and a larger record (the
    // last one) still goes, alone.
    let mut config = CaptureProcess::config(&db, &binlog_end().await, "");
    config.0 = config
        .0
        .replacen("[publish]\n", "[publish]\nmax_in_flight_bytes = 65536\n", 1);
    let mut cap = CaptureProcess::spawn(config);
    let ddl = sluice_tests::w1_create_table(&db);
    sql(&[format!("CREATE DATABASE `{db}`"), ddl]).await;
    // Ten batches of 100 rows, as the reference load generator writes them.
    let mut statements = Vec::new();
    for b in 0..10 {
        let values: Vec<String> = (0..100)
            .map(|i| {
                let n = b * 100 + i;
                format!(
                    "('v{n}','c','en2','set1,set3','11:22:33','2024-01-02',2024,'2024-01-02 03:04:05',\
                     '2024-01-02 03:04:05',1.25,2.5,{n}.25,'text {n}','blob',b'101',1,'m','l','t',\
                     {},{n},{n},{n},{n})",
                    n % 256
                )
            })
            .collect();
        statements.push(format!(
            "INSERT INTO `{db}`.binlog_field_test_1 (testvarchar,testchar,testenum,testset,testtime,\
             testdate,testyear,testtimestamp,testdatetime,testfloat,testdouble,testdecimal,testtext,\
             testblob,testbit,testbool,testmediumblob,testlongblob,testtinyblob,test_unsinged_tinyint,\
             test_unsinged_smallint,test_unsinged_mediumint,test_unsinged_int,test_unsinged_bigint) \
             VALUES {}",
            values.join(",")
        ));
    }
    statements.push(format!(
        "UPDATE `{db}`.binlog_field_test_1 SET testlongblob = REPEAT('x', 300000) WHERE id = 1000"
    ));
    sql(&statements).await;
    let events = events_of(cap.topic(&db, "binlog_field_test_1"), |m| {
        count_rows(m) >= 1001
    })
    .await;
    let mut rows = row_events(&events);
    assert_eq!(rows.len(), 1001);
    let big = rows.pop().unwrap();
    assert!(big.before.is_some());
    assert_eq!(
        big.after.as_ref().unwrap().values[23],
        value::of(Kind::Bytes(vec![b'x'; 300_000]))
    );
    let ids: std::collections::BTreeSet<u64> = rows
        .iter()
        .map(|e| match e.key.as_ref().unwrap().values[0].kind {
            Some(Kind::Uint(id)) => id,
            ref k => panic!("{k:?}"),
        })
        .collect();
    assert_eq!(ids.len(), 1000);
    let last = rows.last().unwrap().after.as_ref().unwrap();
    assert_eq!(last.values.len(), 30);
    assert_eq!(last.values[17], value::decimal("999.25"));
    assert_eq!(
        last.values[9],
        value::of(Kind::SetValue(sluice_proto::v1::SetValue {
            bits: 0b101,
            members: vec!["set1".into(), "set3".into()]
        }))
    );
    cap.stop_ok();
    sql(&[format!("DROP DATABASE `{db}`")]).await;
}

/// Events the capture has handed to Kafka, from its metrics endpoint.
async fn published(port: u16) -> u64 {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let Ok(mut s) = tokio::net::TcpStream::connect(("127.0.0.1", port)).await else {
        return 0;
    };
    if s.write_all(b"GET /metrics HTTP/1.0\r\n\r\n").await.is_err() {
        return 0;
    }
    let mut body = String::new();
    let _ = s.read_to_string(&mut body).await;
    body.lines()
        .filter(|l| l.starts_with("sluice_capture_events_total{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum()
}

#[tokio::test(flavor = "multi_thread")]
async fn kill_9_and_restart_loses_nothing() {
    let db = unique("sluice_t_cap_crash");
    sql(&[
        format!("CREATE DATABASE `{db}`"),
        format!("CREATE TABLE `{db}`.t (id INT PRIMARY KEY, n INT) ENGINE=InnoDB"),
    ])
    .await;
    let mut cap = CaptureProcess::spawn(CaptureProcess::config(&db, &binlog_end().await, ""));
    // The writer starts once the capture is up (its first checkpoint stored): its start, which
    // waits on the broker, is no part of the race below.
    wait_first_checkpoint(&cap, Duration::from_secs(60)).await;
    const N: i64 = 3000;
    let writer_db = db.clone();
    let writer = tokio::spawn(async move {
        let mut c = mysql_async::Conn::new(mysql_async::Opts::from_url(&mysql_url()).unwrap())
            .await
            .unwrap();
        for i in 0..N {
            c.query_drop(format!("INSERT INTO `{writer_db}`.t VALUES ({i}, 0)"))
                .await
                .unwrap();
            // A steady writer, not a burst: the capture must die mid-stream.
            if i % 50 == 0 {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            // Every 10th row is updated, so keys carry several versions.
            if i % 10 == 0 {
                c.query_drop(format!("UPDATE `{writer_db}`.t SET n = 1 WHERE id = {i}"))
                    .await
                    .unwrap();
            }
        }
    });
    // Kill once the capture is well into the stream.
    let port = cap.metrics_port;
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while published(port).await < 500 {
        assert!(
            std::time::Instant::now() < deadline,
            "capture published nothing"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        !writer.is_finished(),
        "the writer should still be writing when the capture dies"
    );
    cap.kill();
    tokio::time::sleep(Duration::from_millis(300)).await;
    cap.restart();
    writer.await.unwrap();
    let expected_changes = N as usize + (N as usize).div_ceil(10);
    let events = events_of(cap.topic(&db, "t"), move |m| {
        let mut seen = std::collections::HashSet::new();
        for e in m.values().flatten() {
            seen.insert((e.version, e.op));
        }
        seen.len() >= expected_changes
    })
    .await;
    // Distinct changes: every one arrived; repeats (the tail before the kill) carry the
    // version of the original, so apply drops them.
    let mut distinct: HashMap<(i64, u64), ChangeEvent> = HashMap::new();
    for e in row_events(&events) {
        if let Some(prev) = distinct.insert((int_key(&e), e.version), e.clone()) {
            assert_eq!(
                prev,
                ChangeEvent {
                    capture_time_micros: prev.capture_time_micros,
                    ..e
                }
            );
        }
    }
    assert_eq!(distinct.len(), expected_changes);
    let keys: std::collections::BTreeSet<i64> = distinct.keys().map(|k| k.0).collect();
    assert_eq!(keys.len(), N as usize);
    // Per key, versions never go backwards within its partition.
    for (p, evs) in &events {
        let mut last: HashMap<i64, u64> = HashMap::new();
        for e in evs.iter().filter(|e| e.key.is_some()) {
            let k = int_key(e);
            if let Some(v) = last.get(&k) {
                // A replayed tail starts over: allow equal-or-lower only as an exact repeat.
                if e.version < *v {
                    assert!(distinct.contains_key(&(k, e.version)), "partition {p}");
                }
            }
            last.insert(k, e.version);
        }
    }
    cap.stop_ok();
    sql(&[format!("DROP DATABASE `{db}`")]).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_wrong_password_is_named() {
    let (text, c, p) = CaptureProcess::config("x", "end", "");
    let url = mysql_url();
    let user = url
        .strip_prefix("mysql://")
        .and_then(|r| r.split([':', '@']).next())
        .unwrap_or("root")
        .to_string();
    let bad = sluice_tests::mysql_url_as(&user, "not-the-password");
    let mut cap = CaptureProcess::spawn((text.replace(&url, &bad), c, p));
    let (code, log) = cap.wait(Duration::from_secs(60));
    assert_eq!(code, Some(1), "{log}");
    assert!(log.contains("Access denied"), "{log}");
}

async fn write_checkpoint(connector: &str, json: String) {
    let producer: FutureProducer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", kafka_brokers())
        .create()
        .unwrap();
    producer
        .send(
            FutureRecord::to("_sluice_checkpoints")
                .key(connector)
                .payload(&json),
            Duration::from_secs(10),
        )
        .await
        .map_err(|(e, _)| e)
        .unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_purged_checkpoint_stops_with_what_to_do() {
    // Make sure the checkpoint topic exists (a capture creates it), then plant a checkpoint
    // pointing into a binlog file the server does not have.
    // (Planted before a capture made it, the broker would make it with its default partitions,
    // and the capture, which reads the one partition it makes, would not see the checkpoint.)
    let db = unique("sluice_t_cap_purged");
    let mut first = CaptureProcess::spawn(CaptureProcess::config(&db, "end", ""));
    let probe: rdkafka::consumer::BaseConsumer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", kafka_brokers())
        .create()
        .unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let md = rdkafka::consumer::Consumer::fetch_metadata(
            &probe,
            Some("_sluice_checkpoints"),
            Duration::from_secs(5),
        );
        if md.is_ok_and(|m| {
            m.topics()
                .iter()
                .any(|t| t.error().is_none() && !t.partitions().is_empty())
        }) {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the capture did not make the checkpoint topic"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    first.stop();
    let mut c = mysql_async::Conn::new(mysql_async::Opts::from_url(&mysql_url()).unwrap())
        .await
        .unwrap();
    let server_id: u32 = c.query_first("SELECT @@server_id").await.unwrap().unwrap();
    let config = CaptureProcess::config(&db, "end", "");
    write_checkpoint(
        &config.1,
        format!(
            r#"{{"next":{{"file":"mysql-bin.999999","pos":4}},"server_id":{server_id},"written_at":0}}"#
        ),
    )
    .await;
    let mut cap = CaptureProcess::spawn(config);
    let (code, log) = cap.wait(Duration::from_secs(60));
    assert_eq!(code, Some(1), "{log}");
    // A file above every one the server has: its binlog began again.
    assert!(log.contains("mysql-bin.999999"), "{log}");
    assert!(log.contains("binlog began again"), "{log}");
    assert!(log.contains("mysql.generation = 1"), "{log}");
    assert!(log.contains("re-snapshot"), "{log}");

    // A file below every one the server has: purged.
    let config = CaptureProcess::config(&db, "end", "");
    write_checkpoint(
        &config.1,
        format!(
            r#"{{"next":{{"file":"mysql-bin.000000","pos":4}},"server_id":{server_id},"written_at":0,"generation":4}}"#
        ),
    )
    .await;
    let mut cap = CaptureProcess::spawn(config);
    let (code, log) = cap.wait(Duration::from_secs(60));
    assert_eq!(code, Some(1), "{log}");
    assert!(log.contains("no longer has"), "{log}");
    assert!(log.contains("re-snapshot"), "{log}");
    assert!(log.contains("mysql.generation = 4"), "{log}");

    // A checkpoint of another server is refused too.
    let config = CaptureProcess::config(&db, "end", "");
    write_checkpoint(
        &config.1,
        format!(
            r#"{{"next":{{"file":"mysql-bin.000001","pos":4}},"server_id":{},"written_at":0}}"#,
            server_id + 1
        ),
    )
    .await;
    let mut cap = CaptureProcess::spawn(config);
    let (code, log) = cap.wait(Duration::from_secs(60));
    assert_eq!(code, Some(1), "{log}");
    assert!(
        log.contains("another server") || log.contains("server_id"),
        "{log}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn starts_from_a_gtid_or_a_time() {
    let db = unique("sluice_t_cap_start");
    let t = format!("`{db}`.t");
    sql(&[
        format!("CREATE DATABASE `{db}`"),
        format!("CREATE TABLE {t} (id INT PRIMARY KEY) ENGINE=InnoDB"),
        format!("INSERT INTO {t} VALUES (1)"),
    ])
    .await;
    let mut c = mysql_async::Conn::new(mysql_async::Opts::from_url(&mysql_url()).unwrap())
        .await
        .unwrap();
    let version: String = c.query_first("SELECT @@version").await.unwrap().unwrap();
    let gtid: Option<String> = if version.to_lowercase().contains("mariadb") {
        c.query_first("SELECT @@gtid_binlog_pos").await.unwrap()
    } else {
        c.query_first("SELECT @@gtid_executed").await.unwrap()
    };
    // A new binlog file created before the start time: `time:` starts reading there (or in
    // a newer file, should the server rotate meanwhile), not at the oldest file.
    c.query_drop("FLUSH BINARY LOGS").await.unwrap();
    let (flushed, _) = sluice_tests::capture::binlog_status(&mut c).await;
    // The next whole second: rows from then on are "after the time".
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap();
    let next_second = now.as_secs() + 1;
    tokio::time::sleep(Duration::from_millis(
        1000 - u64::from(now.subsec_millis()) + 50,
    ))
    .await;
    sql(&[format!("INSERT INTO {t} VALUES (2), (3)")]).await;

    let keys = |events: &BTreeMap<i32, Vec<ChangeEvent>>| -> Vec<i64> {
        row_events(events).iter().map(int_key).collect()
    };
    if let Some(gtid) = gtid.filter(|g| !g.is_empty()) {
        let mut cap =
            CaptureProcess::spawn(CaptureProcess::config(&db, &format!("gtid:{gtid}"), ""));
        let events = events_of(cap.topic(&db, "t"), |m| count_rows(m) >= 2).await;
        assert_eq!(keys(&events), vec![2, 3], "from GTID {gtid}");
        assert_eq!(cap.stop().0, Some(0));
    }
    let mut cap = CaptureProcess::spawn(CaptureProcess::config(
        &db,
        &format!("time:{next_second}"),
        "",
    ));
    let events = events_of(cap.topic(&db, "t"), |m| count_rows(m) >= 2).await;
    assert_eq!(keys(&events), vec![2, 3], "from time {next_second}");
    let log = cap.stop_ok();
    let started_in = log
        .lines()
        .find(|l| l.contains("the start time is in or after this binlog file"))
        .and_then(|l| l.split("file=").nth(1))
        .and_then(|r| r.split_whitespace().next())
        .unwrap_or_else(|| panic!("no file located for the start time: {log}"));
    assert!(
        started_in >= flushed.as_str(),
        "started in {started_in}, before {flushed}: {log}"
    );
    sql(&[format!("DROP DATABASE `{db}`")]).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_killed_binlog_connection_is_reopened() {
    // Its own replication user, so that killing its connections touches no other test.
    let user = unique("rep");
    let db = unique("sluice_t_cap_reconnect");
    sql(&[
        format!("CREATE USER '{user}'@'%' IDENTIFIED BY 'pw'"),
        format!("GRANT REPLICATION SLAVE, REPLICATION CLIENT, SELECT ON *.* TO '{user}'@'%'"),
        format!("CREATE DATABASE `{db}`"),
        format!("CREATE TABLE `{db}`.t (id INT PRIMARY KEY) ENGINE=InnoDB"),
    ])
    .await;
    let (text, c, p) = CaptureProcess::config(&db, &binlog_end().await, "");
    let url = mysql_url();
    let own = sluice_tests::mysql_url_as(&user, "pw");
    let mut cap = CaptureProcess::spawn((text.replace(&url, &own), c, p));
    sql(&[format!("INSERT INTO `{db}`.t VALUES (1)")]).await;
    let topic = cap.topic(&db, "t");
    let events = events_of(topic.clone(), |m| count_rows(m) >= 1).await;
    assert_eq!(count_rows(&events), 1);
    // Kill the capture's binlog dump on the server side.
    let mut conn = mysql_async::Conn::new(mysql_async::Opts::from_url(&mysql_url()).unwrap())
        .await
        .unwrap();
    let ids: Vec<u64> = conn
        .exec(
            "SELECT ID FROM information_schema.PROCESSLIST WHERE USER = ? AND COMMAND LIKE 'Binlog Dump%'",
            (user.clone(),),
        )
        .await
        .unwrap();
    assert!(!ids.is_empty(), "no binlog dump thread of {user}");
    for id in ids {
        conn.query_drop(format!("KILL {id}")).await.unwrap();
    }
    sql(&[format!("INSERT INTO `{db}`.t VALUES (2), (3)")]).await;
    let events = events_of(topic, |m| count_rows(m) >= 3).await;
    let keys: std::collections::BTreeSet<i64> = row_events(&events).iter().map(int_key).collect();
    assert_eq!(keys.into_iter().collect::<Vec<_>>(), vec![1, 2, 3]);
    let log = cap.stop_ok();
    assert!(log.contains("reconnecting"), "{log}");
    sql(&[
        format!("DROP DATABASE `{db}`"),
        format!("DROP USER '{user}'@'%'"),
    ])
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn tables_without_a_primary_key_keep_one_partition() {
    let db = unique("sluice_t_cap_nopk");
    let mut cap = CaptureProcess::spawn(CaptureProcess::config(&db, &binlog_end().await, ""));
    sql(&[
        format!("CREATE DATABASE `{db}`"),
        format!("CREATE TABLE `{db}`.log (msg VARCHAR(20)) ENGINE=InnoDB"),
        format!("INSERT INTO `{db}`.log VALUES ('a'), ('b'), ('c'), ('d')"),
        format!("UPDATE `{db}`.log SET msg = 'z' WHERE msg = 'a'"),
    ])
    .await;
    let events = events_of(cap.topic(&db, "log"), |m| count_rows(m) >= 5).await;
    let partitions_with_rows: Vec<i32> = events
        .iter()
        .filter(|(_, evs)| evs.iter().any(|e| e.key.is_some() && e.op() != Op::Ddl))
        .map(|(p, _)| *p)
        .collect();
    assert_eq!(partitions_with_rows.len(), 1, "{partitions_with_rows:?}");
    let rows = row_events(&events);
    assert!(rows
        .iter()
        .all(|e| e.key.as_ref().unwrap().values.is_empty()));
    assert_eq!(rows[4].op(), Op::Update);
    assert_eq!(
        rows[4].after.as_ref().unwrap().values,
        vec![value::text("z")]
    );
    assert_eq!(cap.stop().0, Some(0));
    sql(&[format!("DROP DATABASE `{db}`")]).await;
}

/// The snapshot's rows, by table: (key values, after values), in key order of arrival.
fn snapshot_rows(
    events: &BTreeMap<i32, Vec<ChangeEvent>>,
) -> Vec<(Vec<sluice_proto::v1::Value>, Vec<sluice_proto::v1::Value>)> {
    let mut rows: Vec<_> = events
        .values()
        .flatten()
        .filter(|e| e.key.is_some())
        .map(|e| {
            assert_eq!(e.op(), Op::SnapshotRead, "{e:?}");
            (
                e.key.clone().unwrap().values,
                e.after.clone().unwrap().values,
            )
        })
        .collect();
    rows.sort_by_key(|(k, a)| format!("{k:?}{a:?}"));
    rows
}

#[tokio::test(flavor = "multi_thread")]
async fn a_snapshot_reads_every_type_as_the_binlog_does() {
    let db = unique("sluice_t_snap_edge");
    sql(&[
        format!("CREATE DATABASE `{db}`"),
        edge::create_table(&db),
        edge::SESSION.to_string(),
        edge::insert_rows(&db),
    ])
    .await;
    let mut cap = CaptureProcess::spawn(CaptureProcess::config(
        &db,
        "end",
        "[snapshot]\nmode = \"snapshot\"\nchunk_rows = 2\n",
    ));
    let (code, log) = cap.wait(Duration::from_secs(60));
    assert_eq!(code, Some(0), "{log}");
    assert!(log.contains("snapshot finished"), "{log}");
    let events = events_of(cap.topic(&db, "edge"), |m| count_rows(m) >= 4).await;
    let mut rows: Vec<Vec<sluice_proto::v1::Value>> =
        snapshot_rows(&events).into_iter().map(|(_, a)| a).collect();
    rows.sort_by_key(|r| format!("{:?}", r[0]));
    let expected = edge::expected_rows();
    assert_eq!(rows.len(), expected.len());
    for (got, want) in rows.iter().zip(&expected) {
        for (i, (g, w)) in got.iter().zip(want).enumerate() {
            assert_eq!(g, w, "row {:?} column {i}", want[0]);
        }
    }
    sql(&[format!("DROP DATABASE `{db}`")]).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn snapshots_of_empty_keyless_composite_and_string_keyed_tables() {
    let db = unique("sluice_t_snap_shapes");
    let strings = ["", "a", "B", "b2", "é", "Z", "zz", "ß", "日本", "x y", "x"];
    let mut statements = vec![
        format!("CREATE DATABASE `{db}`"),
        format!("CREATE TABLE `{db}`.empty (id INT PRIMARY KEY)"),
        format!("CREATE TABLE `{db}`.nopk (a INT, b VARCHAR(10))"),
        format!("INSERT INTO `{db}`.nopk VALUES (1,'x'),(1,'x'),(2,NULL),(NULL,'y'),(3,'z')"),
        // Keyless, with the temporal and decimal columns the text protocol would send as text.
        format!("CREATE TABLE `{db}`.nopk_types (d DATETIME(3), dt DATE, n DECIMAL(5,2))"),
        format!(
            "INSERT INTO `{db}`.nopk_types VALUES ('2024-02-29 12:00:00.125', '2024-02-29', 1.50), \
             ('2024-02-29 12:00:00.125', '2024-02-29', 1.50)"
        ),
        format!("CREATE TABLE `{db}`.composite (a INT, b VARCHAR(20), c INT, PRIMARY KEY (b, a))"),
        format!(
            "CREATE TABLE `{db}`.strpk (k VARCHAR(20) CHARACTER SET utf8mb4 \
             COLLATE utf8mb4_general_ci PRIMARY KEY, v INT)"
        ),
    ];
    let composite: Vec<String> = (0..50)
        .map(|i| format!("({}, 'k{}', {i})", i % 7, i / 7))
        .collect();
    statements.push(format!(
        "INSERT INTO `{db}`.composite VALUES {}",
        composite.join(",")
    ));
    let strpk: Vec<String> = strings
        .iter()
        .enumerate()
        .map(|(i, s)| format!("('{s}', {i})"))
        .collect();
    statements.push(format!(
        "INSERT INTO `{db}`.strpk VALUES {}",
        strpk.join(",")
    ));
    sql(&statements).await;
    let mut cap = CaptureProcess::spawn(CaptureProcess::config(
        &db,
        "end",
        "[snapshot]\nmode = \"snapshot\"\nchunk_rows = 3\nparallel_tables = 3\n",
    ));
    let (code, log) = cap.wait(Duration::from_secs(90));
    assert_eq!(code, Some(0), "{log}");
    use sluice_proto::v1::Value as V;
    let int = |i: i64| V {
        kind: Some(Kind::Int(i)),
    };
    let text = |s: &str| V {
        kind: Some(Kind::Text(s.into())),
    };
    let null = sluice_proto::value::null();

    // Composite key (b, a): every row once, key in key order of the columns.
    let events = events_of(cap.topic(&db, "composite"), |m| count_rows(m) >= 50).await;
    let got = snapshot_rows(&events);
    let mut want: Vec<_> = (0..50i64)
        .map(|i| {
            let (a, b) = (int(i % 7), text(&format!("k{}", i / 7)));
            (vec![b.clone(), a.clone()], vec![a, b, int(i)])
        })
        .collect();
    want.sort_by_key(|(k, a)| format!("{k:?}{a:?}"));
    assert_eq!(got, want);

    // String key under a case- and accent-insensitive collation: every row once.
    let events = events_of(cap.topic(&db, "strpk"), move |m| {
        count_rows(m) >= strings.len()
    })
    .await;
    let got = snapshot_rows(&events);
    let mut want: Vec<_> = strings
        .iter()
        .enumerate()
        .map(|(i, s)| (vec![text(s)], vec![text(s), int(i as i64)]))
        .collect();
    want.sort_by_key(|(k, a)| format!("{k:?}{a:?}"));
    assert_eq!(got, want);

    // No primary key: every row, duplicates included, all with the empty key.
    let events = events_of(cap.topic(&db, "nopk"), |m| count_rows(m) >= 5).await;
    let got = snapshot_rows(&events);
    let mut want = vec![
        (vec![], vec![int(1), text("x")]),
        (vec![], vec![int(1), text("x")]),
        (vec![], vec![int(2), null.clone()]),
        (vec![], vec![null, text("y")]),
        (vec![], vec![int(3), text("z")]),
    ];
    want.sort_by_key(|(k, a)| format!("{k:?}{a:?}"));
    assert_eq!(got, want);
    assert_eq!(events.len(), 1, "a keyless table's rows keep one partition");
    let events = events_of(cap.topic(&db, "nopk_types"), |m| count_rows(m) >= 2).await;
    let row = vec![
        V {
            kind: Some(Kind::Datetime(sluice_proto::v1::DateTime {
                year: 2024,
                month: 2,
                day: 29,
                hour: 12,
                minute: 0,
                second: 0,
                micros: 125_000,
            })),
        },
        V {
            kind: Some(Kind::Date(sluice_proto::v1::Date {
                year: 2024,
                month: 2,
                day: 29,
            })),
        },
        V {
            kind: Some(Kind::Decimal("1.50".into())),
        },
    ];
    assert_eq!(
        snapshot_rows(&events),
        vec![(vec![], row.clone()), (vec![], row)],
        "a keyless table's values as a keyed table's, duplicates kept"
    );

    // The empty table: no row event.
    let topic = cap.topic(&db, "empty");
    let events =
        tokio::task::spawn_blocking(move || read_events(&topic, Duration::from_secs(3), |_| false))
            .await
            .unwrap();
    assert_eq!(count_rows(&events), 0);
    assert!(log.contains("snapshot finished"), "{log}");
    sql(&[format!("DROP DATABASE `{db}`")]).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_table_is_snapshotted_again_on_request_while_streaming_goes_on() {
    let db = unique("sluice_t_resnap");
    sql(&[
        format!("CREATE DATABASE `{db}`"),
        format!("CREATE TABLE `{db}`.a (id INT PRIMARY KEY, v INT)"),
        format!("CREATE TABLE `{db}`.b (id INT PRIMARY KEY, v INT)"),
        format!("INSERT INTO `{db}`.a VALUES (1, 1), (2, 2), (3, 3)"),
        format!("INSERT INTO `{db}`.b VALUES (1, 1)"),
    ])
    .await;
    let (text, connector, prefix) = CaptureProcess::config(&db, &binlog_end().await, "");
    let progress = format!("{text}[log]\nprogress_interval_s = 1\n");
    let mut cap = CaptureProcess::spawn((progress, connector.clone(), prefix.clone()));
    sql(&[format!("INSERT INTO `{db}`.b VALUES (2, 2)")]).await;
    let events = events_of(cap.topic(&db, "b"), |m| count_rows(m) >= 1).await;
    assert_eq!(row_events(&events).len(), 1);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let log = cap.stop_ok();
    // At start the capture names the tables it captures.
    assert!(log.contains(&format!("capturing {db}.a, {db}.b")), "{log}");
    // Then it says how it goes, once a second here (the binlog position, events and rate).
    assert!(
        log.contains("progress: binlog_file=") && log.contains(" events="),
        "{log}"
    );

    // A request naming a table the server lacks and one outside the filter is refused at
    // start, each named; its id is not used up.
    let bad = format!(
        "{text}[snapshot]\ntables = [\"{db}.a\", \"{db}.nope\", \"other_{db}.a\"]\nrequest_id = \"again-1\"\n"
    );
    let mut cap = CaptureProcess::spawn((bad, connector.clone(), prefix.clone()));
    let (code, log) = cap.wait(Duration::from_secs(60));
    assert_eq!(code, Some(1), "{log}");
    assert!(
        log.contains(&format!("{db}.nope: no such table on the server"))
            && log.contains(&format!("other_{db}.a: outside the capture's [filter]"))
            && !log.contains("snapshot starts"),
        "{log}"
    );

    // The request: table a again. Streaming goes on meanwhile.
    let request = format!(
        "{text}[snapshot]\ntables = [\"{db}.a\"]\nrequest_id = \"again-1\"\nchunk_rows = 2\n"
    );
    let mut cap = CaptureProcess::spawn((request.clone(), connector.clone(), prefix.clone()));
    sql(&[format!("INSERT INTO `{db}`.b VALUES (3, 3)")]).await;
    let events = events_of(cap.topic(&db, "a"), |m| count_rows(m) >= 3).await;
    let rows = row_events(&events);
    assert_eq!(rows.len(), 3);
    assert!(rows.iter().all(|e| e.op() == Op::SnapshotRead), "{rows:?}");
    let mut keys: Vec<i64> = rows.iter().map(int_key).collect();
    keys.sort();
    assert_eq!(keys, vec![1, 2, 3]);
    let events = events_of(cap.topic(&db, "b"), |m| count_rows(m) >= 2).await;
    let b: Vec<(Op, i64)> = row_events(&events)
        .iter()
        .map(|e| (e.op(), int_key(e)))
        .collect();
    assert_eq!(
        b,
        vec![(Op::Insert, 2), (Op::Insert, 3)],
        "b is streamed, not snapshotted"
    );
    tokio::time::sleep(Duration::from_secs(1)).await;
    let log = cap.stop_ok();
    assert!(log.contains("snapshot finished"), "{log}");

    // Served once: the same request id does not run again.
    let mut cap = CaptureProcess::spawn((request, connector, prefix));
    tokio::time::sleep(Duration::from_secs(3)).await;
    let log = cap.stop_ok();
    assert!(!log.contains("snapshot starts"), "{log}");
    // Its `mysql.start` (a FILE:POS) is not used with a checkpoint: said at start.
    assert!(log.contains("mysql.start is set, but connector"), "{log}");
    sql(&[format!("DROP DATABASE `{db}`")]).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_new_capture_killed_before_any_change_resumes_where_it_started() {
    let db = unique("sluice_t_cap_first");
    sql(&[
        format!("CREATE DATABASE `{db}`"),
        format!("CREATE TABLE `{db}`.t (id INT PRIMARY KEY)"),
    ])
    .await;
    // start = "end": the position is resolved at start and must be stored at once, or a
    // restart would resolve a later "end" and lose what came in between.
    let mut cap = CaptureProcess::spawn(CaptureProcess::config(&db, "end", ""));
    wait_first_checkpoint(&cap, Duration::from_secs(60)).await;
    cap.kill();
    sql(&[format!("INSERT INTO `{db}`.t VALUES (1), (2)")]).await;
    cap.restart();
    let events = events_of(cap.topic(&db, "t"), |m| count_rows(m) >= 2).await;
    let keys: Vec<i64> = row_events(&events).iter().map(int_key).collect();
    assert_eq!(keys, vec![1, 2]);
    let log = cap.stop_ok();
    assert!(log.contains("resuming from the checkpoint"), "{log}");
    sql(&[format!("DROP DATABASE `{db}`")]).await;
}

/// MariaDB logs INET6 and UUID as BINARY(16): rows read while their table has other columns
/// than when they were written (an ALTER since, read behind the server) keep those types, not
/// raw bytes.
#[tokio::test(flavor = "multi_thread")]
async fn inet6_and_uuid_rows_read_behind_an_alter_keep_their_types() {
    let db = unique("sluice_t_cap_behind_types");
    sql(&[
        format!("CREATE DATABASE `{db}`"),
        format!("CREATE TABLE `{db}`.t (id INT PRIMARY KEY, a INET6, u UUID)"),
    ])
    .await;
    let mut cap = CaptureProcess::spawn(CaptureProcess::config(&db, &binlog_end().await, ""));
    wait_first_checkpoint(&cap, Duration::from_secs(60)).await;
    cap.stop_ok();
    sql(&[
        format!(
            "INSERT INTO `{db}`.t VALUES (1, '::ffff:1.2.3.4', '6ccd780c-baba-1026-9564-5b8c656024db')"
        ),
        format!("ALTER TABLE `{db}`.t ADD COLUMN x INT"),
    ])
    .await;
    cap.restart();
    let events = events_of(cap.topic(&db, "t"), |m| count_rows(m) >= 1).await;
    let row = row_events(&events)
        .into_iter()
        .find(|e| op(e) == Op::Insert)
        .expect("the insert");
    assert_eq!(
        row.after.as_ref().unwrap().values,
        vec![
            value::int(1),
            value::text("::ffff:1.2.3.4"),
            value::text("6ccd780c-baba-1026-9564-5b8c656024db"),
        ]
    );
    cap.stop_ok();
    sql(&[format!("DROP DATABASE `{db}`")]).await;
}

/// The same for a column added by an ALTER read behind the server and gone again by the time
/// its rows are read: the type comes from the statement.
#[tokio::test(flavor = "multi_thread")]
async fn a_column_added_and_dropped_while_behind_keeps_the_type_its_statement_declared() {
    let db = unique("sluice_t_cap_behind_added");
    let mut cap = CaptureProcess::spawn(CaptureProcess::config(&db, &binlog_end().await, ""));
    sql(&[
        format!("CREATE DATABASE `{db}`"),
        format!("CREATE TABLE `{db}`.t (id INT PRIMARY KEY)"),
        format!("INSERT INTO `{db}`.t VALUES (1)"),
    ])
    .await;
    let topic = cap.topic(&db, "t");
    events_of(topic.clone(), |m| count_rows(m) >= 1).await;
    // Kept busy with 30 000 rows of another table, the capture reads what follows behind.
    sql(&[
        format!("CREATE TABLE `{db}`.bulk (id INT PRIMARY KEY, pad CHAR(100))"),
        format!("INSERT INTO `{db}`.bulk SELECT seq, REPEAT('x', 100) FROM `{db}`.seq_1_to_30000"),
        format!("ALTER TABLE `{db}`.t ADD COLUMN a INET4 NOT NULL DEFAULT '1.2.3.4'"),
        format!("INSERT INTO `{db}`.t VALUES (2, '10.0.0.2')"),
        format!("ALTER TABLE `{db}`.t DROP COLUMN a"),
    ])
    .await;
    let events = events_of(topic, |m| {
        row_events(m)
            .iter()
            .any(|e| op(e) == Op::Insert && int_key(e) == 2)
    })
    .await;
    let row = row_events(&events)
        .into_iter()
        .find(|e| op(e) == Op::Insert && int_key(e) == 2)
        .unwrap();
    assert_eq!(
        row.after.as_ref().unwrap().values,
        vec![value::int(2), value::text("10.0.0.2")]
    );
    cap.stop_ok();
    sql(&[format!("DROP DATABASE `{db}`")]).await;
}

/// A table made by `CREATE TABLE ... LIKE` another, and dropped and made again with other
/// columns, all while the capture was down: the rows of the copy keep the types of the table
/// it copied (as the capture knew them), not raw bytes.
#[tokio::test(flavor = "multi_thread")]
async fn a_table_made_like_another_read_behind_keeps_the_copied_types() {
    let db = unique("sluice_t_cap_behind_like");
    let mut cap = CaptureProcess::spawn(CaptureProcess::config(&db, &binlog_end().await, ""));
    sql(&[
        format!("CREATE DATABASE `{db}`"),
        format!("CREATE TABLE `{db}`.t (id INT PRIMARY KEY, u UUID)"),
        format!("INSERT INTO `{db}`.t VALUES (1, '6ccd780c-baba-1026-9564-5b8c656024db')"),
    ])
    .await;
    events_of(cap.topic(&db, "t"), |m| count_rows(m) >= 1).await;
    wait_first_checkpoint(&cap, Duration::from_secs(60)).await;
    cap.stop_ok();
    sql(&[
        format!("CREATE TABLE `{db}`.c LIKE `{db}`.t"),
        format!("INSERT INTO `{db}`.c SELECT * FROM `{db}`.t"),
        format!("DROP TABLE `{db}`.c"),
        format!("CREATE TABLE `{db}`.c (id INT PRIMARY KEY, v INT)"),
    ])
    .await;
    cap.restart();
    let events = events_of(cap.topic(&db, "c"), |m| count_rows(m) >= 1).await;
    let row = row_events(&events)
        .into_iter()
        .find(|e| op(e) == Op::Insert)
        .expect("the insert");
    assert_eq!(
        row.after.as_ref().unwrap().values,
        vec![
            value::int(1),
            value::text("6ccd780c-baba-1026-9564-5b8c656024db"),
        ]
    );
    cap.stop_ok();
    sql(&[format!("DROP DATABASE `{db}`")]).await;
}

/// And after a restart, for a column a statement read since dropped (information_schema no
/// longer has it): the type comes from the checkpoint.
#[tokio::test(flavor = "multi_thread")]
async fn a_column_dropped_while_the_capture_was_down_keeps_its_type() {
    let db = unique("sluice_t_cap_down_dropped");
    let mut cap = CaptureProcess::spawn(CaptureProcess::config(&db, &binlog_end().await, ""));
    sql(&[
        format!("CREATE DATABASE `{db}`"),
        format!("CREATE TABLE `{db}`.t (id INT PRIMARY KEY, a INET4)"),
        format!("INSERT INTO `{db}`.t VALUES (1, '10.0.0.1')"),
    ])
    .await;
    let topic = cap.topic(&db, "t");
    events_of(topic.clone(), |m| count_rows(m) >= 1).await;
    cap.stop_ok();
    sql(&[
        format!("INSERT INTO `{db}`.t VALUES (2, '10.0.0.2')"),
        format!("ALTER TABLE `{db}`.t DROP COLUMN a"),
    ])
    .await;
    cap.restart();
    let events = events_of(topic, |m| {
        row_events(m)
            .iter()
            .any(|e| op(e) == Op::Insert && int_key(e) == 2)
    })
    .await;
    let rows: Vec<Vec<sluice_proto::v1::Value>> = row_events(&events)
        .into_iter()
        .filter(|e| op(e) == Op::Insert)
        .map(|e| e.after.unwrap().values)
        .collect();
    assert_eq!(
        rows,
        vec![
            vec![value::int(1), value::text("10.0.0.1")],
            vec![value::int(2), value::text("10.0.0.2")]
        ]
    );
    cap.stop_ok();
    sql(&[format!("DROP DATABASE `{db}`")]).await;
}

/// A checkpoint committed after another connector's transaction began, while that one is left
/// open (its capture killed mid-write), is read: the read waits for the broker to end the open
/// one rather than stopping at the partition's last stable offset and starting without it.
#[tokio::test(flavor = "multi_thread")]
async fn a_checkpoint_behind_another_connectors_open_transaction_is_read() {
    use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
    let topic = unique("sluice_t_ckpt_open");
    let admin: rdkafka::admin::AdminClient<_> = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", kafka_brokers())
        .create()
        .unwrap();
    admin
        .create_topics(
            &[rdkafka::admin::NewTopic::new(
                &topic,
                1,
                rdkafka::admin::TopicReplication::Fixed(1),
            )],
            &rdkafka::admin::AdminOptions::new(),
        )
        .await
        .unwrap();
    let (t, open_id, mine_id) = (topic.clone(), unique("open"), unique("mine"));
    let hung = tokio::task::spawn_blocking(move || {
        let producer = |id: &str, timeout_ms: &str| -> BaseProducer {
            let p: BaseProducer = rdkafka::ClientConfig::new()
                .set("bootstrap.servers", kafka_brokers())
                .set("transactional.id", id)
                .set("transaction.timeout.ms", timeout_ms)
                .create()
                .unwrap();
            p.init_transactions(Duration::from_secs(30)).unwrap();
            p
        };
        // Another connector's writer: a transaction begun and never ended (the broker aborts
        // it after its 8 s).
        let open = producer(&open_id, "8000");
        open.begin_transaction().unwrap();
        open.send(BaseRecord::to(&t).key("other").payload("1"))
            .map_err(|(e, _)| e)
            .unwrap();
        open.flush(Duration::from_secs(10)).unwrap();
        // This connector's checkpoint, committed after it.
        let mine = producer(&mine_id, "60000");
        mine.begin_transaction().unwrap();
        mine.send(BaseRecord::to(&t).key("mine").payload("2"))
            .map_err(|(e, _)| e)
            .unwrap();
        mine.commit_transaction(Duration::from_secs(30)).unwrap();
        open // kept (not dropped, which would abort it) until the read is over
    })
    .await
    .unwrap();
    let kafka = sluice_common::KafkaConfig {
        brokers: kafka_brokers(),
        ..Default::default()
    };
    let t = topic.clone();
    let read = tokio::task::spawn_blocking(move || {
        sluice_capture::checkpoint::read_last_blocking(&kafka, &t, "sluice-tests", &|k| {
            k == b"mine" || k == b"other"
        })
    })
    .await
    .unwrap()
    .unwrap();
    drop(hung);
    let keys: Vec<(&String, &[u8])> = read.iter().map(|(k, r)| (k, &r.payload[..])).collect();
    assert_eq!(
        keys,
        vec![(&"mine".to_string(), &b"2"[..])],
        "the committed checkpoint, and not the aborted record"
    );
    let _ = admin
        .delete_topics(&[&topic], &rdkafka::admin::AdminOptions::new())
        .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_keyless_table_snapshot_under_a_writer_has_every_row_once() {
    let db = unique("sluice_t_snap_nopk");
    let mut statements = vec![
        format!("CREATE DATABASE `{db}`"),
        format!("CREATE TABLE `{db}`.nopk (v INT, pad VARCHAR(40))"),
    ];
    for b in 0..20 {
        let values: Vec<String> = (b * 1000..(b + 1) * 1000)
            .map(|v| format!("({v}, 'row {v}')"))
            .collect();
        statements.push(format!(
            "INSERT INTO `{db}`.nopk VALUES {}",
            values.join(",")
        ));
    }
    sql(&statements).await;
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
                    "INSERT INTO `{db}`.nopk VALUES ({}, 'new')",
                    100_000 + n
                ))
                .await
                .unwrap();
                n += 1;
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            n
        })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut cap = CaptureProcess::spawn(CaptureProcess::config(
        &db,
        "end",
        "[snapshot]\nmode = \"snapshot+stream\"\n",
    ));
    sluice_tests::capture::wait_snapshot_done(cap.metrics_port, Duration::from_secs(120)).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let inserted = writer.await.unwrap();
    assert!(inserted > 10, "the writer inserted {inserted} rows");
    let mut c = mysql_async::Conn::new(mysql_async::Opts::from_url(&mysql_url()).unwrap())
        .await
        .unwrap();
    let mut want: Vec<i64> = c.query(format!("SELECT v FROM `{db}`.nopk")).await.unwrap();
    want.sort();
    let n = want.len();
    let events = events_of(cap.topic(&db, "nopk"), move |m| count_rows(m) >= n).await;
    let mut got: Vec<i64> = events
        .values()
        .flatten()
        .filter(|e| e.key.is_some())
        .map(|e| match e.after.as_ref().unwrap().values[0].kind {
            Some(Kind::Int(v)) => v,
            ref other => panic!("{other:?}"),
        })
        .collect();
    got.sort();
    // Every row once: the snapshot's (as of its position) and the inserts after it.
    if got != want {
        let g: std::collections::BTreeMap<i64, usize> =
            got.iter().fold(Default::default(), |mut m, v| {
                *m.entry(*v).or_default() += 1;
                m
            });
        let twice: Vec<_> = g.iter().filter(|(_, n)| **n > 1).take(10).collect();
        let missing: Vec<_> = want
            .iter()
            .filter(|v| !g.contains_key(v))
            .take(10)
            .collect();
        panic!(
            "{} events for {} rows; published twice {twice:?}; missing {missing:?}",
            got.len(),
            want.len()
        );
    }
    cap.stop_ok();
    sql(&[format!("DROP DATABASE `{db}`")]).await;
}

/// XA transactions, whose rows the server logs at XA PREPARE: a prepared one arrives at its XA
/// COMMIT (also across a capture killed while it waits), a rolled-back one never, a one-phase
/// commit at once; ordinary transactions in between flow meanwhile.
#[tokio::test(flavor = "multi_thread")]
async fn xa_transactions_arrive_at_their_commit_and_never_after_a_rollback() {
    let db = unique("sluice_t_cap_xa");
    sql(&[
        format!("CREATE DATABASE `{db}`"),
        format!("CREATE TABLE `{db}`.t (id INT PRIMARY KEY, n INT) ENGINE=InnoDB"),
    ])
    .await;
    let mut cap = CaptureProcess::spawn(CaptureProcess::config(&db, &binlog_end().await, ""));
    let conn = || async {
        mysql_async::Conn::new(mysql_async::Opts::from_url(&mysql_url()).unwrap())
            .await
            .unwrap()
    };
    let (ga, gb, gc) = (unique("xa"), unique("xb"), unique("xc"));
    let t = format!("`{db}`.t");
    let mut a = conn().await;
    for s in [
        format!("XA START '{ga}'"),
        format!("INSERT INTO {t} VALUES (1, 1)"),
        format!("XA END '{ga}'"),
        format!("XA PREPARE '{ga}'"),
    ] {
        a.query_drop(&s)
            .await
            .unwrap_or_else(|e| panic!("{s}: {e}"));
    }
    sql(&[
        format!("INSERT INTO {t} VALUES (10, 10)"),
        format!("XA START '{gb}'"),
        format!("INSERT INTO {t} VALUES (2, 2)"),
        format!("XA END '{gb}'"),
        format!("XA PREPARE '{gb}'"),
        format!("XA ROLLBACK '{gb}'"),
        format!("XA START '{gc}'"),
        format!("INSERT INTO {t} VALUES (3, 3)"),
        format!("XA END '{gc}'"),
        format!("XA COMMIT '{gc}' ONE PHASE"),
        format!("INSERT INTO {t} VALUES (12, 12)"),
    ])
    .await;
    let keys = |m: &BTreeMap<i32, Vec<ChangeEvent>>| -> std::collections::BTreeSet<i64> {
        row_events(m).iter().map(int_key).collect()
    };
    let topic = cap.topic(&db, "t");
    let seen = events_of(topic.clone(), move |m| {
        let k: Vec<i64> = row_events(m).iter().map(int_key).collect();
        [3, 10, 12].iter().all(|x| k.contains(x))
    })
    .await;
    assert_eq!(
        keys(&seen),
        [3, 10, 12].into_iter().collect(),
        "the prepared transaction waits, the rolled-back one never comes"
    );
    // Killed while the prepared transaction waits: its checkpoint is before it.
    cap.kill();
    cap.restart();
    a.query_drop(format!("XA COMMIT '{ga}'")).await.unwrap();
    drop(a);
    sql(&[format!("INSERT INTO {t} VALUES (11, 11)")]).await;
    let seen = events_of(topic, move |m| {
        let k: Vec<i64> = row_events(m).iter().map(int_key).collect();
        [1, 3, 10, 11, 12].iter().all(|x| k.contains(x))
    })
    .await;
    assert_eq!(
        keys(&seen),
        [1, 3, 10, 11, 12].into_iter().collect(),
        "the committed XA transaction arrives, after a restart too"
    );
    let log = cap.stop_ok();
    assert!(log.contains("XA transaction committed"), "{log}");
    sql(&[format!("DROP DATABASE `{db}`")]).await;
}

/// A row too large to publish (over `publish.max_message_bytes`): its table is refused with
/// the row's key named, the other tables flow, and a restart reads past it again instead of
/// stopping at it every time.
#[tokio::test(flavor = "multi_thread")]
async fn a_row_too_large_to_publish_refuses_its_table_and_the_rest_flows() {
    let db = unique("sluice_t_cap_big");
    sql(&[
        format!("CREATE DATABASE `{db}`"),
        format!("CREATE TABLE `{db}`.big (id INT PRIMARY KEY, b LONGBLOB)"),
        format!("CREATE TABLE `{db}`.small (id INT PRIMARY KEY)"),
    ])
    .await;
    let mut config = CaptureProcess::config(&db, &binlog_end().await, "");
    config.0 = config.0.replace(
        "checkpoint_interval_ms = 100\n",
        "checkpoint_interval_ms = 100\nmax_message_bytes = 1048576\n",
    );
    let mut cap = CaptureProcess::spawn(config);
    sql(&[
        format!("INSERT INTO `{db}`.big VALUES (1, 'small enough')"),
        format!("INSERT INTO `{db}`.big VALUES (2, REPEAT('x', 1500000))"),
        format!("INSERT INTO `{db}`.small VALUES (1)"),
    ])
    .await;
    let small = cap.topic(&db, "small");
    let seen = events_of(small.clone(), |m| count_rows(m) >= 1).await;
    assert_eq!(count_rows(&seen), 1, "the other table flows");
    let big = cap.topic(&db, "big");
    let refused = |m: &BTreeMap<i32, Vec<ChangeEvent>>| {
        m.values()
            .flatten()
            .filter_map(|e| e.ddl.as_ref())
            .find(|d| d.kind == "refused")
            .map(|d| d.reason.clone())
    };
    let seen = events_of(big.clone(), move |m| {
        refused(m).is_some() && row_events(m).iter().any(|e| int_key(e) == 1)
    })
    .await;
    let reason = refused(&seen).expect("a refused event on the big table's topic");
    assert!(
        reason.contains("id = Int(2)") && reason.contains("publish.max_message_bytes (1048576)"),
        "{reason}"
    );
    let keys: Vec<i64> = row_events(&seen).iter().map(int_key).collect();
    assert_eq!(
        keys,
        vec![1],
        "the row before it arrives, the large one does not"
    );
    // Restarted from a checkpoint before the large row: it goes on past it again.
    cap.kill();
    cap.restart();
    sql(&[format!("INSERT INTO `{db}`.small VALUES (2)")]).await;
    let seen = events_of(small, |m| row_events(m).iter().any(|e| int_key(e) == 2)).await;
    assert!(row_events(&seen).iter().any(|e| int_key(e) == 2));
    let (code, log) = cap.stop();
    assert_eq!(code, Some(0), "the capture runs on: {log}");
    sql(&[format!("DROP DATABASE `{db}`")]).await;
}

/// `mysql.generation`: versions carry it in their top 8 bits (above every version of an
/// earlier generation, whatever the binlog file), and the checkpoint keeps it over a
/// configuration that forgets it.
#[tokio::test(flavor = "multi_thread")]
async fn a_new_generation_keeps_versions_above_every_earlier_one() {
    let db = unique("sluice_t_cap_gen");
    sql(&[
        format!("CREATE DATABASE `{db}`"),
        format!("CREATE TABLE `{db}`.t (id INT PRIMARY KEY)"),
    ])
    .await;
    let mut config = CaptureProcess::config(&db, &binlog_end().await, "");
    config.0 = config.0.replace(
        "heartbeat_ms = 1000\n",
        "heartbeat_ms = 1000\ngeneration = 3\n",
    );
    let mut cap = CaptureProcess::spawn(config);
    sql(&[format!("INSERT INTO `{db}`.t VALUES (1)")]).await;
    let topic = cap.topic(&db, "t");
    let seen = events_of(topic.clone(), |m| count_rows(m) >= 1).await;
    let v1 = row_events(&seen)[0].version;
    assert_eq!(v1 >> 56, 3, "version {v1:#x}");
    // Restarted with generation 0 in its configuration: the checkpoint's 3 holds.
    cap.stop_ok();
    cap.edit_config("generation = 3\n", "");
    cap.restart();
    sql(&[format!("INSERT INTO `{db}`.t VALUES (2)")]).await;
    let seen = events_of(topic, |m| row_events(m).iter().any(|e| int_key(e) == 2)).await;
    let v2 = row_events(&seen)
        .iter()
        .find(|e| int_key(e) == 2)
        .unwrap()
        .version;
    assert_eq!(v2 >> 56, 3, "version {v2:#x}");
    assert!(v2 > v1);
    cap.stop_ok();
    sql(&[format!("DROP DATABASE `{db}`")]).await;
}

/// `publish.heartbeat_interval_ms`: an idle capture publishes heartbeats, with a version at or
/// above every change before them, and says it is caught up (lag 0).
#[tokio::test(flavor = "multi_thread")]
async fn an_idle_capture_publishes_heartbeats() {
    let db = unique("sluice_t_cap_beat");
    sql(&[
        format!("CREATE DATABASE `{db}`"),
        format!("CREATE TABLE `{db}`.t (id INT PRIMARY KEY)"),
    ])
    .await;
    let mut config = CaptureProcess::config(&db, &binlog_end().await, "");
    config.0 = config.0.replace(
        "checkpoint_interval_ms = 100\n",
        "checkpoint_interval_ms = 100\nheartbeat_interval_ms = 500\n",
    );
    let prefix = config.2.clone();
    let connector = config.1.clone();
    let mut cap = CaptureProcess::spawn(config);
    sql(&[format!("INSERT INTO `{db}`.t VALUES (1)")]).await;
    let seen = events_of(cap.topic(&db, "t"), |m| count_rows(m) >= 1).await;
    let row_version = row_events(&seen)[0].version;
    let topic = sluice_capture::publish::heartbeat_topic(&prefix);
    let beats = events_of(topic, move |m| {
        m.values()
            .flatten()
            .filter(|e| e.version >= row_version)
            .count()
            >= 2
    })
    .await;
    let beats: Vec<&ChangeEvent> = beats.values().flatten().collect();
    assert!(beats.len() >= 2, "{beats:?}");
    for b in &beats {
        assert_eq!(b.op(), Op::Heartbeat);
        assert_eq!(b.source.as_ref().unwrap().connector, connector);
        assert!(b.position.is_some() && b.key.is_none() && b.after.is_none());
    }
    assert!(beats.iter().any(|b| b.version >= row_version));
    // Caught up: lag 0 once the binlog is read to its end (other tests write to the same
    // server meanwhile, so the capture is idle only between their transactions).
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let lag = sluice_tests::capture::metric_at(cap.metrics_port, "sluice_capture_lag_seconds");
        if lag == Some(0.0) {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "idle, yet never caught up: lag {lag:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    cap.stop_ok();
    sql(&[format!("DROP DATABASE `{db}`")]).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_second_capture_of_one_connector_fences_the_first() {
    let db = unique("sluice_t_cap_fence");
    sql(&[
        format!("CREATE DATABASE `{db}`"),
        format!("CREATE TABLE `{db}`.t (id INT PRIMARY KEY, v INT)"),
    ])
    .await;
    let config = CaptureProcess::config(&db, &binlog_end().await, "");
    let mut first = CaptureProcess::spawn(config.clone());
    sql(&[format!("INSERT INTO `{db}`.t VALUES (1, 1)")]).await;
    let topic = first.topic(&db, "t");
    let t = topic.clone();
    events_of(t, |m| count_rows(m) >= 1).await;

    // The same connector again (as a second deployment of one configuration would be; its own
    // replica server_id, so that the server does not cut the first one's binlog connection).
    let (text, connector, prefix) = config;
    let text = text
        .lines()
        .map(|l| {
            if l.starts_with("server_id = ") {
                format!("server_id = {}", sluice_tests::replica_server_id())
            } else {
                l.to_string()
            }
        })
        .collect::<Vec<_>>()
        .join("\n");
    // The first, restarted, resumes from its checkpoint and stays idle: it has marked nothing
    // of its own since its start.
    first.stop_ok();
    first.restart();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let mut second = CaptureProcess::spawn((text, connector.clone(), prefix));
    // The first learns at its next checkpoint (an idle one rewrites the checkpoint it resumed
    // from every 10 s), and stops: the source stays idle meanwhile.
    let (code, log) = first.wait(Duration::from_secs(40));
    sql(&[format!("INSERT INTO `{db}`.t VALUES (2, 2)")]).await;
    assert_eq!(code, Some(1), "{log}");
    assert!(
        log.contains("another capture was started with the same connector name"),
        "{log}"
    );
    assert!(log.contains(&connector), "{log}");

    // The second goes on alone: every row arrives, and the checkpoint is its own.
    sql(&[
        format!("INSERT INTO `{db}`.t VALUES (3, 3)"),
        format!("UPDATE `{db}`.t SET v = 10 WHERE id = 1"),
    ])
    .await;
    // (keys go to different partitions: wait for each)
    let seen = events_of(topic, |m| {
        let rows = row_events(m);
        let keys: std::collections::BTreeSet<i64> = rows.iter().map(int_key).collect();
        keys.len() == 3 && rows.iter().any(|e| e.op() == Op::Update && int_key(e) == 1)
    })
    .await;
    let keys: std::collections::BTreeSet<i64> = row_events(&seen).iter().map(int_key).collect();
    assert_eq!(keys, [1, 2, 3].into_iter().collect(), "every row published");
    let log = second.stop_ok();
    assert!(!log.contains("another capture"), "{log}");
    let checkpoint = sluice_tests::capture::last_checkpoint(&connector).expect("checkpoint");
    let stopped_at = log
        .lines()
        .find(|l| l.contains("last checkpoint stored"))
        .unwrap_or_default()
        .to_string();
    let next = format!(
        "{}:{}",
        checkpoint["next"]["file"].as_str().unwrap(),
        checkpoint["next"]["pos"]
    );
    assert!(stopped_at.contains(&next), "{stopped_at} / {checkpoint}");
    sql(&[format!("DROP DATABASE `{db}`")]).await;
}

/// Partitions added to a change topic while the pipeline runs (an operator scaling out) must
/// not move keys: an apply stage reading a key's newer events from another partition than its
/// older ones could write them out of order. Keys stay on the partitions the topic had when
/// the connector first published to it, through a restart too, and the capture says so.
#[tokio::test(flavor = "multi_thread")]
async fn partitions_added_to_a_topic_keep_every_key_on_its_partition() {
    use rdkafka::admin::{AdminClient, AdminOptions, NewPartitions};
    let db = unique("sluice_t_cap_grow");
    sql(&[
        format!("CREATE DATABASE `{db}`"),
        format!("CREATE TABLE `{db}`.t (id INT PRIMARY KEY, n INT) ENGINE=InnoDB"),
    ])
    .await;
    let mut cap = CaptureProcess::spawn(CaptureProcess::config(&db, &binlog_end().await, ""));
    const N: usize = 60;
    let inserts: Vec<String> = (0..N)
        .map(|i| format!("INSERT INTO `{db}`.t VALUES ({i}, 0)"))
        .collect();
    sql(&inserts).await;
    let topic = cap.topic(&db, "t");
    let first = events_of(topic.clone(), |m| count_rows(m) >= N).await;
    assert_eq!(count_rows(&first), N);
    // 3 partitions become 6.
    let admin: AdminClient<rdkafka::client::DefaultClientContext> = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", kafka_brokers())
        .create()
        .unwrap();
    for r in admin
        .create_partitions(&[NewPartitions::new(&topic, 6)], &AdminOptions::new())
        .await
        .unwrap()
    {
        r.unwrap();
    }
    sql(&[format!("UPDATE `{db}`.t SET n = 1")]).await;
    cap.stop_ok();
    cap.restart();
    sql(&[format!("UPDATE `{db}`.t SET n = 2")]).await;
    let events = events_of(topic, |m| count_rows(m) >= 3 * N).await;
    assert_eq!(count_rows(&events), 3 * N, "every change arrives once");
    let mut partition_of: HashMap<i64, i32> = HashMap::new();
    let mut moved = Vec::new();
    for (p, evs) in &events {
        for e in evs.iter().filter(|e| e.key.is_some()) {
            let k = int_key(e);
            let first = *partition_of.entry(k).or_insert(*p);
            if first != *p || *p >= 3 {
                moved.push(format!(
                    "key {k} on {p} (first on {first}), version {}",
                    e.version
                ));
            }
        }
    }
    if !moved.is_empty() {
        let (_, log) = cap.stop();
        panic!(
            "keys left their partitions: {:?}\nthe capture's log:\n{log}",
            &moved[..moved.len().min(10)]
        );
    }
    assert_eq!(partition_of.len(), N);
    let log = cap.stop_ok();
    assert!(
        log.contains("more partitions than when this connector first published to it"),
        "the restarted capture says why the added partitions stay empty:\n{log}"
    );
    sql(&[format!("DROP DATABASE `{db}`")]).await;
}

/// A table with a YEAR column created while the capture is caught up: its CREATE is published
/// with the schema read from information_schema, and its first rows' table map must agree with
/// it (the binlog sets YEAR's signedness bit, information_schema gives it no sign); before,
/// the table was refused as "the schema published with the table's last DDL disagrees".
#[tokio::test(flavor = "multi_thread")]
async fn a_year_column_created_while_streaming_is_not_refused() {
    let db = unique("sluice_t_cap_year");
    let mut cap = CaptureProcess::spawn(CaptureProcess::config(&db, &binlog_end().await, ""));
    sql(&[
        format!("CREATE DATABASE `{db}`"),
        format!("CREATE TABLE `{db}`.y (id INT PRIMARY KEY, y YEAR NOT NULL, n INT UNSIGNED)"),
    ])
    .await;
    // The capture reads the CREATE caught up, before any row.
    tokio::time::sleep(Duration::from_secs(2)).await;
    sql(&[format!(
        "INSERT INTO `{db}`.y VALUES (1, 2024, 7), (2, 1999, 8)"
    )])
    .await;
    let events = events_of(cap.topic(&db, "y"), |m| count_rows(m) >= 2).await;
    let all: Vec<&ChangeEvent> = events.values().flatten().collect();
    assert!(
        !all.iter()
            .any(|e| e.ddl.as_ref().is_some_and(|d| d.kind == "refused")),
        "{all:#?}"
    );
    assert_eq!(row_events(&events).len(), 2, "{all:#?}");
    cap.stop_ok();
    sql(&[format!("DROP DATABASE `{db}`")]).await;
}

/// `publish.topics_at_start`: the topics of every table the filter takes are made when the
/// capture starts, before any row (with the configured partitions), and none for a table it
/// leaves out; rows then go to them as usual.
#[tokio::test(flavor = "multi_thread")]
async fn topics_at_start_makes_every_filtered_tables_topic_before_any_row() {
    let db = unique("sluice_t_topics_at_start");
    sql(&[
        format!("CREATE DATABASE `{db}`"),
        format!("CREATE TABLE `{db}`.a (id INT PRIMARY KEY)"),
        format!("CREATE TABLE `{db}`.b (id INT PRIMARY KEY)"),
        format!("CREATE TABLE `{db}`.skipped (id INT PRIMARY KEY)"),
    ])
    .await;
    let (text, connector, prefix) = CaptureProcess::config(&db, &binlog_end().await, "");
    let text = text
        .replace(
            "[filter]\n",
            &format!("[filter]\nexclude = [\"{db}\\\\.skipped\"]\n"),
        )
        .replace("[publish]\n", "[publish]\ntopics_at_start = true\n");
    let mut cap = CaptureProcess::spawn((text, connector, prefix.clone()));
    let consumer: rdkafka::consumer::BaseConsumer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", kafka_brokers())
        .create()
        .unwrap();
    let mine = || -> BTreeMap<String, usize> {
        let md =
            rdkafka::consumer::Consumer::fetch_metadata(&consumer, None, Duration::from_secs(10))
                .unwrap();
        md.topics()
            .iter()
            .filter(|t| t.name().starts_with(&format!("{prefix}.")))
            .map(|t| (t.name().to_string(), t.partitions().len()))
            .collect()
    };
    let want: BTreeMap<String, usize> = [
        (format!("{prefix}.{db}.a"), 3),
        (format!("{prefix}.{db}.b"), 3),
    ]
    .into_iter()
    .collect();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while mine() != want {
        assert!(
            std::time::Instant::now() < deadline,
            "topics before any row: {:?}",
            mine()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    sql(&[format!("INSERT INTO `{db}`.b VALUES (1), (2), (3)")]).await;
    let seen = events_of(format!("{prefix}.{db}.b"), |m| count_rows(m) >= 3).await;
    assert_eq!(count_rows(&seen), 3);
    let log = cap.stop_ok();
    assert!(log.contains("created the filtered tables' topics"), "{log}");
    sql(&[format!("DROP DATABASE `{db}`")]).await;
}
