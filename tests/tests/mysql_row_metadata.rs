//! `binlog_row_metadata` other than FULL on a server that has the setting (MariaDB 10.5+, MySQL
//! 8.0+): the capture refuses to start, and a capture that is running when someone changes it
//! stops at the first table map without column names, before decoding a row with today's
//! columns. The setting is global, so this binary holds this one test alone (cargo runs test
//! binaries one after another), and sets it back whatever happens.

use std::time::Duration;

use mysql_async::prelude::Queryable;
use sluice_tests::capture::{binlog_end, CaptureProcess};
use sluice_tests::{bin, mysql_url, unique};

async fn conn() -> mysql_async::Conn {
    mysql_async::Conn::new(mysql_async::Opts::from_url(&mysql_url()).unwrap())
        .await
        .unwrap()
}

/// Sets `binlog_row_metadata` back to FULL when dropped, even after a failed assertion.
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
                c.query_drop("SET GLOBAL binlog_row_metadata = 'FULL'")
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
    let config = CaptureProcess::config(&db, "end", "");
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
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(
        text.contains("binlog_row_metadata is MINIMAL, must be FULL"),
        "{text}"
    );
    drop(_restore);
    c.query_drop(format!("DROP DATABASE `{db}`")).await.unwrap();
}
