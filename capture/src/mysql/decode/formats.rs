//! MySQL's storage formats of row values (`Field_*::pack`, `my_*_from_binary`): little- and
//! big-endian integers, the 5.6+ temporal types with their fractional seconds, DECIMAL's packed
//! digit groups, binary JSON. Each reads its bytes off the front of the row data.

use sluice_proto::v1;

/// Failure inside one column: too few bytes, or bytes that mean nothing.
pub(super) enum ColumnError {
    Short(usize),
    Invalid(String),
}
use ColumnError::{Invalid, Short};

#[inline]
pub(super) fn take<'a>(data: &mut &'a [u8], n: usize) -> Option<&'a [u8]> {
    if data.len() < n {
        return None;
    }
    let (head, tail) = data.split_at(n);
    *data = tail;
    Some(head)
}

#[inline]
pub(super) fn take_ref<'a>(data: &mut &'a [u8], n: usize) -> Result<&'a [u8], ColumnError> {
    let have = data.len();
    take(data, n).ok_or(Short(n.saturating_sub(have)))
}

#[inline]
pub(super) fn le(bytes: &[u8]) -> u64 {
    bytes
        .iter()
        .rev()
        .fold(0u64, |acc, b| (acc << 8) | u64::from(*b))
}

#[inline]
pub(super) fn be(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0u64, |acc, b| (acc << 8) | u64::from(*b))
}

/// Sign-extend the low `bytes` bytes of `v`.
#[inline]
pub(super) fn sign_extend(v: u64, bytes: usize) -> i64 {
    let shift = 64 - 8 * bytes as u32;
    ((v << shift) as i64) >> shift
}

/// Fractional-second storage bytes for a precision.
fn frac_bytes(fsp: u8) -> usize {
    (fsp as usize).div_ceil(2)
}

/// Fractional seconds stored big-endian in `frac_bytes(fsp)` bytes, as microseconds.
pub(super) fn frac_be(data: &mut &[u8], fsp: u8) -> Result<i64, ColumnError> {
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
pub(super) fn time2(data: &mut &[u8], fsp: u8) -> Result<i64, ColumnError> {
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
pub(super) fn datetime2(data: &mut &[u8], fsp: u8) -> Result<v1::DateTime, ColumnError> {
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
pub(super) fn decimal(
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
pub(super) fn json_text(bytes: &[u8]) -> Result<String, ColumnError> {
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

/// MariaDB's INET4 bytes (network order) as it prints them.
pub(super) fn inet4_text(b: &[u8]) -> String {
    format!("{}.{}.{}.{}", b[0], b[1], b[2], b[3])
}

/// MariaDB's INET6 bytes (network order) as it prints them (checked against MariaDB 10.11):
/// lowercase groups without leading zeros, the longest run of zero groups (the first of equal
/// ones, a single group too) as `::`; IPv4-mapped (`::ffff:a.b.c.d`) and IPv4-compatible
/// addresses (96 zero bits, then a first 16-bit group that is not zero: `::1.2.3.4`, while
/// `::2` stays `::2`) end in the dotted IPv4 form.
pub(super) fn inet6_text(b: &[u8]) -> String {
    let v4 = || format!("{}.{}.{}.{}", b[12], b[13], b[14], b[15]);
    if b[..10].iter().all(|x| *x == 0) && b[10] == 0xff && b[11] == 0xff {
        return format!("::ffff:{}", v4());
    }
    if b[..12].iter().all(|x| *x == 0) && (b[12] != 0 || b[13] != 0) {
        return format!("::{}", v4());
    }
    let groups: Vec<u16> = b
        .chunks(2)
        .map(|g| u16::from_be_bytes([g[0], g[1]]))
        .collect();
    // The longest run of zero groups, the first of equal ones.
    let (mut best, mut best_len, mut i) = (0, 0, 0);
    while i < 8 {
        if groups[i] == 0 {
            let start = i;
            while i < 8 && groups[i] == 0 {
                i += 1;
            }
            if i - start > best_len {
                (best, best_len) = (start, i - start);
            }
        } else {
            i += 1;
        }
    }
    let hex = |gs: &[u16]| {
        gs.iter()
            .map(|g| format!("{g:x}"))
            .collect::<Vec<_>>()
            .join(":")
    };
    if best_len == 0 {
        return hex(&groups);
    }
    format!(
        "{}::{}",
        hex(&groups[..best]),
        hex(&groups[best + best_len..])
    )
}

/// MariaDB's UUID bytes as it prints them: 8-4-4-4-12 lowercase hex digits (MariaDB 10.11
/// logs the value in that order, as the test bed shows).
pub(super) fn uuid_text(b: &[u8]) -> String {
    let h: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &h[..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..]
    )
}

#[cfg(test)]
mod mariadb_type_tests {
    use super::*;

    fn v6(text: &str) -> String {
        let ip: std::net::Ipv6Addr = text.parse().unwrap();
        inet6_text(&ip.octets())
    }

    /// What MariaDB 10.11 prints for each (`CAST(CAST(a AS INET6) AS CHAR)`).
    #[test]
    fn inet6_as_mariadb_prints_it() {
        for (a, want) in [
            ("::", "::"),
            ("::1", "::1"),
            ("::0.0.0.2", "::2"),
            ("::1.2.3.4", "::1.2.3.4"),
            ("::0.1.0.0", "::0.1.0.0"),
            ("::0.0.1.0", "::100"),
            ("::ffff:1.2.3.4", "::ffff:1.2.3.4"),
            ("::ffff:0:1", "::ffff:0.0.0.1"),
            ("1::", "1::"),
            ("1:0:0:1:0:0:0:1", "1:0:0:1::1"),
            ("1:0:0:1:0:0:1:1", "1::1:0:0:1:1"),
            ("1:0:1:1:1:1:1:1", "1::1:1:1:1:1:1"),
            ("0:0:1::", "0:0:1::"),
            ("fe80::1:0:0:0", "fe80::1:0:0:0"),
            ("::fffe:1.2.3.4", "::fffe:102:304"),
            ("0:0:0:0:0:1:0:1", "::1:0:1"),
            ("::1:0:0:0:0", "0:0:0:1::"),
            ("1:0:0:0:1:0:0:0", "1::1:0:0:0"),
            ("64:ff9b::1.2.3.4", "64:ff9b::102:304"),
            (
                "abcd:ef01:2345:6789:abcd:ef01:2345:6789",
                "abcd:ef01:2345:6789:abcd:ef01:2345:6789",
            ),
        ] {
            assert_eq!(v6(a), want, "{a}");
        }
    }

    #[test]
    fn inet4_and_uuid() {
        assert_eq!(inet4_text(&[127, 0, 0, 1]), "127.0.0.1");
        let u = [
            0x6c, 0xcd, 0x78, 0x0c, 0xba, 0xba, 0x10, 0x26, 0x95, 0x64, 0x5b, 0x8c, 0x65, 0x60,
            0x24, 0xdb,
        ];
        assert_eq!(uuid_text(&u), "6ccd780c-baba-1026-9564-5b8c656024db");
    }
}
