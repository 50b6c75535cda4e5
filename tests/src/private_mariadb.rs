//! MariaDB servers of a test's own (from the test bed's `mariadbd`), for tests that do what
//! the shared server must not see: replication between two servers, a fail-over, a server
//! killed. Each has its own data directory (deleted with it), port and server_id, the binlog
//! settings a capture needs, the user `sluice`/`sluice`, and TLS with the test bed's
//! certificate when its folder is known (`SLUICE_TLS_DIR`).

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::free_port;

pub struct PrivateMariaDb {
    dir: tempfile::TempDir,
    pub port: u16,
    pub server_id: u32,
    child: Option<Child>,
}

const MARIADBD: &str = "/usr/sbin/mariadbd";

impl PrivateMariaDb {
    /// `None` when no `mariadbd` is installed here (`deploy/testbed.sh start mariadb`
    /// installs it).
    pub fn start(server_id: u32) -> Option<Self> {
        if !Path::new(MARIADBD).exists() {
            return None;
        }
        let dir = tempfile::Builder::new()
            .prefix("sluice-mariadb-")
            .tempdir_in(std::env::temp_dir())
            .unwrap();
        let data = dir.path().join("data");
        // Once more after a failure (seen once under load, not reproduced): with what it said.
        let mut said = String::new();
        let installed = (0..2).any(|_| {
            let _ = std::fs::remove_dir_all(&data);
            std::fs::create_dir(&data).unwrap();
            let mut install = Command::new("mariadb-install-db");
            install
                .arg("--no-defaults")
                .arg(format!("--datadir={}", data.display()))
                .arg("--auth-root-authentication-method=socket")
                .arg("--skip-test-db");
            if is_root() {
                install.arg("--user=root");
            }
            let out = install.output().expect("run mariadb-install-db");
            if !out.status.success() {
                said.push_str(&String::from_utf8_lossy(&out.stdout));
                said.push_str(&String::from_utf8_lossy(&out.stderr));
                eprintln!("mariadb-install-db failed ({}): {said}", out.status);
            }
            out.status.success()
        });
        assert!(installed, "mariadb-install-db failed twice: {said}");
        let mut db = Self {
            dir,
            port: free_port(),
            server_id,
            child: None,
        };
        db.resume();
        db.root_sql(
            "CREATE USER 'sluice'@'%' IDENTIFIED BY 'sluice'; \
             GRANT ALL PRIVILEGES ON *.* TO 'sluice'@'%' WITH GRANT OPTION;",
        );
        Some(db)
    }

    pub fn url(&self) -> String {
        format!("mysql://sluice:sluice@127.0.0.1:{}", self.port)
    }

    fn socket(&self) -> String {
        self.dir.path().join("mysqld.sock").display().to_string()
    }

    /// Start (again) and wait until it answers.
    pub fn resume(&mut self) {
        let d = self.dir.path();
        let mut cmd = Command::new(MARIADBD);
        cmd.arg("--no-defaults")
            .arg(format!("--datadir={}", d.join("data").display()))
            .arg(format!("--socket={}", self.socket()))
            .arg(format!("--pid-file={}", d.join("mariadbd.pid").display()))
            .arg(format!("--log-error={}", d.join("error.log").display()))
            .arg(format!("--port={}", self.port))
            .arg(format!("--server-id={}", self.server_id))
            .args([
                "--bind-address=127.0.0.1",
                "--skip-name-resolve",
                "--log-bin=mysql-bin",
                "--binlog-format=ROW",
                "--binlog-row-image=FULL",
                "--binlog-row-metadata=FULL",
                "--gtid-strict-mode=1",
                "--log-slave-updates=1",
                "--character-set-server=utf8mb4",
                "--collation-server=utf8mb4_general_ci",
                "--innodb-buffer-pool-size=32M",
                "--innodb-log-file-size=16M",
                "--innodb-flush-log-at-trx-commit=2",
                "--sync-binlog=0",
                "--skip-innodb-doublewrite",
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        // TLS with the test bed's certificate (made for 127.0.0.1), as the shared server: a
        // capture verifies it by the test bed's CA (`crate::mysql_tls`), as by default.
        if let Some(tls) = crate::tls_dir() {
            cmd.arg(format!("--ssl-ca={tls}/ca.pem"))
                .arg(format!("--ssl-cert={tls}/server.pem"))
                .arg(format!("--ssl-key={tls}/server.key"));
        }
        if is_root() {
            cmd.arg("--user=root");
        }
        self.child = Some(cmd.spawn().expect("start mariadbd"));
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let ok = Command::new("mariadb")
                .args([
                    "--no-defaults",
                    "-uroot",
                    &format!("--socket={}", self.socket()),
                ])
                .args(["-e", "SELECT 1"])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success());
            if ok {
                return;
            }
            if let Some(Ok(Some(status))) = self.child.as_mut().map(|c| c.try_wait()) {
                panic!("mariadbd exited ({status}): {}", self.error_log());
            }
            assert!(
                Instant::now() < deadline,
                "mariadbd did not answer within 60 s: {}",
                self.error_log()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// Statements as root over the socket, without writing them to the binlog.
    pub fn root_sql(&self, sql: &str) {
        let out = Command::new("mariadb")
            .args([
                "--no-defaults",
                "-uroot",
                &format!("--socket={}", self.socket()),
            ])
            .args(["-e", &format!("SET sql_log_bin = 0; {sql}")])
            .output()
            .expect("run mariadb");
        assert!(
            out.status.success(),
            "{sql}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// kill -9: the server fails.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    pub fn error_log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("error.log")).unwrap_or_default()
    }

    /// A connection as `sluice`.
    pub async fn conn(&self) -> mysql_async::Conn {
        mysql_async::Conn::new(mysql_async::Opts::from_url(&self.url()).unwrap())
            .await
            .unwrap()
    }
}

impl Drop for PrivateMariaDb {
    fn drop(&mut self) {
        self.kill();
    }
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| o.stdout.starts_with(b"0\n"))
}
