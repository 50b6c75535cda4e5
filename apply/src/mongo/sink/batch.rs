//! The batch in hand: the writes of the events read since the last write, the messages they
//! came from (a refused write dead-letters its message), and the offsets to store once it is
//! written. It lives behind a mutex shared by the sink and the drain (`drain`), so whichever
//! writes it takes it whole.

use std::sync::Arc;
use std::time::Instant;

use rdkafka::message::OwnedMessage;

use super::Target;
use crate::group::Offsets;
use crate::mongo::write::Write;

/// One write of the batch and where it came from.
pub(super) struct Item {
    pub(super) db: Arc<str>,
    pub(super) coll: Arc<str>,
    pub(super) write: Write,
    /// Index into `Batch::messages`.
    pub(super) origin: usize,
}

#[derive(Default)]
pub(super) struct Batch {
    pub(super) items: Vec<Item>,
    pub(super) messages: Vec<OwnedMessage>,
    pub(super) offsets: Offsets,
    pub(super) events: usize,
    pub(super) bytes: usize,
    pub(super) started: Option<Instant>,
    pub(super) oldest_commit_micros: Option<i64>,
}

impl Batch {
    /// Take a row event's writes (to the target `db.coll`), keeping its message.
    pub(super) fn push(
        &mut self,
        (db, coll): &Target,
        writes: Vec<Write>,
        commit_time_micros: i64,
        m: OwnedMessage,
    ) {
        let origin = self.messages.len();
        for w in writes {
            self.bytes += w.size();
            self.items.push(Item {
                db: Arc::clone(db),
                coll: Arc::clone(coll),
                write: w,
                origin,
            });
        }
        self.events += 1;
        if commit_time_micros > 0 {
            let o = self.oldest_commit_micros.get_or_insert(commit_time_micros);
            *o = (*o).min(commit_time_micros);
        }
        self.offsets.record(&m);
        self.messages.push(m);
    }
}
