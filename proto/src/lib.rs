//! The change-event contract between the capture and apply stages.
//!
//! This crate owns three things, and nothing else:
//! - the protobuf messages (`v1`), generated at build time from `proto/sluice/v1/event.proto`;
//! - how a change is addressed in Kafka: the topic name ([`TopicTemplate`]) and the record key
//!   ([`event_key`]), so that all changes of one row land on one partition, in order;
//! - how an event's `version` is derived from a source position ([`mysql_version`],
//!   [`mongo_version`]), so that apply can make replays harmless.
//!
//! It holds no state and does no I/O; `proto/README.md` is the written contract.

use prost::Message;

pub mod v1 {
    //! Messages of contract version 1.
    include!(concat!(env!("OUT_DIR"), "/sluice.v1.rs"));
}

pub mod tags {
    //! Every field's number and wire key, written at build time from
    //! `proto/sluice/v1/event.proto` (see `build.rs`): what the hand-written encoders
    //! ([`crate::EventHeader`], [`crate::wire`] users) and readers ([`crate::view`]) name
    //! instead of numbers, so the `.proto` stays the one source of truth. A `*_KEY` is the
    //! field's key as it is written, one byte for fields 1 to 15, two from 16; `*_KEY1` is the
    //! one byte, and exists only for fields 1 to 15.
    include!(concat!(env!("OUT_DIR"), "/sluice.v1.tags.rs"));
}
pub mod view;
pub mod wire;

pub use v1::{ChangeEvent, EventKey, Op, TableSchema, Value};

/// A row event with the fields that change from row to row left open (op, version, the binlog
/// position's row, the transaction's index) and the key and images given as encoded `Row`
/// messages: worked out once per source event, then [`EventHeader::encode`]d per row. Writes
/// the bytes prost writes for the whole event.
#[derive(Debug, Clone)]
pub struct EventHeader {
    /// `contract`, `source`.
    head: Vec<u8>,
    /// `database`, `table`.
    names: Vec<u8>,
    position: PositionParts,
    /// `commit_time_micros`, `capture_time_micros`.
    times: Vec<u8>,
    /// The transaction's `id` and its `last`, around the open `index`.
    transaction: Option<(Vec<u8>, Vec<u8>)>,
    /// `schema_id`, `schema`.
    tail: Vec<u8>,
}

#[derive(Debug, Clone)]
enum PositionParts {
    None,
    /// A binlog position but its `row` (its last field).
    Binlog(Vec<u8>),
    /// Any other position, whole (field key included).
    Whole(Vec<u8>),
}

impl EventHeader {
    /// The open fields of `event` are ignored, as are its key, images, DDL and MongoDB change.
    pub fn new(event: &ChangeEvent) -> Self {
        let part = |e: ChangeEvent| e.encode_to_vec();
        let position = match &event.position {
            None => PositionParts::None,
            Some(v1::Position {
                kind: Some(v1::position::Kind::Binlog(p)),
            }) => PositionParts::Binlog(
                v1::BinlogPosition {
                    row: 0,
                    ..p.clone()
                }
                .encode_to_vec(),
            ),
            Some(p) => PositionParts::Whole(part(ChangeEvent {
                position: Some(p.clone()),
                ..Default::default()
            })),
        };
        Self {
            head: part(ChangeEvent {
                contract: event.contract,
                source: event.source.clone(),
                ..Default::default()
            }),
            names: part(ChangeEvent {
                database: event.database.clone(),
                table: event.table.clone(),
                ..Default::default()
            }),
            position,
            times: part(ChangeEvent {
                commit_time_micros: event.commit_time_micros,
                capture_time_micros: event.capture_time_micros,
                ..Default::default()
            }),
            transaction: event.transaction.as_ref().map(|t| {
                let id = v1::Transaction {
                    id: t.id.clone(),
                    ..Default::default()
                };
                let last = v1::Transaction {
                    last: t.last,
                    ..Default::default()
                };
                (id.encode_to_vec(), last.encode_to_vec())
            }),
            tail: part(ChangeEvent {
                schema_id: event.schema_id,
                schema: event.schema.clone(),
                ..Default::default()
            }),
        }
    }

    /// Append the event of one row: `key`, `before` and `after` are encoded `Row` messages.
    #[allow(clippy::too_many_arguments)]
    pub fn encode(
        &self,
        op: Op,
        version: u64,
        row: u32,
        tx_index: u64,
        key: &[u8],
        before: Option<&[u8]>,
        after: Option<&[u8]>,
        buf: &mut Vec<u8>,
    ) {
        use tags::{binlog_position as bp, change_event as ce, position, transaction as tx};
        use wire::{put_bytes, put_delimited, put_uint_field};
        buf.extend_from_slice(&self.head);
        put_uint_field(ce::OP_KEY1, op as i32 as u64, buf);
        buf.extend_from_slice(&self.names);
        put_uint_field(ce::VERSION_KEY1, version, buf);
        match &self.position {
            PositionParts::None => {}
            PositionParts::Binlog(rest) => {
                let _ = put_delimited::<()>(&ce::POSITION_KEY, buf, |buf| {
                    let _ = put_delimited::<()>(&position::BINLOG_KEY, buf, |buf| {
                        // `row` is the binlog position's last field.
                        buf.extend_from_slice(rest);
                        put_uint_field(bp::ROW_KEY1, row.into(), buf);
                        Ok(())
                    });
                    Ok(())
                });
            }
            PositionParts::Whole(p) => buf.extend_from_slice(p),
        }
        buf.extend_from_slice(&self.times);
        if let Some((id, last)) = &self.transaction {
            let _ = put_delimited::<()>(&ce::TRANSACTION_KEY, buf, |buf| {
                buf.extend_from_slice(id);
                put_uint_field(tx::INDEX_KEY1, tx_index, buf);
                buf.extend_from_slice(last);
                Ok(())
            });
        }
        buf.extend_from_slice(&self.tail);
        put_bytes(&ce::KEY_KEY, key, buf);
        if let Some(b) = before {
            put_bytes(&ce::BEFORE_KEY, b, buf);
        }
        if let Some(a) = after {
            put_bytes(&ce::AFTER_KEY, a, buf);
        }
    }
}

/// The contract version written into `ChangeEvent::contract`.
pub const CONTRACT_VERSION: u32 = 1;

/// Errors of the contract helpers. All of them are definite: retrying cannot help.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ContractError {
    #[error("topic template {template:?}: {reason}")]
    BadTemplate { template: String, reason: String },
    #[error(
        "topic name {name:?} for {database}.{table} is not a valid Kafka topic name: {reason}"
    )]
    BadTopic {
        name: String,
        database: String,
        table: String,
        reason: String,
    },
    #[error("binlog file name {0:?} has no numeric suffix (expected e.g. \"mysql-bin.000042\")")]
    BadBinlogFile(String),
    #[error("binlog position {file}:{pos} (+ row {row}) does not fit the 32-bit version layout")]
    VersionOverflow { file: String, pos: u64, row: u32 },
}

/// The placeholders a topic template may use.
const PLACEHOLDERS: [&str; 3] = ["{prefix}", "{db}", "{table}"];

/// Maps a (database, table) to its Kafka topic. The default is `{prefix}.{db}.{table}`.
///
/// Characters Kafka does not allow in topic names (anything but `[A-Za-z0-9._-]`) are replaced
/// by `_`; the result must be at most 249 characters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopicTemplate {
    template: String,
    prefix: String,
}

impl TopicTemplate {
    pub const DEFAULT: &'static str = "{prefix}.{db}.{table}";

    pub fn new(template: &str, prefix: &str) -> Result<Self, ContractError> {
        let bad = |reason: &str| ContractError::BadTemplate {
            template: template.to_string(),
            reason: reason.to_string(),
        };
        if template.is_empty() {
            return Err(bad("is empty"));
        }
        // Every `{...}` must be a known placeholder.
        let mut rest = template;
        while let Some(open) = rest.find('{') {
            let close = rest[open..]
                .find('}')
                .ok_or_else(|| bad("has a '{' without a closing '}'"))?;
            let ph = &rest[open..open + close + 1];
            if !PLACEHOLDERS.contains(&ph) {
                return Err(bad(&format!(
                    "unknown placeholder {ph}; known: {}",
                    PLACEHOLDERS.join(", ")
                )));
            }
            rest = &rest[open + close + 1..];
        }
        // A template without {table} puts several tables on one topic: allowed (the key still
        // separates rows, so the order per row holds).
        Ok(Self {
            template: template.to_string(),
            prefix: prefix.to_string(),
        })
    }

    /// The topic of `database`.`table`.
    pub fn topic(&self, database: &str, table: &str) -> Result<String, ContractError> {
        let raw = self
            .template
            .replace("{prefix}", &self.prefix)
            .replace("{db}", database)
            .replace("{table}", table);
        let name: String = raw
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '.' || c == '_' || c == '-' {
                    c
                } else {
                    '_'
                }
            })
            .collect();
        let bad = |reason: &str| ContractError::BadTopic {
            name: name.clone(),
            database: database.to_string(),
            table: table.to_string(),
            reason: reason.to_string(),
        };
        if name.is_empty() || name == "." || name == ".." {
            return Err(bad("empty, '.' or '..'"));
        }
        if name.len() > 249 {
            return Err(bad("longer than 249 characters"));
        }
        Ok(name)
    }
}

/// The Kafka record key of a change to one row: database, table and primary key values,
/// protobuf-encoded (deterministic: equal keys give equal bytes, hence equal partitions).
pub fn event_key(database: &str, table: &str, key: &[Value]) -> Vec<u8> {
    // (append_event_key relies on this being the plain protobuf encoding of the fields in order.)
    EventKey {
        database: database.to_string(),
        table: table.to_string(),
        key: key.to_vec(),
    }
    .encode_to_vec()
}

/// The part of [`event_key`] that is the same for every row of a table: encode it once, then
/// [`append_event_key`] per row.
pub fn event_key_prefix(database: &str, table: &str) -> Vec<u8> {
    event_key(database, table, &[])
}

/// `prefix` (from [`event_key_prefix`]) followed by the key values: the bytes of
/// [`event_key`], without building an `EventKey` per row.
pub fn append_event_key(prefix: &[u8], key: &[Value], out: &mut Vec<u8>) {
    out.clear();
    out.extend_from_slice(prefix);
    for v in key {
        prost::encoding::message::encode(3, v, out);
    }
}

/// The numeric suffix of a binlog file name ("mysql-bin.000042" -> 42).
pub fn binlog_file_seq(file: &str) -> Result<u64, ContractError> {
    let digits = file
        .rsplit_once('.')
        .map(|(_, d)| d)
        .filter(|d| !d.is_empty() && d.bytes().all(|b| b.is_ascii_digit()))
        .ok_or_else(|| ContractError::BadBinlogFile(file.to_string()))?;
    digits
        .parse()
        .map_err(|_| ContractError::BadBinlogFile(file.to_string()))
}

/// The version of row `row` of the rows event that starts at `pos` in binlog `file`, in
/// binlog generation 0: see [`mysql_version_in`].
pub fn mysql_version(file: &str, pos: u64, row: u32) -> Result<u64, ContractError> {
    mysql_version_in(0, file, pos, row)
}

/// The version of row `row` of the rows event that starts at `pos` in binlog `file`, in binlog
/// generation `generation`: `generation << 56 | file_seq << 32 | (pos + row)`.
///
/// Every row takes at least one byte of its rows event, so `pos + row` is below the next
/// event's start: versions grow strictly with the binlog order, within and across files.
/// Binlog offsets are 32-bit in the v4 event header, so `pos + row` fits (a file grown past
/// 4 GiB by one large transaction does not, and is refused). A server's binlog history that
/// starts over (RESET MASTER, a restored server, a fail-over to a replica with its own file
/// numbers) would make later versions lower than earlier ones; the capture is started again
/// in the next generation (`mysql.generation`), whose versions are all higher.
pub fn mysql_version_in(
    generation: u8,
    file: &str,
    pos: u64,
    row: u32,
) -> Result<u64, ContractError> {
    let seq = binlog_file_seq(file)?;
    let offset = pos + u64::from(row);
    if seq >= 1 << 24 || offset >= 1 << 32 {
        return Err(ContractError::VersionOverflow {
            file: file.to_string(),
            pos,
            row,
        });
    }
    Ok(u64::from(generation) << 56 | seq << 32 | offset)
}

/// The version of a MongoDB oplog entry: its timestamp, `seconds << 32 | increment`. Events of
/// one transaction share it and are ordered by `Transaction::index`.
pub fn mongo_version(ts_seconds: u32, ts_increment: u32) -> u64 {
    u64::from(ts_seconds) << 32 | u64::from(ts_increment)
}

/// The fingerprint of a schema: FNV-1a 64 over its protobuf encoding with `schema_id` cleared.
/// Equal schemas (same columns, types, key) give equal ids, whichever process computes them.
pub fn schema_id(schema: &TableSchema) -> u64 {
    let mut s = schema.clone();
    s.schema_id = 0;
    fnv1a(FNV_START, &s.encode_to_vec())
}

/// The offset basis of 64-bit FNV-1a: where a hash with [`fnv1a`] starts.
pub const FNV_START: u64 = 0xcbf2_9ce4_8422_2325;

/// 64-bit FNV-1a of `bytes`, continuing from `h` (start with [`FNV_START`]): hashing `a` then
/// `b` gives the hash of `a` and `b` joined.
pub fn fnv1a(mut h: u64, bytes: &[u8]) -> u64 {
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// The key of a schema record on the schema topic.
pub fn schema_record_key(schema_id: u64) -> String {
    format!("{schema_id:016x}")
}

/// Short constructors for values, used by capture and by tests.
pub mod value {
    use super::v1::{value::Kind, Value};

    pub fn null() -> Value {
        Value {
            kind: Some(Kind::Null(true)),
        }
    }
    pub fn of(kind: Kind) -> Value {
        Value { kind: Some(kind) }
    }
    pub fn int(v: i64) -> Value {
        of(Kind::Int(v))
    }
    pub fn uint(v: u64) -> Value {
        of(Kind::Uint(v))
    }
    pub fn text(v: impl Into<String>) -> Value {
        of(Kind::Text(v.into()))
    }
    pub fn bytes(v: impl Into<Vec<u8>>) -> Value {
        of(Kind::Bytes(v.into()))
    }
    pub fn decimal(v: impl Into<String>) -> Value {
        of(Kind::Decimal(v.into()))
    }
    /// True for SQL NULL.
    pub fn is_null(v: &Value) -> bool {
        matches!(v.kind, Some(Kind::Null(_)))
    }
}

#[cfg(test)]
mod tests;
