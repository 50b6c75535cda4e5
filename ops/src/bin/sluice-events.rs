//! `sluice-events`: the same as `sluice events` (kept for scripts that name it).

use clap::Parser;

fn main() {
    let args = sluice_ops::events::Args::parse();
    if !sluice_ops::events::run(&args) {
        eprintln!("sluice-events: topic {} does not exist", args.topic);
        std::process::exit(1);
    }
}
