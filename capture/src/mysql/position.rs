//! Binlog positions, and where in the binlog a capture without a checkpoint starts
//! (`[mysql] start`). The checkpoint that stores a position is in [`crate::checkpoint::mysql`].

use serde::{Deserialize, Serialize};

/// A binlog coordinate: file and byte offset.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct BinlogPos {
    pub file: String,
    pub pos: u64,
}

impl std::fmt::Display for BinlogPos {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}", self.file, self.pos)
    }
}

/// `[mysql] start`: where a capture without a checkpoint begins.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Start {
    /// The end of the binlog now: only changes from now on.
    End,
    /// The oldest binlog file the server still has.
    Earliest,
    /// A file and offset, `mysql-bin.000042:1234`.
    At(BinlogPos),
    /// A GTID set: MySQL `uuid:1-100,...`, MariaDB `0-1-100,...`; the capture starts after it.
    Gtid(String),
    /// The first transaction committed at or after this time (seconds since the epoch).
    Timestamp(u64),
}

impl Start {
    /// Parse `end`, `earliest`, `file:pos`, `gtid:SET`, `time:SECONDS` or `time:RFC3339`.
    pub fn parse(s: &str) -> Result<Self, String> {
        let s = s.trim();
        match s {
            "end" => return Ok(Start::End),
            "earliest" => return Ok(Start::Earliest),
            _ => {}
        }
        if let Some(set) = s.strip_prefix("gtid:") {
            if set.trim().is_empty() {
                return Err("gtid: needs a GTID set".into());
            }
            return Ok(Start::Gtid(set.trim().to_string()));
        }
        if let Some(t) = s.strip_prefix("time:") {
            return sluice_common::civil::parse_epoch_seconds(t.trim()).map(Start::Timestamp);
        }
        if let Some((file, pos)) = s.rsplit_once(':') {
            let pos: u64 = pos
                .parse()
                .map_err(|_| format!("{pos:?} is not a binlog offset"))?;
            if file.is_empty() || pos < 4 {
                return Err("expected FILE:POS with POS >= 4".into());
            }
            sluice_proto::binlog_file_seq(file).map_err(|e| e.to_string())?;
            return Ok(Start::At(BinlogPos {
                file: file.to_string(),
                pos,
            }));
        }
        Err(format!(
            "{s:?}: expected end, earliest, FILE:POS, gtid:SET or time:SECONDS|RFC3339"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn starts_parse() {
        assert_eq!(Start::parse("end"), Ok(Start::End));
        assert_eq!(Start::parse("earliest"), Ok(Start::Earliest));
        assert_eq!(
            Start::parse("mysql-bin.000042:1234"),
            Ok(Start::At(BinlogPos {
                file: "mysql-bin.000042".into(),
                pos: 1234
            }))
        );
        assert_eq!(
            Start::parse("gtid:0-1-100"),
            Ok(Start::Gtid("0-1-100".into()))
        );
        assert_eq!(Start::parse("time:86400"), Ok(Start::Timestamp(86400)));
        assert_eq!(
            Start::parse("time:2024-02-29T12:00:00Z"),
            Ok(Start::Timestamp(1_709_208_000))
        );
        assert!(Start::parse("mysql-bin:12").is_err());
        assert!(Start::parse("bin.000001:2").is_err());
        assert!(Start::parse("gtid:").is_err());
        assert!(Start::parse("yesterday").is_err());
        assert!(Start::parse("time:2024-02-29 12:00").is_err());
    }
}
