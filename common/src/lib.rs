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

/// Return freed memory to the system at once instead of after mimalloc's delay (1 s in v3):
/// the batches come and go in large pieces, and the delay kept about 20 MiB more resident for
/// no speed measured (docs/BENCHMARKS.md). Called first thing by every binary.
pub fn release_memory_promptly() {
    // SAFETY: sets a global allocator option; valid at any time.
    unsafe { libmimalloc_sys::mi_option_set(MI_OPTION_PURGE_DELAY, 0) }
}

/// `mi_option_purge_delay` of mimalloc.h (v3), which the Rust binding does not name.
const MI_OPTION_PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;

#[cfg(test)]
mod allocator_tests {
    #[test]
    fn the_purge_delay_option_is_the_one_set() {
        // SAFETY: reads a global allocator option.
        let default = unsafe { libmimalloc_sys::mi_option_get(super::MI_OPTION_PURGE_DELAY) };
        assert_eq!(
            default, 1000,
            "mimalloc v3's default purge delay (ms, src/options.c)"
        );
        super::release_memory_promptly();
        let now = unsafe { libmimalloc_sys::mi_option_get(super::MI_OPTION_PURGE_DELAY) };
        assert_eq!(now, 0);
    }
}
