//! The apply stage: consumes change topics and writes them to a target.
//!
//! - [`clickhouse`]: ClickHouse tables (binary `apply-clickhouse`);
//! - [`mongo`]: MongoDB collections (binary `apply-mongo`).
//!
//! Both commit a Kafka offset only after the target acknowledged every write before it. What
//! they share: the error model ([`error`]), the consumer group's run loop and drain
//! ([`group`]), the consumer settings ([`consumer`]), the schema cache ([`schemas`]) and the
//! capture incarnations a partition has seen ([`incarnation`]).
//!
//! The stage meets the capture only at Kafka: it reads the event contract (`sluice_proto`) and
//! depends on no capture code and no MySQL client. The operator's tools that need both stand
//! above both (`sluice-ops`).

pub mod clickhouse;
pub mod consumer;
pub mod error;
pub mod group;
pub mod incarnation;
pub mod mongo;
pub mod schemas;

pub use error::{ApplyError, BadEvent, Origin, Reason};

/// Append `v` in decimal, with leading zeros to at least `width` digits (no `fmt` machinery:
/// the writers call it per value).
pub(crate) fn push_decimal(v: u64, width: usize, out: &mut Vec<u8>) {
    let mut digits = [b'0'; 20];
    let mut i = digits.len();
    let mut v = v;
    loop {
        i -= 1;
        digits[i] = b'0' + (v % 10) as u8;
        v /= 10;
        if v == 0 {
            break;
        }
    }
    let start = i.min(digits.len() - width.min(digits.len()));
    out.extend_from_slice(&digits[start..]);
}

#[cfg(test)]
mod tests {
    #[test]
    fn decimals_are_zero_padded_to_their_width_and_never_cut() {
        let text = |v: u64, width: usize| {
            let mut out = Vec::new();
            super::push_decimal(v, width, &mut out);
            String::from_utf8(out).unwrap()
        };
        assert_eq!(text(u64::MAX, 2), u64::MAX.to_string());
        assert_eq!(text(7, 3), "007");
        assert_eq!(text(0, 1), "0");
        assert_eq!(text(0, 0), "0");
        assert_eq!(text(1234, 2), "1234");
        assert_eq!(text(5, 40), format!("{:020}", 5));
    }
}
