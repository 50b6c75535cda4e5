//! The benchmarks: commands that print figures (never tests). `bench-w1` (MySQL -> ClickHouse)
//! and `bench-w2` (MongoDB -> MongoDB) run the two reference workloads stage by stage,
//! `bench-recovery` the times to recover from faults, `bench-tables` a source of many tables,
//! `bench-kafka` the Kafka client's floor over any topics, and `bench-report` all of them,
//! several times, into the performance table of docs/BENCHMARKS.md.
//!
//! - [`measure`]: a stage started, its metrics, CPU time and peak memory;
//! - [`floor`]: what the client libraries alone cost for the same records;
//! - [`w1`]: reference workload W1's rows and its sustained step.

pub mod floor;
pub mod measure;
pub mod w1;
