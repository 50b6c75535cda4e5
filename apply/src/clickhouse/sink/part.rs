//! One table's part of a batch: the rows for one INSERT, in RowBinary, in pieces.

use std::sync::Arc;

use bytes::Bytes;

/// One table's part of a batch: the INSERT's column list and RowBinary rows, in pieces of
/// about [`PIECE`] bytes that each end at a row's end. A large batch never reallocates (and
/// copies) one buffer as it grows, and each piece is compressed and sent on its own, so the
/// INSERT holds no second copy of the batch.
pub(super) struct TableBatch {
    pub(super) columns: Arc<Vec<String>>,
    /// The shard whose per-shard table it goes into (`cluster.write = "shards"`; otherwise
    /// `None`: into the table itself).
    pub(super) shard: Option<usize>,
    /// Full pieces.
    pub(super) done: Vec<Bytes>,
    /// The piece being filled.
    pub(super) body: Vec<u8>,
    pub(super) rows: usize,
}

const PIECE: usize = 1 << 20;

impl TableBatch {
    /// After a row: start a new piece once this one is full.
    pub(super) fn row_done(&mut self) {
        if self.body.len() >= PIECE {
            // Later pieces are sized at once: this table's part is a large one.
            let next = Vec::with_capacity(PIECE + PIECE / 8);
            self.done
                .push(Bytes::from(std::mem::replace(&mut self.body, next)));
        }
    }
}
