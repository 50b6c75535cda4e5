//! Which partition a key goes to, and the partition counts keys are spread over.
//!
//! A key's partition is Kafka's (the Java client's `murmur2` partitioner, which librdkafka's
//! `murmur2_random` is too, so every Kafka tool agrees), computed here rather than by the
//! producer, with the partition count the topic had when this connector first published to it.
//! Partitions added to a topic later (an operator scaling out) would otherwise move keys to
//! other partitions while older events of the same key wait in the old one, and an apply stage
//! could write them out of order. That count is kept per topic in the checkpoint topic (key
//! [`crate::checkpoint::key_partitions_key`]), written in the same transaction as a checkpoint, so a restart keeps it too.

use std::collections::BTreeMap;

/// Kafka's murmur2 (`org.apache.kafka.common.utils.Utils.murmur2`).
pub fn murmur2(data: &[u8]) -> i32 {
    const SEED: u32 = 0x9747_b28c;
    const M: u32 = 0x5bd1_e995;
    const R: u32 = 24;
    let len = data.len();
    let mut h: u32 = SEED ^ (len as u32);
    let chunks = data.chunks_exact(4);
    let tail = chunks.remainder();
    for c in chunks {
        let mut k = u32::from_le_bytes([c[0], c[1], c[2], c[3]]);
        k = k.wrapping_mul(M);
        k ^= k >> R;
        k = k.wrapping_mul(M);
        h = h.wrapping_mul(M);
        h ^= k;
    }
    match tail.len() {
        3 => {
            h ^= (tail[2] as u32) << 16;
            h ^= (tail[1] as u32) << 8;
            h ^= tail[0] as u32;
            h = h.wrapping_mul(M);
        }
        2 => {
            h ^= (tail[1] as u32) << 8;
            h ^= tail[0] as u32;
            h = h.wrapping_mul(M);
        }
        1 => {
            h ^= tail[0] as u32;
            h = h.wrapping_mul(M);
        }
        _ => {}
    }
    h ^= h >> 13;
    h = h.wrapping_mul(M);
    h ^= h >> 15;
    h as i32
}

/// The partition of `key` among `partitions`, as Kafka's default partitioner picks it.
pub fn partition_of(key: &[u8], partitions: i32) -> i32 {
    (murmur2(key) & 0x7fff_ffff) % partitions.max(1)
}

/// Topic -> the partition count its keys are spread over.
pub type Counts = BTreeMap<String, i32>;

/// What to spread a topic's keys over, given the count recorded for it (if any) and the count
/// it has now. An error when the topic has fewer partitions than recorded (it was deleted and
/// made again: the keys cannot stay where they were).
pub fn spread(topic: &str, recorded: Option<i32>, now: i32) -> Result<i32, String> {
    match recorded {
        None => Ok(now),
        Some(r) if now >= r => Ok(r),
        Some(r) => Err(format!(
            "topic {topic} has {now} partitions, fewer than the {r} this connector spread its keys \
             over (it was deleted and made again?). Publishing on would put keys on other \
             partitions than their earlier events. Give the connector a new topic prefix \
             ([topics] prefix) and snapshot again, or make the topic again with {r} partitions"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn murmur2_matches_kafka() {
        // Kafka's UtilsTest.testMurmur2.
        let cases: [(&[u8], i32); 6] = [
            (b"21", -973932308),
            (b"foobar", -790332482),
            (b"a-little-bit-long-string", -985981536),
            (b"a-little-bit-longer-string", -1486304829),
            (
                b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8",
                -58897971,
            ),
            (b"abc", 479470107),
        ];
        for (data, want) in cases {
            assert_eq!(murmur2(data), want, "{:?}", std::str::from_utf8(data));
        }
    }

    #[test]
    fn keys_stay_on_the_count_first_recorded() {
        assert_eq!(spread("t", None, 6), Ok(6));
        assert_eq!(spread("t", Some(6), 6), Ok(6));
        assert_eq!(
            spread("t", Some(6), 12),
            Ok(6),
            "partitions added: keys stay"
        );
        let e = spread("t", Some(6), 3).unwrap_err();
        assert!(
            e.contains("fewer than the 6") && e.contains("new topic prefix"),
            "{e}"
        );
        // Spread over 6 with 12 partitions: never past the sixth.
        for k in 0..1000u32 {
            assert!(partition_of(&k.to_be_bytes(), 6) < 6);
        }
    }
}
