//! The operator's tools, behind the `sluice` command. They run beside a pipeline, never in it:
//! each reads what the stages left in Kafka and in the servers, and answers one question.
//!
//! - [`status`]: where each capture connector stands and how far each apply group is behind;
//! - [`position`]: a stopped capture's position or a stopped group's offsets, shown or moved;
//! - [`replay`]: the dead letters, read and written again once their cause is fixed, and
//!   [`letters`], how they are printed;
//! - [`verify`]: the source compared with the target, right while the pipeline streams;
//! - [`events`]: a topic's records, one line each;
//! - [`mongo_command`]: one MongoDB command and its reply.
//!
//! This crate stands above both stages: it reads the capture's configs and checkpoints
//! (`sluice_capture`) and the apply stages' configs and dead letters (`sluice_apply`), which
//! themselves meet only at Kafka.

pub mod events;
pub mod letters;
pub mod mongo_command;
pub mod position;
pub mod replay;
pub mod status;
pub mod verify;
