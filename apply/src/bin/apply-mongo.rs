//! `apply-mongo`: Kafka change topics to MongoDB collections. See `apply-mongo --help`.

use std::process::ExitCode;

use sluice_apply::mongo::{preflight, sink::Sink, Config};
use sluice_common::{app, Context};

fn main() -> ExitCode {
    app::main(
        "apply-mongo",
        "Apply change events from Kafka to MongoDB collections (bulk writes, offsets after the write).",
        |c: Config| async move { preflight(&c).await },
        run,
    )
}

async fn run(ctx: Context<Config>) -> anyhow::Result<()> {
    let sink = Sink::start(ctx.config, &ctx.registry, ctx.health.clone()).await?;
    sink.run(ctx.shutdown).await?;
    Ok(())
}
