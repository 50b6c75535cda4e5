//! The acker: one task that takes the publisher's marks in order, waits until every record
//! before a mark is acknowledged, and writes the mark's checkpoint to the checkpoint topic
//! (compacted, key = connector) at most every `checkpoint_interval_ms`, and always at the end;
//! an unchanged one again every [`KEEPALIVE`] (see [`crate::checkpoint`]: a fenced capture learns
//! it there). A failed delivery ends it with the failure: the capture stops, and resumes from the
//! last checkpoint written. A [`Mark::Store`] is written at once, whatever the interval, and
//! answered once it is committed: a capture that must not publish before its position is
//! durable (a new connector's start, a snapshot's start) waits for that answer.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rdkafka::producer::Producer;
use serde::Serialize;
use tokio::sync::{mpsc, oneshot};

use super::ledger::KafkaProducer;
use super::{PublishError, PublishMetrics};
use crate::checkpoint::{CheckpointWriter, KEEPALIVE};

/// A point the acker waits for: every record below `upto` acknowledged.
pub(super) enum Mark<C> {
    /// ... makes `checkpoint` safe to resume from.
    At { upto: u64, checkpoint: C },
    /// ... makes `checkpoint` safe to resume from, written at once; `done` is answered once it
    /// is committed (dropped unanswered when the write failed: the acker ends with the error).
    Store {
        upto: u64,
        checkpoint: C,
        done: oneshot::Sender<()>,
    },
    /// ... and then the acker writes the last checkpoint and returns.
    End { upto: u64 },
}

pub(super) async fn ack_loop<C: Serialize + Clone>(
    mut rx: mpsc::Receiver<Mark<C>>,
    resumed: Option<C>,
    producer: Arc<KafkaProducer>,
    next: Arc<AtomicU64>,
    writer: Arc<CheckpointWriter>,
    interval: Duration,
    metrics: PublishMetrics,
) -> Result<Option<C>, PublishError> {
    let ledger = producer.context();
    let mut acked = ledger.acked.subscribe();
    let mut failed = ledger.failed.subscribe();
    // The checkpoint resumed from is written again every KEEPALIVE until the first mark: a
    // capture idle since its start learns of a successor too.
    let mut safe: Option<C> = resumed;
    let mut written = true; // nothing new to write yet
    let mut last_write = Instant::now();
    // Write `c` to the checkpoint topic and wait for its commit (every record before it is
    // acknowledged already).
    let write = |c: C| {
        let writer = writer.clone();
        let metrics = metrics.clone();
        async move {
            let payload = serde_json::to_vec(&c).expect("checkpoints serialize");
            let result = writer.write(payload).await;
            let outcome = if result.is_ok() { "ok" } else { "error" };
            metrics.checkpoints.with_label_values(&[outcome]).inc();
            result
        }
    };
    let due = |last_write: Instant| tokio::time::Instant::from_std(last_write + interval);
    loop {
        // The next mark; meanwhile a checkpoint held is written when its interval is up, and a
        // failed delivery ends the loop.
        let mark = tokio::select! {
            m = rx.recv() => m,
            _ = tokio::time::sleep_until(due(last_write)), if !written => {
                write(safe.clone().expect("pending")).await?;
                written = true;
                last_write = Instant::now();
                continue;
            }
            _ = tokio::time::sleep_until(tokio::time::Instant::from_std(last_write + KEEPALIVE)),
                if written && safe.is_some() => {
                write(safe.clone().expect("some")).await?;
                last_write = Instant::now();
                continue;
            }
            changed = failed.changed() => {
                changed.map_err(|_| PublishError::AckerGone)?;
                if let Some(e) = ledger.failure() {
                    return Err(e);
                }
                continue;
            }
        };
        let (upto, checkpoint, done) = match mark {
            Some(Mark::At { upto, checkpoint }) => (upto, Some(checkpoint), None),
            Some(Mark::Store {
                upto,
                checkpoint,
                done,
            }) => (upto, Some(checkpoint), Some(done)),
            Some(Mark::End { upto }) => (upto, None, None),
            None => (next.load(Ordering::Relaxed), None, None),
        };
        // Wait for the mark's records, writing a held checkpoint when its interval is up.
        loop {
            if let Some(e) = ledger.failure() {
                return Err(e);
            }
            if *acked.borrow_and_update() >= upto {
                break;
            }
            tokio::select! {
                changed = acked.changed() => changed.map_err(|_| PublishError::AckerGone)?,
                _ = tokio::time::sleep_until(due(last_write)), if !written => {
                    write(safe.clone().expect("pending")).await?;
                    written = true;
                    last_write = Instant::now();
                }
            }
        }
        match checkpoint {
            Some(c) => {
                safe = Some(c);
                written = false;
                if done.is_some() || last_write.elapsed() >= interval {
                    write(safe.clone().expect("set")).await?;
                    written = true;
                    last_write = Instant::now();
                }
                if let Some(done) = done {
                    let _ = done.send(());
                }
            }
            None => {
                if !written {
                    write(safe.clone().expect("pending")).await?;
                }
                return Ok(safe);
            }
        }
    }
}
