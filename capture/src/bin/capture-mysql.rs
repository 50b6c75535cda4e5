//! `capture-mysql`: MySQL/MariaDB binlog to Kafka. See `capture-mysql --help`.

use std::process::ExitCode;

use sluice_capture::mysql::{preflight, stream::Capture, Config};
use sluice_common::{app, standby, Context};

fn main() -> ExitCode {
    app::main(
        "capture-mysql",
        "Capture MySQL/MariaDB row changes from the binlog and publish them to Kafka.",
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
