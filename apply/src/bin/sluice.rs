//! `sluice`: the operator's command.
//!
//!     sluice status [--connector NAME] [--group G] [--json]
//!     sluice dead-letters list   [--table DB.T] [--reason R] [--all] [--json]
//!     sluice dead-letters replay (--table DB.T | --reason R | --all) [--dry-run]
//!
//! Kafka is reached with `--brokers` (or `SLUICE_KAFKA_BROKERS`) and any librdkafka property
//! given with `-X key=value` (TLS, SASL).

use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};
use prost::Message as _;
use sluice_apply::replay::{self, DeadLetter, Filter, Kafka};
use sluice_proto::v1::{value::Kind, EventKey};

/// The operator's command: where the captures stand and how far the apply groups are behind;
/// dead letters listed and replayed.
#[derive(Parser)]
#[command(name = "sluice", version)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Where each capture connector stands (its last stored checkpoint: binlog position and
    /// GTID set, or oplog time and resume token; the snapshot under way) and how far each apply
    /// group is behind (per partition: committed offset, end, events behind, how long the first
    /// of them has waited; the members and their partitions).
    Status {
        #[command(flatten)]
        kafka: KafkaArgs,
        /// The captures' checkpoint topic (`[publish] checkpoint_topic`).
        #[arg(long, default_value = "_sluice_checkpoints")]
        checkpoint_topic: String,
        /// Only this connector (repeatable); default every connector of the checkpoint topic.
        #[arg(long)]
        connector: Vec<String>,
        /// Only this consumer group (repeatable); default every group with committed offsets.
        #[arg(long)]
        group: Vec<String>,
        /// One JSON document.
        #[arg(long)]
        json: bool,
    },
    /// The events an apply stage could not write: list them, replay them once the cause is
    /// fixed.
    #[command(subcommand)]
    DeadLetters(DeadLetters),
}

#[derive(Subcommand)]
enum DeadLetters {
    /// One line per dead letter: where it is, its table, operation, key, reason and where it
    /// was read (not yet replayed ones unless --all).
    List {
        #[command(flatten)]
        kafka: KafkaArgs,
        #[command(flatten)]
        select: Select,
        /// Dead letters already replayed too.
        #[arg(long)]
        all: bool,
        /// One JSON object per line.
        #[arg(long)]
        json: bool,
    },
    /// Write the selected dead letters again to the topic and partition they were read from,
    /// where the apply stage takes them like any event, and mark them replayed (once: a second
    /// replay skips them). MySQL rows are written again alone (their version orders them); a
    /// MongoDB document gets its history from the dead letter on. Take the target's stop off
    /// first (`_sluice_stopped` in ClickHouse, `stopped_collections` in MongoDB), or the events
    /// are dead-lettered again.
    Replay {
        #[command(flatten)]
        kafka: KafkaArgs,
        #[command(flatten)]
        select: Select,
        /// Every dead letter not yet replayed (when neither --table nor --reason is given).
        #[arg(long)]
        all: bool,
        /// Say what would be written, write nothing.
        #[arg(long)]
        dry_run: bool,
    },
}

#[derive(Args)]
struct KafkaArgs {
    /// Bootstrap brokers.
    #[arg(long, env = "SLUICE_KAFKA_BROKERS", default_value = "127.0.0.1:9092")]
    brokers: String,
    /// A librdkafka property, `key=value` (repeatable): `security.protocol`, `ssl.*`, `sasl.*`.
    #[arg(short = 'X', value_name = "KEY=VALUE")]
    property: Vec<String>,
    /// The dead-letter topic (the apply stage's `errors.dead_letter_topic`).
    #[arg(long, default_value = "_sluice_dead_letters")]
    topic: String,
}

#[derive(Args)]
struct Select {
    /// Only events of this source table or collection, `database.table`.
    #[arg(long, value_name = "DB.TABLE")]
    table: Option<String>,
    /// Only this reason: a label (`value`, `table_stopped`, `duplicate_key`, `refused`, `ddl`,
    /// `undecodable`, `contract`, `unknown_schema`) or a piece of the reason's text.
    #[arg(long)]
    reason: Option<String>,
}

impl KafkaArgs {
    fn kafka(&self) -> Result<Kafka, String> {
        let mut config = sluice_common::KafkaConfig {
            brokers: self.brokers.clone(),
            ..Default::default()
        };
        for p in &self.property {
            let (k, v) = p
                .split_once('=')
                .ok_or_else(|| format!("-X {p}: expected key=value"))?;
            config.properties.insert(k.trim().into(), v.trim().into());
        }
        config
            .validate()
            .map_err(|(k, e)| format!("--brokers ({k}): {e}"))?;
        Ok(Kafka {
            config,
            dead_letter_topic: self.topic.clone(),
        })
    }
}

fn key_text(d: &DeadLetter) -> String {
    let Some(k) = d.key.as_deref() else {
        return "-".into();
    };
    let Ok(k) = EventKey::decode(k) else {
        return "?".into();
    };
    if k.key.is_empty() {
        return "-".into();
    }
    k.key
        .iter()
        .map(|v| match &v.kind {
            Some(Kind::Int(i)) | Some(Kind::TimeMicros(i)) | Some(Kind::TimestampMicros(i)) => {
                i.to_string()
            }
            Some(Kind::Uint(u)) | Some(Kind::Bits(u)) => u.to_string(),
            Some(Kind::Text(s)) | Some(Kind::Decimal(s)) | Some(Kind::Json(s)) => format!("{s:?}"),
            Some(Kind::Bytes(b)) => format!("0x{}", sluice_common::hex::encode(b)),
            Some(Kind::Bson(b)) => mongodb::bson::RawDocument::from_bytes(b)
                .ok()
                .and_then(|d| d.get("v").ok().flatten())
                .and_then(|v| mongodb::bson::Bson::try_from(v.to_raw_bson()).ok())
                .map(|v| v.to_string())
                .unwrap_or_else(|| "bson".into()),
            Some(Kind::Null(_)) | None => "NULL".into(),
            Some(other) => format!("{other:?}"),
        })
        .collect::<Vec<_>>()
        .join(",")
}

fn filter(select: &Select, replayed: bool) -> Filter {
    Filter {
        table: select.table.clone(),
        reason: select.reason.clone(),
        replayed,
    }
}

async fn run(cli: Cli) -> Result<bool, String> {
    match cli.command {
        Command::Status {
            kafka,
            checkpoint_topic,
            connector,
            group,
            json,
        } => {
            let config = kafka.kafka()?.config;
            let status = tokio::task::spawn_blocking(move || {
                sluice_apply::status::read(&config, &checkpoint_topic, &connector, &group)
            })
            .await
            .map_err(|e| e.to_string())??;
            if json {
                println!(
                    "{}",
                    serde_json::to_string_pretty(&status).expect("status serializes")
                );
            } else {
                print!("{}", sluice_apply::status::text(&status));
            }
            Ok(true)
        }
        Command::DeadLetters(DeadLetters::List {
            kafka,
            select,
            all,
            json,
        }) => {
            let f = filter(&select, all);
            let letters = kafka.kafka()?.dead_letters()?;
            let shown: Vec<&DeadLetter> = letters.iter().filter(|d| f.matches(d)).collect();
            for d in &shown {
                if json {
                    println!(
                        "{}",
                        serde_json::json!({
                            "partition": d.at.0,
                            "offset": d.at.1,
                            "time_ms": d.timestamp_ms,
                            "table": d.event.table,
                            "op": d.event.op_label(),
                            "key": key_text(d),
                            "kind": d.kind,
                            "reason": d.reason,
                            "source": format!("{}/{}@{}", d.topic, d.partition, d.offset),
                            "replayed": d.replayed,
                        })
                    );
                } else {
                    println!(
                        "{}@{}  {}  {} key={}  [{}] {}  (read at {}/{}@{}){}",
                        d.at.0,
                        d.at.1,
                        if d.event.table.is_empty() {
                            "?"
                        } else {
                            &d.event.table
                        },
                        d.event.op_label(),
                        key_text(d),
                        d.kind.as_deref().unwrap_or("-"),
                        d.reason,
                        d.topic,
                        d.partition,
                        d.offset,
                        if d.replayed { "  replayed" } else { "" }
                    );
                }
            }
            if !json {
                eprintln!("{} dead letters", shown.len());
            }
            Ok(true)
        }
        Command::DeadLetters(DeadLetters::Replay {
            kafka,
            select,
            all,
            dry_run,
        }) => {
            if select.table.is_none() && select.reason.is_none() && !all {
                return Err("say which dead letters to replay: --table, --reason, or --all".into());
            }
            let o = replay::replay(&kafka.kafka()?, &filter(&select, false), dry_run).await?;
            for (d, why) in &o.skipped {
                println!(
                    "not replayed {}@{} ({} {} key={}): {why}",
                    d.at.0,
                    d.at.1,
                    d.event.table,
                    d.event.op_label(),
                    key_text(d)
                );
            }
            println!(
                "{}{} dead letters replayed, {} events written again{}, {} not replayed",
                if dry_run { "dry run: " } else { "" },
                o.replayed,
                o.written,
                if o.rewritten > 0 {
                    format!(
                        " (and {} written meanwhile by the capture, again after them)",
                        o.rewritten
                    )
                } else {
                    String::new()
                },
                o.skipped.len()
            );
            Ok(o.skipped.is_empty())
        }
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli).await {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(e) => {
            eprintln!("sluice: {e}");
            ExitCode::from(1)
        }
    }
}
