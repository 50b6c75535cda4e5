//! A capture that stops moving while its source moves says so in `/healthz`.
//!
//! A task of its own (the stream may be the thing that is stuck) looks every few seconds at two
//! kinds of progress: what the stream has read (its binlog file and offset, as exported), against
//! the server's binlog end; and what Kafka has acknowledged, against the records handed to it.
//! Either standing still for `mysql.stalled_after_ms` while there is work (the server's binlog
//! past the read position, or records in flight) is a stall: the condition is set, with both
//! positions or counts, and logged once; it clears, and says so, when the capture moves again.
//! A capture idle at the server's end is not stalled.

use std::time::{Duration, Instant};

use prometheus::IntGauge;
use sluice_common::metrics::Health;

use crate::publish::Delivery;

/// The condition's name in [`Health`].
pub(super) const CONDITION: &str = "stalled";

/// What the watch reads.
pub(super) struct Watch {
    pub(super) health: Health,
    pub(super) opts: mysql_async::Opts,
    /// The stream's binlog file number and offset (`sluice_capture_binlog_*`).
    pub(super) read: (IntGauge, IntGauge),
    pub(super) delivery: Delivery,
    pub(super) after: Duration,
}

/// How often the watch looks.
const EVERY: Duration = Duration::from_secs(5);

/// Where things stood when last seen moving.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Seen {
    /// (file number, offset) read by the stream.
    pub(super) read: (i64, i64),
    /// (handed to Kafka, acknowledged).
    pub(super) delivered: (u64, u64),
}

/// Why the capture is stalled, if it is: `now` against what was last seen moving (`read_moved`
/// and `acked_moved`, the instants each last moved or had nothing to do), the server's binlog end
/// (file number, offset; none when it could not be read).
pub(super) fn verdict(
    seen: Seen,
    server: Option<(i64, i64)>,
    read_idle: Duration,
    ack_idle: Duration,
    after: Duration,
) -> Option<String> {
    let (sent, acked) = seen.delivered;
    if ack_idle >= after && sent > acked {
        return Some(format!(
            "the capture is stalled: {} record(s) handed to Kafka have not been acknowledged \
             for {} s (the brokers, or a topic refusing writes: see its log)",
            sent - acked,
            ack_idle.as_secs()
        ));
    }
    match server {
        Some(end) if end > seen.read && read_idle >= after => Some(format!(
            "the capture is stalled: it has read nothing for {} s while the source's binlog is \
             at file {} offset {} and the capture at file {} offset {} (a snapshot holding the \
             stream, Kafka not taking records, or a stuck connection: see its log)",
            read_idle.as_secs(),
            end.0,
            end.1,
            seen.read.0,
            seen.read.1
        )),
        _ => None,
    }
}

/// Start the watch; it runs until aborted.
pub(super) fn spawn(w: Watch) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut conn: Option<mysql_async::Conn> = None;
        let now = Instant::now();
        let (mut read_moved, mut acked_moved) = (now, now);
        let mut last: Option<Seen> = None;
        let mut said: Option<String> = None;
        loop {
            tokio::time::sleep(EVERY).await;
            let seen = Seen {
                read: (w.read.0.get(), w.read.1.get()),
                delivered: w.delivery.counts(),
            };
            // The server's binlog end, on a connection of the watch's own (re-opened when lost;
            // none while the server does not answer: the stream says that itself).
            if conn.is_none() {
                conn = crate::mysql::connect::connect(w.opts.clone()).await.ok();
            }
            let server = match conn.as_mut() {
                Some(c) => match tokio::time::timeout(
                    Duration::from_secs(10),
                    crate::mysql::binlog_position(c),
                )
                .await
                {
                    Ok(Ok(Some(p))) => sluice_proto::binlog_file_seq(&p.file)
                        .ok()
                        .map(|seq| (seq as i64, p.pos as i64)),
                    Ok(Ok(None)) => None,
                    _ => {
                        conn = None;
                        None
                    }
                },
                None => None,
            };
            let now = Instant::now();
            let before = last.replace(seen);
            if before.is_none_or(|b| b.read != seen.read) || server.is_some_and(|e| e <= seen.read)
            {
                read_moved = now;
            }
            let (sent, acked) = seen.delivered;
            if before.is_none_or(|b| b.delivered.1 != acked) || sent == acked {
                acked_moved = now;
            }
            let why = verdict(seen, server, now - read_moved, now - acked_moved, w.after);
            match (&why, &said) {
                (Some(w), None) => tracing::warn!(reason = %w, "stalled"),
                (None, Some(_)) => tracing::info!("moving again after a stall"),
                _ => {}
            }
            // (the reason's seconds change at each look; said once, kept current in /healthz)
            w.health.set(CONDITION, why.clone());
            said = why;
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const AFTER: Duration = Duration::from_secs(60);

    fn seen(read: (i64, i64), sent: u64, acked: u64) -> Seen {
        Seen {
            read,
            delivered: (sent, acked),
        }
    }

    #[test]
    fn a_capture_idle_at_the_servers_end_is_not_stalled() {
        let s = seen((3, 1000), 10, 10);
        let long = Duration::from_secs(600);
        assert_eq!(verdict(s, Some((3, 1000)), long, long, AFTER), None);
        assert_eq!(verdict(s, None, long, long, AFTER), None);
    }

    #[test]
    fn reading_nothing_while_the_server_moves_on_is_a_stall_once_it_lasts() {
        let s = seen((3, 1000), 10, 10);
        let short = Duration::from_secs(59);
        assert_eq!(verdict(s, Some((3, 5000)), short, short, AFTER), None);
        let why = verdict(s, Some((4, 4)), AFTER, short, AFTER).expect("stalled");
        assert!(
            why.contains("read nothing for 60 s")
                && why.contains("file 4 offset 4")
                && why.contains("file 3 offset 1000"),
            "{why}"
        );
    }

    #[test]
    fn records_in_flight_unacknowledged_are_a_stall_once_it_lasts() {
        let s = seen((3, 1000), 25, 20);
        let why = verdict(s, Some((3, 1000)), Duration::ZERO, AFTER, AFTER).expect("stalled");
        assert!(why.contains("5 record(s)") && why.contains("60 s"), "{why}");
        // Nothing in flight: nothing to acknowledge.
        let s = seen((3, 1000), 20, 20);
        assert_eq!(
            verdict(s, Some((3, 1000)), Duration::ZERO, AFTER, AFTER),
            None
        );
    }
}
