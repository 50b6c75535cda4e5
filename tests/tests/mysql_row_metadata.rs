//! Global binlog settings the capture cannot follow, changed under a running capture:
//! `binlog_row_metadata` other than FULL on a server that has the setting (MariaDB 10.5+, MySQL
//! 8.0+), and MariaDB's `log_bin_compress`. The capture refuses to start with either, and a
//! capture that is running when someone changes it stops before decoding a row it cannot read
//! exactly. The settings are global, so this binary holds these tests alone (cargo runs test
//! binaries one after another), runs them one at a time, and sets them back whatever happens;
//! and only on the test bed's own MariaDB: given another server (`SLUICE_MYSQL_URL`), they say
//! they are skipped.

use std::time::Duration;

use mysql_async::prelude::Queryable;
use sluice_tests::capture::{binlog_end, CaptureProcess};
use sluice_tests::{bin, mysql_url, unique};

use sluice_tests::to_clickhouse::mysql as conn;

/// One test at a time: each changes the server's global settings.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Sets `binlog_row_metadata` back to FULL and `log_bin_compress` off when dropped, even after a
/// failed assertion.
struct Restore;

impl Drop for Restore {
    fn drop(&mut self) {
        let url = mysql_url();
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                let mut c = mysql_async::Conn::new(mysql_async::Opts::from_url(&url).unwrap())
                    .await
                    .unwrap();
                c.query_drop(
                    "SET GLOBAL binlog_row_metadata = 'FULL'; SET GLOBAL log_bin_compress = OFF; \
                     SET GLOBAL log_bin_compress_min_len = DEFAULT",
                )
                .await
                .unwrap();
            })
        })
        .join()
        .unwrap();
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn row_metadata_other_than_full_is_refused_at_start_and_while_running() {
    if !sluice_tests::faults::testbed_mysql() {
        println!(
            "skipped: it changes the server's global settings, and SLUICE_MYSQL_URL names a \
             server the test bed did not start"
        );
        return;
    }
    let _one = ONE_AT_A_TIME.lock().await;
    let db = unique("sluice_t_rowmeta");
    let mut c = conn().await;
    c.query_drop(format!(
        "CREATE DATABASE `{db}`; CREATE TABLE `{db}`.t (id INT PRIMARY KEY, u INT UNSIGNED)"
    ))
    .await
    .unwrap();
    let mut capture = CaptureProcess::spawn(CaptureProcess::config(&db, &binlog_end().await, ""));
    c.query_drop(format!("INSERT INTO `{db}`.t VALUES (1, 4294967295)"))
        .await
        .unwrap();
    let topic = capture.topic(&db, "t");
    let first = tokio::task::spawn_blocking(move || {
        sluice_tests::capture::read_events(&topic, Duration::from_secs(60), |m| {
            sluice_tests::capture::count_rows(m) >= 1
        })
    })
    .await
    .unwrap();
    assert_eq!(sluice_tests::capture::count_rows(&first), 1);

    let _restore = Restore;
    c.query_drop("SET GLOBAL binlog_row_metadata = 'MINIMAL'")
        .await
        .unwrap();
    c.query_drop(format!("INSERT INTO `{db}`.t VALUES (2, 5)"))
        .await
        .unwrap();
    let (code, log) = capture.wait(Duration::from_secs(60));
    assert_eq!(code, Some(1), "the capture stops: {log}");
    assert!(
        log.contains("has no column names")
            && log.contains("binlog_row_metadata was set to other than FULL"),
        "{log}"
    );
    // Nothing was decoded with today's columns: the second row was not published.
    let topic = capture.topic(&db, "t");
    let events = tokio::task::spawn_blocking(move || {
        sluice_tests::capture::read_events(&topic, Duration::from_secs(3), |_| false)
    })
    .await
    .unwrap();
    assert_eq!(sluice_tests::capture::count_rows(&events), 1);

    // And a capture does not start on such a server.
    let (code, text) = check(&CaptureProcess::config(&db, "end", ""));
    assert_eq!(code, Some(1), "{text}");
    assert!(
        text.contains("binlog_row_metadata is MINIMAL, must be FULL"),
        "{text}"
    );
    drop(_restore);
    c.query_drop(format!("DROP DATABASE `{db}`")).await.unwrap();
}

/// `capture-mysql --check` with the configuration `config`: its exit code and output.
fn check(config: &(String, String, String)) -> (Option<i32>, String) {
    let file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(file.path(), &config.0).unwrap();
    let out = std::process::Command::new(bin("capture-mysql"))
        .args(["--check", "-c", file.path().to_str().unwrap()])
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.code(), text)
}

/// MariaDB's `log_bin_compress`: refused at start, and a running capture stops at the first
/// compressed event, naming the setting, with nothing of it published.
#[tokio::test(flavor = "multi_thread")]
async fn compressed_binlog_events_are_refused_at_start_and_while_running() {
    if !sluice_tests::faults::testbed_mysql() {
        println!(
            "skipped: it changes the server's global settings, and SLUICE_MYSQL_URL names a \
             server the test bed did not start"
        );
        return;
    }
    let _one = ONE_AT_A_TIME.lock().await;
    let mut c = conn().await;
    let has: Vec<(String, String)> = c
        .query("SHOW GLOBAL VARIABLES LIKE 'log_bin_compress'")
        .await
        .unwrap();
    if has.is_empty() {
        eprintln!("the server has no log_bin_compress (not MariaDB): nothing to test");
        return;
    }
    let db = unique("sluice_t_compress");
    c.query_drop(format!(
        "CREATE DATABASE `{db}`; CREATE TABLE `{db}`.t (id INT PRIMARY KEY, v VARCHAR(200))"
    ))
    .await
    .unwrap();
    let mut capture = CaptureProcess::spawn(CaptureProcess::config(&db, &binlog_end().await, ""));
    c.query_drop(format!("INSERT INTO `{db}`.t VALUES (1, 'plain')"))
        .await
        .unwrap();
    let topic = capture.topic(&db, "t");
    let first = tokio::task::spawn_blocking(move || {
        sluice_tests::capture::read_events(&topic, Duration::from_secs(60), |m| {
            sluice_tests::capture::count_rows(m) >= 1
        })
    })
    .await
    .unwrap();
    assert_eq!(sluice_tests::capture::count_rows(&first), 1);

    // (made before compression is on: its statements would be compressed too)
    let other = format!("{db}_other");
    c.query_drop(format!(
        "CREATE DATABASE `{other}`; CREATE TABLE `{other}`.u (id INT PRIMARY KEY, v VARCHAR(200))"
    ))
    .await
    .unwrap();
    let _restore = Restore;
    // Events of 10 bytes and more are compressed (the server's smallest threshold).
    c.query_drop("SET GLOBAL log_bin_compress_min_len = 10; SET GLOBAL log_bin_compress = ON")
        .await
        .unwrap();
    // A new session: the setting is read when a session starts writing. Its compressed rows
    // of a table outside the capture's filter are not the capture's: it reads on.
    let mut w = conn().await;
    w.query_drop(format!(
        "INSERT INTO `{other}`.u VALUES (1, '{}')",
        "compressible ".repeat(10)
    ))
    .await
    .unwrap();
    drop(w);
    c.query_drop("SET GLOBAL log_bin_compress = OFF")
        .await
        .unwrap();
    let mut w = conn().await;
    w.query_drop(format!(
        "INSERT INTO `{db}`.t VALUES (3, 'after the other')"
    ))
    .await
    .unwrap();
    drop(w);
    let topic = capture.topic(&db, "t");
    let passed = tokio::task::spawn_blocking(move || {
        sluice_tests::capture::read_events(&topic, Duration::from_secs(60), |m| {
            sluice_tests::capture::count_rows(m) >= 2
        })
    })
    .await
    .unwrap();
    assert_eq!(
        sluice_tests::capture::count_rows(&passed),
        2,
        "the capture read past the compressed rows of a table it does not capture"
    );
    // Its own table's compressed rows stop it, naming the setting and how to move past them.
    c.query_drop("SET GLOBAL log_bin_compress = ON")
        .await
        .unwrap();
    let mut w = conn().await;
    w.query_drop(format!(
        "INSERT INTO `{db}`.t VALUES (2, '{}')",
        "compressible ".repeat(10)
    ))
    .await
    .unwrap();
    drop(w);
    let (code, log) = capture.wait(Duration::from_secs(60));
    assert_eq!(code, Some(1), "the capture stops: {log}");
    assert!(
        log.contains("compressed MariaDB binlog event") && log.contains("log_bin_compress=OFF"),
        "{log}"
    );
    let command = format!(
        "sluice position set --connector {} --binlog ",
        capture.connector
    );
    let past = log
        .split(&command)
        .nth(1)
        .and_then(|rest| rest.split('`').next())
        .unwrap_or_else(|| panic!("no `{command}...` in {log}"))
        .to_string();
    let topic = capture.topic(&db, "t");
    let events = tokio::task::spawn_blocking(move || {
        sluice_tests::capture::read_events(&topic, Duration::from_secs(3), |_| false)
    })
    .await
    .unwrap();
    assert_eq!(
        sluice_tests::capture::count_rows(&events),
        2,
        "nothing of the compressed transaction is published"
    );
    let (code, text) = check(&CaptureProcess::config(&db, "end", ""));
    assert_eq!(code, Some(1), "{text}");
    assert!(
        text.contains("log_bin_compress is ON") && text.contains("set log_bin_compress=OFF"),
        "{text}"
    );
    drop(_restore);
    // The command the message names moves past it: the next row arrives.
    // (taken once the stopped capture's last checkpoint is 30 s old)
    let stopped = std::time::Instant::now();
    loop {
        let (code, out, err) = sluice_tests::capture::sluice(&[
            "position",
            "set",
            "--connector",
            &capture.connector,
            "--binlog",
            &past,
        ]);
        if code == Some(0) {
            break;
        }
        assert!(
            err.contains("a capture of it is running")
                && stopped.elapsed() < Duration::from_secs(60),
            "{out}{err}"
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    c.query_drop(format!("INSERT INTO `{db}`.t VALUES (4, 'past it')"))
        .await
        .unwrap();
    capture.restart();
    let topic = capture.topic(&db, "t");
    let events = tokio::task::spawn_blocking(move || {
        sluice_tests::capture::read_events(&topic, Duration::from_secs(60), |m| {
            sluice_tests::capture::count_rows(m) >= 3
        })
    })
    .await
    .unwrap();
    assert_eq!(
        sluice_tests::capture::count_rows(&events),
        3,
        "row 4 after the skip"
    );
    capture.stop_ok();
    c.query_drop(format!("DROP DATABASE `{other}`"))
        .await
        .unwrap();
    c.query_drop(format!("DROP DATABASE `{db}`")).await.unwrap();
}
