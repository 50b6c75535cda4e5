//! When `/healthz` says the target is out: a target failing for longer than a while.

use std::sync::Arc;
use std::time::{Duration, Instant};

/// The target failing for a while: after `after`, `/healthz` says degraded with the last
/// failure; the next success makes it healthy again.
pub struct Outage {
    health: sluice_common::metrics::Health,
    after: Duration,
    since: std::sync::Mutex<Option<Instant>>,
}

impl Outage {
    pub fn new(health: sluice_common::metrics::Health, after: Duration) -> Arc<Self> {
        Arc::new(Self {
            health,
            after,
            since: std::sync::Mutex::new(None),
        })
    }

    /// A write or statement failed for now (it is retried).
    pub fn failing(&self, what: &str) {
        let mut since = self.since.lock().expect("outage lock");
        let start = *since.get_or_insert_with(Instant::now);
        if start.elapsed() >= self.after {
            self.health.degrade(format!(
                "the target has not taken a write for {} s: {what}",
                start.elapsed().as_secs()
            ));
        }
    }

    /// A write or statement succeeded.
    pub fn ok(&self) {
        let mut since = self.since.lock().expect("outage lock");
        if since.take().is_some() {
            self.health.restore();
        }
    }
}
