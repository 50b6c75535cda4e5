//! Faults injected into a running pipeline at seeded moments, one after the other: an applier
//! killed (-9) or stopped (SIGTERM, which must exit 0) and restarted, the Kafka broker restarted,
//! the target cut off for a while (a relay between the appliers and the server), a partition
//! added to a topic. Every kind happens at least once; then more, until the time is up.

use std::time::{Duration, Instant};

use crate::capture::CaptureProcess;
use crate::relay::Relay;
use crate::{kafka_brokers, Rng};

#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Fault {
    KillApplier,
    StopApplier,
    RestartBroker,
    TargetDown,
    AddPartition,
}

pub const ALL: [Fault; 5] = [
    Fault::KillApplier,
    Fault::StopApplier,
    Fault::RestartBroker,
    Fault::TargetDown,
    Fault::AddPartition,
];

/// What [`inject`] did.
#[derive(Debug, Default)]
pub struct Report {
    /// Each fault, with its time from the start.
    pub done: Vec<String>,
    /// Processes that exited on their own (each was started again, as a supervisor would).
    pub unplanned: Vec<String>,
}

/// Whether the broker is the test bed's (which [`inject`] can restart).
pub fn testbed_broker() -> bool {
    let b = kafka_brokers();
    b == "127.0.0.1:19092" || b == "localhost:19092"
}

/// Whether the MariaDB is the test bed's (whose global settings a test may change and set
/// back): `SLUICE_MYSQL_URL` unset, or naming the test bed's port on this machine.
pub fn testbed_mysql() -> bool {
    if std::env::var_os("SLUICE_MYSQL_URL").is_none() {
        return true;
    }
    let port = std::env::var("SLUICE_MARIADB_PORT").unwrap_or_else(|_| "13306".into());
    let url = crate::mysql_url();
    let host = url.rsplit_once('@').map_or(url.as_str(), |(_, h)| h);
    let host = host.split(['/', '?']).next().unwrap_or_default();
    host == format!("127.0.0.1:{port}") || host == format!("localhost:{port}")
}

/// `deploy/testbed.sh ARGS`, which must succeed.
pub fn testbed(args: &[&str]) {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy/testbed.sh");
    let out = std::process::Command::new("bash")
        .arg(script)
        .args(args)
        .output()
        .expect("deploy/testbed.sh runs");
    assert!(
        out.status.success(),
        "testbed.sh {args:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Inject faults for at least `for_` into the pipeline of `cap` and `appliers`, whose target
/// the appliers reach through `relay`; partitions are added to `topic` (which has `partitions`).
pub async fn inject(
    seed: u64,
    for_: Duration,
    cap: &mut CaptureProcess,
    appliers: &mut [CaptureProcess],
    relay: &Relay,
    topic: &str,
    mut partitions: usize,
) -> Report {
    let mut rng = Rng(seed);
    let own_broker = !testbed_broker();
    // Faults: every kind once in a seeded order, then seeded ones until the time is up.
    let mut order: Vec<Fault> = ALL.to_vec();
    for i in (1..order.len()).rev() {
        order.swap(i, rng.below(i as u64 + 1) as usize);
    }
    let started = Instant::now();
    let mut report = Report::default();
    let mut i = 0;
    while i < order.len() || started.elapsed() < for_ {
        let fault = if i < order.len() {
            order[i]
        } else {
            ALL[rng.below(ALL.len() as u64) as usize]
        };
        i += 1;
        tokio::time::sleep(Duration::from_millis(2000 + rng.below(5000))).await;
        // A process that exited on its own is a finding; it is started again (as a supervisor
        // would) so that the run goes on.
        for (k, p) in appliers.iter_mut().enumerate() {
            if p.exited() {
                let (code, log) = p.wait(Duration::from_secs(1));
                report
                    .unplanned
                    .push(format!("applier {k} exited with {code:?}:\n{log}"));
                p.restart();
            }
        }
        if cap.exited() {
            let (code, log) = cap.wait(Duration::from_secs(1));
            report
                .unplanned
                .push(format!("the capture exited with {code:?}:\n{log}"));
            cap.restart();
        }
        let at = started.elapsed().as_secs_f64();
        match fault {
            Fault::KillApplier | Fault::StopApplier => {
                let k = rng.below(appliers.len() as u64) as usize;
                let p = &mut appliers[k];
                if fault == Fault::KillApplier {
                    p.kill();
                } else {
                    let (code, log) = p.stop();
                    assert_eq!(
                        code,
                        Some(0),
                        "seed {seed}: applier {k} stopped with\n{log}"
                    );
                }
                tokio::time::sleep(Duration::from_millis(rng.below(3000))).await;
                p.restart();
                report.done.push(format!("{at:.1}s {fault:?} {k}"));
            }
            Fault::RestartBroker => {
                if own_broker {
                    report.done.push(format!(
                        "{at:.1}s broker restart left out (SLUICE_KAFKA_BROKERS)"
                    ));
                    continue;
                }
                tokio::task::spawn_blocking(|| {
                    testbed(&["stop", "kafka"]);
                    testbed(&["start", "kafka"]);
                })
                .await
                .unwrap();
                report.done.push(format!("{at:.1}s {fault:?}"));
            }
            Fault::TargetDown => {
                let down = Duration::from_millis(2000 + rng.below(8000));
                relay.cut();
                tokio::time::sleep(down).await;
                relay.restore();
                report.done.push(format!("{at:.1}s {fault:?} for {down:?}"));
            }
            Fault::AddPartition => {
                use rdkafka::admin::{AdminClient, AdminOptions, NewPartitions};
                partitions += 1;
                let admin: AdminClient<rdkafka::client::DefaultClientContext> =
                    rdkafka::ClientConfig::new()
                        .set("bootstrap.servers", kafka_brokers())
                        .create()
                        .unwrap();
                let r = admin
                    .create_partitions(
                        &[NewPartitions::new(topic, partitions)],
                        &AdminOptions::new().operation_timeout(Some(Duration::from_secs(10))),
                    )
                    .await
                    .unwrap();
                assert!(r.iter().all(|r| r.is_ok()), "seed {seed}: {r:?}");
                report
                    .done
                    .push(format!("{at:.1}s {fault:?} (now {partitions})"));
            }
        }
    }
    report
}
