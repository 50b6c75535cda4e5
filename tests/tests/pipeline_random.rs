//! The randomized whole-pipeline test (MariaDB -> capture-mysql -> Kafka -> apply-clickhouse, on
//! whichever server `SLUICE_CLICKHOUSE_URL` names): a seeded random sequence of actions drawn
//! from one registry (`sluice_tests::scenario::actions::REGISTRY`): rows written in every way
//! (upserts, updates, deletes, key moves, transactions of hundreds of rows, XA transactions left
//! prepared across other actions), schema changes of every class (every MySQL type this stage
//! maps added or modified with its DEFAULT in every form, NOT NULL without one, generated
//! columns, narrowing MODIFYs under a permissive `sql_mode`, renames, drops, several clauses in
//! one ALTER, primary keys changed, TRUNCATE, DROP then CREATE, RENAME TABLE swaps, `CREATE
//! TABLE ... LIKE` copies, partitions truncated, dropped, exchanged), and faults and operations
//! of the pipeline (each stage stopped, killed, paused past its sessions and continued; appliers
//! joining and leaving the group; ClickHouse cut off; snapshots requested; a stopped table taken
//! up again by the documented steps; the broker restarted; partitions added).
//!
//! At checkpoints and at the end `sluice verify` compares every table cell for cell: each one
//! is equal to its source (every source column in the target), or stopped for a reason on the
//! list of the impossible in docs/apply-clickhouse.md (*What stops a table*), read from that
//! file; no other event is dead-lettered. The settings (seed, steps, time, checkpoints, the
//! actions drawn) are in `sluice_tests::scenario`.

#[tokio::test(flavor = "multi_thread")]
async fn a_random_pipeline_leaves_every_table_equal_or_stopped_for_a_listed_reason() {
    sluice_tests::scenario::run().await;
}
