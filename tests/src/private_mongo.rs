//! A mongo-java-server of a test's own (the test bed's jars and launcher), for tests that write
//! what the shared server must not see, such as oplog entries of their own making.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::free_port;

pub struct PrivateMongo {
    pub port: u16,
    child: Child,
}

impl PrivateMongo {
    /// `None` when the test bed's mongo-java-server is not installed here
    /// (`deploy/testbed.sh start mongo` installs it).
    pub fn start() -> Option<Self> {
        let home = std::env::var("HOME").unwrap_or_default();
        let cache = std::env::var("SLUICE_CACHE_DIR")
            .ok()
            .filter(|v| !v.is_empty())
            .unwrap_or_else(|| format!("{home}/.cache/sluice"));
        let state = std::env::var("SLUICE_TESTBED_DIR")
            .ok()
            .filter(|v| !v.is_empty())
            .unwrap_or_else(|| "/var/tmp/sluice-testbed".into());
        let (libs, classes) = (
            format!("{cache}/mongo-java-server"),
            format!("{state}/mongo/classes"),
        );
        if !std::path::Path::new(&format!("{classes}/MongoLauncher.class")).exists() {
            return None;
        }
        let port = free_port();
        let child = Command::new("java")
            .args([
                "-Xmx512m",
                "-Dorg.slf4j.simpleLogger.defaultLogLevel=warn",
                "-cp",
                &format!("{libs}/*:{classes}"),
                "MongoLauncher",
                &port.to_string(),
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start mongo-java-server");
        let deadline = Instant::now() + Duration::from_secs(60);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                Instant::now() < deadline,
                "mongo-java-server did not listen within 60 s"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        Some(Self { port, child })
    }

    pub fn url(&self) -> String {
        format!("mongodb://127.0.0.1:{}/?directConnection=true", self.port)
    }
}

impl Drop for PrivateMongo {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
