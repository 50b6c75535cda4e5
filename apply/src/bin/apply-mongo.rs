//! `apply-mongo`: Kafka change topics to MongoDB. See `apply-mongo --help`.

use std::process::ExitCode;

// Many small allocations per event (decoded values, protobuf): mimalloc handles them far
// better than the system allocator (measured in docs/BENCHMARKS.md).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

use clap::Parser;
use sluice_apply::mongo::{preflight, Config};
use sluice_common::{app, preflight::require, CommonArgs, Context};

/// Apply change events from Kafka to MongoDB collections.
#[derive(Parser)]
#[command(name = "apply-mongo", version)]
struct Args {
    #[command(flatten)]
    common: CommonArgs,
}

fn main() -> ExitCode {
    let args = Args::parse();
    app::main(
        "apply-mongo",
        args.common,
        |c: Config| async move { preflight(&c).await },
        run,
    )
}

async fn run(ctx: Context<Config>) -> anyhow::Result<()> {
    require(&preflight(&ctx.config).await)?;
    tracing::warn!(
        "applying is not built yet: this build checks the target and serves metrics only"
    );
    ctx.shutdown.wait().await;
    Ok(())
}
