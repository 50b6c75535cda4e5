//! The wall clock, as the contract writes it (microseconds since the UNIX epoch).

use std::time::{SystemTime, UNIX_EPOCH};

/// Microseconds since the epoch now; 0 on a clock set before 1970.
pub fn now_micros() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros() as i64)
        .unwrap_or(0)
}

/// Whole seconds since the epoch now; 0 on a clock set before 1970.
pub fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    #[test]
    fn micros_and_seconds_agree() {
        let (s, m) = (super::now_secs() as i64, super::now_micros());
        // After 2020 and within a second of each other.
        assert!(s > 1_577_836_800, "{s}");
        assert!((m / 1_000_000 - s).abs() <= 1, "{m} vs {s}");
    }
}
