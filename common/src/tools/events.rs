//! `sluice-events`: print the change events of a topic, one line each, with column names from
//! the schema topic (MongoDB documents as relaxed extended JSON). For operators and the demo.
//!
//!     sluice-events --brokers 127.0.0.1:9092 --topic sluice.shop.orders [--count 10] [--follow]
//!         [--wait SECONDS]

use std::collections::HashMap;
use std::time::{Duration, Instant};

use clap::Parser;
use prost::Message;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::{Message as _, Offset, TopicPartitionList};
use sluice_proto::v1::{value::Kind, SchemaRecord, TableSchema, Value};
use sluice_proto::ChangeEvent;

/// Print the change events of a Kafka topic.
#[derive(Parser)]
#[command(name = "sluice-events", version)]
struct Args {
    /// Bootstrap brokers.
    #[arg(long, env = "SLUICE_KAFKA_BROKERS", default_value = "127.0.0.1:9092")]
    brokers: String,
    /// The topic to read, from its beginning.
    #[arg(long)]
    topic: String,
    /// The schema topic, for column names.
    #[arg(long, default_value = "_sluice_schemas")]
    schema_topic: String,
    /// Stop after this many events.
    #[arg(long)]
    count: Option<usize>,
    /// Keep waiting for new events (otherwise stop at the end of the topic).
    #[arg(long)]
    follow: bool,
    /// Wait up to this many seconds for the topic to exist and, with --count, for that many
    /// events (for scripts that write and then look).
    #[arg(long, default_value_t = 0)]
    wait: u64,
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
    mut each: impl FnMut(&[u8]) -> bool,
) -> bool {
    let c = consumer(brokers);
    let deadline = Instant::now() + wait;
    let t = loop {
        let md = match c.fetch_metadata(Some(topic), Duration::from_secs(10)) {
            Ok(md) => md,
            Err(e) => {
                eprintln!("sluice-events: {topic}: {e}");
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
                if let Some(p) = m.payload() {
                    if !each(p) {
                        return true;
                    }
                }
            }
            Some(Err(rdkafka::error::KafkaError::PartitionEOF(_))) => {
                at_end += 1;
                if at_end >= partitions && !follow && Instant::now() >= deadline {
                    return true;
                }
            }
            Some(Err(e)) => {
                eprintln!("sluice-events: {e}");
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

/// Every schema of the schema topic, by id.
fn load_schemas(brokers: &str, topic: &str, schemas: &mut HashMap<u64, TableSchema>) {
    // No schema topic (a MongoDB-only deployment): no column names to show.
    let _ = read(brokers, topic, false, Duration::ZERO, |p| {
        if let Ok(r) = SchemaRecord::decode(p) {
            if let Some(s) = r.schema {
                schemas.insert(s.schema_id, s);
            }
        }
        true
    });
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

fn main() {
    let args = Args::parse();
    let mut schemas: HashMap<u64, TableSchema> = HashMap::new();
    load_schemas(&args.brokers, &args.schema_topic, &mut schemas);
    let mut printed = 0;
    let wait = Duration::from_secs(args.wait);
    let found = read(&args.brokers, &args.topic, args.follow, wait, |p| {
        let Ok(e) = ChangeEvent::decode(p) else {
            println!("(not a change event: {} bytes)", p.len());
            return true;
        };
        if e.schema_id != 0 && !schemas.contains_key(&e.schema_id) {
            // A schema published after the schema topic was read.
            load_schemas(&args.brokers, &args.schema_topic, &mut schemas);
        }
        let schema = schemas.get(&e.schema_id).or(e.schema.as_ref());
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
        println!("{line}");
        printed += 1;
        args.count.is_none_or(|n| printed < n)
    });
    if !found {
        eprintln!("sluice-events: topic {} does not exist", args.topic);
        std::process::exit(1);
    }
}
