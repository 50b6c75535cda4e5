//! The apply stage: consumes change topics and writes them to a target.
//!
//! - [`clickhouse`]: ClickHouse tables (binary `apply-clickhouse`);
//! - [`mongo`]: MongoDB collections (binary `apply-mongo`).
//!
//! Both commit a Kafka offset only after the target acknowledged every write before it.

pub mod clickhouse;
pub mod consumer;
pub mod group;
pub mod mongo;
pub mod schemas;
