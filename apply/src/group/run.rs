//! The run loop both apply binaries share: events taken from the consumer into the sink's
//! batch, a batch written when full or due, records of a taken-over capture skipped, a consumer
//! that hit a fatal error replaced, and on shutdown the batch written and the offsets committed
//! before leaving the group.

use std::sync::Arc;
use std::time::{Duration, Instant};

use rdkafka::consumer::{CommitMode, Consumer, ConsumerContext, StreamConsumer};
use rdkafka::message::BorrowedMessage;
use rdkafka::Message;
use sluice_common::Shutdown;

use super::context::{no_topic_yet, GroupContext};
use super::lifecycle::close_within;
use super::offsets::Drain;
use super::watcher::Watcher;
use crate::error::{ApplyError, Origin};

/// A sink that gathers the events of its consumer group into batches; [`run`] drives it.
#[allow(async_fn_in_trait)]
pub(crate) trait BatchSink {
    type Drain: Drain;
    /// The group's consumer (shared, so that a message can borrow it while the sink handles
    /// the message).
    fn consumer(&self) -> Arc<StreamConsumer<GroupContext<Self::Drain>>>;
    /// When the batch in hand got its first event, if it has any.
    fn batch_started(&self) -> Option<Instant>;
    /// The batch in hand reached its size limits.
    fn batch_full(&self) -> bool;
    /// When its batches are due ([`Pace`]).
    fn pace(&self) -> &Pace;
    /// Take one event into the batch (its offset is stored once the batch is written). The
    /// message is librdkafka's own, not copied; a sink that keeps it detaches it.
    async fn on_message(
        &mut self,
        m: &BorrowedMessage<'_>,
        shutdown: &Shutdown,
    ) -> Result<(), ApplyError>;
    /// Skip one record (of a taken-over capture, [`crate::incarnation`]): its offset is
    /// stored with the batch in hand, as if it had been handled.
    fn skip(&mut self, m: &BorrowedMessage<'_>);
    /// Write the batch in hand (or start writing it); its offsets are stored once written.
    async fn write_held(&mut self, shutdown: &Shutdown) -> Result<(), ApplyError>;
    /// Wait for every write started, storing their offsets.
    async fn settle(&mut self) -> Result<(), ApplyError> {
        Ok(())
    }
    /// The consumer hit a fatal error: replace it with a new one of the same settings,
    /// subscribed, as a restart would ([`retire`] the old one). What it held is dropped
    /// unstored: the new consumer reads on from the committed offsets.
    /// Returns the old consumer, [`retire`]d, for the caller to close.
    async fn rejoin(
        &mut self,
    ) -> Result<Arc<StreamConsumer<GroupContext<Self::Drain>>>, ApplyError>;
}

/// How long a stage waits before a new consumer joins after a fatal error: a member fenced by
/// another with the same `consumer.instance_id` must not take the partitions back at once.
const REJOIN_AFTER: Duration = Duration::from_secs(5);

/// Why the consumer can no longer be used, if it cannot: librdkafka's fatal errors (a static
/// member fenced, KIP-345) leave it dead, every later call failing.
fn fatal_error<C: ConsumerContext>(
    consumer: &StreamConsumer<C>,
    e: &rdkafka::error::KafkaError,
) -> Option<String> {
    let fatal = consumer.client().fatal_error();
    if !matches!(e, rdkafka::error::KafkaError::MessageConsumptionFatal(_)) && fatal.is_none() {
        return None;
    }
    Some(match fatal {
        Some((code, reason)) => format!("{code:?}: {reason}"),
        None => e.to_string(),
    })
}

/// A consumer being replaced: from now on its rebalances (its last one comes when it is
/// closed) leave the sink's batch alone, which is the new consumer's.
pub(crate) fn retire<D: Drain>(old: &StreamConsumer<GroupContext<D>>) {
    old.context().retire();
}

/// Consume until shutdown or an error: a batch is written when full, or once it holds an event
/// and `max_wait` has passed since the previous write began ([`due`]). On shutdown what is held
/// is written and the offsets committed before leaving the group.
pub(crate) async fn run<S: BatchSink>(sink: &mut S, shutdown: &Shutdown) -> Result<(), ApplyError> {
    run_loop(sink, shutdown).await
}

/// The error that stops the stage for `why` (Kafka's state, not an event).
fn stop(why: String) -> ApplyError {
    ApplyError::definite(Origin::Kafka, why)
}

/// When a sink's batches are written: `max_wait` (`batch.max_wait_ms`) and when the last write
/// to the target began (of rows or documents, from any path: a batch, the batch before a DDL
/// event, a table's part before a column change). A write of offsets only (heartbeats, DDL
/// events, skipped or dead-lettered records) costs the target nothing and does not count.
#[derive(Debug, Clone)]
pub struct Pace {
    max_wait: Duration,
    last_write: Option<Instant>,
}

impl Pace {
    pub fn new(max_wait: Duration) -> Self {
        Self {
            max_wait,
            last_write: None,
        }
    }

    /// A write of rows or documents begins now.
    pub fn writing(&mut self) {
        self.last_write = Some(Instant::now());
    }

    /// When a batch that got its first event at `started` is written: at once (as soon as no
    /// more events are ready) if the last write began `max_wait` ago or more, otherwise
    /// `max_wait` after it began. So an event waits at most `max_wait`, and only while writes
    /// would otherwise follow each other faster than one per `max_wait`: the first row after a
    /// quiet spell is written at once, while a steady stream is gathered into one write per
    /// `max_wait` (fewer, larger parts for the target to merge), and a write that takes long
    /// makes the next batch larger. (A full batch is written at once.)
    pub fn due(&self, started: Instant) -> Instant {
        match self.last_write {
            Some(w) => started.max(w + self.max_wait),
            None => started,
        }
    }

    /// When a sink with no batch in hand looks again.
    fn idle_until(&self) -> Instant {
        Instant::now() + self.max_wait
    }
}

/// Replace the sink's consumer by a new one of the same settings ([`BatchSink::rejoin`]), with
/// its own watcher; the old one is closed (it leaves the group).
async fn replace<S: BatchSink>(
    sink: &mut S,
    consumer: &mut Arc<StreamConsumer<GroupContext<S::Drain>>>,
    watcher: &mut Watcher,
) -> Result<(), ApplyError> {
    watcher.stop().await;
    let old = sink.rejoin().await?;
    *consumer = sink.consumer();
    // (the last reference: closing it leaves the group, on a thread of its own)
    close_within(old, "replaced").await;
    consumer.context().metrics.rejoins.inc();
    *watcher = Watcher::start(consumer);
    tracing::info!("a new Kafka consumer joined the group");
    Ok(())
}

/// A target changed under the batch in hand by another instance ([`ApplyError::ReadAgain`]):
/// the batch is dropped and the consumer replaced, so that the events not yet committed are
/// read again and written into the target as it is now.
async fn read_again<S: BatchSink>(
    sink: &mut S,
    consumer: &mut Arc<StreamConsumer<GroupContext<S::Drain>>>,
    watcher: &mut Watcher,
    why: &ApplyError,
) -> Result<(), ApplyError> {
    tracing::warn!(%why, "reading the events not yet committed again");
    replace(sink, consumer, watcher).await
}

async fn run_loop<S: BatchSink>(sink: &mut S, shutdown: &Shutdown) -> Result<(), ApplyError> {
    let mut consumer = sink.consumer();
    let mut watcher = Watcher::start(&consumer);
    // Messages taken without waiting since the clock was last read.
    let mut unclocked = 0u32;
    let result = loop {
        if shutdown.is_triggered() {
            break Ok(());
        }
        // Events expired unread at the assignment: nothing more is handled or stored.
        if let Some(why) = consumer.context().expired() {
            return Err(stop(why));
        }
        // Out of its group for long (the membership watch): replaced, as a restart would.
        if let Some(why) = consumer.context().take_out_of_group() {
            tracing::error!(
                %why,
                "the Kafka consumer is out of its group and did not come back by itself: a new \
                 consumer joins the group now, as a restart would; the events not yet committed \
                 are read and written again"
            );
            match replace(sink, &mut consumer, &mut watcher).await {
                Ok(()) => continue,
                Err(e) => break Err(e),
            }
        }
        // A message already fetched is taken without arming a timer; the batch's deadline is
        // checked against the clock only every 64 such messages (it is a bound on waiting, not
        // a beat: past it by at most 63 messages' handling; when none is ready the wait below
        // is bounded by the deadline).
        let ready = futures::FutureExt::now_or_never(consumer.recv());
        let step = match ready {
            Some(m) => {
                unclocked = unclocked.saturating_add(1);
                let overdue = unclocked >= 64
                    && sink.batch_started().is_some_and(|s| {
                        unclocked = 0;
                        Instant::now() >= sink.pace().due(s)
                    });
                if overdue {
                    match sink.write_held(shutdown).await {
                        Ok(()) => {}
                        Err(e) if e.is_read_again() => {
                            // (the message taken is read again too)
                            match read_again(sink, &mut consumer, &mut watcher, &e).await {
                                Ok(()) => continue,
                                Err(e) => break Err(e),
                            }
                        }
                        Err(e) => break Err(e),
                    }
                }
                Some(m)
            }
            None => {
                let deadline = sink
                    .batch_started()
                    .map(|s| sink.pace().due(s))
                    .unwrap_or_else(|| sink.pace().idle_until());
                tokio::select! {
                    biased;
                    _ = shutdown.wait() => break Ok(()),
                    _ = tokio::time::sleep_until(deadline.into()) => None,
                    m = consumer.recv() => Some(m),
                }
            }
        };
        let mut fatal = None;
        let r = match step {
            None => sink.write_held(shutdown).await,
            Some(Err(e)) if no_topic_yet(&e) => {
                tracing::debug!(error = %e, "no topic of the subscription yet");
                Ok(())
            }
            Some(Err(e)) => match fatal_error(&consumer, &e) {
                Some(why) => {
                    fatal = Some(why);
                    Ok(())
                }
                // A broker down or restarting: librdkafka retries by itself, and the client's
                // error callback says so once a minute; each poll's copy is detail.
                None if sluice_common::kafka::ErrorLog::transient(&e) => {
                    tracing::debug!(error = %e, "consumer error");
                    Ok(())
                }
                None => {
                    tracing::warn!(error = %e, "consumer error");
                    Ok(())
                }
            },
            // (the assignment that found it came inside this very receive)
            Some(Ok(_)) if consumer.context().expired().is_some() => {
                return Err(stop(consumer.context().expired().unwrap_or_default()));
            }
            Some(Ok(m)) => {
                let stamp = crate::incarnation::of(&m);
                let admit = consumer.context().incarnations.admit(
                    m.topic(),
                    m.partition(),
                    m.offset(),
                    stamp,
                );
                match admit {
                    crate::incarnation::Admit::Stale { seen, first } => {
                        consumer.context().metrics.stale_capture_records.inc();
                        if first {
                            let (connector, incarnation) = stamp.unwrap_or_default();
                            tracing::warn!(
                                topic = m.topic(),
                                partition = m.partition(),
                                offset = m.offset(),
                                connector,
                                incarnation,
                                successor = seen,
                                "skipping records of a capture that was taken over: they \
                                 reached Kafka after its successor's, which re-sent all they \
                                 hold (sluice_apply_stale_capture_records_total counts them)"
                            );
                        }
                        sink.skip(&m);
                        Ok(())
                    }
                    crate::incarnation::Admit::Yes => match sink.on_message(&m, shutdown).await {
                        Ok(()) if sink.batch_full() => sink.write_held(shutdown).await,
                        other => other,
                    },
                }
            }
        };
        match r {
            Ok(()) => {}
            Err(e) if e.is_read_again() => {
                if let Err(e) = read_again(sink, &mut consumer, &mut watcher, &e).await {
                    break Err(e);
                }
                continue;
            }
            Err(e) => break Err(e),
        }
        if let Some(why) = fatal {
            tracing::error!(
                error = %why,
                "the Kafka consumer hit a fatal error and cannot go on: fenced by another member \
                 with the same consumer.instance_id (each instance needs its own), or its group \
                 session timed out. A new consumer joins the group in {REJOIN_AFTER:?}, as a \
                 restart would; the events not yet committed are read and written again"
            );
            tokio::select! {
                _ = shutdown.wait() => break Ok(()),
                _ = tokio::time::sleep(REJOIN_AFTER) => {}
            }
            if let Err(e) = replace(sink, &mut consumer, &mut watcher).await {
                break Err(e);
            }
        }
    };
    watcher.stop().await;
    if result.is_ok() {
        // Write what is held (no longer interruptible), then commit synchronously.
        sink.write_held(&Shutdown::new()).await?;
        sink.settle().await?;
        if let Err(e) = sink.consumer().commit_consumer_state(CommitMode::Sync) {
            tracing::debug!(error = %e, "final commit (nothing to commit?)");
        }
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_batch_waits_only_while_writes_would_come_faster_than_one_per_max_wait() {
        let ms = Duration::from_millis;
        let mut pace = Pace::new(ms(500));
        let t0 = Instant::now();
        // The first batch since the start: at once.
        assert_eq!(pace.due(t0), t0);
        pace.writing();
        let t0 = pace.last_write.unwrap();
        // After a quiet spell (the last write began longer ago than max_wait): at once.
        assert_eq!(pace.due(t0 + ms(900)), t0 + ms(900));
        assert_eq!(pace.due(t0 + ms(500)), t0 + ms(500));
        // In a steady stream: max_wait after the last write began, so never longer than
        // max_wait after the batch's own first event.
        assert_eq!(pace.due(t0 + ms(10)), t0 + ms(500));
        assert_eq!(pace.due(t0), t0 + ms(500));
    }
}
