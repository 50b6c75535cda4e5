//! The apply stage: consumes change topics and writes them to a target.
//!
//! - [`clickhouse`]: ClickHouse tables (binary `apply-clickhouse`);
//! - [`mongo`]: MongoDB collections (binary `apply-mongo`).
//!
//! Both commit a Kafka offset only after the target acknowledged every write before it. What
//! they share: the error model ([`error`]), the consumer group's run loop and drain
//! ([`group`]), the consumer settings ([`consumer`]) and the schema cache ([`schemas`]).

pub mod clickhouse;
pub mod consumer;
pub mod error;
pub mod group;
pub mod incarnation;
pub mod mongo;
pub mod position;
pub mod replay;
pub mod schemas;
pub mod status;
pub mod verify;

pub use error::{ApplyError, BadEvent, Origin, Reason};
