//! The consumer's context: what happens at a rebalance (the batch in hand written and its
//! offsets committed before partitions go; at an assignment, offsets past the retention found
//! and the capture incarnations learnt), and librdkafka's errors logged.

use std::sync::Arc;
use std::time::Duration;

use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer, ConsumerContext, Rebalance};
use rdkafka::error::KafkaResult;
use rdkafka::ClientContext;

use super::metrics::GroupMetrics;
use super::offsets::Drain;

/// Consumer context: publishes the lag from librdkafka's statistics, logs rebalances, and
/// drains the sink before partitions are revoked.
pub struct GroupContext<D> {
    pub metrics: GroupMetrics,
    pub drain: D,
    /// Set at an assignment when a partition's committed offset is below its first offset:
    /// the events in between expired (retention) before they were written. The stage stops
    /// before it handles any event.
    pub expired: Arc<std::sync::Mutex<Option<String>>>,
    expired_flag: std::sync::atomic::AtomicBool,
    /// Set once this consumer is replaced ([`BatchSink::rejoin`]): its callbacks no longer
    /// touch the sink's batch, which belongs to the new consumer.
    retired: std::sync::atomic::AtomicBool,
    /// The capture incarnations seen per partition: records of a taken-over capture arriving
    /// after its successor's are skipped ([`crate::incarnation`]).
    pub incarnations: crate::incarnation::Incarnations,
    /// The group, and the stage's `/healthz`, for the membership watch
    /// ([`super::membership`]); without them the consumer is not watched.
    pub group: Option<String>,
    pub health: Option<sluice_common::metrics::Health>,
    /// Set by the membership watch: the consumer is out of its group, and why; the run loop
    /// replaces it.
    out_of_group: std::sync::Mutex<Option<String>>,
    /// librdkafka's errors, said without repeating.
    errors: sluice_common::kafka::ErrorLog,
}

impl<D> GroupContext<D> {
    pub fn new(metrics: GroupMetrics, drain: D) -> Self {
        Self {
            metrics,
            drain,
            expired: Default::default(),
            expired_flag: Default::default(),
            retired: Default::default(),
            incarnations: Default::default(),
            group: None,
            health: None,
            out_of_group: Default::default(),
            errors: sluice_common::kafka::ErrorLog::new("apply consumer"),
        }
    }

    /// Watched as a member of `group` ([`super::membership`]), said in `health`.
    pub fn watching(mut self, group: &str, health: &sluice_common::metrics::Health) -> Self {
        self.group = Some(group.to_string());
        self.health = Some(health.clone());
        self
    }

    /// The consumer is out of its group for `why`: the run loop replaces it.
    pub(super) fn out_of_group(&self, why: String) {
        *self.out_of_group.lock().expect("out-of-group lock") = Some(why);
    }

    /// Why the consumer must be replaced, if the membership watch found it out of its group.
    pub(super) fn take_out_of_group(&self) -> Option<String> {
        self.out_of_group.lock().expect("out-of-group lock").take()
    }

    /// This consumer is being replaced: from now on its rebalances leave the sink alone.
    pub fn retire(&self) {
        self.retired
            .store(true, std::sync::atomic::Ordering::SeqCst);
    }

    fn is_retired(&self) -> bool {
        self.retired.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Why the stage must stop (events expired unread), if it must.
    pub(super) fn expired(&self) -> Option<String> {
        if !self.expired_flag.load(std::sync::atomic::Ordering::Relaxed) {
            return None;
        }
        self.expired.lock().expect("expired lock").clone()
    }

    /// Partitions of `tpl` whose committed offset is below their first offset, with both.
    /// Learns on the way the capture incarnations each committed offset carries.
    fn expired_in(
        &self,
        consumer: &BaseConsumer<Self>,
        tpl: &rdkafka::TopicPartitionList,
    ) -> Result<Vec<String>, String>
    where
        Self: ConsumerContext,
    {
        let timeout = Duration::from_secs(10);
        // Each request tried three times: unanswered, the check cannot be skipped (librdkafka
        // would reset to the earliest offset without a word).
        fn tried<T>(mut f: impl FnMut() -> KafkaResult<T>) -> KafkaResult<T> {
            let mut last = f();
            for _ in 0..2 {
                if last.is_ok() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(500));
                last = f();
            }
            last
        }
        let committed = tried(|| consumer.committed_offsets(tpl.clone(), timeout))
            .map_err(|e| format!("the committed offsets: {e}"))?;
        // Every partition's first offset in one request: the first at or after time 0. A
        // partition with nothing left (End) is asked for its watermarks on its own.
        let mut times = rdkafka::TopicPartitionList::with_capacity(tpl.count());
        for e in committed.elements() {
            if matches!(e.offset(), rdkafka::Offset::Offset(_)) {
                let _ = times.add_partition_offset(
                    e.topic(),
                    e.partition(),
                    rdkafka::Offset::Offset(0),
                );
            }
        }
        let firsts = if times.count() == 0 {
            rdkafka::TopicPartitionList::new()
        } else {
            tried(|| consumer.offsets_for_times(times.clone(), timeout))
                .map_err(|e| format!("the partitions' first offsets: {e}"))?
        };
        let mut out = Vec::new();
        for e in committed.elements() {
            if let Some(known) = crate::incarnation::from_metadata(e.metadata()) {
                self.incarnations.assigned(e.topic(), e.partition(), known);
            }
            let rdkafka::Offset::Offset(at) = e.offset() else {
                continue; // nothing committed: a new group starts at the beginning
            };
            let first = firsts
                .find_partition(e.topic(), e.partition())
                .and_then(|f| match f.offset() {
                    rdkafka::Offset::Offset(n) if n >= 0 => Some(n),
                    _ => None,
                });
            let low = match first {
                Some(n) => n,
                None => {
                    tried(|| consumer.fetch_watermarks(e.topic(), e.partition(), timeout))
                        .map_err(|err| {
                            format!(
                                "the first offset of {} partition {}: {err}",
                                e.topic(),
                                e.partition()
                            )
                        })?
                        .0 // nothing left: its first offset is its end
                }
            };
            if at < low {
                out.push(format!(
                    "{} partition {}: committed offset {at}, first offset now {low} ({} events expired unread)",
                    e.topic(),
                    e.partition(),
                    low - at
                ));
            }
        }
        Ok(out)
    }
}

/// "No topic matches the subscription yet": the normal start of a new pipeline, before the
/// capture created its topics (they are found at the next metadata refresh).
pub(super) fn no_topic_yet(e: &rdkafka::error::KafkaError) -> bool {
    e.rdkafka_error_code() == Some(rdkafka::types::RDKafkaErrorCode::UnknownTopicOrPartition)
}

impl<D: Drain> ClientContext for GroupContext<D> {
    fn error(&self, error: rdkafka::error::KafkaError, reason: &str) {
        if no_topic_yet(&error) {
            tracing::info!(%reason, "no topic of the subscription exists yet (a new pipeline: the capture creates them); waiting");
        } else {
            self.errors.note(&error, reason);
        }
    }

    fn log(&self, level: rdkafka::config::RDKafkaLogLevel, fac: &str, message: &str) {
        sluice_common::kafka::librdkafka_log(level, fac, message);
    }
}

impl<D: Drain> ConsumerContext for GroupContext<D> {
    fn pre_rebalance(&self, consumer: &BaseConsumer<Self>, r: &Rebalance<'_>) {
        tracing::info!("rebalance: {}", describe_rebalance(r));
        if self.is_retired() {
            return;
        }
        if let Rebalance::Revoke(_) = r {
            let drained = self.drain.drain();
            if consumer.assignment_lost() {
                // The session timed out: the partitions may already be another member's, and
                // this member's id is gone. What was written is not stored (the next owner
                // reads it again, harmlessly); a commit now would carry the old member id,
                // which the broker refuses, for a static member (`consumer.instance_id`) with
                // a fatal error.
                tracing::warn!(
                    "the group session timed out: the partitions were lost; the batch in hand \
                     was written, and its events are read again by their next owner"
                );
            } else if let Some(offsets) = drained {
                offsets.store(consumer, &self.incarnations);
                if let Err(e) = consumer.commit_consumer_state(CommitMode::Sync) {
                    tracing::warn!(error = %e, "commit before letting partitions go failed");
                }
            }
        }
    }

    fn post_rebalance(&self, consumer: &BaseConsumer<Self>, r: &Rebalance<'_>) {
        if self.is_retired() {
            return;
        }
        match r {
            Rebalance::Assign(tpl) => {
                self.metrics.assigned.set(tpl.count() as i64);
                self.drain.assigned(tpl);
                // (requests to the brokers: off the runtime's worker, which other tasks share)
                let checked = if tokio::runtime::Handle::try_current().is_ok() {
                    tokio::task::block_in_place(|| self.expired_in(consumer, tpl))
                } else {
                    self.expired_in(consumer, tpl)
                };
                let why = match checked {
                    Ok(expired) if expired.is_empty() => None,
                    Ok(expired) => Some(format!(
                        "events expired from Kafka (the topic's retention) before this group \
                         wrote them: {}. Reading on would skip them. Re-snapshot the tables \
                         (the capture's snapshot.request_id and snapshot.tables), then reset the \
                         group's offsets (kafka-consumer-groups --reset-offsets --to-earliest) \
                         and start again; keep outages of the apply stage shorter than the \
                         retention",
                        expired.join("; ")
                    )),
                    Err(what) => Some(format!(
                        "could not read {what} at the assignment, so whether events expired from \
                         Kafka before this group wrote them is unknown; stopping rather than let \
                         the consumer reset past them. Start again once the brokers answer"
                    )),
                };
                if let Some(why) = why {
                    tracing::error!(%why, "offsets past the retention, or not checked");
                    *self.expired.lock().expect("expired lock") = Some(why);
                    self.expired_flag
                        .store(true, std::sync::atomic::Ordering::Relaxed);
                }
            }
            Rebalance::Revoke(_) => {
                self.metrics.assigned.set(0);
                self.incarnations.clear();
            }
            Rebalance::Error(_) => {}
        }
    }
}

/// A rebalance for the log: `assigned partitions=topic[0,1,2] other[0]`,
/// `revoked partitions=...`, or the error.
fn describe_rebalance(r: &Rebalance<'_>) -> String {
    match r {
        Rebalance::Assign(tpl) => format!("assigned partitions={}", partition_list(tpl)),
        Rebalance::Revoke(tpl) => format!("revoked partitions={}", partition_list(tpl)),
        Rebalance::Error(e) => format!("error: {e}"),
    }
}

/// `topic[0,1,2] other[0]`, topics in name order, partitions in number order; `none` when
/// empty.
fn partition_list(tpl: &rdkafka::TopicPartitionList) -> String {
    let mut by_topic: std::collections::BTreeMap<String, Vec<i32>> = Default::default();
    for e in tpl.elements() {
        by_topic
            .entry(e.topic().to_string())
            .or_default()
            .push(e.partition());
    }
    if by_topic.is_empty() {
        return "none".into();
    }
    by_topic
        .into_iter()
        .map(|(topic, mut ps)| {
            ps.sort_unstable();
            let ps: Vec<String> = ps.iter().map(ToString::to_string).collect();
            format!("{topic}[{}]", ps.join(","))
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// Run `fut` to completion from a rebalance callback: those run inside the consumer's poll,
/// either on a runtime worker (block in place) or on a plain thread.
pub fn block_on<F: std::future::Future>(runtime: &tokio::runtime::Handle, fut: F) -> F::Output {
    if tokio::runtime::Handle::try_current().is_ok() {
        tokio::task::block_in_place(|| runtime.block_on(fut))
    } else {
        runtime.block_on(fut)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rebalances_are_logged_as_topic_and_partition_lists() {
        let mut tpl = rdkafka::TopicPartitionList::new();
        tpl.add_partition("cdc.db.b", 2);
        tpl.add_partition("cdc.db.a", 1);
        tpl.add_partition("cdc.db.b", 0);
        assert_eq!(
            describe_rebalance(&Rebalance::Assign(&tpl)),
            "assigned partitions=cdc.db.a[1] cdc.db.b[0,2]"
        );
        assert_eq!(
            describe_rebalance(&Rebalance::Revoke(&rdkafka::TopicPartitionList::new())),
            "revoked partitions=none"
        );
    }
}
