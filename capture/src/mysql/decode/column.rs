//! One column's bytes to its `Value` message, appended to the image being built: the
//! [`Layout`] says how the bytes are stored, the schema what they become (signedness, text or
//! bytes, charset, ENUM/SET members). Written as protobuf wire bytes directly: no `Value` is
//! built on the way.

use sluice_proto::tags::{date, date_time, enum_value, set_value, value};
use sluice_proto::v1::{self, value::Kind, Column, ColumnType};
use sluice_proto::wire::{self, put_bytes, put_int32_field, put_uint_field, put_varint, zigzag};

use super::formats::{
    be, datetime2, decimal, frac_be, json_text, le, sign_extend, take_ref, time2, ColumnError,
    ColumnError::Invalid,
};
use super::layout::Layout;
use crate::mysql::charset;

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
pub(super) struct ColumnDecoder {
    pub(super) name: String,
    layout: Layout,
    /// What the bytes of string-like layouts become.
    target: ColumnType,
    text: Text,
    charset: String,
    members: Vec<String>,
}

impl ColumnDecoder {
    /// The decoder of schema column `col`, stored as `layout`.
    pub(super) fn new(col: &Column, layout: Layout) -> Self {
        let text = match col.r#type() {
            ColumnType::Binary | ColumnType::Varbinary | ColumnType::Blob => Text::Bytes,
            _ if col.charset == "binary" => Text::Bytes,
            _ if charset::is_utf8(&col.charset) => Text::Utf8,
            _ => Text::Other,
        };
        ColumnDecoder {
            name: col.name.clone(),
            layout,
            target: col.r#type(),
            text,
            charset: col.charset.clone(),
            members: col.members.clone(),
        }
    }
}

// A `Value`'s `kind` members, as one-byte field keys (fields 1 to 15, from the `.proto`).
const INT: u8 = value::INT_KEY1;
const UINT: u8 = value::UINT_KEY1;
const FLOAT32: u8 = value::FLOAT32_KEY1;
const FLOAT64: u8 = value::FLOAT64_KEY1;
const DECIMAL: u8 = value::DECIMAL_KEY1;
const TEXT: u8 = value::TEXT_KEY1;
const BYTES: u8 = value::BYTES_KEY1;
const BITS: u8 = value::BITS_KEY1;
const ENUM: u8 = value::ENUM_VALUE_KEY1;
const SET: u8 = value::SET_VALUE_KEY1;
const DATE: u8 = value::DATE_KEY1;
const TIME: u8 = value::TIME_MICROS_KEY1;
const DATETIME: u8 = value::DATETIME_KEY1;
const TIMESTAMP: u8 = value::TIMESTAMP_MICROS_KEY1;
/// `json` is field 17: a two-byte key.
const JSON: [u8; 2] = value::JSON_KEY;

impl ColumnDecoder {
    /// Read one non-NULL value off `data` and append its `Value` message (the `kind` field) to
    /// `out`.
    pub(super) fn encode(&self, data: &mut &[u8], out: &mut Vec<u8>) -> Result<(), ColumnError> {
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
                    put_uint_field(enum_value::INDEX_KEY1, index.into(), out);
                    if !label.is_empty() {
                        put_bytes(&enum_value::LABEL_KEY, label.as_bytes(), out);
                    }
                    Ok(())
                })?;
            }
            Layout::Set { bytes } => {
                let bits = le(take_ref(data, *bytes)?);
                delimited(SET, out, |out| {
                    put_uint_field(set_value::BITS_KEY1, bits, out);
                    for i in (0..64).filter(|i| bits & (1u64 << i) != 0) {
                        let member = self.members.get(i).ok_or_else(|| {
                            Invalid(format!(
                                "SET bit {i} but the schema has {} members",
                                self.members.len()
                            ))
                        })?;
                        put_bytes(&set_value::MEMBERS_KEY, member.as_bytes(), out);
                    }
                    Ok(())
                })?;
            }
            Layout::Date => {
                let v = le(take_ref(data, 3)?);
                delimited(DATE, out, |out| {
                    put_int32_field(date::YEAR_KEY1, (v >> 9) as i32, out);
                    put_uint_field(date::MONTH_KEY1, (v >> 5) & 15, out);
                    put_uint_field(date::DAY_KEY1, v & 31, out);
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
                if matches!(
                    self.target,
                    ColumnType::Inet4 | ColumnType::Inet6 | ColumnType::Uuid
                ) {
                    // Stored like BINARY(n): without trailing NULs.
                    let n = pad_to.unwrap_or(bytes.len());
                    if bytes.len() > n {
                        return Err(Invalid(format!(
                            "{} bytes for a {}-byte {:?} value",
                            bytes.len(),
                            n,
                            self.target
                        )));
                    }
                    let mut full = bytes.to_vec();
                    full.resize(n, 0);
                    let text = match self.target {
                        ColumnType::Inet4 if n == 4 => super::formats::inet4_text(&full),
                        ColumnType::Inet6 if n == 16 => super::formats::inet6_text(&full),
                        ColumnType::Uuid if n == 16 => super::formats::uuid_text(&full),
                        _ => return Err(Invalid(format!("a {n}-byte {:?} value", self.target))),
                    };
                    put_bytes(&[TEXT], text.as_bytes(), out);
                    return Ok(());
                }
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
        put_int32_field(date_time::YEAR_KEY1, dt.year, out);
        for (key, v) in [
            (date_time::MONTH_KEY1, dt.month),
            (date_time::DAY_KEY1, dt.day),
            (date_time::HOUR_KEY1, dt.hour),
            (date_time::MINUTE_KEY1, dt.minute),
            (date_time::SECOND_KEY1, dt.second),
            (date_time::MICROS_KEY1, dt.micros),
        ] {
            put_uint_field(key, v.into(), out);
        }
        Ok(())
    });
}
