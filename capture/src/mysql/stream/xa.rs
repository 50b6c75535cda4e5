//! XA transactions: rows logged at `XA PREPARE`, whose outcome comes later.
//!
//! A server writes an XA transaction's rows to the binlog when it is prepared (MariaDB: a GTID
//! event flagged "prepared XA", the rows, `XA END`, an `XA_prepare` event; MySQL: `XA START`,
//! the rows, `XA END`, the same `XA_prepare` event), and its outcome as a group of its own,
//! later, with other transactions in between: a query `XA COMMIT <xid>` or `XA ROLLBACK <xid>`.
//! The rows are held from the start until the outcome: published at the commit (with the
//! versions of their own positions: the prepared transaction holds its rows' locks until then,
//! so no later change of those rows comes before), dropped at the rollback. A one-phase commit
//! (`XA COMMIT ... ONE PHASE`, or a prepare event flagged one-phase) publishes them at once.
//!
//! While a prepared transaction is held, the checkpoint stays before its first event, so a
//! restart reads it again whole (and republishes what came after it, with the same versions).
//!
//! A snapshot chunk read while a transaction is prepared holds the rows' values before it, at
//! a version above the transaction's: so no chunk of a table is asked for while a prepared
//! transaction holds rows of it, a chunk read (asked before the prepare) with a key one holds
//! is dropped and read again after the outcome, its progress not moved, and the rows held
//! touch their keys (a chunk in flight leaves them out) only when published, at the commit,
//! so that a rollback leaves the chunk's values in place.
//! A reconnect keeps what is held and reads on from the last commit.

use crate::mysql::position::BinlogPos;

/// An encoded row event waiting for its transaction's outcome.
pub(crate) struct HeldRow {
    pub(crate) topic: String,
    /// Of a table without a primary key.
    pub(crate) keyless: bool,
    /// The table's key prefix (the start of `key`).
    pub(crate) key_prefix: Vec<u8>,
    pub(crate) key: Vec<u8>,
    pub(crate) payload: Vec<u8>,
    /// The table's event and byte counters, counted when the row is published.
    pub(crate) counters: (prometheus::IntCounter, prometheus::IntCounter),
}

struct Prepared {
    xid: String,
    rows: Vec<HeldRow>,
    /// The resume point before the transaction's first event.
    before: BinlogPos,
    /// The capture's GTID set there (empty: not known).
    gtid_before: String,
}

#[derive(Default)]
pub(crate) struct XaState {
    /// The XA transaction being read (not prepared yet): its rows, and where it began.
    pub(crate) reading: Option<(Vec<HeldRow>, BinlogPos, String)>,
    prepared: Vec<Prepared>,
}

impl XaState {
    /// An XA transaction begins; `before` is the resume point before it, `gtid_before` the
    /// GTID set there.
    pub(crate) fn start(&mut self, before: BinlogPos, gtid_before: String) {
        self.reading = Some((Vec::new(), before, gtid_before));
    }

    /// Hold `row` of the XA transaction being read (the caller checks there is one, so that
    /// rows outside XA are not copied).
    pub(crate) fn hold(&mut self, row: HeldRow) {
        if let Some((rows, _, _)) = self.reading.as_mut() {
            rows.push(row);
        }
    }

    /// The transaction being read is prepared as `xid`.
    pub(crate) fn prepare(&mut self, xid: String) {
        if let Some((rows, before, gtid_before)) = self.reading.take() {
            self.prepared.push(Prepared {
                xid,
                rows,
                before,
                gtid_before,
            });
        }
    }

    /// The rows of the transaction being read, ending it (a one-phase commit).
    pub(crate) fn finish_reading(&mut self) -> Vec<HeldRow> {
        self.reading
            .take()
            .map(|(rows, _, _)| rows)
            .unwrap_or_default()
    }

    /// The rows of prepared transaction `xid`, no longer held (`None`: not prepared since the
    /// capture's start).
    pub(crate) fn take(&mut self, xid: &str) -> Option<Vec<HeldRow>> {
        let i = self.prepared.iter().position(|p| same_xid(&p.xid, xid))?;
        Some(self.prepared.remove(i).rows)
    }

    /// A prepared transaction still held has rows of `topic`: the xid of the first.
    pub(crate) fn holding_topic(&self, topic: &str) -> Option<&str> {
        self.prepared
            .iter()
            .find(|p| p.rows.iter().any(|r| r.topic == topic))
            .map(|p| p.xid.as_str())
    }

    /// A prepared transaction still held has a row of `key` (event key bytes) on `topic`.
    pub(crate) fn holds(&self, topic: &str, key: &[u8]) -> bool {
        self.prepared
            .iter()
            .any(|p| p.rows.iter().any(|r| r.topic == topic && r.key == key))
    }

    /// The resume point before the oldest prepared transaction still held.
    pub(crate) fn before(&self) -> Option<&BinlogPos> {
        self.oldest().map(|p| &p.before)
    }

    /// The GTID set before the oldest prepared transaction still held.
    pub(crate) fn gtid_before(&self) -> Option<&str> {
        self.oldest().map(|p| p.gtid_before.as_str())
    }

    fn oldest(&self) -> Option<&Prepared> {
        self.prepared.iter().min_by_key(|p| {
            (
                sluice_proto::binlog_file_seq(&p.before.file).unwrap_or(0),
                p.before.pos,
            )
        })
    }
}

fn same_xid(a: &str, b: &str) -> bool {
    let norm = |s: &str| -> String {
        s.chars()
            .filter(|c| !c.is_whitespace())
            .collect::<String>()
            .to_ascii_uppercase()
    };
    norm(a) == norm(b)
}

/// The body of an `XA_prepare` event (type 38: one_phase, formatID, gtrid_length,
/// bqual_length, then gtrid and bqual): whether it is a one-phase commit, and the xid as the
/// server writes it in `XA COMMIT` (`X'<gtrid hex>',X'<bqual hex>',<formatID>`).
pub(crate) fn prepare_event(data: &[u8]) -> Option<(bool, String)> {
    let one_phase = *data.first()? != 0;
    let int = |at: usize| -> Option<u32> {
        Some(u32::from_le_bytes(data.get(at..at + 4)?.try_into().ok()?))
    };
    let format_id = int(1)? as i32;
    let gtrid = int(5)? as usize;
    let bqual = int(9)? as usize;
    if gtrid > 64 || bqual > 64 {
        return None;
    }
    let g = data.get(13..13 + gtrid)?;
    let b = data.get(13 + gtrid..13 + gtrid + bqual)?;
    let hex = |x: &[u8]| sluice_common::hex::encode(x).to_ascii_uppercase();
    Some((
        one_phase,
        format!("X'{}',X'{}',{format_id}", hex(g), hex(b)),
    ))
}

/// What an XA statement of a QUERY event does.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum XaStatement {
    /// `XA START` / `XA BEGIN` (MySQL logs it; MariaDB flags its GTID event instead).
    Start,
    /// `XA COMMIT <xid>` (`one_phase`: `... ONE PHASE`).
    Commit { xid: String, one_phase: bool },
    /// `XA ROLLBACK <xid>`.
    Rollback { xid: String },
}

pub(crate) fn statement(sql: &str) -> Option<XaStatement> {
    let t = sql.trim_start();
    let head = t.get(..3)?;
    if !head.eq_ignore_ascii_case("XA ") {
        return None;
    }
    let rest = t[3..].trim_start();
    let word_end = rest.find(char::is_whitespace).unwrap_or(rest.len());
    let (verb, xid) = rest.split_at(word_end);
    let xid = xid.trim();
    match verb.to_ascii_uppercase().as_str() {
        "START" | "BEGIN" => Some(XaStatement::Start),
        "COMMIT" => {
            let upper = xid.to_ascii_uppercase();
            let one_phase = upper.ends_with("ONE PHASE");
            let xid = if one_phase {
                xid[..xid.len() - "ONE PHASE".len()].trim()
            } else {
                xid
            };
            Some(XaStatement::Commit {
                xid: xid.to_string(),
                one_phase,
            })
        }
        "ROLLBACK" => Some(XaStatement::Rollback {
            xid: xid.to_string(),
        }),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pos(p: u64) -> BinlogPos {
        BinlogPos {
            file: "mysql-bin.000003".into(),
            pos: p,
        }
    }

    fn row(n: u8) -> HeldRow {
        let c = || prometheus::IntCounter::new("c", "c").unwrap();
        HeldRow {
            topic: "t".into(),
            keyless: false,
            key_prefix: Vec::new(),
            key: vec![n],
            payload: vec![n],
            counters: (c(), c()),
        }
    }

    #[test]
    fn held_rows_are_found_by_topic_and_key_until_their_outcome() {
        let mut xa = XaState::default();
        xa.start(pos(4), String::new());
        xa.hold(row(1));
        assert_eq!(xa.holding_topic("t"), None, "not prepared yet");
        xa.prepare("X'61',X'',1".into());
        assert_eq!(xa.holding_topic("t"), Some("X'61',X'',1"));
        assert_eq!(xa.holding_topic("u"), None);
        assert!(xa.holds("t", &[1]));
        assert!(!xa.holds("t", &[2]));
        assert!(!xa.holds("u", &[1]));
        assert!(xa.take("X'61',X'',1").is_some());
        assert_eq!(xa.holding_topic("t"), None);
        assert!(!xa.holds("t", &[1]));
    }

    #[test]
    fn prepare_events_name_their_xid_as_xa_commit_does() {
        // MariaDB 10.11 for XA START 'x1': one_phase 0, formatID 1, gtrid "x1", no bqual.
        let mut d = vec![0u8];
        d.extend(1u32.to_le_bytes());
        d.extend(2u32.to_le_bytes());
        d.extend(0u32.to_le_bytes());
        d.extend(b"x1");
        d.extend([0xde, 0xad, 0xbe, 0xef]); // a checksum after the body
        assert_eq!(prepare_event(&d), Some((false, "X'7831',X'',1".into())));
        d[0] = 1;
        assert!(prepare_event(&d).unwrap().0);
        assert_eq!(prepare_event(&d[..10]), None);
        assert_eq!(
            statement("XA COMMIT X'7831',X'',1"),
            Some(XaStatement::Commit {
                xid: "X'7831',X'',1".into(),
                one_phase: false
            })
        );
        assert_eq!(
            statement("xa commit X'7831',X'',1 ONE PHASE"),
            Some(XaStatement::Commit {
                xid: "X'7831',X'',1".into(),
                one_phase: true
            })
        );
        assert_eq!(
            statement("XA ROLLBACK X'7832',X'',1"),
            Some(XaStatement::Rollback {
                xid: "X'7832',X'',1".into()
            })
        );
        assert_eq!(
            statement("XA START X'7831',X'',1"),
            Some(XaStatement::Start)
        );
        assert_eq!(statement("XA END X'7831',X'',1"), None);
        assert_eq!(statement("COMMIT"), None);
    }

    #[test]
    fn rows_wait_for_their_outcome_and_the_checkpoint_for_the_oldest() {
        let mut xa = XaState::default();
        assert!(
            xa.reading.is_none(),
            "outside XA: rows are published at once"
        );
        xa.start(pos(100), "0-1-1".into());
        xa.hold(row(1));
        xa.prepare("X'31',X'',1".into());
        assert!(
            xa.reading.is_none(),
            "after the prepare: nothing more is held"
        );
        xa.start(pos(200), "0-1-2".into());
        xa.hold(row(3));
        xa.prepare("X'32',X'',1".into());
        assert_eq!(xa.before(), Some(&pos(100)));
        assert_eq!(xa.gtid_before(), Some("0-1-1"));
        let rolled_back = xa.take("x'32', x'', 1").unwrap();
        assert_eq!(rolled_back[0].key, vec![3]);
        assert_eq!(xa.before(), Some(&pos(100)));
        let committed = xa.take("X'31',X'',1").unwrap();
        assert_eq!(committed[0].key, vec![1]);
        assert_eq!(xa.before(), None);
        assert!(xa.take("X'31',X'',1").is_none());
        xa.start(pos(300), String::new());
        xa.hold(row(4));
        assert_eq!(xa.finish_reading().len(), 1);
        assert!(xa.before().is_none() && xa.reading.is_none());
    }
}
