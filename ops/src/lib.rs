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

/// The tools read the brokers from `--brokers` or `SLUICE_KAFKA_BROKERS`; the stages' own name
/// for them, `SLUICE__KAFKA__BROKERS` (`[kafka] brokers`), is taken too when that one is not
/// set, so that one environment serves both. Called first thing in `main`, before any thread.
pub fn brokers_from_stage_env() {
    if std::env::var_os("SLUICE_KAFKA_BROKERS").is_none() {
        if let Some(b) = std::env::var_os("SLUICE__KAFKA__BROKERS") {
            std::env::set_var("SLUICE_KAFKA_BROKERS", b);
        }
    }
}
