//! `apply-clickhouse`: Kafka change topics to ClickHouse. See `apply-clickhouse --help`.

use std::process::ExitCode;

use sluice_apply::clickhouse::{preflight, sink::Sink, Config};
use sluice_common::{app, Context};

fn main() -> ExitCode {
    app::main(
        "apply-clickhouse",
        "Apply change events from Kafka to ClickHouse tables.",
        |c: Config| async move { preflight(&c).await },
        run,
    )
}

async fn run(ctx: Context<Config>) -> anyhow::Result<()> {
    let sink = Sink::start(
        ctx.config,
        &ctx.registry,
        ctx.health.clone(),
        ctx.shutdown.clone(),
    )
    .await?;
    sink.run(ctx.shutdown).await?;
    Ok(())
}
