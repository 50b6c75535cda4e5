//! `sluice status`: where each capture connector stands and how far each apply group is
//! behind, read from Kafka alone.
//!
//! - A connector's position is its last committed checkpoint in the checkpoint topic (read
//!   with `isolation.level=read_committed`, as the captures read it): the binlog coordinate and
//!   GTID set (capture-mysql) or the oplog time and resume token (capture-mongo), when it was
//!   stored, and the snapshot under way.
//! - An apply group's lag is, per partition, the partition's end minus the group's committed
//!   offset (the partition's start when nothing is committed yet), and the age of the first
//!   event not committed (its Kafka timestamp, which the capture sets when it publishes).
//!   Its members and their partitions come from the group coordinator.
//!
//! The source's own current position (and so the capture's lag behind it) is not read here:
//! the capture exports it as metrics (`sluice_capture_lag_seconds`).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::{Message, Offset, TopicPartitionList};
use serde::Serialize;
use sluice_capture::checkpoint::{self, Checkpoint, Stored};
use sluice_common::clock::now_secs;
use sluice_common::KafkaConfig;

const CLIENT: &str = "sluice-status";

/// What `sluice status` shows.
#[derive(Debug, Serialize)]
pub struct Status {
    pub checkpoint_topic: String,
    pub connectors: Vec<Connector>,
    pub groups: Vec<Group>,
    pub dead_letter_topic: String,
    /// Dead letters by table and reason (none when the topic does not exist).
    pub dead_letters: Vec<DeadLetters>,
}

/// The dead letters of one table (or, for bytes that are no change event, of one topic) and
/// one reason.
#[derive(Debug, Serialize, PartialEq)]
pub struct DeadLetters {
    /// `database.table`, or the topic the event was read from when it is not a change event.
    pub table: String,
    /// The reason's label (`value`, `table_stopped`, `undecodable`...; `-` on older ones).
    pub reason: String,
    /// Not replayed yet, and replayed.
    pub waiting: usize,
    pub replayed: usize,
    /// The newest one's Kafka time, milliseconds since the epoch.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_ms: Option<i64>,
}

/// Count dead letters by (table, reason), in that order.
pub fn count_dead_letters(letters: &[crate::replay::DeadLetter]) -> Vec<DeadLetters> {
    let mut by: BTreeMap<(String, String), DeadLetters> = BTreeMap::new();
    for d in letters {
        let table = if d.event.table.is_empty() {
            d.topic.clone()
        } else {
            d.event.table.clone()
        };
        let reason = d.kind.clone().unwrap_or_else(|| "-".into());
        let e = by
            .entry((table.clone(), reason.clone()))
            .or_insert(DeadLetters {
                table,
                reason,
                waiting: 0,
                replayed: 0,
                last_ms: None,
            });
        if d.replayed {
            e.replayed += 1;
        } else {
            e.waiting += 1;
        }
        e.last_ms = e.last_ms.max(d.timestamp_ms);
    }
    by.into_values().collect()
}

/// One capture connector's last stored checkpoint.
#[derive(Debug, Serialize)]
pub struct Connector {
    pub name: String,
    /// `mysql` (a binlog position) or `mongodb` (an oplog time).
    pub source: &'static str,
    /// `file:pos` (MySQL/MariaDB) or `seconds.increment` (MongoDB).
    pub position: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub gtid_set: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub resume_token: Option<String>,
    /// When it was stored, seconds since the epoch, and how long ago.
    pub written_at: u64,
    pub age_seconds: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub snapshot: Option<Snapshot>,
    pub snapshots_done: Vec<String>,
    /// Where the source is now, when its config was given (`--capture-config`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub source_now: Option<SourceNow>,
    /// The checkpoint as stored.
    pub checkpoint: Checkpoint,
}

/// A MySQL/MariaDB source's current binlog position, and how far the stored one is behind it.
#[derive(Debug, Serialize, PartialEq)]
pub struct SourceNow {
    pub position: String,
    /// Binlog bytes between the stored position and the source's: what a restart reads first
    /// (`None` when a file between them is no longer listed by the server).
    pub behind_bytes: Option<u64>,
}

/// The binlog bytes from `from` to `to` (`(file, pos)`), given the server's binlog files and
/// sizes in order (`SHOW BINARY LOGS`); `None` when `from`'s file is not among them.
pub fn binlog_bytes_between(
    logs: &[(String, u64)],
    from: (&str, u64),
    to: (&str, u64),
) -> Option<u64> {
    if from.0 == to.0 {
        return Some(to.1.saturating_sub(from.1));
    }
    let start = logs.iter().position(|(f, _)| f == from.0)?;
    let mut bytes = logs[start].1.saturating_sub(from.1);
    for (f, size) in &logs[start + 1..] {
        if f == to.0 {
            return Some(bytes + to.1);
        }
        bytes += size;
    }
    None
}

/// The source's position now, read with the capture's own config, for the connector whose
/// stored position is `at` (`file:pos`).
pub async fn mysql_source_now(
    config: &sluice_capture::mysql::MysqlConfig,
    at: &str,
) -> Result<SourceNow, String> {
    use mysql_async::prelude::Queryable;
    let mut conn = mysql_async::Conn::new(config.opts()?)
        .await
        .map_err(|e| sluice_capture::mysql::connect_error(&e, config))?;
    let version: Option<String> = conn
        .query_first("SELECT @@version")
        .await
        .map_err(|e| format!("{}: {e}", config.describe()))?;
    let sql = sluice_capture::mysql::binlog_status_sql(&version.unwrap_or_default());
    let row: Option<mysql_async::Row> = conn
        .query_first(sql)
        .await
        .map_err(|e| format!("{}: {sql}: {e}", config.describe()))?;
    let row = row.ok_or_else(|| format!("{}: {sql} is empty (no binlog)", config.describe()))?;
    let (file, pos): (String, u64) = (row.get(0).unwrap_or_default(), row.get(1).unwrap_or(4));
    let logs: Vec<mysql_async::Row> = conn
        .query("SHOW BINARY LOGS")
        .await
        .map_err(|e| format!("{}: SHOW BINARY LOGS: {e}", config.describe()))?;
    let logs: Vec<(String, u64)> = logs
        .into_iter()
        .map(|r| (r.get(0).unwrap_or_default(), r.get(1).unwrap_or(0)))
        .collect();
    let behind_bytes = at
        .rsplit_once(':')
        .and_then(|(f, p)| binlog_bytes_between(&logs, (f, p.parse().ok()?), (&file, pos)));
    let _ = conn.disconnect().await;
    Ok(SourceNow {
        position: format!("{file}:{pos}"),
        behind_bytes,
    })
}

/// The snapshot a checkpoint holds as under way.
#[derive(Debug, Serialize, PartialEq)]
pub struct Snapshot {
    pub id: String,
    pub tables: usize,
    pub tables_done: usize,
    pub rows: u64,
}

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

/// Read the status: every connector of `checkpoint_topic` (or only `connectors`), and every
/// consumer group that committed offsets on a topic (or only `groups`). Blocking.
pub fn read(
    kafka: &KafkaConfig,
    checkpoint_topic: &str,
    connectors: &[String],
    groups: &[String],
    dead_letter_topic: &str,
) -> Result<Status, String> {
    let mut checkpoints = read_checkpoints(kafka, checkpoint_topic)?
        .into_iter()
        .filter(|(k, _)| connectors.is_empty() || connectors.contains(k))
        .map(|(name, c)| connector(name, c.checkpoint, now_secs()))
        .collect::<Vec<_>>();
    checkpoints.sort_by(|a, b| a.name.cmp(&b.name));
    for c in connectors {
        if !checkpoints.iter().any(|k| &k.name == c) {
            return Err(format!(
                "connector {c:?}: no checkpoint in {checkpoint_topic} (never started, or another \
                 checkpoint topic: --checkpoint-topic)"
            ));
        }
    }
    let out = read_groups(kafka, groups)?;
    let letters = crate::replay::Kafka {
        config: kafka.clone(),
        dead_letter_topic: dead_letter_topic.to_string(),
    }
    .dead_letters();
    let dead_letters = match letters {
        Ok(l) => count_dead_letters(&l),
        Err(e) if e.contains("does not exist") => Vec::new(), // none ever written
        Err(e) => return Err(e),
    };
    Ok(Status {
        checkpoint_topic: checkpoint_topic.to_string(),
        connectors: checkpoints,
        groups: out,
        dead_letter_topic: dead_letter_topic.to_string(),
        dead_letters,
    })
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

/// The last checkpoint of each connector (committed transactions only). Blocking.
pub fn read_checkpoints(
    kafka: &KafkaConfig,
    topic: &str,
) -> Result<BTreeMap<String, Stored>, String> {
    checkpoint::read_connectors(kafka, topic, CLIENT).map_err(|e| e.to_string())
}

/// A connector's status from its stored checkpoint.
pub fn connector(name: String, c: Checkpoint, now: u64) -> Connector {
    let (gtid_set, resume_token) = match &c {
        Checkpoint::Mysql(m) => (m.gtid_set.clone(), None),
        Checkpoint::Mongo(m) => (String::new(), m.resume_token.clone()),
    };
    let snapshot = c.snapshot().map(|s| Snapshot {
        id: s.id.clone(),
        tables: s.tables.len(),
        tables_done: s.tables.values().filter(|t| t.done).count(),
        rows: s.tables.values().map(|t| t.rows).sum(),
    });
    Connector {
        name,
        source: c.source(),
        position: c.position(),
        gtid_set,
        resume_token,
        written_at: c.written_at(),
        age_seconds: now.saturating_sub(c.written_at()),
        snapshot,
        snapshots_done: c.snapshots_done().to_vec(),
        source_now: None,
        checkpoint: c,
    }
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

/// A member's assignment, as the consumer protocol encodes it: version (int16), an array of
/// (topic string, partitions int32 array), then user data. None when it does not parse.
pub fn assignment(bytes: &[u8]) -> Option<BTreeMap<String, Vec<i32>>> {
    let mut r = bytes;
    fn take<'a>(r: &mut &'a [u8], n: usize) -> Option<&'a [u8]> {
        let (a, b) = (r.get(..n)?, r.get(n..)?);
        *r = b;
        Some(a)
    }
    let i16_ = |r: &mut &[u8]| take(r, 2).map(|b| i16::from_be_bytes([b[0], b[1]]));
    let i32_ = |r: &mut &[u8]| take(r, 4).map(|b| i32::from_be_bytes([b[0], b[1], b[2], b[3]]));
    let mut out = BTreeMap::new();
    if r.is_empty() {
        return Some(out);
    }
    i16_(&mut r)?; // version
    let topics = i32_(&mut r)?;
    for _ in 0..topics.max(0) {
        let len = i16_(&mut r)?;
        let name = std::str::from_utf8(take(&mut r, len.max(0) as usize)?).ok()?;
        let n = i32_(&mut r)?;
        let mut ps = Vec::with_capacity(n.max(0) as usize);
        for _ in 0..n.max(0) {
            ps.push(i32_(&mut r)?);
        }
        ps.sort_unstable();
        out.insert(name.to_string(), ps);
    }
    Some(out)
}

/// Seconds as text: `0.4 s`, `12 s`, `3 min 5 s`, `2 h 10 min`.
pub fn duration_text(s: f64) -> String {
    if s < 10.0 {
        format!("{s:.1} s")
    } else if s < 120.0 {
        format!("{} s", s.round() as u64)
    } else if s < 7200.0 {
        let s = s.round() as u64;
        format!("{} min {} s", s / 60, s % 60)
    } else {
        let m = (s / 60.0).round() as u64;
        format!("{} h {} min", m / 60, m % 60)
    }
}

/// A section's title, and `none` under it when it is empty.
fn heading(o: &mut String, title: &str, empty: bool) {
    o.push_str(title);
    o.push_str(":\n");
    if empty {
        o.push_str("  none\n");
    }
}

/// The status as text, for people.
pub fn text(s: &Status) -> String {
    use std::fmt::Write;
    let mut o = String::new();
    heading(
        &mut o,
        &format!("captures (checkpoint topic {})", s.checkpoint_topic),
        s.connectors.is_empty(),
    );
    for c in &s.connectors {
        let _ = write!(o, "  {} ({}): at {}", c.name, c.source, c.position);
        if !c.gtid_set.is_empty() {
            let _ = write!(o, ", GTID set {}", c.gtid_set);
        }
        if let Some(t) = &c.resume_token {
            let _ = write!(o, ", resume token {t}");
        }
        let _ = write!(o, "; stored {} ago", duration_text(c.age_seconds as f64));
        if let Some(now) = &c.source_now {
            let _ = write!(o, "; the source at {}", now.position);
            if let Some(b) = now.behind_bytes {
                let _ = write!(o, ", {b} bytes behind");
            }
        }
        let _ = writeln!(o);
        if let Some(sn) = &c.snapshot {
            let _ = writeln!(
                o,
                "    snapshot {:?} under way: {} of {} tables done, {} rows published",
                sn.id, sn.tables_done, sn.tables, sn.rows
            );
        }
        if !c.snapshots_done.is_empty() {
            let _ = writeln!(o, "    snapshots done: {}", c.snapshots_done.join(", "));
        }
    }
    heading(&mut o, "apply groups", s.groups.is_empty());
    for g in &s.groups {
        let _ = write!(
            o,
            "  {}: {}, {} member{}, {} event{} behind",
            g.name,
            g.state,
            g.members.len(),
            if g.members.len() == 1 { "" } else { "s" },
            g.lag_messages,
            if g.lag_messages == 1 { "" } else { "s" },
        );
        if let Some(l) = g.lag_seconds {
            let _ = write!(o, ", the oldest waiting {}", duration_text(l));
        }
        let _ = writeln!(o);
        for m in &g.members {
            let parts: Vec<String> = m
                .partitions
                .iter()
                .map(|(t, ps)| {
                    format!(
                        "{t}[{}]",
                        ps.iter().map(i32::to_string).collect::<Vec<_>>().join(",")
                    )
                })
                .collect();
            let _ = writeln!(
                o,
                "    member {} {}: {}",
                m.client_id,
                m.host,
                if parts.is_empty() {
                    "no partitions".to_string()
                } else {
                    parts.join(" ")
                }
            );
        }
        for p in &g.partitions {
            let _ = write!(
                o,
                "    {}[{}]: committed {}, end {}, {} behind",
                p.topic,
                p.partition,
                p.committed
                    .map_or_else(|| "nothing".to_string(), |n| n.to_string()),
                p.end,
                p.lag_messages
            );
            if let Some(l) = p.lag_seconds {
                let _ = write!(o, " (the first waiting {})", duration_text(l));
            }
            if p.expired {
                let _ = write!(
                    o,
                    "; EXPIRED: events from {} to {} were deleted before the group read them",
                    p.committed.unwrap_or(0),
                    p.start
                );
            }
            let _ = writeln!(o);
        }
    }
    heading(
        &mut o,
        &format!("dead letters (topic {})", s.dead_letter_topic),
        s.dead_letters.is_empty(),
    );
    for d in &s.dead_letters {
        let _ = writeln!(
            o,
            "  {} [{}]: {} not replayed, {} replayed{}",
            d.table,
            d.reason,
            d.waiting,
            d.replayed,
            d.last_ms
                .map(|ms| format!(
                    ", the newest {} ago",
                    duration_text((now_secs() as f64 - ms as f64 / 1000.0).max(0.0))
                ))
                .unwrap_or_default()
        );
    }
    o
}

#[cfg(test)]
mod tests {
    #[test]
    fn binlog_bytes_are_counted_across_files() {
        let logs = vec![
            ("b.000001".to_string(), 1000),
            ("b.000002".to_string(), 500),
            ("b.000003".to_string(), 300),
        ];
        assert_eq!(
            binlog_bytes_between(&logs, ("b.000002", 100), ("b.000002", 450)),
            Some(350)
        );
        // The rest of the stored file, the whole files between, up to the position now.
        assert_eq!(
            binlog_bytes_between(&logs, ("b.000001", 900), ("b.000003", 40)),
            Some(640)
        );
        assert_eq!(
            binlog_bytes_between(&logs, ("b.000001", 900), ("b.000002", 4)),
            Some(104)
        );
        // A stored file the server no longer lists: unknown, not zero.
        assert_eq!(
            binlog_bytes_between(&logs, ("b.000000", 4), ("b.000003", 40)),
            None
        );
    }

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

    fn of(json: serde_json::Value) -> Checkpoint {
        Checkpoint::from_json(json.to_string().as_bytes()).unwrap()
    }

    #[test]
    fn either_captures_checkpoint_reads_as_a_position() {
        let my = serde_json::json!({
            "next": {"file": "mariadb-bin.000007", "pos": 1234},
            "gtid_set": "0-1-99", "server_id": 1, "written_at": 1000,
            "snapshot": {"id": "initial", "tables": {
                "db.a": {"after": "0a", "rows": 10, "done": true},
                "db.b": {"rows": 5}}},
            "snapshots_done": []
        });
        let c = connector("m".into(), of(my), 1030);
        assert_eq!(
            (c.source, c.position.as_str(), c.gtid_set.as_str()),
            ("mysql", "mariadb-bin.000007:1234", "0-1-99")
        );
        assert_eq!(c.age_seconds, 30);
        assert_eq!(
            c.snapshot,
            Some(Snapshot {
                id: "initial".into(),
                tables: 2,
                tables_done: 1,
                rows: 15
            })
        );
        // capture-mongo's, with its older names (`collections`, `docs`).
        let mo = serde_json::json!({
            "ts": [1764720000u32, 3], "resume_token": "82aa", "replica_set": "rs0",
            "written_at": 1000,
            "snapshot": {"id": "r1", "collections": {"db.c": {"docs": 7, "done": true}}},
            "snapshots_done": ["initial"]
        });
        let c = connector("g".into(), of(mo), 999);
        assert_eq!(
            (c.source, c.position.as_str(), c.resume_token.as_deref()),
            ("mongodb", "1764720000.3", Some("82aa"))
        );
        assert_eq!(
            c.age_seconds, 0,
            "a clock behind the writer's is no negative age"
        );
        assert_eq!(
            c.snapshot.as_ref().map(|s| (s.tables_done, s.rows)),
            Some((1, 7))
        );
        assert_eq!(c.snapshots_done, vec!["initial".to_string()]);
        let text = text(&Status {
            checkpoint_topic: "_cp".into(),
            connectors: vec![c],
            groups: vec![],
            dead_letter_topic: "_dl".into(),
            dead_letters: vec![],
        });
        assert!(text.contains("dead letters (topic _dl):\n  none"), "{text}");
        assert!(
            text.contains("g (mongodb): at 1764720000.3, resume token 82aa"),
            "{text}"
        );
        assert!(
            text.contains("snapshot \"r1\" under way: 1 of 1 tables done, 7 rows"),
            "{text}"
        );
    }

    #[test]
    fn durations_read_as_people_say_them() {
        assert_eq!(duration_text(0.42), "0.4 s");
        assert_eq!(duration_text(75.0), "75 s");
        assert_eq!(duration_text(185.0), "3 min 5 s");
        assert_eq!(duration_text(7800.0), "2 h 10 min");
    }
}
