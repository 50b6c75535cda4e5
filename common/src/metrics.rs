//! The Prometheus endpoint every binary serves.
//!
//! One registry per process. Metric names follow `sluice_<stage>_<name>_<unit>` (counters end
//! in `_total`), labels have bounded values (table names, partition numbers, error types; never
//! row keys). Every process also exports `sluice_build_info{binary,version}` and the standard
//! `process_*` metrics (CPU seconds, resident memory, open fds).
//!
//! The server answers `GET /metrics` (text exposition format), `GET /healthz` (200 "ok" while
//! the process runs and is healthy; 503 with the reason while it is degraded, see [`Health`]),
//! `GET /livez` (200 while it serves: for liveness probes, which must not restart a process
//! that waits for its target), and 404 otherwise. It is deliberately small: one request per connection.

use std::net::SocketAddr;

use prometheus::{Encoder, IntGaugeVec, Opts, Registry, TextEncoder};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::shutdown::Shutdown;

/// The process's registry, with the build info and process collectors already registered.
pub fn registry(binary: &str) -> Registry {
    let registry = Registry::new();
    let info = IntGaugeVec::new(
        Opts::new("sluice_build_info", "Build information; always 1."),
        &["binary", "version"],
    )
    .expect("valid metric");
    info.with_label_values(&[binary, env!("CARGO_PKG_VERSION")])
        .set(1);
    registry.register(Box::new(info)).expect("registered once");
    #[cfg(target_os = "linux")]
    registry
        .register(Box::new(
            prometheus::process_collector::ProcessCollector::for_self(),
        ))
        .expect("registered once");
    registry
}

/// Bind the metrics endpoint. Binding happens before the binary starts its work, so a taken
/// port is reported at start-up.
pub async fn bind(addr: SocketAddr) -> std::io::Result<TcpListener> {
    TcpListener::bind(addr).await
}

/// The `--healthcheck` probe: `GET /healthz` on the endpoint a process configured with `listen`
/// serves (loopback when `listen` is an unspecified address), within `timeout`. `Ok` when it
/// answers 200 `ok`; otherwise what went wrong, naming the address.
pub fn probe(listen: SocketAddr, timeout: std::time::Duration) -> Result<(), String> {
    use std::io::{Read, Write};
    use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
    if listen.port() == 0 {
        return Err(format!(
            "metrics.listen {listen} has port 0 (a port picked at start): the endpoint cannot be found"
        ));
    }
    let mut addr = listen;
    if addr.ip().is_unspecified() {
        addr.set_ip(match addr.ip() {
            IpAddr::V4(_) => IpAddr::V4(Ipv4Addr::LOCALHOST),
            IpAddr::V6(_) => IpAddr::V6(Ipv6Addr::LOCALHOST),
        });
    }
    let fail = |what: &str, e: std::io::Error| format!("{what} http://{addr}/healthz: {e}");
    let mut stream = std::net::TcpStream::connect_timeout(&addr, timeout)
        .map_err(|e| fail("cannot connect to", e))?;
    stream
        .set_read_timeout(Some(timeout))
        .and_then(|()| stream.set_write_timeout(Some(timeout)))
        .map_err(|e| fail("cannot set timeouts for", e))?;
    stream
        .write_all(b"GET /healthz HTTP/1.0\r\n\r\n")
        .map_err(|e| fail("cannot send to", e))?;
    let mut answer = Vec::new();
    stream
        .take(4096)
        .read_to_end(&mut answer)
        .map_err(|e| fail("no answer from", e))?;
    let answer = String::from_utf8_lossy(&answer);
    let status = answer.lines().next().unwrap_or("");
    let body = answer.split("\r\n\r\n").nth(1).unwrap_or("").trim();
    if status.split_whitespace().nth(1) == Some("200") && body == "ok" {
        Ok(())
    } else {
        Err(format!(
            "http://{addr}/healthz answered {status:?} {body:?}"
        ))
    }
}

/// Whether the process does its work: `None` healthy, or why not (waiting for a server it
/// cannot reach, tables stopped). Shared by the binary's work and the `/healthz` answer.
/// Several conditions may hold at once, each set and cleared under its own name.
#[derive(Clone, Default)]
pub struct Health(
    std::sync::Arc<std::sync::RwLock<std::collections::BTreeMap<&'static str, String>>>,
);

impl Health {
    /// Degraded, for `why` (the process's main condition: a server it waits for).
    pub fn degrade(&self, why: impl Into<String>) {
        self.set("", Some(why.into()));
    }
    /// The main condition cleared.
    pub fn restore(&self) {
        self.set("", None);
    }
    /// Condition `name` holds for `why` (`None`: it no longer holds).
    pub fn set(&self, name: &'static str, why: Option<String>) {
        let mut m = self.0.write().expect("health lock");
        match why {
            Some(w) => {
                m.insert(name, w);
            }
            None => {
                m.remove(name);
            }
        }
    }
    /// Why not healthy: every condition that holds, `; `-separated.
    pub fn degraded(&self) -> Option<String> {
        let m = self.0.read().expect("health lock");
        (!m.is_empty()).then(|| m.values().cloned().collect::<Vec<_>>().join("; "))
    }
}

/// The first label's values of counter `name` in `registry`, sorted, each with its count
/// (for tests of which series exist).
pub fn counter_series(registry: &Registry, name: &str) -> Vec<(String, f64)> {
    let mut out: Vec<(String, f64)> = registry
        .gather()
        .iter()
        .filter(|f| f.name() == name)
        .flat_map(|f| {
            f.get_metric().iter().map(|m| {
                let label = m
                    .get_label()
                    .first()
                    .map(|l| l.value().to_string())
                    .unwrap_or_default();
                (label, m.get_counter().get_value())
            })
        })
        .collect();
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

/// Serve `registry` on `listener` until `shutdown` fires.
pub async fn serve(listener: TcpListener, registry: Registry, health: Health, shutdown: Shutdown) {
    loop {
        tokio::select! {
            _ = shutdown.wait() => return,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    let registry = registry.clone();
                    let health = health.clone();
                    tokio::spawn(async move {
                        if let Err(e) = handle(stream, &registry, &health).await {
                            tracing::debug!(error = %e, "metrics request failed");
                        }
                    });
                }
                Err(e) => {
                    tracing::warn!(error = %e, "metrics endpoint: accept failed");
                    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                }
            }
        }
    }
}

async fn handle(
    mut stream: TcpStream,
    registry: &Registry,
    health: &Health,
) -> std::io::Result<()> {
    let mut buf = Vec::with_capacity(1024);
    let mut chunk = [0u8; 1024];
    // Read the request head (we ignore any body), at most 16 KiB, for at most 5 s.
    let read = async {
        while !buf.windows(4).any(|w| w == b"\r\n\r\n") && buf.len() < 16 * 1024 {
            let n = stream.read(&mut chunk).await?;
            if n == 0 {
                break;
            }
            buf.extend_from_slice(&chunk[..n]);
        }
        Ok::<_, std::io::Error>(())
    };
    tokio::time::timeout(std::time::Duration::from_secs(5), read)
        .await
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, "slow request"))??;
    let head = String::from_utf8_lossy(&buf);
    let mut parts = head.split_whitespace();
    let (method, path) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let path = path.split('?').next().unwrap_or("");
    let (status, content_type, body) = match (method, path) {
        ("GET", "/metrics") => {
            let encoder = TextEncoder::new();
            let mut body = Vec::new();
            encoder
                .encode(&registry.gather(), &mut body)
                .map_err(std::io::Error::other)?;
            ("200 OK", encoder.format_type().to_string(), body)
        }
        ("GET", "/livez") => ("200 OK", "text/plain".to_string(), b"ok\n".to_vec()),
        ("GET", "/healthz") => match health.degraded() {
            None => ("200 OK", "text/plain".to_string(), b"ok\n".to_vec()),
            Some(why) => (
                "503 Service Unavailable",
                "text/plain".to_string(),
                format!("degraded: {why}\n").into_bytes(),
            ),
        },
        ("GET", _) => (
            "404 Not Found",
            "text/plain".into(),
            b"not found\n".to_vec(),
        ),
        _ => (
            "405 Method Not Allowed",
            "text/plain".into(),
            b"method not allowed\n".to_vec(),
        ),
    };
    let header = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    stream.write_all(header.as_bytes()).await?;
    stream.write_all(&body).await?;
    stream.shutdown().await
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_probe_says_up_only_while_the_endpoint_answers() {
        let listener = bind("0.0.0.0:0".parse().unwrap()).await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let listen: SocketAddr = format!("0.0.0.0:{port}").parse().unwrap();
        let shutdown = Shutdown::new();
        let health = Health::default();
        let server = tokio::spawn(serve(
            listener,
            registry("test"),
            health.clone(),
            shutdown.clone(),
        ));
        let probe_now =
            move || tokio::task::spawn_blocking(move || probe(listen, Duration::from_secs(2)));
        assert_eq!(probe_now().await.unwrap(), Ok(()));
        // Degraded: 503 with the reason, and the probe says so.
        health.degrade("waiting for ClickHouse");
        let e = probe_now().await.unwrap().unwrap_err();
        assert!(
            e.contains("503") && e.contains("waiting for ClickHouse"),
            "{e}"
        );
        // Two conditions: both said; the outage's end leaves the other.
        health.set("stopped", Some("1 table stopped: db.t".into()));
        let e = probe_now().await.unwrap().unwrap_err();
        assert!(
            e.contains("waiting for ClickHouse") && e.contains("1 table stopped: db.t"),
            "{e}"
        );
        health.restore();
        let e = probe_now().await.unwrap().unwrap_err();
        assert!(
            e.contains("1 table stopped") && !e.contains("waiting"),
            "{e}"
        );
        health.set("stopped", None);
        assert_eq!(probe_now().await.unwrap(), Ok(()));
        shutdown.trigger();
        server.await.unwrap();
        let down = probe_now().await.unwrap().unwrap_err();
        assert!(down.contains(&format!("127.0.0.1:{port}")), "{down}");
        let zero = probe("127.0.0.1:0".parse().unwrap(), Duration::from_secs(1)).unwrap_err();
        assert!(zero.contains("port 0"), "{zero}");
    }
}
