//! Waiting for the pipeline to catch up with a source position: the capture's checkpoint at or
//! past it (no snapshot of the table under way), then the apply group's committed offsets at
//! the ends the table's topic had at that moment.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::{Offset, TopicPartitionList};
use sluice_capture::checkpoint::Checkpoint;
use sluice_capture::mysql::position::BinlogPos;

/// The version of a binlog position in a generation (`sluice_proto::mysql_version_in` of its
/// first row): every row event before the position is below it, every one after above.
pub fn position_version(generation: u8, p: &BinlogPos) -> Result<u64, String> {
    sluice_proto::mysql_version_in(generation, &p.file, p.pos, 0).map_err(|e| e.to_string())
}

pub(super) fn pos_key(p: &BinlogPos) -> (u64, u64) {
    (sluice_proto::binlog_file_seq(&p.file).unwrap_or(0), p.pos)
}

/// Waits until the target has caught up past a source position.
pub(crate) struct Pipeline {
    pub(crate) capture_kafka: sluice_common::KafkaConfig,
    pub(crate) checkpoint_topic: String,
    pub(crate) connector: String,
    pub(crate) apply_kafka: sluice_common::KafkaConfig,
    pub(crate) group: String,
    pub(crate) topics: sluice_proto::TopicTemplate,
}

impl Pipeline {
    /// The pipeline of a capture (its checkpoints, its topics) and an apply group.
    pub(crate) fn new(
        capture: &impl sluice_capture::Connector,
        apply_kafka: &sluice_common::KafkaConfig,
        group: &str,
    ) -> Result<Self, String> {
        Ok(Self {
            capture_kafka: capture.kafka().clone(),
            checkpoint_topic: capture.publish().checkpoint_topic.clone(),
            connector: capture.connector().to_string(),
            apply_kafka: apply_kafka.clone(),
            group: group.to_string(),
            topics: capture.topics().template().map_err(|e| e.to_string())?,
        })
    }

    /// Blocks until the capture's checkpoint is at or past `p` with no snapshot of the table
    /// under way, and the group has committed every event the table's topic had then. Returns
    /// the capture's binlog generation.
    pub(super) fn wait(
        &self,
        p: &BinlogPos,
        db: &str,
        table: &str,
        limit: Duration,
    ) -> Result<u8, String> {
        let cp = self.wait_for(
            &|cp| match cp {
                Checkpoint::Mysql(c) => (pos_key(&c.next) >= pos_key(p), c.next.to_string()),
                other => (false, other.position()),
            },
            &p.to_string(),
            db,
            table,
            limit,
        )?;
        Ok(cp.generation())
    }

    /// Blocks until `reached` says the capture's checkpoint is at or past the source position
    /// `target` (it answers whether, and where the checkpoint is), with no snapshot of
    /// `db.table` under way, and then until the group has committed every event the table's
    /// topic had at that moment. Returns the checkpoint.
    pub(crate) fn wait_for(
        &self,
        reached: &dyn Fn(&Checkpoint) -> (bool, String),
        target: &str,
        db: &str,
        table: &str,
        limit: Duration,
    ) -> Result<Checkpoint, String> {
        let started = Instant::now();
        let deadline = started + limit;
        let name = format!("{db}.{table}");
        let late = |what: String| {
            format!(
                "the target did not catch up with the source's position {target} within {} s: \
                 {what}",
                limit.as_secs()
            )
        };
        let checkpoint = loop {
            let stored =
                crate::status::read_checkpoints(&self.capture_kafka, &self.checkpoint_topic)?;
            let Some(cp) = stored.get(&self.connector) else {
                // A capture just started stores its first checkpoint at its first commit.
                if Instant::now() > deadline {
                    return Err(format!(
                        "connector {:?} has no checkpoint on {}: is the capture running with \
                         this config?",
                        self.connector, self.checkpoint_topic
                    ));
                }
                std::thread::sleep(Duration::from_millis(150));
                continue;
            };
            let (done, at) = reached(&cp.checkpoint);
            let snapshotting = cp.checkpoint.snapshotting(&name);
            if done && !snapshotting {
                break cp.checkpoint.clone();
            }
            // A running capture stores a checkpoint every 10 s: one that stored none for longer
            // than the window the tools use (and not since this wait began) is not running, and
            // waiting on would only run out the time.
            let age = sluice_common::clock::now_secs().saturating_sub(cp.checkpoint.written_at());
            if age > crate::position::RUNNING_WINDOW.as_secs()
                && started.elapsed() > Duration::from_secs(15)
            {
                return Err(format!(
                    "the capture {} stored its last checkpoint {age} s ago, at {at}, short of the \
                     source's position {target} (a running capture stores one every 10 s): it \
                     is not running. Start it, then verify again",
                    self.connector
                ));
            }
            if Instant::now() > deadline {
                return Err(late(if snapshotting {
                    format!("the capture's snapshot of {name} is not done")
                } else {
                    format!("the capture {} is at {at}", self.connector)
                }));
            }
            std::thread::sleep(Duration::from_millis(150));
        };
        let topic = self.topics.topic(db, table).map_err(|e| e.to_string())?;
        let timeout = self.apply_kafka.request_timeout();
        let consumer = crate::status::consumer(&self.apply_kafka, &self.group)?;
        let md = consumer
            .fetch_metadata(Some(&topic), timeout)
            .map_err(|e| format!("topic {topic}: {e}"))?;
        let Some(t) = md
            .topics()
            .iter()
            .find(|t| t.name() == topic && t.error().is_none())
        else {
            return Ok(checkpoint); // nothing was ever published for the table
        };
        let mut ends = TopicPartitionList::new();
        for part in t.partitions() {
            let (low, high) = consumer
                .fetch_watermarks(&topic, part.id(), timeout)
                .map_err(|e| format!("topic {topic}[{}]: {e}", part.id()))?;
            // A partition holding nothing (a partition added to the topic that no event went
            // to yet) is caught up whatever the group committed there (nothing, or before).
            if high <= low {
                continue;
            }
            ends.add_partition_offset(&topic, part.id(), Offset::Offset(high))
                .map_err(|e| e.to_string())?;
        }
        loop {
            let committed = committed(&consumer, &ends, timeout)?;
            let behind: Vec<String> = ends
                .elements()
                .iter()
                .filter_map(|e| {
                    let end = e.offset().to_raw().unwrap_or(0);
                    let at = committed.get(&e.partition()).copied().unwrap_or(-1);
                    (at < end).then(|| format!("[{}] {at} < {end}", e.partition()))
                })
                .collect();
            if behind.is_empty() {
                return Ok(checkpoint);
            }
            if Instant::now() > deadline {
                return Err(late(format!(
                    "group {} has not committed {topic} up to {}",
                    self.group,
                    behind.join(", ")
                )));
            }
            std::thread::sleep(Duration::from_millis(150));
        }
    }
}

fn committed(
    consumer: &BaseConsumer,
    ends: &TopicPartitionList,
    timeout: Duration,
) -> Result<HashMap<i32, i64>, String> {
    let mut tpl = TopicPartitionList::new();
    for e in ends.elements() {
        tpl.add_partition(e.topic(), e.partition());
    }
    let got = consumer
        .committed_offsets(tpl, timeout)
        .map_err(|e| format!("committed offsets: {e}"))?;
    Ok(got
        .elements()
        .iter()
        .filter_map(|e| e.offset().to_raw().map(|o| (e.partition(), o)))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    pub(super) fn positions_order_as_their_versions() {
        let a = BinlogPos {
            file: "mysql-bin.000002".into(),
            pos: 900,
        };
        let b = BinlogPos {
            file: "mysql-bin.000003".into(),
            pos: 4,
        };
        assert!(position_version(0, &a).unwrap() < position_version(0, &b).unwrap());
        assert!(position_version(0, &b).unwrap() < position_version(1, &a).unwrap());
        assert!(pos_key(&a) < pos_key(&b));
        // The event at the position itself (its first row) is not before it.
        assert_eq!(
            position_version(0, &a).unwrap(),
            sluice_proto::mysql_version("mysql-bin.000002", 900, 0).unwrap()
        );
    }
}
