//! The status as text, for people.

use sluice_common::clock::now_secs;

use super::Status;

/// Seconds as text: `0.4 s`, `12 s`, `3 min 5 s`, `2 h 10 min`.
pub fn duration_text(s: f64) -> String {
    if s < 10.0 {
        format!("{s:.1} s")
    } else if s < 120.0 {
        format!("{} s", s.round() as u64)
    } else if s < 7200.0 {
        let s = s.round() as u64;
        format!("{} min {} s", s / 60, s % 60)
    } else {
        let m = (s / 60.0).round() as u64;
        format!("{} h {} min", m / 60, m % 60)
    }
}

/// A section's title, and `none` under it when it is empty.
fn heading(o: &mut String, title: &str, empty: bool) {
    o.push_str(title);
    o.push_str(":\n");
    if empty {
        o.push_str("  none\n");
    }
}

/// The status as text, for people.
pub fn text(s: &Status) -> String {
    use std::fmt::Write;
    let mut o = String::new();
    heading(
        &mut o,
        &format!("captures (checkpoint topic {})", s.checkpoint_topic),
        s.connectors.is_empty(),
    );
    for c in &s.connectors {
        let _ = write!(o, "  {} ({}): at {}", c.name, c.source, c.position);
        if !c.gtid_set.is_empty() {
            let _ = write!(o, ", GTID set {}", c.gtid_set);
        }
        if let Some(t) = &c.resume_token {
            let _ = write!(o, ", resume token {t}");
        }
        let _ = write!(o, "; stored {} ago", duration_text(c.age_seconds as f64));
        if let Some(now) = &c.source_now {
            let _ = write!(o, "; the source at {}", now.position);
            if let Some(b) = now.behind_bytes {
                let _ = write!(o, ", {b} bytes behind");
            }
        }
        let _ = writeln!(o);
        if let Some(sn) = &c.snapshot {
            // A rebuild's id: `rebuild FILE:POS db.t` (the ALTER it follows).
            let rebuild = sn
                .id
                .strip_prefix("rebuild ")
                .and_then(|r| r.split_once(' '));
            match rebuild {
                Some((at, table)) => {
                    let _ = writeln!(
                        o,
                        "    rebuilding {table} (read again after the ALTER at {at}): {} rows \
                         published{}",
                        sn.rows,
                        if sn.tables_done == sn.tables {
                            ", done"
                        } else {
                            ""
                        }
                    );
                }
                None => {
                    let _ = writeln!(
                        o,
                        "    snapshot {:?} under way: {} of {} tables done, {} rows published",
                        sn.id, sn.tables_done, sn.tables, sn.rows
                    );
                }
            }
        }
        if !c.snapshots_queued.is_empty() {
            let _ = writeln!(o, "    queued: {}", c.snapshots_queued.join("; "));
        }
        if !c.snapshots_done.is_empty() {
            let _ = writeln!(o, "    snapshots done: {}", c.snapshots_done.join(", "));
        }
    }
    heading(&mut o, "apply groups", s.groups.is_empty());
    for g in &s.groups {
        let _ = write!(
            o,
            "  {}: {}, {} member{}, {} event{} behind",
            g.name,
            g.state,
            g.members.len(),
            if g.members.len() == 1 { "" } else { "s" },
            g.lag_messages,
            if g.lag_messages == 1 { "" } else { "s" },
        );
        if let Some(l) = g.lag_seconds {
            let _ = write!(o, ", the oldest waiting {}", duration_text(l));
        }
        let _ = writeln!(o);
        for m in &g.members {
            let parts: Vec<String> = m
                .partitions
                .iter()
                .map(|(t, ps)| {
                    format!(
                        "{t}[{}]",
                        ps.iter().map(i32::to_string).collect::<Vec<_>>().join(",")
                    )
                })
                .collect();
            let _ = writeln!(
                o,
                "    member {} {}: {}",
                m.client_id,
                m.host,
                if parts.is_empty() {
                    "no partitions".to_string()
                } else {
                    parts.join(" ")
                }
            );
        }
        for p in &g.partitions {
            let _ = write!(
                o,
                "    {}[{}]: committed {}, end {}, {} behind",
                p.topic,
                p.partition,
                p.committed
                    .map_or_else(|| "nothing".to_string(), |n| n.to_string()),
                p.end,
                p.lag_messages
            );
            if let Some(l) = p.lag_seconds {
                let _ = write!(o, " (the first waiting {})", duration_text(l));
            }
            if p.expired {
                let _ = write!(
                    o,
                    "; EXPIRED: events from {} to {} were deleted before the group read them",
                    p.committed.unwrap_or(0),
                    p.start
                );
            }
            let _ = writeln!(o);
        }
    }
    heading(
        &mut o,
        &format!("dead letters (topic {})", s.dead_letter_topic),
        s.dead_letters.is_empty(),
    );
    for d in &s.dead_letters {
        let _ = writeln!(
            o,
            "  {} [{}]: {} not replayed, {} replayed{}",
            d.table,
            d.reason,
            d.waiting,
            d.replayed,
            d.last_ms
                .map(|ms| format!(
                    ", the newest {} ago",
                    duration_text((now_secs() as f64 - ms as f64 / 1000.0).max(0.0))
                ))
                .unwrap_or_default()
        );
    }
    if let Some(stopped) = &s.stopped {
        heading(
            &mut o,
            "stopped tables (of the apply configs given)",
            stopped.is_empty(),
        );
        for t in stopped {
            let _ = writeln!(
                o,
                "  {} ({}, group {}) stopped since {}: {}",
                t.target, t.stage, t.group, t.since, t.reason
            );
            let _ = writeln!(o, "    to take it up again:");
            for (i, step) in t.resume.iter().enumerate() {
                let _ = writeln!(o, "      {}. {step}", i + 1);
            }
        }
    }
    o
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::status::{connector, Snapshot};
    use sluice_capture::checkpoint::Checkpoint;

    fn of(json: serde_json::Value) -> Checkpoint {
        Checkpoint::from_json(json.to_string().as_bytes()).unwrap()
    }

    #[test]
    fn either_captures_checkpoint_reads_as_a_position() {
        let my = serde_json::json!({
            "next": {"file": "mariadb-bin.000007", "pos": 1234},
            "gtid_set": "0-1-99", "server_id": 1, "written_at": 1000,
            "snapshot": {"id": "initial", "tables": {
                "db.a": {"after": "0a", "rows": 10, "done": true},
                "db.b": {"rows": 5}}},
            "snapshots_done": []
        });
        let c = connector("m".into(), of(my), 1030);
        assert_eq!(
            (c.source, c.position.as_str(), c.gtid_set.as_str()),
            ("mysql", "mariadb-bin.000007:1234", "0-1-99")
        );
        assert_eq!(c.age_seconds, 30);
        assert_eq!(
            c.snapshot,
            Some(Snapshot {
                id: "initial".into(),
                tables: 2,
                tables_done: 1,
                rows: 15
            })
        );
        // capture-mongo's, with its older names (`collections`, `docs`).
        let mo = serde_json::json!({
            "ts": [1764720000u32, 3], "resume_token": "82aa", "replica_set": "rs0",
            "written_at": 1000,
            "snapshot": {"id": "r1", "collections": {"db.c": {"docs": 7, "done": true}}},
            "snapshots_done": ["initial"]
        });
        let c = connector("g".into(), of(mo), 999);
        assert_eq!(
            (c.source, c.position.as_str(), c.resume_token.as_deref()),
            ("mongodb", "1764720000.3", Some("82aa"))
        );
        assert_eq!(
            c.age_seconds, 0,
            "a clock behind the writer's is no negative age"
        );
        assert_eq!(
            c.snapshot.as_ref().map(|s| (s.tables_done, s.rows)),
            Some((1, 7))
        );
        assert_eq!(c.snapshots_done, vec!["initial".to_string()]);
        let text = text(&Status {
            checkpoint_topic: "_cp".into(),
            connectors: vec![c],
            groups: vec![],
            dead_letter_topic: "_dl".into(),
            dead_letters: vec![],
            stopped: None,
        });
        assert!(text.contains("dead letters (topic _dl):\n  none"), "{text}");
        assert!(
            text.contains("g (mongodb): at 1764720000.3, resume token 82aa"),
            "{text}"
        );
        assert!(
            text.contains("snapshot \"r1\" under way: 1 of 1 tables done, 7 rows"),
            "{text}"
        );
    }

    #[test]
    fn a_rebuild_reads_as_one_and_queued_snapshots_are_listed() {
        let my = serde_json::json!({
            "next": {"file": "mariadb-bin.000007", "pos": 1234},
            "gtid_set": "", "server_id": 1, "written_at": 1000,
            "snapshot": {"id": "rebuild mariadb-bin.000007:900 db.a", "tables": {
                "db.a": {"after": "0a", "rows": 10}}},
            "snapshots_pending": [
                {"id": "rebuild mariadb-bin.000007:1100 db.b", "tables": ["db.b"]},
                {"id": "rename mariadb-bin.000007:1200 db.c", "tables": ["db.c"]}],
            "snapshots_done": []
        });
        let c = connector("m".into(), of(my), 1000);
        let text = text(&Status {
            checkpoint_topic: "_cp".into(),
            connectors: vec![c],
            groups: vec![],
            dead_letter_topic: "_dl".into(),
            dead_letters: vec![],
            stopped: None,
        });
        assert!(
            text.contains(
                "rebuilding db.a (read again after the ALTER at mariadb-bin.000007:900): 10 rows \
                 published\n"
            ),
            "{text}"
        );
        assert!(
            text.contains(
                "queued: rebuild mariadb-bin.000007:1100 db.b (db.b); rename \
                 mariadb-bin.000007:1200 db.c (db.c)"
            ),
            "{text}"
        );
    }

    #[test]
    fn stopped_tables_are_listed_with_the_steps_that_take_them_up_again() {
        let status = |stopped| Status {
            checkpoint_topic: "_cp".into(),
            connectors: vec![],
            groups: vec![],
            dead_letter_topic: "_dl".into(),
            dead_letters: vec![],
            stopped,
        };
        // Not asked for (no --apply-config): not shown.
        assert!(!text(&status(None)).contains("stopped tables"));
        assert!(text(&status(Some(vec![])))
            .contains("stopped tables (of the apply configs given):\n  none"));
        let t = text(&status(Some(vec![crate::status::Stopped {
            stage: "apply-clickhouse",
            group: "g".into(),
            target: "t".into(),
            since: "2026-12-07 10:00:00".into(),
            reason: "CHANGE COLUMN a b".into(),
            resume: vec![
                "fix".into(),
                "ALTER TABLE `m`.`_sluice_stopped` DELETE WHERE target = 't'".into(),
            ],
        }])));
        assert!(
            t.contains(
                "  t (apply-clickhouse, group g) stopped since 2026-12-07 10:00:00: CHANGE COLUMN a b\n    to take it up again:\n      1. fix\n      2. ALTER TABLE `m`.`_sluice_stopped` DELETE WHERE target = 't'\n"
            ),
            "{t}"
        );
    }

    #[test]
    fn durations_read_as_people_say_them() {
        assert_eq!(duration_text(0.42), "0.4 s");
        assert_eq!(duration_text(75.0), "75 s");
        assert_eq!(duration_text(185.0), "3 min 5 s");
        assert_eq!(duration_text(7800.0), "2 h 10 min");
    }
}
