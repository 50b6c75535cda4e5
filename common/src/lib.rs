//! What every sluice binary shares: the command line and config loading ([`app`], [`config`]),
//! the Prometheus endpoint ([`metrics`]), logging ([`logging`]), shutdown on signals
//! ([`shutdown`]), Kafka client settings ([`kafka`]) and preflight checks ([`preflight`]).

pub mod app;
pub mod civil;
pub mod config;
pub mod kafka;
pub mod logging;
pub mod metrics;
pub mod mongo;
pub mod preflight;
pub mod shutdown;
pub mod topics;

pub use app::{AppConfig, CommonArgs, Context, MetricsConfig};
pub use config::Validate;
pub use kafka::KafkaConfig;
pub use logging::LogConfig;
pub use preflight::Check;
pub use shutdown::Shutdown;
pub use topics::TopicsConfig;

// Many small allocations per event (decoded values, protobuf): mimalloc handles them far better
// than the system allocator (docs/BENCHMARKS.md). Every binary links this crate.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;
