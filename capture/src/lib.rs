//! The capture stage: reads a source's change log and publishes change events to Kafka.
//!
//! - [`mysql`]: MySQL/MariaDB binlog (binary `capture-mysql`);
//! - [`mongo`]: MongoDB change streams (binary `capture-mongo`).
//!
//! What both share: the error model ([`error`]), the publisher with its ordered
//! acknowledgements ([`publish`]), the checkpoint topic ([`checkpoint`]), the table filter ([`filter`]) and the
//! snapshot settings and progress ([`snapshot`]).

pub mod checkpoint;
pub mod error;
pub mod filter;
pub mod mongo;
pub mod mysql;
pub mod publish;
pub mod snapshot;
pub mod stall;

pub use error::{CaptureError, Origin};

use std::future::Future;

use prometheus::Registry;
use sluice_common::{standby, Context, KafkaConfig, Shutdown, StandbyConfig};

/// What [`run`] and the operator's tools read of a capture's config, either capture's.
pub trait Connector {
    /// The connector's name: its checkpoints, its fence and its election are by it.
    fn connector(&self) -> &str;
    fn kafka(&self) -> &KafkaConfig;
    fn standby(&self) -> &StandbyConfig;
    /// `[publish]`: the checkpoint and schema topics among the rest.
    fn publish(&self) -> &publish::PublishConfig;
    /// `[topics]`: the change topics' names.
    fn topics(&self) -> &sluice_common::TopicsConfig;
}

/// A capture binary's work: `start` runs the capture of `config` until the shutdown it gets.
/// With `[standby] enabled` it starts only once this instance is the active one of its
/// connector (`sluice_capture_active`), and a lost role stops it and ends in an error, for the
/// supervisor to start the instance again as a standby (`sluice_common::standby`).
pub async fn run<C, F, Fut>(ctx: Context<C>, start: F) -> anyhow::Result<()>
where
    C: Connector,
    F: FnOnce(C, Registry, Shutdown, sluice_common::metrics::Health) -> Fut,
    Fut: Future<Output = anyhow::Result<()>>,
{
    let Context {
        config,
        registry,
        shutdown,
        health,
        ..
    } = ctx;
    let (connector, kafka, standby) = (
        config.connector().to_string(),
        config.kafka().clone(),
        config.standby().clone(),
    );
    standby::run(
        &standby,
        &kafka,
        &connector,
        &registry.clone(),
        "sluice_capture_active",
        shutdown,
        |shutdown| start(config, registry, shutdown, health),
    )
    .await
}
