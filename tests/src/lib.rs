//! Helpers for the integration tests: where the servers are, unique names, the binaries.
//!
//! Every address comes from an environment variable, with the local test bed's address as the
//! default (`deploy/testbed.sh env` prints them), so the same tests run against real MySQL 8,
//! MongoDB replica sets or a current ClickHouse when given their URLs:
//!
//! | variable | default |
//! |---|---|
//! | `SLUICE_MYSQL_URL` | `mysql://sluice:sluice@127.0.0.1:13306` |
//! | `SLUICE_KAFKA_BROKERS` | `127.0.0.1:19092` |
//! | `SLUICE_CLICKHOUSE_URL` | `http://127.0.0.1:18123` |
//! | `SLUICE_MONGO_SOURCE_URL` | `mongodb://127.0.0.1:27117/?directConnection=true` |
//! | `SLUICE_MONGO_TARGET_URL` | `mongodb://127.0.0.1:27118/?directConnection=true` |
//!
//! Each test makes its own topic, group, database or collection ([`unique`]), so tests run side
//! by side and leave nothing that a later run could trip over.
//!
//! The setups tests share: [`capture`] (a stage's process, its checkpoint, a group's lag, the
//! `sluice` command), [`to_clickhouse`] (the W1 table's pipeline into ClickHouse, compared),
//! [`mongo`] (MongoDB pipelines, compared), [`mirror`], [`faults`], [`relay`], [`edge`] and the
//! private servers ([`private_mariadb`], [`private_clickhouse`], [`private_mongo`]).

use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

fn var(name: &str, default: &str) -> String {
    std::env::var(name)
        .ok()
        .filter(|v| !v.is_empty())
        .unwrap_or_else(|| default.to_string())
}

pub fn mysql_url() -> String {
    var("SLUICE_MYSQL_URL", "mysql://sluice:sluice@127.0.0.1:13306")
}
/// The `[mysql]` TLS keys for [`mysql_url`]'s server: its CA when the test bed's TLS folder is
/// known (`SLUICE_TLS_DIR`; the default `ssl_mode`, verify_identity, then checks the
/// server), else TLS off (a server of one's own without it).
pub fn mysql_tls() -> String {
    match std::env::var("SLUICE_TLS_DIR")
        .ok()
        .filter(|d| !d.is_empty())
    {
        Some(dir) => format!("ssl_ca = \"{dir}/ca.pem\"\n"),
        None => "ssl_mode = \"disabled\"\n".to_string(),
    }
}

/// The test bed's TLS folder (CA, certificates: `deploy/testbed.sh`).
pub fn tls_dir() -> Option<String> {
    std::env::var("SLUICE_TLS_DIR")
        .ok()
        .filter(|d| !d.is_empty())
}

pub fn kafka_brokers() -> String {
    var("SLUICE_KAFKA_BROKERS", "127.0.0.1:19092")
}
pub fn clickhouse_url() -> String {
    var("SLUICE_CLICKHOUSE_URL", "http://127.0.0.1:18123")
}
pub fn mongo_source_url() -> String {
    var(
        "SLUICE_MONGO_SOURCE_URL",
        "mongodb://127.0.0.1:27117/?directConnection=true",
    )
}
pub fn mongo_target_url() -> String {
    var(
        "SLUICE_MONGO_TARGET_URL",
        "mongodb://127.0.0.1:27118/?directConnection=true",
    )
}

/// mongo-java-server answers buildInfo without the `gitVersion` every MongoDB build reports.
pub async fn is_mongo_java_server(c: &mongodb::Client) -> bool {
    let info = c
        .database("admin")
        .run_command(mongodb::bson::doc! { "buildInfo": 1 })
        .await
        .expect("buildInfo");
    !info.contains_key("gitVersion")
}

/// A name no other test (of this run or an earlier one) uses: `<base>_<pid>_<n>_<time>`,
/// made only of `[a-z0-9_]`, so it is valid as a topic, database or collection name.
pub fn unique(base: &str) -> String {
    static N: AtomicU32 = AtomicU32::new(0);
    let t = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis()
        % 100_000_000;
    format!(
        "{base}_{}_{}_{t}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

/// The path of one of the workspace's binaries, built by `cargo build --workspace --bins`
/// (the test runner does that first) into the same target folder as this test.
pub fn bin(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    // target/<profile>/deps/<test> -> target/<profile>/<name>
    let dir = exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("target folder");
    let path = dir.join(name);
    assert!(
        path.exists(),
        "{} is missing: run `cargo build --workspace --bins` first",
        path.display()
    );
    path
}

/// The seed of a randomized test: `SLUICE_TEST_SEED` when set (to run a failure again), else
/// from the clock; printed, so that a failing run names it.
pub fn seed() -> u64 {
    let seed = std::env::var("SLUICE_TEST_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64
                | 1
        });
    eprintln!("SLUICE_TEST_SEED={seed}");
    seed
}

/// A TCP port that was free a moment ago, for a process under test to bind.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("bind a free port")
        .port()
}

/// `[kafka]` etc. sections pointing at the test servers, for the binaries' config files.
pub fn kafka_section() -> String {
    format!("[kafka]\nbrokers = \"{}\"\n", kafka_brokers())
}
pub mod capture;
pub mod edge;
pub mod faults;
pub mod mirror;
pub mod mongo;
pub mod private_clickhouse;
pub mod private_mariadb;
pub mod private_mongo;
pub mod relay;
pub mod scenario;
pub mod to_clickhouse;

/// An INSERT of W1 rows `from..from + n` (ids are the row numbers) into `db`.
pub fn w1_insert(db: &str, from: u64, n: u64) -> String {
    let values: Vec<String> = (from..from + n)
        .map(|k| {
            format!(
                "({k},'v{k}','c','en2','set1,set3','11:22:33','2024-01-02',2024,\
                 '2024-01-02 03:04:05','2024-01-02 03:04:05',1.25,2.5,{}.25,'text {k}','blob',\
                 b'101',1,'m','l','t',{},{},{},{},{k})",
                k % 1000,
                k % 256,
                k % 65536,
                k % 16_777_216,
                k
            )
        })
        .collect();
    format!(
        "INSERT INTO `{db}`.binlog_field_test_1 (id,testvarchar,testchar,testenum,testset,testtime,\
         testdate,testyear,testtimestamp,testdatetime,testfloat,testdouble,testdecimal,testtext,\
         testblob,testbit,testbool,testmediumblob,testlongblob,testtinyblob,test_unsinged_tinyint,\
         test_unsinged_smallint,test_unsinged_mediumint,test_unsinged_int,test_unsinged_bigint) \
         VALUES {}",
        values.join(",")
    )
}

/// The W1 table of the reference workload (`deploy/workloads/w1.mysql.sql`), in database `db`.
pub fn w1_create_table(db: &str) -> String {
    std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../deploy/workloads/w1.mysql.sql"
    ))
    .expect("deploy/workloads/w1.mysql.sql")
    .replace(
        "`binlog_field_test_1`",
        &format!("`{db}`.`binlog_field_test_1`"),
    )
}

/// `SLUICE_MYSQL_URL` with other credentials (the host, port and options kept).
pub fn mysql_url_as(user: &str, password: &str) -> String {
    let url = mysql_url();
    let rest = url.strip_prefix("mysql://").unwrap_or(&url);
    let host = rest.rsplit_once('@').map(|(_, h)| h).unwrap_or(rest);
    format!("mysql://{user}:{password}@{host}")
}

/// A replica server_id no other test uses at the same time (MariaDB refuses a second binlog
/// reader with the same id).
pub fn replica_server_id() -> u32 {
    use std::hash::{BuildHasher, Hasher};
    static N: AtomicU32 = AtomicU32::new(0);
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u32(std::process::id());
    h.write_u32(N.fetch_add(1, Ordering::Relaxed));
    100_000 + (h.finish() % 2_000_000_000) as u32
}

/// xorshift64*: small, and the same sequence for the same seed on every machine.
pub struct Rng(pub u64);

impl Rng {
    #[allow(clippy::should_implement_trait)]
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }

    pub fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
}
