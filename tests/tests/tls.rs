//! TLS and authentication on every server of the test bed that has them: MariaDB with a user
//! that `REQUIRE SSL`, Kafka's SASL_SSL listener with SCRAM users, ClickHouse 18.16 over HTTPS
//! with a password (`deploy/testbed.sh` makes the CA and the certificates). End to end first,
//! then each way to get it wrong, refused at start by `--check` with a message that names the
//! server and the cause.
//!
//! Needs the test bed's TLS folder (`SLUICE_TLS_DIR`), its SASL listener
//! (`SLUICE_KAFKA_SASL_BROKERS`) and its HTTPS ClickHouse (`SLUICE_CLICKHOUSE_HTTPS_URL`);
//! without them the tests say so and pass nothing off as tested.

use std::process::Command;
use std::time::{Duration, Instant};

use mysql_async::prelude::Queryable;
use sluice_tests::capture::{binlog_end, CaptureProcess};
use sluice_tests::{bin, clickhouse_url, mysql_url, replica_server_id, tls_dir, unique};

struct Bed {
    tls: String,
    sasl_brokers: String,
    ch_https: String,
    mysql_host_port: String,
}

fn bed() -> Option<Bed> {
    let tls = tls_dir()?;
    let sasl_brokers = std::env::var("SLUICE_KAFKA_SASL_BROKERS").ok()?;
    let ch_https = std::env::var("SLUICE_CLICKHOUSE_HTTPS_URL").ok()?;
    let url = mysql_url();
    let mysql_host_port = url.rsplit('@').next().unwrap().to_string();
    Some(Bed {
        tls,
        sasl_brokers,
        ch_https,
        mysql_host_port,
    })
}

fn skip(test: &str) {
    eprintln!("{test}: the test bed's TLS servers are not known (SLUICE_TLS_DIR, SLUICE_KAFKA_SASL_BROKERS, SLUICE_CLICKHOUSE_HTTPS_URL): not run");
}

/// `[kafka]` over SASL_SSL with SCRAM-SHA-512, the password from a file.
fn kafka_section(b: &Bed, password_file: &std::path::Path, ca: &str) -> String {
    format!(
        "[kafka]\nbrokers = \"{}\"\nsecurity_protocol = \"sasl_ssl\"\n\
         sasl_mechanism = \"SCRAM-SHA-512\"\nsasl_username = \"scramuser\"\n\
         sasl_password_file = \"{}\"\nssl_ca = \"{}/{ca}\"\n",
        b.sasl_brokers,
        password_file.display(),
        b.tls
    )
}

fn secret_file(dir: &tempfile::TempDir, name: &str, secret: &str) -> std::path::PathBuf {
    let p = dir.path().join(name);
    std::fs::write(&p, format!("{secret}\n")).unwrap();
    p
}

/// `binary --check` with this config: its exit code and what it printed.
fn check(binary: &str, config: &str) -> (Option<i32>, String) {
    let f = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(f.path(), config).unwrap();
    let out = Command::new(bin(binary))
        .args(["-c", f.path().to_str().unwrap(), "--check"])
        .output()
        .unwrap();
    (
        out.status.code(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn mariadb_to_clickhouse_over_tls_with_authentication_everywhere() {
    let Some(b) = bed() else {
        return skip("mariadb_to_clickhouse_over_tls_with_authentication_everywhere");
    };
    let secrets = tempfile::tempdir().unwrap();
    let kafka_pw = secret_file(&secrets, "kafka", "scram-Secret#3");
    let ch_pw = secret_file(&secrets, "clickhouse", "ch-Secret#4");
    let db = unique("sluice_tls");
    let ch_db = format!("{db}_m");
    let mut c = mysql_async::Conn::new(mysql_async::Opts::from_url(&mysql_url()).unwrap())
        .await
        .unwrap();
    c.query_drop(format!("CREATE DATABASE `{db}`"))
        .await
        .unwrap();
    c.query_drop(format!(
        "CREATE TABLE `{db}`.t (id INT PRIMARY KEY, s VARCHAR(20) NOT NULL)"
    ))
    .await
    .unwrap();
    let ch = clickhouse::Client::default()
        .with_url(clickhouse_url())
        .with_validation(false);
    ch.query(&format!("CREATE DATABASE {ch_db}"))
        .execute()
        .await
        .unwrap();
    let (connector, prefix) = (unique("conn"), unique("cdc"));
    // The password has '#' and '@': given as its own key, it needs no URL encoding.
    let capture_config = format!(
        "connector = \"{connector}\"\n[mysql]\nurl = \"mysql://{}\"\nuser = \"sluice_tls\"\n\
         password = \"tls-Secret#1@x\"\nssl_ca = \"{}/ca.pem\"\nstart = \"{}\"\nserver_id = {}\n\
         [filter]\ninclude = [\"{db}\\\\..*\"]\n[topics]\nprefix = \"{prefix}\"\n\
         [publish]\npartitions = 1\nreplication_factor = 1\n{}",
        b.mysql_host_port,
        b.tls,
        binlog_end().await,
        replica_server_id(),
        kafka_section(&b, &kafka_pw, "ca.pem")
    );
    let (code, out) = check("capture-mysql", &capture_config);
    assert_eq!(code, Some(0), "capture-mysql --check over TLS:\n{out}");
    let mut cap =
        CaptureProcess::spawn_binary("capture-mysql", (capture_config, connector, prefix.clone()));
    let apply_config = format!(
        "[clickhouse]\nurl = \"{}\"\nuser = \"sluice_tls\"\npassword_file = \"{}\"\n\
         ssl_ca = \"{}/ca.pem\"\ndatabase = \"{ch_db}\"\n\
         [consumer]\ngroup_id = \"{}\"\ntopics = [\"^{}\\\\..*\"]\n[batch]\nmax_wait_ms = 200\n{}",
        b.ch_https,
        ch_pw.display(),
        b.tls,
        unique("g"),
        prefix.replace('.', "\\\\."),
        kafka_section(&b, &kafka_pw, "ca.pem")
    );
    let (code, out) = check("apply-clickhouse", &apply_config);
    assert_eq!(code, Some(0), "apply-clickhouse --check over TLS:\n{out}");
    let mut apply = CaptureProcess::spawn_binary(
        "apply-clickhouse",
        (apply_config, String::new(), String::new()),
    );
    for i in 1..=50 {
        c.query_drop(format!("INSERT INTO `{db}`.t VALUES ({i}, 'r{i}')"))
            .await
            .unwrap();
    }
    c.query_drop(format!("UPDATE `{db}`.t SET s = 'u' WHERE id <= 10"))
        .await
        .unwrap();
    c.query_drop(format!("DELETE FROM `{db}`.t WHERE id > 45"))
        .await
        .unwrap();
    let want: Vec<(i32, String)> = c
        .query(format!("SELECT id, s FROM `{db}`.t ORDER BY id"))
        .await
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let got: Vec<(i32, String)> = ch
            .query(&format!(
                "SELECT id, s FROM {ch_db}.t FINAL WHERE _deleted = 0 ORDER BY id"
            ))
            .fetch_all()
            .await
            .unwrap_or_default();
        if got == want {
            break;
        }
        if Instant::now() > deadline {
            let (_, lc) = cap.stop();
            let (_, la) = apply.stop();
            panic!(
                "the mirror never equalled the source ({} of {} rows):\n{lc}\n---\n{la}",
                got.len(),
                want.len()
            );
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    for p in [&mut cap, &mut apply] {
        p.stop_ok();
    }
    c.query_drop(format!("DROP DATABASE `{db}`")).await.unwrap();
}

/// Each way to get TLS or authentication wrong is refused by `--check`, naming the server and
/// the cause.
#[tokio::test(flavor = "multi_thread")]
async fn wrong_ca_name_password_or_privilege_are_refused_at_start_and_named() {
    let Some(b) = bed() else {
        return skip("wrong_ca_name_password_or_privilege_are_refused_at_start_and_named");
    };
    let secrets = tempfile::tempdir().unwrap();
    let good_kafka = secret_file(&secrets, "kafka", "scram-Secret#3");
    let bad_kafka = secret_file(&secrets, "kafka-bad", "not-the-password");
    let mysql = |user: &str, password: &str, host: &str, tls: &str| {
        format!(
            "[mysql]\nurl = \"mysql://{host}\"\nuser = \"{user}\"\npassword = \"{password}\"\n{tls}\
             server_id = {}\n{}",
            replica_server_id(),
            kafka_section(&b, &good_kafka, "ca.pem")
        )
    };
    let hp = b.mysql_host_port.clone();
    let ca = format!("ssl_ca = \"{}/ca.pem\"\n", b.tls);
    let other_ca = format!("ssl_ca = \"{}/other-ca.pem\"\n", b.tls);
    let localhost_hp = hp.replace("127.0.0.1", "localhost");
    let cases: Vec<(&str, String, &str, Vec<&str>)> = vec![
        (
            "MariaDB, a CA that did not sign its certificate",
            mysql("sluice_tls", "tls-Secret#1@x", &hp, &other_ca),
            "capture-mysql",
            vec![
                "mysql",
                "not signed by a CA this capture trusts",
                "mysql.ssl_ca",
            ],
        ),
        (
            "MariaDB, no TLS for a user that requires it",
            mysql(
                "sluice_tls",
                "tls-Secret#1@x",
                &hp,
                "ssl_mode = \"disabled\"\n",
            ),
            "capture-mysql",
            vec!["mysql", "Access denied"],
        ),
        (
            "MariaDB, a wrong password",
            mysql("sluice_tls", "not-the-password", &hp, &ca),
            "capture-mysql",
            vec!["mysql", "a wrong password"],
        ),
        (
            "MariaDB, a user without REPLICATION SLAVE",
            mysql("sluice_norepl", "norepl-secret", &hp, &ca),
            "capture-mysql",
            vec!["privileges", "binlog dump", "GRANT REPLICATION SLAVE"],
        ),
        (
            "MariaDB by an address its certificate does not name (127.0.0.2)",
            mysql(
                "sluice_tls",
                "tls-Secret#1@x",
                &hp.replace("127.0.0.1", "127.0.0.2"),
                &ca,
            ),
            "capture-mysql",
            vec!["mysql", "does not name the host of mysql.url"],
        ),
        (
            "MariaDB by a name its certificate holds (localhost): accepted",
            mysql("sluice_tls", "tls-Secret#1@x", &localhost_hp, &ca),
            "capture-mysql",
            vec![],
        ),
        (
            "Kafka, a wrong SCRAM password",
            format!(
                "[clickhouse]\nurl = \"{}\"\nuser = \"sluice_tls\"\npassword = \"ch-Secret#4\"\n\
                 ssl_ca = \"{}/ca.pem\"\n{}",
                b.ch_https,
                b.tls,
                kafka_section(&b, &bad_kafka, "ca.pem")
            ),
            "apply-clickhouse",
            vec!["kafka", "Authentication failed"],
        ),
        (
            "Kafka, a CA that did not sign the broker's certificate",
            format!(
                "[clickhouse]\nurl = \"{}\"\nuser = \"sluice_tls\"\npassword = \"ch-Secret#4\"\n\
                 ssl_ca = \"{}/ca.pem\"\n{}",
                b.ch_https,
                b.tls,
                kafka_section(&b, &good_kafka, "other-ca.pem")
            ),
            "apply-clickhouse",
            vec!["kafka", "certificate verify failed"],
        ),
        (
            "ClickHouse, a wrong password",
            format!(
                "[clickhouse]\nurl = \"{}\"\nuser = \"sluice_tls\"\npassword = \"not-the-password\"\n\
                 ssl_ca = \"{}/ca.pem\"\n{}",
                b.ch_https,
                b.tls,
                kafka_section(&b, &good_kafka, "ca.pem")
            ),
            "apply-clickhouse",
            vec!["clickhouse", "a wrong user or password"],
        ),
        (
            "ClickHouse, a CA that did not sign its certificate",
            format!(
                "[clickhouse]\nurl = \"{}\"\nuser = \"sluice_tls\"\npassword = \"ch-Secret#4\"\n\
                 ssl_ca = \"{}/other-ca.pem\"\n{}",
                b.ch_https,
                b.tls,
                kafka_section(&b, &good_kafka, "ca.pem")
            ),
            "apply-clickhouse",
            vec![
                "clickhouse",
                "not signed by a CA trusted here",
                "clickhouse.ssl_ca",
            ],
        ),
        (
            "ClickHouse by an address its certificate does not name (127.0.0.2)",
            format!(
                "[clickhouse]\nurl = \"{}\"\nuser = \"sluice_tls\"\npassword = \"ch-Secret#4\"\n\
                 ssl_ca = \"{}/ca.pem\"\n{}",
                b.ch_https.replace("127.0.0.1", "127.0.0.2"),
                b.tls,
                kafka_section(&b, &good_kafka, "ca.pem")
            ),
            "apply-clickhouse",
            vec!["clickhouse", "does not name the host of clickhouse.url"],
        ),
        (
            "ClickHouse, public roots only (no ssl_ca)",
            format!(
                "[clickhouse]\nurl = \"{}\"\nuser = \"sluice_tls\"\npassword = \"ch-Secret#4\"\n{}",
                b.ch_https,
                kafka_section(&b, &good_kafka, "ca.pem")
            ),
            "apply-clickhouse",
            vec!["clickhouse", "not signed by a CA trusted here"],
        ),
    ];
    let mut failures = Vec::new();
    for (what, config, binary, want) in &cases {
        let (code, out) = check(binary, config);
        let ok = if want.is_empty() {
            code == Some(0)
        } else {
            code != Some(0) && want.iter().all(|w| out.contains(w))
        };
        if !ok {
            failures.push(format!(
                "{what}: exit {code:?}, expected {}{want:?}:\n{out}",
                if want.is_empty() {
                    "success"
                } else {
                    "a refusal naming "
                }
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}
