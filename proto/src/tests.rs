//! Round trips of every value kind, with extremes, and the addressing rules.

use super::v1::{self, value::Kind};
use super::*;

fn round_trip_value(kind: Kind) {
    let v = value::of(kind.clone());
    let bytes = v.encode_to_vec();
    let back = Value::decode(bytes.as_slice()).expect("decode");
    assert_eq!(back.kind, Some(kind), "value changed on the way");
}

pub(crate) fn every_value_kind() -> Vec<Kind> {
    let big_decimal = format!("{}.{}", "9".repeat(35), "9".repeat(30));
    let mut kinds = vec![
        Kind::Null(true),
        Kind::Int(i64::MIN),
        Kind::Int(i64::MAX),
        Kind::Int(-128),
        Kind::Int(-8_388_608), // MEDIUMINT min
        Kind::Int(0),
        Kind::Uint(u64::MAX),
        Kind::Uint(0),
        Kind::Uint(16_777_215), // MEDIUMINT UNSIGNED max
        Kind::Float32(f32::MAX),
        Kind::Float32(f32::MIN_POSITIVE),
        Kind::Float32(-0.0),
        Kind::Float32(f32::INFINITY),
        Kind::Float64(f64::MIN),
        Kind::Float64(f64::EPSILON),
        Kind::Float64(f64::NEG_INFINITY),
        Kind::Decimal(big_decimal.clone()),
        Kind::Decimal(format!("-{big_decimal}")),
        Kind::Decimal("0.000000000000000000000000000001".into()),
        Kind::Text(String::new()),
        Kind::Text("emoji 😀 utf8mb4, 中文, Ünïcödé".into()),
        Kind::Bytes(vec![0, 0, 255, 0, 1]),
        Kind::Bytes(Vec::new()),
        Kind::Bits(u64::MAX),
        Kind::Bits(1),
        Kind::EnumValue(v1::EnumValue {
            index: 0,
            label: String::new(),
        }),
        Kind::EnumValue(v1::EnumValue {
            index: 3,
            label: "en3".into(),
        }),
        Kind::SetValue(v1::SetValue {
            bits: 0b101,
            members: vec!["set1".into(), "set3".into()],
        }),
        Kind::SetValue(v1::SetValue {
            bits: u64::MAX,
            members: (0..64).map(|i| format!("m{i}")).collect(),
        }),
        Kind::Date(v1::Date {
            year: 0,
            month: 0,
            day: 0,
        }),
        Kind::Date(v1::Date {
            year: 9999,
            month: 12,
            day: 31,
        }),
        Kind::Date(v1::Date {
            year: 1000,
            month: 1,
            day: 1,
        }),
        Kind::TimeMicros(-(838 * 3600 + 59 * 60 + 59) * 1_000_000),
        Kind::TimeMicros((838 * 3600 + 59 * 60 + 59) * 1_000_000),
        Kind::TimeMicros(-1_500_000), // -00:00:01.5
        Kind::Datetime(v1::DateTime {
            year: 0,
            month: 0,
            day: 0,
            hour: 0,
            minute: 0,
            second: 0,
            micros: 0,
        }),
        Kind::Datetime(v1::DateTime {
            year: 9999,
            month: 12,
            day: 31,
            hour: 23,
            minute: 59,
            second: 59,
            micros: 999_999,
        }),
        Kind::TimestampMicros(0),
        Kind::TimestampMicros(2_147_483_647 * 1_000_000 + 999_999),
        Kind::TimestampMicros(1_000_000),
        Kind::Geometry(v1::Geometry {
            srid: 4326,
            wkb: vec![
                1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 240, 63, 0, 0, 0, 0, 0, 0, 0, 64,
            ],
        }),
        Kind::Json(r#"{"a": [1, 2.5, null, "x"], "b": {"c": true}}"#.into()),
        Kind::Bson(vec![5, 0, 0, 0, 0]),
        Kind::RawText(v1::RawText {
            data: vec![0xff, 0xfe, 0x00],
            charset: "utf8mb4".into(),
        }),
    ];
    // YEAR travels as int.
    kinds.push(Kind::Int(2155));
    kinds.push(Kind::Int(1901));
    kinds
}

#[test]
fn every_value_kind_round_trips() {
    let kinds = every_value_kind();
    // Each oneof variant of Value appears at least once.
    let tags: std::collections::HashSet<_> = kinds.iter().map(std::mem::discriminant).collect();
    assert_eq!(
        tags.len(),
        19,
        "a Value variant is missing from the round-trip set"
    );
    for k in kinds {
        round_trip_value(k);
    }
}

#[test]
fn nan_survives() {
    let v = value::of(Kind::Float64(f64::NAN));
    let back = Value::decode(v.encode_to_vec().as_slice()).unwrap();
    match back.kind {
        Some(Kind::Float64(x)) => assert!(x.is_nan()),
        other => panic!("got {other:?}"),
    }
}

#[test]
fn absent_value_is_not_null() {
    let absent = Value { kind: None };
    let back = Value::decode(absent.encode_to_vec().as_slice()).unwrap();
    assert_eq!(back.kind, None);
    assert!(!value::is_null(&back));
    assert!(value::is_null(&value::null()));
}

pub(crate) fn sample_event() -> ChangeEvent {
    let row = v1::Row {
        values: every_value_kind().into_iter().map(value::of).collect(),
    };
    let schema = TableSchema {
        database: "shop".into(),
        table: "orders".into(),
        columns: vec![v1::Column {
            name: "id".into(),
            r#type: v1::ColumnType::Bigint as i32,
            sql_type: "bigint(20) unsigned".into(),
            nullable: false,
            unsigned: true,
            length: 20,
            ..Default::default()
        }],
        primary_key: vec![0],
        schema_id: 0,
    };
    ChangeEvent {
        contract: CONTRACT_VERSION,
        source: Some(v1::Source {
            kind: v1::SourceKind::Mariadb as i32,
            connector: "c1".into(),
            server_id: 1,
            server_uuid_or_replica_set: String::new(),
        }),
        op: Op::Update as i32,
        database: "shop".into(),
        table: "orders".into(),
        version: mysql_version("mysql-bin.000042", 1234, 7).unwrap(),
        position: Some(v1::Position {
            kind: Some(v1::position::Kind::Binlog(v1::BinlogPosition {
                file: "mysql-bin.000042".into(),
                pos: 1234,
                commit_pos: 9999,
                gtid: "0-1-77".into(),
                gtid_set: "0-1-77".into(),
                row: 7,
            })),
        }),
        commit_time_micros: 1_700_000_000_123_456,
        capture_time_micros: 1_700_000_000_223_456,
        transaction: Some(v1::Transaction {
            id: "0-1-77".into(),
            index: 7,
            last: false,
        }),
        schema_id: schema_id(&schema),
        schema: Some(schema),
        key: Some(v1::Row {
            values: vec![value::uint(u64::MAX)],
        }),
        before: Some(row.clone()),
        after: Some(row),
        ddl: None,
        mongo: Some(v1::MongoChange {
            document_key: vec![1, 2, 3],
            full_document: vec![],
            full_document_before_change: vec![],
            update_description: Some(v1::UpdateDescription {
                updated_fields: vec![5, 0, 0, 0, 0],
                removed_fields: vec!["a.b".into()],
                truncated_arrays: vec![v1::TruncatedArray {
                    field: "arr".into(),
                    new_size: 2,
                }],
            }),
            operation_type: "update".into(),
            lsid: vec![9],
            txn_number: i64::MAX,
        }),
    }
}

#[test]
fn whole_event_round_trips() {
    let ev = sample_event();
    let back = ChangeEvent::decode(ev.encode_to_vec().as_slice()).unwrap();
    assert_eq!(back, ev);
}

#[test]
fn ddl_event_round_trips() {
    let mut ev = sample_event();
    ev.op = Op::Ddl as i32;
    ev.before = None;
    ev.after = None;
    ev.ddl = Some(v1::Ddl {
        statement: "ALTER TABLE orders ADD COLUMN note TEXT".into(),
        schema: ev.schema.clone(),
        new_database: String::new(),
        new_table: String::new(),
        kind: "alter".into(),
        reason: String::new(),
        statements: vec!["ALTER TABLE orders ADD COLUMN note TEXT".into()],
        before: ev.schema.clone(),
        rebuild: v1::Rebuild::Rows as i32,
        rebuild_reason: "column note added with the default 'x'".into(),
    });
    let back = ChangeEvent::decode(ev.encode_to_vec().as_slice()).unwrap();
    assert_eq!(back, ev);
    assert_eq!(back.op(), Op::Ddl);
}

#[test]
fn default_topic_names() {
    let t = TopicTemplate::new(TopicTemplate::DEFAULT, "cdc").unwrap();
    assert_eq!(t.topic("shop", "orders").unwrap(), "cdc.shop.orders");
    // Characters Kafka refuses become '_'.
    assert_eq!(t.topic("my db", "tbl$1").unwrap(), "cdc.my_db.tbl_1");
    let t = TopicTemplate::new("{db}-{table}", "ignored").unwrap();
    assert_eq!(t.topic("a", "b").unwrap(), "a-b");
}

#[test]
fn bad_templates_are_refused_with_the_reason() {
    let e = TopicTemplate::new("{prefix}.{schema}.{table}", "x").unwrap_err();
    assert!(
        e.to_string().contains("unknown placeholder {schema}"),
        "{e}"
    );
    let e = TopicTemplate::new("{prefix", "x").unwrap_err();
    assert!(e.to_string().contains("without a closing"), "{e}");
    assert!(TopicTemplate::new("", "x").is_err());
    let t = TopicTemplate::new("{table}", "x").unwrap();
    let e = t.topic("db", &"t".repeat(250)).unwrap_err();
    assert!(e.to_string().contains("249"), "{e}");
}

#[test]
fn keys_are_deterministic_and_distinct() {
    let a = event_key("db", "t", &[value::uint(1)]);
    let b = event_key("db", "t", &[value::uint(1)]);
    let c = event_key("db", "t", &[value::uint(2)]);
    let d = event_key("db", "t2", &[value::uint(1)]);
    assert_eq!(a, b);
    assert_ne!(a, c);
    assert_ne!(a, d);
    // Composite keys keep their order.
    assert_ne!(
        event_key("db", "t", &[value::int(1), value::text("x")]),
        event_key("db", "t", &[value::text("x"), value::int(1)])
    );
    // The per-table prefix plus the values gives the same bytes.
    let mut buf = Vec::new();
    let key = [value::int(1), value::text("x"), value::null()];
    append_event_key(&event_key_prefix("db", "t"), &key, &mut buf);
    assert_eq!(buf, event_key("db", "t", &key));
    let back = EventKey::decode(a.as_slice()).unwrap();
    assert_eq!(back.key, vec![value::uint(1)]);
}

#[test]
fn mysql_versions_grow_with_the_binlog() {
    let v = |f: &str, p: u64, r: u32| mysql_version(f, p, r).unwrap();
    // Rows of one event, events of one file, files.
    assert!(v("bin.000001", 100, 0) < v("bin.000001", 100, 1));
    assert!(v("bin.000001", 100, 50) < v("bin.000001", 200, 0));
    assert!(v("bin.000001", u32::MAX as u64 - 1, 0) < v("bin.000002", 4, 0));
    assert_eq!(v("mysql-bin.000042", 4, 0), 42 << 32 | 4);
    assert!(matches!(
        mysql_version("nonumber", 4, 0),
        Err(ContractError::BadBinlogFile(_))
    ));
    assert!(matches!(
        mysql_version("bin.000001", u32::MAX as u64, 1),
        Err(ContractError::VersionOverflow { .. })
    ));
    assert!(matches!(
        mysql_version("bin.4294967296", 4, 0),
        Err(ContractError::VersionOverflow { .. })
    ));
    // File numbers above 2^24 would reach into the generation's bits.
    assert!(matches!(
        mysql_version("bin.16777216", 4, 0),
        Err(ContractError::VersionOverflow { .. })
    ));
    assert!(mysql_version("bin.16777215", 4, 0).is_ok());
}

#[test]
fn a_later_binlog_generation_is_above_every_version_of_an_earlier_one() {
    let v = |g: u8, f: &str, p: u64| mysql_version_in(g, f, p, 0).unwrap();
    // RESET MASTER: the files start again at 1, in the next generation.
    assert!(v(0, "bin.999999", u32::MAX as u64 - 1) < v(1, "bin.000001", 4));
    assert_eq!(
        v(0, "bin.000007", 4),
        mysql_version("bin.000007", 4, 0).unwrap()
    );
    assert_eq!(v(2, "bin.000001", 4), 2 << 56 | 1 << 32 | 4);
    assert!(v(254, "bin.16777215", 4) < v(255, "bin.000001", 4));
}

#[test]
fn mongo_versions_follow_the_oplog_timestamp() {
    assert!(mongo_version(100, u32::MAX) < mongo_version(101, 0));
    assert!(mongo_version(100, 1) < mongo_version(100, 2));
    assert_eq!(mongo_version(1, 2), 1 << 32 | 2);
}

#[test]
fn schema_ids_depend_on_content_only() {
    let ev = sample_event();
    let s = ev.schema.unwrap();
    let mut with_id = s.clone();
    with_id.schema_id = 12345;
    assert_eq!(schema_id(&s), schema_id(&with_id));
    let mut other = s.clone();
    other.columns[0].nullable = true;
    assert_ne!(schema_id(&s), schema_id(&other));
    assert_eq!(schema_record_key(0xab), "00000000000000ab");
}

#[test]
fn an_event_header_writes_prosts_encoding() {
    let mut e = sample_event();
    // A row event: no DDL, no MongoDB change.
    (e.ddl, e.mongo) = (None, None);
    e.key = Some(v1::Row {
        values: vec![value::of(Kind::Int(-7))],
    });
    e.before = e.after.clone();
    e.before.as_mut().unwrap().values.push(Value { kind: None });
    let oplog = Some(v1::Position {
        kind: Some(v1::position::Kind::Oplog(v1::OplogPosition {
            ts_seconds: 5,
            ts_increment: 6,
            resume_token: vec![1, 2],
        })),
    });
    let variants = [
        e.clone(),
        ChangeEvent {
            before: None,
            position: None,
            transaction: None,
            ..e.clone()
        },
        ChangeEvent {
            after: None,
            key: Some(v1::Row::default()),
            position: oplog,
            schema: None,
            ..e.clone()
        },
        // The last event of its transaction, and a GTID set long enough (300 bytes) to widen
        // the position's length prefixes, both of them, when the row is filled in.
        ChangeEvent {
            transaction: Some(v1::Transaction {
                id: "0-1-78".into(),
                index: 0,
                last: true,
            }),
            position: Some(v1::Position {
                kind: Some(v1::position::Kind::Binlog(v1::BinlogPosition {
                    file: "mysql-bin.000042".into(),
                    pos: 4,
                    gtid_set: "0-1-".repeat(75),
                    ..Default::default()
                })),
            }),
            source: None,
            contract: 0,
            ..e.clone()
        },
    ];
    for event in variants {
        let header = EventHeader::new(&event);
        // The open fields, zero (which protobuf leaves out) and not, short and long.
        for (op, version, row, index) in [
            (Op::Insert, 0, 0, 0),
            (Op::Delete, 1 << 40, 7, 5),
            (Op::Update, 9, 300, 1 << 33),
        ] {
            let mut want = event.clone();
            want.op = op as i32;
            want.version = version;
            if let Some(v1::Position {
                kind: Some(v1::position::Kind::Binlog(p)),
            }) = want.position.as_mut()
            {
                p.row = row;
            }
            if let Some(t) = want.transaction.as_mut() {
                t.index = index;
            }
            let rows = [&want.key, &want.before, &want.after]
                .map(|r| r.as_ref().map(|r| r.encode_to_vec()));
            let mut buf = vec![9]; // appends
            header.encode(
                op,
                version,
                row,
                index,
                rows[0].as_deref().unwrap(),
                rows[1].as_deref(),
                rows[2].as_deref(),
                &mut buf,
            );
            assert_eq!(buf[0], 9);
            assert_eq!(&buf[1..], want.encode_to_vec().as_slice());
        }
    }
}

#[test]
fn fnv1a_matches_the_published_vectors_and_chains() {
    // The FNV reference's test vectors for 64-bit FNV-1a.
    assert_eq!(fnv1a(FNV_START, b""), 0xcbf2_9ce4_8422_2325);
    assert_eq!(fnv1a(FNV_START, b"a"), 0xaf63_dc4c_8601_ec8c);
    assert_eq!(fnv1a(FNV_START, b"foobar"), 0x8594_4171_f739_67e8);
    assert_eq!(
        fnv1a(fnv1a(FNV_START, b"foo"), b"bar"),
        fnv1a(FNV_START, b"foobar")
    );
}

/// Every field of every message: prost's encoding of the message with only that field set is
/// the generated key followed by the body the wire format defines (`build.rs` writes one line
/// per field from the `.proto`).
#[test]
fn every_fields_key_is_the_one_prost_writes() {
    let mut seen = 0;
    let mut check = |field: &str, prost: &[u8], key: &[u8], body: &[u8]| {
        let mut hand = key.to_vec();
        hand.extend_from_slice(body);
        assert_eq!(prost, &hand[..], "{field}");
        seen += 1;
    };
    include!(concat!(env!("OUT_DIR"), "/sluice.v1.tag_checks.rs"));
    // ChangeEvent alone has 17 fields, Value 19: a lost message would show.
    assert!(seen >= 100, "{seen} fields checked");
}
