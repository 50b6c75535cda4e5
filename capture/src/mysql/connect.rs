//! Connections to the source server, each within a time limit: a port that accepts TCP and
//! never speaks MySQL (another service's, a proxy with nothing behind it) would otherwise hold
//! the caller forever, with nothing said (`--check` printing nothing, a capture healthy and
//! idle, a SIGTERM that cannot finish).

use std::time::Duration;

use mysql_async::{Conn, Opts, Pool};

/// How long a connection may take: TCP, TLS and the MySQL handshake (with its
/// authentication).
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(15);

/// [`Conn::new`] within [`CONNECT_TIMEOUT`]; past it, an I/O error of kind `TimedOut` that
/// says what was waited for.
pub async fn connect(opts: Opts) -> Result<Conn, mysql_async::Error> {
    connect_within(opts, CONNECT_TIMEOUT).await
}

async fn connect_within(opts: Opts, limit: Duration) -> Result<Conn, mysql_async::Error> {
    let server = format!("{}:{}", opts.ip_or_hostname(), opts.tcp_port());
    match tokio::time::timeout(limit, Conn::new(opts)).await {
        Ok(r) => r,
        Err(_) => Err(timed_out(&server, limit)),
    }
}

/// A connection of `pool` within [`CONNECT_TIMEOUT`], as [`connect`].
pub async fn from_pool(pool: &Pool) -> Result<Conn, mysql_async::Error> {
    match tokio::time::timeout(CONNECT_TIMEOUT, pool.get_conn()).await {
        Ok(r) => r,
        Err(_) => Err(timed_out(
            "the server (a snapshot connection)",
            CONNECT_TIMEOUT,
        )),
    }
}

fn timed_out(server: &str, limit: Duration) -> mysql_async::Error {
    std::io::Error::new(
        std::io::ErrorKind::TimedOut,
        format!(
            "no MySQL handshake from {server} within {} ms (is it a MySQL or MariaDB server, \
             and reachable?)",
            limit.as_millis()
        ),
    )
    .into()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A port that accepts connections and says nothing: the connect ends, and says why.
    #[tokio::test]
    async fn a_silent_port_times_out_naming_the_server() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let hold = tokio::spawn(async move {
            let mut held = Vec::new();
            loop {
                let (s, _) = listener.accept().await.unwrap();
                held.push(s);
            }
        });
        let opts = Opts::from_url(&format!("mysql://u:p@127.0.0.1:{port}")).unwrap();
        let e = connect_within(opts, Duration::from_millis(300))
            .await
            .expect_err("a timeout");
        let text = e.to_string();
        assert!(
            text.contains(&format!("127.0.0.1:{port}")) && text.contains("no MySQL handshake"),
            "{text}"
        );
        hold.abort();
    }
}
