//! Preflight checks: what a binary verifies before it starts (and prints for `--check`).
//!
//! Each check names what it looked at and says what it found, or why it failed and what to do.

use std::process::ExitCode;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    Pass(String),
    /// Works, but not as recommended.
    Warn(String),
    Fail(String),
    /// Not ready, and worth waiting for: a server unreachable for a deployment that has run
    /// before (a restart during an outage). The binary waits, with backoff, degraded.
    Wait(String),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Check {
    pub name: String,
    pub outcome: Outcome,
}

impl Check {
    pub fn pass(name: impl Into<String>, detail: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            outcome: Outcome::Pass(detail.into()),
        }
    }
    pub fn warn(name: impl Into<String>, detail: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            outcome: Outcome::Warn(detail.into()),
        }
    }
    pub fn fail(name: impl Into<String>, detail: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            outcome: Outcome::Fail(detail.into()),
        }
    }
    pub fn from_result(name: impl Into<String>, r: Result<String, String>) -> Self {
        match r {
            Ok(d) => Self::pass(name, d),
            Err(e) => Self::fail(name, e),
        }
    }
    pub fn wait(name: impl Into<String>, detail: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            outcome: Outcome::Wait(detail.into()),
        }
    }
    pub fn failed(&self) -> bool {
        matches!(self.outcome, Outcome::Fail(_))
    }
}

/// The checks to wait for (none failed, some [`Outcome::Wait`]), as one message.
pub fn waiting(checks: &[Check]) -> Option<String> {
    if checks.iter().any(Check::failed) {
        return None;
    }
    let w: Vec<String> = checks
        .iter()
        .filter_map(|c| match &c.outcome {
            Outcome::Wait(why) => Some(format!("{}: {why}", c.name)),
            _ => None,
        })
        .collect();
    (!w.is_empty()).then(|| w.join("; "))
}

/// The failed checks as one error message, or `Ok` when none failed.
pub fn require(checks: &[Check]) -> anyhow::Result<()> {
    let failed: Vec<String> = checks
        .iter()
        .filter_map(|c| match &c.outcome {
            Outcome::Fail(why) | Outcome::Wait(why) => Some(format!("{}: {why}", c.name)),
            _ => None,
        })
        .collect();
    if failed.is_empty() {
        Ok(())
    } else {
        anyhow::bail!("preflight failed: {}", failed.join("; "))
    }
}

/// Print the checks (one line each) and turn them into an exit code.
pub fn report(binary: &str, checks: &[Check]) -> ExitCode {
    for c in checks {
        let (tag, detail) = match &c.outcome {
            Outcome::Pass(d) => ("ok  ", d),
            Outcome::Warn(d) => ("warn", d),
            Outcome::Fail(d) => ("FAIL", d),
            Outcome::Wait(d) => ("wait", d),
        };
        println!("[{tag}] {}: {detail}", c.name);
    }
    let failed = checks
        .iter()
        .filter(|c| c.failed() || matches!(c.outcome, Outcome::Wait(_)))
        .count();
    if failed == 0 {
        println!("{binary}: all {} checks passed", checks.len());
        ExitCode::SUCCESS
    } else {
        println!("{binary}: {failed} of {} checks failed", checks.len());
        ExitCode::FAILURE
    }
}
