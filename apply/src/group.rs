//! What both apply binaries do with Kafka, one question a file:
//!
//! - `offsets`: the events a batch holds, stored once written, and what a sink does before its
//!   partitions go ([`Drain`]);
//! - `context`: the consumer's context, what happens at a rebalance;
//! - `run`: the run loop ([`run`]) over a [`BatchSink`], and a consumer replaced after a fatal
//!   error;
//! - `watcher`: the lag watcher, the topic finder and the membership watch beside each
//!   consumer;
//! - `membership`: whether the consumer is still in its group, from the broker's side;
//! - `metrics`: the group's and the sinks' metrics;
//! - `health`: when `/healthz` says the target is out ([`Outage`]);
//! - `dead_letters`: events that can never be written ([`DeadLetters`]);
//! - `lifecycle`: whether the group ran before, and leaving it at shutdown.

mod context;
mod dead_letters;
mod health;
mod lifecycle;
mod membership;
mod metrics;
mod offsets;
mod run;
mod watcher;

pub use context::{block_on, GroupContext};
pub use dead_letters::{
    headers as dead_letter_headers, wait_all as dead_letters_acknowledged, DeadLetters, Pending,
    DEAD_LETTER_MAX_BYTES,
};
pub use health::Outage;
pub use lifecycle::{close_within, group_has_run, CLOSE_WITHIN};
pub use membership::assignment;
pub use metrics::{GroupMetrics, SinkMetrics};
pub use offsets::{Drain, Offsets};
pub use run::Pace;
pub(crate) use run::{retire, run, BatchSink};
