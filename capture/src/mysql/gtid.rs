//! The set of transactions the capture has read, as GTIDs: what it resumes from on another
//! server of the same replication topology (a fail-over to a promoted replica), where binlog
//! file names and offsets mean nothing.
//!
//! - MariaDB: a GTID is `domain-server-seq`; within a domain the sequence numbers only grow
//!   (`gtid_strict_mode`), so the position is the last GTID of each domain, the form
//!   `@slave_connect_state` takes (`0-1-100,1-2-7`).
//! - MySQL: a GTID is `uuid:number`, or `uuid:tag:number` (8.4's tagged GTIDs); the set is
//!   each uuid's (and tag's) intervals (`uuid:1-100:105,uuid:tag:1-3`), the form
//!   `gtid_executed` and `COM_BINLOG_DUMP_GTID` take. A `PREVIOUS_GTIDS` event at the start of
//!   each binlog file holds the set of every transaction before that file.

use std::collections::BTreeMap;
use std::fmt;

/// A GTID set of one server flavour.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GtidSet {
    /// domain -> (server_id, seq) of its last transaction.
    MariaDb(BTreeMap<u32, (u32, u64)>),
    /// `uuid` or `uuid:tag` (lower case, with dashes) -> closed intervals, sorted and
    /// disjoint.
    MySql(BTreeMap<String, Vec<(u64, u64)>>),
}

impl GtidSet {
    /// An empty set of the flavour.
    pub fn empty(mariadb: bool) -> Self {
        if mariadb {
            Self::MariaDb(BTreeMap::new())
        } else {
            Self::MySql(BTreeMap::new())
        }
    }

    /// Parse a set as the server writes it (whitespace and newlines, which MySQL puts after
    /// each comma, are ignored).
    pub fn parse(s: &str, mariadb: bool) -> Result<Self, String> {
        let mut set = Self::empty(mariadb);
        let s: String = s.chars().filter(|c| !c.is_whitespace()).collect();
        for part in s.split(',').filter(|p| !p.is_empty()) {
            match &mut set {
                Self::MariaDb(m) => {
                    let (domain, server, seq) = parse_mariadb(part)?;
                    let e = m.entry(domain).or_insert((server, seq));
                    if seq >= e.1 {
                        *e = (server, seq);
                    }
                }
                Self::MySql(m) => {
                    let mut fields = part.split(':');
                    let uuid = normalize_uuid(fields.next().unwrap_or_default())
                        .ok_or_else(|| format!("GTID set {part:?}: not a server uuid"))?;
                    let mut key = uuid.clone();
                    let mut any = false;
                    for iv in fields {
                        if iv.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_') {
                            key = format!(
                                "{uuid}:{}",
                                tag(iv)
                                    .ok_or_else(|| { format!("GTID set {part:?}: tag {iv:?}") })?
                            );
                            continue;
                        }
                        let intervals = m.entry(key.clone()).or_default();
                        let (a, b) = match iv.split_once('-') {
                            Some((a, b)) => (a, b),
                            None => (iv, iv),
                        };
                        let (a, b): (u64, u64) = (
                            a.parse()
                                .map_err(|_| format!("GTID set {part:?}: {iv:?}"))?,
                            b.parse()
                                .map_err(|_| format!("GTID set {part:?}: {iv:?}"))?,
                        );
                        if a == 0 || b < a {
                            return Err(format!("GTID set {part:?}: interval {iv:?}"));
                        }
                        insert_interval(intervals, a, b);
                        any = true;
                    }
                    if !any {
                        return Err(format!("GTID set {part:?}: no transaction numbers"));
                    }
                }
            }
        }
        Ok(set)
    }

    /// Add one transaction's GTID (`d-s-n` or `uuid:n`, as the capture formats them).
    pub fn add(&mut self, gtid: &str) -> Result<(), String> {
        match self {
            Self::MariaDb(m) => {
                let (domain, server, seq) = parse_mariadb(gtid)?;
                // The last one of the domain: in strict mode that is the highest.
                m.insert(domain, (server, seq));
            }
            Self::MySql(m) => {
                let (key, n) = gtid
                    .rsplit_once(':')
                    .ok_or_else(|| format!("GTID {gtid:?}: expected uuid:number"))?;
                let (uuid, t) = match key.split_once(':') {
                    Some((u, t)) => (u, Some(t)),
                    None => (key, None),
                };
                let uuid = normalize_uuid(uuid)
                    .ok_or_else(|| format!("GTID {gtid:?}: not a server uuid"))?;
                let key = match t {
                    Some(t) => format!(
                        "{uuid}:{}",
                        tag(t).ok_or_else(|| format!("GTID {gtid:?}: tag {t:?}"))?
                    ),
                    None => uuid,
                };
                let n: u64 = n.parse().map_err(|_| format!("GTID {gtid:?}: number"))?;
                insert_interval(m.entry(key).or_default(), n, n);
            }
        }
        Ok(())
    }

    pub fn is_empty(&self) -> bool {
        match self {
            Self::MariaDb(m) => m.is_empty(),
            Self::MySql(m) => m.is_empty(),
        }
    }

    /// The transactions of `self` that `other` lacks, as text (empty: none). MariaDB: each
    /// domain whose last sequence number here is above `other`'s (or that `other` lacks);
    /// MySQL: the numbers not in `other`'s intervals.
    pub fn missing_from(&self, other: &GtidSet) -> String {
        match (self, other) {
            (Self::MariaDb(a), Self::MariaDb(b)) => a
                .iter()
                .filter(|(d, (_, seq))| b.get(d).is_none_or(|(_, s)| s < seq))
                .map(|(d, (server, seq))| {
                    let from = b.get(d).map_or(1, |(_, s)| s + 1);
                    if from == *seq {
                        format!("{d}-{server}-{seq}")
                    } else {
                        format!("domain {d} seq {from}..{seq} (last {d}-{server}-{seq})")
                    }
                })
                .collect::<Vec<_>>()
                .join(", "),
            (Self::MySql(a), Self::MySql(b)) => {
                let mut out = GtidSet::MySql(BTreeMap::new());
                for (uuid, ivs) in a {
                    let have = b.get(uuid).cloned().unwrap_or_default();
                    for &(lo, hi) in ivs {
                        for (x, y) in subtract(lo, hi, &have) {
                            if let GtidSet::MySql(m) = &mut out {
                                insert_interval(m.entry(uuid.clone()).or_default(), x, y);
                            }
                        }
                    }
                }
                out.to_string()
            }
            _ => "(a GTID set of the other server flavour)".into(),
        }
    }
}

impl GtidSet {
    /// MariaDB: every domain of `self` has the same last GTID in `at` (the server's state at
    /// a binlog position, which may name more domains). MySQL: `self` is within `at`.
    pub fn agrees_with(&self, at: &GtidSet) -> bool {
        match (self, at) {
            (Self::MariaDb(a), Self::MariaDb(b)) => a.iter().all(|(d, v)| b.get(d) == Some(v)),
            _ => self.missing_from(at).is_empty(),
        }
    }
}

impl fmt::Display for GtidSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let parts: Vec<String> = match self {
            Self::MariaDb(m) => m.iter().map(|(d, (s, n))| format!("{d}-{s}-{n}")).collect(),
            Self::MySql(m) => m
                .iter()
                .filter(|(_, ivs)| !ivs.is_empty())
                .map(|(u, ivs)| {
                    let ivs: Vec<String> = ivs
                        .iter()
                        .map(|&(a, b)| {
                            if a == b {
                                a.to_string()
                            } else {
                                format!("{a}-{b}")
                            }
                        })
                        .collect();
                    format!("{u}:{}", ivs.join(":"))
                })
                .collect(),
        };
        f.write_str(&parts.join(","))
    }
}

fn parse_mariadb(s: &str) -> Result<(u32, u32, u64), String> {
    let mut it = s.split('-');
    let (Some(d), Some(sv), Some(n), None) = (it.next(), it.next(), it.next(), it.next()) else {
        return Err(format!("GTID {s:?}: expected domain-server-seq"));
    };
    let bad = || format!("GTID {s:?}: expected domain-server-seq");
    Ok((
        d.parse().map_err(|_| bad())?,
        sv.parse().map_err(|_| bad())?,
        n.parse().map_err(|_| bad())?,
    ))
}

/// `3E11FA47-71CA-11E1-9E33-C80AA9429562` or without dashes -> lower case with dashes.
fn normalize_uuid(s: &str) -> Option<String> {
    let hex: String = s.chars().filter(|&c| c != '-').collect();
    if hex.len() != 32 || !hex.chars().all(|c| c.is_ascii_hexdigit()) {
        return None;
    }
    let h = hex.to_ascii_lowercase();
    Some(format!(
        "{}-{}-{}-{}-{}",
        &h[0..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..32]
    ))
}

/// Add `[a, b]` to sorted disjoint intervals, merging neighbours.
fn insert_interval(ivs: &mut Vec<(u64, u64)>, a: u64, b: u64) {
    let (mut lo, mut hi) = (a, b);
    let mut out = Vec::with_capacity(ivs.len() + 1);
    let mut placed = false;
    for &(x, y) in ivs.iter() {
        if y.saturating_add(1) < lo {
            out.push((x, y));
        } else if hi.saturating_add(1) < x {
            if !placed {
                out.push((lo, hi));
                placed = true;
            }
            out.push((x, y));
        } else {
            lo = lo.min(x);
            hi = hi.max(y);
        }
    }
    if !placed {
        out.push((lo, hi));
        out.sort_unstable();
    }
    *ivs = out;
}

/// `[lo, hi]` minus the intervals `have`.
fn subtract(lo: u64, hi: u64, have: &[(u64, u64)]) -> Vec<(u64, u64)> {
    let mut out = Vec::new();
    let mut from = lo;
    for &(x, y) in have {
        if y < from || x > hi {
            continue;
        }
        if x > from {
            out.push((from, x - 1));
        }
        from = y.saturating_add(1);
        if from > hi {
            return out;
        }
    }
    if from <= hi {
        out.push((from, hi));
    }
    out
}

/// A GTID tag (MySQL 8.4): `[a-z_][a-z0-9_]{0,31}`, compared in lower case.
fn tag(s: &str) -> Option<String> {
    let t = s.to_ascii_lowercase();
    let ok = !t.is_empty()
        && t.len() <= 32
        && t.starts_with(|c: char| c.is_ascii_lowercase() || c == '_')
        && t.chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
    ok.then_some(t)
}

/// A GTID as the capture writes it: `uuid:number`, or `uuid:tag:number`.
pub fn mysql_gtid(sid: [u8; 16], tag: Option<&str>, gno: u64) -> String {
    let uuid = uuid_text(sid);
    match tag {
        Some(t) => format!("{uuid}:{}:{gno}", t.to_ascii_lowercase()),
        None => format!("{uuid}:{gno}"),
    }
}

fn uuid_text(sid: [u8; 16]) -> String {
    let hex: String = sid.iter().map(|b| format!("{b:02x}")).collect();
    normalize_uuid(&hex).expect("32 hex digits")
}

/// The set of a MySQL `PREVIOUS_GTIDS_LOG_EVENT` (type 35, as the driver decodes it, tagged
/// or not): every transaction written before the binlog file it opens.
pub fn from_previous_gtids(ev: &mysql_common::binlog::events::PreviousGtidsEvent<'_>) -> GtidSet {
    let mut m: BTreeMap<String, Vec<(u64, u64)>> = BTreeMap::new();
    for sid in ev.sids() {
        let uuid = uuid_text(sid.uuid());
        let key = match sid.tag() {
            Some(t) => format!("{uuid}:{}", t.as_str().to_ascii_lowercase()),
            None => uuid,
        };
        let ivs = m.entry(key).or_default();
        for iv in sid.intervals() {
            // Stored with an exclusive end.
            if iv.end() > iv.start() {
                insert_interval(ivs, iv.start(), iv.end() - 1);
            }
        }
    }
    GtidSet::MySql(m)
}

#[cfg(test)]
mod tests {
    use super::*;

    const U: &str = "3e11fa47-71ca-11e1-9e33-c80aa9429562";

    #[test]
    fn mariadb_keeps_the_last_gtid_of_each_domain() {
        let mut s = GtidSet::parse("0-1-100, 1-2-7", true).unwrap();
        s.add("0-1-101").unwrap();
        s.add("0-3-102").unwrap();
        s.add("2-1-1").unwrap();
        assert_eq!(s.to_string(), "0-3-102,1-2-7,2-1-1");
        assert!(GtidSet::parse("0-1", true).is_err());
        assert!(GtidSet::parse("0-1-x", true).is_err());
        assert!(GtidSet::parse("", true).unwrap().is_empty());
    }

    #[test]
    fn a_position_agrees_only_with_the_same_last_gtids() {
        let ours = GtidSet::parse("0-1-100,1-2-7", true).unwrap();
        for (theirs, agrees) in [
            ("0-1-100,1-2-7", true),
            ("0-1-100,1-2-7,5-9-1", true),
            ("0-1-99,1-2-7", false),
            ("0-1-101,1-2-7", false),
            ("0-3-100,1-2-7", false),
            ("0-1-100", false),
            ("", false),
        ] {
            let theirs = GtidSet::parse(theirs, true).unwrap();
            assert_eq!(ours.agrees_with(&theirs), agrees, "{theirs}");
        }
        let ours = GtidSet::parse(&format!("{U}:1-10"), false).unwrap();
        let wider = GtidSet::parse(&format!("{U}:1-20"), false).unwrap();
        assert!(ours.agrees_with(&wider));
        assert!(!wider.agrees_with(&ours));
    }

    #[test]
    fn mysql_intervals_merge_and_print_as_the_server_does() {
        let mut s = GtidSet::parse(&format!("{}:1-5:7,\n{U}:9", U.to_uppercase()), false).unwrap();
        assert_eq!(s.to_string(), format!("{U}:1-5:7:9"));
        s.add(&format!("{U}:6")).unwrap();
        s.add(&format!("{U}:8")).unwrap();
        assert_eq!(s.to_string(), format!("{U}:1-9"));
        s.add(&format!("{U}:20")).unwrap();
        s.add(&format!("{U}:3")).unwrap();
        assert_eq!(s.to_string(), format!("{U}:1-9:20"));
        let other = "aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee";
        s.add(&format!("{other}:1")).unwrap();
        assert_eq!(s.to_string(), format!("{U}:1-9:20,{other}:1"));
        assert!(GtidSet::parse(&format!("{U}:5-3"), false).is_err());
        assert!(GtidSet::parse(&format!("{U}:0"), false).is_err());
        assert!(GtidSet::parse("nope:1", false).is_err());
        assert!(GtidSet::parse(U, false).is_err());
    }

    #[test]
    fn missing_names_what_the_other_server_lacks() {
        let a = GtidSet::parse("0-1-100,1-2-7", true).unwrap();
        let b = GtidSet::parse("0-1-97,1-2-9", true).unwrap();
        assert_eq!(a.missing_from(&b), "domain 0 seq 98..100 (last 0-1-100)");
        assert_eq!(b.missing_from(&a), "domain 1 seq 8..9 (last 1-2-9)");
        let c = GtidSet::parse("0-1-99", true).unwrap();
        assert_eq!(
            a.missing_from(&c),
            "0-1-100, domain 1 seq 1..7 (last 1-2-7)"
        );
        assert_eq!(c.missing_from(&a), "");

        let x = GtidSet::parse(&format!("{U}:1-100"), false).unwrap();
        let y = GtidSet::parse(&format!("{U}:1-40:45-90"), false).unwrap();
        assert_eq!(x.missing_from(&y), format!("{U}:41-44:91-100"));
        assert_eq!(y.missing_from(&x), "");
    }

    /// A PREVIOUS_GTIDS event as MySQL writes it (libbinlogevents `Previous_gtids_event`:
    /// intervals with an exclusive end; 8.4 adds a tag per entry): two servers, the first
    /// with 1-5 and 7 (stored as [1,6) and [7,8)), the second tagged.
    #[test]
    fn previous_gtids_become_the_set() {
        use mysql_common::binlog::events::{PreviousGtidsEvent, PreviousGtidsSid};
        use mysql_common::packets::{GnoInterval, Tag};
        let ev = PreviousGtidsEvent::new(vec![
            PreviousGtidsSid::new(
                [0x11; 16],
                None,
                vec![GnoInterval::new(1, 6), GnoInterval::new(7, 8)],
            ),
            PreviousGtidsSid::new(
                [0xab; 16],
                Some(Tag::new("blue").unwrap()),
                vec![GnoInterval::new(1, 101)],
            ),
        ]);
        let set = from_previous_gtids(&ev);
        assert_eq!(
            set.to_string(),
            "11111111-1111-1111-1111-111111111111:1-5:7,\
             abababab-abab-abab-abab-abababababab:blue:1-100"
        );
        // What the set prints, it parses back to.
        assert_eq!(GtidSet::parse(&set.to_string(), false).unwrap(), set);
    }

    #[test]
    fn tagged_gtids_are_their_own_intervals() {
        let mut s = GtidSet::parse(&format!("{U}:1-3:blue:1-2:7"), false).unwrap();
        assert_eq!(s.to_string(), format!("{U}:1-3,{U}:blue:1-2:7"));
        s.add(&format!("{U}:blue:3")).unwrap();
        s.add(&format!("{U}:4")).unwrap();
        assert_eq!(s.to_string(), format!("{U}:1-4,{U}:blue:1-3:7"));
        assert_eq!(
            mysql_gtid([0x11; 16], Some("Blue"), 9),
            "11111111-1111-1111-1111-111111111111:blue:9"
        );
        assert!(GtidSet::parse(&format!("{U}:Bad-Tag:1"), false).is_err());
        assert!(s.add(&format!("{U}:9tag:1")).is_err());
    }
}
