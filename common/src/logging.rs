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
}

impl Default for LogConfig {
    fn default() -> Self {
        Self {
            format: LogFormat::Text,
            level: "info".into(),
        }
    }
}

impl LogConfig {
    pub fn validate(&self) -> Result<(), (String, String)> {
        EnvFilter::try_new(&self.level)
            .map(|_| ())
            .map_err(|e| ("log.level".to_string(), e.to_string()))
    }
}

/// Install the global subscriber. Call once, early in `main`.
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
