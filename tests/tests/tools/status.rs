//! `sluice status`: where a capture connector stands and how far an apply group is behind, on a
//! running MySQL -> ClickHouse pipeline.

use std::time::{Duration, Instant};

use mysql_async::prelude::Queryable;
use sluice_tests::capture::{group_lag, metric_at};
use sluice_tests::to_clickhouse::*;
use sluice_tests::w1_insert;

/// `sluice status` against a running pipeline: the connector's stored position is the one the
/// capture's metrics show once it is idle; a stopped group's lag is the events published since
/// (as the brokers count them), with how long the first has waited; a running group lists its
/// member with every partition, and catches up to no lag.
#[tokio::test(flavor = "multi_thread")]
async fn sluice_status_shows_the_captures_position_and_the_groups_lag() {
    use sluice_tests::capture::sluice;
    let (db, m_db, mut cap, mut c, group, mut a) = mirrored_w1("sluice_t_status", 10).await;
    let prefix = cap.prefix.clone();
    let topic = cap.topic(&db, "binlog_field_test_1");
    let connector = cap.connector.clone();
    let status = |extra: &[&str]| {
        let mut args = vec![
            "status",
            "--json",
            "--connector",
            &connector,
            "--group",
            &group,
        ];
        args.extend_from_slice(extra);
        let (code, out, err) = sluice(&args);
        assert_eq!(code, Some(0), "{out}{err}");
        serde_json::from_str::<serde_json::Value>(&out).unwrap_or_else(|e| panic!("{e}: {out}"))
    };
    let group_of = |s: &serde_json::Value| s["groups"][0].clone();

    // The stored position equals the metrics' (file number, offset) once nothing moves.
    let port = cap.metrics_port;
    let metrics = move || {
        (
            metric_at(port, "sluice_capture_binlog_file_number").unwrap_or(-1.0) as u64,
            metric_at(port, "sluice_capture_binlog_offset_bytes").unwrap_or(-1.0) as u64,
        )
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let before = metrics();
        let s = status(&[]);
        let after = metrics();
        let conn = &s["connectors"][0];
        assert_eq!(conn["name"], cap.connector.as_str(), "{s:#}");
        assert_eq!(conn["source"], "mysql", "{s:#}");
        let position = conn["position"].as_str().unwrap().to_string();
        let (file, pos) = position.rsplit_once(':').unwrap();
        let stored = (
            sluice_proto::binlog_file_seq(file).unwrap() as u64,
            pos.parse::<u64>().unwrap(),
        );
        assert!(
            stored <= after,
            "the stored position {position} is past the capture's {after:?}"
        );
        if before == after && stored == after {
            assert!(conn["age_seconds"].as_u64().unwrap() < 30, "{s:#}");
            assert_eq!(conn["snapshots_done"], serde_json::json!([]), "{s:#}");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the stored position {position} never reached the capture's {after:?}"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }

    // Running and caught up: one member holding the topic's 3 partitions, nothing behind.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let g = group_of(&status(&[]));
        let members = g["members"].as_array().cloned().unwrap_or_default();
        let held = members
            .first()
            .and_then(|m| m["partitions"][&topic].as_array().cloned())
            .unwrap_or_default();
        if g["state"] == "Stable"
            && members.len() == 1
            && held.len() == 3
            && g["lag_messages"] == 0
            && g["partitions"].as_array().map(Vec::len) == Some(3)
        {
            break;
        }
        assert!(Instant::now() < deadline, "{g:#}");
        tokio::time::sleep(Duration::from_millis(300)).await;
    }

    // Stopped: the group is empty, and 50 rows written since are 50 events behind.
    a.stop_ok();
    let written = Instant::now();
    c.query_drop(w1_insert(&db, 100, 50)).await.unwrap();
    let (g2, t2) = (group.clone(), topic.clone());
    let deadline = Instant::now() + Duration::from_secs(30);
    while tokio::task::spawn_blocking({
        let (g2, t2) = (g2.clone(), t2.clone());
        move || group_lag(&g2, &t2)
    })
    .await
    .unwrap()
        < 50
    {
        assert!(
            Instant::now() < deadline,
            "the 50 rows were never published"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let s = status(&[]);
    let g = group_of(&s);
    assert_eq!(g["name"], group.as_str(), "{s:#}");
    assert_eq!(g["state"], "Empty", "{g:#}");
    assert_eq!(g["members"], serde_json::json!([]), "{g:#}");
    assert_eq!(g["lag_messages"], 50, "{g:#}");
    let by_partition: i64 = g["partitions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            let (end, committed) = (p["end"].as_i64().unwrap(), p["committed"].as_i64().unwrap());
            assert_eq!(
                p["lag_messages"].as_i64().unwrap(),
                end - committed,
                "{p:#}"
            );
            end - committed
        })
        .sum();
    assert_eq!(by_partition, 50, "{g:#}");
    let waited = g["lag_seconds"]
        .as_f64()
        .expect("the first waiting event's age");
    assert!(
        waited <= written.elapsed().as_secs_f64() + 2.0,
        "the first event waiting is {waited} s old, written {:?} ago",
        written.elapsed()
    );
    // The same in text.
    let (code, out, err) = sluice(&["status", "--group", &group, "--connector", &cap.connector]);
    assert_eq!(code, Some(0), "{err}");
    assert!(
        out.contains(&format!(
            "{group}: Empty, 0 members, 50 events behind, the oldest waiting"
        )),
        "{out}"
    );
    assert!(
        out.contains(&format!("  {} (mysql): at ", cap.connector)),
        "{out}"
    );
    // A connector that never ran is named.
    let (code, _, err) = sluice(&["status", "--connector", "no-such-connector"]);
    assert_eq!(code, Some(1));
    assert!(
        err.contains("connector \"no-such-connector\": no checkpoint"),
        "{err}"
    );

    // `sluice events`: merged, the topic reads in the source's order, its CREATE once.
    let (code, out, err) = sluice(&["events", "--topic", &topic, "--merge", "--json"]);
    assert_eq!(code, Some(0), "{err}");
    let lines: Vec<serde_json::Value> = out
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    let statements = lines
        .iter()
        .filter(|l| l.get("statement").is_some())
        .count();
    assert_eq!(
        statements, 1,
        "the CREATE is written to 3 partitions, shown once:\n{out}"
    );
    let ids: Vec<i64> = lines
        .iter()
        .filter_map(|l| l["after"]["id"].as_i64())
        .collect();
    let want: Vec<i64> = (1..=10).chain(100..150).collect();
    assert_eq!(ids, want, "in the source's order");
    for w in lines.windows(2) {
        assert!(
            w[0]["version"].as_u64() <= w[1]["version"].as_u64(),
            "{w:?}"
        );
    }
    for l in &lines {
        assert!(
            l["partition"].is_i64() && l["offset"].is_i64() && l["timestamp_ms"].is_i64(),
            "{l}"
        );
    }
    // Unmerged text: where each record is, and when.
    let (code, out, err) = sluice(&["events", "--topic", &topic, "--count", "3"]);
    assert_eq!(code, Some(0), "{err}");
    let first = out.lines().next().unwrap_or_default().to_string();
    let (at, rest) = first.split_once(' ').unwrap_or_default();
    let (p, o) = at.split_once('@').unwrap_or_default();
    assert!(
        p.parse::<i32>().is_ok() && o.parse::<i64>().is_ok() && rest.trim_start().starts_with("20"),
        "{out}"
    );
    assert_eq!(out.lines().count(), 3, "{out}");
    // Fewer records than --count asked for within --wait: exit 1, saying how many came; merged,
    // --count counts lines (the CREATE once), and enough of them end the wait.
    let (code, out, err) = sluice(&[
        "events", "--topic", &topic, "--count", "1000", "--wait", "1",
    ]);
    assert_eq!(code, Some(1), "{out}");
    assert!(
        err.contains(&format!(
            "63 of the 1000 records asked for (--count) on {topic} arrived within --wait 1 s"
        )),
        "{err}"
    );
    let started = std::time::Instant::now();
    let (code, out, err) = sluice(&[
        "events", "--topic", &topic, "--merge", "--count", "61", "--wait", "60",
    ]);
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(out.lines().count(), 61, "{out}");
    println!("merged --count 61 --wait 60 took {:?}", started.elapsed());
    // The schema and checkpoint topics decoded.
    let (code, out, err) = sluice(&["events", "--topic", "_sluice_schemas"]);
    assert_eq!(code, Some(0), "{err}");
    assert!(
        out.contains(&format!("SCHEMA   {db}.binlog_field_test_1 id "))
            && out.contains("id bigint"),
        "no schema of the table:\n{}",
        out.lines().rev().take(5).collect::<Vec<_>>().join("\n")
    );
    let (code, out, err) = sluice(&["events", "--topic", "_sluice_checkpoints", "--json"]);
    assert_eq!(code, Some(0), "{err}");
    assert!(
        out.lines().any(|l| {
            serde_json::from_str::<serde_json::Value>(l).is_ok_and(|v| {
                v["key"] == cap.connector.as_str() && v["checkpoint"]["next"]["pos"].is_u64()
            })
        }),
        "no checkpoint of {}",
        cap.connector
    );

    // With the capture's config: the source's position now, and the binlog bytes the stopped
    // capture's stored position is behind it (at least the rows written since).
    cap.stop_ok();
    let stored = status(&[])["connectors"][0]["position"]
        .as_str()
        .unwrap()
        .to_string();
    c.query_drop(w1_insert(&db, 200, 20)).await.unwrap();
    let (file, pos) = sluice_tests::capture::binlog_status(&mut c).await;
    let config = cap.config_path().to_str().unwrap().to_string();
    let s = status(&["--capture-config", &config]);
    let now = &s["connectors"][0]["source_now"];
    // At or past where the test read it (other tests write meanwhile; the binlog may rotate).
    let (at_file, at_pos) = now["position"].as_str().unwrap().rsplit_once(':').unwrap();
    let seq = |f: &str| sluice_proto::binlog_file_seq(f).unwrap();
    assert!(
        (seq(at_file), at_pos.parse::<u64>().unwrap()) >= (seq(&file), pos),
        "{s:#}"
    );
    let behind = now["behind_bytes"].as_u64().unwrap();
    let (stored_file, stored_pos) = stored.rsplit_once(':').unwrap();
    if stored_file == file {
        assert!(behind >= pos - stored_pos.parse::<u64>().unwrap(), "{s:#}");
    }
    assert!(
        behind > 20 * 100,
        "20 W1 rows are more than {behind} bytes: {s:#}"
    );
    let (code, out, err) = sluice(&[
        "status",
        "--connector",
        &cap.connector,
        "--capture-config",
        &config,
    ]);
    assert_eq!(code, Some(0), "{err}");
    assert!(
        out.contains("; the source at ") && out.contains(" bytes behind"),
        "{out}"
    );
    cap.restart();

    // Started again, the group catches up to nothing behind.
    let mut a = apply(&prefix, &m_db, "mirror", &group, "");
    converge(&db, &m_db, Duration::from_secs(60)).await;
    let deadline = Instant::now() + Duration::from_secs(30);
    while group_of(&status(&[]))["lag_messages"] != 0 {
        assert!(Instant::now() < deadline, "{:#}", group_of(&status(&[])));
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    finish(&db, &mut [&mut cap, &mut a]).await;
}
