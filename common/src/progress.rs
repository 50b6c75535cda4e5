//! The progress line: every `[log] progress_interval_s` (default 60, 0 turns it off) a running
//! binary logs one INFO line, `progress: ...`, saying how things go: where the capture stands
//! in its source, how many events or rows went by and at what rate, the lag, the snapshot under
//! way; for an apply stage the rows written, the messages still to read, the lag, its
//! partitions and dead letters.
//!
//! The line is read from the process's own metrics registry, so it says exactly what
//! `/metrics` says (no second count to drift from the first). A metric with labels is summed
//! over its series; one the process has not registered (another binary's) is left out.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use prometheus::proto::{MetricFamily, MetricType};
use prometheus::Registry;

use crate::Shutdown;

/// One item of the line.
#[derive(Debug, Clone, Copy)]
pub enum Item {
    /// `name=value` of a gauge (or counter), summed over its series.
    Value(&'static str, &'static str),
    /// `name=total (rate/s)` of a counter, the rate since the last line.
    Rate(&'static str, &'static str),
}

/// What each binary's line says.
pub fn items(binary: &str) -> &'static [Item] {
    use Item::*;
    const CAPTURE: &[Item] = &[
        Value("binlog_file", "sluice_capture_binlog_file_number"),
        Value("binlog_offset", "sluice_capture_binlog_offset_bytes"),
        Value("oplog_time", "sluice_capture_oplog_time_seconds"),
        Rate("events", "sluice_capture_events_total"),
        Value("lag_s", "sluice_capture_lag_seconds"),
        Rate("snapshot_rows", "sluice_capture_snapshot_rows_total"),
        Value(
            "snapshot_tables_left",
            "sluice_capture_snapshot_tables_remaining",
        ),
        Rate("errors", "sluice_capture_errors_total"),
    ];
    const APPLY: &[Item] = &[
        Rate("rows", "sluice_apply_rows_total"),
        Value("behind_messages", "sluice_apply_consumer_lag_messages"),
        Value("lag_s", "sluice_apply_lag_seconds"),
        Value("partitions", "sluice_apply_assigned_partitions"),
        Rate("dead_letters", "sluice_apply_dead_letters_total"),
        Rate("retries", "sluice_apply_retries_total"),
    ];
    if binary.starts_with("capture") {
        CAPTURE
    } else {
        APPLY
    }
}

/// Log the line every `interval` until shutdown.
pub async fn run(binary: &'static str, registry: Registry, interval: Duration, shutdown: Shutdown) {
    let mut last: HashMap<&'static str, f64> = HashMap::new();
    let mut at = Instant::now();
    loop {
        tokio::select! {
            _ = shutdown.wait() => return,
            _ = tokio::time::sleep(interval) => {}
        }
        let now = Instant::now();
        let line = line(
            items(binary),
            &registry.gather(),
            &mut last,
            now.duration_since(at),
        );
        at = now;
        tracing::info!("progress: {line}");
    }
}

/// The line's text from `families`; `last` holds each counter's value at the previous line
/// (updated), `elapsed` the time since.
pub fn line(
    items: &[Item],
    families: &[MetricFamily],
    last: &mut HashMap<&'static str, f64>,
    elapsed: Duration,
) -> String {
    let mut parts = Vec::new();
    for item in items {
        let (Item::Value(name, metric) | Item::Rate(name, metric)) = *item;
        let Some(value) = sum(families, metric) else {
            continue;
        };
        match item {
            Item::Value(..) => parts.push(format!("{name}={}", number(value))),
            Item::Rate(..) => {
                let before = last.insert(metric, value);
                let secs = elapsed.as_secs_f64();
                let rate = match before {
                    Some(b) if secs > 0.0 => (value - b).max(0.0) / secs,
                    _ => 0.0,
                };
                parts.push(format!("{name}={} ({}/s)", number(value), number(rate)));
            }
        }
    }
    parts.join(" ")
}

/// A metric's value summed over its series; `None` when the process has no such metric.
fn sum(families: &[MetricFamily], name: &str) -> Option<f64> {
    let family = families.iter().find(|f| f.name() == name)?;
    let kind = family.get_field_type();
    Some(
        family
            .get_metric()
            .iter()
            .map(|m| match kind {
                MetricType::COUNTER => m.get_counter().get_value(),
                MetricType::GAUGE => m.get_gauge().get_value(),
                _ => 0.0,
            })
            .sum(),
    )
}

/// Whole numbers as such, others with one decimal.
fn number(v: f64) -> String {
    if v.fract() == 0.0 && v.abs() < 1e15 {
        format!("{}", v as i64)
    } else {
        format!("{v:.1}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus::{IntCounterVec, IntGauge, Opts};

    #[test]
    fn the_line_reads_the_registry_and_rates_the_counters() {
        let registry = Registry::new();
        let events = IntCounterVec::new(
            Opts::new("sluice_capture_events_total", "events"),
            &["database", "table"],
        )
        .unwrap();
        let file = IntGauge::new("sluice_capture_binlog_file_number", "file").unwrap();
        registry.register(Box::new(events.clone())).unwrap();
        registry.register(Box::new(file.clone())).unwrap();
        events.with_label_values(&["db", "a"]).inc_by(100);
        events.with_label_values(&["db", "b"]).inc_by(20);
        file.set(3);
        let capture = items("capture-mysql");
        let mut last = HashMap::new();
        let first = line(
            capture,
            &registry.gather(),
            &mut last,
            Duration::from_secs(60),
        );
        // Summed over the series; metrics the process lacks are left out.
        assert_eq!(first, "binlog_file=3 events=120 (0/s)");
        events.with_label_values(&["db", "a"]).inc_by(30);
        let second = line(
            capture,
            &registry.gather(),
            &mut last,
            Duration::from_secs(10),
        );
        assert_eq!(second, "binlog_file=3 events=150 (3/s)");
        assert!(items("apply-clickhouse")
            .iter()
            .any(|i| matches!(i, Item::Rate("rows", _))));
    }
}
