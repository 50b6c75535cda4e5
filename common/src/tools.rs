//! The operator's tools that need no pipeline process: the records of a topic, one MongoDB
//! command. `sluice events` and `sluice mongo` run them (and the older `sluice-events` and
//! `sluice-mongo` binaries, kept for scripts that name them).

pub mod events;
pub mod mongo_command;
