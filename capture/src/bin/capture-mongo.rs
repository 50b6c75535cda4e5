//! `capture-mongo`: MongoDB change streams (or the oplog) to Kafka. See `capture-mongo --help`.

use std::process::ExitCode;

use sluice_capture::mongo::{preflight, stream::Capture, Config};
use sluice_common::{app, Context};

fn main() -> ExitCode {
    app::main(
        "capture-mongo",
        "Capture MongoDB changes (change streams or the oplog) and publish them to Kafka.",
        |c: Config| async move { preflight(&c).await },
        run,
    )
}

async fn run(ctx: Context<Config>) -> anyhow::Result<()> {
    sluice_capture::run(ctx, |config, registry, shutdown, health| async move {
        Capture::start(config, &registry)
            .await?
            .watched(health)
            .run(shutdown)
            .await?;
        Ok(())
    })
    .await
}
