//! `capture-mysql`: MySQL/MariaDB binlog to Kafka. See `capture-mysql --help`.

use std::process::ExitCode;

// Many small allocations per event (decoded values, protobuf): mimalloc handles them far
// better than the system allocator (measured in docs/BENCHMARKS.md).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

use clap::Parser;
use sluice_capture::mysql::{preflight, stream::Capture, Config};
use sluice_common::{app, preflight::require, CommonArgs, Context};

/// Capture MySQL/MariaDB row changes from the binlog and publish them to Kafka.
#[derive(Parser)]
#[command(name = "capture-mysql", version)]
struct Args {
    #[command(flatten)]
    common: CommonArgs,
}

fn main() -> ExitCode {
    let args = Args::parse();
    app::main(
        "capture-mysql",
        args.common,
        |c: Config| async move { preflight(&c).await },
        run,
    )
}

async fn run(ctx: Context<Config>) -> anyhow::Result<()> {
    require(&preflight(&ctx.config).await)?;
    let capture = Capture::start(ctx.config, &ctx.registry).await?;
    capture.run(ctx.shutdown).await?;
    Ok(())
}
