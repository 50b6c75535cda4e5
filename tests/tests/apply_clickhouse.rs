//! MariaDB -> capture-mysql -> Kafka -> apply-clickhouse -> ClickHouse, end to end, with the
//! real servers and the real binaries.

use std::time::{Duration, Instant};

use mysql_async::prelude::Queryable;
use serde::Deserialize;
use sluice_tests::capture::{
    binlog_end, dead_letters, group_lag, kill_in_first_second, metric_at,
    wait_initial_snapshot_stored, wait_snapshot_done, wait_stored_snapshot_rows, CaptureProcess,
};
use sluice_tests::w1_insert;
use sluice_tests::{clickhouse_url, kafka_brokers, unique};

use sluice_tests::to_clickhouse::*;

#[tokio::test(flavor = "multi_thread")]
async fn mirror_equals_source_and_changelog_holds_every_change() {
    let db = unique("sluice_t_apply");
    let (m_db, c_db) = (format!("{db}_mirror"), format!("{db}_log"));
    ch_exec(format!("CREATE DATABASE {m_db}")).await;
    ch_exec(format!("CREATE DATABASE {c_db}")).await;
    let mut cap = CaptureProcess::spawn(CaptureProcess::config(&db, &binlog_end().await, ""));
    let prefix = cap.prefix.clone();
    let mut mirror = apply(&prefix, &m_db, "mirror", &unique("g"), "");
    let mut log = apply(&prefix, &c_db, "changelog", &unique("g"), "");
    w1_source(&db).await;
    let changes = mixed_load(&db).await;

    converge(&db, &m_db, Duration::from_secs(90)).await;
    // From ClickHouse 23.2 the mirror is ReplacingMergeTree(_version, _deleted): FINAL alone
    // shows the source's rows, deleted ones hidden; and the tables keep a deduplication window
    // for the INSERTs' tokens (22.2+).
    let version: String = ch().query("SELECT version()").fetch_one().await.unwrap();
    let mut parts = version.split('.').map(|p| p.parse::<u32>().unwrap_or(0));
    let (major, minor) = (parts.next().unwrap_or(0), parts.next().unwrap_or(0));
    let create: String = ch()
        .query(&format!("SHOW CREATE TABLE {m_db}.binlog_field_test_1"))
        .fetch_one()
        .await
        .unwrap();
    assert_eq!(
        create.contains("ReplacingMergeTree(_version, _deleted)"),
        (major, minor) >= (23, 2),
        "{version}: {create}"
    );
    assert_eq!(
        create.contains("non_replicated_deduplication_window = 1000"),
        (major, minor) >= (22, 2),
        "{version}: {create}"
    );
    if (major, minor) >= (23, 2) {
        let all: u64 = ch()
            .query(&format!(
                "SELECT count() FROM {m_db}.binlog_field_test_1 FINAL"
            ))
            .fetch_one()
            .await
            .unwrap();
        assert_eq!(
            all as usize,
            source_rows(&db).await.len(),
            "deleted rows hidden by FINAL"
        );
    }

    // The change log: every change once, whatever was replayed.
    let deadline = Instant::now() + Duration::from_secs(60);
    let counted = loop {
        let n: u64 = ch()
            .query(&format!(
                "SELECT count() FROM {c_db}.binlog_field_test_1 FINAL"
            ))
            .fetch_one()
            .await
            .unwrap_or(0);
        if n as usize >= changes || Instant::now() > deadline {
            break n;
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    };
    assert_eq!(counted as usize, changes);
    #[derive(Deserialize, clickhouse::Row, Debug, PartialEq)]
    struct OpCount {
        op: String,
        n: u64,
    }
    let ops = ch()
        .query(&format!(
            "SELECT _op, count() FROM {c_db}.binlog_field_test_1 FINAL GROUP BY _op ORDER BY _op"
        ))
        .fetch_all::<OpCount>()
        .await
        .unwrap();
    let ops: Vec<(String, u64)> = ops.into_iter().map(|o| (o.op, o.n)).collect();
    assert_eq!(
        ops,
        vec![
            ("delete".to_string(), 35),
            ("insert".to_string(), 305),
            ("update".to_string(), 60)
        ]
    );
    finish(&db, &mut [&mut cap, &mut mirror, &mut log]).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn kill_9_of_apply_mid_batches_loses_nothing() {
    let (db, m_db, mut cap) = pipeline("sluice_t_apply_kill", "_mirror").await;
    let prefix = cap.prefix.clone();
    // A backlog first, so that apply commits offsets in the middle of the partitions.
    let mut c = w1_source(&db).await;
    for b in 0..40u64 {
        c.query_drop(w1_insert(&db, 1 + b * 50, 50)).await.unwrap();
    }
    let topic = cap.topic(&db, "binlog_field_test_1");
    let backlog = tokio::task::spawn_blocking(move || {
        sluice_tests::capture::read_events(&topic, Duration::from_secs(60), |m| {
            sluice_tests::capture::count_rows(m) >= 2000
        })
    })
    .await
    .unwrap();
    assert_eq!(sluice_tests::capture::count_rows(&backlog), 2000);
    // Small batches, slowly: the kill falls between committed batches.
    let group = unique("g");
    let extra = "[batch]\nmax_rows = 20\nmax_wait_ms = 50\n\
                 [kafka.properties]\n\"auto.commit.interval.ms\" = \"100\"\n\
                 \"session.timeout.ms\" = \"6000\"\n\"heartbeat.interval.ms\" = \"1000\"\n";
    let mut mirror = apply(&prefix, &m_db, "mirror", &group, extra);
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let n = rows_written(mirror.metrics_port);
        if n >= 600 {
            break;
        }
        assert!(Instant::now() < deadline, "apply wrote only {n} rows");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Past at least one offset commit (every 100 ms here).
    tokio::time::sleep(Duration::from_millis(250)).await;
    assert!(
        rows_written(mirror.metrics_port) < 2000,
        "apply drained the backlog before it could be killed mid-way"
    );
    mirror.kill();
    c.query_drop(format!(
        "UPDATE `{db}`.binlog_field_test_1 SET testint = 7 WHERE id % 3 = 0"
    ))
    .await
    .unwrap();
    mirror.restart();
    converge(&db, &m_db, Duration::from_secs(90)).await;
    finish(&db, &mut [&mut cap, &mut mirror]).await;
}

fn rows_written(port: u16) -> u64 {
    metric_at(port, "sluice_apply_rows_total").unwrap_or(0.0) as u64
}

/// The instance holds partitions.
fn assigned(port: u16) -> bool {
    metric_at(port, "sluice_apply_assigned_partitions").is_some_and(|n| n > 0.0)
}

#[tokio::test(flavor = "multi_thread")]
async fn two_instances_share_the_partitions() {
    let (db, m_db, mut cap) = pipeline("sluice_t_apply_two", "_mirror").await;
    let prefix = cap.prefix.clone();
    // The topic first (the capture creates it with the first row), then the two members.
    let mut c = w1_source(&db).await;
    c.query_drop(w1_insert(&db, 1, 1)).await.unwrap();
    let group = unique("g");
    // One with a stable name in the group (static membership).
    let instance = unique("inst");
    let mut a = apply_to_with(
        &clickhouse_url(),
        &prefix,
        &m_db,
        "mirror",
        &group,
        "",
        &format!("instance_id = \"{instance}\""),
    );
    let mut b = apply(&prefix, &m_db, "mirror", &group, "");
    // Wait until both hold partitions.
    let deadline = Instant::now() + Duration::from_secs(60);
    while !(assigned(a.metrics_port) && assigned(b.metrics_port)) {
        if Instant::now() > deadline {
            let (_, la) = a.stop();
            let (_, lb) = b.stop();
            panic!("the group never gave both members partitions:\n{la}\n---\n{lb}");
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    for i in 0..6u64 {
        c.query_drop(w1_insert(&db, 2 + i * 100, 100))
            .await
            .unwrap();
    }
    let want = source_rows(&db).await;
    let deadline = Instant::now() + Duration::from_secs(60);
    while mirror_rows(&m_db).await != want {
        if Instant::now() > deadline {
            let (_, la) = a.stop();
            let (_, lb) = b.stop();
            #[derive(Deserialize, clickhouse::Row, Debug)]
            #[allow(dead_code)]
            struct Raw {
                id: u64,
                v: u64,
                d: u8,
            }
            let raw = ch()
                .query(&format!(
                    "SELECT id, _version, _deleted FROM {m_db}.binlog_field_test_1 WHERE id < 6"
                ))
                .fetch_all::<Raw>()
                .await
                .unwrap();
            let topic = cap.topic(&db, "binlog_field_test_1");
            let events = tokio::task::spawn_blocking(move || {
                sluice_tests::capture::read_events(&topic, Duration::from_secs(20), |m| {
                    sluice_tests::capture::count_rows(m) >= 601
                })
            })
            .await
            .unwrap();
            let mut summary: Vec<String> = Vec::new();
            for (p, evs) in &events {
                for (o, e) in evs.iter().enumerate() {
                    let id = e
                        .key
                        .as_ref()
                        .and_then(|k| k.values.first())
                        .map(|v| format!("{:?}", v.kind));
                    if o < 6 {
                        summary.push(format!("p{p}@{o}={id:?}/{:?}", e.op()));
                    }
                }
            }
            panic!("mirror never converged: raw {raw:?}; topic {summary:?}\n{la}\n---\n{lb}");
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let (ra, rb) = (rows_written(a.metrics_port), rows_written(b.metrics_port));
    assert!(ra > 0 && rb > 0, "both instances write: {ra} + {rb}");
    // The broker names a static member after its group.instance.id.
    let g = group.clone();
    let members = tokio::task::spawn_blocking(move || {
        use rdkafka::consumer::Consumer;
        let c: rdkafka::consumer::BaseConsumer = rdkafka::ClientConfig::new()
            .set("bootstrap.servers", kafka_brokers())
            .create()
            .unwrap();
        let list = c
            .fetch_group_list(Some(&g), Duration::from_secs(10))
            .unwrap();
        list.groups()
            .iter()
            .flat_map(|g| g.members().iter().map(|m| m.id().to_string()))
            .collect::<Vec<_>>()
    })
    .await
    .unwrap();
    assert_eq!(members.len(), 2, "{members:?}");
    assert!(
        members
            .iter()
            .any(|m| m.starts_with(&format!("{instance}-"))),
        "{members:?}"
    );
    // Every row counted (a server shows the rows of an INSERT before its answer reaches the
    // applier, which counts them then: the counters may trail the mirror for a moment).
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (ra, rb) = (rows_written(a.metrics_port), rows_written(b.metrics_port));
        if ra + rb >= 601 {
            break;
        }
        assert!(Instant::now() < deadline, "{ra} + {rb} rows counted");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    finish(&db, &mut [&mut cap, &mut a, &mut b]).await;
}

/// Two members with one `consumer.instance_id` (a copied configuration): the broker fences the
/// older one (KIP-345), a fatal error that leaves its librdkafka consumer dead. The fenced
/// member says so and a new consumer of it joins again (fencing the other in turn); once the
/// duplicate is gone, the first holds the partitions and nothing is lost. A member that stayed
/// dead would leave the partitions to nobody once the duplicate stops.
#[tokio::test(flavor = "multi_thread")]
async fn a_member_fenced_by_its_instance_id_joins_again_and_loses_nothing() {
    let (db, m_db, mut cap) = pipeline("sluice_t_apply_fenced", "_mirror").await;
    let prefix = cap.prefix.clone();
    let mut c = w1_source(&db).await;
    c.query_drop(w1_insert(&db, 1, 100)).await.unwrap();
    let group = unique("g");
    let consumer = format!("instance_id = \"{}\"", unique("inst"));
    let member = || {
        apply_to_with(
            &clickhouse_url(),
            &prefix,
            &m_db,
            "mirror",
            &group,
            "",
            &consumer,
        )
    };
    let mut a = member();
    converge(&db, &m_db, Duration::from_secs(60)).await;
    let mut b = member();
    let rejoins = |port| metric_at(port, "sluice_apply_consumer_rejoins_total").unwrap_or(0.0);
    let deadline = Instant::now() + Duration::from_secs(60);
    while rejoins(a.metrics_port) < 1.0 {
        if Instant::now() > deadline {
            let (_, la) = a.stop();
            let (_, lb) = b.stop();
            panic!("the first member never joined again:\n{la}\n---\n{lb}");
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    c.query_drop(w1_insert(&db, 101, 100)).await.unwrap();
    b.stop_ok();
    c.query_drop(w1_insert(&db, 201, 100)).await.unwrap();
    c.query_drop(format!(
        "UPDATE `{db}`.binlog_field_test_1 SET testint = -id WHERE id % 7 = 0"
    ))
    .await
    .unwrap();
    converge(&db, &m_db, Duration::from_secs(90)).await;
    // And its offsets are committed again (a fenced consumer left alive would write on, as a
    // zombie, but never commit).
    let topic = cap.topic(&db, "binlog_field_test_1");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (g, t) = (group.clone(), topic.clone());
        let lag = tokio::task::spawn_blocking(move || group_lag(&g, &t))
            .await
            .unwrap();
        if lag == 0 {
            break;
        }
        if Instant::now() > deadline {
            let (_, la) = a.stop();
            panic!("{lag} events written but never committed:\n{la}");
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert!(!a.exited(), "the fenced member exited");
    let log_a = a.stop_ok();
    assert!(
        log_a.contains("fenced by another member with the same consumer.instance_id")
            && log_a.contains("a new Kafka consumer joined the group"),
        "{log_a}"
    );
    finish(&db, &mut [&mut cap]).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_poison_event_is_dead_lettered_and_the_rest_flows() {
    use rdkafka::producer::{FutureProducer, FutureRecord};

    let (db, m_db, mut cap) = pipeline("sluice_t_apply_poison", "_mirror").await;
    let prefix = cap.prefix.clone();
    let dlq = unique("dlq");
    let group = unique("g");
    let mut mirror = apply(
        &prefix,
        &m_db,
        "mirror",
        &group,
        &format!("[errors]\ndead_letter_topic = \"{dlq}\"\n"),
    );
    let mut c = w1_source(&db).await;
    c.query_drop(w1_insert(&db, 1, 10)).await.unwrap();
    converge(&db, &m_db, Duration::from_secs(60)).await;
    // Garbage on every partition of the table's topic, then more rows.
    let topic = cap.topic(&db, "binlog_field_test_1");
    let producer: FutureProducer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", kafka_brokers())
        .create()
        .unwrap();
    for p in 0..3 {
        producer
            .send(
                FutureRecord::to(&topic)
                    .partition(p)
                    .key("poison")
                    .payload(&[0xffu8, 0xff, 0xff, 0x01][..]),
                Duration::from_secs(10),
            )
            .await
            .map_err(|(e, _)| e)
            .unwrap();
    }
    c.query_drop(w1_insert(&db, 11, 10)).await.unwrap();
    converge(&db, &m_db, Duration::from_secs(60)).await;
    // The dead letters carry the original bytes and the reason.
    let d = dlq.clone();
    let letters = tokio::task::spawn_blocking(move || dead_letters(&d, 3))
        .await
        .unwrap();
    assert_eq!(letters.len(), 3, "{letters:?}");
    for (payload, reason) in &letters {
        assert_eq!(payload, &vec![0xffu8, 0xff, 0xff, 0x01]);
        assert!(reason.contains("not a change event"), "{reason}");
    }
    // `sluice status` counts them by table (here the topic: they are no change event) and
    // reason.
    let (code, out, err) =
        sluice_tests::capture::sluice(&["status", "--topic", &dlq, "--group", &group, "--json"]);
    assert_eq!(code, Some(0), "{err}");
    let s: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(
        s["dead_letters"],
        serde_json::json!([{
            "table": topic, "reason": "undecodable", "waiting": 3, "replayed": 0,
            "last_ms": s["dead_letters"][0]["last_ms"]
        }]),
        "{s:#}"
    );
    assert!(s["dead_letters"][0]["last_ms"].is_i64(), "{s:#}");
    let (code, out, err) =
        sluice_tests::capture::sluice(&["status", "--topic", &dlq, "--group", &group]);
    assert_eq!(code, Some(0), "{err}");
    assert!(
        out.contains(&format!("dead letters (topic {dlq}):\n  {topic} [undecodable]: 3 not replayed, 0 replayed, the newest ")),
        "{out}"
    );
    finish(&db, &mut [&mut cap, &mut mirror]).await;
}

/// A ClickHouse server of the test's own with database `<db>_mirror` made (`db` a unique name
/// from `base`), and a client of it; `None` without a `clickhouse-server` binary.
async fn private_mirror(
    base: &str,
) -> Option<(
    sluice_tests::private_clickhouse::PrivateClickHouse,
    clickhouse::Client,
    String,
    String,
)> {
    let server = sluice_tests::private_clickhouse::PrivateClickHouse::start()?;
    let private = clickhouse::Client::default()
        .with_url(server.url())
        .with_validation(false);
    let db = unique(base);
    let m_db = format!("{db}_mirror");
    private
        .query(&format!("CREATE DATABASE {m_db}"))
        .execute()
        .await
        .unwrap();
    Some((server, private, db, m_db))
}

#[tokio::test(flavor = "multi_thread")]
async fn clickhouse_down_then_up_loses_nothing() {
    let Some((mut server, private, db, m_db)) = private_mirror("sluice_t_apply_down").await else {
        eprintln!("no clickhouse-server binary here: this test needs one to stop and start");
        return;
    };
    let mut cap = CaptureProcess::spawn(CaptureProcess::config(&db, &binlog_end().await, ""));
    let prefix = cap.prefix.clone();
    let group = unique("g");
    let extra = "[batch]\nmax_wait_ms = 100\n[errors]\ndegraded_after_ms = 1000\n";
    let mut mirror = apply_to(&server.url(), &prefix, &m_db, "mirror", &group, extra);
    let mut c = w1_source(&db).await;
    c.query_drop(w1_insert(&db, 1, 100)).await.unwrap();
    // A UInt64 over the live rows of a mirror table (0 while the server is away).
    let live = |what: &'static str, table: &'static str| {
        let (client, sql) = (
            private.clone(),
            format!("SELECT {what} FROM {m_db}.{table} FINAL WHERE _deleted = 0"),
        );
        async move { client.query(&sql).fetch_one::<u64>().await.unwrap_or(0) }
    };
    let count = || live("count()", "binlog_field_test_1");
    let deadline = Instant::now() + Duration::from_secs(60);
    while count().await < 100 {
        assert!(Instant::now() < deadline, "first rows never arrived");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // A new source table, whose topic apply takes on (3 more partitions) before the outage.
    c.query_drop(format!(
        "CREATE TABLE `{db}`.added (id INT PRIMARY KEY, v INT NOT NULL)"
    ))
    .await
    .unwrap();
    while metric_at(mirror.metrics_port, "sluice_apply_assigned_partitions") < Some(6.0) {
        assert!(
            Instant::now() < deadline + Duration::from_secs(60),
            "apply never took on the new table's topic"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // The target goes away. The new table gets its first rows, whose target cannot be looked
    // up or created until the server is back (and no batch write is waiting before them); then
    // the first table keeps changing.
    server.pause();
    c.query_drop(format!(
        "INSERT INTO `{db}`.added VALUES (1, 10), (2, 20), (3, 30)"
    ))
    .await
    .unwrap();
    tokio::time::sleep(Duration::from_secs(2)).await;
    c.query_drop(w1_insert(&db, 101, 200)).await.unwrap();
    c.query_drop(format!(
        "DELETE FROM `{db}`.binlog_field_test_1 WHERE id <= 50"
    ))
    .await
    .unwrap();
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(
        mirror.child.try_wait().unwrap().is_none(),
        "apply must wait, not die"
    );
    // Past errors.degraded_after_ms, /healthz says so, with the reason.
    let (status, body) = healthz(mirror.metrics_port);
    assert_eq!(status, 503, "{body}");
    assert!(body.contains("has not taken a write"), "{body}");
    // It names the server it cannot reach.
    assert!(
        body.contains(&format!("ClickHouse {}", server.url())),
        "{body}"
    );
    // The lag is exported while nothing can be written, in messages and in seconds.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let messages = metric_at(mirror.metrics_port, "sluice_apply_consumer_lag_messages");
        let seconds = metric_at(mirror.metrics_port, "sluice_apply_lag_seconds");
        if messages.is_some_and(|m| m > 0.0) && seconds.is_some_and(|s| s > 0.0) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no lag exported during the outage: {messages:?} messages, {seconds:?} s"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    // SIGTERM while what is in hand cannot be written: the stage stops without it, saying
    // so, exit 1 (nothing of it committed: a new instance reads it again).
    let (code, first) = mirror.stop();
    assert_eq!(code, Some(1), "{first}");
    // (an INSERT's batch, or the lookup of a target before it: either is read again)
    assert!(
        first.contains("ClickHouse: stopping") && first.contains("read again on restart"),
        "{first}"
    );
    assert!(
        first.contains("retrying"),
        "the outage was retried: {first}"
    );
    mirror = apply_to(&server.url(), &prefix, &m_db, "mirror", &group, extra);
    server.resume();
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let n = count().await;
        if n == 250 {
            break;
        }
        assert!(Instant::now() < deadline, "caught up to {n} of 250 rows");
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    while live("toUInt64(sum(v))", "added").await != 60 {
        if Instant::now() > deadline {
            let (_, out) = mirror.stop();
            panic!("the table added during the outage never arrived: {out}");
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    assert_eq!(healthz(mirror.metrics_port).0, 200, "healthy again");
    let deadline = Instant::now() + Duration::from_secs(20);
    while metric_at(mirror.metrics_port, "sluice_apply_lag_seconds") != Some(0.0) {
        assert!(Instant::now() < deadline, "the lag never went back to 0");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let out = mirror.stop_ok();
    for log in [&first, &out] {
        assert!(
            !log.contains("dead-lettering"),
            "nothing was dead-lettered: {log}"
        );
    }
    cap.stop_ok();
    c.query_drop(format!("DROP DATABASE `{db}`")).await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn the_reference_w1_changelog_table_is_written_by_column_name() {
    let db = unique("sluice_t_apply_w1ref");
    let c_db = format!("{db}_ref");
    ch_exec(format!("CREATE DATABASE {c_db}")).await;
    // The report's own ClickHouse table, as it is (MergeTree, its own bookkeeping columns).
    let ddl = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../deploy/workloads/w1.clickhouse.sql"
    ))
    .unwrap();
    let ddl: String = ddl
        .lines()
        .filter(|l| !l.trim_start().starts_with("--"))
        .collect::<Vec<_>>()
        .join("\n")
        .replace(
            "CREATE TABLE binlog_field_test_1",
            &format!("CREATE TABLE {c_db}.binlog_field_test_1"),
        )
        .trim_end()
        .trim_end_matches(';')
        .to_string();
    ch_exec(ddl).await;
    let mut cap = CaptureProcess::spawn(CaptureProcess::config(&db, &binlog_end().await, ""));
    let prefix = cap.prefix.clone();
    let mut log = apply(
        &prefix,
        &c_db,
        "changelog",
        &unique("g"),
        "[tables]\ncreate = false\nop_column = \"binlog_event_type\"\n\
         version_column = \"bifrost_data_version\"\n",
    );
    let mut c = w1_source(&db).await;
    c.query_drop(w1_insert(&db, 1, 100)).await.unwrap();
    c.query_drop(format!(
        "UPDATE `{db}`.binlog_field_test_1 SET testvarchar = 'changed' WHERE id <= 10"
    ))
    .await
    .unwrap();
    c.query_drop(format!(
        "DELETE FROM `{db}`.binlog_field_test_1 WHERE id > 95"
    ))
    .await
    .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let n: u64 = ch()
            .query(&format!("SELECT count() FROM {c_db}.binlog_field_test_1"))
            .fetch_one()
            .await
            .unwrap_or(0);
        if n >= 115 {
            assert_eq!(n, 115);
            break;
        }
        if Instant::now() > deadline {
            let (_, out) = log.stop();
            panic!("{n} of 115 changes; apply said: {out}");
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    #[derive(Deserialize, clickhouse::Row, Debug)]
    struct Last {
        v: String,
        t: String,
        d: String,
        e: String,
        ts: String,
        bit: i64,
        version: i64,
    }
    let last = ch()
        .query(&format!(
            "SELECT testvarchar, testtime, testdecimal, binlog_event_type, toString(testtimestamp), \
             testbit, bifrost_data_version FROM {c_db}.binlog_field_test_1 \
             WHERE id = 7 ORDER BY bifrost_data_version DESC LIMIT 1"
        ))
        .fetch_one::<Last>()
        .await
        .unwrap();
    assert_eq!(last.v, "changed");
    assert_eq!(last.t, "11:22:33");
    assert_eq!(last.d, "7.25");
    assert_eq!(last.e, "update");
    assert_eq!(last.ts, "2024-01-02 03:04:05");
    assert_eq!(last.bit, 5);
    assert!(last.version > 0);
    finish(&db, &mut [&mut cap, &mut log]).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_rebalance_writes_the_batch_in_hand_first() {
    let (db, m_db, mut cap) = pipeline("sluice_t_apply_drain", "_mirror").await;
    let prefix = cap.prefix.clone();
    let mut c = w1_source(&db).await;
    c.query_drop(w1_insert(&db, 1, 1)).await.unwrap();
    // A holds its batch for up to 60 s: only a drain writes it sooner.
    let group = unique("g");
    let extra = "[batch]\nmax_wait_ms = 60000\n";
    let mut a = apply(&prefix, &m_db, "mirror", &group, extra);
    let deadline = Instant::now() + Duration::from_secs(60);
    while !assigned(a.metrics_port) {
        assert!(Instant::now() < deadline, "a never got partitions");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Let a settle (the table's DDL events on every partition each write what came before).
    tokio::time::sleep(Duration::from_secs(2)).await;
    let before = rows_written(a.metrics_port);
    c.query_drop(w1_insert(&db, 2, 200)).await.unwrap();
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        rows_written(a.metrics_port),
        before,
        "a wrote its batch before the rebalance"
    );
    // A second member joins: a lets partitions go, writing what it holds first.
    let mut b = apply(&prefix, &m_db, "mirror", &group, extra);
    converge(&db, &m_db, Duration::from_secs(30)).await;
    finish(&db, &mut [&mut cap, &mut b]).await;
    let log = a.stop_ok();
    assert!(log.contains("wrote the batch in hand"), "{log}");
}

/// `batch.max_wait_ms` is spent only while writes would come faster: the first row after a
/// quiet spell is written at once (not `max_wait_ms` later), and rows right after it wait for
/// the next write, `max_wait_ms` after that one began (here 60 s: only the stop writes them).
#[tokio::test(flavor = "multi_thread")]
async fn a_row_after_a_quiet_spell_is_written_at_once_and_the_next_ones_wait() {
    let (db, m_db, mut cap) = pipeline("sluice_t_apply_quiet", "_mirror").await;
    let prefix = cap.prefix.clone();
    let mut c = w1_source(&db).await;
    let extra = "[batch]\nmax_wait_ms = 60000\n";
    let mut a = apply(&prefix, &m_db, "mirror", &unique("g"), extra);
    let deadline = Instant::now() + Duration::from_secs(60);
    while !assigned(a.metrics_port) {
        assert!(Instant::now() < deadline, "a never got partitions");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // The table's DDL events (on every partition) are handled; nothing written yet.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(rows_written(a.metrics_port), 0);
    c.query_drop(w1_insert(&db, 1, 1)).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(15);
    while rows_written(a.metrics_port) < 1 {
        assert!(
            Instant::now() < deadline,
            "the first row after a quiet spell was held back (max_wait_ms is 60 s)"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Right after that write: the next rows wait for the next one.
    c.query_drop(w1_insert(&db, 2, 200)).await.unwrap();
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        rows_written(a.metrics_port),
        1,
        "rows right after a write were written before max_wait_ms"
    );
    // A stop writes what is held.
    a.stop_ok();
    converge(&db, &m_db, Duration::from_secs(30)).await;
    finish(&db, &mut [&mut cap]).await;
}

/// A source table of `rows` W1 rows.
async fn w1_filled(db: &str, rows: u64) {
    let mut c = w1_source(db).await;
    for b in 0..rows.div_ceil(2000) {
        let n = 2000.min(rows - b * 2000);
        c.query_drop(w1_insert(db, 1 + b * 2000, n)).await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn snapshot_then_stream_under_a_concurrent_writer_equals_the_source() {
    let db = unique("sluice_t_snap_w1");
    let ch_db = format!("{db}_mirror");
    ch_exec(format!("CREATE DATABASE {ch_db}")).await;
    let rows = 100_000;
    w1_filled(&db, rows).await;
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    // (Paced so that this debug build's capture keeps up: a chunk is published once the
    // stream has read as far as the chunk's snapshot.)
    let writer = concurrent_writer(&db, rows, Duration::from_millis(1), stop.clone());
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut cap = CaptureProcess::spawn(CaptureProcess::config(
        &db,
        "end",
        "[snapshot]\nmode = \"snapshot+stream\"\nchunk_rows = 5000\n",
    ));
    let prefix = cap.prefix.clone();
    let mut mirror = apply(&prefix, &ch_db, "mirror", &unique("g"), "");
    // The writer goes on through the whole snapshot, and a little after.
    wait_snapshot_done(cap.metrics_port, Duration::from_secs(240)).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let statements = writer.await.unwrap();
    assert!(statements > 20, "the writer ran {statements} statements");
    let published = metric_at(cap.metrics_port, "sluice_capture_snapshot_rows_total").unwrap();
    // How many chunk rows the writer changed while their chunk was read (left to the stream).
    let left = metric_at(
        cap.metrics_port,
        "sluice_capture_snapshot_rows_left_to_stream_total",
    );
    eprintln!("snapshot: {published} rows published, {left:?} left to the stream, {statements} statements");
    assert!(
        published > (rows / 2) as f64 && published <= (rows + statements) as f64,
        "{published} snapshot rows"
    );
    converge(&db, &ch_db, Duration::from_secs(240)).await;
    finish(&db, &mut [&mut cap, &mut mirror]).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_capture_killed_mid_snapshot_resumes_from_the_last_chunk() {
    let db = unique("sluice_t_snap_kill");
    let ch_db = format!("{db}_mirror");
    ch_exec(format!("CREATE DATABASE {ch_db}")).await;
    let rows = 60_000;
    w1_filled(&db, rows).await;
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    // A gentler writer: the rows it adds beyond the snapshot's cursor stay few next to the
    // rows a restart from zero would publish again.
    let writer = concurrent_writer(&db, rows, Duration::from_millis(5), stop.clone());
    let mut cap = CaptureProcess::spawn(CaptureProcess::config(
        &db,
        "end",
        "[snapshot]\nmode = \"snapshot+stream\"\nchunk_rows = 1000\nparallel_tables = 1\n",
    ));
    let prefix = cap.prefix.clone();
    let mut mirror = apply(&prefix, &ch_db, "mirror", &unique("g"), "");
    // Kill once the stored checkpoint says a good part of the table was published.
    let before = wait_stored_snapshot_rows(&cap.connector, 15_000, Duration::from_secs(120), |c| {
        c["snapshot"]["tables"]
            .as_object()
            .map(|t| t.values().filter_map(|p| p["rows"].as_u64()).sum::<u64>())
            .unwrap_or(0)
    })
    .await;
    cap.kill();
    assert!(before < rows - 10_000, "killed too late: {before}");
    cap.restart();
    wait_snapshot_done(cap.metrics_port, Duration::from_secs(240)).await;
    // The second run went on from a chunk, not from zero: it published well under the table.
    let second = metric_at(cap.metrics_port, "sluice_capture_snapshot_rows_total").unwrap();
    if second >= (rows - before / 2) as f64 {
        let (_, log) = cap.stop();
        panic!(
            "the restarted capture published {second} rows after {before} before the kill: {log}"
        );
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    writer.await.unwrap();
    converge(&db, &ch_db, Duration::from_secs(240)).await;
    let log = cap.stop_ok();
    assert!(log.contains("resumed=true"), "{log}");
    finish(&db, &mut [&mut mirror]).await;
}

/// A new capture-mysql (start = "end", `snapshot+stream`) killed (-9) at seeded moments of its
/// first second, again and again, while a writer deletes, updates, inserts and moves
/// keys; then it runs to the end, and the mirror must equal the source, every row compared. A
/// restart must go on from the position the new connector stored before it published anything:
/// one that began again at a later `end` would leave in the mirror the snapshot rows that were
/// deleted in between (their deletes never published).
#[tokio::test(flavor = "multi_thread")]
async fn a_new_capture_killed_in_its_first_second_leaves_nothing_stale() {
    let seed = sluice_tests::seed();
    let mut rng = sluice_tests::Rng(seed);
    let rows = 20_000;
    for round in 0..3 {
        let db = unique("sluice_t_first");
        let ch_db = format!("{db}_mirror");
        ch_exec(format!("CREATE DATABASE {ch_db}")).await;
        w1_filled(&db, rows).await;
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let writer = concurrent_writer(&db, rows, Duration::from_millis(2), stop.clone());
        // Checkpoints at most every second, as by default: a checkpoint queued is not yet
        // stored.
        let (text, connector, prefix) = CaptureProcess::config(
            &db,
            "end",
            "[snapshot]\nmode = \"snapshot+stream\"\nchunk_rows = 500\n",
        );
        let text = text.replace(
            "checkpoint_interval_ms = 100\n",
            "checkpoint_interval_ms = 1000\n",
        );
        let mut cap = CaptureProcess::spawn((text, connector, prefix));
        let mut mirror = apply(
            &cap.prefix,
            &ch_db,
            "mirror",
            &unique("g"),
            "[log]\nprogress_interval_s = 1\n",
        );
        let kills = kill_in_first_second(&mut cap, &mut rng).await;
        eprintln!("round {round}: capture killed {kills:?}");
        wait_initial_snapshot_stored(&cap, Duration::from_secs(120)).await;
        tokio::time::sleep(Duration::from_millis(300)).await;
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let statements = writer.await.unwrap();
        assert!(statements > 10, "the writer ran {statements} statements");
        converge(&db, &ch_db, Duration::from_secs(120)).await;
        // The applier said how it went, once a second here.
        let log = mirror.stop_ok();
        assert!(
            log.contains("progress: rows=") && log.contains("partitions=3"),
            "{log}"
        );
        finish(&db, &mut [&mut cap]).await;
    }
}

/// An applier started before the capture created any topic (the normal start of a new
/// pipeline) says so at INFO, with no ERROR nor WARN, and stops cleanly.
#[tokio::test(flavor = "multi_thread")]
async fn an_applier_started_before_any_topic_exists_waits_without_an_error() {
    let prefix = unique("cdc_none");
    let ch_db = unique("sluice_t_none");
    ch_exec(format!("CREATE DATABASE {ch_db}")).await;
    let mut a = apply(&prefix, &ch_db, "mirror", &unique("g"), "");
    let deadline = Instant::now() + Duration::from_secs(30);
    while !assigned(a.metrics_port) && Instant::now() < deadline {
        // (nothing to assign: wait long enough for the first metadata answer)
        if metric_at(a.metrics_port, "sluice_apply_assigned_partitions").is_some() {
            tokio::time::sleep(Duration::from_secs(3)).await;
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let log = a.stop_ok();
    assert!(
        log.contains("no topic of the subscription exists yet"),
        "{log}"
    );
    assert!(!log.contains(" ERROR ") && !log.contains(" WARN "), "{log}");
    ch_exec(format!("DROP DATABASE {ch_db}")).await;
}

/// `GET /healthz`: the status code and the body.
fn healthz(port: u16) -> (u16, String) {
    let out = std::process::Command::new("curl")
        .args([
            "-s",
            "-w",
            "\n%{http_code}",
            &format!("http://127.0.0.1:{port}/healthz"),
        ])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, code) = text.rsplit_once('\n').unwrap_or(("", "0"));
    (code.trim().parse().unwrap_or(0), body.to_string())
}

/// An applier restarted while ClickHouse is down (its group has run before) waits for it,
/// degraded (`/healthz` 503 with the reason), and goes on when it is back; a first start of a
/// new group against a server that does not answer fails fast.
#[tokio::test(flavor = "multi_thread")]
async fn an_applier_restarted_during_an_outage_waits_degraded_and_a_first_start_fails_fast() {
    let Some((mut server, private, db, m_db)) = private_mirror("sluice_t_apply_wait").await else {
        eprintln!("no clickhouse-server binary here: this test needs one to stop and start");
        return;
    };
    let mut cap = CaptureProcess::spawn(CaptureProcess::config(&db, &binlog_end().await, ""));
    let prefix = cap.prefix.clone();
    let group = unique("g");
    let batch = "[batch]\nmax_wait_ms = 100\n";
    let mut mirror = apply_to(&server.url(), &prefix, &m_db, "mirror", &group, batch);
    let mut c = w1_source(&db).await;
    c.query_drop(w1_insert(&db, 1, 50)).await.unwrap();
    let count = || {
        let (client, sql) = (
            private.clone(),
            format!("SELECT count() FROM {m_db}.binlog_field_test_1 FINAL WHERE _deleted = 0"),
        );
        async move { client.query(&sql).fetch_one::<u64>().await.unwrap_or(0) }
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    while count().await < 50 {
        assert!(Instant::now() < deadline, "first rows never arrived");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    mirror.stop_ok();

    // Down; the applier restarts; the source goes on.
    server.pause();
    mirror.restart();
    c.query_drop(w1_insert(&db, 51, 50)).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    let (status, body) = loop {
        let h = healthz(mirror.metrics_port);
        if h.0 == 503 || Instant::now() > deadline {
            break h;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(status, 503, "{body}");
    assert!(
        body.contains("waiting at start") && body.contains("clickhouse"),
        "{body}"
    );
    // Alive all the same: a liveness probe must not restart it for waiting.
    let live = std::process::Command::new("curl")
        .args(["-s", "-o", "/dev/null", "-w", "%{http_code}"])
        .arg(format!("http://127.0.0.1:{}/livez", mirror.metrics_port))
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&live.stdout), "200");
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(
        mirror.child.try_wait().unwrap().is_none(),
        "a restart during an outage must wait, not exit"
    );
    server.resume();
    let deadline = Instant::now() + Duration::from_secs(90);
    while count().await < 100 {
        if Instant::now() > deadline {
            let (_, out) = mirror.stop();
            panic!("rows never arrived after the outage: {out}");
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    assert_eq!(healthz(mirror.metrics_port).0, 200);
    let out = mirror.stop_ok();
    assert!(out.contains("has run before"), "{out}");

    // A new group against a server that does not answer: it fails at once, saying why.
    server.pause();
    let mut first = apply_to(&server.url(), &prefix, &m_db, "mirror", &unique("g"), batch);
    let (code, out) = first.wait(Duration::from_secs(60));
    assert_eq!(code, Some(1), "{out}");
    assert!(out.contains("a first start of consumer group"), "{out}");
    server.resume();
    finish(&db, &mut [&mut cap]).await;
}

/// SIGTERM always ends an applier, with exit 0, however its consumer's close goes: ten stops
/// in a row, each while it holds partitions (the stop waits at most 30 s for each).
#[tokio::test(flavor = "multi_thread")]
async fn many_stops_in_a_row_each_finish() {
    let (db, m_db, mut cap) = pipeline("sluice_t_apply_stops", "_mirror").await;
    ch_exec(format!("CREATE DATABASE IF NOT EXISTS {m_db}")).await;
    let mut c = w1_source(&db).await;
    let group = unique("g");
    for round in 0..10u64 {
        c.query_drop(w1_insert(&db, 1 + round * 10, 10))
            .await
            .unwrap();
        let mut a = apply(&cap.prefix, &m_db, "mirror", &group, "");
        let deadline = Instant::now() + Duration::from_secs(60);
        while !assigned(a.metrics_port) {
            assert!(Instant::now() < deadline, "round {round}: never assigned");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let (code, out) = a.stop();
        assert_eq!(code, Some(0), "round {round}: {out}");
    }
    let mut a = apply(&cap.prefix, &m_db, "mirror", &group, "");
    converge(&db, &m_db, Duration::from_secs(60)).await;
    finish(&db, &mut [&mut cap, &mut a]).await;
}

/// Events that expired from Kafka (retention) before the group wrote them stop the stage at its
/// next start, naming the partitions and the remedy; nothing after the gap is written.
#[tokio::test(flavor = "multi_thread")]
async fn events_expired_before_they_were_written_stop_the_stage() {
    use rdkafka::admin::{AdminClient, AdminOptions};
    use rdkafka::client::DefaultClientContext;
    let (db, m_db, mut cap) = pipeline("sluice_t_apply_expired", "_mirror").await;
    let mut c = w1_source(&db).await;
    c.query_drop(w1_insert(&db, 1, 50)).await.unwrap();
    let group = unique("g");
    let mut a = apply(&cap.prefix, &m_db, "mirror", &group, "");
    converge(&db, &m_db, Duration::from_secs(60)).await;
    a.stop_ok();

    // More changes while the applier is away, then they expire (records deleted, as the
    // retention would).
    c.query_drop(w1_insert(&db, 51, 100)).await.unwrap();
    let topic = cap.topic(&db, "binlog_field_test_1");
    let t = topic.clone();
    tokio::task::spawn_blocking(move || {
        sluice_tests::capture::read_events(&t, Duration::from_secs(60), |m| {
            sluice_tests::capture::count_rows(m) >= 150
        })
    })
    .await
    .unwrap();
    let admin: AdminClient<DefaultClientContext> = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", kafka_brokers())
        .create()
        .unwrap();
    let mut tpl = rdkafka::TopicPartitionList::new();
    for p in 0..3 {
        tpl.add_partition_offset(&topic, p, rdkafka::Offset::End)
            .unwrap();
    }
    admin
        .delete_records(&tpl, &AdminOptions::new())
        .await
        .unwrap();

    a.restart();
    let (code, out) = a.wait(Duration::from_secs(60));
    assert_eq!(code, Some(1), "{out}");
    assert!(out.contains("expired from Kafka"), "{out}");
    assert!(out.contains(&topic), "{out}");
    assert!(out.contains("Re-snapshot"), "{out}");
    assert_eq!(
        mirror_rows(&m_db).await.len(),
        50,
        "nothing written past the gap"
    );
    finish(&db, &mut [&mut cap]).await;
}

/// By default a row a mirror table cannot hold stops that table, named with the reason (a
/// mirror missing a change would be wrong), while the other tables flow; the row and the
/// table's later ones are dead-lettered.
#[tokio::test(flavor = "multi_thread")]
async fn a_row_a_mirror_cannot_hold_stops_its_table_and_the_rest_flows() {
    let (db, m_db, mut cap) = pipeline("sluice_t_apply_stopmirror", "_mirror").await;
    let mut c = mysql().await;
    c.query_drop(format!("CREATE DATABASE `{db}`"))
        .await
        .unwrap();
    c.query_drop(format!(
        "CREATE TABLE `{db}`.dated (id INT PRIMARY KEY, d DATE NOT NULL)"
    ))
    .await
    .unwrap();
    c.query_drop(sluice_tests::w1_create_table(&db))
        .await
        .unwrap();
    let dlq = unique("dlq");
    let group = unique("g");
    let mut a = CaptureProcess::apply_clickhouse_with(&cap.prefix, &m_db, &dlq, &group, "");
    // A date no ClickHouse date type holds (a day February has not, which MySQL keeps with
    // ALLOW_INVALID_DATES), between two it does; then more rows of each table.
    c.query_drop("SET SESSION sql_mode = CONCAT(@@sql_mode, ',ALLOW_INVALID_DATES')")
        .await
        .unwrap();
    c.query_drop(format!(
        "INSERT INTO `{db}`.dated VALUES (1, '2020-01-01'), (2, '2021-02-30'), (3, '2021-01-01')"
    ))
    .await
    .unwrap();
    c.query_drop(w1_insert(&db, 1, 20)).await.unwrap();
    c.query_drop(format!("INSERT INTO `{db}`.dated VALUES (4, '2022-01-01')"))
        .await
        .unwrap();
    converge(&db, &m_db, Duration::from_secs(60)).await;
    let stopped = |m_db: String| async move {
        sluice_tests::capture::clickhouse_tsv(&format!(
            "SELECT target, reason FROM {m_db}._sluice_stopped"
        ))
        .await
        .unwrap_or_default()
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut rows = stopped(m_db.clone()).await;
    while !rows.contains("dated") && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(300)).await;
        rows = stopped(m_db.clone()).await;
    }
    assert!(rows.contains("dated"), "{rows}");
    assert!(
        rows.contains("row (id=2) column d: 2021-02-30 is not a day of the calendar"),
        "{rows}"
    );
    // A row written once the table is stopped is not applied (dead-lettered); the other
    // table goes on.
    c.query_drop(format!(
        "INSERT INTO `{db}`.dated VALUES (5, '2023-01-01'), (7, '2023-07-07')"
    ))
    .await
    .unwrap();
    c.query_drop(w1_insert(&db, 21, 20)).await.unwrap();
    converge(&db, &m_db, Duration::from_secs(60)).await;
    let topic = dlq.clone();
    let letters = tokio::task::spawn_blocking(move || dead_letters(&topic, 2))
        .await
        .unwrap();
    assert!(letters.len() >= 2, "{letters:?}");
    assert!(
        letters
            .iter()
            .any(|(_, r)| r.contains("not a day of the calendar")),
        "{letters:?}"
    );
    assert!(
        letters.iter().any(|(_, r)| r.contains("is stopped")),
        "{letters:?}"
    );
    let written = sluice_tests::capture::clickhouse_tsv(&format!(
        "SELECT id FROM {m_db}.dated FINAL ORDER BY id"
    ))
    .await
    .unwrap();
    // (rows 1, 3 and 4 may be written or not: each sits in a partition of its own, read
    // before or after the stop)
    let ids: Vec<&str> = written.lines().collect();
    assert!(!ids.contains(&"2") && !ids.contains(&"5"), "{written}");
    let out = a.stop_ok();
    assert!(out.contains("table stopped"), "{out}");

    // Taken up again as docs/operations.md says: the stop deleted, the table's dead letters
    // replayed. Row 5 changed meanwhile: the replayed older insert does not undo the change.
    sluice_tests::capture::clickhouse_tsv(&format!(
        "ALTER TABLE {m_db}._sluice_stopped DELETE WHERE target = 'dated'"
    ))
    .await
    .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while stopped(m_db.clone()).await.contains("dated") {
        assert!(Instant::now() < deadline, "the stop is still there");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let mut a = CaptureProcess::apply_clickhouse_with(&cap.prefix, &m_db, &dlq, &group, "");
    c.query_drop(format!(
        "UPDATE `{db}`.dated SET d = '2024-06-01' WHERE id = 5; \
         INSERT INTO `{db}`.dated VALUES (6, '2023-06-06')"
    ))
    .await
    .unwrap();
    let ids = |m_db: String| async move {
        sluice_tests::capture::clickhouse_tsv(&format!(
            "SELECT id, d FROM {m_db}.dated FINAL ORDER BY id"
        ))
        .await
        .unwrap()
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    while !ids(m_db.clone()).await.contains("6\t2023-06-06") {
        assert!(
            Instant::now() < deadline,
            "row 6 never arrived: {}",
            a.stop().1
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let table = format!("{db}.dated");
    let replay = || {
        sluice_tests::capture::sluice(&[
            "dead-letters",
            "replay",
            "--topic",
            &dlq,
            "--table",
            &table,
            "--reason",
            "table_stopped",
        ])
    };
    let (code, out, err) = replay();
    assert_eq!(code, Some(0), "{out}{err}");
    assert!(!out.contains(" 0 dead letters replayed"), "{out}");
    let want =
        "1\t2020-01-01\n3\t2021-01-01\n4\t2022-01-01\n5\t2024-06-01\n6\t2023-06-06\n7\t2023-07-07";
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let got = ids(m_db.clone()).await;
        if got.trim() == want {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "after the replay:\n{got}\n{}",
            a.stop().1
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    // Once: replayed again, nothing is written; the refused row's dead letter is still listed.
    let (code, out, err) = replay();
    assert_eq!(code, Some(0), "{out}{err}");
    assert!(
        out.contains("0 dead letters replayed, 0 events written again"),
        "{out}"
    );
    let (code, out, err) = sluice_tests::capture::sluice(&[
        "dead-letters",
        "list",
        "--topic",
        &dlq,
        "--table",
        &table,
    ]);
    assert_eq!(code, Some(0), "{out}{err}");
    assert_eq!(out.lines().count(), 1, "{out}");
    assert!(out.contains("insert key=2  [value]"), "{out}");
    // That one whole, by the place `list` printed, with the event decoded.
    let at = out.split_whitespace().next().unwrap().to_string();
    let (code, shown, err) =
        sluice_tests::capture::sluice(&["dead-letters", "show", &at, "--topic", &dlq]);
    assert_eq!(code, Some(0), "{shown}{err}");
    assert!(shown.contains(&format!("  table:    {table}\n")), "{shown}");
    assert!(shown.contains("  key:      2\n"), "{shown}");
    assert!(shown.contains("  reason:   [value] "), "{shown}");
    assert!(shown.contains("  replayed: no\n"), "{shown}");
    assert!(
        shown.contains(&format!("  event:    INSERT   {table} v")),
        "{shown}"
    );
    assert!(
        shown.contains("id=2"),
        "column names from the schema topic: {shown}"
    );
    let (code, _, err) =
        sluice_tests::capture::sluice(&["dead-letters", "show", "0@999999", "--topic", &dlq]);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("no dead letter at 0@999999"), "{err}");
    // A time filter: the dead letter is older than now, not older than the test.
    let listed_since = |since: &str| {
        let (code, out, err) = sluice_tests::capture::sluice(&[
            "dead-letters",
            "list",
            "--topic",
            &dlq,
            "--table",
            &table,
            "--since",
            since,
        ]);
        assert_eq!(code, Some(0), "{out}{err}");
        out.lines().count()
    };
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    assert_eq!(listed_since(&(now + 1).to_string()), 0);
    assert_eq!(listed_since(&(now - 600).to_string()), 1);
    a.stop_ok();
    finish(&db, &mut [&mut cap]).await;
}

/// A rebalance while the target refuses writes: the member that cannot write its batch in hand
/// before letting its partitions go stores nothing of it and stops (so that no later offset of
/// a partition it keeps or gets back is stored over those events); the other member reads them
/// again from the committed offsets, and nothing is lost.
/// A `tables.order_by` a mirror cannot be kept by (a column besides the primary key: a row
/// whose value there changed would be kept twice) stops that table before it is created,
/// naming the setting; its rows are dead-lettered and the other tables flow.
#[tokio::test(flavor = "multi_thread")]
async fn an_order_by_a_mirror_cannot_be_kept_by_stops_its_table_and_the_rest_flows() {
    let (db, m_db, mut cap) = pipeline("sluice_t_apply_orderby", "_mirror").await;
    let mut c = w1_source(&db).await;
    c.query_drop(format!(
        "CREATE TABLE `{db}`.keyed (id INT PRIMARY KEY, v INT NOT NULL)"
    ))
    .await
    .unwrap();
    let dlq = unique("dlq");
    let mut a = CaptureProcess::apply_clickhouse_with(
        &cap.prefix,
        &m_db,
        &dlq,
        "",
        &format!("[tables.order_by]\n\"{db}.keyed\" = \"(id, v)\"\n"),
    );
    c.query_drop(format!("INSERT INTO `{db}`.keyed VALUES (1, 10), (2, 20)"))
        .await
        .unwrap();
    c.query_drop(w1_insert(&db, 1, 30)).await.unwrap();
    c.query_drop(format!("UPDATE `{db}`.keyed SET v = 11 WHERE id = 1"))
        .await
        .unwrap();
    converge(&db, &m_db, Duration::from_secs(60)).await;
    let stopped = || {
        let sql = format!("SELECT target, reason FROM {m_db}._sluice_stopped");
        async move { sluice_tests::capture::clickhouse_tsv(&sql).await }
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut rows = stopped().await.unwrap_or_default();
    while !rows.contains("keyed") && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(300)).await;
        rows = stopped().await.unwrap_or_default();
    }
    assert!(
        rows.contains(&format!(
            "tables.order_by.\"{db}.keyed\" = \"(id, v)\" names column(s) v besides \
             the primary key"
        )),
        "{rows}"
    );
    let created = sluice_tests::capture::clickhouse_tsv(&format!(
        "SELECT count() FROM system.tables WHERE database = '{m_db}' AND name = 'keyed'"
    ))
    .await
    .unwrap();
    assert_eq!(created.trim(), "0", "the table was created");
    let topic = dlq.clone();
    let letters = tokio::task::spawn_blocking(move || dead_letters(&topic, 3))
        .await
        .unwrap();
    assert_eq!(letters.len(), 3, "{letters:?}");
    assert!(
        letters
            .iter()
            .all(|(_, r)| r.contains("tables.order_by") || r.contains("is stopped")),
        "{letters:?}"
    );
    let out = a.stop_ok();
    // Stopped at its CREATE (the target is made there), or at its first row.
    assert!(
        out.contains("stopping this table") || out.contains("table stopped"),
        "{out}"
    );
    finish(&db, &mut [&mut cap]).await;
}

/// Rows ClickHouse refuses for good (a column the stage writes was dropped behind its back)
/// stop their table with the server's answer; the stage exits once, nothing of the batch
/// stored, and restarted it dead-letters that table's events and writes the others'.
#[tokio::test(flavor = "multi_thread")]
async fn rows_clickhouse_refuses_stop_their_table_once_and_the_rest_flows() {
    let (db, m_db, mut cap) = pipeline("sluice_t_apply_refused", "_mirror").await;
    let mut c = w1_source(&db).await;
    for sql in [
        format!("CREATE TABLE `{db}`.keyed (id INT PRIMARY KEY, v INT NOT NULL)"),
        format!("CREATE TABLE `{db}`.other (id INT PRIMARY KEY)"),
        format!("INSERT INTO `{db}`.keyed VALUES (1, 10)"),
        format!("INSERT INTO `{db}`.other VALUES (1)"),
    ] {
        c.query_drop(sql).await.unwrap();
    }
    let dlq = unique("dlq");
    let mut a = CaptureProcess::apply_clickhouse(&cap.prefix, &m_db, &dlq);
    let count = |t: &'static str| {
        let sql = format!("SELECT count() FROM {m_db}.{t} FINAL");
        async move {
            sluice_tests::capture::clickhouse_tsv(&sql)
                .await
                .map(|s| s.trim().to_string())
                .unwrap_or_default()
        }
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    while (count("keyed").await != "1" || count("other").await != "1") && Instant::now() < deadline
    {
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    assert_eq!(count("keyed").await, "1");
    ch_exec(format!("ALTER TABLE {m_db}.keyed DROP COLUMN v")).await;
    c.query_drop(format!("INSERT INTO `{db}`.keyed VALUES (2, 20)"))
        .await
        .unwrap();
    c.query_drop(format!("INSERT INTO `{db}`.other VALUES (2)"))
        .await
        .unwrap();
    let (code, log) = a.wait(Duration::from_secs(60));
    assert_eq!(code, Some(1), "{log}");
    assert!(log.contains("ClickHouse refused the INSERT"), "{log}");
    let stopped = sluice_tests::capture::clickhouse_tsv(&format!(
        "SELECT target, reason FROM {m_db}._sluice_stopped"
    ))
    .await
    .unwrap();
    assert!(
        stopped.starts_with("keyed\t") && stopped.contains("ClickHouse refused the INSERT"),
        "{stopped}"
    );
    // Restarted (as its container is): the other table's row is written, the stopped one's
    // dead-lettered, and nothing stops the stage again.
    a.restart();
    let deadline = Instant::now() + Duration::from_secs(60);
    while count("other").await != "2" && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    assert_eq!(count("other").await, "2");
    let topic = dlq.clone();
    let letters = tokio::task::spawn_blocking(move || dead_letters(&topic, 1))
        .await
        .unwrap();
    assert_eq!(letters.len(), 1, "{letters:?}");
    assert!(letters[0].1.contains("is stopped"), "{letters:?}");
    a.stop_ok();
    finish(&db, &mut [&mut cap]).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_rebalance_while_the_target_refuses_writes_stops_the_member_and_loses_nothing() {
    let (db, m_db, mut cap) = pipeline("sluice_t_apply_drainfail", "_mirror").await;
    let prefix = cap.prefix.clone();
    let mut c = w1_source(&db).await;
    c.query_drop(w1_insert(&db, 1, 1)).await.unwrap();
    let relay = sluice_tests::relay::Relay::to(&clickhouse_url()).await;
    // A holds its batch for up to 20 s: only a drain would write it sooner.
    let group = unique("g");
    let extra = "[batch]\nmax_wait_ms = 20000\n";
    let mut a = apply_to(&relay.http_url(), &prefix, &m_db, "mirror", &group, extra);
    let deadline = Instant::now() + Duration::from_secs(60);
    while !assigned(a.metrics_port) {
        assert!(Instant::now() < deadline, "a never got partitions");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    c.query_drop(w1_insert(&db, 2, 200)).await.unwrap();
    tokio::time::sleep(Duration::from_secs(2)).await;
    // The target goes away from A; B joins, and A must let its partitions go.
    relay.cut();
    let mut b = apply(&prefix, &m_db, "mirror", &group, "");
    let deadline = Instant::now() + Duration::from_secs(60);
    while !a.exited() {
        if Instant::now() > deadline {
            relay.restore();
            panic!("a did not stop:\n{}", a.stop().1);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let (code, log) = a.wait(Duration::from_secs(1));
    assert_ne!(code, Some(0), "a must stop:\n{log}");
    assert!(
        log.contains("could not write the batch in hand before letting partitions go")
            && log.contains("before a rebalance"),
        "{log}"
    );
    relay.restore();
    converge(&db, &m_db, Duration::from_secs(60)).await;
    finish(&db, &mut [&mut cap, &mut b]).await;
}

/// A table one instance stops is stopped by the group's other instances too, within 5 s (its
/// keys are on every partition): rows of it read later, on any partition, are dead-lettered,
/// not written, while another table flows.
#[tokio::test(flavor = "multi_thread")]
async fn a_table_one_instance_stops_is_stopped_by_the_others() {
    let (db, m_db, mut cap) = pipeline("sluice_t_apply_stopall", "_mirror").await;
    let mut c = mysql().await;
    c.query_drop(format!("CREATE DATABASE `{db}`"))
        .await
        .unwrap();
    c.query_drop(format!(
        "CREATE TABLE `{db}`.dated (id INT PRIMARY KEY, d DATE NOT NULL)"
    ))
    .await
    .unwrap();
    c.query_drop(sluice_tests::w1_create_table(&db))
        .await
        .unwrap();
    let (dlq, group) = (unique("dlq"), unique("g"));
    let mut a = CaptureProcess::apply_clickhouse_with(&cap.prefix, &m_db, &dlq, &group, "");
    let mut b = CaptureProcess::apply_clickhouse_with(&cap.prefix, &m_db, &dlq, &group, "");
    let deadline = Instant::now() + Duration::from_secs(60);
    while !(assigned(a.metrics_port) && assigned(b.metrics_port)) {
        assert!(
            Instant::now() < deadline,
            "the two instances never shared the partitions"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // Rows on every partition arrive; then one no ClickHouse Date holds stops the table.
    c.query_drop(format!(
        "INSERT INTO `{db}`.dated VALUES (1, '2020-01-01'), (2, '2020-01-02'), (3, '2020-01-03'), \
         (4, '2020-01-04'), (5, '2020-01-05'), (6, '2020-01-06')"
    ))
    .await
    .unwrap();
    let rows = |m_db: String| async move {
        sluice_tests::capture::clickhouse_tsv(&format!("SELECT count() FROM {m_db}.dated FINAL"))
            .await
            .unwrap_or_default()
            .trim()
            .to_string()
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    while rows(m_db.clone()).await != "6" {
        assert!(Instant::now() < deadline, "the first rows never arrived");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    c.query_drop("SET SESSION sql_mode = CONCAT(@@sql_mode, ',ALLOW_INVALID_DATES')")
        .await
        .unwrap();
    c.query_drop(format!(
        "INSERT INTO `{db}`.dated VALUES (100, '2021-02-30')"
    ))
    .await
    .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while !sluice_tests::capture::clickhouse_tsv(&format!(
        "SELECT target FROM {m_db}._sluice_stopped"
    ))
    .await
    .unwrap_or_default()
    .contains("dated")
    {
        assert!(Instant::now() < deadline, "the table never stopped");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // Past the 5 s re-read, rows of every partition: none is written, by either instance.
    tokio::time::sleep(Duration::from_secs(6)).await;
    let values: Vec<String> = (7..40).map(|i| format!("({i}, '2021-01-01')")).collect();
    c.query_drop(format!(
        "INSERT INTO `{db}`.dated VALUES {}",
        values.join(",")
    ))
    .await
    .unwrap();
    c.query_drop(w1_insert(&db, 1, 50)).await.unwrap();
    let want = source_rows(&db).await;
    let deadline = Instant::now() + Duration::from_secs(60);
    while mirror_rows(&m_db).await != want {
        if Instant::now() > deadline {
            panic!(
                "the other table never arrived\n{}\n----\n{}",
                a.stop().1,
                b.stop().1
            );
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        rows(m_db.clone()).await,
        "6",
        "rows of the stopped table were written"
    );
    let out_a = a.stop_ok();
    let out_b = b.stop_ok();
    // Both instances dead-lettered rows of it (each holds some of its partitions).
    for out in [&out_a, &out_b] {
        assert!(out.contains("dead-lettering"), "{out}");
    }
    finish(&db, &mut [&mut cap]).await;
}

/// Many tables on one topic (`topics.template = "{prefix}.{db}"`): the key carries the table
/// and the primary key, so two appliers of one group write every table into its own target, and
/// each row's last version wins; an ALTER of one table applies while the others flow. The
/// capture makes one topic for the database, and no other.
#[tokio::test(flavor = "multi_thread")]
async fn many_tables_on_one_topic_each_arrive_whole_in_their_own_target() {
    const TABLES: usize = 12;
    let db = unique("sluice_t_one_topic");
    let ch_db = format!("{db}_m");
    ch_exec(format!("CREATE DATABASE {ch_db}")).await;
    let mut c = mysql().await;
    c.query_drop(format!("CREATE DATABASE `{db}`"))
        .await
        .unwrap();
    for t in 0..TABLES {
        c.query_drop(format!(
            "CREATE TABLE `{db}`.t{t} (id INT PRIMARY KEY, v INT NOT NULL, s VARCHAR(20) NOT NULL)"
        ))
        .await
        .unwrap();
    }
    let (text, connector, prefix) = CaptureProcess::config(&db, &binlog_end().await, "");
    let text = text.replace("[topics]\n", "[topics]\ntemplate = \"{prefix}.{db}\"\n");
    let mut cap = CaptureProcess::spawn((text, connector, prefix.clone()));
    let group = unique("g");
    let mut a = apply(&prefix, &ch_db, "mirror", &group, "");
    let mut b = apply(&prefix, &ch_db, "mirror", &group, "");
    for round in 0..4 {
        let mut sql = Vec::new();
        for t in 0..TABLES {
            let values: Vec<String> = (round * 25..round * 25 + 25)
                .map(|id| format!("({id}, {}, 's{t}-{id}')", id * t))
                .collect();
            sql.push(format!(
                "INSERT INTO `{db}`.t{t} (id, v, s) VALUES {}",
                values.join(",")
            ));
            sql.push(format!(
                "UPDATE `{db}`.t{t} SET v = v + {round} WHERE id % 3 = {}",
                round % 3
            ));
            sql.push(format!("DELETE FROM `{db}`.t{t} WHERE id = {}", round * 7));
        }
        c.query_drop(sql.join(";")).await.unwrap();
        if round == 1 {
            c.query_drop(format!(
                "ALTER TABLE `{db}`.t5 ADD COLUMN x INT NOT NULL DEFAULT 5"
            ))
            .await
            .unwrap();
        }
    }
    c.query_drop(format!("UPDATE `{db}`.t5 SET x = id WHERE id > 60"))
        .await
        .unwrap();

    // Every table's rows arrive; then each is compared value by value.
    let deadline = Instant::now() + Duration::from_secs(120);
    for t in 0..TABLES {
        let want: u64 = c
            .query_first(format!("SELECT COUNT(*) FROM `{db}`.t{t}"))
            .await
            .unwrap()
            .unwrap();
        while target_count(&ch_db, &format!("t{t}")).await != want {
            assert!(Instant::now() < deadline, "t{t}: not {want} rows");
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    }
    let (code, report, err) = sluice_tests::capture::verify(&cap, &a, &[]);
    assert_eq!(code, Some(0), "{report:#}\n{err}");
    assert_eq!(report["result"], "equal", "{report:#}");
    assert_eq!(
        report["tables"].as_array().unwrap().len(),
        TABLES,
        "{report:#}"
    );
    // One topic for the database's tables.
    let consumer: rdkafka::consumer::BaseConsumer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", sluice_tests::kafka_brokers())
        .create()
        .unwrap();
    let md = rdkafka::consumer::Consumer::fetch_metadata(&consumer, None, Duration::from_secs(10))
        .unwrap();
    let mine: Vec<&str> = md
        .topics()
        .iter()
        .map(|t| t.name())
        .filter(|n| n.starts_with(&format!("{prefix}.")))
        .collect();
    assert_eq!(mine, [format!("{prefix}.{db}")], "the capture's topics");
    finish(&db, &mut [&mut cap, &mut a, &mut b]).await;
}

/// The statements of a stopped table are dead-lettered with its rows, and the documented
/// resume (the stop deleted, the table's dead letters replayed) applies them in order: rows a
/// TRUNCATE removed stay removed, a column added with a default and a renamed column hold the
/// source's values.
#[tokio::test(flavor = "multi_thread")]
async fn a_stopped_tables_statements_are_applied_in_order_when_it_is_taken_up_again() {
    let (db, m_db, mut cap) = pipeline("sluice_t_apply_stopddl", "_mirror").await;
    let mut c = mysql().await;
    c.query_drop(format!("CREATE DATABASE `{db}`"))
        .await
        .unwrap();
    c.query_drop(format!(
        "CREATE TABLE `{db}`.dated (id INT PRIMARY KEY, d DATE NOT NULL)"
    ))
    .await
    .unwrap();
    let dlq = unique("dlq");
    let group = unique("g");
    let mut a = CaptureProcess::apply_clickhouse_with(&cap.prefix, &m_db, &dlq, &group, "");
    c.query_drop(format!(
        "INSERT INTO `{db}`.dated VALUES (1, '2020-01-01'), (3, '2021-01-01')"
    ))
    .await
    .unwrap();
    let rows = |sql: String| async move {
        sluice_tests::capture::clickhouse_tsv(&sql)
            .await
            .unwrap_or_default()
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    while rows(format!("SELECT count() FROM {m_db}.dated FINAL"))
        .await
        .trim()
        != "2"
    {
        assert!(Instant::now() < deadline, "rows 1 and 3 never arrived");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // A date no ClickHouse date type holds stops the table.
    c.query_drop("SET SESSION sql_mode = CONCAT(@@sql_mode, ',ALLOW_INVALID_DATES')")
        .await
        .unwrap();
    c.query_drop(format!("INSERT INTO `{db}`.dated VALUES (2, '2021-02-30')"))
        .await
        .unwrap();
    let stopped = format!("SELECT target FROM {m_db}._sluice_stopped");
    let deadline = Instant::now() + Duration::from_secs(60);
    while !rows(stopped.clone()).await.contains("dated") {
        assert!(Instant::now() < deadline, "the table never stopped");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // While it is stopped: a TRUNCATE (which removes the refused row too), rows, a column
    // added with a default (the capture reads the table again), a column renamed.
    c.query_drop(format!(
        "INSERT INTO `{db}`.dated VALUES (5, '2023-01-01'); TRUNCATE TABLE `{db}`.dated; \
         INSERT INTO `{db}`.dated VALUES (8, '2024-01-08'), (9, '2024-01-09'); \
         ALTER TABLE `{db}`.dated ADD COLUMN n INT NOT NULL DEFAULT 7; \
         ALTER TABLE `{db}`.dated RENAME COLUMN d TO dd; \
         INSERT INTO `{db}`.dated VALUES (10, '2024-01-10', 10)"
    ))
    .await
    .unwrap();
    sluice_tests::capture::wait_snapshot_done(cap.metrics_port, Duration::from_secs(60)).await;
    // Every event read (the applier's lag 0 for a while).
    let mut quiet = 0;
    let deadline = Instant::now() + Duration::from_secs(60);
    while quiet < 10 {
        let lag =
            sluice_tests::capture::metric_at(a.metrics_port, "sluice_apply_consumer_lag_messages");
        quiet = if lag == Some(0.0) { quiet + 1 } else { 0 };
        assert!(Instant::now() < deadline, "lag {lag:?}");
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let letters = tokio::task::spawn_blocking({
        let dlq = dlq.clone();
        move || dead_letters(&dlq, usize::MAX)
    })
    .await
    .unwrap();
    assert!(
        letters
            .iter()
            .any(|(_, r)| r.contains("its truncate statement") && r.contains("is not applied")),
        "{letters:?}"
    );
    assert_eq!(
        rows(format!("SELECT id FROM {m_db}.dated FINAL ORDER BY id")).await,
        "1\n3\n",
        "nothing written while stopped"
    );
    // Seen: in /healthz and in a metric.
    let (code, body) = healthz(a.metrics_port);
    assert_eq!(code, 503, "{body}");
    assert!(body.contains("1 table(s) stopped: dated"), "{body}");
    assert_eq!(
        metric_at(a.metrics_port, "sluice_apply_stopped_tables"),
        Some(1.0)
    );
    // And in `sluice status` given the applier's config: since when, why, and how to take it
    // up again.
    let config = a.config_path().to_str().unwrap().to_string();
    let status = |json: bool| {
        let mut args = vec!["status", "--group", &group, "--apply-config", &config];
        if json {
            args.push("--json");
        }
        let (code, out, err) = sluice_tests::capture::sluice(&args);
        assert_eq!(code, Some(0), "{out}{err}");
        out
    };
    let text = status(false);
    assert!(
        text.contains(&format!(
            "  dated (apply-clickhouse, group {group}) stopped since 20"
        )) && text.contains("2021-02-30")
            && text.contains(&format!(
                "2. ALTER TABLE `{m_db}`.`_sluice_stopped` DELETE WHERE target = 'dated'"
            )),
        "{text}"
    );
    let json: serde_json::Value = serde_json::from_str(&status(true)).unwrap();
    assert_eq!(json["stopped"][0]["target"], "dated", "{json:#}");
    assert_eq!(json["stopped"][0]["group"], group.as_str(), "{json:#}");

    // Taken up again as docs/operations.md says, the applier running.
    sluice_tests::capture::clickhouse_tsv(&format!(
        "ALTER TABLE {m_db}._sluice_stopped DELETE WHERE target = 'dated'"
    ))
    .await
    .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while healthz(a.metrics_port).0 != 200 {
        assert!(
            Instant::now() < deadline,
            "still degraded: {:?}",
            healthz(a.metrics_port)
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(
        metric_at(a.metrics_port, "sluice_apply_stopped_tables"),
        Some(0.0)
    );
    let text = status(false);
    assert!(
        text.contains("stopped tables (of the apply configs given):\n  none"),
        "{text}"
    );
    let table = format!("{db}.dated");
    // A dry run says what it would do, and does nothing.
    let (_, out, err) = sluice_tests::capture::sluice(&[
        "dead-letters",
        "replay",
        "--topic",
        &dlq,
        "--table",
        &table,
        "--reason",
        "table_stopped",
        "--dry-run",
    ]);
    assert!(
        out.contains("dry run (nothing written): ")
            && out.contains(" dead letters would be replayed"),
        "{out}{err}"
    );
    assert_eq!(
        rows(format!("SELECT id FROM {m_db}.dated FINAL ORDER BY id")).await,
        "1\n3\n",
        "nothing written by a dry run"
    );
    let (code, out, err) = sluice_tests::capture::sluice(&[
        "dead-letters",
        "replay",
        "--topic",
        &dlq,
        "--table",
        &table,
        "--reason",
        "table_stopped",
    ]);
    // (rows older than the TRUNCATE are not written again, and said so: exit status 1)
    let not_replayed: Vec<&str> = out
        .lines()
        .filter(|l| l.starts_with("not replayed"))
        .collect();
    assert!(
        not_replayed
            .iter()
            .all(|l| l.contains("superseded by a later truncate")),
        "{out}{err}"
    );
    assert_eq!(
        code,
        Some(i32::from(!not_replayed.is_empty())),
        "{out}{err}"
    );
    let (code, report, err) =
        tokio::task::block_in_place(|| sluice_tests::capture::verify(&cap, &a, &[]));
    assert_eq!(code, Some(0), "{report:#}\n{err}");
    assert_eq!(
        rows(format!(
            "SELECT id, dd, n FROM {m_db}.dated FINAL WHERE _deleted = 0 ORDER BY id"
        ))
        .await,
        "8\t2024-01-08\t7\n9\t2024-01-09\t7\n10\t2024-01-10\t10\n"
    );
    let out = a.stop_ok();
    assert!(out.contains("table taken up again"), "{out}");
    finish(&db, &mut [&mut cap]).await;
}

/// `tables.unheld = "mark"`: a value a column cannot hold (a zero, partial or invalid date) is
/// written as NULL (the type's zero where the column is not Nullable) and named in the row's
/// `_sluice_unheld`, and the table flows; without it the same rows stop their table, the remedy
/// named; a key stays exact or refused either way; a target made before its table was marked
/// gets the column.
#[tokio::test(flavor = "multi_thread")]
async fn values_the_target_cannot_hold_are_marked_where_the_table_says_so() {
    let (db, m_db, mut cap) = pipeline("sluice_t_apply_unheld", "_mirror").await;
    let mut c = mysql().await;
    let shape = "(id INT PRIMARY KEY, d DATE NULL, dn DATE NOT NULL, dt DATETIME NOT NULL, n INT)";
    c.query_drop(format!(
        "CREATE DATABASE `{db}`; \
         CREATE TABLE `{db}`.m {shape}; CREATE TABLE `{db}`.s {shape}; \
         CREATE TABLE `{db}`.late {shape}; \
         CREATE TABLE `{db}`.mk (id INT, d DATE NOT NULL, n INT, PRIMARY KEY (id, d))"
    ))
    .await
    .unwrap();
    let marked = format!(
        "[tables.unheld_tables]\n\"{db}.m\" = \"mark\"\n\"{db}.mk\" = \"mark\"\n\"{db}.late\" = \"mark\"\n"
    );
    let rows = |sql: String| async move {
        sluice_tests::capture::clickhouse_tsv(&sql)
            .await
            .unwrap_or_default()
    };
    // `late`'s target is made by an applier without the setting, from a row it holds.
    c.query_drop(format!(
        "INSERT INTO `{db}`.late VALUES (1, '2020-01-01', '2020-01-02', '2020-01-03 10:00:00', 1)"
    ))
    .await
    .unwrap();
    let dlq = unique("dlq");
    let group = unique("g");
    let mut a = CaptureProcess::apply_clickhouse_with(&cap.prefix, &m_db, &dlq, &group, "");
    let deadline = Instant::now() + Duration::from_secs(60);
    while rows(format!("SELECT count() FROM {m_db}.late FINAL"))
        .await
        .trim()
        != "1"
    {
        assert!(Instant::now() < deadline, "late's first row never came");
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    a.stop_ok();
    let mut a = CaptureProcess::apply_clickhouse_with(&cap.prefix, &m_db, &dlq, &group, &marked);
    c.query_drop("SET SESSION sql_mode = 'ALLOW_INVALID_DATES'")
        .await
        .unwrap();
    for t in ["m", "s", "late"] {
        c.query_drop(format!(
            "INSERT INTO `{db}`.{t} VALUES \
             (2, '0000-00-00', '2026-00-15', '0000-00-00 00:00:00', 2), \
             (3, '2026-02-30', '2026-02-03', '2026-02-30 10:00:00', 3), \
             (4, NULL, '2026-02-04', '2026-02-04 10:00:00', 4)"
        ))
        .await
        .unwrap();
    }
    c.query_drop(format!(
        "INSERT INTO `{db}`.m VALUES (1, '2020-01-01', '2020-01-02', '2020-01-03 10:00:00', 1); \
         UPDATE `{db}`.m SET dn = '2021-01-01', n = 33 WHERE id = 3; \
         INSERT INTO `{db}`.mk VALUES (1, '2020-01-01', 1), (2, '0000-00-00', 2)"
    ))
    .await
    .unwrap();
    let stopped = format!("SELECT target, reason FROM {m_db}._sluice_stopped ORDER BY target");
    let deadline = Instant::now() + Duration::from_secs(60);
    let want = "1\t0\t2020-01-02\t[]\t1\n\
                2\t1\tzero\t['d','dn','dt']\t2\n\
                3\t1\t2021-01-01\t['d','dt']\t33\n\
                4\t1\t2026-02-04\t[]\t4\n";
    let read = format!(
        "SELECT id, isNull(d), if(dn = toDate(0), 'zero', toString(dn)), _sluice_unheld, n \
         FROM {m_db}.m FINAL WHERE _deleted = 0 ORDER BY id"
    );
    loop {
        let s = rows(stopped.clone()).await;
        let m = rows(read.clone()).await;
        let late = rows(format!("SELECT count() FROM {m_db}.late FINAL")).await;
        if s.contains("mk\t") && s.contains("s\t") && m == want && late.trim() == "4" {
            let lines: Vec<&str> = s.lines().collect();
            let of = |t: &str| {
                lines
                    .iter()
                    .find(|l| l.starts_with(&format!("{t}\t")))
                    .copied()
                    .unwrap_or_default()
            };
            // Unmarked: the row, the column, the value and both remedies named.
            assert!(
                (of("s").contains("row (id=2) column dn: 2026-00-15")
                    || of("s").contains("row (id=3) column d: 2026-02-30"))
                    && of("s").contains("temporal_tables")
                    && of("s").contains("unheld_tables"),
                "{s}"
            );
            // A key stays exact or refused, marked or not.
            assert!(
                of("mk").contains("a zero date in a primary key column")
                    && !of("mk").contains("unheld_tables"),
                "{s}"
            );
            assert!(
                !lines
                    .iter()
                    .any(|l| l.starts_with("m\t") || l.starts_with("late\t")),
                "{s}"
            );
            break;
        }
        if Instant::now() > deadline {
            let (_, log) = a.stop();
            panic!("stopped: {s}\nm: {m}\nlate: {late}\n{log}");
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    assert_eq!(
        rows(format!(
            "SELECT id, _sluice_unheld FROM {m_db}.late FINAL WHERE _deleted = 0 ORDER BY id"
        ))
        .await,
        "1\t[]\n2\t['d','dn','dt']\n3\t['d','dt']\n4\t[]\n",
        "the target made before the table was marked gets the column"
    );
    let page = sluice_tests::capture::scrape(a.metrics_port).unwrap_or_default();
    let counted = |column: &str| {
        page.lines().any(|l| {
            l.starts_with("sluice_apply_unheld_values_total")
                && l.contains(&format!("column=\"{column}\""))
                && l.contains("table=\"m\"")
                && l.ends_with(" 3")
        })
    };
    assert!(counted("d") && counted("dt"), "{page}");
    // (rows 2 and 3, and 3 again by its UPDATE)
    // `sluice verify` tells the marked keys from differences: equal, two keys marked.
    let (m, late) = (format!("{db}.m"), format!("{db}.late"));
    let (code, report, err) = tokio::task::block_in_place(|| {
        sluice_tests::capture::verify(&cap, &a, &["--table", &m, "--table", &late])
    });
    assert_eq!(code, Some(0), "{report:#}\n{err}");
    for t in report["tables"].as_array().expect("tables") {
        assert_eq!(t["result"], "equal", "{report:#}");
        let keys: Vec<String> = t["marked"]
            .as_array()
            .map(|a| a.iter().map(|k| k["key"]["id"].to_string()).collect())
            .unwrap_or_default();
        assert_eq!(keys, ["\"2\"", "\"3\""], "{report:#}");
    }
    let out = a.stop_ok();
    assert!(
        out.contains("cannot hold was written as NULL")
            && out.contains(&format!("FROM {m_db}.m WHERE has(_sluice_unheld, 'dn')")),
        "{out}"
    );
    finish(&db, &mut [&mut cap]).await;
}

/// A zero date in a primary key column: a ClickHouse date type stores it as 1970-01-01, another
/// key, so the table is stopped naming the column and the remedy, while a row whose key holds a
/// real date is written; the same table kept as text takes the zero date exactly.
#[tokio::test(flavor = "multi_thread")]
async fn a_zero_date_in_a_key_stops_its_table_unless_dates_are_text() {
    let (db, m_db, mut cap) = pipeline("sluice_t_apply_zerokey", "_mirror").await;
    let mut c = mysql().await;
    c.query_drop(format!(
        "CREATE DATABASE `{db}`; \
         CREATE TABLE `{db}`.k (id INT, d DATE NOT NULL, PRIMARY KEY (id, d)); \
         CREATE TABLE `{db}`.kt (id INT, d DATETIME(6) NOT NULL, PRIMARY KEY (id, d))"
    ))
    .await
    .unwrap();
    let dlq = unique("dlq");
    let group = unique("g");
    let mut a = CaptureProcess::apply_clickhouse_with(
        &cap.prefix,
        &m_db,
        &dlq,
        &group,
        &format!("[tables.temporal_tables]\n\"{db}.kt\" = \"text\"\n"),
    );
    c.query_drop("SET SESSION sql_mode = ''").await.unwrap();
    for t in ["k", "kt"] {
        c.query_drop(format!(
            "INSERT INTO `{db}`.{t} VALUES (1, '2020-01-01'), (2, '0000-00-00'), (3, '1970-01-01')"
        ))
        .await
        .unwrap();
    }
    let rows = |sql: String| async move {
        sluice_tests::capture::clickhouse_tsv(&sql)
            .await
            .unwrap_or_default()
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    let stopped = format!("SELECT target, reason FROM {m_db}._sluice_stopped");
    loop {
        let s = rows(stopped.clone()).await;
        let kt = rows(format!("SELECT count() FROM {m_db}.kt FINAL")).await;
        if s.contains("k\t") && kt.trim() == "3" {
            assert!(
                s.contains("column d: a zero date in a primary key column")
                    && s.contains("temporal_tables"),
                "{s}"
            );
            assert!(!s.contains("kt\t"), "{s}");
            break;
        }
        assert!(Instant::now() < deadline, "stopped: {s}; kt: {kt}");
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    assert_eq!(
        rows(format!("SELECT d FROM {m_db}.kt FINAL ORDER BY id")).await,
        "2020-01-01 00:00:00.000000\n0000-00-00 00:00:00.000000\n1970-01-01 00:00:00.000000\n"
    );
    a.stop_ok();
    finish(&db, &mut [&mut cap]).await;
}
