use super::*;
use sluice_proto::v1::{Ddl, MongoChange};

fn event(table: &str, op: Op, mongo: bool, ddl: Option<&str>) -> Vec<u8> {
    let (db, t) = table.split_once('.').unwrap();
    ChangeEvent {
        contract: 1,
        op: op as i32,
        database: db.into(),
        table: t.into(),
        ddl: ddl.map(|k| Ddl {
            kind: k.into(),
            ..Default::default()
        }),
        mongo: mongo.then(MongoChange::default),
        ..Default::default()
    }
    .encode_to_vec()
}

fn source(offset: i64, key: &str, payload: Vec<u8>) -> SourceEvent {
    SourceEvent {
        offset,
        key: (!key.is_empty()).then(|| key.as_bytes().to_vec()),
        event: EventInfo::of(&payload),
        payload,
    }
}

fn letter(at: i64, e: &SourceEvent) -> DeadLetter {
    DeadLetter {
        at: (0, at),
        topic: "t".into(),
        partition: 0,
        offset: e.offset,
        reason: "refused".into(),
        kind: Some("value".into()),
        timestamp_ms: None,
        key: e.key.clone(),
        payload: e.payload.clone(),
        event: e.event.clone(),
        replayed: false,
    }
}

/// A MySQL row is written again alone: its version orders it against the newer rows.
#[test]
fn a_mysql_row_is_replayed_alone() {
    let log = vec![
        source(10, "k1", event("db.t", Op::Insert, false, None)),
        source(11, "k1", event("db.t", Op::Update, false, None)),
        source(12, "k2", event("db.t", Op::Insert, false, None)),
    ];
    let d = letter(0, &log[0]);
    let plan = plan_partition(&[&d], 0, &log);
    assert_eq!(plan.replayed, vec![(0, 0)]);
    assert_eq!(plan.reoffers.len(), 1);
    assert_eq!(plan.reoffers[0].offset, 10);
    assert_eq!(plan.reoffers[0].payload, log[0].payload);
    assert!(plan.skipped.is_empty());
}

/// A MongoDB document's history from its first dead letter on is written again, in order,
/// and nothing of another document.
#[test]
fn a_mongo_document_gets_its_history_from_the_dead_letter_on() {
    let log = vec![
        source(5, "a", event("db.c", Op::Insert, true, None)),
        source(6, "b", event("db.c", Op::Insert, true, None)),
        source(7, "b", event("db.c", Op::Update, true, None)),
        source(8, "a", event("db.c", Op::Update, true, None)),
        source(9, "b", event("db.c", Op::Update, true, None)),
    ];
    let d1 = letter(0, &log[1]);
    let d2 = letter(1, &log[2]); // a second dead letter of the same document
    let plan = plan_partition(&[&d2, &d1], 0, &log);
    let offsets: Vec<i64> = plan.reoffers.iter().map(|o| o.offset).collect();
    assert_eq!(offsets, vec![6, 7, 9]);
    assert_eq!(plan.replayed, vec![(0, 0), (0, 1)]);
}

/// A row older than a later TRUNCATE, DROP or RENAME of its table is not written again; a
/// later ALTER or another table's statement changes nothing.
#[test]
fn rows_before_a_statement_that_empties_the_table_are_not_replayed() {
    for (reset, op, kind) in [
        (true, Op::Truncate, Some("truncate")),
        (true, Op::Ddl, Some("drop")),
        (true, Op::Ddl, Some("rename")),
        (true, Op::Ddl, Some("renamed")),
        (false, Op::Ddl, Some("alter")),
    ] {
        let log = vec![
            source(1, "k", event("db.t", Op::Insert, false, None)),
            source(2, "", event("db.t", op, false, kind)),
            source(3, "", event("db.u", Op::Truncate, false, Some("truncate"))),
        ];
        let d = letter(0, &log[0]);
        let plan = plan_partition(&[&d], 0, &log);
        assert_eq!(plan.reoffers.is_empty(), reset, "{kind:?}");
        if reset {
            assert!(
                plan.skipped[0].1.contains("superseded"),
                "{:?}",
                plan.skipped
            );
            assert!(plan.replayed.is_empty());
        }
    }
    // another table's TRUNCATE alone
    let log = vec![
        source(1, "k", event("db.t", Op::Insert, false, None)),
        source(3, "", event("db.u", Op::Truncate, false, Some("truncate"))),
    ];
    let d = letter(0, &log[0]);
    assert_eq!(plan_partition(&[&d], 0, &log).reoffers.len(), 1);
}

/// A MySQL statement dead-lettered because its table was stopped is written again in its place
/// among the rows (a TRUNCATE too: rows before it are superseded by it); not a MongoDB one, nor
/// one dead-lettered for another reason, nor one the topic no longer holds.
#[test]
fn a_stopped_tables_mysql_statements_are_written_again_in_place() {
    let binlog = |mut e: ChangeEvent| {
        e.position = Some(sluice_proto::v1::Position {
            kind: Some(sluice_proto::v1::position::Kind::Binlog(Default::default())),
        });
        e.encode_to_vec()
    };
    let of = |payload: Vec<u8>| ChangeEvent::decode(payload.as_slice()).unwrap();
    let log = vec![
        source(1, "k1", binlog(of(event("db.t", Op::Insert, false, None)))),
        source(
            2,
            "",
            binlog(of(event("db.t", Op::Truncate, false, Some("truncate")))),
        ),
        source(3, "k2", binlog(of(event("db.t", Op::Insert, false, None)))),
        source(
            4,
            "",
            binlog(of(event("db.t", Op::Ddl, false, Some("alter")))),
        ),
        source(5, "k2", binlog(of(event("db.t", Op::Update, false, None)))),
        source(6, "", event("db.c", Op::Ddl, true, Some("drop"))),
        source(
            7,
            "",
            binlog(of(event("db.t", Op::Ddl, false, Some("refused")))),
        ),
    ];
    let stopped = |at: i64, e: &SourceEvent| DeadLetter {
        kind: Some("table_stopped".into()),
        ..letter(at, e)
    };
    let letters: Vec<DeadLetter> = log.iter().zip(0..).map(|(e, i)| stopped(i, e)).collect();
    let all: Vec<&DeadLetter> = letters.iter().collect();
    let plan = plan_partition(&all, 0, &log);
    let offsets: Vec<i64> = plan.reoffers.iter().map(|o| o.offset).collect();
    assert_eq!(offsets, vec![2, 3, 4, 5]);
    let why: Vec<&str> = plan.skipped.iter().map(|(_, w)| w.as_str()).collect();
    assert!(why[0].contains("superseded by a later truncate"), "{why:?}");
    assert!(why[1].contains("source statement (drop)"), "{why:?}");
    assert!(why[2].contains("source statement (refused)"), "{why:?}");
    // Another reason: not written again.
    let refused = letter(9, &log[3]);
    assert!(plan_partition(&[&refused], 0, &log).reoffers.is_empty());
    // Gone from the topic: refused, named.
    let plan = plan_partition(&[&letters[3]], 5, &log[4..]);
    assert!(plan.reoffers.is_empty());
    assert!(
        plan.skipped[0].1.contains("no longer holds offset 4"),
        "{:?}",
        plan.skipped
    );
}

/// Statements, undecodable events and events the topic no longer holds are refused, named.
#[test]
fn what_cannot_be_replayed_is_named() {
    let log = vec![
        source(4, "", event("db.t", Op::Ddl, false, Some("alter"))),
        source(5, "k", b"not an event".to_vec()),
    ];
    let ddl = letter(0, &log[0]);
    let junk = letter(1, &log[1]);
    let gone = letter(2, &source(2, "k", event("db.t", Op::Insert, true, None)));
    let plan = plan_partition(&[&ddl, &junk, &gone], 3, &log);
    assert!(plan.reoffers.is_empty());
    assert!(plan.replayed.is_empty());
    let why: Vec<&str> = plan.skipped.iter().map(|(_, w)| w.as_str()).collect();
    assert!(why[0].contains("no longer holds offset 2"), "{why:?}");
    assert!(why[1].contains("source statement (alter)"), "{why:?}");
    assert!(why[2].contains("not a change event"), "{why:?}");
}

/// What the capture wrote among the replay's writes, of a replayed document and before its
/// last replayed write, is offered again; the replay's own records and later writes are not.
#[test]
fn the_captures_writes_among_the_replays_are_offered_again() {
    let written: HashMap<Vec<u8>, i64> = [(b"a".to_vec(), 20)].into();
    let row = |o, k| source(o, k, event("db.c", Op::Update, true, None));
    let window = vec![
        (row(18, "a"), None),                           // the capture's, before: again
        (row(19, "a"), Some("run1 t/0@3".to_string())), // the replay's own
        (row(20, "b"), None),                           // another document
        (row(21, "a"), None),                           // after the replay's: in order
        (row(17, "a"), Some("run0 t/0@1".to_string())), // an earlier replay's: again
    ];
    let again = left_behind(&written, &window, "run1");
    let offsets: Vec<i64> = again.iter().map(|o| o.offset).collect();
    assert_eq!(offsets, vec![18, 17]);
}

#[test]
fn the_filter_takes_a_reason_label_or_text_and_a_table() {
    let e = source(1, "k", event("db.t", Op::Insert, false, None));
    let mut d = letter(0, &e);
    d.reason = "collection db.t is stopped: duplicate key".into();
    d.kind = Some("table_stopped".into());
    let f = |table: Option<&str>, reason: Option<&str>| Filter {
        table: table.map(String::from),
        reason: reason.map(String::from),
        replayed: false,
        since_ms: None,
    };
    assert!(f(Some("db.t"), None).matches(&d));
    assert!(!f(Some("db.u"), None).matches(&d));
    assert!(f(None, Some("table_stopped")).matches(&d));
    assert!(f(None, Some("duplicate key")).matches(&d));
    assert!(!f(None, Some("value")).matches(&d));
    d.replayed = true;
    assert!(!f(None, None).matches(&d));
    assert!(Filter {
        replayed: true,
        ..f(None, None)
    }
    .matches(&d));
    // A time filter: dead letters at or after it; one without a Kafka time never matches.
    d.replayed = false;
    d.timestamp_ms = Some(5_000);
    let since = |t: i64| Filter {
        since_ms: Some(t),
        ..f(None, None)
    };
    assert!(since(5_000).matches(&d));
    assert!(!since(5_001).matches(&d));
    d.timestamp_ms = None;
    assert!(!since(0).matches(&d));
}
