//! Structured logs on stderr: human-readable text or one JSON object per line.

use serde::{Deserialize, Serialize};
use tracing_subscriber::EnvFilter;

#[derive(Debug, Clone, Copy, Deserialize, Serialize, PartialEq, Eq, Default)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Text,
    /// One JSON object per line, for log shippers.
    Json,
}

/// `[log]`: how the process logs.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, default)]
pub struct LogConfig {
    /// `text` or `json`. Default `text`.
    pub format: LogFormat,
    /// A tracing filter, e.g. `info` or `info,sluice_capture=debug`. `RUST_LOG`, when set,
    /// wins. Default `info`.
    pub level: String,
    /// Seconds between two `progress:` lines (position, rates, lag: see
    /// [`crate::progress`]); 0 turns them off. Default 60.
    pub progress_interval_s: u64,
}

impl Default for LogConfig {
    fn default() -> Self {
        Self {
            format: LogFormat::Text,
            level: "info".into(),
            progress_interval_s: 60,
        }
    }
}

impl LogConfig {
    pub fn validate(&self) -> Result<(), (String, String)> {
        check_filter(&self.level).map_err(|e| ("log.level".to_string(), e))
    }
}

/// The level names a filter takes.
const LEVELS: &str = "trace, debug, info, warn, error, off";

/// Check a log filter (`[log] level` or `RUST_LOG`): each comma-separated directive is a level,
/// or `target=level`. A bare word that is no level (`warning`, `verbose`) would be taken for a
/// target and silence every other line, the errors included: it is refused, with the levels.
pub fn check_filter(filter: &str) -> Result<(), String> {
    use tracing_subscriber::filter::LevelFilter;
    for d in filter.split(',').map(str::trim).filter(|d| !d.is_empty()) {
        let is_level = |l: &str| l.parse::<LevelFilter>().is_ok();
        match d.rsplit_once('=') {
            None if is_level(d) => {}
            None => {
                return Err(format!(
                    "{d:?} is not a level: the levels are {LEVELS} (or `target=level`, e.g. \
                     `info,sluice_capture=debug`)"
                ))
            }
            // A span filter (`target[span{field=value}]`) holds `=` inside its brackets.
            Some(_) if d.ends_with(']') => {}
            Some((target, level)) if !is_level(level) => {
                return Err(format!(
                    "{level:?} (for {target:?}) is not a level: the levels are {LEVELS}"
                ))
            }
            Some(_) => {}
        }
    }
    EnvFilter::try_new(filter)
        .map(|_| ())
        .map_err(|e| e.to_string())
}

/// `RUST_LOG`, when set, checked as [`check_filter`] checks `[log] level`.
pub fn check_env() -> Result<(), String> {
    match std::env::var("RUST_LOG") {
        Ok(v) => check_filter(&v).map_err(|e| format!("RUST_LOG={v:?}: {e}")),
        Err(_) => Ok(()),
    }
}

/// Install the global subscriber. Call once, early in `main`, after [`check_env`].
pub fn init(config: &LogConfig) {
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(&config.level));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_target(true);
    let _ = match config.format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_word_that_is_no_level_is_refused_with_the_levels() {
        for ok in [
            "info",
            "WARN",
            "off",
            "info,sluice_capture=debug",
            "sluice_apply::group=trace",
            "h2[conn{id=1}]",
        ] {
            assert_eq!(check_filter(ok), Ok(()), "{ok}");
        }
        for (bad, named) in [
            ("warning", "\"warning\""),
            ("verbose", "\"verbose\""),
            ("info,sluice_capture=loud", "\"loud\""),
        ] {
            let e = check_filter(bad).unwrap_err();
            assert!(e.contains(named) && e.contains(LEVELS), "{bad}: {e}");
        }
        let config = LogConfig {
            level: "warning".into(),
            ..Default::default()
        };
        assert_eq!(config.validate().unwrap_err().0, "log.level");
    }
}
