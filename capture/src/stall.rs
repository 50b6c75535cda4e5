//! A capture that stops moving while its source moves says so in `/healthz`.
//!
//! A task of its own (the stream may be the thing that is stuck) looks every few seconds at two
//! kinds of progress: what the stream has read, against the source (a [`Probe`] of each
//! capture: capture-mysql's read position against the server's binlog end; capture-mongo's
//! changes and idle answers from the source, of which a reading stream has one at least every
//! `max_await_ms`); and what Kafka has acknowledged, against the records handed to it. Either
//! standing still for the stage's `stalled_after_ms` while there is work (the source past the
//! read position, or records in flight) is a stall: the condition is set, with positions or
//! counts, and logged once; it clears, and says so, when the capture moves again. A capture idle
//! at its source's end is not stalled.

use std::future::Future;
use std::pin::Pin;
use std::time::{Duration, Instant};

use sluice_common::metrics::Health;

use crate::publish::Delivery;

/// The condition's name in [`Health`].
pub const CONDITION: &str = "stalled";

/// What the stream has read, as a probe sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Read {
    /// Where the stream stands: any pair that changes whenever it reads.
    pub at: (i64, i64),
    /// Nothing more to read: the source is not past `at` (or could not be asked).
    pub caught_up: bool,
    /// What the source is doing meanwhile, for the reason (`while ...`).
    pub meanwhile: String,
}

/// A capture's look at its stream and its source.
pub type Probe = Box<dyn FnMut() -> Pin<Box<dyn Future<Output = Read> + Send>> + Send>;

/// What the watch reads, and where it says what it found.
pub struct Watch {
    pub health: Health,
    /// `sluice_capture_stalled` ([`gauge`]): 1 while stalled.
    pub stalled: prometheus::IntGauge,
    pub delivery: Delivery,
    pub after: Duration,
    pub probe: Probe,
}

/// `sluice_capture_stalled`, registered in `r`.
pub fn gauge(r: &prometheus::Registry) -> prometheus::Result<prometheus::IntGauge> {
    let g = prometheus::IntGauge::new(
        "sluice_capture_stalled",
        "1 while the capture is stalled (it reads nothing while its source has more, or Kafka \
         acknowledges none of its records in flight, for stalled_after_ms), else 0.",
    )?;
    r.register(Box::new(g.clone()))?;
    Ok(g)
}

/// How often the watch looks.
const EVERY: Duration = Duration::from_secs(5);

/// Why the capture is stalled, if it is: `read` as last probed, `delivered` (handed to Kafka,
/// acknowledged), and how long the read position and the acknowledgements have stood still
/// with work to do.
pub fn verdict(
    read: &Read,
    delivered: (u64, u64),
    read_idle: Duration,
    ack_idle: Duration,
    after: Duration,
) -> Option<String> {
    let (sent, acked) = delivered;
    if ack_idle >= after && sent > acked {
        return Some(format!(
            "the capture is stalled: {} record(s) handed to Kafka have not been acknowledged \
             for {} s (the brokers, or a topic refusing writes: see its log)",
            sent - acked,
            ack_idle.as_secs()
        ));
    }
    (!read.caught_up && read_idle >= after).then(|| {
        format!(
            "the capture is stalled: it has read nothing for {} s {}",
            read_idle.as_secs(),
            read.meanwhile
        )
    })
}

/// Start the watch; it runs until aborted.
pub fn spawn(mut w: Watch) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let now = Instant::now();
        let (mut read_moved, mut acked_moved) = (now, now);
        let mut last: Option<((i64, i64), u64)> = None;
        let mut said: Option<String> = None;
        loop {
            tokio::time::sleep(EVERY).await;
            let read = (w.probe)().await;
            let (sent, acked) = w.delivery.counts();
            let now = Instant::now();
            let before = last.replace((read.at, acked));
            if read.caught_up || before.is_none_or(|(at, _)| at != read.at) {
                read_moved = now;
            }
            if sent == acked || before.is_none_or(|(_, a)| a != acked) {
                acked_moved = now;
            }
            let why = verdict(
                &read,
                (sent, acked),
                now - read_moved,
                now - acked_moved,
                w.after,
            );
            match (&why, &said) {
                (Some(w), None) => tracing::warn!(reason = %w, "stalled"),
                (None, Some(_)) => tracing::info!("moving again after a stall"),
                _ => {}
            }
            // (the reason's seconds change at each look; said once, kept current in /healthz)
            w.stalled.set(i64::from(why.is_some()));
            w.health.set(CONDITION, why.clone());
            said = why;
        }
    })
}

/// Stop the watch started by [`spawn`] and clear what it said: awaited, so that a look in
/// progress cannot set the condition again afterwards.
pub async fn end(
    watch: tokio::task::JoinHandle<()>,
    health: &Health,
    stalled: &prometheus::IntGauge,
) {
    watch.abort();
    let _ = watch.await;
    health.set(CONDITION, None);
    stalled.set(0);
}

#[cfg(test)]
mod tests {
    use super::*;

    const AFTER: Duration = Duration::from_secs(60);

    fn read(caught_up: bool) -> Read {
        Read {
            at: (3, 1000),
            caught_up,
            meanwhile: "while the source's binlog is at file 4 offset 4".into(),
        }
    }

    #[test]
    fn a_capture_idle_at_its_sources_end_is_not_stalled() {
        let long = Duration::from_secs(600);
        assert_eq!(verdict(&read(true), (10, 10), long, long, AFTER), None);
    }

    #[test]
    fn reading_nothing_while_the_source_moves_on_is_a_stall_once_it_lasts() {
        let short = Duration::from_secs(59);
        assert_eq!(verdict(&read(false), (10, 10), short, short, AFTER), None);
        let why = verdict(&read(false), (10, 10), AFTER, short, AFTER).expect("stalled");
        assert!(
            why.contains("read nothing for 60 s") && why.contains("file 4 offset 4"),
            "{why}"
        );
    }

    #[test]
    fn records_in_flight_unacknowledged_are_a_stall_once_it_lasts() {
        let why = verdict(&read(true), (25, 20), Duration::ZERO, AFTER, AFTER).expect("stalled");
        assert!(why.contains("5 record(s)") && why.contains("60 s"), "{why}");
        // Nothing in flight: nothing to acknowledge.
        assert_eq!(
            verdict(&read(true), (20, 20), Duration::ZERO, AFTER, AFTER),
            None
        );
    }
}
