//! What `sluice verify` answers: per table, the keys missing, extra, different or unsettled
//! with both values, and the outcome; for people as text, for tools as JSON.

use std::collections::BTreeMap;
use std::time::Instant;

use serde::Serialize;

/// How a table, or the whole, compares.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Outcome {
    /// Every key equal.
    Equal,
    /// Some key missing, extra or different.
    Different,
    /// Nothing found different, but keys kept changing (or, for the whole, a table could not
    /// be verified).
    Unsettled,
    /// A table that could not be compared (its reason says why).
    #[serde(rename = "not verified")]
    NotVerified,
}

/// The whole answer.
#[derive(Debug, Serialize)]
pub struct Report {
    /// `equal`, `different` (a difference found) or `unsettled` (nothing found different,
    /// but keys kept changing, or a table could not be verified).
    pub result: Outcome,
    pub tables: Vec<TableReport>,
    pub rows: u64,
    pub seconds: f64,
}

impl Report {
    /// The process's exit status: 0 equal, 1 different, 2 unsettled or not verified.
    pub fn exit_code(&self) -> u8 {
        match self.result {
            Outcome::Equal => 0,
            Outcome::Different => 1,
            Outcome::Unsettled | Outcome::NotVerified => 2,
        }
    }

    /// The whole answer from the tables' answers.
    pub fn of(tables: Vec<TableReport>, started: Instant) -> Report {
        let any = |o: Outcome| tables.iter().any(|r| r.result == o);
        let result = if any(Outcome::Different) {
            Outcome::Different
        } else if any(Outcome::NotVerified) {
            Outcome::NotVerified
        } else if any(Outcome::Unsettled) {
            Outcome::Unsettled
        } else {
            Outcome::Equal
        };
        Report {
            result,
            rows: tables.iter().map(|r| r.rows).sum(),
            tables,
            seconds: started.elapsed().as_secs_f64(),
        }
    }
}

#[derive(Debug, Serialize)]
pub struct TableReport {
    pub source: String,
    pub target: String,
    pub result: Outcome,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Source rows checksummed.
    pub rows: u64,
    pub chunks: u64,
    /// Chunks whose checksums differed at first (changes in flight included).
    pub chunks_narrowed: u64,
    /// Source columns the target has not (not compared).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub columns_not_compared: Vec<String>,
    pub missing: Vec<KeyDiff>,
    pub extra: Vec<KeyDiff>,
    pub different: Vec<KeyDiff>,
    /// Keys that differ only in values the target cannot hold, each named in the row's
    /// `tables.unheld_column` (`tables.unheld = "mark"`): not a difference the mirror hides.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub marked: Vec<KeyDiff>,
    pub unsettled: Vec<KeyDiff>,
    pub seconds: f64,
}

impl TableReport {
    /// A table about to be compared: nothing found yet.
    pub fn new(source: String, target: String) -> Self {
        Self {
            source,
            target,
            result: Outcome::Equal,
            reason: None,
            rows: 0,
            chunks: 0,
            chunks_narrowed: 0,
            columns_not_compared: Vec::new(),
            missing: Vec::new(),
            extra: Vec::new(),
            different: Vec::new(),
            marked: Vec::new(),
            unsettled: Vec::new(),
            seconds: 0.0,
        }
    }

    /// It could not be compared, for `reason`.
    pub fn not_verified(&mut self, reason: String) {
        self.result = Outcome::NotVerified;
        self.reason = Some(reason);
    }

    /// The table's outcome once compared (`Err`: why it could not be), from the keys found.
    pub fn conclude(&mut self, compared: Result<(), String>) {
        if let Err(e) = compared {
            return self.not_verified(e);
        }
        if self.result == Outcome::NotVerified {
            return;
        }
        self.result =
            if !self.missing.is_empty() || !self.extra.is_empty() || !self.different.is_empty() {
                Outcome::Different
            } else if !self.unsettled.is_empty() {
                Outcome::Unsettled
            } else {
                Outcome::Equal
            };
    }
}

/// One key that differs.
#[derive(Debug, Clone, Serialize)]
pub struct KeyDiff {
    /// Primary-key column -> value.
    pub key: BTreeMap<String, String>,
    /// The columns that differ (every column for a missing or extra row): name, source value,
    /// target value (canonical text: see docs/operations.md).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub columns: Vec<ColumnDiff>,
}

#[derive(Debug, Clone, Serialize)]
pub struct ColumnDiff {
    pub column: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub source: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub target: Option<String>,
}

impl Outcome {
    /// As people read it (and as JSON writes it).
    pub fn word(self) -> &'static str {
        match self {
            Outcome::Equal => "equal",
            Outcome::Different => "different",
            Outcome::Unsettled => "unsettled",
            Outcome::NotVerified => "not verified",
        }
    }
}

/// One line per table.
pub fn summary_line(t: &TableReport) -> String {
    let mut s = format!(
        "{} -> {}: {} ({} rows, {} chunks",
        t.source,
        t.target,
        t.result.word(),
        t.rows,
        t.chunks
    );
    if t.chunks_narrowed > 0 {
        s.push_str(&format!(", {} narrowed to keys", t.chunks_narrowed));
    }
    s.push(')');
    let counts: Vec<String> = [
        ("missing", t.missing.len()),
        ("extra", t.extra.len()),
        ("different", t.different.len()),
        ("marked as not held", t.marked.len()),
        ("unsettled", t.unsettled.len()),
    ]
    .iter()
    .filter(|(_, n)| *n > 0)
    .map(|(w, n)| format!("{n} {w}"))
    .collect();
    if !counts.is_empty() {
        s.push_str(&format!(": {}", counts.join(", ")));
    }
    if let Some(r) = &t.reason {
        s.push_str(&format!(": {r}"));
    }
    s
}

/// The last line: the whole answer, and how many tables had each (`different: 1 of 2 tables
/// different, 1 equal; 3000 rows in 1.2 s`).
pub fn closing_line(r: &Report) -> String {
    let count = |o: Outcome| r.tables.iter().filter(|t| t.result == o).count();
    let mut parts = vec![format!(
        "{} of {} tables {}",
        count(r.result),
        r.tables.len(),
        r.result.word()
    )];
    for o in [
        Outcome::Different,
        Outcome::NotVerified,
        Outcome::Unsettled,
        Outcome::Equal,
    ] {
        if o != r.result && count(o) > 0 {
            parts.push(format!("{} {}", count(o), o.word()));
        }
    }
    format!(
        "{}: {}; {} rows in {:.1} s",
        r.result.word(),
        parts.join(", "),
        r.rows,
        r.seconds
    )
}

/// The report for people: a line per table, then up to `limit` keys of each kind.
pub fn text(r: &Report, limit: usize) -> String {
    let mut out = Vec::new();
    for t in &r.tables {
        out.push(summary_line(t));
        if !t.columns_not_compared.is_empty() {
            out.push(format!(
                "  not in the target, not compared: {}",
                t.columns_not_compared.join(", ")
            ));
        }
        for (what, keys) in [
            ("missing", &t.missing),
            ("extra", &t.extra),
            ("different", &t.different),
            ("marked", &t.marked),
            ("unsettled", &t.unsettled),
        ] {
            for k in keys.iter().take(limit) {
                let key: Vec<String> = k.key.iter().map(|(n, v)| format!("{n}={v}")).collect();
                out.push(format!("  {what:<9} {}", key.join(" ")));
                for c in &k.columns {
                    let v = |x: &Option<String>| x.as_deref().map(|s| format!("{s:?}"));
                    out.push(match (v(&c.source), v(&c.target)) {
                        (Some(s), Some(t)) => format!("    {}: source {s}, target {t}", c.column),
                        (Some(s), None) => format!("    {}: {s}", c.column),
                        (None, Some(t)) => format!("    {}: {t}", c.column),
                        (None, None) => format!("    {}", c.column),
                    });
                }
            }
            if keys.len() > limit {
                out.push(format!(
                    "  ... {} more {what} (all of them with --json)",
                    keys.len() - limit
                ));
            }
        }
    }
    out.push(closing_line(r));
    out.join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table(result: Outcome) -> TableReport {
        TableReport {
            result,
            ..TableReport::new("d.t".into(), "x.t".into())
        }
    }

    #[test]
    fn a_table_concludes_from_its_keys_and_the_whole_from_its_tables() {
        let key = || KeyDiff {
            key: [("id".to_string(), "1".to_string())].into(),
            columns: vec![],
        };
        let mut t = table(Outcome::Equal);
        t.conclude(Ok(()));
        assert_eq!(t.result, Outcome::Equal);
        t.unsettled.push(key());
        t.conclude(Ok(()));
        assert_eq!(t.result, Outcome::Unsettled);
        t.missing.push(key());
        t.conclude(Ok(()));
        assert_eq!(t.result, Outcome::Different);
        t.conclude(Err("gone".into()));
        assert_eq!(
            (t.result, t.reason.as_deref()),
            (Outcome::NotVerified, Some("gone"))
        );
        let mut planned_out = table(Outcome::Equal);
        planned_out.not_verified("a change log".into());
        planned_out.conclude(Ok(()));
        assert_eq!(planned_out.result, Outcome::NotVerified);
        let whole = |r: &[Outcome]| {
            Report::of(r.iter().map(|o| table(*o)).collect(), Instant::now()).result
        };
        assert_eq!(whole(&[Outcome::Equal, Outcome::Equal]), Outcome::Equal);
        assert_eq!(
            whole(&[Outcome::Equal, Outcome::NotVerified]),
            Outcome::NotVerified
        );
        assert_eq!(
            whole(&[Outcome::Unsettled, Outcome::NotVerified]),
            Outcome::NotVerified
        );
        assert_eq!(
            whole(&[Outcome::Equal, Outcome::Unsettled]),
            Outcome::Unsettled
        );
        // The closing line counts the tables of each answer.
        let two = Report::of(
            vec![table(Outcome::Different), table(Outcome::Equal)],
            Instant::now(),
        );
        let line = closing_line(&two);
        assert!(
            line.starts_with("different: 1 of 2 tables different, 1 equal; "),
            "{line}"
        );
        let all = Report::of(
            vec![table(Outcome::Equal), table(Outcome::Equal)],
            Instant::now(),
        );
        assert!(
            closing_line(&all).starts_with("equal: 2 of 2 tables equal; "),
            "{}",
            closing_line(&all)
        );
        assert_eq!(
            whole(&[Outcome::Unsettled, Outcome::Different]),
            Outcome::Different
        );
        assert_eq!(Report::of(vec![], Instant::now()).exit_code(), 0);
        // JSON keeps the words tools read.
        let json = serde_json::to_value(table(Outcome::NotVerified)).unwrap();
        assert_eq!(json["result"], "not verified");
        assert_eq!(
            serde_json::to_value(Outcome::Different).unwrap(),
            "different"
        );
    }
}
