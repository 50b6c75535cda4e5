//! A TCP relay whose connections can be cut: a network failure between a stage and its server.

/// A TCP relay to the first host of `url`, whose connections can be cut (every socket closed,
/// new ones refused) and restored: a network failure between a stage and its server.
pub struct Relay {
    pub port: u16,
    cut: std::sync::Arc<std::sync::atomic::AtomicBool>,
    conns: std::sync::Arc<std::sync::Mutex<Vec<tokio::task::JoinHandle<()>>>>,
}

impl Relay {
    pub async fn to(url: &str) -> Self {
        use std::sync::atomic::Ordering;
        let rest = url.split_once("://").map(|(_, r)| r).unwrap_or(url);
        let rest = rest.rsplit_once('@').map(|(_, r)| r).unwrap_or(rest);
        let upstream = rest
            .split(['/', '?', ','])
            .next()
            .unwrap_or_default()
            .to_string();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let cut = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let conns = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let (c, k) = (cut.clone(), conns.clone());
        tokio::spawn(async move {
            loop {
                let Ok((mut down, _)) = listener.accept().await else {
                    return;
                };
                if c.load(Ordering::SeqCst) {
                    continue; // dropped: refused
                }
                let up = upstream.clone();
                let h = tokio::spawn(async move {
                    if let Ok(mut u) = tokio::net::TcpStream::connect(&up).await {
                        let _ = tokio::io::copy_bidirectional(&mut down, &mut u).await;
                    }
                });
                k.lock().unwrap().push(h);
            }
        });
        Relay { port, cut, conns }
    }

    /// The URL of `url`'s server through the relay (one host, connected to directly).
    pub fn url(&self, url: &str) -> String {
        let (scheme, rest) = url.split_once("://").unwrap_or(("mongodb", url));
        let (auth, rest) = match rest.rsplit_once('@') {
            Some((a, r)) => (format!("{a}@"), r),
            None => (String::new(), rest),
        };
        let tail = rest.find(['/', '?']).map(|i| &rest[i..]).unwrap_or("/");
        let tail = if tail.starts_with('?') {
            format!("/{tail}")
        } else {
            tail.to_string()
        };
        let direct = if tail.to_ascii_lowercase().contains("directconnection=") {
            ""
        } else if tail.contains('?') {
            "&directConnection=true"
        } else {
            "?directConnection=true"
        };
        format!("{scheme}://{auth}127.0.0.1:{}{tail}{direct}", self.port)
    }

    pub fn cut(&self) {
        self.cut.store(true, std::sync::atomic::Ordering::SeqCst);
        for h in self.conns.lock().unwrap().drain(..) {
            h.abort();
        }
    }

    pub fn restore(&self) {
        self.cut.store(false, std::sync::atomic::Ordering::SeqCst);
    }
}

impl Relay {
    /// An HTTP URL of the relay (for ClickHouse).
    pub fn http_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }
}
