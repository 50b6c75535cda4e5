//! `capture-mongo`: MongoDB change streams (or the oplog) to Kafka. See `capture-mongo --help`.

use std::process::ExitCode;

use sluice_capture::mongo::{preflight, stream::Capture, Config};
use sluice_common::{app, standby, Context};

fn main() -> ExitCode {
    app::main(
        "capture-mongo",
        "Capture MongoDB changes (change streams or the oplog) and publish them to Kafka.",
        |c: Config| async move { preflight(&c).await },
        run,
    )
}

async fn run(ctx: Context<Config>) -> anyhow::Result<()> {
    let config = ctx.config;
    let registry = ctx.registry;
    // With `[standby] enabled`, this instance waits until it is the active one.
    standby::run(
        &config.standby.clone(),
        &config.kafka.clone(),
        &config.connector.clone(),
        &registry.clone(),
        "sluice_capture_active",
        ctx.shutdown,
        |shutdown| async move {
            let capture = Capture::start(config, &registry).await?;
            capture.run(shutdown).await?;
            Ok(())
        },
    )
    .await
}
