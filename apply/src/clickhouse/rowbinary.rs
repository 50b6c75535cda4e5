//! RowBinary encoding of source values into ClickHouse columns.
//!
//! Encoding is driven by the *target* column type, so the same code writes into tables the
//! apply stage created and into tables the user made (such as the W1 change-log table, whose
//! TIME and DECIMAL columns are Strings). A value the target type cannot hold exactly is an
//! error naming the column and the reason, never a silent conversion: such an event goes to the
//! dead-letter topic.
//!
//! This is the per-value hot path of the sink: values are read where they lie in the event and
//! written straight into the table's buffer; only an error allocates.

use sluice_proto::v1::Column;
use sluice_proto::view::{ValueRef, ValueRef as V};
// RowBinary's string lengths are LEB128, the same as protobuf's varints.
use sluice_proto::wire::put_varint;

use super::types::ChType;

/// Why value `v` cannot be a key's in a column of type `t`, if it cannot: the zero date and
/// the zero datetime become the epoch in a ClickHouse date type (documented, for a value), so
/// in a key they would read as 1970-01-01 and a source row with that very date would become
/// the same mirror row. Keys are exact or refused; a key column kept as text holds them exactly.
pub fn inexact_key(v: &ValueRef<'_>, t: &ChType) -> Option<String> {
    let t = match t {
        ChType::Nullable(inner) => inner,
        t => t,
    };
    zero_date(v, t).then(|| {
        format!(
            "a zero date in a primary key column: {} stores it as 1970-01-01, which is another \
             key (a row with that date would become the same mirror row), and keys are kept \
             exactly or refused; {TEMPORAL_REMEDY}",
            t.sql()
        )
    })
}

/// Whether `v` is the zero date (or datetime) going into a ClickHouse date type, which stores
/// it as the epoch: a documented mapping for a value, but not the value itself.
pub fn zero_date(v: &ValueRef<'_>, t: &ChType) -> bool {
    let t = match t {
        ChType::Nullable(inner) => inner,
        t => t,
    };
    let zero = match v {
        V::Date(d) => d.year == 0 && d.month == 0 && d.day == 0,
        V::Datetime(d) => d.year == 0 && d.month == 0 && d.day == 0,
        _ => false,
    };
    zero && matches!(
        t,
        ChType::Date(_) | ChType::Date32(_) | ChType::DateTime(_) | ChType::DateTime64(..)
    )
}

/// Whether `v` is a date or time going into a ClickHouse date type: the only values
/// `tables.unheld = "mark"` marks when the type cannot hold them.
pub fn date_into_date(v: &ValueRef<'_>, t: &ChType) -> bool {
    let t = match t {
        ChType::Nullable(inner) => inner,
        t => t,
    };
    matches!(v, V::Date(_) | V::Datetime(_) | V::TimestampMicros(_))
        && matches!(
            t,
            ChType::Date(_) | ChType::Date32(_) | ChType::DateTime(_) | ChType::DateTime64(..)
        )
}

/// Append the value a column of type `t` gets for a source value it cannot hold
/// (`tables.unheld = "mark"`): NULL where it is Nullable, else the type's zero (0, '', the
/// epoch, the first member of an Enum).
pub fn put_unheld(t: &ChType, out: &mut Vec<u8>) {
    let zeros = |n: usize, out: &mut Vec<u8>| out.resize(out.len() + n, 0);
    match t {
        ChType::Nullable(_) => out.push(1),
        ChType::Int(b) | ChType::UInt(b) => zeros(*b as usize / 8, out),
        ChType::Float32 | ChType::Date32(_) | ChType::DateTime(_) | ChType::IPv4 => zeros(4, out),
        ChType::Float64 | ChType::DateTime64(..) => zeros(8, out),
        ChType::Decimal { precision, .. } => zeros(
            match precision {
                0..=9 => 4,
                10..=18 => 8,
                19..=38 => 16,
                _ => 32,
            },
            out,
        ),
        ChType::String | ChType::Strings => out.push(0),
        ChType::FixedString(n) => zeros(*n, out),
        ChType::Date(_) => zeros(2, out),
        ChType::IPv6 | ChType::Uuid => zeros(16, out),
        ChType::Enum(members, bits) => {
            let first = members.first().map_or(0, |(_, n)| *n);
            let _ = put_int(i128::from(first), *bits, true, out);
        }
    }
}

/// Append `names` as RowBinary of `Array(String)`.
pub fn put_strings(names: &[&str], out: &mut Vec<u8>) {
    put_varint(names.len() as u64, out);
    for n in names {
        put_varint(n.len() as u64, out);
        out.extend_from_slice(n.as_bytes());
    }
}

/// Append `v` (of source column `c`) to `out` as RowBinary of `t`.
pub fn encode(v: ValueRef<'_>, c: &Column, t: &ChType, out: &mut Vec<u8>) -> Result<(), String> {
    if let ChType::Nullable(inner) = t {
        if matches!(v, V::Absent | V::Null) {
            out.push(1);
            return Ok(());
        }
        out.push(0);
        return encode(v, c, inner, out);
    }
    match (v, t) {
        (V::Absent, _) => Err("no value in the row image (MINIMAL row image?)".into()),
        (V::Null, _) => Err(format!("NULL into non-Nullable {}", t.sql())),
        (V::Int(i), ChType::Int(b)) => put_int(i as i128, *b, true, out),
        (V::Int(i), ChType::UInt(b)) => put_int(i as i128, *b, false, out),
        (V::Uint(u), ChType::Int(b)) => put_int(u as i128, *b, true, out),
        (V::Uint(u), ChType::UInt(b)) => put_int(u as i128, *b, false, out),
        (V::Bits(u), ChType::Int(b)) => put_int(u as i128, *b, true, out),
        (V::Bits(u), ChType::UInt(b)) => put_int(u as i128, *b, false, out),
        (V::Int(i), ChType::Float64) => {
            out.extend_from_slice(&(i as f64).to_le_bytes());
            Ok(())
        }
        (V::Float32(x), ChType::Float32) => {
            out.extend_from_slice(&x.to_le_bytes());
            Ok(())
        }
        (V::Float32(x), ChType::Float64) => {
            out.extend_from_slice(&f64::from(x).to_le_bytes());
            Ok(())
        }
        (V::Float64(x), ChType::Float64) => {
            out.extend_from_slice(&x.to_le_bytes());
            Ok(())
        }
        (V::Decimal(d), ChType::Decimal { precision, scale }) => {
            put_decimal(d, *precision, *scale, out)
        }
        (V::Int(_) | V::Uint(_), ChType::Decimal { precision, scale }) => {
            put_decimal(&text(&v, c), *precision, *scale, out)
        }
        (V::Enum { label, .. }, ChType::Enum(members, bits)) => {
            let n = members
                .iter()
                .find(|(m, _)| m == label)
                .map(|(_, n)| *n)
                .ok_or_else(|| format!("{label:?} is not a member of {}", t.sql()))?;
            put_int(n as i128, *bits, true, out)
        }
        (V::Enum { index, .. }, ChType::UInt(b)) => put_int(index as i128, *b, false, out),
        (V::Set { bits, .. }, ChType::UInt(b)) => put_int(bits as i128, *b, false, out),
        (V::Date(d), ChType::Date(span)) => {
            let days = date_days(&d, &v, c)?;
            check_span(days * 86_400, span, t, &v, c)?;
            out.extend_from_slice(&(days as u16).to_le_bytes());
            Ok(())
        }
        (V::Date(d), ChType::Date32(span)) => {
            let days = date_days(&d, &v, c)?;
            check_span(days * 86_400, span, t, &v, c)?;
            out.extend_from_slice(&(days as i32).to_le_bytes());
            Ok(())
        }
        (V::Datetime(d), ChType::DateTime(span)) => {
            if d.micros != 0 {
                return Err(format!(
                    "{} has fractional seconds a DateTime column would drop",
                    text(&v, c)
                ));
            }
            let secs = datetime_seconds(&d, &v, c)?;
            check_span(secs, span, t, &v, c)?;
            out.extend_from_slice(&(secs as u32).to_le_bytes());
            Ok(())
        }
        (V::TimestampMicros(us), ChType::DateTime(span)) => {
            if us % 1_000_000 != 0 {
                return Err(format!(
                    "{} has fractional seconds a DateTime column would drop",
                    text(&v, c)
                ));
            }
            check_span(us / 1_000_000, span, t, &v, c)?;
            out.extend_from_slice(&((us / 1_000_000) as u32).to_le_bytes());
            Ok(())
        }
        (V::Datetime(d), ChType::DateTime64(p, span)) => {
            let secs = datetime_seconds(&d, &v, c)?;
            check_span(secs, span, t, &v, c)?;
            put_dt64(secs * 1_000_000 + i64::from(d.micros), *p, &v, c, out)
        }
        (V::TimestampMicros(us), ChType::DateTime64(p, span)) => {
            check_span(us.div_euclid(1_000_000), span, t, &v, c)?;
            put_dt64(us, *p, &v, c, out)
        }
        (V::Text(s), ChType::IPv4) => {
            let ip: std::net::Ipv4Addr = s
                .parse()
                .map_err(|_| format!("{s:?} is not an IPv4 address"))?;
            out.extend_from_slice(&u32::from(ip).to_le_bytes());
            Ok(())
        }
        (V::Text(s), ChType::IPv6) => {
            let ip: std::net::Ipv6Addr = s
                .parse()
                .map_err(|_| format!("{s:?} is not an IPv6 address"))?;
            out.extend_from_slice(&ip.octets());
            Ok(())
        }
        (V::Text(s), ChType::Uuid) => {
            let u = parse_uuid(s).ok_or_else(|| format!("{s:?} is not a UUID"))?;
            // Two 64-bit halves, the high one first, each little-endian.
            out.extend_from_slice(&((u >> 64) as u64).to_le_bytes());
            out.extend_from_slice(&(u as u64).to_le_bytes());
            Ok(())
        }
        (V::TimeMicros(us), ChType::Int(64)) => put_int(us as i128, 64, true, out),
        (_, ChType::String) => {
            let bytes: &[u8] = match v {
                V::Bytes(b) | V::Bson(b) => b,
                V::RawText { data, .. } => data,
                V::Geometry { wkb, .. } => wkb,
                V::Text(t) | V::Decimal(t) | V::Json(t) => t.as_bytes(),
                _ => {
                    // The text, written in place; its length (LEB128, as protobuf's varint)
                    // is patched in front of it.
                    out.push(0);
                    let start = out.len();
                    write_text(&v, c, out);
                    sluice_proto::wire::patch_len(out, start);
                    return Ok(());
                }
            };
            put_varint(bytes.len() as u64, out);
            out.extend_from_slice(bytes);
            Ok(())
        }
        (_, ChType::FixedString(n)) => {
            let owned;
            let bytes: &[u8] = match v {
                V::Bytes(b) => b,
                V::Text(t) => t.as_bytes(),
                _ => {
                    owned = text(&v, c);
                    owned.as_bytes()
                }
            };
            if bytes.len() > *n {
                return Err(format!("{} bytes do not fit FixedString({n})", bytes.len()));
            }
            out.extend_from_slice(bytes);
            out.resize(out.len() + (n - bytes.len()), 0);
            Ok(())
        }
        (v, t) => Err(format!(
            "a {} value cannot be written to a {} column",
            kind_name(&v),
            t.sql()
        )),
    }
}

fn kind_name(v: &ValueRef<'_>) -> &'static str {
    match v {
        V::Absent => "missing",
        V::Null => "NULL",
        V::Int(_) => "signed integer",
        V::Uint(_) => "unsigned integer",
        V::Float32(_) => "FLOAT",
        V::Float64(_) => "DOUBLE",
        V::Decimal(_) => "DECIMAL",
        V::Text(_) => "text",
        V::Bytes(_) => "binary",
        V::Bits(_) => "BIT",
        V::Enum { .. } => "ENUM",
        V::Set { .. } => "SET",
        V::Date(_) => "DATE",
        V::TimeMicros(_) => "TIME",
        V::Datetime(_) => "DATETIME",
        V::TimestampMicros(_) => "TIMESTAMP",
        V::Geometry { .. } => "GEOMETRY",
        V::Json(_) => "JSON",
        V::Bson(_) => "BSON",
        V::RawText { .. } => "text in another charset",
    }
}

/// A value as text, the way MySQL prints it (fractional seconds to the column's precision).
pub fn text(v: &ValueRef<'_>, c: &Column) -> String {
    let mut out = Vec::new();
    write_text(v, c, &mut out);
    String::from_utf8(out).expect("every piece of text is UTF-8")
}

/// [`text`], appended to `out`.
fn write_text(v: &ValueRef<'_>, c: &Column, out: &mut Vec<u8>) {
    use std::io::Write;
    // Writing into a Vec cannot fail.
    let frac = |us: u32, out: &mut Vec<u8>| {
        if c.fsp > 0 {
            let at = out.len();
            out.push(b'.');
            crate::push_decimal(u64::from(us), 6, out);
            out.truncate(at + 1 + (c.fsp as usize).min(6));
        }
    };
    let _ = match *v {
        V::Absent => Ok(()),
        V::Null => out.write_all(b"NULL"),
        V::Int(i) => write!(out, "{i}"),
        V::Uint(u) | V::Bits(u) => write!(out, "{u}"),
        V::Float32(f) => write!(out, "{f}"),
        V::Float64(f) => write!(out, "{f}"),
        V::Decimal(d) | V::Text(d) | V::Json(d) => out.write_all(d.as_bytes()),
        V::Bytes(b) | V::Bson(b) => out.write_all(String::from_utf8_lossy(b).as_bytes()),
        V::RawText { data, .. } => out.write_all(String::from_utf8_lossy(data).as_bytes()),
        V::Enum { label, .. } => out.write_all(label.as_bytes()),
        V::Set { members, .. } => {
            for (i, m) in members.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                out.extend_from_slice(m.as_bytes());
            }
            Ok(())
        }
        V::Date(d) => write!(out, "{:04}-{:02}-{:02}", d.year, d.month, d.day),
        V::TimeMicros(t) => {
            // (by hand, not `write!`: a TIME column of every row of a table goes this way)
            if t < 0 {
                out.push(b'-');
            }
            let t = t.unsigned_abs();
            let s = t / 1_000_000;
            crate::push_decimal(s / 3600, 2, out);
            out.push(b':');
            crate::push_decimal(s / 60 % 60, 2, out);
            out.push(b':');
            crate::push_decimal(s % 60, 2, out);
            frac((t % 1_000_000) as u32, out);
            Ok(())
        }
        V::Datetime(d) => {
            let r = write!(
                out,
                "{:04}-{:02}-{:02} {:02}:{:02}:{:02}",
                d.year, d.month, d.day, d.hour, d.minute, d.second
            );
            frac(d.micros, out);
            r
        }
        V::TimestampMicros(0) => {
            let r = out.write_all(b"0000-00-00 00:00:00");
            frac(0, out);
            r
        }
        V::TimestampMicros(us) => {
            let secs = us.div_euclid(1_000_000);
            let (y, m, d) = sluice_common::civil::civil_from_days(secs.div_euclid(86_400));
            let rem = secs.rem_euclid(86_400);
            let r = write!(
                out,
                "{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02}",
                rem / 3600,
                rem / 60 % 60,
                rem % 60
            );
            frac(us.rem_euclid(1_000_000) as u32, out);
            r
        }
        V::Geometry { wkb, .. } => write!(out, "{} bytes of WKB", wkb.len()),
    };
}

fn put_int(v: i128, bits: u8, signed: bool, out: &mut Vec<u8>) -> Result<(), String> {
    let (min, max) = if signed {
        (-(1i128 << (bits - 1)), (1i128 << (bits - 1)) - 1)
    } else {
        (0, (1i128 << bits) - 1)
    };
    if v < min || v > max {
        return Err(format!(
            "{v} is out of range for {}{bits}",
            if signed { "Int" } else { "UInt" }
        ));
    }
    let bytes = v.to_le_bytes();
    out.extend_from_slice(&bytes[..bits as usize / 8]);
    Ok(())
}

/// Exact decimal text to ClickHouse's scaled integer of the width its precision needs.
fn put_decimal(d: &str, precision: u8, scale: u8, out: &mut Vec<u8>) -> Result<(), String> {
    let (neg, digits) = match d.strip_prefix('-') {
        Some(r) => (true, r),
        None => (false, d),
    };
    let (int, frac) = digits.split_once('.').unwrap_or((digits, ""));
    let int = int.trim_start_matches('0');
    let scale = scale as usize;
    if frac.len() > scale && frac.as_bytes()[scale..].iter().any(|b| *b != b'0') {
        return Err(format!("{d} has more than {scale} decimal places"));
    }
    if int.len() + scale > precision as usize {
        return Err(format!("{d} does not fit Decimal({precision}, {scale})"));
    }
    let digit = |b: u8| {
        if b.is_ascii_digit() {
            Ok(u64::from(b - b'0'))
        } else {
            Err(format!("{d} is not a decimal"))
        }
    };
    // The scaled integer, in 64-bit limbs (little-endian): up to 76 digits.
    let mut limbs = [0u64; 4];
    let mut push = |x: u64| {
        let mut carry = u128::from(x);
        for l in limbs.iter_mut() {
            let t = u128::from(*l) * 10 + carry;
            *l = t as u64;
            carry = t >> 64;
        }
    };
    for b in int.bytes() {
        push(digit(b)?);
    }
    let fb = frac.as_bytes();
    for i in 0..scale {
        push(fb.get(i).map(|b| digit(*b)).transpose()?.unwrap_or(0));
    }
    if neg {
        // Two's complement over 256 bits.
        let mut carry = 1u128;
        for l in limbs.iter_mut() {
            let t = u128::from(!*l) + carry;
            *l = t as u64;
            carry = t >> 64;
        }
    }
    let width: usize = match precision {
        0..=9 => 4,
        10..=18 => 8,
        19..=38 => 16,
        _ => 32,
    };
    // Two's complement truncates: the low `width` bytes are the value (it fits, checked above).
    let start = out.len();
    for l in &limbs[..width.div_ceil(8)] {
        out.extend_from_slice(&l.to_le_bytes());
    }
    out.truncate(start + width);
    Ok(())
}

/// What the apply stage says of a date or time a target column cannot hold.
const TEMPORAL_REMEDY: &str = "keep this table's dates as MySQL prints them with \
    `[tables.temporal_tables] \"db.table\" = \"text\"` (or `tables.temporal = \"text\"`), drop \
    the target table and re-snapshot it";

fn check_span(
    secs: i64,
    span: &super::types::Span,
    t: &ChType,
    v: &ValueRef<'_>,
    c: &Column,
) -> Result<(), String> {
    if span.holds(secs) {
        return Ok(());
    }
    Err(format!(
        "{} is outside what ClickHouse {} holds and reads back on this server ({}); \
         {TEMPORAL_REMEDY}",
        text(v, c),
        t.sql(),
        span.describe()
    ))
}

/// A UUID's text (`8-4-4-4-12` hex digits, any case) as its 128-bit number.
fn parse_uuid(s: &str) -> Option<u128> {
    let groups: Vec<&str> = s.split('-').collect();
    if groups.iter().map(|g| g.len()).collect::<Vec<_>>() != [8, 4, 4, 4, 12] {
        return None;
    }
    let hex: String = groups.concat();
    if !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    u128::from_str_radix(&hex, 16).ok()
}

fn put_dt64(us: i64, p: u8, k: &ValueRef<'_>, c: &Column, out: &mut Vec<u8>) -> Result<(), String> {
    let v = if p >= 6 {
        us * 10i64.pow(u32::from(p) - 6)
    } else {
        let div = 10i64.pow(6 - u32::from(p));
        if us % div != 0 {
            return Err(format!(
                "{} has more fractional digits than DateTime64({p})",
                text(k, c)
            ));
        }
        us / div
    };
    out.extend_from_slice(&v.to_le_bytes());
    Ok(())
}

/// Seconds since the epoch of a wall-clock DATETIME read as UTC; the zero datetime is 0.
fn datetime_seconds(
    d: &sluice_proto::v1::DateTime,
    v: &ValueRef<'_>,
    c: &Column,
) -> Result<i64, String> {
    let date = sluice_proto::v1::Date {
        year: d.year,
        month: d.month,
        day: d.day,
    };
    let days = date_days(&date, v, c)?;
    if days == 0 && d.year == 0 {
        // The zero datetime is the epoch; a zero date with a time of day is no instant.
        if d.hour != 0 || d.minute != 0 || d.second != 0 || d.micros != 0 {
            return Err(format!(
                "{} is a zero date with a time of day, which no ClickHouse date type holds; \
                 {TEMPORAL_REMEDY}",
                text(v, c)
            ));
        }
        return Ok(0);
    }
    Ok(days * 86_400 + i64::from(d.hour) * 3600 + i64::from(d.minute) * 60 + i64::from(d.second))
}

/// Days since the epoch of a DATE; the zero date (`0000-00-00`) is ClickHouse's zero, day 0
/// (1970-01-01). A date with a zero month or day (MySQL without `NO_ZERO_IN_DATE`) and a day
/// the month does not have (`ALLOW_INVALID_DATES`: `2026-02-30`) are no date ClickHouse
/// holds: refused, never moved to another day.
fn date_days(d: &sluice_proto::v1::Date, v: &ValueRef<'_>, c: &Column) -> Result<i64, String> {
    let (y, m, day) = (d.year, d.month, d.day);
    if y == 0 && m == 0 && day == 0 {
        return Ok(0);
    }
    if m == 0 || day == 0 {
        return Err(format!(
            "{} has a zero month or day (a partial date), which no ClickHouse date type \
             holds; {TEMPORAL_REMEDY}",
            text(v, c)
        ));
    }
    if m > 12 || day > days_in_month(i64::from(y), m) {
        return Err(format!(
            "{} is not a day of the calendar (MySQL keeps it with ALLOW_INVALID_DATES), which \
             no ClickHouse date type holds; {TEMPORAL_REMEDY}",
            text(v, c)
        ));
    }
    Ok(sluice_common::civil::days_from_civil(
        i64::from(y),
        i64::from(m),
        i64::from(day),
    ))
}

fn days_in_month(y: i64, m: u32) -> u32 {
    match m {
        2 if (y % 4 == 0 && y % 100 != 0) || y % 400 == 0 => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

#[cfg(test)]
mod tests;
