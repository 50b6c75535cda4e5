//! `sluice-mongo`: the same as `sluice mongo` (kept for scripts that name it).

use std::process::ExitCode;

use clap::Parser;

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let args = sluice_ops::mongo_command::Args::parse();
    match sluice_ops::mongo_command::run(&args).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("sluice-mongo: {e}");
            ExitCode::FAILURE
        }
    }
}
