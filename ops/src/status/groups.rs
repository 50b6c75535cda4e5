//! The apply groups: per partition, the committed offset, the end, the events behind and how
//! long the first of them has waited; the members and the partitions each holds.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::{Message, Offset, TopicPartitionList};
use serde::Serialize;
use sluice_common::KafkaConfig;

use super::CLIENT;

/// One consumer group.
#[derive(Debug, Serialize)]
pub struct Group {
    pub name: String,
    /// The coordinator's state: `Stable`, `Empty` (no member running), `PreparingRebalance`...
    pub state: String,
    pub members: Vec<Member>,
    pub partitions: Vec<PartitionLag>,
    /// Sums and maxima over the partitions.
    pub lag_messages: i64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lag_seconds: Option<f64>,
}

#[derive(Debug, Serialize)]
pub struct Member {
    pub id: String,
    pub client_id: String,
    pub host: String,
    /// topic -> partitions assigned.
    pub partitions: BTreeMap<String, Vec<i32>>,
}

#[derive(Debug, Serialize)]
pub struct PartitionLag {
    pub topic: String,
    pub partition: i32,
    /// The next offset the group reads (Kafka's committed offset); absent when nothing is
    /// committed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub committed: Option<i64>,
    pub start: i64,
    pub end: i64,
    /// Events not committed: the end minus the committed offset (or the start).
    pub lag_messages: i64,
    /// How long the first event not committed has waited (now minus its Kafka timestamp).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lag_seconds: Option<f64>,
    /// The committed offset is below the partition's start: events expired before the group
    /// read them (the apply stage refuses to start on such a partition).
    pub expired: bool,
}

/// Every consumer group that committed offsets on a topic (or only `groups`, each listed even
/// without offsets).
pub fn read_groups(kafka: &KafkaConfig, groups: &[String]) -> Result<Vec<Group>, String> {
    let timeout = kafka.request_timeout();
    let consumer = consumer(kafka, "")?;
    let md = consumer
        .fetch_metadata(None, timeout)
        .map_err(|e| format!("cannot read the topics from {}: {e}", kafka.brokers))?;
    // Every topic a group may have committed on: all but Kafka's own.
    let topics: Vec<(String, Vec<i32>)> = md
        .topics()
        .iter()
        .filter(|t| !t.name().starts_with("__") && t.error().is_none())
        .map(|t| {
            (
                t.name().to_string(),
                t.partitions().iter().map(|p| p.id()).collect(),
            )
        })
        .collect();
    let list = consumer
        .fetch_group_list(None, timeout)
        .map_err(|e| format!("cannot list the consumer groups: {e}"))?;
    let mut names: Vec<String> = list
        .groups()
        .iter()
        .filter(|g| g.protocol_type() == "consumer" || g.protocol_type().is_empty())
        .map(|g| g.name().to_string())
        .filter(|n| groups.is_empty() || groups.contains(n))
        .collect();
    for g in groups {
        if !names.contains(g) {
            names.push(g.clone()); // a group may have offsets and no coordinator entry yet
        }
    }
    names.sort();
    let mut out = Vec::new();
    for name in names {
        let info = list.groups().iter().find(|g| g.name() == name);
        let g = group(kafka, &name, info, &topics, timeout)?;
        if g.partitions.is_empty() && g.members.is_empty() && !groups.contains(&name) {
            continue; // no offsets on any topic: a reader's group, not an apply stage's
        }
        out.push(g);
    }
    Ok(out)
}

pub(crate) fn consumer(kafka: &KafkaConfig, group: &str) -> Result<BaseConsumer, String> {
    let mut c = kafka.client_config(CLIENT);
    let id = if group.is_empty() {
        format!("{CLIENT}-{}", std::process::id())
    } else {
        group.to_string()
    };
    c.set("group.id", id)
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false");
    c.create()
        .map_err(|e| format!("cannot make a Kafka client for {}: {e}", kafka.brokers))
}

fn group(
    kafka: &KafkaConfig,
    name: &str,
    info: Option<&rdkafka::groups::GroupInfo>,
    topics: &[(String, Vec<i32>)],
    timeout: Duration,
) -> Result<Group, String> {
    let members: Vec<Member> = info
        .map(|g| {
            g.members()
                .iter()
                .map(|m| Member {
                    id: m.id().to_string(),
                    client_id: m.client_id().to_string(),
                    host: m.client_host().to_string(),
                    partitions: m.assignment().and_then(assignment).unwrap_or_default(),
                })
                .collect()
        })
        .unwrap_or_default();
    let assigned = |topic: &str, p: i32| {
        members
            .iter()
            .any(|m| m.partitions.get(topic).is_some_and(|ps| ps.contains(&p)))
    };
    let c = consumer(kafka, name)?;
    let mut tpl = TopicPartitionList::new();
    for (t, ps) in topics {
        for p in ps {
            tpl.add_partition(t, *p);
        }
    }
    let committed = if tpl.count() == 0 {
        TopicPartitionList::new()
    } else {
        c.committed_offsets(tpl, timeout)
            .map_err(|e| format!("group {name}: cannot read its committed offsets: {e}"))?
    };
    let mut partitions = Vec::new();
    for e in committed.elements() {
        let at = match e.offset() {
            Offset::Offset(n) => Some(n),
            _ => None,
        };
        if at.is_none() && !assigned(e.topic(), e.partition()) {
            continue;
        }
        let (start, end) = c
            .fetch_watermarks(e.topic(), e.partition(), timeout)
            .map_err(|x| format!("{}[{}]: {x}", e.topic(), e.partition()))?;
        let from = at.unwrap_or(start);
        partitions.push(PartitionLag {
            topic: e.topic().to_string(),
            partition: e.partition(),
            committed: at,
            start,
            end,
            lag_messages: (end - from).max(0),
            lag_seconds: None,
            expired: at.is_some_and(|n| n < start),
        });
    }
    waiting_ages(kafka, &mut partitions, timeout)?;
    let lag_messages = partitions.iter().map(|p| p.lag_messages).sum();
    let lag_seconds = partitions
        .iter()
        .filter_map(|p| p.lag_seconds)
        .fold(None, |m: Option<f64>, s| Some(m.map_or(s, |m| m.max(s))));
    Ok(Group {
        name: name.to_string(),
        state: info.map_or_else(|| "unknown".into(), |g| g.state().to_string()),
        members,
        partitions,
        lag_messages,
        lag_seconds,
    })
}

/// The age of the first event not committed on each partition that is behind: read that one
/// event's timestamp.
fn waiting_ages(
    kafka: &KafkaConfig,
    partitions: &mut [PartitionLag],
    timeout: Duration,
) -> Result<(), String> {
    let mut tpl = TopicPartitionList::new();
    for p in partitions.iter().filter(|p| p.lag_messages > 0) {
        let from = p.committed.unwrap_or(p.start).max(p.start);
        tpl.add_partition_offset(&p.topic, p.partition, Offset::Offset(from))
            .map_err(|e| e.to_string())?;
    }
    if tpl.count() == 0 {
        return Ok(());
    }
    let c = consumer(kafka, "")?;
    c.assign(&tpl).map_err(|e| e.to_string())?;
    let mut left = tpl.count();
    let deadline = Instant::now() + timeout;
    let now_ms = sluice_common::clock::now_micros() as f64 / 1000.0;
    while left > 0 && Instant::now() < deadline {
        match c.poll(Duration::from_millis(200)) {
            Some(Ok(m)) => {
                if let Some(p) = partitions
                    .iter_mut()
                    .find(|p| p.topic == m.topic() && p.partition == m.partition())
                {
                    if p.lag_seconds.is_none() {
                        left -= 1;
                        if let Some(ms) = m.timestamp().to_millis() {
                            p.lag_seconds = Some(((now_ms - ms as f64) / 1000.0).max(0.0));
                        }
                    }
                }
                let mut done = TopicPartitionList::new();
                done.add_partition(m.topic(), m.partition());
                let _ = c.incremental_unassign(&done);
            }
            Some(Err(e)) => return Err(format!("reading the first event waiting: {e}")),
            None => {}
        }
    }
    Ok(())
}

pub use sluice_apply::group::assignment;

#[cfg(test)]
mod tests {
    use super::*;

    fn encode(version: i16, topics: &[(&str, &[i32])], user: &[u8]) -> Vec<u8> {
        let mut b = version.to_be_bytes().to_vec();
        b.extend((topics.len() as i32).to_be_bytes());
        for (t, ps) in topics {
            b.extend((t.len() as i16).to_be_bytes());
            b.extend(t.as_bytes());
            b.extend((ps.len() as i32).to_be_bytes());
            for p in *ps {
                b.extend(p.to_be_bytes());
            }
        }
        b.extend((user.len() as i32).to_be_bytes());
        b.extend(user);
        b
    }

    #[test]
    fn a_members_assignment_is_read_from_the_consumer_protocol() {
        let b = encode(1, &[("s.db.t", &[2, 0]), ("s.db.u", &[1])], b"xy");
        let a = assignment(&b).unwrap();
        assert_eq!(a["s.db.t"], vec![0, 2]);
        assert_eq!(a["s.db.u"], vec![1]);
        assert_eq!(a.len(), 2);
        assert_eq!(assignment(&[]).unwrap().len(), 0, "no assignment yet");
        // Cut short anywhere: not parsed, rather than half a list.
        for n in 1..b.len() - 6 {
            assert_eq!(assignment(&b[..n]), None, "cut at {n}");
        }
    }
}
