//! Whether the consumer is still in its group, told from the broker's side: every 5 s the
//! partitions of the subscribed topics that no member of the group holds
//! (`sluice_apply_unheld_partitions`). A consumer that holds none while some are held by no
//! member, or that is no member of the group (by its member id), is out of its group (its
//! session was lost and it did not come back, or the group is empty): `/healthz` says so after [`DEGRADED_AFTER`], and after [`REJOIN_AFTER`] (when the
//! group is not in the middle of a rebalance) the run loop replaces the consumer, as a restart
//! would. A broker that does not answer for [`DEGRADED_AFTER`] is said in `/healthz` too.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rdkafka::consumer::{Consumer, StreamConsumer};

use super::context::GroupContext;
use super::offsets::Drain;

/// How often the group is looked at.
const EVERY: Duration = Duration::from_secs(5);
/// How long a consumer may be out of its group (or the brokers silent) before `/healthz` says
/// so: longer than an ordinary rebalance.
pub(super) const DEGRADED_AFTER: Duration = Duration::from_secs(15);
/// How long a consumer may be out of its group before it is replaced: longer than any rebalance
/// that is not waiting for a stuck member.
pub(super) const REJOIN_AFTER: Duration = Duration::from_secs(30);

/// A (topic, partition).
type Partition = (String, i32);

/// What the broker says of the group now.
#[derive(Debug, PartialEq)]
pub(super) struct Seen {
    /// Partitions of the subscribed topics no member holds.
    pub unheld: BTreeSet<Partition>,
    /// The group's state (`Stable`, `Empty`, `PreparingRebalance`, ...).
    pub state: String,
    pub members: usize,
    /// Whether this consumer is one of the members (by its member id).
    pub member: bool,
    /// The partitions of the subscribed topics (none yet: nothing to be a member for).
    pub subscribed: usize,
}

/// This consumer's member id in its group (none before it joined, or after its session was
/// lost).
fn member_id<C: rdkafka::consumer::ConsumerContext>(
    consumer: &StreamConsumer<C>,
) -> Option<String> {
    let rk = consumer.client().native_ptr();
    // SAFETY: `rk` is the live handle `consumer` holds for the length of the call;
    // rd_kafka_memberid returns a string librdkafka allocated (or null), copied here and freed
    // with rd_kafka_mem_free, as its documentation asks.
    unsafe {
        let p = rdkafka::bindings::rd_kafka_memberid(rk);
        if p.is_null() {
            return None;
        }
        let id = std::ffi::CStr::from_ptr(p).to_string_lossy().into_owned();
        rdkafka::bindings::rd_kafka_mem_free(rk, p.cast());
        (!id.is_empty()).then_some(id)
    }
}

/// The partitions of the topics `subscription` names (a name, or a `^regex`) in `topics`
/// (name, partition count).
fn subscribed(subscription: &[String], topics: &[(String, i32)]) -> BTreeSet<Partition> {
    let names: Vec<String> = topics
        .iter()
        .filter(|(t, _)| !t.starts_with("__"))
        .map(|(t, _)| t.clone())
        .collect();
    let matched = crate::consumer::matching(subscription, &names);
    topics
        .iter()
        .filter(|(t, _)| matched.contains(&t))
        .flat_map(|(t, n)| (0..*n).map(move |p| (t.clone(), p)))
        .collect()
}

/// A member's assignment, as the consumer protocol encodes it: version (int16), an array of
/// (topic string, partitions int32 array), then user data. None when it does not parse.
/// (`sluice status` lists the members' partitions with it too.)
pub fn assignment(bytes: &[u8]) -> Option<std::collections::BTreeMap<String, Vec<i32>>> {
    let mut r = bytes;
    fn take<'a>(r: &mut &'a [u8], n: usize) -> Option<&'a [u8]> {
        let (a, b) = (r.get(..n)?, r.get(n..)?);
        *r = b;
        Some(a)
    }
    let i16_ = |r: &mut &[u8]| take(r, 2).map(|b| i16::from_be_bytes([b[0], b[1]]));
    let i32_ = |r: &mut &[u8]| take(r, 4).map(|b| i32::from_be_bytes([b[0], b[1], b[2], b[3]]));
    let mut out = std::collections::BTreeMap::new();
    if r.is_empty() {
        return Some(out);
    }
    i16_(&mut r)?; // version
    let topics = i32_(&mut r)?;
    for _ in 0..topics.max(0) {
        let len = i16_(&mut r)?;
        let name = std::str::from_utf8(take(&mut r, len.max(0) as usize)?).ok()?;
        let n = i32_(&mut r)?;
        let mut ps = Vec::with_capacity(n.max(0) as usize);
        for _ in 0..n.max(0) {
            ps.push(i32_(&mut r)?);
        }
        ps.sort_unstable();
        out.insert(name.to_string(), ps);
    }
    Some(out)
}

/// Ask the broker (blocking): the subscribed topics' partitions and what the group's members
/// hold of them.
fn look<C: rdkafka::consumer::ConsumerContext>(
    consumer: &StreamConsumer<C>,
    group: &str,
    timeout: Duration,
) -> Result<Seen, String> {
    let subscription: Vec<String> = consumer
        .subscription()
        .map_err(|e| format!("the subscription: {e}"))?
        .elements()
        .iter()
        .map(|e| e.topic().to_string())
        .collect();
    let metadata = consumer
        .fetch_metadata(None, timeout)
        .map_err(|e| format!("the cluster's topics: {e}"))?;
    let topics: Vec<(String, i32)> = metadata
        .topics()
        .iter()
        .filter(|t| t.error().is_none())
        .map(|t| (t.name().to_string(), t.partitions().len() as i32))
        .collect();
    let list = consumer
        .fetch_group_list(Some(group), timeout)
        .map_err(|e| format!("group {group}: {e}"))?;
    let g = list
        .groups()
        .iter()
        .find(|g| g.name() == group)
        .ok_or_else(|| format!("group {group}: not described"))?;
    let mut unheld = subscribed(&subscription, &topics);
    let all = unheld.len();
    for m in g.members() {
        for (t, ps) in m.assignment().and_then(assignment).unwrap_or_default() {
            for p in ps {
                unheld.remove(&(t.clone(), p));
            }
        }
    }
    let me = member_id(consumer);
    Ok(Seen {
        unheld,
        state: g.state().to_string(),
        members: g.members().len(),
        member: me.is_some_and(|me| g.members().iter().any(|m| m.id() == me)),
        subscribed: all,
    })
}

/// The partitions as `topic[0,1] other[2]`, at most `max` topics named.
fn listed(ps: &BTreeSet<Partition>, max: usize) -> String {
    let mut by: std::collections::BTreeMap<&str, Vec<i32>> = Default::default();
    for (t, p) in ps {
        by.entry(t).or_default().push(*p);
    }
    let n = by.len();
    let mut out: Vec<String> = by
        .into_iter()
        .take(max)
        .map(|(t, ps)| {
            let ps: Vec<String> = ps.iter().map(ToString::to_string).collect();
            format!("{t}[{}]", ps.join(","))
        })
        .collect();
    if n > max {
        out.push(format!("and {} more topics", n - max));
    }
    out.join(" ")
}

/// What the watch concludes from one look, given how long the consumer has held nothing while
/// partitions were unheld (`out_for`).
#[derive(Debug, PartialEq)]
pub(super) enum Verdict {
    /// In its group, or holding partitions: nothing to say.
    Fine,
    /// Out of its group for a while: `/healthz` says why.
    Degraded(String),
    /// Out for long enough, and the group is not rebalancing: replace the consumer.
    Rejoin(String),
}

/// Whether a consumer holding `held` partitions is out of its group, as `seen`: its topics have
/// partitions, it holds none, and it is no member, or some partitions are held by no member.
/// (Before the topics exist, a new pipeline's, librdkafka joins no group: that is no fault.)
pub(super) fn out(held: i64, seen: &Seen) -> bool {
    held == 0 && seen.subscribed > 0 && (!seen.member || !seen.unheld.is_empty())
}

pub(super) fn verdict(held: i64, seen: &Seen, group: &str, out_for: Duration) -> Verdict {
    if !out(held, seen) {
        return Verdict::Fine;
    }
    let why = if seen.unheld.is_empty() {
        format!(
            "this instance holds no partition and is not a member of group {group} ({}, {} \
             members) for {} s",
            seen.state,
            seen.members,
            out_for.as_secs()
        )
    } else {
        format!(
            "this instance holds no partition while {} partitions of its topics are held by no \
             member of group {group} ({}, {} members) for {} s: {}",
            seen.unheld.len(),
            seen.state,
            seen.members,
            out_for.as_secs(),
            listed(&seen.unheld, 3)
        )
    };
    let rebalancing = seen.state.ends_with("Rebalance");
    if out_for >= REJOIN_AFTER && !rebalancing {
        Verdict::Rejoin(why)
    } else if out_for >= DEGRADED_AFTER {
        Verdict::Degraded(why)
    } else {
        Verdict::Fine
    }
}

/// Look at the group every [`EVERY`] until the task is stopped: the unheld partitions in the
/// metric; out of the group, or the brokers silent, in `/healthz`; out for long, the consumer
/// marked to be replaced ([`GroupContext::out_of_group`]).
pub(super) async fn watch<D: Drain>(
    consumer: Arc<StreamConsumer<GroupContext<D>>>,
    stop: Arc<std::sync::atomic::AtomicBool>,
) {
    let ctx = || consumer.context();
    let (Some(group), Some(health)) = (ctx().group.clone(), ctx().health.clone()) else {
        return;
    };
    let mut out_since: Option<Instant> = None;
    // (the brokers' silence is counted from their last answer)
    let mut last_answer = Instant::now();
    let mut silent = false;
    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
        tokio::time::sleep(EVERY).await;
        if stop.load(std::sync::atomic::Ordering::Relaxed) {
            break;
        }
        let (c, g) = (consumer.clone(), group.clone());
        let seen = tokio::task::spawn_blocking(move || look(&c, &g, Duration::from_secs(3)))
            .await
            .unwrap_or_else(|e| Err(e.to_string()));
        let seen = match seen {
            Ok(s) => {
                last_answer = Instant::now();
                if std::mem::take(&mut silent) {
                    health.set("kafka", None);
                    tracing::info!("the Kafka brokers answer again");
                }
                s
            }
            Err(e) => {
                let for_ = last_answer.elapsed();
                if for_ >= DEGRADED_AFTER {
                    let why = format!(
                        "no answer from the Kafka brokers for {} s: {e}",
                        for_.as_secs()
                    );
                    if !std::mem::replace(&mut silent, true) {
                        tracing::warn!(%why, "the Kafka brokers do not answer");
                    }
                    health.set("kafka", Some(why));
                }
                continue;
            }
        };
        ctx().metrics.unheld.set(seen.unheld.len() as i64);
        let held = ctx().metrics.assigned.get();
        let out_for = if out(held, &seen) {
            out_since.get_or_insert_with(Instant::now).elapsed()
        } else {
            out_since = None;
            Duration::ZERO
        };
        match verdict(held, &seen, &group, out_for) {
            Verdict::Fine => health.set("group", None),
            Verdict::Degraded(why) => {
                tracing::warn!(%why, "out of the consumer group");
                health.set("group", Some(why));
            }
            Verdict::Rejoin(why) => {
                health.set("group", Some(why.clone()));
                ctx().out_of_group(why);
                break; // this consumer is replaced; the new one is watched anew
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_subscribed_partitions_are_the_named_topics_and_the_patterns_matches() {
        let topics = vec![
            ("cdc.db.a".to_string(), 2),
            ("cdc.db.b".to_string(), 1),
            ("other".to_string(), 1),
            ("__consumer_offsets".to_string(), 8),
        ];
        let s = subscribed(&["^cdc\\.db\\..*".into()], &topics);
        assert_eq!(s.len(), 3);
        let s = subscribed(&["other".into(), "missing".into()], &topics);
        assert_eq!(s.into_iter().collect::<Vec<_>>(), [("other".into(), 0)]);
    }

    #[test]
    fn out_of_the_group_is_said_after_a_while_and_rejoined_after_longer_unless_rebalancing() {
        let seen = |state: &str, unheld: &[(&str, i32)]| Seen {
            unheld: unheld.iter().map(|(t, p)| (t.to_string(), *p)).collect(),
            state: state.into(),
            members: 0,
            member: true,
            subscribed: 2,
        };
        let empty = seen("Empty", &[("t", 0), ("t", 1)]);
        let s = Duration::from_secs;
        assert_eq!(verdict(0, &empty, "g", s(5)), Verdict::Fine);
        assert!(matches!(
            verdict(0, &empty, "g", s(15)),
            Verdict::Degraded(why) if why.contains("group g (Empty, 0 members)") && why.contains("t[0,1]")
        ));
        assert!(matches!(verdict(0, &empty, "g", s(30)), Verdict::Rejoin(_)));
        // Holding partitions, or every partition held: fine however long.
        assert_eq!(verdict(1, &empty, "g", s(99)), Verdict::Fine);
        assert_eq!(verdict(0, &seen("Stable", &[]), "g", s(99)), Verdict::Fine);
        // A rebalance waiting for a slow member: said, not rejoined.
        let rebalancing = seen("PreparingRebalance", &[("t", 0)]);
        assert!(matches!(
            verdict(0, &rebalancing, "g", s(99)),
            Verdict::Degraded(_)
        ));
        // Every partition held by the others, and this one no member: out too (a member with
        // nothing, where instances outnumber partitions, is not).
        let left_out = Seen {
            member: false,
            members: 1,
            ..seen("Stable", &[])
        };
        assert!(matches!(
            verdict(0, &left_out, "g", s(30)),
            Verdict::Rejoin(why) if why.contains("is not a member of group g (Stable, 1 members)")
        ));
        assert_eq!(verdict(2, &left_out, "g", s(99)), Verdict::Fine);
        // No topic yet (a new pipeline's): no member, and nothing wrong.
        let new = Seen {
            subscribed: 0,
            ..left_out
        };
        assert_eq!(verdict(0, &new, "g", s(99)), Verdict::Fine);
    }
}
