//! Shutdown: one signal, many listeners.
//!
//! SIGTERM and SIGINT fire the process's [`Shutdown`]. Every task that reads input selects on
//! [`Shutdown::wait`] and, when it fires, stops reading, finishes and checkpoints what it holds,
//! then returns; `main` exits 0 once they have. A second signal while draining exits at once
//! (status 130), for an operator who does not want to wait.

use tokio::sync::watch;

/// A cloneable handle on the process's shutdown state.
#[derive(Clone, Debug)]
pub struct Shutdown {
    rx: watch::Receiver<bool>,
    tx: std::sync::Arc<watch::Sender<bool>>,
}

impl Default for Shutdown {
    fn default() -> Self {
        Self::new()
    }
}

impl Shutdown {
    pub fn new() -> Self {
        let (tx, rx) = watch::channel(false);
        Self {
            rx,
            tx: std::sync::Arc::new(tx),
        }
    }

    /// Ask every holder to stop.
    pub fn trigger(&self) {
        self.tx.send_replace(true);
    }

    pub fn is_triggered(&self) -> bool {
        *self.rx.borrow()
    }

    /// Resolves once shutdown was asked for (at once if it already was).
    pub async fn wait(&self) {
        let mut rx = self.rx.clone();
        // An error means every sender is gone, which cannot happen while `self` holds one.
        let _ = rx.wait_for(|stop| *stop).await;
    }

    /// Trigger on SIGTERM or SIGINT; a second signal exits the process at once.
    pub fn listen_for_signals(&self) -> std::io::Result<()> {
        use tokio::signal::unix::{signal, SignalKind};
        let mut term = signal(SignalKind::terminate())?;
        let mut int = signal(SignalKind::interrupt())?;
        let this = self.clone();
        tokio::spawn(async move {
            let name = tokio::select! {
                _ = term.recv() => "SIGTERM",
                _ = int.recv() => "SIGINT",
            };
            tracing::info!(signal = name, "shutting down: finishing what is in flight");
            this.trigger();
            tokio::select! {
                _ = term.recv() => {},
                _ = int.recv() => {},
            }
            tracing::warn!("second signal: exiting without draining");
            std::process::exit(130);
        });
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn every_clone_sees_the_trigger() {
        let s = Shutdown::new();
        let a = s.clone();
        let waiter = tokio::spawn(async move { a.wait().await });
        assert!(!s.is_triggered());
        s.trigger();
        tokio::time::timeout(std::time::Duration::from_secs(5), waiter)
            .await
            .expect("waiter woke")
            .unwrap();
        assert!(s.clone().is_triggered());
        s.wait().await; // already triggered: returns at once
    }
}
