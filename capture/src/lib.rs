//! The capture stage: reads a source's change log and publishes change events to Kafka.
//!
//! - [`mysql`]: MySQL/MariaDB binlog (binary `capture-mysql`);
//! - [`mongo`]: MongoDB change streams (binary `capture-mongo`).
//!
//! What both share: the error model ([`error`]), the publisher with its ordered
//! acknowledgements and checkpoints ([`publish`]), the table filter ([`filter`]) and the
//! snapshot settings and progress ([`snapshot`]).

pub mod error;
pub mod filter;
pub mod mongo;
pub mod mysql;
pub mod publish;
pub mod snapshot;

pub use error::{CaptureError, Origin};
