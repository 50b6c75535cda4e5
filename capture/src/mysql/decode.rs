//! Row images of binlog rows events, decoded straight from their bytes into the contract's
//! encoded values: each image becomes the bytes of a `Row` message without a `Value` being built
//! (an [`Image`]), and the event and its Kafka key are put together from those bytes.
//!
//! mysql_common decodes rows into its own `Value`, losing what the contract must keep: the
//! zero YEAR becomes 1900, negative TIME(1)/TIME(2) come out wrong, TIMESTAMP and DECIMAL arrive
//! as text, signedness is unknown without `binlog_row_metadata=FULL`. So the capture reads the
//! row bytes itself, with the storage formats of MySQL's `Field_*::pack` / `my_*_from_binary`,
//! using the table map for storage metadata and the table's [`TableSchema`] for what the binlog
//! does not say (signedness, charset, ENUM/SET members, BINARY padding).
//!
//! A [`TableDecoder`] is built once per table map (table id + schema) and decodes every row of
//! the events that follow it.

use std::ops::Range;

use mysql_async::binlog::events::{RowsEventData, TableMapEvent};
use mysql_async::consts::ColumnType as My;
use prost::Message;
use sluice_proto::v1::{self, value::Kind, Column, ColumnType, TableSchema};
use sluice_proto::wire::{
    self, key as k, patch_len, put_bytes, put_int32_field, put_uint_field, put_varint, zigzag,
    FIXED32, FIXED64, LEN, VARINT,
};

use super::charset;

/// Why a row could not be decoded. Always definite: the same bytes fail the same way.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum DecodeError {
    #[error(
        "{table}: the binlog has {binlog} columns, the schema {schema}: the schema changed \
         without a DDL the capture saw"
    )]
    ColumnCount {
        table: String,
        binlog: usize,
        schema: usize,
    },
    #[error("{table}.{column}: binlog column type {ty} is not supported")]
    Unsupported {
        table: String,
        column: String,
        ty: u8,
    },
    #[error("{table}.{column}: row data ends early (needs {needed} more bytes)")]
    Truncated {
        table: String,
        column: String,
        needed: usize,
    },
    #[error("{table}.{column}: {reason}")]
    Bad {
        table: String,
        column: String,
        reason: String,
    },
}

/// How one column's bytes are laid out and what they become.
#[derive(Debug, Clone)]
enum Layout {
    Int {
        bytes: usize,
        unsigned: bool,
    },
    Year,
    Float,
    Double,
    Decimal {
        precision: usize,
        scale: usize,
    },
    Bit {
        bytes: usize,
    },
    Enum {
        bytes: usize,
    },
    Set {
        bytes: usize,
    },
    Date,
    /// The pre-5.6 formats.
    OldTime,
    OldDatetime,
    OldTimestamp,
    Time2 {
        fsp: u8,
    },
    Datetime2 {
        fsp: u8,
    },
    Timestamp2 {
        fsp: u8,
    },
    /// CHAR/BINARY (fixed): length prefix of 1 or 2 bytes; BINARY is re-padded with NULs.
    Fixed {
        prefix: usize,
        pad_to: Option<usize>,
    },
    /// VARCHAR/VARBINARY: length prefix of 1 or 2 bytes.
    Var {
        prefix: usize,
    },
    /// BLOB/TEXT/GEOMETRY/JSON: length prefix of 1..4 bytes.
    Blob {
        prefix: usize,
    },
    /// MySQL's binary JSON: length prefix of 1..4 bytes.
    BinaryJson {
        prefix: usize,
    },
}

/// What the bytes of a string column become.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Text {
    /// Binary strings: `bytes`.
    Bytes,
    /// UTF-8 (or ASCII) text: validated, kept as it is.
    Utf8,
    /// Text in another charset: converted to UTF-8 (`charset::to_text`).
    Other,
}

#[derive(Debug, Clone)]
struct ColumnDecoder {
    name: String,
    layout: Layout,
    /// What the bytes of string-like layouts become.
    target: ColumnType,
    text: Text,
    charset: String,
    members: Vec<String>,
}

/// Decodes the rows of one table, as described by one table map and one schema.
#[derive(Debug, Clone)]
pub struct TableDecoder {
    table: String,
    columns: Vec<ColumnDecoder>,
}

/// One row change: the before image (update, delete) and the after image (insert, update).
pub type RowChange = (Option<v1::Row>, Option<v1::Row>);

/// One row image, encoded: the bytes of a `Row` message (every column one `values` entry) and
/// where each column's `Value` message lies in them. Reused from row to row.
#[derive(Debug, Default)]
pub struct Image {
    bytes: Vec<u8>,
    values: Vec<Range<usize>>,
}

impl Image {
    /// The `Row` message.
    pub fn bytes(&self) -> &[u8] {
        &self.bytes
    }

    /// The `Value` message of column `i` (empty when the image does not hold the column).
    pub fn value(&self, i: usize) -> &[u8] {
        &self.bytes[self.values[i].clone()]
    }

    /// The `Row` message of the `key` columns' values, into `out` (cleared first).
    pub fn key_row(&self, key: &[u32], out: &mut Vec<u8>) {
        out.clear();
        for &i in key {
            put_bytes(&[k(1, LEN)], self.value(i as usize), out);
        }
    }

    /// The Kafka record key of this image: `prefix` (from `sluice_proto::event_key_prefix`)
    /// then the `key` columns' values, the bytes of `sluice_proto::append_event_key`.
    pub fn event_key(&self, prefix: &[u8], key: &[u32], out: &mut Vec<u8>) {
        out.clear();
        out.extend_from_slice(prefix);
        for &i in key {
            put_bytes(&[k(3, LEN)], self.value(i as usize), out);
        }
    }

    /// Whether the `key` columns hold the same values here and in `other`.
    pub fn same_key(&self, other: &Image, key: &[u32]) -> bool {
        key.iter()
            .all(|&i| self.value(i as usize) == other.value(i as usize))
    }

    /// The image as a message.
    pub fn to_row(&self) -> v1::Row {
        v1::Row::decode(self.bytes.as_slice())
            .expect("an image holds only valid UTF-8 where the contract has strings")
    }

    fn clear(&mut self) {
        self.bytes.clear();
        self.values.clear();
    }
}

/// The rows of one rows event, decoded one at a time ([`Rows::next_into`]).
pub struct Rows<'a> {
    decoder: &'a TableDecoder,
    data: &'a [u8],
    before: Option<Vec<bool>>,
    after: Option<Vec<bool>>,
}

impl Rows<'_> {
    /// Decode the next row change into `before` and `after`: which of the two images it has,
    /// or `None` after the last row.
    pub fn next_into(
        &mut self,
        before: &mut Image,
        after: &mut Image,
    ) -> Result<Option<(bool, bool)>, DecodeError> {
        if self.data.is_empty() {
            return Ok(None);
        }
        if let Some(present) = &self.before {
            self.decoder.decode_image(&mut self.data, present, before)?;
        }
        if let Some(present) = &self.after {
            self.decoder.decode_image(&mut self.data, present, after)?;
        }
        Ok(Some((self.before.is_some(), self.after.is_some())))
    }
}

impl TableDecoder {
    pub fn new(tme: &TableMapEvent<'_>, schema: &TableSchema) -> Result<Self, DecodeError> {
        let table = format!("{}.{}", schema.database, schema.table);
        let n = tme.columns_count() as usize;
        if n != schema.columns.len() {
            return Err(DecodeError::ColumnCount {
                table,
                binlog: n,
                schema: schema.columns.len(),
            });
        }
        let mut columns = Vec::with_capacity(n);
        for (i, col) in schema.columns.iter().enumerate() {
            let raw = tme.get_raw_column_type(i).ok().flatten();
            let meta = tme.get_column_metadata(i).unwrap_or(&[]);
            let unsupported = |ty: u8| DecodeError::Unsupported {
                table: table.clone(),
                column: col.name.clone(),
                ty,
            };
            let raw = raw.ok_or_else(|| unsupported(0))?;
            let layout = layout(raw, meta, col).ok_or_else(|| unsupported(raw as u8))?;
            if !compatible(&layout, col.r#type()) {
                return Err(DecodeError::Bad {
                    table: table.clone(),
                    column: col.name.clone(),
                    reason: format!(
                        "the binlog stores it as {layout:?}, the schema says {:?} ({}): the \
                         table changed after these rows were written. With \
                         binlog_row_metadata=FULL the binlog carries its own column metadata",
                        col.r#type(),
                        col.sql_type
                    ),
                });
            }
            let text = match col.r#type() {
                ColumnType::Binary | ColumnType::Varbinary | ColumnType::Blob => Text::Bytes,
                _ if col.charset == "binary" => Text::Bytes,
                _ if charset::is_utf8(&col.charset) => Text::Utf8,
                _ => Text::Other,
            };
            columns.push(ColumnDecoder {
                name: col.name.clone(),
                layout,
                target: col.r#type(),
                text,
                charset: col.charset.clone(),
                members: col.members.clone(),
            });
        }
        Ok(Self { table, columns })
    }

    /// The rows of a rows event, to be decoded one by one.
    pub fn rows<'a>(&'a self, ev: &'a RowsEventData<'_>) -> Rows<'a> {
        Rows {
            decoder: self,
            data: ev.rows_data(),
            before: ev
                .columns_before_image()
                .map(|b| b.iter().by_vals().collect()),
            after: ev
                .columns_after_image()
                .map(|b| b.iter().by_vals().collect()),
        }
    }

    /// Decode every row of a rows event into messages.
    pub fn decode_event(&self, ev: &RowsEventData<'_>) -> Result<Vec<RowChange>, DecodeError> {
        let mut rows = self.rows(ev);
        let (mut before, mut after) = (Image::default(), Image::default());
        let mut changes = Vec::new();
        while let Some((b, a)) = rows.next_into(&mut before, &mut after)? {
            changes.push((b.then(|| before.to_row()), a.then(|| after.to_row())));
        }
        Ok(changes)
    }

    /// Decode one image: `present` says which columns it holds (the event's column bitmap).
    fn decode_image(
        &self,
        data: &mut &[u8],
        present: &[bool],
        image: &mut Image,
    ) -> Result<(), DecodeError> {
        image.clear();
        let n_present = present.iter().filter(|p| **p).count();
        let bitmap = take(data, n_present.div_ceil(8)).ok_or_else(|| DecodeError::Truncated {
            table: self.table.clone(),
            column: "(null bitmap)".into(),
            needed: n_present.div_ceil(8),
        })?;
        let out = &mut image.bytes;
        let mut k = 0; // index among present columns
        for (i, col) in self.columns.iter().enumerate() {
            // Each column is one `values` entry (field 1) holding a `Value` message.
            out.extend_from_slice(&[wire::key(1, LEN), 0]);
            let start = out.len();
            if !present.get(i).copied().unwrap_or(false) {
                // An empty `Value`: the image does not hold the column.
                image.values.push(start..start);
                continue;
            }
            let is_null = bitmap[k / 8] & (1 << (k % 8)) != 0;
            k += 1;
            if is_null {
                out.extend_from_slice(&[wire::key(1, VARINT), 1]); // null = true
            } else {
                col.encode(data, out).map_err(|e| match e {
                    Short(needed) => DecodeError::Truncated {
                        table: self.table.clone(),
                        column: col.name.clone(),
                        needed,
                    },
                    Invalid(reason) => DecodeError::Bad {
                        table: self.table.clone(),
                        column: col.name.clone(),
                        reason,
                    },
                })?;
            }
            image.values.push(patch_len(out, start));
        }
        Ok(())
    }
}

/// The layout of a column from its binlog type and metadata, and its schema.
fn layout(raw: My, meta: &[u8], col: &Column) -> Option<Layout> {
    let m = |i: usize| meta.get(i).copied().unwrap_or(0);
    Some(match raw {
        My::MYSQL_TYPE_TINY => Layout::Int {
            bytes: 1,
            unsigned: col.unsigned,
        },
        My::MYSQL_TYPE_SHORT => Layout::Int {
            bytes: 2,
            unsigned: col.unsigned,
        },
        My::MYSQL_TYPE_INT24 => Layout::Int {
            bytes: 3,
            unsigned: col.unsigned,
        },
        My::MYSQL_TYPE_LONG => Layout::Int {
            bytes: 4,
            unsigned: col.unsigned,
        },
        My::MYSQL_TYPE_LONGLONG => Layout::Int {
            bytes: 8,
            unsigned: col.unsigned,
        },
        My::MYSQL_TYPE_YEAR => Layout::Year,
        My::MYSQL_TYPE_FLOAT => Layout::Float,
        My::MYSQL_TYPE_DOUBLE => Layout::Double,
        My::MYSQL_TYPE_NEWDECIMAL => Layout::Decimal {
            precision: m(0) as usize,
            scale: m(1) as usize,
        },
        My::MYSQL_TYPE_BIT => Layout::Bit {
            bytes: (m(1) as usize * 8 + m(0) as usize).div_ceil(8),
        },
        My::MYSQL_TYPE_DATE | My::MYSQL_TYPE_NEWDATE => Layout::Date,
        My::MYSQL_TYPE_TIME => Layout::OldTime,
        My::MYSQL_TYPE_DATETIME => Layout::OldDatetime,
        My::MYSQL_TYPE_TIMESTAMP => Layout::OldTimestamp,
        My::MYSQL_TYPE_TIME2 => Layout::Time2 { fsp: m(0) },
        My::MYSQL_TYPE_DATETIME2 => Layout::Datetime2 { fsp: m(0) },
        My::MYSQL_TYPE_TIMESTAMP2 => Layout::Timestamp2 { fsp: m(0) },
        My::MYSQL_TYPE_VARCHAR | My::MYSQL_TYPE_VAR_STRING => {
            let max = u16::from_le_bytes([m(0), m(1)]) as usize;
            Layout::Var {
                prefix: if max < 256 { 1 } else { 2 },
            }
        }
        My::MYSQL_TYPE_STRING | My::MYSQL_TYPE_ENUM | My::MYSQL_TYPE_SET => {
            // Metadata: real type and the high bits of the maximum length folded together.
            let (b0, b1) = (m(0), m(1));
            let (real, max) = if b0 & 0x30 != 0x30 {
                (
                    b0 | 0x30,
                    b1 as usize | ((((b0 & 0x30) ^ 0x30) as usize) << 4),
                )
            } else {
                (b0, b1 as usize)
            };
            match real {
                0xf7 => Layout::Enum { bytes: b1 as usize },
                0xf8 => Layout::Set { bytes: b1 as usize },
                _ => Layout::Fixed {
                    prefix: if max < 256 { 1 } else { 2 },
                    pad_to: (col.r#type() == ColumnType::Binary).then_some(col.length as usize),
                },
            }
        }
        My::MYSQL_TYPE_BLOB
        | My::MYSQL_TYPE_TINY_BLOB
        | My::MYSQL_TYPE_MEDIUM_BLOB
        | My::MYSQL_TYPE_LONG_BLOB
        | My::MYSQL_TYPE_GEOMETRY => Layout::Blob {
            prefix: m(0) as usize,
        },
        My::MYSQL_TYPE_JSON => Layout::BinaryJson {
            prefix: m(0) as usize,
        },
        _ => return None,
    })
}

/// Whether a binlog storage layout can be a column of schema type `ty`: a guard against
/// decoding rows with a schema of another time.
fn compatible(layout: &Layout, ty: ColumnType) -> bool {
    use ColumnType as T;
    match layout {
        Layout::Int { bytes: 1, .. } => ty == T::Tinyint,
        Layout::Int { bytes: 2, .. } => ty == T::Smallint,
        Layout::Int { bytes: 3, .. } => ty == T::Mediumint,
        Layout::Int { bytes: 4, .. } => ty == T::Int,
        Layout::Int { .. } => ty == T::Bigint,
        Layout::Year => ty == T::Year,
        Layout::Float => ty == T::Float,
        Layout::Double => ty == T::Double,
        Layout::Decimal { .. } => ty == T::Decimal,
        Layout::Bit { .. } => ty == T::Bit,
        Layout::Enum { .. } => ty == T::Enum,
        Layout::Set { .. } => ty == T::Set,
        Layout::Date => ty == T::Date,
        Layout::OldTime | Layout::Time2 { .. } => ty == T::Time,
        Layout::OldDatetime | Layout::Datetime2 { .. } => ty == T::Datetime,
        Layout::OldTimestamp | Layout::Timestamp2 { .. } => ty == T::Timestamp,
        Layout::Fixed { .. } => matches!(ty, T::Char | T::Binary),
        Layout::Var { .. } => matches!(ty, T::Varchar | T::Varbinary),
        Layout::Blob { .. } => matches!(ty, T::Text | T::Blob | T::Json | T::Geometry),
        Layout::BinaryJson { .. } => ty == T::Json,
    }
}

/// Failure inside one column: too few bytes, or bytes that mean nothing.
enum ColumnError {
    Short(usize),
    Invalid(String),
}
use ColumnError::{Invalid, Short};

fn take<'a>(data: &mut &'a [u8], n: usize) -> Option<&'a [u8]> {
    if data.len() < n {
        return None;
    }
    let (head, tail) = data.split_at(n);
    *data = tail;
    Some(head)
}

fn take_ref<'a>(data: &mut &'a [u8], n: usize) -> Result<&'a [u8], ColumnError> {
    let have = data.len();
    take(data, n).ok_or(Short(n.saturating_sub(have)))
}

fn le(bytes: &[u8]) -> u64 {
    bytes
        .iter()
        .rev()
        .fold(0u64, |acc, b| (acc << 8) | u64::from(*b))
}

fn be(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0u64, |acc, b| (acc << 8) | u64::from(*b))
}

/// Sign-extend the low `bytes` bytes of `v`.
fn sign_extend(v: u64, bytes: usize) -> i64 {
    let shift = 64 - 8 * bytes as u32;
    ((v << shift) as i64) >> shift
}

/// Fractional-second storage bytes for a precision.
fn frac_bytes(fsp: u8) -> usize {
    (fsp as usize).div_ceil(2)
}

// A `Value`'s `kind` members, as one-byte field keys.
const INT: u8 = k(2, VARINT);
const UINT: u8 = k(3, VARINT);
const FLOAT32: u8 = k(4, FIXED32);
const FLOAT64: u8 = k(5, FIXED64);
const DECIMAL: u8 = k(6, LEN);
const TEXT: u8 = k(7, LEN);
const BYTES: u8 = k(8, LEN);
const BITS: u8 = k(9, VARINT);
const ENUM: u8 = k(10, LEN);
const SET: u8 = k(11, LEN);
const DATE: u8 = k(12, LEN);
const TIME: u8 = k(13, VARINT);
const DATETIME: u8 = k(14, LEN);
const TIMESTAMP: u8 = k(15, VARINT);
/// Field 17 (`json`) takes two key bytes.
const JSON: [u8; 2] = [(17 << 3 | LEN) | 0x80, (17 << 3) >> 7];

impl ColumnDecoder {
    /// Read one non-NULL value off `data` and append its `Value` message (the `kind` field) to
    /// `out`.
    fn encode(&self, data: &mut &[u8], out: &mut Vec<u8>) -> Result<(), ColumnError> {
        match &self.layout {
            Layout::Int { bytes, unsigned } => {
                let v = le(take_ref(data, *bytes)?);
                if *unsigned {
                    out.push(UINT);
                    put_varint(v, out);
                } else {
                    out.push(INT);
                    put_varint(zigzag(sign_extend(v, *bytes)), out);
                }
            }
            Layout::Year => {
                let v = take_ref(data, 1)?[0];
                out.push(INT);
                put_varint(zigzag(if v == 0 { 0 } else { 1900 + i64::from(v) }), out);
            }
            // Both are stored little-endian IEEE 754, as protobuf's fixed32/fixed64.
            Layout::Float => {
                out.push(FLOAT32);
                out.extend_from_slice(take_ref(data, 4)?);
            }
            Layout::Double => {
                out.push(FLOAT64);
                out.extend_from_slice(take_ref(data, 8)?);
            }
            Layout::Decimal { precision, scale } => {
                delimited(DECIMAL, out, |out| decimal(data, *precision, *scale, out))?;
            }
            Layout::Bit { bytes } => {
                out.push(BITS);
                put_varint(be(take_ref(data, *bytes)?), out);
            }
            Layout::Enum { bytes } => {
                let index = le(take_ref(data, *bytes)?) as u32;
                let label = match index {
                    0 => "",
                    i => self.members.get(i as usize - 1).ok_or_else(|| {
                        Invalid(format!(
                            "ENUM index {i} but the schema has {} members",
                            self.members.len()
                        ))
                    })?,
                };
                delimited(ENUM, out, |out| {
                    put_uint_field(k(1, VARINT), index.into(), out);
                    if !label.is_empty() {
                        put_bytes(&[k(2, LEN)], label.as_bytes(), out);
                    }
                    Ok(())
                })?;
            }
            Layout::Set { bytes } => {
                let bits = le(take_ref(data, *bytes)?);
                delimited(SET, out, |out| {
                    put_uint_field(k(1, VARINT), bits, out);
                    for i in (0..64).filter(|i| bits & (1u64 << i) != 0) {
                        let member = self.members.get(i).ok_or_else(|| {
                            Invalid(format!(
                                "SET bit {i} but the schema has {} members",
                                self.members.len()
                            ))
                        })?;
                        put_bytes(&[k(2, LEN)], member.as_bytes(), out);
                    }
                    Ok(())
                })?;
            }
            Layout::Date => {
                let v = le(take_ref(data, 3)?);
                delimited(DATE, out, |out| {
                    put_int32_field(k(1, VARINT), (v >> 9) as i32, out);
                    put_uint_field(k(2, VARINT), (v >> 5) & 15, out);
                    put_uint_field(k(3, VARINT), v & 31, out);
                    Ok(())
                })?;
            }
            Layout::OldTime => {
                let v = sign_extend(le(take_ref(data, 3)?), 3);
                let (neg, v) = (v < 0, v.unsigned_abs() as i64);
                let secs = (v / 10000) * 3600 + (v / 100 % 100) * 60 + v % 100;
                let micros = secs * 1_000_000;
                out.push(TIME);
                put_varint(zigzag(if neg { -micros } else { micros }), out);
            }
            Layout::OldDatetime => {
                let v = le(take_ref(data, 8)?);
                let (d, t) = (v / 1_000_000, v % 1_000_000);
                put_datetime(
                    &v1::DateTime {
                        year: (d / 10000) as i32,
                        month: (d / 100 % 100) as u32,
                        day: (d % 100) as u32,
                        hour: (t / 10000) as u32,
                        minute: (t / 100 % 100) as u32,
                        second: (t % 100) as u32,
                        micros: 0,
                    },
                    out,
                );
            }
            Layout::OldTimestamp => {
                out.push(TIMESTAMP);
                put_varint(zigzag(le(take_ref(data, 4)?) as i64 * 1_000_000), out);
            }
            Layout::Time2 { fsp } => {
                let micros = time2(data, *fsp)?;
                out.push(TIME);
                put_varint(zigzag(micros), out);
            }
            Layout::Datetime2 { fsp } => put_datetime(&datetime2(data, *fsp)?, out),
            Layout::Timestamp2 { fsp } => {
                let secs = be(take_ref(data, 4)?) as i64;
                let frac = frac_be(data, *fsp)?;
                out.push(TIMESTAMP);
                put_varint(zigzag(secs * 1_000_000 + frac), out);
            }
            Layout::Fixed { prefix, pad_to } => {
                let len = le(take_ref(data, *prefix)?) as usize;
                let bytes = take_ref(data, len)?;
                match pad_to {
                    // BINARY(n) is stored without its trailing NULs.
                    Some(n) if bytes.len() < *n => {
                        out.push(BYTES);
                        put_varint(*n as u64, out);
                        out.extend_from_slice(bytes);
                        out.resize(out.len() + (n - bytes.len()), 0);
                    }
                    _ => self.string(bytes, out),
                }
            }
            Layout::Var { prefix } => {
                let len = le(take_ref(data, *prefix)?) as usize;
                self.string(take_ref(data, len)?, out);
            }
            Layout::BinaryJson { prefix } => {
                let len = le(take_ref(data, *prefix)?) as usize;
                put_bytes(&JSON, json_text(take_ref(data, len)?)?.as_bytes(), out);
            }
            Layout::Blob { prefix } => {
                let len = le(take_ref(data, *prefix)?) as usize;
                let bytes = take_ref(data, len)?;
                match self.target {
                    // MariaDB: the JSON text as stored.
                    ColumnType::Json => match std::str::from_utf8(bytes) {
                        Ok(_) => put_bytes(&JSON, bytes, out),
                        Err(_) => charset::to_text(bytes.to_vec(), &self.charset).encode(out),
                    },
                    ColumnType::Geometry => {
                        if bytes.len() < 4 {
                            return Err(Invalid(format!(
                                "GEOMETRY value of {} bytes has no SRID",
                                bytes.len()
                            )));
                        }
                        Kind::Geometry(v1::Geometry {
                            srid: le(&bytes[..4]) as u32,
                            wkb: bytes[4..].to_vec(),
                        })
                        .encode(out)
                    }
                    _ => self.string(bytes, out),
                }
            }
        }
        Ok(())
    }

    /// Bytes of a string column: text in its charset, or bytes for binary strings.
    fn string(&self, bytes: &[u8], out: &mut Vec<u8>) {
        match self.text {
            Text::Bytes => put_bytes(&[BYTES], bytes, out),
            Text::Utf8 if std::str::from_utf8(bytes).is_ok() => put_bytes(&[TEXT], bytes, out),
            // Not valid in its charset, or another charset: `to_text` keeps what it cannot
            // convert as raw text.
            _ => charset::to_text(bytes.to_vec(), &self.charset).encode(out),
        }
    }
}

/// A `kind` member that is a message (`key` one byte), its body written by `body`.
fn delimited(
    key: u8,
    out: &mut Vec<u8>,
    body: impl FnOnce(&mut Vec<u8>) -> Result<(), ColumnError>,
) -> Result<(), ColumnError> {
    wire::put_delimited(&[key], out, body).map(|_| ())
}

/// A `DateTime` message as the `datetime` member.
fn put_datetime(dt: &v1::DateTime, out: &mut Vec<u8>) {
    let _ = delimited(DATETIME, out, |out| {
        put_int32_field(k(1, VARINT), dt.year, out);
        for (tag, v) in [
            (2, dt.month),
            (3, dt.day),
            (4, dt.hour),
            (5, dt.minute),
            (6, dt.second),
            (7, dt.micros),
        ] {
            put_uint_field(k(tag, VARINT), v.into(), out);
        }
        Ok(())
    });
}

/// Fractional seconds stored big-endian in `frac_bytes(fsp)` bytes, as microseconds.
fn frac_be(data: &mut &[u8], fsp: u8) -> Result<i64, ColumnError> {
    let n = frac_bytes(fsp);
    let v = be(take_ref(data, n)?) as i64;
    Ok(match n {
        0 => 0,
        1 => v * 10_000,
        2 => v * 100,
        _ => v,
    })
}

/// TIME(fsp) in MySQL 5.6+ format: signed microseconds.
fn time2(data: &mut &[u8], fsp: u8) -> Result<i64, ColumnError> {
    const INT_OFS: i64 = 0x80_0000;
    // The packed value: (hms << 24) + microseconds, signed.
    let packed: i64 = match frac_bytes(fsp) {
        0 => (be(take_ref(data, 3)?) as i64 - INT_OFS) << 24,
        1 => {
            let mut int = be(take_ref(data, 3)?) as i64 - INT_OFS;
            let mut frac = i64::from(take_ref(data, 1)?[0]);
            if int < 0 && frac != 0 {
                int += 1;
                frac -= 0x100;
            }
            (int << 24) + frac * 10_000
        }
        2 => {
            let mut int = be(take_ref(data, 3)?) as i64 - INT_OFS;
            let mut frac = be(take_ref(data, 2)?) as i64;
            if int < 0 && frac != 0 {
                int += 1;
                frac -= 0x10000;
            }
            (int << 24) + frac * 100
        }
        _ => be(take_ref(data, 6)?) as i64 - 0x8000_0000_0000,
    };
    let neg = packed < 0;
    let p = packed.abs();
    let hms = p >> 24;
    let micros = p % (1 << 24);
    let hour = (hms >> 12) % (1 << 10);
    let minute = (hms >> 6) % (1 << 6);
    let second = hms % (1 << 6);
    let total = ((hour * 60 + minute) * 60 + second) * 1_000_000 + micros;
    Ok(if neg { -total } else { total })
}

/// DATETIME(fsp) in MySQL 5.6+ format.
fn datetime2(data: &mut &[u8], fsp: u8) -> Result<v1::DateTime, ColumnError> {
    let int = be(take_ref(data, 5)?) as i64 - 0x80_0000_0000;
    let frac = frac_be(data, fsp)?;
    let ymdhms = int;
    let ymd = ymdhms >> 17;
    let ym = ymd >> 5;
    let hms = ymdhms % (1 << 17);
    Ok(v1::DateTime {
        year: (ym / 13) as i32,
        month: (ym % 13) as u32,
        day: (ymd % (1 << 5)) as u32,
        hour: (hms >> 12) as u32,
        minute: ((hms >> 6) % (1 << 6)) as u32,
        second: (hms % (1 << 6)) as u32,
        micros: frac as u32,
    })
}

/// DECIMAL(precision, scale) in MySQL's binary format, appended to `out` as exact text.
fn decimal(
    data: &mut &[u8],
    precision: usize,
    scale: usize,
    out: &mut Vec<u8>,
) -> Result<(), ColumnError> {
    const DIG2BYTES: [usize; 10] = [0, 1, 1, 2, 2, 3, 3, 4, 4, 4];
    if precision == 0 || scale > precision || precision > 65 {
        return Err(Invalid(format!("DECIMAL({precision},{scale}) metadata")));
    }
    let intg = precision - scale;
    let (intg0, intg0x) = (intg / 9, intg % 9);
    let (frac0, frac0x) = (scale / 9, scale % 9);
    let size = intg0 * 4 + DIG2BYTES[intg0x] + frac0 * 4 + DIG2BYTES[frac0x];
    // At most 65 digits: 40 bytes is more than enough.
    let mut b = [0u8; 40];
    let b = &mut b[..size];
    b.copy_from_slice(take_ref(data, size)?);
    let negative = b[0] & 0x80 == 0;
    b[0] ^= 0x80;
    if negative {
        for x in b.iter_mut() {
            *x = !*x;
        }
    }
    // Digits, each group of `width` digits zero-padded, into `digits`.
    let mut pos = 0;
    let mut group = |width: usize, digits: &mut Digits| -> Result<(), ColumnError> {
        let n = DIG2BYTES[width];
        let mut v = be(&b[pos..pos + n]);
        pos += n;
        if v >= 10u64.pow(width as u32) {
            return Err(Invalid(format!(
                "DECIMAL({precision},{scale}): a {width}-digit group holds {v}"
            )));
        }
        for i in (0..width).rev() {
            digits.buf[digits.len + i] = b'0' + (v % 10) as u8;
            v /= 10;
        }
        digits.len += width;
        Ok(())
    };
    let mut int = Digits::default();
    if intg0x > 0 {
        group(intg0x, &mut int)?;
    }
    for _ in 0..intg0 {
        group(9, &mut int)?;
    }
    let mut frac = Digits::default();
    for _ in 0..frac0 {
        group(9, &mut frac)?;
    }
    if frac0x > 0 {
        group(frac0x, &mut frac)?;
    }
    let int = int.as_slice();
    let int = match int.iter().position(|&d| d != b'0') {
        Some(first) => &int[first..],
        None => b"0",
    };
    let frac = frac.as_slice();
    let zero = int == b"0" && frac.iter().all(|&d| d == b'0');
    if negative && !zero {
        out.push(b'-');
    }
    out.extend_from_slice(int);
    if scale > 0 {
        out.push(b'.');
        out.extend_from_slice(frac);
    }
    Ok(())
}

/// Up to 65 decimal digits, on the stack.
struct Digits {
    buf: [u8; 72],
    len: usize,
}

impl Default for Digits {
    fn default() -> Self {
        Self {
            buf: [0; 72],
            len: 0,
        }
    }
}

impl Digits {
    fn as_slice(&self) -> &[u8] {
        &self.buf[..self.len]
    }
}

/// MySQL's binary JSON as JSON text. (MariaDB stores JSON as LONGTEXT and never sends this.)
fn json_text(bytes: &[u8]) -> Result<String, ColumnError> {
    use mysql_common::binlog::jsonb;
    use mysql_common::io::ParseBuf;
    if bytes.is_empty() {
        return Ok("null".into());
    }
    let value: jsonb::Value<'_> = ParseBuf(bytes)
        .parse(())
        .map_err(|e| Invalid(format!("binary JSON: {e}")))?;
    let json =
        serde_json::Value::try_from(value).map_err(|e| Invalid(format!("binary JSON: {e}")))?;
    Ok(json.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_images_key_is_the_keys_of_its_row() {
        // An image of three columns, the key being the third and the first (a long text, so
        // that its length prefix widens).
        let row = v1::Row {
            values: vec![
                sluice_proto::value::text("k".repeat(200)),
                sluice_proto::value::null(),
                sluice_proto::value::of(Kind::Int(-5)),
            ],
        };
        let mut image = Image {
            bytes: row.encode_to_vec(),
            values: Vec::new(),
        };
        // Where each value lies, read back from the bytes.
        let mut at = 0;
        while at < image.bytes.len() {
            let (len, n) = {
                let mut b = &image.bytes[at + 1..];
                let before = b.len();
                let len = prost::encoding::decode_varint(&mut b).unwrap() as usize;
                (len, before - b.len())
            };
            let start = at + 1 + n;
            image.values.push(start..start + len);
            at = start + len;
        }
        assert_eq!(image.to_row(), row);
        let key = [2u32, 0];
        let key_values = vec![row.values[2].clone(), row.values[0].clone()];
        let mut got = Vec::new();
        image.key_row(&key, &mut got);
        assert_eq!(
            got,
            v1::Row {
                values: key_values.clone()
            }
            .encode_to_vec()
        );
        let prefix = sluice_proto::event_key_prefix("db", "t");
        let (mut ours, mut theirs) = (Vec::new(), Vec::new());
        image.event_key(&prefix, &key, &mut ours);
        sluice_proto::append_event_key(&prefix, &key_values, &mut theirs);
        assert_eq!(ours, theirs);
        assert!(image.same_key(&image, &key));
        let mut other = Image {
            bytes: image.bytes.clone(),
            values: image.values.clone(),
        };
        let last = other.values[2].end - 1;
        other.bytes[last] ^= 1; // -5 becomes another number
        assert!(!image.same_key(&other, &key));
        assert!(image.same_key(&other, &[0]));
    }

    fn dec(bytes: &[u8], p: usize, s: usize) -> String {
        let mut d = bytes;
        let mut out = Vec::new();
        match decimal(&mut d, p, s, &mut out) {
            Ok(()) => {
                assert!(d.is_empty(), "bytes left over");
                String::from_utf8(out).expect("ASCII")
            }
            Err(_) => panic!("decode failed"),
        }
    }

    #[test]
    fn decimals_from_mysql_docs() {
        // The example of MySQL's decimal2bin documentation: 1234567890.1234 as DECIMAL(14,4).
        assert_eq!(
            dec(&[0x81, 0x0D, 0xFB, 0x38, 0xD2, 0x04, 0xD2], 14, 4),
            "1234567890.1234"
        );
        // And its negative: every byte inverted.
        assert_eq!(
            dec(&[0x7E, 0xF2, 0x04, 0xC7, 0x2D, 0xFB, 0x2D], 14, 4),
            "-1234567890.1234"
        );
        // Zero with a scale: "0.00", never "-0.00".
        assert_eq!(dec(&[0x80, 0x00], 3, 2), "0.00");
        // A nine-digit group holding 1 000 000 000 is not a decimal: refused, not misprinted.
        let mut d: &[u8] = &[0x80 | 0x3b, 0x9a, 0xca, 0x00];
        assert!(matches!(
            decimal(&mut d, 9, 0, &mut Vec::new()),
            Err(Invalid(_))
        ));
    }

    #[test]
    fn time2_negative_fractions() {
        // -00:00:01.5 as TIME(1), as MySQL's my_time_packed_to_binary writes it: the int part
        // floors to -2, the fraction byte is (char)-50; reading borrows one second back.
        let packed_int = (0x80_0000i64 - 2) as u64;
        let b = [
            (packed_int >> 16) as u8,
            (packed_int >> 8) as u8,
            packed_int as u8,
            (0x100 - 50) as u8,
        ];
        let mut d = &b[..];
        assert_eq!(time2(&mut d, 1).ok(), Some(-1_500_000));
        // 00:00:00 exactly.
        let mut d: &[u8] = &[0x80, 0, 0];
        assert_eq!(time2(&mut d, 0).ok(), Some(0));
    }

    #[test]
    fn sign_extension() {
        assert_eq!(sign_extend(0xff, 1), -1);
        assert_eq!(sign_extend(0x80_0000, 3), -8_388_608);
        assert_eq!(sign_extend(0x7f_ffff, 3), 8_388_607);
        assert_eq!(sign_extend(u64::MAX, 8), -1);
    }
}
