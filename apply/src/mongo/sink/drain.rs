//! The drain: the batch in hand written from the rebalance callback before partitions are let
//! go, and the partitions assigned claimed ([`super::fence`]). What the drain could not write is
//! not stored, and the partitions' next owner reads it again.

use std::sync::{Arc, Mutex};
use std::time::Instant;

use super::batch::Batch;
use super::writer::Writer;
use crate::group::{block_on, Drain, Offsets};

/// Forgets the partitions' claims when dropped: after the drain's write, whatever it did.
struct Forget<'a>(&'a Writer);

impl Drop for Forget<'_> {
    fn drop(&mut self) {
        self.0.fence.forget();
    }
}

/// Writes the batch in hand before partitions are let go.
pub(crate) struct MongoDrain {
    pub(super) batch: Arc<Mutex<Batch>>,
    pub(super) writer: Writer,
    pub(super) runtime: tokio::runtime::Handle,
    /// A batch that could not be written here (in the rebalance callback): the sink stops
    /// before it stores any later offset.
    pub(super) failed: Arc<Mutex<Option<String>>>,
}

impl Drain for MongoDrain {
    /// Claim the partitions just assigned ([`super::fence`]), retrying MongoDB for up to 30 s;
    /// if it stays away, the sink stops before it writes anything.
    fn assigned(&self, partitions: &rdkafka::TopicPartitionList) {
        let partitions: Vec<(String, i32)> = partitions
            .elements()
            .iter()
            .map(|e| (e.topic().to_string(), e.partition()))
            .collect();
        if partitions.is_empty() {
            return;
        }
        let claim = async {
            let deadline = Instant::now() + std::time::Duration::from_secs(30);
            let mut backoff = std::time::Duration::from_millis(250);
            loop {
                match self.writer.fence.claim(&partitions).await {
                    Ok(()) => return Ok(()),
                    Err(e) if e.is_transient() && Instant::now() + backoff < deadline => {
                        tracing::warn!(error = %e, "claiming the assigned partitions; retrying");
                        tokio::time::sleep(backoff).await;
                        backoff = (backoff * 2).min(std::time::Duration::from_secs(4));
                    }
                    Err(e) => return Err(e),
                }
            }
        };
        if let Err(e) = block_on(&self.runtime, claim) {
            *self.failed.lock().expect("failed lock") = Some(format!(
                "the partitions assigned could not be claimed in the owners' collection: {e}"
            ));
        }
    }

    fn drain(&self) -> Option<Offsets> {
        let taken = std::mem::take(&mut *self.batch.lock().expect("batch lock"));
        // The partitions go (all of them: the group's protocol is eager); claimed again if
        // they come back.
        let _forget = Forget(&self.writer);
        if taken.offsets.is_empty() {
            return None;
        }
        let write = async {
            let outcome = self.writer.write(&taken).await?;
            self.writer.settle(&taken, outcome).await
        };
        match block_on(&self.runtime, write) {
            Ok(()) => {
                tracing::info!(
                    events = taken.events,
                    "wrote the batch in hand before letting partitions go"
                );
                Some(taken.offsets)
            }
            Err(e) => {
                tracing::warn!(error = %e, events = taken.events,
                    "could not write the batch in hand before letting partitions go; their next owner reads it again");
                *self.failed.lock().expect("failed lock") = Some(e.to_string());
                None
            }
        }
    }
}
