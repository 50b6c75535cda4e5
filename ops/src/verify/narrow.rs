//! Narrowing a chunk whose checksums differ to its keys, over rounds: the source read in a
//! consistent snapshot at a binlog position P, the target read once it caught up past P, and a
//! key judged a difference only when the target shows a state from before P ([`judge`]); a key
//! the target changed after P is read again in the next round, and one still changing after
//! every round is unsettled, never equal. What was found is read whole, for people.

use std::collections::{BTreeSet, HashMap};

use mysql_async::prelude::Queryable;
use sluice_common::sql::{clickhouse as ch, mysql as my};
use sluice_proto::v1::{Column, ColumnType};

use super::catch_up::{position_version, Pipeline};
use super::plan::{Chunk, Plan};
use super::render;
use super::report::{ColumnDiff, KeyDiff, TableReport};
use super::source::Source;
use super::target::Target;
use super::Options;

/// How a key compares once the target has caught up past the snapshot the source was read in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Equal,
    Missing,
    Extra,
    Different,
    /// The target's row changed after the snapshot: read again.
    Later,
}

/// The target's state of one key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TargetRow {
    pub hash: u64,
    pub version: u64,
    pub deleted: bool,
}

/// Compare one key: `source` its hash in the snapshot, `target` its newest target row,
/// `before` the version of the snapshot's position (target versions at or below it are states
/// at or before the snapshot).
pub fn judge(source: Option<u64>, target: Option<TargetRow>, before: u64) -> Verdict {
    let live = target.filter(|t| !t.deleted);
    match (source, live) {
        (Some(s), Some(t)) if s == t.hash => return Verdict::Equal,
        (None, None) => return Verdict::Equal,
        _ => {}
    }
    if target.is_some_and(|t| t.version > before) {
        return Verdict::Later;
    }
    match (source, live) {
        (Some(_), None) => Verdict::Missing,
        (None, Some(_)) => Verdict::Extra,
        _ => Verdict::Different,
    }
}

/// Key by key, over rounds, for the chunks that differ.
pub(super) async fn narrow(
    source: &Source,
    target: &Target,
    pipeline: &std::sync::Arc<Pipeline>,
    options: &Options,
    plan: &Plan,
    chunks: Vec<Chunk>,
    report: &mut TableReport,
) -> Result<(), String> {
    // Per chunk the keys still open (None: every key).
    let mut open: Vec<(Chunk, Option<BTreeSet<String>>)> =
        chunks.into_iter().map(|c| (c, None)).collect();
    let mut found: Vec<(Chunk, String, Verdict)> = Vec::new();
    let my_keys = format!(
        "SELECT HEX({}), {} FROM {} WHERE ",
        plan.my_key(),
        render::mysql_hash(&plan.my_row()),
        plan.source_name()
    );
    for round in 0..options.rounds.max(1) {
        let mut conn = source.conn().await?;
        let (lo, hi) = source.snapshot(&mut conn).await?;
        let mut mine = Vec::new();
        for (chunk, _) in &open {
            let sql = format!("{my_keys}{}", plan.range(chunk, my::ident));
            let rows: HashMap<String, u64> = Source::query::<(String, u64)>(&mut conn, &sql)
                .await?
                .into_iter()
                .collect();
            mine.push(rows);
        }
        conn.query_drop("COMMIT").await.map_err(|e| e.to_string())?;
        drop(conn);
        let (p, name, limit) = (
            hi.clone(),
            (plan.db.clone(), plan.table.clone()),
            options.wait,
        );
        let pl = pipeline.clone();
        let generation = tokio::task::spawn_blocking(move || pl.wait(&p, &name.0, &name.1, limit))
            .await
            .map_err(|e| e.to_string())??;
        let before = position_version(generation, &lo)?;
        let mut next = Vec::new();
        for ((chunk, keys), mine) in open.into_iter().zip(mine) {
            let theirs: HashMap<String, TargetRow> = target
                .query::<(String, u64, u64, u8)>(&format!(
                    "SELECT hex(_sluice_k), _sluice_lh, _sluice_lv, _sluice_ld FROM ({})",
                    plan.ch_latest(&chunk)
                ))
                .await?
                .into_iter()
                .map(|(k, h, v, d)| {
                    (
                        k,
                        TargetRow {
                            hash: h,
                            version: v,
                            deleted: d != 0,
                        },
                    )
                })
                .collect();
            let all: BTreeSet<&String> = mine.keys().chain(theirs.keys()).collect();
            let mut later = BTreeSet::new();
            for k in all {
                if keys.as_ref().is_some_and(|open| !open.contains(k)) {
                    continue;
                }
                match judge(mine.get(k).copied(), theirs.get(k).copied(), before) {
                    Verdict::Equal => {}
                    Verdict::Later => {
                        later.insert(k.clone());
                    }
                    v => found.push((chunk.clone(), k.clone(), v)),
                }
            }
            if !later.is_empty() {
                next.push((chunk, Some(later)));
            }
        }
        open = next;
        if open.is_empty() {
            break;
        }
        if options.progress {
            eprintln!(
                "verify: {}: round {}: {} keys changed while compared, read again",
                report.source,
                round + 1,
                open.iter()
                    .map(|(_, k)| k.as_ref().map_or(0, BTreeSet::len))
                    .sum::<usize>()
            );
        }
    }
    // The values of what was found, for people.
    let mut by_chunk: Vec<(Chunk, Vec<(String, Verdict)>)> = Vec::new();
    for (chunk, k, v) in found {
        match by_chunk.iter_mut().find(|(c, _)| *c == chunk) {
            Some((_, ks)) => ks.push((k, v)),
            None => by_chunk.push((chunk, vec![(k, v)])),
        }
    }
    for (chunk, keys) in by_chunk {
        let wanted: Vec<String> = keys.iter().map(|(k, _)| my::string(k)).collect();
        let mut conn = source.conn().await?;
        let mine: HashMap<String, String> = Source::query::<(String, String)>(
            &mut conn,
            &format!(
                "SELECT HEX({}), HEX({}) FROM {} WHERE {} AND HEX({}) IN ({})",
                plan.my_key(),
                plan.my_row(),
                plan.source_name(),
                plan.range(&chunk, my::ident),
                plan.my_key(),
                wanted.join(", ")
            ),
        )
        .await?
        .into_iter()
        .collect();
        drop(conn);
        let ch_wanted: Vec<String> = keys.iter().map(|(k, _)| ch::string(k)).collect();
        // (with the columns its newest row does not hold, where the target names them)
        let unheld = plan
            .unheld_column
            .as_ref()
            .map_or("emptyArrayString()".to_string(), |c| ch::ident(c));
        let theirs: HashMap<String, (String, Vec<String>)> = target
            .query::<(String, String, String)>(&format!(
                "SELECT hex(_sluice_k), hex(argMax(_sluice_r, _sluice_v)) AS _sluice_lr, \
                 arrayStringConcat(argMax(_sluice_u, _sluice_v), '\\0') AS _sluice_lu FROM (SELECT {key} AS _sluice_k, \
                 {row} AS _sluice_r, {ver} AS _sluice_v, {unheld} AS _sluice_u FROM {db}.{t} \
                 WHERE {range}) GROUP BY _sluice_k HAVING hex(_sluice_k) IN ({wanted})",
                key = plan.ch_key(),
                row = plan.ch_row(),
                ver = ch::ident(&plan.version_column),
                db = ch::ident(&plan.target_db()),
                t = ch::ident(plan.target_table()),
                range = plan.range(&chunk, ch::ident),
                wanted = ch_wanted.join(", ")
            ))
            .await?
            .into_iter()
            .map(|(k, r, u)| {
                let u = u.split('\0').filter(|c| !c.is_empty()).map(str::to_string);
                (k, (r, u.collect()))
            })
            .collect();
        for (k, v) in keys {
            let (row, unheld) = match theirs.get(&k) {
                Some((r, u)) => (Some(r), u.as_slice()),
                None => (None, &[][..]),
            };
            let diff = key_diff(plan, &k, mine.get(&k), row, v);
            match v {
                Verdict::Missing => report.missing.push(diff),
                Verdict::Extra => report.extra.push(diff),
                _ if marked_only(&diff, unheld) => report.marked.push(diff),
                _ => report.different.push(diff),
            }
        }
    }
    for (_, keys) in open {
        for k in keys.unwrap_or_default() {
            report
                .unsettled
                .push(key_diff(plan, &k, None, None, Verdict::Later));
        }
    }
    Ok(())
}

/// Whether a different key differs only in columns its target row names as not held
/// (`tables.unheld = "mark"`), each holding the stand-in (NULL or the epoch) for a source date
/// no ClickHouse type holds: the mirror says so itself. A marked column whose source value is
/// a date the target could hold (an update lost, say) is a difference.
fn marked_only(diff: &KeyDiff, unheld: &[String]) -> bool {
    !diff.columns.is_empty()
        && diff.columns.iter().all(|c| {
            unheld.contains(&c.column)
                && c.target.as_deref().is_some_and(stand_in)
                && c.source.as_deref().is_some_and(|v| {
                    // (verify renders the source's zero date as the epoch, as the
                    // unmarked mapping stores it)
                    unholdable_date(v)
                        || (c.target.as_deref() == Some("NULL") && v.starts_with("1970-01-01"))
                })
        })
}

/// NULL, or a date type's zero (the epoch; 18.16 prints its Date zero as `0000-00-00`).
fn stand_in(v: &str) -> bool {
    v == "NULL" || v.starts_with("1970-01-01") || v.starts_with("0000-00-00")
}

/// A date (or datetime) as MySQL prints it that some ClickHouse server's date types cannot
/// hold: zero, a zero month or day, a day the month has not, or a year outside 1970 - 2105
/// (18.16's span; later servers hold those, and then mark nothing).
fn unholdable_date(v: &str) -> bool {
    let b = v.as_bytes();
    if b.len() < 10 || b[4] != b'-' || b[7] != b'-' {
        return false;
    }
    let num = |r: std::ops::Range<usize>| v.get(r).and_then(|x| x.parse::<u32>().ok());
    let (Some(y), Some(m), Some(d)) = (num(0..4), num(5..7), num(8..10)) else {
        return false;
    };
    if m == 0 || d == 0 || !(1970..=2105).contains(&y) {
        return true;
    }
    let leap = (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
    let days = match m {
        1 | 3 | 5 | 7 | 8 | 10 | 12 => 31,
        4 | 6 | 9 | 11 => 30,
        2 if leap => 29,
        2 => 28,
        _ => return true,
    };
    d > days
}

/// A found key with its values: every column for a missing or extra row, the differing
/// columns for a different one.
fn key_diff(
    plan: &Plan,
    key_hex: &str,
    source: Option<&String>,
    target: Option<&String>,
    verdict: Verdict,
) -> KeyDiff {
    let kinds = |cols: &[(Column, String)]| -> Vec<bool> {
        cols.iter().map(|(c, t)| render::delimited(c, t)).collect()
    };
    let (key_kinds, row_kinds) = (kinds(&plan.key), kinds(&plan.columns));
    let parts = |hex: &str, kinds: &[bool]| {
        sluice_common::hex::decode(hex)
            .ok()
            .and_then(|b| render::split_parts(&b, kinds))
    };
    let key_parts = parts(key_hex, &key_kinds).unwrap_or_default();
    let key = plan
        .key
        .iter()
        .zip(key_parts.iter())
        .map(|((c, _), v)| (c.name.clone(), display(c, v)))
        .collect();
    let mine = source.and_then(|s| parts(s, &row_kinds));
    let theirs = target.and_then(|t| parts(t, &row_kinds));
    let mut columns = Vec::new();
    if verdict != Verdict::Later {
        for (i, (c, _)) in plan.columns.iter().enumerate() {
            let s = mine.as_ref().and_then(|m| m.get(i));
            let t = theirs.as_ref().and_then(|m| m.get(i));
            let show = matches!(verdict, Verdict::Missing | Verdict::Extra) || s != t;
            if show {
                columns.push(ColumnDiff {
                    column: c.name.clone(),
                    source: (verdict != Verdict::Extra)
                        .then(|| s.map_or("?".into(), |v| display(c, v))),
                    target: (verdict != Verdict::Missing)
                        .then(|| t.map_or("?".into(), |v| display(c, v))),
                });
            }
        }
    }
    KeyDiff { key, columns }
}

/// A canonical value for people: floats back from `E:M` to their shortest decimal.
fn display(col: &Column, v: &Option<Vec<u8>>) -> String {
    if let (ColumnType::Float | ColumnType::Double, Some(b)) = (col.r#type(), v) {
        if let Some(f) = float_of(b) {
            return if col.r#type() == ColumnType::Float {
                (f as f32).to_string()
            } else {
                f.to_string()
            };
        }
    }
    render::show(v)
}

/// `E:M` -> M · 2^(E-52).
pub fn float_of(text: &[u8]) -> Option<f64> {
    let t = std::str::from_utf8(text).ok()?;
    if t == "0" {
        return Some(0.0);
    }
    let (e, m) = t.split_once(':')?;
    let (e, m): (i32, i64) = (e.parse().ok()?, m.parse().ok()?);
    // Two steps, so that neither power of two leaves the range of f64.
    let k = e - 52;
    Some(m as f64 * 2f64.powi(k / 2) * 2f64.powi(k - k / 2))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_stand_in_for_a_date_no_type_holds_is_marked() {
        let diff = |source: &str, target: &str| KeyDiff {
            key: Default::default(),
            columns: vec![ColumnDiff {
                column: "d".into(),
                source: Some(source.into()),
                target: Some(target.into()),
            }],
        };
        let marks = ["d".to_string()];
        assert!(marked_only(&diff("2026-02-30", "NULL"), &marks));
        assert!(marked_only(&diff("2026-00-15", "1970-01-01"), &marks));
        assert!(marked_only(&diff("0000-00-00 00:00:00", "NULL"), &marks));
        // The zero date, as verify renders it, behind NULL.
        assert!(marked_only(&diff("1970-01-01", "NULL"), &marks));
        // A valid source date behind a stale mark: a difference (an update lost).
        assert!(!marked_only(&diff("2026-02-03", "NULL"), &marks));
        // A target that holds something else than the stand-in: a difference.
        assert!(!marked_only(&diff("2026-02-30", "2026-03-02"), &marks));
        // Not named in the row's marks.
        assert!(!marked_only(&diff("2026-02-30", "NULL"), &[]));
    }

    pub(super) fn row(hash: u64, version: u64, deleted: bool) -> Option<TargetRow> {
        Some(TargetRow {
            hash,
            version,
            deleted,
        })
    }

    #[test]
    pub(super) fn a_key_differs_only_when_the_target_shows_a_state_from_before_the_snapshot() {
        let p = 1000;
        // Agreement needs no version.
        assert_eq!(judge(Some(7), row(7, 5000, false), p), Verdict::Equal);
        assert_eq!(judge(None, None, p), Verdict::Equal);
        assert_eq!(judge(None, row(7, 10, true), p), Verdict::Equal);
        // Disagreement with a target state at or before P: the target is wrong.
        assert_eq!(judge(Some(7), row(8, 999, false), p), Verdict::Different);
        assert_eq!(judge(Some(7), row(8, 1000, false), p), Verdict::Different);
        assert_eq!(judge(Some(7), None, p), Verdict::Missing);
        assert_eq!(judge(Some(7), row(7, 10, true), p), Verdict::Missing);
        assert_eq!(judge(None, row(7, 10, false), p), Verdict::Extra);
        // A target row written after P: the source changed since the snapshot, read again.
        assert_eq!(judge(Some(7), row(8, 1001, false), p), Verdict::Later);
        assert_eq!(judge(Some(7), row(7, 1001, true), p), Verdict::Later);
        assert_eq!(judge(None, row(7, 1001, false), p), Verdict::Later);
    }

    #[test]
    pub(super) fn canonical_floats_read_back_exactly() {
        for (text, want) in [
            ("-4:7205759403792794", 0.1f64),
            ("1023:9007199254740991", f64::MAX),
            ("-1022:1", 5e-324),
            ("-1022:4503599627370496", f64::MIN_POSITIVE),
            ("1:-5629499534213120", -2.5),
            ("0", 0.0),
        ] {
            assert_eq!(float_of(text.as_bytes()), Some(want), "{text}");
        }
        assert_eq!(
            float_of(b"-4:7205759511166976").map(|f| f as f32),
            Some(0.1f32)
        );
    }
}
