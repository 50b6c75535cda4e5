//! The canonical rendering of a row, written once as MySQL SQL and once as ClickHouse SQL, so
//! that each server hashes its own rows and equal rows give equal hashes.
//!
//! A row's canonical text is its columns' texts, in the source's column order, each as
//! `LENGTH:BYTES` (length in bytes, so no value can run into the next one), or `TEXT,` for a
//! number, date or time held as such on both servers ([`delimited`]), or `N` for NULL.
//! A column's text follows the type mapping of docs/apply-clickhouse.md:
//!
//! | source type | text |
//! |---|---|
//! | integers, YEAR, BIT | the decimal number |
//! | DECIMAL with a scale | the decimal number without trailing zeros (`12.5`, `12`): ClickHouse 20+ prints no trailing zeros, 18.16 does |
//! | FLOAT, DOUBLE | `E:M`, the exact binary value: `value = M · 2^(E-52)`, `M` an integer (`0` for zero), computed with operations both servers do exactly (comparisons, scaling by powers of two), never from a printed decimal |
//! | DATE, DATETIME, TIMESTAMP | as MySQL prints them in UTC; the zero date/datetime as the target's zero (`1970-01-01 ...`) unless the target keeps text |
//! | TIME | as MySQL prints it |
//! | ENUM, SET, text | the UTF-8 text |
//! | binary strings, BLOB | the bytes; GEOMETRY its WKB (without the 4-byte SRID) |
//! | INET4, UUID | the text; INET6 into IPv6 its 16 bytes in hex (the servers print it differently) |
//!
//! The row's hash is the first 8 bytes of the MD5 of that text, read as a big-endian
//! unsigned integer; a chunk's checksum is the count of its rows and the XOR of their hashes.

use sluice_common::sql::{clickhouse as ch, mysql as my};
use sluice_proto::v1::{Column, ColumnType as T};

/// The ClickHouse type without `Nullable(...)` / `LowCardinality(...)`.
pub fn bare_type(t: &str) -> &str {
    let mut t = t.trim();
    loop {
        let inner = ["Nullable(", "LowCardinality("]
            .iter()
            .find_map(|w| t.strip_prefix(w).and_then(|r| r.strip_suffix(')')));
        match inner {
            Some(i) => t = i.trim(),
            None => return t,
        }
    }
}

/// What a target column of this source column holds, as far as the rendering cares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Target {
    /// Text (String, FixedString): the value as the apply stage wrote it.
    Text,
    /// A Date/DateTime/DateTime64: zero dates read as the epoch.
    Temporal,
    Other,
}

fn target_kind(ch_type: &str) -> Target {
    let t = bare_type(ch_type);
    if t == "String" || t.starts_with("FixedString") {
        Target::Text
    } else if t.starts_with("Date") {
        Target::Temporal
    } else {
        Target::Other
    }
}

/// The source column's value as text in MySQL (before the length prefix). The session runs
/// with `time_zone = '+00:00'`.
pub fn mysql_text(col: &Column, ch_type: &str) -> String {
    let c = my::ident(&col.name);
    let target = target_kind(ch_type);
    match col.r#type() {
        T::Tinyint | T::Smallint | T::Mediumint | T::Int | T::Bigint => c,
        T::Year | T::Bit => format!("CAST({c} AS UNSIGNED)"),
        T::Decimal if col.scale > 0 => {
            format!("TRIM(TRAILING '.' FROM TRIM(TRAILING '0' FROM CAST({c} AS CHAR)))")
        }
        T::Decimal => format!("CAST({c} AS CHAR)"),
        T::Float | T::Double => mysql_float(&c),
        T::Date if target == Target::Temporal => {
            format!("IF(CAST({c} AS CHAR) = '0000-00-00', '1970-01-01', CAST({c} AS CHAR))")
        }
        T::Datetime | T::Timestamp if target == Target::Temporal => {
            let frac = if col.fsp > 0 {
                format!(".{}", "0".repeat(col.fsp as usize))
            } else {
                String::new()
            };
            format!(
                "IF(CAST({c} AS CHAR) = '0000-00-00 00:00:00{frac}', \
                 '1970-01-01 00:00:00{frac}', CAST({c} AS CHAR))"
            )
        }
        T::Date | T::Datetime | T::Timestamp | T::Time => format!("CAST({c} AS CHAR)"),
        T::Enum | T::Set | T::Json => format!("CONVERT({c} USING utf8mb4)"),
        T::Char | T::Varchar | T::Text if col.charset != "binary" => {
            format!("CONVERT({c} USING utf8mb4)")
        }
        T::Geometry => format!("SUBSTRING({c}, 5)"),
        // Printed by different rules (MariaDB shortens a single zero group, ClickHouse does
        // not): the 16 bytes instead.
        T::Inet6 if bare_type(ch_type) == "IPv6" => format!("HEX(CAST({c} AS BINARY(16)))"),
        _ => c,
    }
}

/// A DOUBLE (or FLOAT, exact as a DOUBLE) as `E:M`: E the binary exponent (at least -1022, so
/// subnormals share one), M = value / 2^(E-52), an integer below 2^53 in magnitude. LOG2 only
/// guesses E; comparisons with powers of two (exact) correct it by one either way.
fn mysql_float(c: &str) -> String {
    let a = format!("ABS({c})");
    let e0 = format!("LEAST(GREATEST(FLOOR(LOG2({a})), -1074), 1023)");
    let e = format!("GREATEST({e0} + ({a} / POW(2, {e0}) >= 2) - ({a} / POW(2, {e0}) < 1), -1022)");
    format!("IF({c} = 0, '0', CONCAT({e}, ':', CAST({c} / POW(2, {e} - 52) AS SIGNED)))")
}

fn clickhouse_float(c: &str) -> String {
    let x = format!("toFloat64({c})");
    let a = format!("abs({x})");
    let e0 = format!("least(greatest(floor(log2({a})), -1074), 1023)");
    let e = format!("greatest({e0} + ({a} / pow(2, {e0}) >= 2) - ({a} / pow(2, {e0}) < 1), -1022)");
    format!(
        "if({x} = 0, '0', concat(toString(toInt64({e})), ':', toString(toInt64({x} / pow(2, {e} - 52)))))"
    )
}

/// The target column's value as text in ClickHouse (before the length prefix).
pub fn clickhouse_text(col: &Column, ch_type: &str) -> String {
    let c = ch::ident(&col.name);
    let t = bare_type(ch_type);
    match col.r#type() {
        T::Decimal if col.scale > 0 => {
            // (No `?` in the SQL: the client takes it for a parameter.)
            format!(
                "replaceRegexpOne(replaceRegexpOne(toString({c}), '\\\\.0+$', ''), \
                 '(\\\\.[0-9]*[1-9])0+$', '\\\\1')"
            )
        }
        T::Float | T::Double if t.starts_with("Float") => clickhouse_float(&c),
        T::Inet6 if t == "IPv6" => format!("hex({c})"),
        _ if t == "String" => c,
        _ if t.starts_with("FixedString") => format!("toString({c})"),
        // A DateTime64 wider than the source's precision (a column narrowed in the source
        // since the target was made): its values at the source's precision.
        _ if t.starts_with("DateTime64(")
            && matches!(col.r#type(), T::Datetime | T::Timestamp)
            && datetime64_precision(t).is_some_and(|p| p > col.fsp) =>
        {
            format!("toString(toDateTime64({c}, {}, 'UTC'))", col.fsp)
        }
        // ClickHouse before 20.x prints its zero day as 0000-00-00: it is 1970-01-01.
        _ if t.starts_with("DateTime") => {
            format!("replaceOne(toString({c}, 'UTC'), '0000-00-00', '1970-01-01')")
        }
        _ if t.starts_with("Date") => {
            format!("replaceOne(toString({c}), '0000-00-00', '1970-01-01')")
        }
        _ => format!("toString({c})"),
    }
}

/// The precision of a `DateTime64(p, ...)`.
fn datetime64_precision(t: &str) -> Option<u32> {
    t.strip_prefix("DateTime64(")?
        .split([',', ')'])
        .next()?
        .trim()
        .parse()
        .ok()
}

/// A column whose text, on both servers, is a number, a date or a time (never a `,`, never
/// starting with `N`): written as `TEXT,`, which costs the servers less than `LENGTH:TEXT`
/// (the text is built once). A target column of another type (text, for the values ClickHouse
/// 18.16 keeps as text) is length-prefixed: a wrong value there could hold a `,`.
pub fn delimited(col: &Column, ch_type: &str) -> bool {
    let t = bare_type(ch_type);
    let numeric_target = ["Int", "UInt", "Float", "Decimal", "Date"]
        .iter()
        .any(|p| t.starts_with(p));
    numeric_target
        && matches!(
            col.r#type(),
            T::Tinyint
                | T::Smallint
                | T::Mediumint
                | T::Int
                | T::Bigint
                | T::Year
                | T::Bit
                | T::Decimal
                | T::Float
                | T::Double
                | T::Date
                | T::Datetime
                | T::Timestamp
        )
}

/// `TEXT,` or `LENGTH:TEXT` ([`delimited`]), or `N` for NULL, in MySQL.
pub fn mysql_part(col: &Column, ch_type: &str) -> String {
    let x = mysql_text(col, ch_type);
    let part = if delimited(col, ch_type) {
        format!("CONCAT({x}, ',')")
    } else {
        format!("CONCAT(LENGTH({x}), ':', {x})")
    };
    if col.nullable {
        format!("IFNULL({part}, 'N')")
    } else {
        part
    }
}

/// The same in ClickHouse.
pub fn clickhouse_part(col: &Column, ch_type: &str) -> String {
    let x = clickhouse_text(col, ch_type);
    let part = if delimited(col, ch_type) {
        format!("concat({x}, ',')")
    } else {
        format!("concat(toString(length({x})), ':', {x})")
    };
    if ch_type.trim().starts_with("Nullable(") {
        format!("ifNull({part}, 'N')")
    } else {
        part
    }
}

/// The row's (or key's) canonical text from the columns' parts, in MySQL.
pub fn mysql_concat(parts: &[String]) -> String {
    match parts {
        [one] => one.clone(),
        _ => format!("CONCAT({})", parts.join(", ")),
    }
}

pub fn clickhouse_concat(parts: &[String]) -> String {
    match parts {
        [one] => one.clone(),
        _ => format!("concat({})", parts.join(", ")),
    }
}

/// The 64-bit hash of a canonical text, in MySQL.
pub fn mysql_hash(text: &str) -> String {
    format!("CAST(CONV(LEFT(MD5({text}), 16), 16, 10) AS UNSIGNED)")
}

/// The same hash in ClickHouse.
pub fn clickhouse_hash(text: &str) -> String {
    format!("reinterpretAsUInt64(reverse(substring(MD5({text}), 1, 8)))")
}

/// A canonical text split into its parts (`None` for NULL), `delimited` saying for each part
/// whether it is `TEXT,` or `LENGTH:TEXT`; `None` if it is not such a text.
pub fn split_parts(mut s: &[u8], delimited: &[bool]) -> Option<Vec<Option<Vec<u8>>>> {
    let mut out = Vec::new();
    for d in delimited {
        if s.first() == Some(&b'N') {
            out.push(None);
            s = &s[1..];
        } else if *d {
            let comma = s.iter().position(|b| *b == b',')?;
            out.push(Some(s[..comma].to_vec()));
            s = &s[comma + 1..];
        } else {
            let colon = s.iter().position(|b| *b == b':')?;
            let len: usize = std::str::from_utf8(&s[..colon]).ok()?.parse().ok()?;
            let rest = &s[colon + 1..];
            if rest.len() < len {
                return None;
            }
            out.push(Some(rest[..len].to_vec()));
            s = &rest[len..];
        }
    }
    s.is_empty().then_some(out)
}

/// A value's bytes for people: the text if it is UTF-8 without control characters, else hex.
pub fn show(v: &Option<Vec<u8>>) -> String {
    match v {
        None => "NULL".into(),
        Some(b) => match std::str::from_utf8(b) {
            Ok(t) if !t.chars().any(|c| c.is_control() && c != '\n' && c != '\t') => t.to_string(),
            _ => format!("0x{}", sluice_common::hex::encode(b)),
        },
    }
}

/// A query for an error message: its start.
pub(super) fn abbreviated(sql: &str) -> String {
    match sql.char_indices().nth(160) {
        Some((i, _)) => format!("`{}...`", &sql[..i]),
        None => format!("`{sql}`"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn canonical_texts_split_back_into_their_parts() {
        let kinds = [false, false, false, false, true, true];
        let parts = split_parts(b"2:12N3:a:b0:-4:720575,N", &kinds).unwrap();
        assert_eq!(
            parts,
            vec![
                Some(b"12".to_vec()),
                None,
                Some(b"a:b".to_vec()),
                Some(Vec::new()),
                Some(b"-4:720575".to_vec()),
                None
            ]
        );
        assert_eq!(
            split_parts(b"5:abc", &[false]),
            None,
            "a length beyond the text"
        );
        assert_eq!(split_parts(b"x:abc", &[false]), None);
        assert_eq!(split_parts(b"12", &[true]), None, "no closing comma");
        assert_eq!(split_parts(b"1,2,", &[true]), None, "more than the columns");
    }

    #[test]
    fn wrapper_types_are_seen_through() {
        assert_eq!(bare_type("Nullable(Decimal(9, 2))"), "Decimal(9, 2)");
        assert_eq!(bare_type("LowCardinality(Nullable(String))"), "String");
        assert_eq!(bare_type("DateTime('UTC')"), "DateTime('UTC')");
        assert_eq!(datetime64_precision("DateTime64(6, 'UTC')"), Some(6));
        assert_eq!(datetime64_precision("DateTime64(3)"), Some(3));
        assert_eq!(datetime64_precision("DateTime('UTC')"), None);
    }

    #[test]
    fn shown_values_are_text_or_hex() {
        assert_eq!(show(&None), "NULL");
        assert_eq!(show(&Some(b"caf\xc3\xa9".to_vec())), "café");
        assert_eq!(show(&Some(vec![0, 255])), "0x00ff");
    }
}
