//! A ClickHouse server of a test's own (from the test bed's `clickhouse-server` binary), for
//! tests that stop and start the target while the pipeline runs.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::free_port;

pub struct PrivateClickHouse {
    bin: &'static str,
    dir: tempfile::TempDir,
    pub http_port: u16,
    child: Option<Child>,
}

impl PrivateClickHouse {
    /// `None` when no `clickhouse-server` binary is installed here.
    pub fn start() -> Option<Self> {
        let bin = ["/usr/sbin/clickhouse-server", "/usr/bin/clickhouse-server"]
            .into_iter()
            .find(|p| std::path::Path::new(p).exists())?;
        let dir = tempfile::tempdir().unwrap();
        let http_port = free_port();
        let tcp_port = free_port();
        let d = dir.path().display().to_string();
        std::fs::write(
            dir.path().join("users.xml"),
            "<?xml version=\"1.0\"?><yandex><profiles><default></default></profiles>\
             <users><default><password></password><networks><ip>::/0</ip></networks>\
             <profile>default</profile><quota>default</quota></default></users>\
             <quotas><default></default></quotas></yandex>",
        )
        .unwrap();
        std::fs::write(
            dir.path().join("config.xml"),
            format!(
                "<?xml version=\"1.0\"?><yandex>\
                 <logger><level>warning</level><log>{d}/server.log</log><errorlog>{d}/error.log</errorlog></logger>\
                 <listen_host>127.0.0.1</listen_host><http_port>{http_port}</http_port>\
                 <tcp_port>{tcp_port}</tcp_port><path>{d}/data/</path><tmp_path>{d}/tmp/</tmp_path>\
                 <user_files_path>{d}/files/</user_files_path><users_config>{d}/users.xml</users_config>\
                 <default_profile>default</default_profile><default_database>default</default_database>\
                 <mark_cache_size>67108864</mark_cache_size><mlock_executable>false</mlock_executable>\
                 </yandex>"
            ),
        )
        .unwrap();
        let mut ch = Self {
            bin,
            dir,
            http_port,
            child: None,
        };
        ch.resume();
        Some(ch)
    }

    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.http_port)
    }

    /// Start (again) and wait until it answers.
    pub fn resume(&mut self) {
        let config = self.dir.path().join("config.xml");
        let child = Command::new(self.bin)
            .arg(format!("--config-file={}", config.display()))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start clickhouse-server");
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Ok(out) = Command::new("curl")
                .args(["-fsS", &format!("{}/ping", self.url())])
                .output()
            {
                if out.status.success() {
                    return;
                }
            }
            assert!(
                Instant::now() < deadline,
                "private ClickHouse did not start"
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// Stop it (kill -9: an outage, not a maintenance window).
    pub fn pause(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for PrivateClickHouse {
    fn drop(&mut self) {
        self.pause();
    }
}
