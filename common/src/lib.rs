//! What every sluice binary shares: the command line and config loading ([`app`], [`config`]),
//! the Prometheus endpoint ([`metrics`]), logging ([`logging`]), shutdown on signals
//! ([`shutdown`]), Kafka client settings ([`kafka`]), preflight checks ([`preflight`]) and the
//! election of a capture's active instance ([`standby`]);
//! and the small helpers both stages use: the calendar ([`civil`]), the clock ([`clock`]), hex
//! ([`hex`]), MongoDB's transient codes ([`mongo`]) and SQL text ([`sql`]: quoting for ClickHouse
//! and MySQL, MySQL statements as tokens). It ships no binary.

pub mod app;
pub mod civil;
pub mod clock;
pub mod config;
pub mod hex;
pub mod kafka;
pub mod logging;
pub mod metrics;
pub mod mongo;
pub mod preflight;
pub mod progress;
pub mod secret;
pub mod shutdown;
pub mod sql;
pub mod standby;
pub mod topics;

/// The longest wait between two tries of a server that failed (a write, a statement, a
/// reconnection), the waits doubling from 0.5 s (1 s at a start) up to it: short, so that work
/// resumes within seconds of the server's return, while a try of a server that is down costs
/// one refused connection.
pub const RETRY_MAX: std::time::Duration = std::time::Duration::from_secs(5);

pub use app::{AppConfig, CommonArgs, Context, MetricsConfig};
pub use config::Validate;
pub use kafka::KafkaConfig;
pub use logging::LogConfig;
pub use preflight::Check;
pub use shutdown::Shutdown;
pub use standby::StandbyConfig;
pub use topics::TopicsConfig;

// Many small allocations per event (decoded values, protobuf): mimalloc handles them far better
// than the system allocator (docs/BENCHMARKS.md). Every binary links this crate.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Keep the process's memory to what it uses. Called first thing by every binary.
///
/// - mimalloc returns freed memory to the system at once instead of after its delay (1 s in
///   v3): the batches come and go in large pieces, and the delay kept about 20 MiB more
///   resident for no speed measured.
/// - No transparent huge pages. mimalloc asks for them on its arenas (`MADV_HUGEPAGE`), so
///   every 2 MiB touched after a purge came back as a whole huge page, zeroed in the page
///   fault: apply-clickhouse held 77 MiB instead of 38 under sustained load, apply-mongo spent
///   a fifth of its CPU clearing pages, and librdkafka's heap got huge pages too. Turned off
///   for the whole process (`PR_SET_THP_DISABLE`), since allocations made before `main` are
///   already in an advised arena. docs/BENCHMARKS.md has the runs.
///
/// `MIMALLOC_PURGE_DELAY` and `MIMALLOC_ALLOW_THP` in the environment, read by mimalloc
/// itself, are left to win.
pub fn keep_memory_small() {
    if std::env::var_os("MIMALLOC_PURGE_DELAY").is_none() {
        // SAFETY: sets a global allocator option; valid at any time.
        unsafe { libmimalloc_sys::mi_option_set(MI_OPTION_PURGE_DELAY, 0) }
    }
    if std::env::var_os("MIMALLOC_ALLOW_THP").is_none() {
        // SAFETY: sets a global allocator option; valid at any time. prctl with these
        // arguments only sets a flag of this process (and of the children it starts).
        unsafe {
            libmimalloc_sys::mi_option_set(MI_OPTION_ALLOW_THP, 0);
            libc::prctl(libc::PR_SET_THP_DISABLE, 1, 0, 0, 0);
        }
    }
}

/// `mi_option_purge_delay` and `mi_option_allow_thp` of mimalloc.h (v3), which the Rust
/// binding does not name.
const MI_OPTION_PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;
const MI_OPTION_ALLOW_THP: libmimalloc_sys::mi_option_t = 43;

#[cfg(test)]
mod allocator_tests {
    /// Kibibytes of anonymous memory backed by huge pages in this process.
    fn anon_huge_kib() -> u64 {
        let smaps = std::fs::read_to_string("/proc/self/smaps_rollup").expect("smaps_rollup");
        smaps
            .lines()
            .find_map(|l| l.strip_prefix("AnonHugePages:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .expect("AnonHugePages line")
    }

    // One test: the options are process-wide, and the defaults are read before they change.
    #[test]
    fn freed_memory_goes_back_at_once_and_no_huge_pages() {
        // SAFETY (every block below): reads or sets global allocator options; prctl reads a flag.
        let get = |o| unsafe { libmimalloc_sys::mi_option_get(o) };
        assert_eq!(
            get(super::MI_OPTION_PURGE_DELAY),
            1000,
            "mimalloc v3's default purge delay (ms, src/options.c)"
        );
        assert_eq!(
            get(super::MI_OPTION_ALLOW_THP),
            1,
            "allow_thp defaults to on"
        );
        // The option after allow_thp (minimal_purge_size) defaults to 0: a wrong index shows.
        assert_eq!(get(super::MI_OPTION_ALLOW_THP + 1), 0);
        super::keep_memory_small();
        assert_eq!(get(super::MI_OPTION_PURGE_DELAY), 0);
        assert_eq!(get(super::MI_OPTION_ALLOW_THP), 0);
        assert_eq!(
            unsafe { libc::prctl(libc::PR_GET_THP_DISABLE, 0, 0, 0, 0) },
            1
        );
        // Touch 64 MiB: with huge pages allowed, mimalloc's advised arena gets them wherever
        // the system's THP mode is `madvise` or `always`.
        let before = anon_huge_kib();
        let mut v = vec![0u8; 64 << 20];
        for i in (0..v.len()).step_by(4096) {
            v[i] = 1;
        }
        let after = anon_huge_kib();
        assert_eq!(v.iter().step_by(4096).filter(|b| **b == 1).count(), 16384);
        // Fewer is possible (the kernel splits huge pages of freed memory); none new is not,
        // in any thread of the process.
        assert!(
            after <= before,
            "huge pages appeared: {before} kB -> {after} kB"
        );
    }
}
