use super::super::types::Span;
use super::*;
use sluice_proto::v1::{value::Kind, ColumnType, Value};
use sluice_proto::value;

fn col(ty: ColumnType) -> Column {
    Column {
        name: "c".into(),
        r#type: ty as i32,
        ..Default::default()
    }
}

fn enc(v: Value, c: &Column, t: &ChType) -> Result<Vec<u8>, String> {
    let mut out = Vec::new();
    encode(ValueRef::from(&v), c, t, &mut out).map(|_| out)
}

#[test]
fn times_as_text_are_zero_padded_signed_and_cut_to_their_precision() {
    let t = |us: i64, fsp: u32| {
        let c = Column {
            fsp,
            ..col(ColumnType::Time)
        };
        text(&ValueRef::TimeMicros(us), &c)
    };
    assert_eq!(t(1_000_000, 0), "00:00:01");
    assert_eq!(t(0, 0), "00:00:00");
    assert_eq!(t((838 * 3600 + 59 * 60 + 59) * 1_000_000, 0), "838:59:59");
    assert_eq!(t(-(3600 + 2) * 1_000_000 - 5, 6), "-01:00:02.000005");
    assert_eq!(t(12 * 1_000_000 + 340_000, 2), "00:00:12.34");
    assert_eq!(t(7, 3), "00:00:00.000");
}

#[test]
fn integers_are_range_checked() {
    let c = col(ColumnType::Bigint);
    assert_eq!(
        enc(value::uint(u64::MAX), &c, &ChType::UInt(64)).unwrap(),
        vec![0xff; 8]
    );
    let e = enc(value::uint(u64::MAX), &c, &ChType::Int(64)).unwrap_err();
    assert!(e.contains("out of range for Int64"), "{e}");
    assert_eq!(
        enc(value::int(-1), &c, &ChType::Int(8)).unwrap(),
        vec![0xff]
    );
    assert!(enc(value::int(-1), &c, &ChType::UInt(8)).is_err());
}

#[test]
fn decimals_are_exact() {
    let c = col(ColumnType::Decimal);
    let t = ChType::Decimal {
        precision: 10,
        scale: 2,
    };
    assert_eq!(
        enc(value::decimal("-12.50"), &c, &t).unwrap(),
        (-1250i64).to_le_bytes().to_vec()
    );
    assert!(enc(value::decimal("1.005"), &c, &t)
        .unwrap_err()
        .contains("decimal places"));
    assert!(enc(value::decimal("123456789.00"), &c, &t)
        .unwrap_err()
        .contains("does not fit"));
    let wide = ChType::Decimal {
        precision: 38,
        scale: 30,
    };
    let v = enc(
        value::decimal("-12345678.123456789012345678901234567890"),
        &c,
        &wide,
    )
    .unwrap();
    assert_eq!(
        i128::from_le_bytes(v.try_into().unwrap()),
        -12345678_123456789012345678901234567890i128
    );
}

#[test]
fn temporal_values_keep_or_refuse_their_precision() {
    let mut c = col(ColumnType::Datetime);
    c.fsp = 6;
    let dt = |micros| {
        value::of(Kind::Datetime(sluice_proto::v1::DateTime {
            year: 2024,
            month: 2,
            day: 29,
            hour: 12,
            minute: 0,
            second: 1,
            micros,
        }))
    };
    assert_eq!(
        enc(dt(0), &c, &ChType::DateTime(Span::DATETIME)).unwrap(),
        1_709_208_001u32.to_le_bytes().to_vec()
    );
    assert!(enc(dt(5), &c, &ChType::DateTime(Span::DATETIME))
        .unwrap_err()
        .contains("fractional"));
    assert_eq!(
        enc(dt(5), &c, &ChType::DateTime64(6, Span::FULL)).unwrap(),
        1_709_208_001_000_005i64.to_le_bytes().to_vec()
    );
    let s = enc(dt(5), &c, &ChType::String).unwrap();
    assert_eq!(&s[1..], b"2024-02-29 12:00:01.000005");
    let old = value::of(Kind::Date(sluice_proto::v1::Date {
        year: 1969,
        month: 12,
        day: 31,
    }));
    let e = enc(
        old.clone(),
        &col(ColumnType::Date),
        &ChType::Date(Span::DATE),
    )
    .unwrap_err();
    assert!(
        e.contains("1969-12-31 is outside what ClickHouse Date holds")
            && e.contains("(1970-01-01 .. 2149-06-06)")
            && e.contains("temporal_tables"),
        "{e}"
    );
    // Date32 on a current server holds it, as days before the epoch.
    assert_eq!(
        enc(old, &col(ColumnType::Date), &ChType::Date32(Span::FULL)).unwrap(),
        (-1i32).to_le_bytes().to_vec()
    );
    let mut t = col(ColumnType::Time);
    t.fsp = 2;
    let s = enc(value::of(Kind::TimeMicros(-1_500_000)), &t, &ChType::String).unwrap();
    assert_eq!(&s[1..], b"-00:00:01.50");
}

fn date(year: i32, month: u32, day: u32) -> Value {
    value::of(Kind::Date(sluice_proto::v1::Date { year, month, day }))
}

#[test]
fn dates_hold_their_span_or_are_refused() {
    let c = col(ColumnType::Date);
    let d32 = |span| ChType::Date32(span);
    // MySQL's whole range on 26.8+; only 1900..2299 before.
    for (y, m, d, days) in [(1000, 1, 1, -354_285i32), (9999, 12, 31, 2_932_896)] {
        assert_eq!(
            enc(date(y, m, d), &c, &d32(Span::FULL)).unwrap(),
            days.to_le_bytes().to_vec()
        );
        assert!(enc(date(y, m, d), &c, &d32(Span::WIDE_1900)).is_err());
    }
    // 18.16 prints days past 2106-02-07 as 1970-01-01: refused there.
    let old = ChType::Date(Span::DATE_OLD);
    assert_eq!(
        enc(date(2106, 2, 7), &c, &old).unwrap(),
        49_710u16.to_le_bytes().to_vec()
    );
    assert!(enc(date(2106, 2, 8), &c, &old).is_err());
    assert!(enc(date(2149, 6, 6), &c, &ChType::Date(Span::DATE)).is_ok());
    // The zero date is day 0; partial and invalid dates are refused, never moved.
    assert_eq!(enc(date(0, 0, 0), &c, &old).unwrap(), vec![0, 0]);
    for (y, m, d, why) in [
        (2026, 2, 30, "not a day of the calendar"),
        (2026, 4, 31, "not a day of the calendar"),
        (2025, 2, 29, "not a day of the calendar"),
        (2026, 0, 15, "partial date"),
        (2026, 5, 0, "partial date"),
        (0, 0, 1, "partial date"),
    ] {
        let e = enc(date(y, m, d), &c, &d32(Span::FULL)).unwrap_err();
        assert!(
            e.contains(why) && e.contains(&format!("{y:04}-{m:02}-{d:02}")),
            "{e}"
        );
    }
    assert!(enc(date(2024, 2, 29), &c, &d32(Span::FULL)).is_ok());
    // As text: exactly as MySQL prints it, whatever it is.
    assert_eq!(
        &enc(date(2026, 2, 30), &c, &ChType::String).unwrap()[1..],
        b"2026-02-30"
    );
    assert_eq!(
        &enc(date(0, 0, 0), &c, &ChType::String).unwrap()[1..],
        b"0000-00-00"
    );
}

#[test]
fn datetimes_hold_their_span_or_are_refused() {
    let c = col(ColumnType::Datetime);
    let dt = |year, month, day, hour, minute, second| {
        value::of(Kind::Datetime(sluice_proto::v1::DateTime {
            year,
            month,
            day,
            hour,
            minute,
            second,
            micros: 0,
        }))
    };
    let old = ChType::DateTime(Span::DATETIME_OLD);
    assert!(enc(dt(2106, 2, 6, 23, 59, 59), &c, &old).is_ok());
    assert!(enc(dt(2106, 2, 7, 0, 0, 0), &c, &old).is_err());
    let now = ChType::DateTime(Span::DATETIME);
    assert!(enc(dt(2106, 2, 7, 6, 28, 15), &c, &now).is_ok());
    assert!(enc(dt(2106, 2, 7, 6, 28, 16), &c, &now).is_err());
    assert!(enc(dt(1969, 12, 31, 23, 59, 59), &c, &now).is_err());
    let wide = ChType::DateTime64(0, Span::FULL);
    assert_eq!(
        enc(dt(1000, 1, 1, 0, 0, 0), &c, &wide).unwrap(),
        (-30_610_224_000i64).to_le_bytes().to_vec()
    );
    assert_eq!(
        enc(dt(0, 0, 0, 0, 0, 0), &c, &wide).unwrap(),
        0i64.to_le_bytes().to_vec()
    );
    assert!(enc(dt(2026, 2, 30, 1, 2, 3), &c, &wide)
        .unwrap_err()
        .contains("not a day of the calendar"));
    // A zero date with a time of day (MySQL without NO_ZERO_DATE) is no instant.
    assert!(enc(dt(0, 0, 0, 10, 0, 0), &c, &wide)
        .unwrap_err()
        .contains("zero date with a time of day"));
    assert!(enc(dt(0, 0, 0, 10, 0, 0), &c, &old)
        .unwrap_err()
        .contains("0000-00-00 10:00:00"));
    assert!(enc(
        dt(9999, 12, 31, 23, 59, 59),
        &c,
        &ChType::DateTime64(0, Span::WIDE_1900)
    )
    .unwrap_err()
    .contains("1900-01-01 .. 2299-12-31"));
}

#[test]
fn wide_decimals_are_256_bit() {
    let c = col(ColumnType::Decimal);
    let t = ChType::Decimal {
        precision: 65,
        scale: 30,
    };
    let nines = format!("{}.{}", "9".repeat(35), "9".repeat(30));
    let got = enc(value::decimal(&nines), &c, &t).unwrap();
    assert_eq!(got.len(), 32);
    // 10^65 - 1, little-endian over 256 bits.
    let mut want = [0u64; 4];
    for _ in 0..65 {
        let mut carry = 9u128;
        for l in want.iter_mut() {
            let x = u128::from(*l) * 10 + carry;
            *l = x as u64;
            carry = x >> 64;
        }
    }
    let want: Vec<u8> = want.iter().flat_map(|l| l.to_le_bytes()).collect();
    assert_eq!(got, want);
    let neg = enc(value::decimal(format!("-{nines}")), &c, &t).unwrap();
    // -x is !x + 1: x + (-x) is 0 over 256 bits.
    let (mut carry, mut sum) = (0u16, Vec::new());
    for (a, b) in got.iter().zip(&neg) {
        let s = u16::from(*a) + u16::from(*b) + carry;
        sum.push(s as u8);
        carry = s >> 8;
    }
    assert_eq!(sum, vec![0u8; 32]);
    let unit = format!("-0.{}1", "0".repeat(29));
    assert_eq!(
        enc(value::decimal(&unit), &c, &t).unwrap(),
        vec![0xff; 32],
        "-1 (scaled) is all ones"
    );
}

#[test]
fn mariadb_addresses_and_uuids() {
    let c = col(ColumnType::Char);
    assert_eq!(
        enc(value::text("127.0.0.1"), &c, &ChType::IPv4).unwrap(),
        0x7f00_0001u32.to_le_bytes().to_vec()
    );
    let v6 = enc(value::text("2001:db8::1"), &c, &ChType::IPv6).unwrap();
    assert_eq!(v6[..4], [0x20, 0x01, 0x0d, 0xb8]);
    assert_eq!(v6[15], 1);
    let u = enc(
        value::text("00112233-4455-6677-8899-aabbccddeeff"),
        &c,
        &ChType::Uuid,
    )
    .unwrap();
    assert_eq!(
        u,
        [
            0x77, 0x66, 0x55, 0x44, 0x33, 0x22, 0x11, 0x00, 0xff, 0xee, 0xdd, 0xcc, 0xbb, 0xaa,
            0x99, 0x88
        ]
    );
    assert!(enc(value::text("1.2.3"), &c, &ChType::IPv4).is_err());
    assert!(enc(value::text("0011-2233"), &c, &ChType::Uuid).is_err());
}

#[test]
fn nullable_and_strings() {
    let c = col(ColumnType::Varchar);
    let t = ChType::Nullable(Box::new(ChType::String));
    assert_eq!(enc(value::null(), &c, &t).unwrap(), vec![1]);
    assert_eq!(
        enc(value::text("hé"), &c, &t).unwrap(),
        vec![0, 3, b'h', 0xc3, 0xa9]
    );
    assert!(enc(value::null(), &c, &ChType::String)
        .unwrap_err()
        .contains("NULL"));
    assert_eq!(
        enc(value::bytes(vec![0, 255]), &c, &ChType::String).unwrap(),
        vec![2, 0, 255]
    );
    // Text written in place: its length prefix takes two bytes past 127.
    let members: Vec<String> = (0..40).map(|i| format!("member{i:02}")).collect();
    let set = value::of(Kind::SetValue(sluice_proto::v1::SetValue {
        bits: u64::MAX >> 24,
        members: members.clone(),
    }));
    let joined = members.join(",");
    assert_eq!(joined.len(), 359);
    let mut want = vec![0xe7, 0x02]; // 359 as LEB128
    want.extend_from_slice(joined.as_bytes());
    assert_eq!(
        enc(set, &col(ColumnType::Set), &ChType::String).unwrap(),
        want
    );
    let s = enc(value::of(Kind::Int(-42)), &c, &ChType::String).unwrap();
    assert_eq!(s, b"\x03-42");
}

#[test]
fn a_zero_date_is_no_key_in_a_date_type_and_is_one_as_text() {
    let zero = value::of(Kind::Date(sluice_proto::v1::Date {
        year: 0,
        month: 0,
        day: 0,
    }));
    let epoch = value::of(Kind::Date(sluice_proto::v1::Date {
        year: 1970,
        month: 1,
        day: 1,
    }));
    let zero_dt = value::of(Kind::Datetime(sluice_proto::v1::DateTime::default()));
    for t in [
        ChType::Date(Span::DATE),
        ChType::Date32(Span::FULL),
        ChType::DateTime(Span::DATE),
        ChType::DateTime64(6, Span::FULL),
    ] {
        let why = inexact_key(&ValueRef::from(&zero), &t)
            .or_else(|| inexact_key(&ValueRef::from(&zero_dt), &t))
            .unwrap_or_else(|| panic!("{t:?}: a zero date key taken"));
        assert!(
            why.contains("1970-01-01") && why.contains("\"text\""),
            "{why}"
        );
        assert_eq!(inexact_key(&ValueRef::from(&epoch), &t), None);
    }
    assert_eq!(inexact_key(&ValueRef::from(&zero), &ChType::String), None);
}

#[test]
fn a_value_not_held_takes_as_many_bytes_as_a_value_of_its_type() {
    // Each type with a value it holds: the marked stand-in must be as wide, or every later
    // column of the row would be read from the wrong bytes.
    let date = Value {
        kind: Some(Kind::Date(sluice_proto::v1::Date {
            year: 2020,
            month: 1,
            day: 2,
        })),
    };
    let cases: Vec<(ChType, Value, ColumnType)> = vec![
        (ChType::Int(8), value::int(1), ColumnType::Tinyint),
        (ChType::UInt(64), value::uint(1), ColumnType::Bigint),
        (ChType::Int(32), value::int(1), ColumnType::Int),
        (ChType::Float64, value::int(1), ColumnType::Int),
        (
            ChType::Decimal {
                precision: 9,
                scale: 2,
            },
            value::int(1),
            ColumnType::Int,
        ),
        (
            ChType::Decimal {
                precision: 38,
                scale: 2,
            },
            value::int(1),
            ColumnType::Int,
        ),
        (ChType::FixedString(4), value::text("ab"), ColumnType::Char),
        (ChType::Date(Span::DATE_OLD), date.clone(), ColumnType::Date),
        (ChType::Date32(Span::FULL), date, ColumnType::Date),
        (ChType::IPv4, value::text("1.2.3.4"), ColumnType::Inet4),
        (ChType::IPv6, value::text("::1"), ColumnType::Inet6),
        (
            ChType::Uuid,
            value::text("00112233-4455-6677-8899-aabbccddeeff"),
            ColumnType::Uuid,
        ),
        (
            ChType::Enum(vec![("a".into(), 1)], 8),
            value::int(1),
            ColumnType::Int,
        ),
    ];
    for (t, v, ty) in cases {
        let c = col(ty);
        let written = if let ChType::Enum(..) = t {
            vec![1u8]
        } else {
            enc(v, &c, &t).unwrap_or_else(|e| panic!("{}: {e}", t.sql()))
        };
        let mut marked = Vec::new();
        put_unheld(&t, &mut marked);
        assert_eq!(marked.len(), written.len(), "{}", t.sql());
        assert!(marked.iter().all(|b| *b == 0) || matches!(t, ChType::Enum(..)));
    }
    // NULL where the column is Nullable; '' for String; the Enum's first member.
    let mut out = Vec::new();
    put_unheld(
        &ChType::Nullable(Box::new(ChType::Date(Span::DATE_OLD))),
        &mut out,
    );
    put_unheld(&ChType::String, &mut out);
    put_unheld(
        &ChType::Enum(vec![("x".into(), 5), ("y".into(), 6)], 16),
        &mut out,
    );
    assert_eq!(out, [1, 0, 5, 0]);
    let mut out = Vec::new();
    put_strings(&["d", "dn"], &mut out);
    assert_eq!(out, [2, 1, b'd', 2, b'd', b'n']);
}

#[test]
fn only_the_zero_date_into_a_date_type_is_the_zero_date() {
    let d = |y, m, day| Value {
        kind: Some(Kind::Date(sluice_proto::v1::Date {
            year: y,
            month: m,
            day,
        })),
    };
    let date = ChType::Nullable(Box::new(ChType::Date(Span::DATE_OLD)));
    assert!(zero_date(&ValueRef::from(&d(0, 0, 0)), &date));
    assert!(!zero_date(&ValueRef::from(&d(2020, 0, 1)), &date));
    assert!(!zero_date(&ValueRef::from(&d(0, 0, 0)), &ChType::String));
}

#[test]
fn only_dates_into_date_columns_may_be_marked() {
    let d = Value {
        kind: Some(Kind::Date(sluice_proto::v1::Date {
            year: 2026,
            month: 2,
            day: 30,
        })),
    };
    let date = ChType::Nullable(Box::new(ChType::Date(Span::DATE_OLD)));
    assert!(date_into_date(&ValueRef::from(&d), &date));
    // A value of another kind, or into another type: the target's shape, never marked.
    assert!(!date_into_date(&ValueRef::from(&value::int(1)), &date));
    assert!(!date_into_date(
        &ValueRef::Null,
        &ChType::Date(Span::DATE_OLD)
    ));
    assert!(!date_into_date(&ValueRef::from(&d), &ChType::Int(32)));
}
