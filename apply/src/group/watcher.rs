//! The tasks beside each consumer: the lag watcher ([`super::metrics`]), the topic finder
//! that lets a new consumer see a new pipeline's topics at once, and the membership watch
//! ([`super::membership`]).

use std::sync::Arc;
use std::time::{Duration, Instant};

use rdkafka::consumer::{Consumer, StreamConsumer};

use super::context::GroupContext;
use super::metrics::watch_lag;
use super::offsets::Drain;

/// The lag watcher of one consumer, its topic finder ([`find_topics`]) and its membership
/// watch, stopped when dropped.
pub(super) struct Watcher {
    lag: Option<tokio::task::JoinHandle<()>>,
    finder: Option<tokio::task::JoinHandle<()>>,
    membership: Option<tokio::task::JoinHandle<()>>,
    /// Tells the finder and the membership watch to stop (it ends a metadata request in flight first, which holds the
    /// consumer).
    stop: Arc<std::sync::atomic::AtomicBool>,
}

impl Watcher {
    pub(super) fn start<D: Drain>(consumer: &Arc<StreamConsumer<GroupContext<D>>>) -> Self {
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        Watcher {
            lag: Some(tokio::spawn(watch_lag(
                consumer.clone(),
                consumer.context().metrics.clone(),
                Duration::from_secs(10),
            ))),
            finder: Some(tokio::spawn(find_topics(consumer.clone(), stop.clone()))),
            membership: Some(tokio::spawn(super::membership::watch(
                consumer.clone(),
                stop.clone(),
            ))),
            stop,
        }
    }

    /// Stop them all, and wait until they let go of their consumer.
    pub(super) async fn stop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        if let Some(task) = self.lag.take() {
            task.abort();
            let _ = task.await;
        }
        if let Some(task) = self.finder.take() {
            let _ = task.await;
        }
        if let Some(task) = self.membership.take() {
            // (asleep, or in a request of at most a few seconds)
            task.abort();
            let _ = task.await;
        }
    }
}

impl Drop for Watcher {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        if let Some(task) = &self.lag {
            task.abort();
        }
        if let Some(task) = &self.membership {
            task.abort();
        }
    }
}

/// How often [`find_topics`] asks for the topics, for how long after a consumer is made, and
/// for how long more while it holds no partition.
const FIND_TOPICS_EVERY: Duration = Duration::from_millis(250);
const FIND_TOPICS_FOR: Duration = Duration::from_secs(30);
const FIND_TOPICS_UNASSIGNED_FOR: Duration = Duration::from_secs(60);

/// The cluster's topics, every 250 ms, for the first 30 s of a consumer (and on to a minute
/// while it holds no partition). A pattern subscription (`^prefix\..*`) matches the topics of
/// the metadata librdkafka last read, which it refreshes every
/// `topic.metadata.refresh.interval.ms` (3 s): on a new pipeline, whose capture makes its topics
/// as their tables' first rows come, those rows would wait up to that long to be seen. A
/// metadata request for every topic makes librdkafka check the subscription against it at once
/// and join with the new topics. Later, the periodic refresh finds new tables' topics.
async fn find_topics<D: Drain>(
    consumer: Arc<StreamConsumer<GroupContext<D>>>,
    stop: Arc<std::sync::atomic::AtomicBool>,
) {
    let started = Instant::now();
    let due = |c: &StreamConsumer<GroupContext<D>>| {
        let since = started.elapsed();
        since < FIND_TOPICS_FOR
            || (since < FIND_TOPICS_UNASSIGNED_FOR && c.context().metrics.assigned.get() == 0)
    };
    while due(&consumer) && !stop.load(std::sync::atomic::Ordering::Relaxed) {
        let c = consumer.clone();
        // (a blocking call of librdkafka's, off the runtime's threads)
        let asked = tokio::task::spawn_blocking(move || {
            c.fetch_metadata(None, Duration::from_secs(2)).map(|_| ())
        })
        .await;
        if let Ok(Err(e)) = asked {
            tracing::debug!(error = %e, "asking for the cluster's topics");
        }
        tokio::time::sleep(FIND_TOPICS_EVERY).await;
    }
}
