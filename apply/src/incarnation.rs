//! Skipping a revived capture's late records.
//!
//! A capture taken over by its successor (a standby, or a restart elsewhere) while it was
//! paused, cut off or frozen may still hold records in its producer's queue; when it runs
//! again they reach Kafka after the successor's. The successor re-reads the source from the
//! last checkpoint, so everything those records say is published again, in order: they are
//! only harmful where they land after the successor's records, where they would take a
//! document or row back to an older state.
//!
//! Every capture record carries its connector and incarnation
//! ([`sluice_common::kafka::INCARNATION_HEADER`], `<connector>/<n>`), higher for each start
//! of a connector. Per partition and connector the stage keeps the highest seen so far and
//! skips any record of that connector below it. The incarnations reached at a partition's
//! stored offset go with that offset into the group's commit, as its metadata
//! (`sluice.incarnation={"<connector>":n}`), and are read back when the partition is
//! assigned: a restarted or rebalanced stage skips exactly what the one before it would have.
//! Records without the header (captures older than the header) are always handled.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Mutex;

use rdkafka::message::Headers;
use rdkafka::Message;

/// The commit metadata's prefix.
const METADATA: &str = "sluice.incarnation=";

/// Commit metadata longer than this is left out (brokers refuse more than
/// `offset.metadata.max.bytes`, 4 096 by default): the partition is then not fenced after a
/// restart until a record of each connector is read again.
const METADATA_MAX: usize = 3_000;

/// What [`Incarnations::admit`] decided for one record.
#[derive(Debug, PartialEq, Eq)]
pub enum Admit {
    /// Handle it.
    Yes,
    /// Skip it: a later incarnation of its connector wrote to the partition before it.
    /// `first` is true for the first such record of this incarnation in the partition (to log
    /// once).
    Stale { seen: u64, first: bool },
}

#[derive(Default, Debug)]
struct Connector {
    /// The highest incarnation admitted.
    max: u64,
    /// Where it rose, (offset, incarnation), past the last stored offset.
    rises: VecDeque<(i64, u64)>,
    /// The incarnation reached at the last stored offset.
    stored: u64,
    /// The incarnation whose stale records were last logged.
    logged: Option<u64>,
}

/// topic -> partition -> connector -> what is known of it.
// (foldhash, not SipHash: every record looks its topic and connector up here)
type Known = FastMap<String, FastMap<i32, FastMap<String, Connector>>>;
type FastMap<K, V> = foldhash::HashMap<K, V>;

/// Per partition of one consumer: the highest capture incarnation seen of each connector.
#[derive(Default)]
pub struct Incarnations(Mutex<Known>);

/// The connector and incarnation a record carries (`None` without the header, or with one
/// that is not `<connector>/<n>`).
pub fn of<M: Message>(m: &M) -> Option<(&str, u64)> {
    let headers = m.headers()?;
    let value = headers
        .iter()
        .find(|h| h.key == sluice_common::kafka::INCARNATION_HEADER)?
        .value?;
    parse(std::str::from_utf8(value).ok()?)
}

/// `<connector>/<n>`, as in the header.
pub fn parse(value: &str) -> Option<(&str, u64)> {
    let (connector, n) = value.rsplit_once('/')?;
    Some((connector, n.parse().ok()?))
}

/// The incarnations in a commit's metadata, if it holds them.
pub fn from_metadata(metadata: &str) -> Option<BTreeMap<String, u64>> {
    serde_json::from_str(metadata.strip_prefix(METADATA)?).ok()
}

/// A commit's metadata for `incarnations` (`None` when too long to commit).
pub fn metadata(incarnations: &BTreeMap<String, u64>) -> Option<String> {
    let json = serde_json::to_string(incarnations).ok()?;
    let m = format!("{METADATA}{json}");
    (m.len() <= METADATA_MAX).then_some(m)
}

impl Incarnations {
    /// The record at `offset` of `topic`/`partition` carries `stamp` (its connector and
    /// incarnation): handle it or skip it. Records come in partition order.
    pub fn admit(
        &self,
        topic: &str,
        partition: i32,
        offset: i64,
        stamp: Option<(&str, u64)>,
    ) -> Admit {
        let Some((connector, incarnation)) = stamp else {
            return Admit::Yes;
        };
        let mut all = self.0.lock().expect("incarnations lock");
        let connectors = match all.get_mut(topic) {
            Some(t) => t.entry(partition).or_default(),
            None => all
                .entry(topic.to_string())
                .or_default()
                .entry(partition)
                .or_default(),
        };
        let c = match connectors.get_mut(connector) {
            Some(c) => c,
            None => connectors.entry(connector.to_string()).or_default(),
        };
        if incarnation < c.max {
            let first = c.logged != Some(incarnation);
            c.logged = Some(incarnation);
            return Admit::Stale { seen: c.max, first };
        }
        if incarnation > c.max {
            c.max = incarnation;
            c.rises.push_back((offset, incarnation));
        }
        Admit::Yes
    }

    /// The offset `last` of `topic`/`partition` is being stored: the incarnations reached
    /// there, for the commit's metadata (`None` when nothing is known of the partition).
    pub fn at(&self, topic: &str, partition: i32, last: i64) -> Option<BTreeMap<String, u64>> {
        let mut all = self.0.lock().expect("incarnations lock");
        let connectors = all.get_mut(topic)?.get_mut(&partition)?;
        let mut out = BTreeMap::new();
        for (name, c) in connectors.iter_mut() {
            while let Some(&(offset, incarnation)) = c.rises.front() {
                if offset > last {
                    break;
                }
                c.stored = incarnation;
                c.rises.pop_front();
            }
            if c.stored > 0 {
                out.insert(name.clone(), c.stored);
            }
        }
        (!out.is_empty()).then_some(out)
    }

    /// `topic`/`partition` was just assigned, its committed offset carrying `incarnations`.
    pub fn assigned(&self, topic: &str, partition: i32, incarnations: BTreeMap<String, u64>) {
        let mut all = self.0.lock().expect("incarnations lock");
        let known = incarnations
            .into_iter()
            .map(|(name, n)| {
                let c = Connector {
                    max: n,
                    stored: n,
                    ..Default::default()
                };
                (name, c)
            })
            .collect();
        all.entry(topic.to_string())
            .or_default()
            .insert(partition, known);
    }

    /// Every partition was let go (the group's assignors are eager).
    pub fn clear(&self) {
        self.0.lock().expect("incarnations lock").clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(pairs: &[(&str, u64)]) -> BTreeMap<String, u64> {
        pairs.iter().map(|(k, v)| (k.to_string(), *v)).collect()
    }

    /// Records of an older incarnation are skipped only after a newer one's of the same
    /// connector in the same partition; before it, in other partitions, and of other
    /// connectors, they are handled.
    #[test]
    fn a_lower_incarnation_is_skipped_only_after_a_higher_one_of_its_connector_in_its_partition() {
        let i = Incarnations::default();
        let a = |n| Some(("a", n));
        assert_eq!(i.admit("t", 0, 0, a(1)), Admit::Yes);
        assert_eq!(i.admit("t", 0, 1, a(1)), Admit::Yes);
        assert_eq!(i.admit("t", 0, 2, a(2)), Admit::Yes);
        assert_eq!(
            i.admit("t", 0, 3, a(1)),
            Admit::Stale {
                seen: 2,
                first: true
            }
        );
        assert_eq!(
            i.admit("t", 0, 4, a(1)),
            Admit::Stale {
                seen: 2,
                first: false
            }
        );
        assert_eq!(i.admit("t", 0, 5, a(2)), Admit::Yes);
        // Another connector sharing the topic has its own numbers.
        assert_eq!(i.admit("t", 0, 6, Some(("b", 1))), Admit::Yes);
        // Another partition, and another topic, have their own.
        assert_eq!(i.admit("t", 1, 0, a(1)), Admit::Yes);
        assert_eq!(i.admit("u", 0, 0, a(1)), Admit::Yes);
        // Headerless records (older captures) are always handled.
        assert_eq!(i.admit("t", 0, 7, None), Admit::Yes);
    }

    /// The incarnation stored with an offset is the one reached at that offset, never one
    /// that rose after it (which would skip records the successor never sends again).
    #[test]
    fn the_stored_incarnation_is_the_one_reached_at_the_stored_offset() {
        let i = Incarnations::default();
        assert_eq!(i.at("t", 0, 5), None, "nothing known of the partition");
        i.assigned("t", 0, m(&[("a", 3)]));
        assert_eq!(i.at("t", 0, 5), Some(m(&[("a", 3)])));
        i.admit("t", 0, 10, Some(("a", 3)));
        i.admit("t", 0, 11, Some(("a", 4)));
        i.admit("t", 0, 12, Some(("b", 9)));
        i.admit("t", 0, 20, Some(("a", 6)));
        assert_eq!(
            i.at("t", 0, 10),
            Some(m(&[("a", 3)])),
            "the rise at 11 is past 10"
        );
        assert_eq!(i.at("t", 0, 11), Some(m(&[("a", 4)])));
        assert_eq!(i.at("t", 0, 19), Some(m(&[("a", 4), ("b", 9)])));
        assert_eq!(i.at("t", 0, 25), Some(m(&[("a", 6), ("b", 9)])));
        // A restart from that commit goes on where it was.
        let j = Incarnations::default();
        let meta = metadata(&m(&[("a", 6), ("b", 9)])).unwrap();
        j.assigned("t", 0, from_metadata(&meta).unwrap());
        assert!(matches!(
            j.admit("t", 0, 26, Some(("a", 5))),
            Admit::Stale { seen: 6, .. }
        ));
        assert_eq!(j.admit("t", 0, 27, Some(("b", 9))), Admit::Yes);
        j.clear();
        assert_eq!(j.at("t", 0, 26), None);
    }

    #[test]
    fn metadata_round_trips_and_foreign_or_oversized_metadata_is_left_out() {
        let one = m(&[("mysql-main", 42)]);
        assert_eq!(
            metadata(&one).as_deref(),
            Some(r#"sluice.incarnation={"mysql-main":42}"#)
        );
        assert_eq!(from_metadata(&metadata(&one).unwrap()), Some(one));
        assert_eq!(from_metadata(""), None);
        assert_eq!(from_metadata("someone else's"), None);
        assert_eq!(from_metadata("sluice.incarnation=x"), None);
        let many: BTreeMap<String, u64> = (0..200).map(|n| (format!("connector-{n}"), n)).collect();
        assert_eq!(
            metadata(&many),
            None,
            "longer than a broker takes by default"
        );
    }

    #[test]
    fn the_header_is_read_as_connector_slash_number() {
        use rdkafka::message::{Header, OwnedHeaders, OwnedMessage, Timestamp};
        let with = |value: Option<&str>| {
            let headers = value.map(|v| {
                OwnedHeaders::new().insert(Header {
                    key: sluice_common::kafka::INCARNATION_HEADER,
                    value: Some(v),
                })
            });
            OwnedMessage::new(
                None,
                None,
                "t".into(),
                Timestamp::NotAvailable,
                0,
                0,
                headers,
            )
        };
        assert_eq!(of(&with(Some("main/7"))), Some(("main", 7)));
        assert_eq!(
            of(&with(Some("a/b/1764880000123"))),
            Some(("a/b", 1764880000123))
        );
        assert_eq!(of(&with(None)), None);
        assert_eq!(of(&with(Some("7"))), None);
        assert_eq!(of(&with(Some("main/seven"))), None);
    }
}
