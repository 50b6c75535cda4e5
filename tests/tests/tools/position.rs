//! `sluice position`: a stopped capture's stored position and a stopped group's offsets, shown
//! and moved.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use mysql_async::prelude::Queryable;
use sluice_tests::capture::group_lag;
use sluice_tests::to_clickhouse::*;
use sluice_tests::w1_insert;

/// `sluice position set`: refused while the capture or the group runs; a stopped capture moved
/// to a binlog coordinate resumes there (the rows before it are skipped, the rows after it
/// arrive); a stopped group moved to its partitions' end skips what was published, moved to
/// their start applies everything again.
#[tokio::test(flavor = "multi_thread")]
async fn sluice_position_moves_a_stopped_capture_and_a_stopped_group() {
    use sluice_tests::capture::{binlog_status, sluice};
    let (db, m_db, mut cap, mut c, group, mut a) = mirrored_w1("sluice_t_position", 10).await;
    let prefix = cap.prefix.clone();
    let connector = cap.connector.clone();
    let ids = |m_db: String| async move {
        let tsv = sluice_tests::capture::clickhouse_tsv(&format!(
            "SELECT id FROM {m_db}.binlog_field_test_1 FINAL WHERE _deleted = 0 ORDER BY id"
        ))
        .await
        .unwrap();
        tsv.lines()
            .map(|l| l.parse::<u64>().unwrap())
            .collect::<Vec<_>>()
    };
    let wait_for = |id: u64, what: &'static str| {
        let m_db = m_db.clone();
        async move {
            let deadline = Instant::now() + Duration::from_secs(60);
            while !ids(m_db.clone()).await.contains(&id) {
                assert!(Instant::now() < deadline, "row {id} never arrived ({what})");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    };
    let set_binlog =
        |at: &str| sluice(&["position", "set", "--connector", &connector, "--binlog", at]);

    // Refused while they run, naming why.
    let (end_file, end_pos) = binlog_status(&mut c).await;
    let end = format!("{end_file}:{end_pos}");
    let (code, out, err) = set_binlog(&end);
    assert_eq!(code, Some(1), "{out}");
    assert!(err.contains("a capture of it is running"), "{err}");
    let (code, out, err) = sluice(&["position", "set", "--group", &group, "--to-end"]);
    assert_eq!(code, Some(1), "{out}");
    assert!(err.contains("member(s) running"), "{err}");

    // The capture stopped: rows 100.. are written, then the position is taken, then rows 200..
    cap.stop_ok();
    let stopped = Instant::now();
    c.query_drop(w1_insert(&db, 100, 10)).await.unwrap();
    let (file, pos) = binlog_status(&mut c).await;
    let between = format!("{file}:{pos}");
    c.query_drop(w1_insert(&db, 200, 10)).await.unwrap();
    // Its last checkpoint must be 30 s old before the move is taken.
    let moved = loop {
        let (code, out, err) = set_binlog(&between);
        if code == Some(0) {
            break out;
        }
        assert!(err.contains("a capture of it is running"), "{err}");
        assert!(
            stopped.elapsed() < Duration::from_secs(60),
            "still refused a minute after the stop: {err}"
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
    };
    assert!(moved.contains(&format!("to {between}")), "{moved}");
    let (code, shown, err) = sluice(&["position", "show", "--connector", &connector]);
    assert_eq!(code, Some(0), "{err}");
    let shown: serde_json::Value = serde_json::from_str(&shown).unwrap();
    assert_eq!(shown["next"]["file"], file.as_str(), "{shown:#}");
    assert_eq!(shown["next"]["pos"], pos, "{shown:#}");
    cap.restart();
    for id in 200..210 {
        wait_for(id, "written after the moved position").await;
    }
    let got = ids(m_db.clone()).await;
    assert!(
        !got.iter().any(|id| (100..110).contains(id)),
        "rows written before the moved position arrived: {got:?}"
    );
    assert_eq!(
        got.iter().filter(|id| (200..210).contains(*id)).count(),
        10,
        "{got:?}"
    );

    // The group stopped: rows 300.. are published, the group is moved to the end, they are
    // skipped and row 400 after them arrives.
    a.stop_ok();
    let topic = cap.topic(&db, "binlog_field_test_1");
    let behind = || {
        let (g, t) = (group.clone(), topic.clone());
        async move {
            tokio::task::spawn_blocking(move || group_lag(&g, &t))
                .await
                .unwrap()
        }
    };
    let before_300 = sluice_tests::capture::binlog_status(&mut c).await;
    c.query_drop(w1_insert(&db, 300, 10)).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while behind().await < 10 {
        assert!(Instant::now() < deadline, "rows 300.. never published");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let (code, out, err) = sluice(&["position", "set", "--group", &group, "--to-end"]);
    assert_eq!(code, Some(0), "{err}");
    assert!(out.contains("3 partition(s) committed"), "{out}");
    assert_eq!(behind().await, 0, "{out}");
    let mut a = apply(&prefix, &m_db, "mirror", &group, "");
    c.query_drop(w1_insert(&db, 400, 1)).await.unwrap();
    wait_for(400, "after the group's move to the end").await;
    let got = ids(m_db.clone()).await;
    assert!(
        !got.iter().any(|id| (300..310).contains(id)),
        "rows published before the move to the end were applied: {got:?}"
    );

    // Moved to the start, it applies everything again: rows 300.. too.
    a.stop_ok();
    let (code, out, err) = sluice(&["position", "set", "--group", &group, "--to-start"]);
    assert_eq!(code, Some(0), "{err}");
    assert!(out.contains(" -> 0"), "{out}");
    let (code, shown, err) = sluice(&["position", "show", "--group", &group]);
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(
        shown.lines().filter(|l| l.ends_with("=0")).count(),
        3,
        "{shown}"
    );
    let mut a = apply(&prefix, &m_db, "mirror", &group, "");
    let want: Vec<u64> = (1..=10)
        .chain(200..210)
        .chain(300..310)
        .chain([400])
        .collect();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let got = ids(m_db.clone()).await;
        if got == want {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "after the move to the start, the mirror holds {got:?}, not everything the topic \
             holds: {want:?}"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }

    // Moved to a source position (the binlog's before rows 300..): each partition to its first
    // event of that position or later, as the events' versions say.
    a.stop_ok();
    let at = format!("{}:{}", before_300.0, before_300.1);
    let (code, out, err) = sluice(&["position", "set", "--group", &group, "--to-position", &at]);
    assert_eq!(code, Some(0), "{out}{err}");
    let from = sluice_proto::mysql_version(&before_300.0, before_300.1, 0).unwrap();
    let (code, events, err) = sluice(&["events", "--topic", &topic, "--json"]);
    assert_eq!(code, Some(0), "{err}");
    let mut want: BTreeMap<i64, i64> = BTreeMap::new();
    let mut ends: BTreeMap<i64, i64> = BTreeMap::new();
    for l in events.lines() {
        let e: serde_json::Value = serde_json::from_str(l).unwrap();
        let (p, o) = (
            e["partition"].as_i64().unwrap(),
            e["offset"].as_i64().unwrap(),
        );
        let end = ends.entry(p).or_insert(0);
        *end = (*end).max(o + 1);
        if e["version"].as_u64().unwrap() >= from {
            let w = want.entry(p).or_insert(o);
            *w = (*w).min(o);
        }
    }
    let (code, shown, err) = sluice(&["position", "show", "--group", &group]);
    assert_eq!(code, Some(0), "{err}");
    for p in 0..3i64 {
        let committed: i64 = shown
            .lines()
            .find_map(|l| l.strip_prefix(&format!("{topic}:{p}=")))
            .unwrap_or_else(|| panic!("partition {p} in {shown}"))
            .parse()
            .unwrap();
        let first = want.get(&p).copied();
        // No event of the position on the partition: its end (past its last record, maybe a
        // transaction marker).
        match first {
            Some(o) => assert_eq!(committed, o, "partition {p}: {shown}\n{events}"),
            None => assert!(committed >= ends[&p], "partition {p}: {shown}\n{events}"),
        }
    }
    assert!(
        !want.is_empty(),
        "rows 300.. are after the position: {events}"
    );
    let mut a = apply(&prefix, &m_db, "mirror", &group, "");
    finish(&db, &mut [&mut cap, &mut a]).await;
}
