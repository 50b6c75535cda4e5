//! Where a MySQL/MariaDB source is now, and how many binlog bytes a connector's stored position
//! is behind it (what a restart reads first).

use serde::Serialize;

/// A MySQL/MariaDB source's current binlog position, and how far the stored one is behind it.
#[derive(Debug, Serialize, PartialEq)]
pub struct SourceNow {
    pub position: String,
    /// Binlog bytes between the stored position and the source's: what a restart reads first
    /// (`None` when a file between them is no longer listed by the server).
    pub behind_bytes: Option<u64>,
}

/// The binlog bytes from `from` to `to` (`(file, pos)`), given the server's binlog files and
/// sizes in order (`SHOW BINARY LOGS`); `None` when `from`'s file is not among them.
pub fn binlog_bytes_between(
    logs: &[(String, u64)],
    from: (&str, u64),
    to: (&str, u64),
) -> Option<u64> {
    if from.0 == to.0 {
        return Some(to.1.saturating_sub(from.1));
    }
    let start = logs.iter().position(|(f, _)| f == from.0)?;
    let mut bytes = logs[start].1.saturating_sub(from.1);
    for (f, size) in &logs[start + 1..] {
        if f == to.0 {
            return Some(bytes + to.1);
        }
        bytes += size;
    }
    None
}

/// The source's position now, read with the capture's own config, for the connector whose
/// stored position is `at` (`file:pos`).
pub async fn mysql_source_now(
    config: &sluice_capture::mysql::MysqlConfig,
    at: &str,
) -> Result<SourceNow, String> {
    use mysql_async::prelude::Queryable;
    let mut conn = sluice_capture::mysql::connect::connect(config.opts()?)
        .await
        .map_err(|e| sluice_capture::mysql::connect_error(&e, config))?;
    let at_now = sluice_capture::mysql::binlog_position(&mut conn)
        .await
        .map_err(|e| format!("{}: {e}", config.describe()))?
        .ok_or_else(|| format!("{}: the server writes no binlog", config.describe()))?;
    let (file, pos) = (at_now.file, at_now.pos);
    let logs: Vec<mysql_async::Row> = conn
        .query("SHOW BINARY LOGS")
        .await
        .map_err(|e| format!("{}: SHOW BINARY LOGS: {e}", config.describe()))?;
    let logs: Vec<(String, u64)> = logs
        .into_iter()
        .map(|r| (r.get(0).unwrap_or_default(), r.get(1).unwrap_or(0)))
        .collect();
    let behind_bytes = at
        .rsplit_once(':')
        .and_then(|(f, p)| binlog_bytes_between(&logs, (f, p.parse().ok()?), (&file, pos)));
    let _ = conn.disconnect().await;
    Ok(SourceNow {
        position: format!("{file}:{pos}"),
        behind_bytes,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn binlog_bytes_are_counted_across_files() {
        let logs = vec![
            ("b.000001".to_string(), 1000),
            ("b.000002".to_string(), 500),
            ("b.000003".to_string(), 300),
        ];
        assert_eq!(
            binlog_bytes_between(&logs, ("b.000002", 100), ("b.000002", 450)),
            Some(350)
        );
        // The rest of the stored file, the whole files between, up to the position now.
        assert_eq!(
            binlog_bytes_between(&logs, ("b.000001", 900), ("b.000003", 40)),
            Some(640)
        );
        assert_eq!(
            binlog_bytes_between(&logs, ("b.000001", 900), ("b.000002", 4)),
            Some(104)
        );
        // A stored file the server no longer lists: unknown, not zero.
        assert_eq!(
            binlog_bytes_between(&logs, ("b.000000", 4), ("b.000003", 40)),
            None
        );
    }
}
