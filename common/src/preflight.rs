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
    pub fn failed(&self) -> bool {
        matches!(self.outcome, Outcome::Fail(_))
    }
}

/// The failed checks as one error message, or `Ok` when none failed.
pub fn require(checks: &[Check]) -> anyhow::Result<()> {
    let failed: Vec<String> = checks
        .iter()
        .filter_map(|c| match &c.outcome {
            Outcome::Fail(why) => Some(format!("{}: {why}", c.name)),
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
        };
        println!("[{tag}] {}: {detail}", c.name);
    }
    let failed = checks.iter().filter(|c| c.failed()).count();
    if failed == 0 {
        println!("{binary}: all {} checks passed", checks.len());
        ExitCode::SUCCESS
    } else {
        println!("{binary}: {failed} of {} checks failed", checks.len());
        ExitCode::FAILURE
    }
}
