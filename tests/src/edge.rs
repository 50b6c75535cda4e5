//! The edge-values table: every MySQL type at its extremes, zero values and NULLs, with the
//! contract values each row must decode to. Used by the binlog decoding test and the end-to-end
//! capture tests.

use sluice_proto::v1::{self, value::Kind};
use sluice_proto::value;

/// Session settings the rows below need: zero dates allowed, timestamps in UTC.
pub const SESSION: &str = "SET SESSION sql_mode = '', SESSION time_zone = '+00:00'";

pub fn create_table(db: &str) -> String {
    format!(
        "CREATE TABLE `{db}`.edge (
          id INT NOT NULL PRIMARY KEY,
          ti TINYINT, tiu TINYINT UNSIGNED, si SMALLINT, siu SMALLINT UNSIGNED,
          mi MEDIUMINT, miu MEDIUMINT UNSIGNED, i INT, iu INT UNSIGNED,
          bi BIGINT, biu BIGINT UNSIGNED,
          d65 DECIMAL(65,30), d10 DECIMAL(10,2), f FLOAT, db DOUBLE,
          b1 BIT(1), b64 BIT(64),
          e ENUM('a','b''q','c'), s SET('x','y','z'),
          dt DATE, tm TIME, tm1 TIME(1), tm2 TIME(2), tm6 TIME(6),
          dtm6 DATETIME(6), dtm0 DATETIME, ts6 TIMESTAMP(6) NULL DEFAULT NULL, y YEAR,
          vc VARCHAR(100) CHARACTER SET utf8mb4, l1 VARCHAR(300) CHARACTER SET latin1,
          ch CHAR(10) CHARACTER SET utf8mb4, bin BINARY(4), vb VARBINARY(300), bl BLOB,
          tx TEXT CHARACTER SET utf8mb4, g GEOMETRY, js JSON
        ) ENGINE=InnoDB"
    )
}

/// The INSERT of every edge row.
pub fn insert_rows(db: &str) -> String {
    let nines = format!("{}.{}", "9".repeat(35), "9".repeat(30));
    format!(
        "INSERT INTO `{db}`.edge VALUES
        (1, -128, 0, -32768, 0, -8388608, 0, -2147483648, 0, -9223372036854775808, 0,
         -{nines}, -99999999.99, -1.5, -1.7976931348623157e308,
         b'0', b'0', 'a', '', '1000-01-01', '-838:59:59', '-00:00:01.5', '-838:59:58.99',
         '-00:00:00.000001', '1000-01-01 00:00:00.000000', '1000-01-01 00:00:00',
         '1970-01-01 00:00:01.000000', 1901, '', 'café', '', x'00', x'0000', '', '',
         ST_GeomFromText('POINT(1 2)'), '{{}}'),
        (2, 127, 255, 32767, 65535, 8388607, 16777215, 2147483647, 4294967295,
         9223372036854775807, 18446744073709551615,
         {nines}, 99999999.99, 1267650600228229401496703205376, 2.2250738585072014e-308,
         b'1', b'1111111111111111111111111111111111111111111111111111111111111111',
         'c', 'x,y,z', '9999-12-31', '838:59:59', '838:59:58.9', '00:00:00.01',
         '838:59:58.999999', '9999-12-31 23:59:59.999999', '9999-12-31 23:59:59',
         '2038-01-19 03:14:07.999999', 2155, 'emoji \u{1F600} utf8mb4', '\u{20ac}uro', 'ten chars!',
         x'ff00ff', x'00ff00', x'000102ff', 'text', NULL,
         '{{\"a\":[1,2.5,null,\"x\"],\"b\":{{\"c\":true}}}}'),
        (3, 0, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
         0, 0.5, NULL, NULL, NULL, NULL, 'b''q', 'x,z', '0000-00-00', '00:00:00', NULL, NULL,
         NULL, '0000-00-00 00:00:00.000000', '0000-00-00 00:00:00', '0000-00-00 00:00:00',
         0, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL),
        (4, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
         NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
         NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL)"
    )
}

fn k(kind: Kind) -> v1::Value {
    value::of(kind)
}

fn date(year: i32, month: u32, day: u32) -> Kind {
    Kind::Date(v1::Date { year, month, day })
}

#[allow(clippy::too_many_arguments)]
fn datetime(y: i32, mo: u32, d: u32, h: u32, mi: u32, s: u32, us: u32) -> Kind {
    Kind::Datetime(v1::DateTime {
        year: y,
        month: mo,
        day: d,
        hour: h,
        minute: mi,
        second: s,
        micros: us,
    })
}

fn time(neg: bool, h: i64, m: i64, s: i64, us: i64) -> Kind {
    let t = ((h * 60 + m) * 60 + s) * 1_000_000 + us;
    Kind::TimeMicros(if neg { -t } else { t })
}

fn enum_value(index: u32, label: &str) -> Kind {
    Kind::EnumValue(v1::EnumValue {
        index,
        label: label.into(),
    })
}

fn set_value(bits: u64, members: &[&str]) -> Kind {
    Kind::SetValue(v1::SetValue {
        bits,
        members: members.iter().map(|m| m.to_string()).collect(),
    })
}

/// WKB of POINT(1 2) with SRID 0.
fn point_1_2() -> Kind {
    let mut wkb = vec![1u8, 1, 0, 0, 0];
    wkb.extend_from_slice(&1.0f64.to_le_bytes());
    wkb.extend_from_slice(&2.0f64.to_le_bytes());
    Kind::Geometry(v1::Geometry { srid: 0, wkb })
}

/// The values each row must decode to, in column order, keyed by id.
pub fn expected_rows() -> Vec<Vec<v1::Value>> {
    let nines = format!("{}.{}", "9".repeat(35), "9".repeat(30));
    let null = value::null;
    let row1 = vec![
        k(Kind::Int(1)),
        k(Kind::Int(-128)),
        k(Kind::Uint(0)),
        k(Kind::Int(-32768)),
        k(Kind::Uint(0)),
        k(Kind::Int(-8_388_608)),
        k(Kind::Uint(0)),
        k(Kind::Int(i32::MIN as i64)),
        k(Kind::Uint(0)),
        k(Kind::Int(i64::MIN)),
        k(Kind::Uint(0)),
        k(Kind::Decimal(format!("-{nines}"))),
        k(Kind::Decimal("-99999999.99".into())),
        k(Kind::Float32(-1.5)),
        k(Kind::Float64(f64::MIN)),
        k(Kind::Bits(0)),
        k(Kind::Bits(0)),
        k(enum_value(1, "a")),
        k(set_value(0, &[])),
        k(date(1000, 1, 1)),
        k(time(true, 838, 59, 59, 0)),
        k(time(true, 0, 0, 1, 500_000)),
        k(time(true, 838, 59, 58, 990_000)),
        k(time(true, 0, 0, 0, 1)),
        k(datetime(1000, 1, 1, 0, 0, 0, 0)),
        k(datetime(1000, 1, 1, 0, 0, 0, 0)),
        k(Kind::TimestampMicros(1_000_000)),
        k(Kind::Int(1901)),
        k(Kind::Text(String::new())),
        k(Kind::Text("café".into())),
        k(Kind::Text(String::new())),
        k(Kind::Bytes(vec![0, 0, 0, 0])),
        k(Kind::Bytes(vec![0, 0])),
        k(Kind::Bytes(Vec::new())),
        k(Kind::Text(String::new())),
        k(point_1_2()),
        k(Kind::Json("{}".into())),
    ];
    let row2 = vec![
        k(Kind::Int(2)),
        k(Kind::Int(127)),
        k(Kind::Uint(255)),
        k(Kind::Int(32767)),
        k(Kind::Uint(65535)),
        k(Kind::Int(8_388_607)),
        k(Kind::Uint(16_777_215)),
        k(Kind::Int(i32::MAX as i64)),
        k(Kind::Uint(u32::MAX as u64)),
        k(Kind::Int(i64::MAX)),
        k(Kind::Uint(u64::MAX)),
        k(Kind::Decimal(nines.clone())),
        k(Kind::Decimal("99999999.99".into())),
        k(Kind::Float32(2f32.powi(100))),
        k(Kind::Float64(f64::MIN_POSITIVE)),
        k(Kind::Bits(1)),
        k(Kind::Bits(u64::MAX)),
        k(enum_value(3, "c")),
        k(set_value(0b111, &["x", "y", "z"])),
        k(date(9999, 12, 31)),
        k(time(false, 838, 59, 59, 0)),
        k(time(false, 838, 59, 58, 900_000)),
        k(time(false, 0, 0, 0, 10_000)),
        k(time(false, 838, 59, 58, 999_999)),
        k(datetime(9999, 12, 31, 23, 59, 59, 999_999)),
        k(datetime(9999, 12, 31, 23, 59, 59, 0)),
        k(Kind::TimestampMicros(2_147_483_647 * 1_000_000 + 999_999)),
        k(Kind::Int(2155)),
        k(Kind::Text("emoji \u{1F600} utf8mb4".into())),
        k(Kind::Text("\u{20ac}uro".into())),
        k(Kind::Text("ten chars!".into())),
        k(Kind::Bytes(vec![0xff, 0x00, 0xff, 0x00])),
        k(Kind::Bytes(vec![0x00, 0xff, 0x00])),
        k(Kind::Bytes(vec![0x00, 0x01, 0x02, 0xff])),
        k(Kind::Text("text".into())),
        null(),
        k(Kind::Json(
            r#"{"a":[1,2.5,null,"x"],"b":{"c":true}}"#.into(),
        )),
    ];
    let mut row3 = vec![k(Kind::Int(3)), k(Kind::Int(0))];
    row3.extend((0..9).map(|_| null()));
    row3.extend([
        k(Kind::Decimal(format!("0.{}", "0".repeat(30)))),
        k(Kind::Decimal("0.50".into())),
        null(),
        null(),
        null(),
        null(),
        k(enum_value(2, "b'q")),
        k(set_value(0b101, &["x", "z"])),
        k(date(0, 0, 0)),
        k(time(false, 0, 0, 0, 0)),
        null(),
        null(),
        null(),
        k(datetime(0, 0, 0, 0, 0, 0, 0)),
        k(datetime(0, 0, 0, 0, 0, 0, 0)),
        k(Kind::TimestampMicros(0)),
        k(Kind::Int(0)),
    ]);
    row3.extend((0..9).map(|_| null()));
    let mut row4 = vec![k(Kind::Int(4))];
    row4.extend((0..36).map(|_| null()));
    vec![row1, row2, row3, row4]
}
