//! The common face of every binary: arguments, config, logs, metrics, signals, exit codes.
//!
//! A binary declares its config struct (implementing [`AppConfig`]), its preflight checks and an
//! async body; [`main`] does the rest:
//! 1. parse `--config FILE`, `--check`, `--print-config`, `--healthcheck`;
//! 2. load the config (file + `SLUICE__...` environment overrides), refusing unknown keys and
//!    bad values with the key's name (exit 2);
//! 3. start logging; run the preflight checks: print them for `--check`, otherwise refuse to
//!    start when one failed (exit 1);
//! 4. start the metrics endpoint and run the body with a [`Context`]; SIGTERM/SIGINT fire
//!    `ctx.shutdown`, and the body is expected to stop reading, finish and checkpoint, then
//!    return `Ok` (exit 0).
//!
//! Exit codes: 0 done, 1 failed (a preflight check at start, a failed `--check`, or an error
//! while running), 2 bad configuration.

use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use prometheus::Registry;
use serde::{de::DeserializeOwned, Deserialize, Serialize};

use crate::config::{self, Validate};
use crate::logging::{self, LogConfig};
use crate::metrics;
use crate::shutdown::Shutdown;

// The arguments every binary takes. (No doc comment: clap would show it as the binary's
// description in `--help`, in place of what the binary does.)
#[derive(Debug, clap::Args)]
pub struct CommonArgs {
    /// The TOML configuration file. Every key has a default (see `--print-config`) and can be
    /// overridden by an environment variable `SLUICE__SECTION__KEY`.
    #[arg(short, long, value_name = "FILE", env = "SLUICE_CONFIG")]
    pub config: Option<PathBuf>,
    /// Check the configuration and reach every server it names, print what was found, exit
    /// (0 when every check passed).
    #[arg(long)]
    pub check: bool,
    /// Print the effective configuration (defaults, file and environment) as TOML and exit.
    #[arg(long)]
    pub print_config: bool,
    /// Ask the running process with this configuration whether it is up (`GET /healthz` on
    /// `[metrics] listen`, on loopback when it listens on all addresses); exit 0 when it
    /// answers `ok`, 1 otherwise. For container health checks: the images have no shell.
    #[arg(long, conflicts_with_all = ["check", "print_config"])]
    pub healthcheck: bool,
}

/// `[metrics]`: the Prometheus endpoint.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct MetricsConfig {
    /// Address of the `/metrics` and `/healthz` endpoint; port 0 picks a free port (logged).
    pub listen: SocketAddr,
}

/// What a binary's config offers to the shared runner.
pub trait AppConfig: DeserializeOwned + Serialize + Validate {
    fn log(&self) -> &LogConfig;
    fn metrics(&self) -> &MetricsConfig;
}

/// Implement [`AppConfig`] for a config struct with `log: LogConfig` and
/// `metrics: MetricsConfig` fields.
#[macro_export]
macro_rules! app_config {
    ($t:ty) => {
        impl $crate::AppConfig for $t {
            fn log(&self) -> &$crate::LogConfig {
                &self.log
            }
            fn metrics(&self) -> &$crate::MetricsConfig {
                &self.metrics
            }
        }
    };
}

/// What the body of a binary gets.
pub struct Context<C> {
    pub config: C,
    pub registry: Registry,
    pub shutdown: Shutdown,
    /// The address the metrics endpoint is bound to.
    pub metrics_addr: SocketAddr,
    /// What `/healthz` answers.
    pub health: metrics::Health,
}

/// Run a binary: see the module docs. `check` is the binary's preflight: printed for
/// `--check`, and required to pass before `body`, the binary's work, starts.
pub fn main<C, Chk, ChkFut, B, BFut>(
    binary: &'static str,
    about: &'static str,
    check: Chk,
    body: B,
) -> ExitCode
where
    C: AppConfig + Clone,
    Chk: Fn(C) -> ChkFut,
    ChkFut: Future<Output = Vec<crate::preflight::Check>>,
    B: FnOnce(Context<C>) -> BFut,
    BFut: Future<Output = anyhow::Result<()>>,
{
    use clap::{Args as _, FromArgMatches as _};
    crate::keep_memory_small();
    let command = CommonArgs::augment_args(
        clap::Command::new(binary)
            .about(about)
            .version(env!("CARGO_PKG_VERSION")),
    );
    let args = CommonArgs::from_arg_matches(&command.get_matches()).unwrap_or_else(|e| e.exit());
    let config: C = match config::load(args.config.as_deref()) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("{binary}: {e}");
            return ExitCode::from(2);
        }
    };
    if args.print_config {
        match toml::to_string_pretty(&config) {
            Ok(text) => {
                print!("{text}");
                return ExitCode::SUCCESS;
            }
            Err(e) => {
                eprintln!("{binary}: cannot print the config: {e}");
                return ExitCode::FAILURE;
            }
        }
    }
    if args.healthcheck {
        return match metrics::probe(config.metrics().listen, std::time::Duration::from_secs(3)) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("{binary}: unhealthy: {e}");
                ExitCode::FAILURE
            }
        };
    }
    if let Err(e) = logging::check_env() {
        eprintln!("{binary}: {e}");
        return ExitCode::from(2);
    }
    logging::init(config.log());
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name(binary)
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("{binary}: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let code = runtime.block_on(async move {
        if args.check {
            let checks = check(config.clone()).await;
            return crate::preflight::report(binary, &checks);
        }
        let shutdown = Shutdown::new();
        if let Err(e) = shutdown.listen_for_signals() {
            tracing::error!(error = %e, "cannot install signal handlers");
            return ExitCode::FAILURE;
        }
        let listen = config.metrics().listen;
        let listener = match metrics::bind(listen).await {
            Ok(l) => l,
            Err(e) => {
                tracing::error!(error = %e, %listen, "cannot bind the metrics endpoint (metrics.listen)");
                return ExitCode::FAILURE;
            }
        };
        let metrics_addr = listener.local_addr().unwrap_or(listen);
        let registry = metrics::registry(binary);
        let health = metrics::Health::default();
        tracing::info!(%metrics_addr, version = env!("CARGO_PKG_VERSION"), "{binary} starting; metrics on http://{metrics_addr}/metrics");
        let server = tokio::spawn(metrics::serve(
            listener,
            registry.clone(),
            health.clone(),
            shutdown.clone(),
        ));
        // The preflight: a failure stops the start; a server worth waiting for (unreachable
        // for a deployment that has run before) is waited for, with backoff, degraded.
        let mut backoff = std::time::Duration::from_secs(1);
        loop {
            let checks = check(config.clone()).await;
            if let Some(why) = crate::preflight::waiting(&checks) {
                health.degrade(format!("waiting at start: {why}"));
                tracing::warn!(reason = %why, retry_in = ?backoff, "{binary} waits for what it needs (it has run before: a restart during an outage)");
                tokio::select! {
                    _ = shutdown.wait() => {
                        let _ = server.await;
                        tracing::info!("{binary} stopped while waiting");
                        return ExitCode::SUCCESS;
                    }
                    _ = tokio::time::sleep(backoff) => {}
                }
                backoff = (backoff * 2).min(crate::RETRY_MAX);
                continue;
            }
            if let Err(e) = crate::preflight::require(&checks) {
                tracing::error!(error = format!("{e:#}"), "{binary} cannot start");
                shutdown.trigger();
                let _ = server.await;
                return ExitCode::FAILURE;
            }
            health.restore();
            break;
        }
        let every = config.log().progress_interval_s;
        if every > 0 {
            tokio::spawn(crate::progress::run(
                binary,
                registry.clone(),
                std::time::Duration::from_secs(every),
                shutdown.clone(),
            ));
        }
        let ctx = Context {
            config,
            registry,
            shutdown: shutdown.clone(),
            metrics_addr,
            health,
        };
        let result = body(ctx).await;
        shutdown.trigger();
        let _ = server.await;
        match result {
            Ok(()) => {
                tracing::info!("{binary} stopped cleanly");
                ExitCode::SUCCESS
            }
            Err(e) => {
                tracing::error!(error = format!("{e:#}"), "{binary} failed");
                ExitCode::FAILURE
            }
        }
    });
    // The work is done (and checkpointed). Blocking tasks still running (a Kafka query of a
    // consumer being closed, which may wait out its timeout once per partition) would hold
    // the exit for minutes: the process exits after at most SHUTDOWN_WITHIN instead.
    runtime.shutdown_timeout(SHUTDOWN_WITHIN);
    code
}

/// How long the exit waits for blocking tasks left running once the body returned.
const SHUTDOWN_WITHIN: std::time::Duration = std::time::Duration::from_secs(5);
