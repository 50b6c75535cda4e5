//! Dead letters read back and re-offered to the pipeline once their cause is fixed
//! (`sluice dead-letters replay`).
//!
//! A dead letter keeps its event's bytes and key and names where the event came from
//! (`sluice.topic`, `sluice.partition`, `sluice.offset`). Replaying it writes the event again to
//! that topic and partition, where the apply stage reads it like any other; the dead letter is
//! marked replayed (a record of the dead-letter topic with the header `sluice.replayed`) once
//! its events are written, so a second replay skips it. A replay cut short between the two
//! writes them again the next time, which changes nothing (below: each re-offer is idempotent).
//! No Kafka transaction is used: its commit markers take offsets in the source partitions, and
//! a consumer that stores the offsets of the events it wrote (as the apply stages do) would show
//! a lag of 1 there until the next event.
//!
//! What makes an old event safe to write again after newer ones:
//! - **ClickHouse** (MySQL and MariaDB row events): the row carries its version, and a mirror
//!   keeps the highest version of each key, so the dead letter alone is written again.
//! - **MongoDB**: documents carry no version, and an update is a description of fields, so an
//!   old change written after newer ones would leave an older state. The key's history is
//!   re-offered instead: the dead letter and every later event of the same document in its
//!   partition, in their order. Each write is idempotent, so the document ends as the source
//!   left it. Events of the document that the capture publishes while the replay writes land
//!   before the replayed ones; the replay reads them back after its commit and offers them
//!   again, until none is left behind.
//! - Either way, a row older than a later TRUNCATE, DROP, RENAME or CREATE of its table (in its
//!   partition: those statements go to every partition) is not replayed: the target no longer
//!   holds rows from before the statement. Source statements are not replayed (the remedy of
//!   a refused statement is done by hand, as its reason says; the listing shows them), except
//!   a MySQL/MariaDB statement dead-lettered because its table was stopped: apply-clickhouse
//!   did not apply it, so it is written again in its place among the rows, and applied by its
//!   version (a TRUNCATE, DROP or RENAME removes only rows older than itself).
//! - A dead letter whose source events the topic no longer holds (retention) is refused: what
//!   followed it cannot be read.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::Duration;

use prost::Message as _;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Header, Headers, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::{Message, Offset, TopicPartitionList};
use sluice_apply::group::dead_letter_headers as headers;
use sluice_proto::v1::Op;
use sluice_proto::ChangeEvent;

/// The header that marks a record of the dead-letter topic as the replay of the dead letter at
/// the offset it holds.
pub const REPLAYED: &str = "sluice.replayed";
/// The header a re-offered event carries: the run that wrote it, and where it was read.
pub const REPLAY: &str = "sluice.replay";

/// One record of the dead-letter topic that is a dead letter (not a replay marker).
#[derive(Debug, Clone)]
pub struct DeadLetter {
    /// Partition and offset in the dead-letter topic.
    pub at: (i32, i64),
    /// Where the event was read.
    pub topic: String,
    pub partition: i32,
    pub offset: i64,
    /// `sluice.reason`: the message.
    pub reason: String,
    /// `sluice.reason.kind`: the reason's label (absent on dead letters of older builds).
    pub kind: Option<String>,
    pub timestamp_ms: Option<i64>,
    pub key: Option<Vec<u8>>,
    pub payload: Vec<u8>,
    pub event: EventInfo,
    /// A replay marker names it.
    pub replayed: bool,
}

/// What the replay needs to know of an event.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EventInfo {
    /// `database.table`, empty when the bytes are not a change event.
    pub table: String,
    pub op: Option<Op>,
    /// `ddl.kind` of a source statement.
    pub ddl_kind: Option<String>,
    /// A MongoDB change (written by apply-mongo).
    pub mongo: bool,
    /// Read from a MySQL/MariaDB binlog (its position is a binlog's).
    pub binlog: bool,
}

impl EventInfo {
    pub fn of(payload: &[u8]) -> Self {
        match ChangeEvent::decode(payload) {
            Ok(e) => EventInfo {
                table: format!("{}.{}", e.database, e.table),
                op: Op::try_from(e.op).ok(),
                ddl_kind: e.ddl.as_ref().map(|d| d.kind.clone()),
                mongo: e.mongo.is_some(),
                binlog: matches!(
                    e.position.as_ref().and_then(|p| p.kind.as_ref()),
                    Some(sluice_proto::v1::position::Kind::Binlog(_))
                ),
            },
            Err(_) => EventInfo::default(),
        }
    }

    fn is_row(&self) -> bool {
        matches!(
            self.op,
            Some(Op::Insert | Op::Update | Op::Delete | Op::SnapshotRead)
        )
    }

    /// A statement after which the target holds no row of the table from before it.
    fn resets_table(&self) -> bool {
        self.op == Some(Op::Truncate)
            || (self.op == Some(Op::Ddl)
                && matches!(
                    self.ddl_kind.as_deref(),
                    Some("truncate" | "drop" | "rename" | "renamed" | "create" | "drop_database")
                ))
    }

    pub fn op_label(&self) -> &'static str {
        match self.op {
            Some(Op::Insert) => "insert",
            Some(Op::Update) => "update",
            Some(Op::Delete) => "delete",
            Some(Op::SnapshotRead) => "snapshot",
            Some(Op::Ddl) => "ddl",
            Some(Op::Truncate) => "truncate",
            Some(_) => "other",
            None => "undecodable",
        }
    }
}

/// Which dead letters a command is about.
#[derive(Debug, Clone, Default)]
pub struct Filter {
    /// `database.table` as the source names it.
    pub table: Option<String>,
    /// A reason label (`value`, `table_stopped`, ...) or a piece of the reason's text.
    pub reason: Option<String>,
    /// Dead letters already replayed too (listing only).
    pub replayed: bool,
    /// Only those dead-lettered at or after this Kafka time (milliseconds since the epoch).
    pub since_ms: Option<i64>,
}

impl Filter {
    pub fn matches(&self, d: &DeadLetter) -> bool {
        (self.replayed || !d.replayed)
            && self
                .since_ms
                .is_none_or(|t| d.timestamp_ms.is_some_and(|at| at >= t))
            && self.table.as_ref().is_none_or(|t| *t == d.event.table)
            && self.reason.as_ref().is_none_or(|r| {
                d.kind.as_deref() == Some(r.as_str()) || d.reason.contains(r.as_str())
            })
    }
}

/// One event of a source partition, as the replay plans with it.
#[derive(Debug, Clone)]
pub struct SourceEvent {
    pub offset: i64,
    pub key: Option<Vec<u8>>,
    pub payload: Vec<u8>,
    pub event: EventInfo,
}

/// An event to write again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reoffer {
    /// Where it was read in the source topic.
    pub offset: i64,
    pub key: Option<Vec<u8>>,
    pub payload: Vec<u8>,
}

impl Reoffer {
    /// Dead letter `d`'s event, to write again where it was read.
    fn of(d: &DeadLetter) -> Self {
        Reoffer {
            offset: d.offset,
            key: d.key.clone(),
            payload: d.payload.clone(),
        }
    }
}

/// What a replay does in one source partition.
#[derive(Debug, Default)]
pub struct PartitionPlan {
    /// In source order.
    pub reoffers: Vec<Reoffer>,
    /// Dead letters (their place in the dead-letter topic) to mark replayed.
    pub replayed: Vec<(i32, i64)>,
    /// Dead letters left alone, with why.
    pub skipped: Vec<((i32, i64), String)>,
}

/// Plan the replay of `selected` (dead letters of one source partition, any order) against the
/// partition's events from `log_start` on (`log`, in offset order).
pub fn plan_partition(
    selected: &[&DeadLetter],
    log_start: i64,
    log: &[SourceEvent],
) -> PartitionPlan {
    let mut plan = PartitionPlan::default();
    let mut selected: Vec<&DeadLetter> = selected.to_vec();
    selected.sort_by_key(|d| d.offset);
    // Per MongoDB document key: the first dead letter's offset (its history is re-offered).
    let mut histories: HashMap<&[u8], i64> = HashMap::new();
    let mut offers: BTreeMap<i64, Reoffer> = BTreeMap::new();
    for d in selected {
        // A MySQL/MariaDB statement dead-lettered because its table was stopped: written
        // again in its place among the table's rows. apply-clickhouse applies it by its
        // version (a copy already applied, or older than what the target holds, changes
        // nothing; a TRUNCATE or DROP removes only rows older than itself).
        // (not a refusal: written again it could only stop the table again; its remedy is
        // the table copied again)
        let stopped_statement = d.event.binlog
            && matches!(d.event.op, Some(Op::Ddl | Op::Truncate))
            && d.event.ddl_kind.as_deref() != Some("refused")
            && d.kind.as_deref() == Some("table_stopped");
        if stopped_statement && d.offset >= log_start {
            plan.replayed.push(d.at);
            offers.insert(d.offset, Reoffer::of(d));
            continue;
        }
        if !d.event.is_row() && !stopped_statement {
            let why = match d.event.op {
                None => "not a change event this build can read".to_string(),
                Some(Op::Ddl | Op::Truncate) => format!(
                    "a source statement ({}) is not replayed: bring the target to the source's \
                     state by hand as the reason says, or copy the table again",
                    d.event.ddl_kind.as_deref().unwrap_or("truncate")
                ),
                Some(_) => "not a row event".to_string(),
            };
            plan.skipped.push((d.at, why));
            continue;
        }
        if d.offset < log_start {
            plan.skipped.push((
                d.at,
                format!(
                    "{}/{} no longer holds offset {} (its first is {log_start}): what followed \
                     the event cannot be read. Copy the table again (a snapshot) instead",
                    d.topic, d.partition, d.offset
                ),
            ));
            continue;
        }
        if let Some(reset) = log.iter().find(|e| {
            e.offset > d.offset && e.event.table == d.event.table && e.event.resets_table()
        }) {
            plan.skipped.push((
                d.at,
                format!(
                    "superseded by a later {} of {} (offset {}): the target holds no row from \
                     before it",
                    reset.event.ddl_kind.as_deref().unwrap_or("truncate"),
                    d.event.table,
                    reset.offset
                ),
            ));
            continue;
        }
        plan.replayed.push(d.at);
        match (&d.key, d.event.mongo) {
            (Some(key), true) => {
                histories.entry(key.as_slice()).or_insert(d.offset);
            }
            _ => {
                offers.insert(d.offset, Reoffer::of(d));
            }
        }
    }
    if !histories.is_empty() {
        for e in log {
            let Some(key) = e.key.as_deref() else {
                continue;
            };
            if histories.get(key).is_some_and(|from| e.offset >= *from) && e.event.is_row() {
                offers.insert(
                    e.offset,
                    Reoffer {
                        offset: e.offset,
                        key: e.key.clone(),
                        payload: e.payload.clone(),
                    },
                );
            }
        }
    }
    plan.reoffers = offers.into_values().collect();
    plan
}

/// Records of a source partition, each with its [`REPLAY`] header.
pub type Window = Vec<(SourceEvent, Option<String>)>;

/// Events the capture wrote into a partition while a replay wrote there: those of a replayed
/// MongoDB document that landed before the replay's last write of it (so its older state would
/// stand). `written` maps each replayed key to the offset of its last replayed write; `window`
/// is the partition from the end read before the replay, in offset order; records of this
/// run (header [`REPLAY`] equal to `run`) are not counted.
pub fn left_behind(
    written: &HashMap<Vec<u8>, i64>,
    window: &[(SourceEvent, Option<String>)],
    run: &str,
) -> Vec<Reoffer> {
    window
        .iter()
        .filter(|(e, r)| {
            r.as_deref().is_none_or(|r| !r.starts_with(run))
                && e.event.is_row()
                && e.key
                    .as_ref()
                    .and_then(|k| written.get(k))
                    .is_some_and(|last| e.offset < *last)
        })
        .map(|(e, _)| Reoffer {
            offset: e.offset,
            key: e.key.clone(),
            payload: e.payload.clone(),
        })
        .collect()
}

/// Kafka access for the dead-letter commands.
pub struct Kafka {
    pub config: sluice_common::KafkaConfig,
    pub dead_letter_topic: String,
}

const CLIENT: &str = "sluice-dead-letters";

impl Kafka {
    fn consumer(&self) -> Result<BaseConsumer, String> {
        let mut c = self.config.client_config(CLIENT);
        c.set("group.id", format!("{CLIENT}-{}", std::process::id()))
            .set("enable.auto.commit", "false")
            .set("enable.partition.eof", "true")
            .set("isolation.level", "read_committed");
        c.create().map_err(|e| {
            format!(
                "could not make a Kafka consumer for {}: {e}",
                self.config.brokers
            )
        })
    }

    fn partitions(&self, c: &BaseConsumer, topic: &str) -> Result<Vec<i32>, String> {
        let md = c
            .fetch_metadata(Some(topic), self.config.request_timeout())
            .map_err(|e| {
                format!(
                    "Kafka at {}: reading the metadata of {topic}: {e}",
                    self.config.brokers
                )
            })?;
        let t = md
            .topics()
            .iter()
            .find(|t| t.name() == topic)
            .filter(|t| t.error().is_none() && !t.partitions().is_empty())
            .ok_or_else(|| format!("topic {topic} does not exist on {}", self.config.brokers))?;
        Ok(t.partitions().iter().map(|p| p.id()).collect())
    }

    /// The first offset of a partition and its end (read committed).
    fn bounds(&self, c: &BaseConsumer, topic: &str, p: i32) -> Result<(i64, i64), String> {
        c.fetch_watermarks(topic, p, self.config.request_timeout())
            .map_err(|e| format!("reading the offsets of {topic}/{p}: {e}"))
    }

    /// Every record of `topic`/`p` from `from` up to `to` (exclusive), in order.
    fn read(
        &self,
        c: &BaseConsumer,
        topic: &str,
        p: i32,
        from: i64,
        to: i64,
        mut each: impl FnMut(&rdkafka::message::BorrowedMessage<'_>),
    ) -> Result<(), String> {
        if from >= to {
            return Ok(());
        }
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition_offset(topic, p, Offset::Offset(from))
            .map_err(|e| e.to_string())?;
        c.assign(&tpl)
            .map_err(|e| format!("reading {topic}/{p}: {e}"))?;
        let deadline = std::time::Instant::now() + Duration::from_secs(120);
        loop {
            match c.poll(Duration::from_millis(500)) {
                Some(Ok(m)) => {
                    if m.offset() >= to {
                        break;
                    }
                    each(&m);
                    if m.offset() + 1 >= to {
                        break;
                    }
                }
                Some(Err(rdkafka::error::KafkaError::PartitionEOF(_))) => {
                    // Transaction markers take offsets: the end may lie past the last record.
                    break;
                }
                Some(Err(e)) => return Err(format!("reading {topic}/{p}: {e}")),
                None => {}
            }
            if std::time::Instant::now() > deadline {
                return Err(format!(
                    "reading {topic}/{p} up to offset {to} took over 120 s"
                ));
            }
        }
        c.unassign().map_err(|e| e.to_string())?;
        Ok(())
    }

    /// Every dead letter of the topic, marked replayed where a marker names it.
    pub fn dead_letters(&self) -> Result<Vec<DeadLetter>, String> {
        let c = self.consumer()?;
        let topic = &self.dead_letter_topic;
        let mut out = Vec::new();
        let mut replayed: HashSet<(i32, i64)> = HashSet::new();
        for p in self.partitions(&c, topic)? {
            let (lo, hi) = self.bounds(&c, topic, p)?;
            self.read(&c, topic, p, lo, hi, |m| {
                let h = |name: &str| -> Option<String> {
                    m.headers()?
                        .iter()
                        .find(|h| h.key == name)
                        .and_then(|h| h.value)
                        .map(|v| String::from_utf8_lossy(v).into_owned())
                };
                if let Some(at) = h(REPLAYED) {
                    if let Ok(o) = at.parse::<i64>() {
                        replayed.insert((p, o));
                    }
                    return;
                }
                let payload = m.payload().unwrap_or_default().to_vec();
                out.push(DeadLetter {
                    at: (p, m.offset()),
                    topic: h(headers::TOPIC).unwrap_or_default(),
                    partition: h(headers::PARTITION)
                        .and_then(|v| v.parse().ok())
                        .unwrap_or(-1),
                    offset: h(headers::OFFSET)
                        .and_then(|v| v.parse().ok())
                        .unwrap_or(-1),
                    reason: h(headers::REASON).unwrap_or_default(),
                    kind: h(headers::REASON_KIND),
                    timestamp_ms: m.timestamp().to_millis(),
                    key: m.key().map(<[u8]>::to_vec),
                    event: EventInfo::of(&payload),
                    payload,
                    replayed: false,
                });
            })?;
        }
        for d in &mut out {
            d.replayed = replayed.contains(&d.at);
        }
        Ok(out)
    }

    /// A source partition's events from `from` to its end, with each record's [`REPLAY`]
    /// header; and the end. Records a taken-over capture delivered after its successor's
    /// ([`sluice_apply::incarnation`]) are left out, as the apply stages skip them: re-offered without
    /// their header they would be written.
    fn source(
        &self,
        c: &BaseConsumer,
        topic: &str,
        p: i32,
        from: i64,
    ) -> Result<(Window, i64), String> {
        let (_, hi) = self.bounds(c, topic, p)?;
        let mut out = Vec::new();
        let seen = sluice_apply::incarnation::Incarnations::default();
        self.read(c, topic, p, from, hi, |m| {
            let stamp = sluice_apply::incarnation::of(m);
            if seen.admit(topic, p, m.offset(), stamp) != sluice_apply::incarnation::Admit::Yes {
                return;
            }
            let payload = m.payload().unwrap_or_default().to_vec();
            let replay = m.headers().and_then(|h| {
                h.iter()
                    .find(|h| h.key == REPLAY)
                    .and_then(|h| h.value)
                    .map(|v| String::from_utf8_lossy(v).into_owned())
            });
            out.push((
                SourceEvent {
                    offset: m.offset(),
                    key: m.key().map(<[u8]>::to_vec),
                    event: EventInfo::of(&payload),
                    payload,
                },
                replay,
            ));
        })?;
        Ok((out, hi))
    }
}

/// What a replay did.
#[derive(Debug, Default)]
pub struct Outcome {
    /// Dead letters replayed.
    pub replayed: usize,
    /// Events written again (a MongoDB document's history counts each of its events).
    pub written: usize,
    /// Events the capture wrote meanwhile, offered again after the replay's.
    pub rewritten: usize,
    pub skipped: Vec<(DeadLetter, String)>,
}

/// Replay the dead letters `filter` selects (only plans with `dry_run`).
pub async fn replay(kafka: &Kafka, filter: &Filter, dry_run: bool) -> Result<Outcome, String> {
    let letters = kafka.dead_letters()?;
    let selected: Vec<&DeadLetter> = letters.iter().filter(|d| filter.matches(d)).collect();
    let mut by_partition: BTreeMap<(String, i32), Vec<&DeadLetter>> = BTreeMap::new();
    let mut outcome = Outcome::default();
    for d in selected {
        if d.topic.is_empty() || d.partition < 0 || d.offset < 0 {
            outcome.skipped.push((
                d.clone(),
                "the dead letter does not say where its event was read".into(),
            ));
            continue;
        }
        by_partition
            .entry((d.topic.clone(), d.partition))
            .or_default()
            .push(d);
    }
    if by_partition.is_empty() {
        return Ok(outcome);
    }
    let c = kafka.consumer()?;
    let run = format!(
        "{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis())
    );
    let producer = if dry_run {
        None
    } else {
        let p: FutureProducer = kafka
            .config
            .producer_config(CLIENT)
            .set(
                "message.max.bytes",
                sluice_apply::group::DEAD_LETTER_MAX_BYTES.to_string(),
            )
            .create()
            .map_err(|e| format!("could not make the replay's producer: {e}"))?;
        Some(p)
    };
    let by_at: HashMap<(i32, i64), &DeadLetter> = letters.iter().map(|d| (d.at, d)).collect();
    for ((topic, p), ds) in by_partition {
        let from = ds.iter().map(|d| d.offset).min().unwrap_or(0);
        let (lo, _) = kafka.bounds(&c, &topic, p)?;
        let (log, end) = kafka.source(&c, &topic, p, from.max(lo))?;
        let log: Vec<SourceEvent> = log.into_iter().map(|(e, _)| e).collect();
        let plan = plan_partition(&ds, lo, &log);
        for (at, why) in plan.skipped {
            outcome.skipped.push((by_at[&at].clone(), why));
        }
        outcome.replayed += plan.replayed.len();
        outcome.written += plan.reoffers.len();
        let Some(producer) = &producer else { continue };
        if plan.reoffers.is_empty() {
            continue;
        }
        let mongo_keys: HashSet<Vec<u8>> = plan
            .replayed
            .iter()
            .filter_map(|at| {
                by_at[at]
                    .event
                    .mongo
                    .then(|| by_at[at].key.clone())
                    .flatten()
            })
            .collect();
        let markers: Vec<(i32, i64)> = plan.replayed.clone();
        let mut written = write(kafka, producer, &topic, p, &run, &plan.reoffers, &markers).await?;
        written.retain(|k, _| mongo_keys.contains(k));
        // The capture's writes of those documents that landed among the replay's.
        let mut from = end;
        for round in 0.. {
            if written.is_empty() {
                break;
            }
            if round == 20 {
                return Err(format!(
                    "{topic}/{p}: the source keeps changing the replayed documents while the \
                     replay writes; run it again when they are quieter"
                ));
            }
            let (window, end) = kafka.source(&c, &topic, p, from)?;
            let again = left_behind(&written, &window, &run);
            if again.is_empty() {
                break;
            }
            outcome.rewritten += again.len();
            written = write(kafka, producer, &topic, p, &run, &again, &[]).await?;
            from = end;
        }
    }
    Ok(outcome)
}

/// Write `offers` to `topic`/`p` (in order: the producer is idempotent), then, once every one
/// is acknowledged, the markers of `replayed` to the dead-letter topic; the offset of each key's
/// last write.
async fn write(
    kafka: &Kafka,
    producer: &FutureProducer,
    topic: &str,
    p: i32,
    run: &str,
    offers: &[Reoffer],
    replayed: &[(i32, i64)],
) -> Result<HashMap<Vec<u8>, i64>, String> {
    let mut sends = Vec::new();
    for o in offers {
        let of = format!("{run} {topic}/{p}@{}", o.offset);
        let headers = OwnedHeaders::new().insert(Header {
            key: REPLAY,
            value: Some(&of),
        });
        let mut r = FutureRecord::to(topic)
            .partition(p)
            .payload(&o.payload)
            .headers(headers);
        if let Some(k) = &o.key {
            r = r.key(k);
        }
        let key = o.key.clone();
        sends.push(async move { (key, producer.send(r, Duration::from_secs(60)).await) });
    }
    let sent = futures::future::join_all(sends).await;
    let mut last = HashMap::new();
    for (key, r) in sent {
        match r {
            Ok(d) => {
                if let Some(k) = key {
                    last.insert(k, d.offset);
                }
            }
            Err((e, _)) => {
                return Err(format!(
                    "writing to {topic}/{p}: {e}; its dead letters are not marked replayed \
                     (run the replay again: what was written is written again harmlessly)"
                ))
            }
        }
    }
    let mut marks = Vec::new();
    for (dp, at) in replayed {
        let at = at.to_string();
        let r: FutureRecord<'_, (), [u8]> = FutureRecord::to(&kafka.dead_letter_topic)
            .partition(*dp)
            .payload(&[][..])
            .headers(OwnedHeaders::new().insert(Header {
                key: REPLAYED,
                value: Some(&at),
            }));
        marks.push(producer.send(r, Duration::from_secs(60)));
    }
    for r in futures::future::join_all(marks).await {
        if let Err((e, _)) = r {
            return Err(format!(
                "the events of {topic}/{p} are written again, but marking their dead letters \
                 replayed in {} failed: {e} (a replay run again writes them again, harmlessly)",
                kafka.dead_letter_topic
            ));
        }
    }
    Ok(last)
}

#[cfg(test)]
mod tests;
