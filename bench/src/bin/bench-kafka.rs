//! Kafka's client alone over the records of topics already written (`sluice_bench::floor`):
//! what consuming and producing them cost per record, the floor under each stage's figure.
//!
//!     target/release/bench-kafka PREFIX RECORDS
//!
//! PREFIX: the topics whose names begin with `PREFIX.` (a pipeline's `[topics] prefix`, e.g.
//! the one a `bench-w1` run printed); RECORDS: how many records they hold (each step reads
//! exactly that many). `bench-w1` and `bench-w2` run the same steps after their drains.

use sluice_tests::kafka_brokers;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    // As the stages do: the Kafka floor step runs in this process (sluice_bench::floor).
    sluice_common::keep_memory_small();
    let args: Vec<String> = std::env::args().skip(1).collect();
    let usage = "usage: bench-kafka PREFIX RECORDS";
    if args.iter().any(|a| a == "--help" || a == "-h") {
        println!("{usage}");
        return Ok(());
    }
    let [prefix, records] = args.as_slice() else {
        anyhow::bail!("{usage}");
    };
    let floor = sluice_bench::floor::measure(&kafka_brokers(), prefix, records.parse()?).await?;
    print!("{}", floor.lines(prefix));
    Ok(())
}
