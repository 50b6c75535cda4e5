//! `apply-clickhouse`: Kafka change topics to ClickHouse. See `apply-clickhouse --help`.

use std::process::ExitCode;

// Many small allocations per event (decoded values, protobuf): mimalloc handles them far
// better than the system allocator (measured in docs/BENCHMARKS.md).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

use clap::Parser;
use sluice_apply::clickhouse::{preflight, sink::Sink, Config};
use sluice_common::{app, preflight::require, CommonArgs, Context};

/// Apply change events from Kafka to ClickHouse tables.
#[derive(Parser)]
#[command(name = "apply-clickhouse", version)]
struct Args {
    #[command(flatten)]
    common: CommonArgs,
}

fn main() -> ExitCode {
    let args = Args::parse();
    app::main(
        "apply-clickhouse",
        args.common,
        |c: Config| async move { preflight(&c).await },
        run,
    )
}

async fn run(ctx: Context<Config>) -> anyhow::Result<()> {
    require(&preflight(&ctx.config).await)?;
    let sink = Sink::start(ctx.config, &ctx.registry).await?;
    sink.run(ctx.shutdown).await?;
    Ok(())
}
