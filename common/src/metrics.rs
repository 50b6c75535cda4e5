//! The Prometheus endpoint every binary serves.
//!
//! One registry per process. Metric names follow `sluice_<stage>_<name>_<unit>` (counters end
//! in `_total`), labels have bounded values (table names, partition numbers, error types; never
//! row keys). Every process also exports `sluice_build_info{binary,version}` and the standard
//! `process_*` metrics (CPU seconds, resident memory, open fds).
//!
//! The server answers `GET /metrics` (text exposition format), `GET /healthz` (200 "ok" while
//! the process runs), and 404 otherwise. It is deliberately small: one request per connection.

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

/// Serve `registry` on `listener` until `shutdown` fires.
pub async fn serve(listener: TcpListener, registry: Registry, shutdown: Shutdown) {
    loop {
        tokio::select! {
            _ = shutdown.wait() => return,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    let registry = registry.clone();
                    tokio::spawn(async move {
                        if let Err(e) = handle(stream, &registry).await {
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

async fn handle(mut stream: TcpStream, registry: &Registry) -> std::io::Result<()> {
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
        ("GET", "/healthz") => ("200 OK", "text/plain".to_string(), b"ok\n".to_vec()),
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
