//! Offsets: which events a batch holds, stored once the target took the batch (librdkafka's
//! `rd_kafka_offset_store` commits the stored offset + 1, the next to read); and what a sink
//! does when its partitions are about to go ([`Drain`]).

use rdkafka::consumer::{Consumer, ConsumerContext};
use rdkafka::Message;

use crate::incarnation::Incarnations;

/// topic -> partition -> offset of the last event handled. Stored once the batch holding it is
/// written: librdkafka's `rd_kafka_offset_store` commits that offset + 1, the next to read.
#[derive(Debug, Default, Clone)]
// (foldhash, not SipHash: every record's offset is recorded here)
pub struct Offsets(pub foldhash::HashMap<String, foldhash::HashMap<i32, i64>>);

impl Offsets {
    pub fn record<M: Message>(&mut self, m: &M) {
        match self.0.get_mut(m.topic()) {
            Some(p) => {
                p.insert(m.partition(), m.offset());
            }
            None => {
                self.0.insert(
                    m.topic().to_string(),
                    [(m.partition(), m.offset())].into_iter().collect(),
                );
            }
        }
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Add `later`'s offsets (of events after these): per partition the later one wins.
    pub fn merge(&mut self, later: Offsets) {
        for (topic, partitions) in later.0 {
            self.0.entry(topic).or_default().extend(partitions);
        }
    }

    /// Store every partition's offset, with the capture incarnations reached there
    /// (`incarnations`, the consumer's) as the commit's metadata ([`crate::incarnation`]).
    pub fn store<X, C>(&self, consumer: &C, incarnations: &Incarnations)
    where
        X: ConsumerContext,
        C: Consumer<X>,
    {
        for (topic, partitions) in &self.0 {
            for (partition, last) in partitions {
                let stored = match incarnations
                    .at(topic, *partition, *last)
                    .and_then(|known| crate::incarnation::metadata(&known))
                {
                    None => consumer.store_offset(topic, *partition, *last),
                    Some(metadata) => {
                        let mut tpl = rdkafka::TopicPartitionList::with_capacity(1);
                        tpl.add_partition_offset(
                            topic,
                            *partition,
                            rdkafka::Offset::Offset(*last + 1),
                        )
                        .and_then(|()| {
                            let mut e = tpl
                                .find_partition(topic, *partition)
                                .expect("the partition just added");
                            e.set_metadata(metadata);
                            consumer.store_offsets(&tpl)
                        })
                    }
                };
                if let Err(e) = stored {
                    // The partition was revoked meanwhile: its next owner reads it again.
                    tracing::debug!(topic, partition, error = %e, "offset not stored");
                }
            }
        }
    }
}

/// What a sink does when its partitions are about to go: write the batch in hand and return
/// its offsets, or `None` when there was nothing (or the write failed, so the next owner reads
/// those events again).
pub trait Drain: Send + Sync + 'static {
    fn drain(&self) -> Option<Offsets>;

    /// Partitions were just assigned (from the rebalance callback, before any of their events
    /// is delivered).
    fn assigned(&self, _partitions: &rdkafka::TopicPartitionList) {}
}
