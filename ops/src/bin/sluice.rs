//! `sluice`: the operator's command.
//!
//!     sluice status [--connector NAME] [--group G] [--apply-config FILE] [--json]
//!     sluice position show (--connector NAME | --group G)
//!     sluice position set --connector NAME (--binlog FILE:POS | --oplog SECONDS[.INC])
//!     sluice position set --group G (--to-end | --to-start | --to-time T | --to-position FILE:POS
//!                                    | --to-offset T:P=O...)
//!     sluice events --topic TOPIC [--merge] [--json] [--count N] [--follow] [--wait S]
//!     sluice mongo --uri URI --db DB '{"find": "coll"}'
//!     sluice dead-letters list   [--table DB.T] [--reason R] [--since T] [--all] [--json]
//!     sluice dead-letters show PARTITION@OFFSET [--json]
//!     sluice dead-letters replay (--table DB.T | --reason R | --all) [--dry-run]
//!     sluice verify --capture-config FILE --apply-config FILE [--table DB.T] [--json]
//!
//! Kafka is reached with `--brokers` (or `SLUICE_KAFKA_BROKERS`, or the stages' own
//! `SLUICE__KAFKA__BROKERS`) and any librdkafka property
//! given with `-X key=value` (TLS, SASL).

use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};
use sluice_ops::letters;
use sluice_ops::replay::{self, DeadLetter, Filter, Kafka};

/// The operator's command: where the captures stand and how far the apply groups are behind,
/// positions moved, dead letters listed and replayed, the records of a topic printed.
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
    /// of them has waited; the members and their partitions); the dead letters by table and
    /// reason.
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
        /// A capture-mysql config (repeatable): its connector is shown with the source's
        /// position now and the binlog bytes its stored position is behind.
        #[arg(long, value_name = "FILE")]
        capture_config: Vec<std::path::PathBuf>,
        /// An apply-clickhouse or apply-mongo config (repeatable): its stopped tables (or
        /// collections) are listed, read from its target, with since when, why, and the
        /// steps that take each up again.
        #[arg(long, value_name = "FILE")]
        apply_config: Vec<std::path::PathBuf>,
        /// One JSON document.
        #[arg(long)]
        json: bool,
    },
    /// Show or move a stopped capture's stored position, or a stopped apply group's offsets.
    #[command(subcommand)]
    Position(Position),
    /// Print the records of a topic, one line each, with partition@offset and Kafka time:
    /// change events (with column names), the checkpoint topic or the schema topic.
    Events(sluice_ops::events::Args),
    /// Run one MongoDB database command, given as extended JSON, and print the reply (a
    /// find's documents one per line).
    Mongo(sluice_ops::mongo_command::Args),
    /// The events an apply stage could not write: list them, replay them once the cause is
    /// fixed.
    #[command(subcommand)]
    DeadLetters(DeadLetters),
    /// Compare the source with the target: MySQL/MariaDB with its ClickHouse mirror, table by
    /// table, in primary-key chunks hashed on each server; or MongoDB with MongoDB, document by
    /// document; and print the keys that are missing, extra or different, with both values. Right while the pipeline runs: a key that changed while it
    /// was compared is read again once the target has caught up. Exit status 0 when equal, 1
    /// when not, 2 when some table could not be verified or some key kept changing.
    Verify(VerifyArgs),
}

#[derive(Args)]
struct VerifyArgs {
    /// capture-mysql's (or capture-mongo's) config: the source, the filter (which tables), the
    /// connector and its checkpoint topic. The environment overrides it as it does the capture's
    /// (`SLUICE__MYSQL__URL=...`).
    #[arg(long, value_name = "FILE")]
    capture_config: std::path::PathBuf,
    /// apply-clickhouse's (or apply-mongo's) config: the target, the table names and modes (or
    /// namespaces), the consumer group.
    #[arg(long, value_name = "FILE")]
    apply_config: std::path::PathBuf,
    /// Only this source table, `database.table` (repeatable); default every table the
    /// capture's filter takes.
    #[arg(long, value_name = "DB.TABLE")]
    table: Vec<String>,
    /// Rows per chunk (tables whose primary key is one integer column; others are one chunk).
    #[arg(long, default_value_t = 10_000)]
    chunk_rows: u64,
    /// Chunks checksummed at the same time, each on a source connection of its own (servers
    /// with cores to spare hash in parallel).
    #[arg(long, default_value_t = 1)]
    parallel: usize,
    /// Rounds of reading again the keys that changed while they were compared, before they
    /// are reported as unsettled.
    #[arg(long, default_value_t = 5)]
    rounds: u32,
    /// Seconds to wait, in each round, for the target to catch up with the source.
    #[arg(long, default_value_t = 120)]
    wait_secs: u64,
    /// Keys printed per table and kind (all of them with --json).
    #[arg(long, default_value_t = 20)]
    show: usize,
    /// One JSON document.
    #[arg(long)]
    json: bool,
    /// No progress lines on stderr.
    #[arg(long)]
    quiet: bool,
}

#[derive(Subcommand)]
enum Position {
    /// A connector's stored checkpoint (JSON, as stored), or a group's committed offsets.
    Show {
        #[command(flatten)]
        kafka: KafkaArgs,
        #[command(flatten)]
        which: Which,
    },
    /// Move a connector's position (a new checkpoint: the old one with the position moved;
    /// refused while a capture of it runs, or while its checkpoint holds a snapshot or
    /// statements tied to its position), or commit a group's offsets (refused while it has
    /// members). Moving forward skips what lies between: the target misses it. Moving back
    /// publishes or applies it again: a mirror is unchanged, a change log gets it twice.
    Set {
        #[command(flatten)]
        kafka: KafkaArgs,
        #[command(flatten)]
        which: Which,
        /// capture-mysql: resume at this binlog coordinate, an event's start (as `SHOW BINLOG
        /// EVENTS` lists them), e.g. `mysql-bin.000007:1234`.
        #[arg(long, value_name = "FILE:POS")]
        binlog: Option<String>,
        /// capture-mongo: resume after this oplog time, `SECONDS[.INCREMENT]`.
        #[arg(long, value_name = "SECONDS[.INC]")]
        oplog: Option<String>,
        /// A group: every partition it committed on to its end (skip everything published).
        #[arg(long)]
        to_end: bool,
        /// A group: every partition it committed on to its start (apply all Kafka holds).
        #[arg(long)]
        to_start: bool,
        /// A group: every partition to its first event at or after this time (seconds since
        /// the epoch or `YYYY-MM-DDTHH:MM:SSZ`).
        #[arg(long, value_name = "TIME")]
        to_time: Option<String>,
        /// A group: every partition to its first event at or after this source position, a
        /// binlog coordinate `FILE:POS` (of `--generation`): what the capture published from
        /// there on is applied again.
        #[arg(long, value_name = "FILE:POS")]
        to_position: Option<String>,
        /// The binlog generation of `--to-position` (the capture's `mysql.generation`, shown in
        /// its checkpoint).
        #[arg(long, default_value_t = 0)]
        generation: u8,
        /// A group: this partition to this offset, `TOPIC:PARTITION=OFFSET` (repeatable).
        #[arg(long, value_name = "TOPIC:PARTITION=OFFSET")]
        to_offset: Vec<String>,
    },
}

#[derive(Args)]
struct Which {
    /// A capture connector (its checkpoint).
    #[arg(long, conflicts_with = "group")]
    connector: Option<String>,
    /// An apply stage's consumer group (its offsets).
    #[arg(long)]
    group: Option<String>,
    /// The captures' checkpoint topic (`[publish] checkpoint_topic`).
    #[arg(long, default_value = "_sluice_checkpoints")]
    checkpoint_topic: String,
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
    /// One dead letter whole: where it was read, when, its reason, its key, and the event
    /// decoded (with column names from the schema topic).
    Show {
        #[command(flatten)]
        kafka: KafkaArgs,
        /// Its place in the dead-letter topic, `PARTITION@OFFSET` as `list` prints it.
        #[arg(value_name = "PARTITION@OFFSET")]
        at: String,
        /// The captures' schema topic (`[publish] schema_topic`).
        #[arg(long, default_value = "_sluice_schemas")]
        schema_topic: String,
        /// One JSON object.
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
    /// Only those dead-lettered at or after this time (seconds since the epoch or
    /// `YYYY-MM-DDTHH:MM:SSZ`).
    #[arg(long, value_name = "TIME")]
    since: Option<String>,
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

fn filter(select: &Select, replayed: bool) -> Result<Filter, String> {
    Ok(Filter {
        table: select.table.clone(),
        reason: select.reason.clone(),
        replayed,
        since_ms: select
            .since
            .as_deref()
            .map(sluice_ops::position::parse_time)
            .transpose()
            .map_err(|e| format!("--since: {e}"))?,
    })
}

async fn verify(a: VerifyArgs) -> Result<u8, String> {
    use sluice_common::config::{left_to_none, load_own};
    use sluice_ops::verify;
    let options = verify::Options {
        tables: a.table,
        chunk_rows: a.chunk_rows,
        parallel: a.parallel,
        rounds: a.rounds,
        wait: std::time::Duration::from_secs(a.wait_secs),
        progress: !a.quiet,
    };
    // capture-mongo's config has a [mongodb] section, capture-mysql's a [mysql] one.
    let text = std::fs::read_to_string(&a.capture_config)
        .map_err(|e| format!("{}: {e}", a.capture_config.display()))?;
    let mongo = text
        .parse::<toml::Table>()
        .map_err(|e| format!("{}: {e}", a.capture_config.display()))?
        .contains_key("mongodb");
    // Each config takes the environment's overrides of its own sections.
    let both = |l1: &std::collections::BTreeSet<String>, l2| match left_to_none(&[l1, l2]) {
        Some(e) => Err(e),
        None => Ok(()),
    };
    let report = if mongo {
        let (capture, l1) = load_own(Some(&a.capture_config)).map_err(|e| e.to_string())?;
        let (apply, l2) = load_own(Some(&a.apply_config)).map_err(|e| e.to_string())?;
        both(&l1, &l2)?;
        verify::mongo::run(&verify::mongo::Setup { capture, apply }, &options).await?
    } else {
        let (capture, l1) = load_own(Some(&a.capture_config)).map_err(|e| e.to_string())?;
        let (apply, l2) = load_own(Some(&a.apply_config)).map_err(|e| e.to_string())?;
        both(&l1, &l2)?;
        verify::run(&verify::Setup { capture, apply }, &options).await?
    };
    if a.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&report).expect("report serializes")
        );
    } else {
        println!("{}", sluice_ops::verify::text(&report, a.show));
    }
    Ok(report.exit_code())
}

async fn run(command: Command) -> Result<bool, String> {
    match command {
        Command::Verify(a) => verify(a).await.map(|code| code == 0),
        Command::Status {
            kafka,
            checkpoint_topic,
            connector,
            group,
            capture_config,
            apply_config,
            json,
        } => {
            let k = kafka.kafka()?;
            let mut status = tokio::task::spawn_blocking(move || {
                sluice_ops::status::read(
                    &k.config,
                    &checkpoint_topic,
                    &connector,
                    &group,
                    &k.dead_letter_topic,
                )
            })
            .await
            .map_err(|e| e.to_string())??;
            // Each config takes the environment's overrides of its own sections.
            let mut left = Vec::new();
            for path in &capture_config {
                let (config, l): (sluice_capture::mysql::Config, _) =
                    sluice_common::config::load_own(Some(path)).map_err(|e| e.to_string())?;
                left.push(l);
                let c = status
                    .connectors
                    .iter_mut()
                    .find(|c| c.name == config.connector)
                    .ok_or_else(|| {
                        format!(
                            "{}: connector {:?} has no checkpoint in {}",
                            path.display(),
                            config.connector,
                            status.checkpoint_topic
                        )
                    })?;
                c.source_now =
                    Some(sluice_ops::status::mysql_source_now(&config.mysql, &c.position).await?);
            }
            if !apply_config.is_empty() {
                let mut stopped = Vec::new();
                for path in &apply_config {
                    let (s, l) = sluice_ops::status::stopped_of_config(path).await?;
                    stopped.extend(s);
                    left.push(l);
                }
                status.stopped = Some(stopped);
            }
            if left.len() > 1 {
                let refs: Vec<_> = left.iter().collect();
                if let Some(e) = sluice_common::config::left_to_none(&refs) {
                    return Err(e);
                }
            }
            if json {
                println!(
                    "{}",
                    serde_json::to_string_pretty(&status).expect("status serializes")
                );
            } else {
                print!("{}", sluice_ops::status::text(&status));
            }
            Ok(true)
        }
        Command::Position(p) => position(p).await,
        Command::Events(args) => {
            let (outcome, args) = tokio::task::spawn_blocking(move || {
                let o = sluice_ops::events::run(&args);
                (o, args)
            })
            .await
            .map_err(|e| e.to_string())?;
            match outcome.error(&args) {
                Some(e) => Err(e),
                None => Ok(true),
            }
        }
        Command::Mongo(args) => {
            sluice_ops::mongo_command::run(&args).await?;
            Ok(true)
        }
        Command::DeadLetters(DeadLetters::List {
            kafka,
            select,
            all,
            json,
        }) => {
            let f = filter(&select, all)?;
            let letters = kafka.kafka()?.dead_letters()?;
            let shown: Vec<&DeadLetter> = letters.iter().filter(|d| f.matches(d)).collect();
            for d in &shown {
                if json {
                    println!("{}", letters::json(d));
                } else {
                    println!("{}", letters::line(d));
                }
            }
            if !json {
                eprintln!("{} dead letters", shown.len());
            }
            Ok(true)
        }
        Command::DeadLetters(DeadLetters::Show {
            kafka,
            at,
            schema_topic,
            json,
        }) => {
            let (p, o) = at
                .split_once('@')
                .and_then(|(p, o)| Some((p.parse::<i32>().ok()?, o.parse::<i64>().ok()?)))
                .ok_or_else(|| format!("{at}: expected PARTITION@OFFSET, as `list` prints it"))?;
            let k = kafka.kafka()?;
            let letters = k.dead_letters()?;
            let d = letters.iter().find(|d| d.at == (p, o)).ok_or_else(|| {
                format!(
                    "no dead letter at {at} of {} (`sluice dead-letters list --all` lists them)",
                    k.dead_letter_topic
                )
            })?;
            let event =
                sluice_ops::events::change_event(&k.config.brokers, &schema_topic, &d.payload);
            if json {
                let mut o = letters::json(d);
                if let Some((_, e)) = event {
                    o["event"] = serde_json::Value::Object(e);
                }
                println!("{o}");
            } else {
                print!(
                    "{}",
                    letters::text(d, &k.dead_letter_topic, event.map(|(l, _)| l))
                );
            }
            Ok(true)
        }
        Command::DeadLetters(DeadLetters::Replay {
            kafka,
            select,
            all,
            dry_run,
        }) => {
            if select.table.is_none() && select.reason.is_none() && select.since.is_none() && !all {
                return Err(
                    "say which dead letters to replay: --table, --reason, --since, or --all".into(),
                );
            }
            let o = replay::replay(&kafka.kafka()?, &filter(&select, false)?, dry_run).await?;
            for (d, why) in &o.skipped {
                println!(
                    "not replayed {}@{} ({} {} key={}): {why}",
                    d.at.0,
                    d.at.1,
                    d.event.table,
                    d.event.op_label(),
                    letters::key_text(d)
                );
            }
            let (replayed, written) = if dry_run {
                ("would be replayed", "would be written again")
            } else {
                ("replayed", "written again")
            };
            println!(
                "{}{} dead letters {replayed}, {} events {written}{}, {} not replayed",
                if dry_run {
                    "dry run (nothing written): "
                } else {
                    ""
                },
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

async fn position(p: Position) -> Result<bool, String> {
    use sluice_ops::position::{self as pos, ConnectorTo, GroupTo};
    let blocking = |f: Box<dyn FnOnce() -> Result<String, String> + Send>| async move {
        tokio::task::spawn_blocking(f)
            .await
            .map_err(|e| e.to_string())?
    };
    let (kafka, which) = match &p {
        Position::Show { kafka, which } | Position::Set { kafka, which, .. } => (kafka, which),
    };
    let config = kafka.kafka()?.config;
    let topic = which.checkpoint_topic.clone();
    let (connector, group) = (which.connector.clone(), which.group.clone());
    let out = match (p, connector, group) {
        (_, None, None) => return Err("say which: --connector NAME or --group G".into()),
        (Position::Show { .. }, Some(c), _) => {
            blocking(Box::new(move || {
                let mut all = sluice_ops::status::read_checkpoints(&config, &topic)?;
                let stored = all.remove(&c).ok_or_else(|| {
                    format!("connector {c:?}: no checkpoint in {topic} (never started?)")
                })?;
                Ok(serde_json::to_string_pretty(&stored.checkpoint).expect("json"))
            }))
            .await?
        }
        (Position::Show { .. }, None, Some(g)) => {
            blocking(Box::new(move || {
                let s = sluice_ops::status::read_groups(&config, std::slice::from_ref(&g))?;
                if s.iter().all(|g| g.partitions.is_empty()) {
                    return Err(format!("group {g:?} has committed no offsets"));
                }
                Ok(s.iter()
                    .flat_map(|g| &g.partitions)
                    .map(|p| {
                        format!(
                            "{}:{}={}",
                            p.topic,
                            p.partition,
                            p.committed.map_or("-".into(), |n| n.to_string())
                        )
                    })
                    .collect::<Vec<_>>()
                    .join("\n"))
            }))
            .await?
        }
        (
            Position::Set {
                binlog,
                oplog,
                to_end,
                to_start,
                to_time,
                to_offset,
                to_position,
                generation,
                ..
            },
            connector,
            group,
        ) => {
            let group_args = to_end as u8
                + to_start as u8
                + to_time.is_some() as u8
                + to_position.is_some() as u8
                + (!to_offset.is_empty()) as u8;
            if let Some(c) = connector {
                let to = match (binlog, oplog) {
                    (Some(b), None) if group_args == 0 => ConnectorTo::binlog(&b)?,
                    (None, Some(o)) if group_args == 0 => ConnectorTo::oplog(&o)?,
                    _ => {
                        return Err(
                            "a connector moves to one of --binlog FILE:POS or --oplog SECONDS"
                                .into(),
                        )
                    }
                };
                blocking(Box::new(move || {
                    let (old, new) = pos::set_connector(&config, &topic, &c, &to)?;
                    Ok(format!(
                        "connector {c}: moved from {} to {}; a capture of it started now resumes \
                         there",
                        old.position(),
                        new.position()
                    ))
                }))
                .await?
            } else {
                let g = group.expect("one of them");
                if binlog.is_some() || oplog.is_some() || group_args != 1 {
                    return Err(
                        "a group moves to one of --to-end, --to-start, --to-time T, \
                         --to-position FILE:POS or --to-offset TOPIC:PARTITION=OFFSET \
                         (repeatable)"
                            .into(),
                    );
                }
                let to = if to_end {
                    GroupTo::End
                } else if to_start {
                    GroupTo::Start
                } else if let Some(t) = to_time {
                    GroupTo::Time(pos::parse_time(&t).map_err(|e| format!("--to-time: {e}"))?)
                } else if let Some(p) = to_position {
                    let (file, at) = p
                        .rsplit_once(':')
                        .and_then(|(f, a)| Some((f, a.parse::<u64>().ok()?)))
                        .ok_or_else(|| format!("--to-position {p:?}: expected FILE:POS"))?;
                    GroupTo::Version(
                        sluice_proto::mysql_version_in(generation, file, at, 0)
                            .map_err(|e| format!("--to-position {p:?}: {e}"))?,
                    )
                } else {
                    GroupTo::Offsets(
                        to_offset
                            .iter()
                            .map(|o| pos::parse_offset(o))
                            .collect::<Result<_, _>>()?,
                    )
                };
                blocking(Box::new(move || {
                    let moves = pos::set_group(&config, &g, &to)?;
                    let mut lines: Vec<String> = moves
                        .iter()
                        .map(|m| {
                            format!(
                                "{}[{}]: {} -> {}",
                                m.topic,
                                m.partition,
                                m.from.map_or("nothing".into(), |n| n.to_string()),
                                m.to
                            )
                        })
                        .collect();
                    lines.push(format!(
                        "group {g}: {} partition(s) committed; its apply stages resume there",
                        moves.len()
                    ));
                    Ok(lines.join("\n"))
                }))
                .await?
            }
        }
    };
    println!("{out}");
    Ok(true)
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    sluice_ops::brokers_from_stage_env();
    let cli = Cli::parse();
    let outcome = match cli.command {
        // (what keeps it from comparing is "not verified": 2, never 1, "different")
        Command::Verify(a) => match verify(a).await {
            Err(e) => {
                eprintln!("sluice: {e}");
                return ExitCode::from(2);
            }
            ok => ok,
        },
        other => run(other).await.map(|ok| if ok { 0 } else { 1 }),
    };
    match outcome {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            eprintln!("sluice: {e}");
            ExitCode::from(1)
        }
    }
}
