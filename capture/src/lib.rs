//! The capture stage: reads a source's change log and publishes change events to Kafka.
//!
//! - [`mysql`]: MySQL/MariaDB binlog (binary `capture-mysql`);
//! - [`mongo`]: MongoDB change streams (binary `capture-mongo`).

pub mod filter;
pub mod mongo;
pub mod mysql;
pub mod publish;
pub mod snapshot;
