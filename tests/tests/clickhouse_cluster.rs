//! The target as a ClickHouse cluster (the test bed's `clickhouse-cluster`: two 18.16 servers
//! and ZooKeeper): MariaDB -> capture-mysql -> Kafka -> two apply-clickhouse of one group, one
//! writing to each server -> the cluster.
//!
//! - `sluice_replicated` (one shard, both servers replicas): `ReplicatedReplacingMergeTree`
//!   made `ON CLUSTER`. W1 rows, updates and deletes; one replica stopped, then an ALTER ADD
//!   COLUMN (its `ON CLUSTER` task waits for the stopped server) while rows go on arriving, then
//!   the replica started: each replica equals the source (`sluice verify` against each
//!   server).
//! - `sluice_cluster` (two shards): the same tables per shard and a `Distributed` table over
//!   them, sharded by the stage's shard column. The Distributed table equals the source read
//!   through either server; after the ALTER too; every row is on one shard only, the one its
//!   shard column names. Once written through the Distributed table, once straight to the
//!   shards (`cluster.write = "shards"`).
//!
//! Servers: `SLUICE_CLICKHOUSE_CLUSTER_URLS` (two HTTP URLs, default the test bed's), clusters
//! `SLUICE_CLICKHOUSE_CLUSTER_REPLICATED` and `SLUICE_CLICKHOUSE_CLUSTER_SHARDED`, and
//! `SLUICE_CLICKHOUSE_CLUSTER_PATH`, the ZooKeeper path of the replicated cluster's tables (its
//! servers' macros decide it: the test bed's `{replicated_shard}` is one shard name on both).

use std::time::{Duration, Instant};

use mysql_async::prelude::Queryable;
use sluice_tests::capture::{binlog_end, CaptureProcess};
use sluice_tests::{kafka_brokers, mysql_url, unique, w1_create_table, w1_insert};

fn var(name: &str, default: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| default.to_string())
}

const TESTBED_NODES: &str = "http://127.0.0.1:18125,http://127.0.0.1:18126";

fn nodes() -> Vec<String> {
    var("SLUICE_CLICKHOUSE_CLUSTER_URLS", TESTBED_NODES)
        .split(',')
        .map(str::to_string)
        .collect()
}

fn client(url: &str) -> clickhouse::Client {
    clickhouse::Client::default()
        .with_url(url)
        .with_validation(false)
}

async fn ddl(url: &str, sql: &str) {
    client(url)
        .query(sql)
        .execute()
        .await
        .unwrap_or_else(|e| panic!("{url}: {sql}: {e}"));
}

async fn text(url: &str, sql: &str) -> String {
    client(url)
        .query(sql)
        .fetch_one::<String>()
        .await
        .unwrap_or_else(|e| panic!("{url}: {sql}: {e}"))
}

async fn number(url: &str, sql: &str) -> u64 {
    client(url)
        .query(sql)
        .fetch_one::<u64>()
        .await
        .unwrap_or_else(|e| panic!("{url}: {sql}: {e}"))
}

/// The rows of the mirror `t` in `ch_db` read through server `url` (deleted ones left out);
/// 0 while it cannot be read.
async fn live_rows(url: &str, ch_db: &str, t: &str) -> u64 {
    client(url)
        .query(&format!(
            "SELECT count() FROM (SELECT id, argMax(_deleted, _version) AS d FROM {ch_db}.{t} \
             GROUP BY id) WHERE d = 0"
        ))
        .fetch_one::<u64>()
        .await
        .unwrap_or(0)
}

async fn source_rows(db: &str) -> u64 {
    let mut c = mysql_async::Conn::new(mysql_async::Opts::from_url(&mysql_url()).unwrap())
        .await
        .unwrap();
    c.query_first(format!("SELECT count(*) FROM `{db}`.binlog_field_test_1"))
        .await
        .unwrap()
        .unwrap()
}

fn applier(
    prefix: &str,
    url: &str,
    ch_db: &str,
    group: &str,
    name: &str,
    cluster: &str,
) -> CaptureProcess {
    let config = format!(
        "[clickhouse]\nurl = \"{url}\"\ndatabase = \"{ch_db}\"\n\
         [consumer]\ngroup_id = \"{group}\"\ninstance_id = \"{name}\"\ntopics = [\"^{}\\\\..*\"]\n\
         [batch]\nmax_wait_ms = 200\n[errors]\ndead_letter_topic = \"{}\"\n\
         [kafka]\nbrokers = \"{}\"\n{cluster}\n",
        prefix.replace('.', "\\\\."),
        unique("dlq"),
        kafka_brokers()
    );
    CaptureProcess::spawn_binary("apply-clickhouse", (config, String::new(), String::new()))
}

/// The pid of the cluster's server `n` (1 or 2), as the test bed keeps it.
fn node_pid(n: usize) -> i32 {
    let dir = var("SLUICE_TESTBED_DIR", "/var/tmp/sluice-testbed");
    std::fs::read_to_string(format!("{dir}/clickhouse-cluster/node{n}/pid"))
        .expect("the test bed's cluster (deploy/testbed.sh start clickhouse-cluster)")
        .trim()
        .parse()
        .unwrap()
}

async fn until(
    what: &str,
    limit: Duration,
    mut done: impl AsyncFnMut() -> bool,
) -> Result<(), String> {
    let t0 = Instant::now();
    while !done().await {
        if t0.elapsed() > limit {
            return Err(format!("{what}: not within {limit:?}"));
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    Ok(())
}

/// Stop the processes and panic with `why` and their logs.
fn fail(why: String, processes: &mut [&mut CaptureProcess]) -> ! {
    let logs: Vec<String> = processes.iter_mut().map(|p| p.stop().1).collect();
    panic!("{why}\nlogs:\n{}", logs.join("\n----\n"));
}

async fn run(distributed: bool, to_shards: bool) {
    let nodes = nodes();
    let (cluster, path) = if distributed {
        (
            var("SLUICE_CLICKHOUSE_CLUSTER_SHARDED", "sluice_cluster"),
            "/clickhouse/tables/{shard}/{database}/{table}".to_string(),
        )
    } else {
        (
            var("SLUICE_CLICKHOUSE_CLUSTER_REPLICATED", "sluice_replicated"),
            var(
                "SLUICE_CLICKHOUSE_CLUSTER_PATH",
                "/clickhouse/tables/{replicated_shard}/{database}/{table}",
            ),
        )
    };
    let db = unique(if to_shards {
        "sluice_t_straight"
    } else if distributed {
        "sluice_t_shards"
    } else {
        "sluice_t_replicas"
    });
    let ch_db = format!("{db}_m");
    let mut c = mysql_async::Conn::new(mysql_async::Opts::from_url(&mysql_url()).unwrap())
        .await
        .unwrap();
    c.query_drop(format!("CREATE DATABASE `{db}`"))
        .await
        .unwrap();
    c.query_drop(w1_create_table(&db)).await.unwrap();
    ddl(
        &nodes[0],
        &format!("CREATE DATABASE {ch_db} ON CLUSTER {cluster}"),
    )
    .await;

    let mut cap = CaptureProcess::spawn(CaptureProcess::config(&db, &binlog_end().await, ""));
    let group = unique("g");
    // The sharded tables with a partition key and a sort key of their own.
    let t = "binlog_field_test_1";
    let overrides = if distributed {
        format!(
            "[tables.partition_by]\n\"{db}.{t}\" = \"intDiv(id, 200)\"\n\
             [tables.order_by]\n\"{db}.{t}\" = \"(intDiv(id, 100), id)\"\n"
        )
    } else {
        String::new()
    };
    // Straight to the shards: each shard's URL, in the cluster's shard order.
    let write = if to_shards {
        format!(
            "write = \"shards\"\nshards = [[\"{}\"], [\"{}\"]]\n",
            nodes[0], nodes[1]
        )
    } else {
        String::new()
    };
    let section = format!(
        "[cluster]\nname = \"{cluster}\"\nzookeeper_path = \"{path}\"\ndistributed = {distributed}\n{write}{overrides}"
    );
    // Straight to the shards, a table whose Distributed table is sharded otherwise (as an
    // earlier version made it, by cityHash64 of the key) cannot be written: it stops, naming
    // the engine and the remedy, and the other table flows.
    let older = "older";
    if to_shards {
        c.query_drop(format!(
            "CREATE TABLE `{db}`.{older} (id INT PRIMARY KEY, v INT NOT NULL)"
        ))
        .await
        .unwrap();
        ddl(
            &nodes[0],
            &format!(
                "CREATE TABLE {ch_db}.{older}_local ON CLUSTER {cluster} (id Int32, v Int32, \
                 _version UInt64, _deleted UInt8) ENGINE = ReplicatedReplacingMergeTree('{path}', \
                 '{{replica}}', _version) ORDER BY id"
            ),
        )
        .await;
        ddl(
            &nodes[0],
            &format!(
                "CREATE TABLE {ch_db}.{older} ON CLUSTER {cluster} AS {ch_db}.{older}_local \
                 ENGINE = Distributed({cluster}, {ch_db}, {older}_local, cityHash64(id))"
            ),
        )
        .await;
        c.query_drop(format!(
            "INSERT INTO `{db}`.{older} VALUES (1, 10), (2, 20), (3, 30)"
        ))
        .await
        .unwrap();
    }
    let mut appliers = [
        applier(&cap.prefix, &nodes[0], &ch_db, &group, "a", &section),
        applier(&cap.prefix, &nodes[1], &ch_db, &group, "b", &section),
    ];
    for b in 0..4 {
        c.query_drop(w1_insert(&db, 1 + b * 100, 100))
            .await
            .unwrap();
    }
    c.query_drop(format!(
        "UPDATE `{db}`.{t} SET testvarchar = concat('u', id), testint = id * 3 WHERE id % 7 = 0"
    ))
    .await
    .unwrap();
    c.query_drop(format!("DELETE FROM `{db}`.{t} WHERE id % 11 = 0"))
        .await
        .unwrap();
    let want = source_rows(&db).await;
    for url in &nodes {
        if let Err(e) = until(
            &format!("{url}: the first rows"),
            Duration::from_secs(120),
            async || live_rows(url, &ch_db, t).await == want,
        )
        .await
        {
            let [a, b] = &mut appliers;
            fail(e, &mut [a, b, &mut cap]);
        }
    }
    let create = text(
        &nodes[1],
        &format!(
            "SELECT engine_full FROM system.tables WHERE database = '{ch_db}' AND name = '{t}'"
        ),
    )
    .await;
    if distributed {
        assert!(create.starts_with("Distributed("), "{create}");
        assert!(
            create.contains("_shard)"),
            "sharded by the shard column: {create}"
        );
        let local = text(
            &nodes[1],
            &format!(
                "SELECT engine_full FROM system.tables WHERE database = '{ch_db}' AND name = '{t}_local'"
            ),
        )
        .await;
        assert!(
            local.starts_with("ReplicatedReplacingMergeTree("),
            "{local}"
        );
        assert!(
            local.contains("PARTITION BY intDiv(id, 200) ORDER BY (intDiv(id, 100), id)"),
            "{local}"
        );
    } else {
        assert!(
            create.starts_with("ReplicatedReplacingMergeTree("),
            "{create}"
        );
    }

    let own_cluster = var("SLUICE_CLICKHOUSE_CLUSTER_URLS", TESTBED_NODES) == TESTBED_NODES;
    if !distributed && !own_cluster {
        eprintln!("a cluster of one's own: no replica is stopped (the test bed's only)");
    }
    // One replica stopped (its applier waits for it) before a schema change, while rows go
    // on arriving: the other applier's ALTER ... ON CLUSTER waits in the cluster's DDL queue
    // for it; started again, it runs the ALTER and catches up from the other replica.
    let stopped = !distributed && own_cluster;
    if stopped {
        let pid = node_pid(2);
        assert!(std::process::Command::new("kill")
            .args(["-TERM", &pid.to_string()])
            .status()
            .unwrap()
            .success());
        until(
            "the second server stopped",
            Duration::from_secs(60),
            async || !std::path::Path::new(&format!("/proc/{pid}")).exists(),
        )
        .await
        .unwrap();
    }
    // A schema change while rows flow: the new column on every server (and in the Distributed
    // table), with its values.
    c.query_drop(format!(
        "ALTER TABLE `{db}`.{t} ADD COLUMN extra INT NOT NULL DEFAULT 7"
    ))
    .await
    .unwrap();
    c.query_drop(w1_insert(&db, 401, 100)).await.unwrap();
    c.query_drop(format!("UPDATE `{db}`.{t} SET extra = id WHERE id % 5 = 0"))
        .await
        .unwrap();
    c.query_drop(w1_insert(&db, 501, 100)).await.unwrap();
    c.query_drop(format!("DELETE FROM `{db}`.{t} WHERE id % 13 = 0"))
        .await
        .unwrap();
    if stopped {
        // The ALTER reached the running server's applier, which is waiting for the other.
        let first = &nodes[0];
        if let Err(e) = until(
            "the ALTER in the cluster's DDL queue",
            Duration::from_secs(60),
            async || {
                number(
                    first,
                    &format!(
                        "SELECT count() FROM system.columns WHERE database = '{ch_db}' AND \
                         table = '{t}' AND name = 'extra'"
                    ),
                )
                .await
                    == 1
            },
        )
        .await
        {
            let [a, b] = &mut appliers;
            fail(e, &mut [a, b, &mut cap]);
        }
        tokio::time::sleep(Duration::from_secs(3)).await;
        sluice_tests::faults::testbed(&["start", "clickhouse-cluster"]);
    }

    let want = source_rows(&db).await;
    for url in &nodes {
        if let Err(e) = until(
            &format!("{url}: every row"),
            Duration::from_secs(180),
            async || live_rows(url, &ch_db, t).await == want,
        )
        .await
        {
            let [a, b] = &mut appliers;
            fail(e, &mut [a, b, &mut cap]);
        }
    }
    for url in &nodes {
        let n = number(
            url,
            &format!(
                "SELECT count() FROM system.columns WHERE database = '{ch_db}' AND table = '{t}' \
                 AND name = 'extra'"
            ),
        )
        .await;
        assert_eq!(n, 1, "{url}: the added column");
    }
    // Each server's copy (or the Distributed table read through it) equals the source, value
    // by value.
    // (The W1 table only: the older table of the shards run is stopped, checked below.)
    let w1 = format!("{db}.{t}");
    for a in &appliers {
        let (code, report, err) = sluice_tests::capture::verify(&cap, a, &["--table", &w1]);
        assert_eq!(code, Some(0), "{report:#}\n{err}");
        assert_eq!(report["result"], "equal", "{report:#}");
    }
    if distributed {
        // Every row on one shard only: the shards' rows add up to the whole, keys apart.
        let mut per_shard = 0;
        for url in &nodes {
            let n = number(url, &format!("SELECT uniqExact(id) FROM {ch_db}.{t}_local")).await;
            assert!(n > 0, "{url}: a shard without rows");
            per_shard += n;
        }
        let all = number(&nodes[0], &format!("SELECT uniqExact(id) FROM {ch_db}.{t}")).await;
        assert_eq!(per_shard, all, "a key on both shards");
        // Each row on the shard its shard column names (weights 1 and 1: `_shard % 2`), the
        // same whether ClickHouse's Distributed table routed it or the stage wrote it to the
        // shard itself.
        for (i, url) in nodes.iter().enumerate() {
            let elsewhere = number(
                url,
                &format!("SELECT count() FROM {ch_db}.{t}_local WHERE _shard % 2 != {i}"),
            )
            .await;
            assert_eq!(elsewhere, 0, "{url}: rows of the other shard");
        }
    }
    if to_shards {
        let sql = format!("SELECT target, reason FROM {ch_db}._sluice_stopped");
        let mut rows = String::new();
        let found = until(
            "the older table stopped",
            Duration::from_secs(60),
            async || {
                rows = client(&nodes[0])
                    .query(&sql)
                    .fetch_all::<(String, String)>()
                    .await
                    .map(|r| format!("{r:?}"))
                    .unwrap_or_default();
                rows.contains(older)
            },
        )
        .await;
        if let Err(e) = found {
            let [a, b] = &mut appliers;
            fail(e, &mut [a, b, &mut cap]);
        }
        assert!(
            rows.contains(&format!(
                "cluster.write = \\\"shards\\\" cannot write {older}: it is sharded by \\\"cityHash64(id)\\\""
            )) && rows.contains("Remedy: make it again"),
            "{rows}"
        );
        let written = number(&nodes[0], &format!("SELECT count() FROM {ch_db}.{older}")).await;
        assert_eq!(written, 0, "rows written into a table sharded otherwise");
    }
    for a in appliers.iter_mut() {
        let log = a.stop_ok();
        assert_eq!(
            log.contains("writing straight to the shards"),
            to_shards,
            "where the rows went: {log}"
        );
    }
    cap.stop_ok();
    c.query_drop(format!("DROP DATABASE `{db}`")).await.unwrap();
}

// One test, the two clusters one after the other: the first stops a server of both.
#[tokio::test(flavor = "multi_thread")]
async fn two_appliers_keep_each_replica_and_a_distributed_table_equal_to_the_source() {
    run(false, false).await;
    run(true, false).await;
    run(true, true).await;
}
