//! `capture-mysql`: MySQL/MariaDB binlog to Kafka. See `capture-mysql --help`.

use std::process::ExitCode;

use sluice_capture::mysql::{preflight, stream::Capture, Config};
use sluice_common::{app, Context};

fn main() -> ExitCode {
    app::main(
        "capture-mysql",
        "Capture MySQL/MariaDB row changes from the binlog and publish them to Kafka.",
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
