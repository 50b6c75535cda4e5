//! Delivery bookkeeping: every record handed to the producer gets the next sequence number
//! (`publisher::produce`), librdkafka's delivery callbacks tick the numbers off, and the
//! [`Ledger`] publishes how many records are acknowledged without a gap. Nothing at or after a
//! failed record ever counts as acknowledged, so no checkpoint can pass a record that was not
//! delivered.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};

use prometheus::Histogram;
use rdkafka::producer::{DeliveryResult, ProducerContext, ThreadedProducer};
use rdkafka::{ClientContext, Message};
use tokio::sync::watch;

use super::PublishError;

/// Delivery bookkeeping, shared with librdkafka's delivery callbacks (which run on the
/// producer's polling thread). Every record gets the next sequence number as its delivery
/// opaque; `acked` publishes the count of records acknowledged without a gap (every sequence
/// number below it is delivered). No per-record future, channel message or allocation.
pub(super) struct Ledger {
    state: std::sync::Mutex<LedgerState>,
    pub(super) acked: watch::Sender<u64>,
    /// Turns true at the first failure.
    pub(super) failed: watch::Sender<bool>,
    latency: Histogram,
    /// Key and value bytes handed to the producer, and acknowledged.
    pub(super) sent_bytes: AtomicU64,
    pub(super) acked_bytes: AtomicU64,
    /// librdkafka's errors, said without repeating ([`sluice_common::kafka::ErrorLog`]), and
    /// counted (`sluice_capture_errors_total{error_type="kafka"}`, when given).
    errors: sluice_common::kafka::ErrorLog,
    error_count: Option<prometheus::IntCounter>,
}

struct LedgerState {
    /// Every sequence number below `base` is acknowledged.
    base: u64,
    /// Acknowledged or not, for `base`, `base + 1`, ...
    done: VecDeque<bool>,
    /// The first failure: the topic and librdkafka's reason. Nothing at or after a failed
    /// record is ever counted as acknowledged.
    failure: Option<(String, String)>,
}

impl Ledger {
    pub(super) fn new(latency: Histogram) -> Self {
        Self {
            state: std::sync::Mutex::new(LedgerState {
                base: 0,
                done: VecDeque::new(),
                failure: None,
            }),
            acked: watch::channel(0).0,
            failed: watch::channel(false).0,
            latency,
            sent_bytes: AtomicU64::new(0),
            acked_bytes: AtomicU64::new(0),
            errors: sluice_common::kafka::ErrorLog::new("capture producer"),
            error_count: None,
        }
    }

    /// Key and value bytes handed to the producer and not yet acknowledged.
    #[inline]
    pub(super) fn bytes_in_flight(&self) -> u64 {
        // Acknowledged first: a delivery between the two reads can only make this larger.
        let acked = self.acked_bytes.load(Ordering::Acquire);
        self.sent_bytes
            .load(Ordering::Acquire)
            .saturating_sub(acked)
    }

    pub(super) fn fail(&self, topic: &str, reason: String) {
        let mut s = self.state.lock().expect("ledger lock");
        s.failure.get_or_insert_with(|| (topic.to_string(), reason));
        drop(s);
        // Wake every waiter so it sees the failure.
        self.failed.send_replace(true);
        self.acked.send_modify(|_| {});
    }

    pub(super) fn failure(&self) -> Option<PublishError> {
        let s = self.state.lock().expect("ledger lock");
        s.failure
            .as_ref()
            .map(|(topic, reason)| PublishError::Delivery {
                topic: topic.clone(),
                reason: reason.clone(),
            })
    }

    /// Record `seq` as acknowledged; returns the new gap-free count when it moved.
    pub(super) fn done(&self, seq: u64) -> Option<u64> {
        let mut s = self.state.lock().expect("ledger lock");
        let Some(idx) = seq.checked_sub(s.base) else {
            return None; // cannot happen: each sequence number is acknowledged once
        };
        let idx = idx as usize;
        if idx >= s.done.len() {
            s.done.resize(idx + 1, false);
        }
        s.done[idx] = true;
        let mut moved = 0;
        while s.done.front() == Some(&true) {
            s.done.pop_front();
            moved += 1;
        }
        if moved == 0 {
            return None;
        }
        s.base += moved;
        Some(s.base)
    }

    /// Wait until every record below `upto` is acknowledged, or one failed.
    pub(super) async fn wait(
        &self,
        rx: &mut watch::Receiver<u64>,
        upto: u64,
    ) -> Result<(), PublishError> {
        loop {
            if let Some(e) = self.failure() {
                return Err(e);
            }
            if *rx.borrow_and_update() >= upto {
                return Ok(());
            }
            rx.changed().await.map_err(|_| PublishError::AckerGone)?;
        }
    }
}

impl Ledger {
    /// Count librdkafka's errors in `counter`.
    pub(super) fn counting_errors(mut self, counter: prometheus::IntCounter) -> Self {
        self.error_count = Some(counter);
        self
    }
}

impl ClientContext for Ledger {
    fn error(&self, error: rdkafka::error::KafkaError, reason: &str) {
        if let Some(c) = &self.error_count {
            c.inc();
        }
        self.errors.note(&error, reason);
    }

    fn log(&self, level: rdkafka::config::RDKafkaLogLevel, fac: &str, message: &str) {
        sluice_common::kafka::librdkafka_log(level, fac, message);
    }
}

impl ProducerContext for Ledger {
    type DeliveryOpaque = usize;

    fn delivery(&self, result: &DeliveryResult<'_>, seq: usize) {
        match result {
            Ok(m) => {
                let size = m.payload_len() + m.key_len();
                self.acked_bytes.fetch_add(size as u64, Ordering::Release);
                if let Some(sent) = m.timestamp().to_millis() {
                    let now = sluice_common::clock::now_micros() / 1000;
                    self.latency.observe((now - sent).max(0) as f64 / 1000.0);
                }
                if let Some(acked) = self.done(seq as u64) {
                    self.acked.send_replace(acked);
                }
            }
            Err((e, m)) => self.fail(m.topic(), e.to_string()),
        }
    }
}

pub(super) type KafkaProducer = ThreadedProducer<Ledger>;

/// Whether `records` unacknowledged records of `bytes` bytes leave no room for another of
/// `size` bytes: too many records, or too many bytes with it, unless nothing is in flight (a
/// record larger than the limit goes, alone).
#[inline]
pub(super) fn full(records: u64, bytes: u64, size: u64, max: u64, max_bytes: u64) -> bool {
    records >= max || (records > 0 && bytes + size > max_bytes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus::HistogramOpts;

    fn ledger() -> Ledger {
        Ledger::new(Histogram::with_opts(HistogramOpts::new("t", "t")).unwrap())
    }

    #[test]
    fn in_flight_limits_count_records_and_bytes() {
        assert!(!full(9, 100, 900, 10, 1000));
        assert!(full(10, 100, 1, 10, 1000), "records");
        assert!(full(1, 999, 2, 10, 1000), "bytes, with the new record");
        // A record larger than the limit waits until nothing is in flight, then goes alone.
        assert!(full(1, 10, 5000, 10, 1000));
        assert!(!full(0, 0, 5000, 10, 1000));
    }

    #[test]
    fn the_ledger_counts_only_acknowledgements_without_a_gap() {
        let l = ledger();
        // Partitions acknowledge out of order: 2 and 1 before 0.
        assert_eq!(l.done(2), None);
        assert_eq!(l.done(1), None);
        assert_eq!(l.done(0), Some(3));
        assert_eq!(l.done(4), None);
        assert_eq!(l.done(3), Some(5));
        assert_eq!(l.done(5), Some(6));
    }

    #[tokio::test]
    async fn a_failed_record_stops_every_waiter_and_nothing_after_it_counts() {
        let l = ledger();
        let mut rx = l.acked.subscribe();
        assert_eq!(l.done(0), Some(1));
        l.acked.send_replace(1);
        assert!(l.wait(&mut rx, 1).await.is_ok());
        // Record 1 fails; 2 is acknowledged, but the count stays at 1.
        l.fail("t.db.x", "Message timed out".into());
        assert_eq!(l.done(2), None);
        let err = l.wait(&mut rx, 3).await.unwrap_err().to_string();
        assert!(err.contains("t.db.x") && err.contains("timed out"), "{err}");
    }
}
