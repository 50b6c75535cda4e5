//! `sluice-events`: the same as `sluice events` (kept for scripts that name it).

use clap::Parser;

fn main() {
    sluice_ops::brokers_from_stage_env();
    let args = sluice_ops::events::Args::parse();
    if let Some(e) = sluice_ops::events::run(&args).error(&args) {
        eprintln!("sluice-events: {e}");
        std::process::exit(1);
    }
}
