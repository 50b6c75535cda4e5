//! `apply-mongo`: Kafka change topics to MongoDB. See `apply-mongo --help`.

use std::process::ExitCode;

use sluice_apply::mongo::{preflight, Config};
use sluice_common::{app, Context};

fn main() -> ExitCode {
    app::main(
        "apply-mongo",
        "Apply change events from Kafka to MongoDB collections.",
        |c: Config| async move { preflight(&c).await },
        run,
    )
}

async fn run(ctx: Context<Config>) -> anyhow::Result<()> {
    tracing::warn!(
        "applying is not built yet: this build checks the target and serves metrics only"
    );
    ctx.shutdown.wait().await;
    Ok(())
}
