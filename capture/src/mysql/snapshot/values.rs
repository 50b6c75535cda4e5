//! `SELECT` values as the contract's values, exactly as the binlog decoder
//! ([`crate::mysql::decode`]) makes them from the same row, and key values back to statement
//! parameters (the `WHERE` of the next chunk).
//!
//! The snapshot connections read in binary protocol with `character_set_results = binary` and
//! `time_zone = '+00:00'`, ENUM and SET as their numbers: so a value arrives in the column's own
//! bytes, and a TIMESTAMP as the UTC date and time the binlog's seconds stand for.

use mysql_async::Value as My;
use sluice_common::civil::{civil_from_days, days_from_civil};
use sluice_proto::v1::{self, value::Kind, ColumnType};

use crate::mysql::charset;

/// A key value back to a statement parameter, compared by the server in the column's type
/// and collation.
pub(super) fn to_param(v: &v1::Value) -> My {
    match &v.kind {
        None | Some(Kind::Null(_)) => My::NULL,
        Some(Kind::Int(i)) => My::Int(*i),
        Some(Kind::Uint(u)) | Some(Kind::Bits(u)) => My::UInt(*u),
        Some(Kind::Float32(f)) => My::Float(*f),
        Some(Kind::Float64(f)) => My::Double(*f),
        Some(Kind::Decimal(s)) | Some(Kind::Text(s)) | Some(Kind::Json(s)) => {
            My::Bytes(s.clone().into_bytes())
        }
        Some(Kind::Bytes(b)) => My::Bytes(b.clone()),
        Some(Kind::EnumValue(e)) => My::UInt(u64::from(e.index)),
        Some(Kind::SetValue(s)) => My::UInt(s.bits),
        Some(Kind::Date(d)) => My::Date(d.year as u16, d.month as u8, d.day as u8, 0, 0, 0, 0),
        Some(Kind::Datetime(d)) => My::Date(
            d.year as u16,
            d.month as u8,
            d.day as u8,
            d.hour as u8,
            d.minute as u8,
            d.second as u8,
            d.micros,
        ),
        Some(Kind::TimeMicros(t)) => {
            let neg = *t < 0;
            let a = t.unsigned_abs();
            let secs = a / 1_000_000;
            My::Time(
                neg,
                (secs / 86_400) as u32,
                (secs / 3600 % 24) as u8,
                (secs / 60 % 60) as u8,
                (secs % 60) as u8,
                (a % 1_000_000) as u32,
            )
        }
        Some(Kind::TimestampMicros(t)) => {
            if *t == 0 {
                My::Date(0, 0, 0, 0, 0, 0, 0)
            } else {
                let secs = t.div_euclid(1_000_000);
                let (y, m, d, hh, mm, ss) = civil_from_epoch(secs);
                My::Date(y as u16, m, d, hh, mm, ss, t.rem_euclid(1_000_000) as u32)
            }
        }
        // Text that did not convert to UTF-8 keeps the column's own bytes: the server compares
        // them in the column's collation, as the key it stored. (Were it NULL, `key > NULL`
        // would find no next chunk and the table would count as done with rows unread.)
        Some(Kind::RawText(r)) => My::Bytes(r.data.clone()),
        Some(Kind::Geometry(g)) => My::Bytes(g.wkb.clone()),
        Some(Kind::Bson(_)) => My::NULL, // MongoDB's only: never a MySQL key
    }
}

/// Date and time of day (UTC) of seconds since the epoch.
fn civil_from_epoch(secs: i64) -> (i64, u8, u8, u8, u8, u8) {
    let (y, m, d) = civil_from_days(secs.div_euclid(86_400));
    let rem = secs.rem_euclid(86_400);
    (
        y,
        m as u8,
        d as u8,
        (rem / 3600) as u8,
        (rem / 60 % 60) as u8,
        (rem % 60) as u8,
    )
}

fn int_of(v: &My) -> Option<i128> {
    match v {
        My::Int(i) => Some(i128::from(*i)),
        My::UInt(u) => Some(i128::from(*u)),
        My::Bytes(b) => std::str::from_utf8(b).ok()?.trim().parse().ok(),
        My::Float(f) => Some(*f as i128),
        My::Double(f) => Some(*f as i128),
        _ => None,
    }
}

/// One value of a `SELECT` (binary protocol, results in the column's own bytes, time zone
/// UTC) as the binlog decoder would have produced it.
pub fn to_value(col: &v1::Column, v: My) -> Result<v1::Value, String> {
    use ColumnType as T;
    let bad = |v: &My| format!("column {}: unexpected value {v:?}", col.name);
    let kind = match (col.r#type(), v) {
        (_, My::NULL) => Kind::Null(true),
        (T::Tinyint | T::Smallint | T::Mediumint | T::Int | T::Bigint | T::Year, v) => {
            let i = int_of(&v).ok_or_else(|| bad(&v))?;
            if col.unsigned {
                Kind::Uint(u64::try_from(i).map_err(|_| bad(&v))?)
            } else {
                Kind::Int(i64::try_from(i).map_err(|_| bad(&v))?)
            }
        }
        (T::Float, My::Float(f)) => Kind::Float32(f),
        (T::Float, My::Double(f)) => Kind::Float32(f as f32),
        (T::Double, My::Double(f)) => Kind::Float64(f),
        (T::Double, My::Float(f)) => Kind::Float64(f64::from(f)),
        (T::Decimal, My::Bytes(b)) => {
            Kind::Decimal(String::from_utf8(b).map_err(|e| format!("{}: {e}", col.name))?)
        }
        (T::Bit, My::Bytes(b)) => Kind::Bits(b.iter().fold(0u64, |a, x| a << 8 | u64::from(*x))),
        (T::Bit, v) => Kind::Bits(int_of(&v).ok_or_else(|| bad(&v))? as u64),
        (T::Enum, v) => {
            let index = int_of(&v).ok_or_else(|| bad(&v))? as u32;
            let label =
                match index {
                    0 => String::new(),
                    i => col.members.get(i as usize - 1).cloned().ok_or_else(|| {
                        format!("{}: ENUM index {i} beyond the members", col.name)
                    })?,
                };
            Kind::EnumValue(v1::EnumValue { index, label })
        }
        (T::Set, v) => {
            let bits = int_of(&v).ok_or_else(|| bad(&v))? as u64;
            let members = (0..64)
                .filter(|i| bits & (1u64 << i) != 0)
                .map(|i| {
                    col.members
                        .get(i)
                        .cloned()
                        .ok_or_else(|| format!("{}: SET bit {i} beyond the members", col.name))
                })
                .collect::<Result<_, _>>()?;
            Kind::SetValue(v1::SetValue { bits, members })
        }
        (T::Date, My::Date(y, m, d, ..)) => Kind::Date(v1::Date {
            year: i32::from(y),
            month: u32::from(m),
            day: u32::from(d),
        }),
        (T::Datetime, My::Date(y, m, d, hh, mm, ss, us)) => Kind::Datetime(v1::DateTime {
            year: i32::from(y),
            month: u32::from(m),
            day: u32::from(d),
            hour: u32::from(hh),
            minute: u32::from(mm),
            second: u32::from(ss),
            micros: us,
        }),
        (T::Timestamp, My::Date(y, m, d, hh, mm, ss, us)) => {
            if y == 0 && m == 0 && d == 0 {
                Kind::TimestampMicros(0)
            } else {
                let days = days_from_civil(i64::from(y), i64::from(m), i64::from(d));
                let secs =
                    days * 86_400 + i64::from(hh) * 3600 + i64::from(mm) * 60 + i64::from(ss);
                Kind::TimestampMicros(secs * 1_000_000 + i64::from(us))
            }
        }
        (T::Time, My::Time(neg, days, hh, mm, ss, us)) => {
            let secs =
                ((i64::from(days) * 24 + i64::from(hh)) * 60 + i64::from(mm)) * 60 + i64::from(ss);
            let micros = secs * 1_000_000 + i64::from(us);
            Kind::TimeMicros(if neg { -micros } else { micros })
        }
        (T::Json, My::Bytes(b)) => match String::from_utf8(b) {
            Ok(t) => Kind::Json(t),
            Err(e) => charset::to_text(e.into_bytes(), &col.charset),
        },
        (T::Geometry, My::Bytes(b)) => {
            if b.len() < 4 {
                return Err(format!("{}: GEOMETRY of {} bytes", col.name, b.len()));
            }
            Kind::Geometry(v1::Geometry {
                srid: u32::from_le_bytes(b[..4].try_into().expect("4 bytes")),
                wkb: b[4..].to_vec(),
            })
        }
        (T::Binary | T::Varbinary | T::Blob, My::Bytes(b)) => Kind::Bytes(b),
        // MariaDB sends INET4/INET6/UUID as the text it prints, which the binlog decoder
        // makes of their bytes too.
        (T::Inet4 | T::Inet6 | T::Uuid, My::Bytes(b)) => {
            Kind::Text(String::from_utf8(b).map_err(|e| format!("{}: {e}", col.name))?)
        }
        (T::Char | T::Varchar | T::Text, My::Bytes(b)) => {
            if col.charset == "binary" {
                Kind::Bytes(b)
            } else {
                charset::to_text(b, &col.charset)
            }
        }
        (_, v) => return Err(bad(&v)),
    };
    Ok(v1::Value { kind: Some(kind) })
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_proto::v1::TableSchema;

    #[test]
    fn civil_dates_round_trip() {
        for secs in [
            0i64,
            86_399,
            951_782_400,
            4_102_444_800,
            1_709_208_000 + 3723,
            -1,
            -86_401,
        ] {
            let (y, m, d, hh, mm, ss) = civil_from_epoch(secs);
            let back = days_from_civil(y, i64::from(m), i64::from(d)) * 86_400
                + i64::from(hh) * 3600
                + i64::from(mm) * 60
                + i64::from(ss);
            assert_eq!(back, secs);
        }
        assert_eq!(civil_from_epoch(1_709_208_000), (2024, 2, 29, 12, 0, 0));
        assert_eq!(civil_from_epoch(-1), (1969, 12, 31, 23, 59, 59));
    }

    #[test]
    fn every_key_kind_goes_back_as_a_parameter() {
        let raw = v1::Value {
            kind: Some(Kind::RawText(v1::RawText {
                data: vec![0x93, 0xfa],
                charset: "cp1252".into(),
            })),
        };
        assert_eq!(to_param(&raw), My::Bytes(vec![0x93, 0xfa]));
        let text = sluice_proto::value::text("é");
        assert_eq!(to_param(&text), My::Bytes("é".as_bytes().to_vec()));
        assert_eq!(
            to_param(&sluice_proto::value::uint(u64::MAX)),
            My::UInt(u64::MAX)
        );
        assert_eq!(to_param(&sluice_proto::value::null()), My::NULL);
    }

    #[test]
    fn enum_and_set_are_read_as_numbers() {
        let schema = TableSchema {
            columns: vec![
                v1::Column {
                    name: "e".into(),
                    r#type: ColumnType::Enum as i32,
                    members: vec!["a".into(), "b".into()],
                    ..Default::default()
                },
                v1::Column {
                    name: "s`x".into(),
                    r#type: ColumnType::Set as i32,
                    members: vec!["a".into(), "b".into()],
                    ..Default::default()
                },
            ],
            ..Default::default()
        };
        assert_eq!(
            super::super::reader::select_list(&schema),
            "`e`+0, `s``x`+0"
        );
        let e = to_value(&schema.columns[0], My::Int(2)).unwrap();
        assert_eq!(
            e.kind,
            Some(Kind::EnumValue(v1::EnumValue {
                index: 2,
                label: "b".into()
            }))
        );
        let s = to_value(&schema.columns[1], My::Bytes(b"3".to_vec())).unwrap();
        assert_eq!(
            s.kind,
            Some(Kind::SetValue(v1::SetValue {
                bits: 3,
                members: vec!["a".into(), "b".into()]
            }))
        );
        assert!(to_value(&schema.columns[0], My::Int(3)).is_err());
    }
}
#[cfg(test)]
mod inet_tests {
    use super::*;
    #[test]
    fn inet4_text_arrives_as_text() {
        let col = v1::Column {
            name: "a".into(),
            r#type: ColumnType::Inet4 as i32,
            ..Default::default()
        };
        let v = to_value(&col, My::Bytes(b"127.0.0.1".to_vec())).unwrap();
        assert_eq!(v.kind, Some(Kind::Text("127.0.0.1".into())));
        let c = crate::mysql::schema::column_type("inet4");
        assert_eq!(c, ColumnType::Inet4);
    }
}
