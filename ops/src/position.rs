//! `sluice position`: move a stopped capture's stored position, or a stopped apply group's
//! committed offsets.
//!
//! A connector's position is its last checkpoint in the checkpoint topic; moving it writes a new
//! checkpoint there, the same as the old one but for the position (fields this build does not
//! know included), as the connector's fenced writer ([`checkpoint::overwrite`]: a capture of the
//! connector started meanwhile is fenced rather than overwriting it), to the partition the old
//! one is in, so it is the last one of its key. A capture whose last checkpoint is younger
//! than [`RUNNING_WINDOW`] is taken to be running (a running one stores its checkpoint every
//! 10 s, unchanged or not) and the move is refused. So is a move of a checkpoint that holds
//! state tied to its position: a snapshot under way or due, statements waiting to be published.
//!
//! An apply group's offsets are committed for the group as Kafka's own tools do, refused while
//! the group has members.

use std::collections::BTreeMap;
use std::time::Duration;

use rdkafka::consumer::{CommitMode, Consumer};
use rdkafka::{Offset, TopicPartitionList};
use sluice_capture::checkpoint::{self, Checkpoint};
use sluice_capture::mysql::position::BinlogPos;
use sluice_common::clock::now_secs;
use sluice_common::KafkaConfig;

use crate::status;

const CLIENT: &str = "sluice-position";

/// A checkpoint younger than this says its capture runs.
pub const RUNNING_WINDOW: Duration = Duration::from_secs(30);

/// Where to move a connector.
#[derive(Debug, Clone, PartialEq)]
pub enum ConnectorTo {
    /// capture-mysql: a binlog file and the offset of an event's start in it.
    Binlog { file: String, pos: u64 },
    /// capture-mongo: after this oplog time (seconds, increment).
    Oplog { secs: u32, inc: u32 },
}

impl ConnectorTo {
    /// `FILE:POS` (a binlog coordinate, as `SHOW BINLOG EVENTS` lists event starts).
    pub fn binlog(s: &str) -> Result<Self, String> {
        let (file, pos) = s.rsplit_once(':').ok_or_else(|| {
            format!("--binlog {s:?}: expected FILE:POS, as mysql-bin.000007:1234")
        })?;
        let pos: u64 = pos
            .parse()
            .map_err(|_| format!("--binlog {s:?}: the position {pos:?} is not a number"))?;
        if file.is_empty() || pos < 4 {
            return Err(format!(
                "--binlog {s:?}: a binlog file name and a position of at least 4 (a file's first \
                 event)"
            ));
        }
        Ok(Self::Binlog {
            file: file.to_string(),
            pos,
        })
    }

    /// `SECONDS[.INCREMENT]` (an oplog time; reading resumes after it).
    pub fn oplog(s: &str) -> Result<Self, String> {
        let (secs, inc) = s.split_once('.').unwrap_or((s, "0"));
        let bad = || format!("--oplog {s:?}: expected SECONDS[.INCREMENT], as 1764720000.3");
        Ok(Self::Oplog {
            secs: secs.parse().map_err(|_| bad())?,
            inc: inc.parse().map_err(|_| bad())?,
        })
    }
}

/// The checkpoint `old` with its position moved to `to` (written `now`), or why it may not be.
pub fn moved(
    connector: &str,
    old: &Checkpoint,
    to: &ConnectorTo,
    now: u64,
) -> Result<Checkpoint, String> {
    let age = now.saturating_sub(old.written_at());
    if age < RUNNING_WINDOW.as_secs() {
        return Err(format!(
            "connector {connector:?} stored its checkpoint {age} s ago: a capture of it is \
             running (a running capture stores one every 10 s). Stop it, wait until its last \
             checkpoint is {} s old, then move it",
            RUNNING_WINDOW.as_secs()
        ));
    }
    if let Some((key, what)) = old.held().first() {
        return Err(format!(
            "connector {connector:?}: its checkpoint holds {what} ({key}), tied to its \
             position: let the capture finish it, stop it, then move the position"
        ));
    }
    let mut new = old.clone();
    match (&mut new, to) {
        (Checkpoint::Mysql(c), ConnectorTo::Binlog { file, pos }) => {
            c.next = BinlogPos {
                file: file.clone(),
                pos: *pos,
            };
            // The GTIDs read so far are not those of the new position: the capture reads the
            // set at the position from the server's binlog when it starts.
            c.last_gtid.clear();
            c.gtid_set.clear();
        }
        (Checkpoint::Mongo(c), ConnectorTo::Oplog { secs, inc }) => {
            c.ts = (*secs, *inc);
            // A change stream resumes from the time, as a token belongs to its own place.
            c.resume_token = None;
        }
        (Checkpoint::Mongo(_), ConnectorTo::Binlog { .. }) => {
            return Err(format!(
                "connector {connector:?} is not capture-mysql's (no binlog position): use \
                 --oplog"
            ))
        }
        (Checkpoint::Mysql(_), ConnectorTo::Oplog { .. }) => {
            return Err(format!(
                "connector {connector:?} is not capture-mongo's (no oplog time): use --binlog"
            ))
        }
    }
    new.set_written_at(now);
    Ok(new)
}

/// Move a stopped connector's position: returns the checkpoints before and after.
pub fn set_connector(
    kafka: &KafkaConfig,
    topic: &str,
    connector: &str,
    to: &ConnectorTo,
) -> Result<(Checkpoint, Checkpoint), String> {
    let mut all = status::read_checkpoints(kafka, topic)?;
    let old = all.remove(connector).ok_or_else(|| {
        format!(
            "connector {connector:?}: no checkpoint in {topic}: a connector that never ran \
             starts from its [mysql] start / [mongodb] start"
        )
    })?;
    let new = moved(connector, &old.checkpoint, to, now_secs())?;
    let payload = serde_json::to_vec(&new).expect("checkpoints serialize");
    checkpoint::overwrite(kafka, CLIENT, topic, connector, old.partition, &payload)
        .map_err(|e| format!("writing the checkpoint of {connector:?}: {e}"))?;
    Ok((old.checkpoint, new))
}

/// Where to move a group's offsets.
#[derive(Debug, Clone, PartialEq)]
pub enum GroupTo {
    /// Each partition's end: everything published so far is skipped.
    End,
    /// Each partition's start: everything Kafka holds is applied again.
    Start,
    /// The first event at or after this time (milliseconds since the epoch).
    Time(i64),
    /// The first event whose version is this or more: the events of a source position on
    /// (`sluice_proto::mysql_version_in` of a binlog coordinate).
    Version(u64),
    /// Given offsets: `(topic, partition) -> offset`.
    Offsets(BTreeMap<(String, i32), i64>),
}

/// One partition moved.
#[derive(Debug, serde::Serialize)]
pub struct PartitionMove {
    pub topic: String,
    pub partition: i32,
    pub from: Option<i64>,
    pub to: i64,
}

/// Commit new offsets for a group without members: the partitions it committed on, or those
/// of `--to-offset`. Returns each partition's move.
pub fn set_group(
    kafka: &KafkaConfig,
    group: &str,
    to: &GroupTo,
) -> Result<Vec<PartitionMove>, String> {
    let timeout = kafka.request_timeout();
    let g = status::read_groups(kafka, &[group.to_string()])?
        .into_iter()
        .find(|g| g.name == group)
        .ok_or_else(|| format!("group {group:?}: not found"))?;
    if !g.members.is_empty() {
        return Err(format!(
            "group {group:?} has {} member(s) running ({}): stop its apply stages first",
            g.members.len(),
            g.members
                .iter()
                .map(|m| format!("{} {}", m.client_id, m.host))
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    let mut moves = Vec::new();
    let c = status::consumer(kafka, group)?;
    let watermarks = |t: &str, p: i32| {
        c.fetch_watermarks(t, p, timeout)
            .map_err(|e| format!("{t}[{p}]: {e}"))
    };
    match to {
        GroupTo::Offsets(offsets) => {
            for ((t, p), o) in offsets {
                let (low, high) = watermarks(t, *p)?;
                if *o < low || *o > high {
                    return Err(format!(
                        "{t}[{p}]: offset {o} is outside what the partition holds ({low} to \
                         {high})"
                    ));
                }
                let from = g
                    .partitions
                    .iter()
                    .find(|x| &x.topic == t && x.partition == *p)
                    .and_then(|x| x.committed);
                moves.push(PartitionMove {
                    topic: t.clone(),
                    partition: *p,
                    from,
                    to: *o,
                });
            }
        }
        _ => {
            if g.partitions.is_empty() {
                return Err(format!(
                    "group {group:?} has committed on no partition: name them with --to-offset"
                ));
            }
            let mut times = TopicPartitionList::new();
            for p in &g.partitions {
                let to = match to {
                    GroupTo::End => p.end,
                    GroupTo::Start => p.start,
                    GroupTo::Version(v) => {
                        first_at_version(kafka, &p.topic, p.partition, p.start, p.end, *v)?
                    }
                    GroupTo::Time(ms) => {
                        times
                            .add_partition_offset(&p.topic, p.partition, Offset::Offset(*ms))
                            .map_err(|e| e.to_string())?;
                        continue;
                    }
                    GroupTo::Offsets(_) => unreachable!(),
                };
                moves.push(PartitionMove {
                    topic: p.topic.clone(),
                    partition: p.partition,
                    from: p.committed,
                    to,
                });
            }
            if times.count() > 0 {
                let found = c
                    .offsets_for_times(times, timeout)
                    .map_err(|e| format!("the offsets at that time: {e}"))?;
                for e in found.elements() {
                    let p = g
                        .partitions
                        .iter()
                        .find(|x| x.topic == e.topic() && x.partition == e.partition())
                        .expect("asked for");
                    // No event at or after the time: the end.
                    let to = match e.offset() {
                        Offset::Offset(n) if n >= 0 => n,
                        _ => p.end,
                    };
                    moves.push(PartitionMove {
                        topic: p.topic.clone(),
                        partition: p.partition,
                        from: p.committed,
                        to,
                    });
                }
            }
        }
    }
    let mut tpl = TopicPartitionList::new();
    for m in &moves {
        tpl.add_partition_offset(&m.topic, m.partition, Offset::Offset(m.to))
            .map_err(|e| e.to_string())?;
    }
    c.commit(&tpl, CommitMode::Sync)
        .map_err(|e| format!("group {group:?}: committing the new offsets: {e}"))?;
    moves.sort_by(|a, b| (&a.topic, a.partition).cmp(&(&b.topic, b.partition)));
    Ok(moves)
}

/// The offset of a partition's first change event whose version is `v` or more, or `end` when
/// there is none: a binary search, since the versions of one partition only grow (the capture
/// publishes in the source's order). Records that are no change event count as version 0.
fn first_at_version(
    kafka: &KafkaConfig,
    topic: &str,
    partition: i32,
    start: i64,
    end: i64,
    v: u64,
) -> Result<i64, String> {
    use prost::Message as _;
    use rdkafka::consumer::BaseConsumer;
    use rdkafka::Message as _;
    let mut config = kafka.client_config("sluice-position");
    config
        .set(
            "group.id",
            format!("sluice-position-{}", std::process::id()),
        )
        .set("enable.auto.commit", "false")
        .set("isolation.level", "read_committed");
    let c: BaseConsumer = config
        .create()
        .map_err(|e| format!("cannot make a Kafka client: {e}"))?;
    let wait = kafka.request_timeout();
    // The first event at or after offset `o`: its offset and version; None when there is none
    // before the end (only transaction markers, or aborted records).
    let at = |o: i64| -> Result<Option<(i64, u64)>, String> {
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition_offset(topic, partition, Offset::Offset(o))
            .map_err(|e| e.to_string())?;
        c.assign(&tpl)
            .map_err(|e| format!("{topic}[{partition}]: {e}"))?;
        let deadline = std::time::Instant::now() + wait;
        loop {
            match c.poll(Duration::from_millis(200)) {
                Some(Ok(m)) if m.partition() == partition => {
                    if m.offset() >= end {
                        return Ok(None);
                    }
                    let version = m
                        .payload()
                        .and_then(|b| sluice_proto::v1::ChangeEvent::decode(b).ok())
                        .map_or(0, |e| e.version);
                    return Ok(Some((m.offset(), version)));
                }
                Some(Ok(_)) => {}
                Some(Err(rdkafka::error::KafkaError::PartitionEOF(_))) => return Ok(None),
                Some(Err(e)) => return Err(format!("{topic}[{partition}] at {o}: {e}")),
                None => {
                    let (_, high) = c
                        .fetch_watermarks(topic, partition, wait)
                        .map_err(|e| format!("{topic}[{partition}]: {e}"))?;
                    if o >= high.min(end) {
                        return Ok(None);
                    }
                    if std::time::Instant::now() > deadline {
                        return Err(format!(
                            "{topic}[{partition}]: nothing read at offset {o} in {} s",
                            wait.as_secs()
                        ));
                    }
                }
            }
        }
    };
    let (mut lo, mut hi) = (start, end);
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        match at(mid)? {
            Some((found, version)) if version < v => lo = found + 1,
            _ => hi = mid,
        }
    }
    Ok(lo)
}

/// `TOPIC:PARTITION=OFFSET`.
pub fn parse_offset(s: &str) -> Result<((String, i32), i64), String> {
    let bad = || format!("--to-offset {s:?}: expected TOPIC:PARTITION=OFFSET");
    let (tp, o) = s.rsplit_once('=').ok_or_else(bad)?;
    let (t, p) = tp.rsplit_once(':').ok_or_else(bad)?;
    Ok((
        (t.to_string(), p.parse().map_err(|_| bad())?),
        o.parse().map_err(|_| bad())?,
    ))
}

/// A time given as seconds since the epoch or `YYYY-MM-DDTHH:MM:SSZ`, in milliseconds.
pub fn parse_time(s: &str) -> Result<i64, String> {
    sluice_common::civil::parse_epoch_seconds(s).map(|secs| secs as i64 * 1000)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value as Json;

    fn of(json: &Json) -> Checkpoint {
        Checkpoint::from_json(json.to_string().as_bytes()).unwrap()
    }

    fn json(c: &Checkpoint) -> Json {
        serde_json::to_value(c).unwrap()
    }

    fn mysql(written_at: u64) -> Json {
        serde_json::json!({
            "next": {"file": "mysql-bin.000009", "pos": 777},
            "last_gtid": "0-1-50", "gtid_set": "0-1-50", "server_id": 1,
            "written_at": written_at, "snapshots_done": ["initial"], "generation": 2,
            "newer_field": {"kept": true}
        })
    }

    #[test]
    fn a_moved_binlog_checkpoint_keeps_all_but_its_position() {
        let to = ConnectorTo::binlog("mysql-bin.000003:4").unwrap();
        let new = json(&moved("c", &of(&mysql(1000)), &to, 1100).unwrap());
        assert_eq!(
            new["next"],
            serde_json::json!({"file": "mysql-bin.000003", "pos": 4})
        );
        assert!(
            new.get("gtid_set").is_none() && new.get("last_gtid").is_none(),
            "{new}"
        );
        assert_eq!(new["server_id"], 1);
        assert_eq!(new["generation"], 2);
        assert_eq!(new["snapshots_done"], serde_json::json!(["initial"]));
        assert_eq!(new["written_at"], 1100);
        assert_eq!(new["newer_field"], serde_json::json!({"kept": true}));
        // Another capture's position is refused, naming the right one.
        let e = moved(
            "c",
            &of(&mysql(1000)),
            &ConnectorTo::oplog("5.1").unwrap(),
            1100,
        )
        .unwrap_err();
        assert!(e.contains("use --binlog"), "{e}");
    }

    #[test]
    fn a_running_capture_or_state_tied_to_the_position_refuses_the_move() {
        let to = ConnectorTo::binlog("f.000001:4").unwrap();
        let e = moved("c", &of(&mysql(1000)), &to, 1029).unwrap_err();
        assert!(e.contains("29 s ago: a capture of it is running"), "{e}");
        assert!(moved("c", &of(&mysql(1000)), &to, 1030).is_ok());
        for (k, v) in [
            (
                "snapshot",
                serde_json::json!({"id": "initial", "tables": {}}),
            ),
            (
                "snapshots_pending",
                serde_json::json!([{"id": "x", "tables": ["d.t"]}]),
            ),
            (
                "ddl_pending",
                serde_json::json!([{"database": "d", "table": "t", "kind": "alter",
                    "statements": ["ALTER TABLE t ADD c INT"], "file": "f.000001",
                    "start": 4, "ts": 0}]),
            ),
        ] {
            let mut c = mysql(0);
            c[k] = v;
            let e = moved("c", &of(&c), &to, 1000).unwrap_err();
            assert!(e.contains(&format!("({k})")), "{e}");
        }
        // Empty or absent is nothing held.
        let mut c = mysql(0);
        c["ddl_pending"] = serde_json::json!([]);
        c["snapshot"] = Json::Null;
        assert!(moved("c", &of(&c), &to, 1000).is_ok());
    }

    #[test]
    fn an_oplog_checkpoint_moves_to_a_time_without_its_token() {
        let c = serde_json::json!({"ts": [10, 2], "resume_token": "82aa", "replica_set": "rs0",
            "written_at": 0});
        let new = json(
            &moved(
                "m",
                &of(&c),
                &ConnectorTo::oplog("1764720000").unwrap(),
                100,
            )
            .unwrap(),
        );
        assert_eq!(new["ts"], serde_json::json!([1764720000u32, 0]));
        assert!(new.get("resume_token").is_none());
        assert_eq!(new["replica_set"], "rs0");
        assert!(
            moved("m", &of(&c), &ConnectorTo::binlog("f.1:4").unwrap(), 100)
                .unwrap_err()
                .contains("use --oplog")
        );
    }

    #[test]
    fn arguments_are_read_or_refused_by_name() {
        assert!(ConnectorTo::binlog("nofile")
            .unwrap_err()
            .contains("FILE:POS"));
        assert!(ConnectorTo::binlog("f.1:3")
            .unwrap_err()
            .contains("at least 4"));
        assert!(ConnectorTo::oplog("x.1").unwrap_err().contains("SECONDS"));
        assert_eq!(
            parse_offset("cdc.db.t:2=15").unwrap(),
            (("cdc.db.t".to_string(), 2), 15)
        );
        assert!(parse_offset("cdc.db.t=15").is_err());
        assert_eq!(parse_time("1000").unwrap(), 1_000_000);
        assert_eq!(parse_time("1970-01-02T00:00:01Z").unwrap(), 86_401_000);
        assert_eq!(
            parse_time("2026-12-02T10:00:00Z").unwrap(),
            1_796_205_600_000
        );
        assert!(parse_time("yesterday").unwrap_err().contains("yesterday"));
    }
}
