//! `sluice events` (also `sluice-events`): print the records of a topic, one line each, with
//! where each is (partition@offset) and its Kafka time. Change events show with column names
//! from the schema topic (MongoDB documents as relaxed extended JSON); the checkpoint topic and
//! the schema topic are decoded too. For operators and the demo.
//!
//! ```text
//! sluice events --topic sluice.shop.orders [--count 10] [--follow] [--wait SECONDS]
//!     [--merge] [--json]
//! ```

use std::collections::HashMap;
use std::time::{Duration, Instant};

use clap::Parser;
use prost::Message;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::{Message as _, Offset, TopicPartitionList};
use serde_json::{json, Value as Json};
use sluice_proto::v1::{value::Kind, SchemaRecord, TableSchema, Value};
use sluice_proto::ChangeEvent;

/// Print the records of a Kafka topic: change events, checkpoints or schemas.
#[derive(Parser, Debug)]
#[command(name = "sluice-events", version)]
pub struct Args {
    /// Bootstrap brokers.
    #[arg(long, env = "SLUICE_KAFKA_BROKERS", default_value = "127.0.0.1:9092")]
    pub brokers: String,
    /// The topic to read, from its beginning: a change topic, the checkpoint topic or the
    /// schema topic.
    #[arg(long)]
    pub topic: String,
    /// The schema topic, for column names.
    #[arg(long, default_value = "_sluice_schemas")]
    pub schema_topic: String,
    /// The captures' checkpoint topic (its records are JSON checkpoints).
    #[arg(long, default_value = "_sluice_checkpoints")]
    pub checkpoint_topic: String,
    /// Stop after this many records.
    #[arg(long)]
    pub count: Option<usize>,
    /// Keep waiting for new records (otherwise stop at the end of the topic).
    #[arg(long, conflicts_with = "merge")]
    pub follow: bool,
    /// Wait up to this many seconds for the topic to exist and, with --count, for that many
    /// records (for scripts that write and then look).
    #[arg(long, default_value_t = 0)]
    pub wait: u64,
    /// Read to the end, then print the change events of every partition in one order, by
    /// version (the source's order), with a statement written to every partition once.
    #[arg(long)]
    pub merge: bool,
    /// One JSON object per line.
    #[arg(long)]
    pub json: bool,
}

/// One record read.
struct Record<'a> {
    partition: i32,
    offset: i64,
    timestamp_ms: Option<i64>,
    key: Option<&'a [u8]>,
    payload: &'a [u8],
}

fn consumer(brokers: &str) -> BaseConsumer {
    rdkafka::ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("group.id", format!("sluice-events-{}", std::process::id()))
        .set("enable.auto.commit", "false")
        .set("enable.partition.eof", "true")
        .create()
        .expect("Kafka client")
}

/// Read a topic from the beginning to its end (or forever with `follow`).
fn read(
    brokers: &str,
    topic: &str,
    follow: bool,
    wait: Duration,
    mut each: impl FnMut(Record<'_>) -> bool,
    enough: impl Fn() -> bool,
) -> bool {
    let c = consumer(brokers);
    let deadline = Instant::now() + wait;
    let t = loop {
        let md = match c.fetch_metadata(Some(topic), Duration::from_secs(10)) {
            Ok(md) => md,
            Err(e) => {
                eprintln!("sluice events: {topic}: {e}");
                std::process::exit(1);
            }
        };
        if let Some(t) = md
            .topics()
            .iter()
            .find(|t| t.name() == topic && t.error().is_none() && !t.partitions().is_empty())
        {
            break t.partitions().iter().map(|p| p.id()).collect::<Vec<_>>();
        }
        if Instant::now() >= deadline {
            return false; // no such topic
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    let mut tpl = TopicPartitionList::new();
    for p in &t {
        tpl.add_partition_offset(topic, *p, Offset::Beginning)
            .expect("partition");
    }
    c.assign(&tpl).expect("assign");
    let mut at_end = 0;
    let partitions = t.len();
    let mut idle_since = Instant::now();
    loop {
        match c.poll(Duration::from_millis(200)) {
            Some(Ok(m)) => {
                idle_since = Instant::now();
                if let Some(payload) = m.payload() {
                    let r = Record {
                        partition: m.partition(),
                        offset: m.offset(),
                        timestamp_ms: m.timestamp().to_millis(),
                        key: m.key(),
                        payload,
                    };
                    if !each(r) {
                        return true;
                    }
                }
            }
            Some(Err(rdkafka::error::KafkaError::PartitionEOF(_))) => {
                at_end += 1;
                if at_end >= partitions && !follow && (Instant::now() >= deadline || enough()) {
                    return true;
                }
            }
            Some(Err(e)) => {
                eprintln!("sluice events: {e}");
                std::process::exit(1);
            }
            None if !follow
                && idle_since.elapsed() > Duration::from_secs(10)
                && Instant::now() >= deadline =>
            {
                return true;
            }
            None => {}
        }
    }
}

/// A change event's bytes for people, with the column names of the schema topic (read from
/// `brokers`): its line and its JSON; `None` when the bytes are no change event.
pub fn change_event(
    brokers: &str,
    schema_topic: &str,
    payload: &[u8],
) -> Option<(String, serde_json::Map<String, Json>)> {
    let e = ChangeEvent::decode(payload).ok()?;
    let mut schemas = HashMap::new();
    if e.schema_id != 0 && e.schema.is_none() {
        load_schemas(brokers, schema_topic, &mut schemas);
    }
    let schema = schemas.get(&e.schema_id).or(e.schema.as_ref());
    Some((event_text(&e, schema), event_json(&e, schema)))
}

/// Every schema of the schema topic, by id.
fn load_schemas(brokers: &str, topic: &str, schemas: &mut HashMap<u64, TableSchema>) {
    // No schema topic (a MongoDB-only deployment): no column names to show.
    let _ = read(
        brokers,
        topic,
        false,
        Duration::ZERO,
        |rec| {
            if let Ok(r) = SchemaRecord::decode(rec.payload) {
                if let Some(s) = r.schema {
                    schemas.insert(s.schema_id, s);
                }
            }
            true
        },
        || false,
    );
}

fn render(v: &Value) -> String {
    match &v.kind {
        None => "-".into(),
        Some(Kind::Null(_)) => "NULL".into(),
        Some(Kind::Int(i)) => i.to_string(),
        Some(Kind::Uint(u)) => u.to_string(),
        Some(Kind::Float32(f)) => f.to_string(),
        Some(Kind::Float64(f)) => f.to_string(),
        Some(Kind::Decimal(d)) => d.clone(),
        Some(Kind::Text(t)) | Some(Kind::Json(t)) => format!("{t:?}"),
        Some(Kind::Bson(b)) => bson_text(b),
        Some(Kind::Bytes(b)) => {
            format!("0x{}", sluice_common::hex::encode(b))
        }
        Some(Kind::Bits(b)) => format!("b'{b:b}'"),
        Some(Kind::EnumValue(e)) => format!("{:?}", e.label),
        Some(Kind::SetValue(s)) => format!("{:?}", s.members.join(",")),
        Some(Kind::Date(d)) => format!("{:04}-{:02}-{:02}", d.year, d.month, d.day),
        Some(Kind::TimeMicros(t)) => {
            let (sign, t) = if *t < 0 { ("-", -t) } else { ("", *t) };
            let s = t / 1_000_000;
            format!(
                "{sign}{:02}:{:02}:{:02}.{:06}",
                s / 3600,
                s / 60 % 60,
                s % 60,
                t % 1_000_000
            )
        }
        Some(Kind::Datetime(d)) => format!(
            "{:04}-{:02}-{:02} {:02}:{:02}:{:02}.{:06}",
            d.year, d.month, d.day, d.hour, d.minute, d.second, d.micros
        ),
        Some(Kind::TimestampMicros(t)) => format!("@{}.{:06}", t / 1_000_000, t % 1_000_000),
        Some(Kind::Geometry(g)) => format!("geometry(srid {}, {} bytes)", g.srid, g.wkb.len()),
        Some(Kind::RawText(r)) => format!("raw {}({} bytes)", r.charset, r.data.len()),
    }
}

/// A BSON document as relaxed extended JSON (a `{"v": x}` wrapper shows as `x`), or its bytes
/// in hex when they are not BSON.
fn bson_text(b: &[u8]) -> String {
    use mongodb::bson::{Bson, Document};
    match Document::from_reader(&mut &b[..]) {
        Ok(d) if d.len() == 1 && d.contains_key("v") => d
            .get("v")
            .cloned()
            .unwrap_or(Bson::Null)
            .into_relaxed_extjson()
            .to_string(),
        Ok(d) => Bson::Document(d).into_relaxed_extjson().to_string(),
        Err(_) => format!("0x{}", sluice_common::hex::encode(b)),
    }
}

fn row(schema: Option<&TableSchema>, values: &[Value]) -> String {
    values
        .iter()
        .enumerate()
        .map(|(i, v)| {
            let name = schema
                .and_then(|s| s.columns.get(i))
                .map(|c| c.name.clone())
                .unwrap_or_else(|| format!("#{i}"));
            format!("{name}={}", render(v))
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// A Kafka time as `YYYY-MM-DDTHH:MM:SS.mmmZ`.
pub fn time_text(ms: Option<i64>) -> String {
    let Some(ms) = ms else {
        return "-".into();
    };
    let (days, rem) = (ms.div_euclid(86_400_000), ms.rem_euclid(86_400_000));
    let (y, m, d) = sluice_common::civil::civil_from_days(days);
    let s = rem / 1000;
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{:03}Z",
        s / 3600,
        s / 60 % 60,
        s % 60,
        rem % 1000
    )
}

/// A value as JSON: numbers and strings as such, BSON as relaxed extended JSON, the rest as
/// their text.
fn json_value(v: &Value) -> Json {
    match &v.kind {
        None => Json::Null,
        Some(Kind::Null(_)) => Json::Null,
        Some(Kind::Int(i)) => json!(i),
        Some(Kind::Uint(u)) => json!(u),
        Some(Kind::Float64(f)) => json!(f),
        Some(Kind::Float32(f)) => json!(f),
        Some(Kind::Text(t)) | Some(Kind::Json(t)) | Some(Kind::Decimal(t)) => json!(t),
        Some(Kind::Bson(b)) => bson_json(b),
        _ => json!(render(v)),
    }
}

fn bson_json(b: &[u8]) -> Json {
    serde_json::from_str(&bson_text(b)).unwrap_or_else(|_| json!(bson_text(b)))
}

fn row_json(schema: Option<&TableSchema>, values: &[Value]) -> Json {
    let mut o = serde_json::Map::new();
    for (i, v) in values.iter().enumerate() {
        let name = schema
            .and_then(|s| s.columns.get(i))
            .map(|c| c.name.clone())
            .unwrap_or_else(|| format!("#{i}"));
        o.insert(name, json_value(v));
    }
    Json::Object(o)
}

/// A change event as one line of text.
fn event_text(e: &ChangeEvent, schema: Option<&TableSchema>) -> String {
    let op = format!("{:?}", e.op()).to_uppercase();
    let mut line = format!("{op:<8} {}.{} v{}", e.database, e.table, e.version);
    if let Some(d) = &e.ddl {
        line.push_str(&format!(" {:?}", d.statement));
    }
    if let Some(b) = &e.before {
        line.push_str(&format!(" before[{}]", row(schema, &b.values)));
    }
    if let Some(a) = &e.after {
        line.push_str(&format!(" after[{}]", row(schema, &a.values)));
    }
    if let Some(m) = &e.mongo {
        if !m.document_key.is_empty() {
            line.push_str(&format!(" key {}", bson_text(&m.document_key)));
        }
        if let Some(u) = &m.update_description {
            if !u.updated_fields.is_empty() {
                line.push_str(&format!(" set {}", bson_text(&u.updated_fields)));
            }
            if !u.removed_fields.is_empty() {
                line.push_str(&format!(" unset {:?}", u.removed_fields));
            }
            for t in &u.truncated_arrays {
                line.push_str(&format!(" truncate {}:{}", t.field, t.new_size));
            }
        }
        if !m.full_document.is_empty() {
            line.push_str(&format!(" doc {}", bson_text(&m.full_document)));
        }
    }
    line
}

/// A change event as a JSON object.
fn event_json(e: &ChangeEvent, schema: Option<&TableSchema>) -> serde_json::Map<String, Json> {
    let mut o = serde_json::Map::new();
    o.insert("op".into(), json!(format!("{:?}", e.op()).to_lowercase()));
    o.insert("database".into(), json!(e.database));
    o.insert("table".into(), json!(e.table));
    o.insert("version".into(), json!(e.version));
    if let Some(d) = &e.ddl {
        o.insert("statement".into(), json!(d.statement));
    }
    if let Some(b) = &e.before {
        o.insert("before".into(), row_json(schema, &b.values));
    }
    if let Some(a) = &e.after {
        o.insert("after".into(), row_json(schema, &a.values));
    }
    if let Some(m) = &e.mongo {
        if !m.document_key.is_empty() {
            o.insert("key".into(), bson_json(&m.document_key));
        }
        if let Some(u) = &m.update_description {
            if !u.updated_fields.is_empty() {
                o.insert("set".into(), bson_json(&u.updated_fields));
            }
            if !u.removed_fields.is_empty() {
                o.insert("unset".into(), json!(u.removed_fields));
            }
        }
        if !m.full_document.is_empty() {
            o.insert("doc".into(), bson_json(&m.full_document));
        }
    }
    o
}

/// What a topic holds.
#[derive(Clone, Copy, PartialEq)]
enum TopicKind {
    Changes,
    Checkpoints,
    Schemas,
}

/// A line for a record of the checkpoint or schema topic: (text, JSON fields).
fn other_record(kind: TopicKind, r: &Record<'_>) -> (String, serde_json::Map<String, Json>) {
    let key = r
        .key
        .map(|k| String::from_utf8_lossy(k).into_owned())
        .unwrap_or_default();
    let mut o = serde_json::Map::new();
    o.insert("key".into(), json!(key));
    if kind == TopicKind::Checkpoints {
        let value: Json = serde_json::from_slice(r.payload)
            .unwrap_or_else(|_| json!(format!("({} bytes, not JSON)", r.payload.len())));
        let text = format!("CHECKPOINT {key} {value}");
        o.insert("checkpoint".into(), value);
        return (text, o);
    }
    match SchemaRecord::decode(r.payload).ok().and_then(|s| s.schema) {
        Some(s) => {
            let cols: Vec<String> = s
                .columns
                .iter()
                .enumerate()
                .map(|(i, c)| {
                    let pk = if s.primary_key.contains(&(i as u32)) {
                        " key"
                    } else {
                        ""
                    };
                    format!("{} {}{pk}", c.name, c.sql_type)
                })
                .collect();
            let text = format!(
                "SCHEMA   {}.{} id {} ({})",
                s.database,
                s.table,
                s.schema_id,
                cols.join(", ")
            );
            o.insert("schema_id".into(), json!(s.schema_id));
            o.insert("database".into(), json!(s.database));
            o.insert("table".into(), json!(s.table));
            o.insert("columns".into(), json!(cols));
            (text, o)
        }
        None => (
            format!("(not a schema record: {} bytes)", r.payload.len()),
            o,
        ),
    }
}

/// What [`run`] found: no such topic, or the topic and how many records it printed.
#[derive(Debug, PartialEq)]
pub enum Outcome {
    NoTopic,
    Printed(usize),
}

impl Outcome {
    /// The error a script should see: no topic, or fewer records than `--count` asked for
    /// within `--wait`.
    pub fn error(&self, args: &Args) -> Option<String> {
        match (self, args.count) {
            (Outcome::NoTopic, _) => Some(format!("topic {} does not exist", args.topic)),
            (Outcome::Printed(n), Some(want)) if *n < want && !args.follow => Some(format!(
                "{n} of the {want} records asked for (--count) on {}{}",
                args.topic,
                if args.wait > 0 {
                    format!(" arrived within --wait {} s", args.wait)
                } else {
                    " were there (--wait S waits for more)".into()
                }
            )),
            _ => None,
        }
    }
}

/// Print `args.topic`: how many records (with `--merge`, lines) it printed.
pub fn run(args: &Args) -> Outcome {
    let kind = if args.topic == args.checkpoint_topic {
        TopicKind::Checkpoints
    } else if args.topic == args.schema_topic {
        TopicKind::Schemas
    } else {
        TopicKind::Changes
    };
    let mut schemas: HashMap<u64, TableSchema> = HashMap::new();
    if kind == TopicKind::Changes {
        load_schemas(&args.brokers, &args.schema_topic, &mut schemas);
    }
    let mut printed = 0;
    // With --merge: the lines it will print (a statement once), for --count.
    let merged = std::cell::Cell::new(0usize);
    let mut statements_seen = std::collections::HashSet::new();
    let wait = Duration::from_secs(args.wait);
    // With --merge: (version, partition, offset, line), printed once all is read.
    let mut held: Vec<(u64, i32, i64, String, Option<String>)> = Vec::new();
    let found = read(
        &args.brokers,
        &args.topic,
        args.follow,
        wait,
        |r| {
            let at = format!("{}@{}", r.partition, r.offset);
            let (text, mut fields, version, ddl) = if kind != TopicKind::Changes {
                let (t, o) = other_record(kind, &r);
                (t, o, 0, None)
            } else {
                match ChangeEvent::decode(r.payload) {
                    Ok(e) => {
                        if e.schema_id != 0 && !schemas.contains_key(&e.schema_id) {
                            // A schema published after the schema topic was read.
                            load_schemas(&args.brokers, &args.schema_topic, &mut schemas);
                        }
                        let schema = schemas.get(&e.schema_id).or(e.schema.as_ref());
                        // A statement is written to every partition: one line for it when merged.
                        let ddl = e.ddl.as_ref().map(|d| {
                            format!(
                                "{}.{}\u{0}{}\u{0}{}",
                                e.database, e.table, e.version, d.statement
                            )
                        });
                        (
                            event_text(&e, schema),
                            event_json(&e, schema),
                            e.version,
                            ddl,
                        )
                    }
                    Err(_) => (
                        format!("(not a change event: {} bytes)", r.payload.len()),
                        serde_json::Map::new(),
                        0,
                        None,
                    ),
                }
            };
            let line = if args.json {
                fields.insert("partition".into(), json!(r.partition));
                fields.insert("offset".into(), json!(r.offset));
                fields.insert("timestamp_ms".into(), json!(r.timestamp_ms));
                Json::Object(fields).to_string()
            } else {
                format!("{at:<9} {} {text}", time_text(r.timestamp_ms))
            };
            if args.merge {
                if ddl
                    .as_ref()
                    .is_none_or(|d| statements_seen.insert(d.clone()))
                {
                    merged.set(merged.get() + 1);
                }
                held.push((version, r.partition, r.offset, line, ddl));
                return true;
            }
            println!("{line}");
            printed += 1;
            args.count.is_none_or(|n| printed < n)
        },
        || args.merge && args.count.is_some_and(|n| merged.get() >= n),
    );
    if args.merge {
        held.sort_by_key(|a| (a.0, a.1, a.2));
        let mut seen = std::collections::HashSet::new();
        for (_, _, _, line, ddl) in held {
            if ddl.is_some_and(|d| !seen.insert(d)) {
                continue;
            }
            if args.count.is_some_and(|n| printed >= n) {
                break;
            }
            println!("{line}");
            printed += 1;
        }
    }
    if found {
        Outcome::Printed(printed)
    } else {
        Outcome::NoTopic
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kafka_times_read_as_utc() {
        assert_eq!(time_text(Some(0)), "1970-01-01T00:00:00.000Z");
        assert_eq!(
            time_text(Some(1_796_205_600_123)),
            "2026-12-02T10:00:00.123Z"
        );
        assert_eq!(time_text(None), "-");
    }

    #[test]
    fn values_keep_their_json_kind() {
        let v = |k| Value { kind: Some(k) };
        assert_eq!(json_value(&v(Kind::Int(-3))), json!(-3));
        assert_eq!(json_value(&v(Kind::Text("a\"b".into()))), json!("a\"b"));
        assert_eq!(json_value(&v(Kind::Decimal("1.50".into()))), json!("1.50"));
        assert_eq!(json_value(&Value { kind: None }), Json::Null);
        let doc = mongodb::bson::doc! {"v": {"a": 1}};
        let mut b = Vec::new();
        doc.to_writer(&mut b).unwrap();
        assert_eq!(json_value(&v(Kind::Bson(b))), json!({"a": 1}));
    }
}
