//! A consumer group's start and end: whether the group has run before (a stage restarting
//! during an outage waits for its target; a first start fails fast), and leaving the group at
//! shutdown without hanging.

use std::time::Duration;

use rdkafka::consumer::{BaseConsumer, Consumer};

/// How long closing the Kafka consumer (leaving the group) may take at shutdown.
pub const CLOSE_WITHIN: Duration = Duration::from_secs(20);

/// Drop `sink` (closing its consumer: leaving the group, librdkafka's own teardown) on a
/// thread of its own, waiting at most [`CLOSE_WITHIN`]. The offsets are committed before (the
/// run's end), so a close that hangs loses nothing: the stage exits without waiting for it
/// (its partitions go to another member once the session times out) rather than hang a
/// shutdown.
pub async fn close_within<S: Send + 'static>(sink: S, what: &str) {
    let (tx, rx) = tokio::sync::oneshot::channel();
    let spawned = std::thread::Builder::new()
        .name("consumer-close".into())
        .spawn(move || {
            drop(sink);
            let _ = tx.send(());
        });
    if spawned.is_err() {
        return;
    }
    if tokio::time::timeout(CLOSE_WITHIN, rx).await.is_err() {
        tracing::warn!(
            within = ?CLOSE_WITHIN,
            "closing the {what} Kafka consumer did not finish in time; exiting without waiting (the offsets are committed)"
        );
    }
}

/// Whether consumer group `group` has run before: the broker knows it (with members, or with
/// committed offsets only). A stage of such a group that cannot reach its target at start is
/// restarting during an outage, and waits; a first start fails fast (a wrong address).
pub async fn group_has_run(
    kafka: &sluice_common::KafkaConfig,
    client_id: &str,
    group: &str,
) -> bool {
    let config = kafka.client_config(client_id);
    let (group, timeout) = (group.to_string(), kafka.request_timeout());
    tokio::task::spawn_blocking(move || {
        let consumer: BaseConsumer = match config.create() {
            Ok(c) => c,
            Err(_) => return false,
        };
        consumer
            .fetch_group_list(Some(&group), timeout)
            .map(|l| {
                l.groups()
                    .iter()
                    .any(|g| g.name() == group && g.state() != "Dead" && !g.state().is_empty())
            })
            .unwrap_or(false)
    })
    .await
    .unwrap_or(false)
}
