//! `[standby]`: several instances of one capture, one of them active.
//!
//! Kafka's group coordinator elects the active one; there is no consensus of our own. Every
//! instance joins the consumer group `sluice-capture-election.<connector>` on the topic
//! `standby.topic` (one partition, no records), with the cooperative-sticky assignor of the
//! classic group protocol: the member holding partition 0 is the active one, and a member joining
//! later does not take it away. The others wait as standbys.
//!
//! - The active one dies (kill -9, a lost node): the coordinator drops it after
//!   `session_timeout_ms` without a heartbeat and hands partition 0 to a standby, which starts
//!   capturing from the last checkpoint.
//! - The active one stops (SIGTERM): it checkpoints, then leaves the group, and a standby takes
//!   over at once.
//! - The active one loses its partition while alive (it was paused, or cut off from the brokers
//!   for longer than the session timeout; librdkafka then revokes the assignment itself): it
//!   stops publishing, checkpoints if it still may, and exits with an error, for its supervisor
//!   to start it again as a standby.
//!
//! A revived old active one cannot write a checkpoint: its successor's checkpoint producer took
//! the transactional id `sluice-capture.<connector>` over before reading the checkpoint, which
//! fences the old producer. Until it learns so, it may publish a few changes its successor
//! publishes too, with the same versions, which the appliers drop.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use prometheus::{IntGauge, Registry};
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext, Rebalance};
use serde::{Deserialize, Serialize};
use tokio::sync::watch;

use crate::kafka::{config_error, KafkaConfig};
use crate::shutdown::Shutdown;

/// `[standby]`: run this capture as one of several instances, one active.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, default)]
pub struct StandbyConfig {
    /// Take part in the election of the active instance; off, the capture is always active (and
    /// a second one with the same connector name fences the first). Default false.
    pub enabled: bool,
    /// This instance's name, in logs, metrics and its Kafka client id. Default: the host name
    /// (a pod's name).
    pub instance: String,
    /// The election's topic: one partition, never written. One topic serves every connector
    /// (each has its own group). Default `_sluice_capture_election`.
    pub topic: String,
    /// How long the active instance may be silent before a standby takes over, in
    /// milliseconds: the Kafka group's `session.timeout.ms`, within the broker's
    /// `group.min.session.timeout.ms` (6000 by default) and `group.max.session.timeout.ms`.
    /// Default 6000.
    pub session_timeout_ms: u64,
}

impl Default for StandbyConfig {
    fn default() -> Self {
        Self {
            enabled: false,
            instance: String::new(),
            topic: "_sluice_capture_election".into(),
            session_timeout_ms: 6000,
        }
    }
}

impl StandbyConfig {
    pub fn validate(&self) -> Result<(), (String, String)> {
        if self.topic.is_empty() {
            return Err(("standby.topic".into(), "must not be empty".into()));
        }
        if self.session_timeout_ms < 1000 {
            return Err((
                "standby.session_timeout_ms".into(),
                format!("{} is below 1000 ms", self.session_timeout_ms),
            ));
        }
        Ok(())
    }

    /// The instance name: the configured one, or the host name.
    pub fn instance_name(&self) -> String {
        if !self.instance.is_empty() {
            return self.instance.clone();
        }
        std::env::var("HOSTNAME")
            .ok()
            .filter(|h| !h.is_empty())
            .or_else(|| {
                std::fs::read_to_string("/proc/sys/kernel/hostname")
                    .ok()
                    .map(|h| h.trim().to_string())
            })
            .unwrap_or_else(|| format!("pid-{}", std::process::id()))
    }

    /// The election's consumer group of `connector`.
    pub fn group(connector: &str) -> String {
        format!("sluice-capture-election.{connector}")
    }
}

/// Where the election stands, as the consumer's thread sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Role {
    Standby,
    Active,
    /// Partition 0 was taken away (revoked, or lost with the session); why.
    Lost(String),
}

struct ElectionContext {
    topic: String,
    role: watch::Sender<Role>,
}

impl rdkafka::ClientContext for ElectionContext {}

impl ConsumerContext for ElectionContext {
    fn post_rebalance(&self, consumer: &BaseConsumer<Self>, r: &Rebalance<'_>) {
        let holds_zero = |tpl: &rdkafka::TopicPartitionList| {
            tpl.elements()
                .iter()
                .any(|e| e.topic() == self.topic && e.partition() == 0)
        };
        match r {
            Rebalance::Assign(tpl) if holds_zero(tpl) => {
                self.role.send_if_modified(|role| {
                    // Once lost, the process stops: a later assignment does not revive it.
                    if *role == Role::Standby {
                        *role = Role::Active;
                        true
                    } else {
                        false
                    }
                });
            }
            Rebalance::Revoke(tpl) if holds_zero(tpl) => {
                let why = if consumer.assignment_lost() {
                    "the group session was lost (no heartbeat reached the coordinator within \
                     standby.session_timeout_ms)"
                } else {
                    "the group coordinator handed the role to another instance"
                };
                self.role.send_if_modified(|role| {
                    if *role == Role::Active {
                        *role = Role::Lost(why.into());
                        true
                    } else {
                        false
                    }
                });
            }
            Rebalance::Error(e) => tracing::warn!(error = %e, "standby election: rebalance error"),
            _ => {}
        }
    }
}

/// This instance's membership in the election. Dropping it leaves the group.
pub struct Election {
    connector: String,
    instance: String,
    role: watch::Receiver<Role>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
    active: IntGauge,
}

impl Election {
    /// Join the election of `connector` (creating its topic if needed). `active_metric` names
    /// the gauge that says whether this instance is the active one.
    pub async fn join(
        config: &StandbyConfig,
        kafka: &KafkaConfig,
        connector: &str,
        registry: &Registry,
        active_metric: &str,
    ) -> Result<Self, String> {
        let instance = config.instance_name();
        let client_id = format!("sluice-capture-election.{connector}.{instance}");
        kafka
            .ensure_topic(&client_id, &config.topic, 1, -1, false, None)
            .await
            .map_err(|e| format!("the standby election's topic (standby.topic): {e}"))?;
        let (tx, rx) = watch::channel(Role::Standby);
        let mut cc = kafka.client_config(&client_id);
        let timeout = config.session_timeout_ms;
        cc.set("group.id", StandbyConfig::group(connector))
            .set("group.protocol", "classic")
            .set("partition.assignment.strategy", "cooperative-sticky")
            .set("session.timeout.ms", timeout.to_string())
            .set("heartbeat.interval.ms", (timeout / 6).max(100).to_string())
            .set("enable.auto.commit", "false")
            .set("enable.auto.offset.store", "false")
            .set("auto.offset.reset", "latest");
        let consumer: BaseConsumer<ElectionContext> = cc
            .create_with_context(ElectionContext {
                topic: config.topic.clone(),
                role: tx,
            })
            .map_err(|e| format!("the standby election's consumer: {}", config_error(&e)))?;
        consumer
            .subscribe(&[&config.topic])
            .map_err(|e| format!("the standby election's topic {}: {e}", config.topic))?;
        let active = IntGauge::new(
            active_metric,
            "1 while this instance is the connector's active capture, 0 while it is a standby.",
        )
        .and_then(|g| registry.register(Box::new(g.clone())).map(|()| g))
        .map_err(|e| format!("metric {active_metric}: {e}"))?;
        let stop = Arc::new(AtomicBool::new(false));
        let stopping = stop.clone();
        // Its own thread: the group's callbacks run in poll, which must go on however busy
        // the capture keeps the runtime.
        let thread = std::thread::Builder::new()
            .name("standby-election".into())
            .spawn(move || {
                while !stopping.load(Ordering::Relaxed) {
                    if let Some(Err(e)) = consumer.poll(Duration::from_millis(100)) {
                        tracing::debug!(error = %e, "standby election: poll");
                    }
                }
                // Leave the group: a standby takes over at once.
                drop(consumer);
            })
            .map_err(|e| format!("cannot start the standby election's thread: {e}"))?;
        tracing::info!(
            connector,
            %instance,
            group = StandbyConfig::group(connector),
            topic = %config.topic,
            session_timeout_ms = timeout,
            "joined the standby election; waiting to be the active instance"
        );
        Ok(Self {
            connector: connector.into(),
            instance,
            role: rx,
            stop,
            thread: Some(thread),
            active,
        })
    }

    pub fn instance(&self) -> &str {
        &self.instance
    }

    /// Wait until this instance is the active one: `true`, or `false` when `shutdown` came
    /// first.
    pub async fn wait_active(&mut self, shutdown: &Shutdown) -> bool {
        tokio::select! {
            r = self.role.wait_for(|r| *r != Role::Standby) => {
                let active = matches!(r.as_deref(), Ok(Role::Active));
                if active {
                    self.active.set(1);
                    tracing::info!(connector = %self.connector, instance = %self.instance, "this instance is now the active capture");
                }
                active
            }
            _ = shutdown.wait() => false,
        }
    }

    /// Resolves when this instance stops being the active one: why.
    pub async fn lost(&mut self) -> String {
        let r = self
            .role
            .wait_for(|r| matches!(r, Role::Lost(_)))
            .await
            .map(|r| r.clone());
        self.active.set(0);
        match r {
            Ok(Role::Lost(why)) => why,
            _ => "the election's consumer stopped".into(),
        }
    }

    /// Leave the group (after the last checkpoint): a standby takes over at once.
    pub fn leave(mut self) {
        self.shut();
    }

    fn shut(&mut self) {
        self.active.set(0);
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Election {
    fn drop(&mut self) {
        self.shut();
    }
}

/// Run `body`, a capture, as one instance of a standby group when `config.enabled` (otherwise at
/// once). `body` gets the shutdown it obeys: the process's, or the loss of the active role.
/// A lost role ends in an error, for the supervisor to start the instance again as a standby.
pub async fn run<F, Fut>(
    config: &StandbyConfig,
    kafka: &KafkaConfig,
    connector: &str,
    registry: &Registry,
    active_metric: &str,
    shutdown: Shutdown,
    body: F,
) -> anyhow::Result<()>
where
    F: FnOnce(Shutdown) -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<()>>,
{
    if !config.enabled {
        return body(shutdown).await;
    }
    let mut election = Election::join(config, kafka, connector, registry, active_metric)
        .await
        .map_err(|e| anyhow::anyhow!("connector {connector:?}: {e}"))?;
    if !election.wait_active(&shutdown).await {
        election.leave();
        tracing::info!("stopped while a standby");
        return Ok(());
    }
    let own = Shutdown::new();
    let run = body(own.clone());
    tokio::pin!(run);
    tokio::select! {
        r = &mut run => {
            election.leave();
            r
        }
        _ = shutdown.wait() => {
            own.trigger();
            let r = run.await;
            election.leave();
            r
        }
        why = election.lost() => {
            tracing::error!(connector, instance = election.instance(), reason = %why, "this instance lost the active role: it stops publishing");
            own.trigger();
            if let Err(e) = run.await {
                tracing::warn!(error = format!("{e:#}"), "the capture, stopping after the active role was lost");
            }
            let instance = election.instance().to_string();
            drop(election);
            Err(anyhow::anyhow!(
                "connector {connector:?}: instance {instance:?} is no longer the active capture \
                 ({why}); it stopped publishing and exits, to be started again as a standby"
            ))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_defaults_and_their_checks() {
        let c = StandbyConfig::default();
        assert!(!c.enabled);
        assert_eq!(c.session_timeout_ms, 6000);
        assert!(c.validate().is_ok());
        let e = StandbyConfig {
            session_timeout_ms: 10,
            ..c.clone()
        }
        .validate()
        .unwrap_err();
        assert_eq!(e.0, "standby.session_timeout_ms");
        let e = StandbyConfig {
            topic: String::new(),
            ..c.clone()
        }
        .validate()
        .unwrap_err();
        assert_eq!(e.0, "standby.topic");
        assert_eq!(
            StandbyConfig::group("mysql"),
            "sluice-capture-election.mysql"
        );
        let named = StandbyConfig {
            instance: "capture-0".into(),
            ..c
        };
        assert_eq!(named.instance_name(), "capture-0");
        assert!(!StandbyConfig::default().instance_name().is_empty());
    }
}
