//! The binlog reader: from a start position to change events on Kafka, resumable.
//!
//! Progress and resumption:
//! - At start the capture reads its checkpoint (`[publish] checkpoint_topic`, key = connector).
//!   With one, it resumes at the checkpoint's binlog coordinate, after checking that the source
//!   is the same server and still has that binlog file; without one it starts at `[mysql] start`.
//! - Rows are published as they are read (a large transaction streams through in bounded
//!   memory); at each commit (XID, COMMIT, or a DDL statement) the capture queues a mark with the
//!   position after the commit. The publisher stores a mark's position only after Kafka
//!   acknowledged every event before it.
//! - A dropped connection is noticed by the server's heartbeats (`[mysql] heartbeat_ms`) going
//!   silent and re-opened from the last commit: the rows of a transaction cut in half are
//!   published again, with the same versions, which apply ignores.
//! - Schemas come from `information_schema` when a table is first seen and after each DDL that
//!   names it; every schema is published to the schema topic before the first event using it.
//!
//! This module holds the loop; each of its steps lives with its concern:
//! - `context`: the state the loop carries ([`Capture`], the table decoders, the transaction);
//! - `start`: where to begin, the resume checks, opening the binlog dump;
//! - `events`: one function per binlog event kind (rotate, GTIDs, queries, XID, table maps,
//!   rows);
//! - `marks`: transactions, positions and the marks that become checkpoints;
//! - `schemas`: the schema cache and the schema topic;
//! - `ddl`: DDL and TRUNCATE events, sent to every partition;
//! - `snapshot`: the snapshot run between transactions (the readers are in
//!   [`crate::mysql::snapshot`]).

mod context;
mod ddl;
mod events;
mod marks;
mod schemas;
mod snapshot;
mod start;
mod table_map;
mod xa;

use std::time::Duration;

use futures::StreamExt;
use mysql_async::binlog::events::Event;
use mysql_async::BinlogStream;
use prometheus::Registry;
use sluice_common::Shutdown;

pub use context::Capture;

use super::snapshot::Msg;
use super::Config;
use crate::error::CaptureError;

/// Databases never captured.
pub const SYSTEM_DATABASES: &[&str] = &["mysql", "information_schema", "performance_schema", "sys"];

/// What the loop takes next.
enum Input {
    /// A binlog event.
    Event(Event),
    /// A snapshot reader's message (none: the readers are gone).
    Snapshot(Option<Msg>),
    /// Shutdown.
    Stop,
}

impl Capture {
    /// Connect, read the checkpoint, work out where to begin (see `start`).
    pub async fn start(config: Config, registry: &Registry) -> Result<Self, CaptureError> {
        let (mut capture, checkpoint) = Self::connect(config, registry).await?;
        capture.resume_from(checkpoint).await?;
        if capture.config.publish.topics_at_start {
            capture.prepare_topics().await;
        }
        Ok(capture)
    }

    /// Create the topics of every table the filter takes now, in one request, before the first
    /// row: with thousands of tables, one at a time at each table's first row takes minutes
    /// (docs/deploy.md, *Many tables*). Tables created later get theirs at their first row, as
    /// does every table when this fails (said in the log).
    async fn prepare_topics(&mut self) {
        use mysql_async::prelude::Queryable;
        let tables: Vec<(String, String)> = match self
            .schema_conn
            .query(
                "SELECT table_schema, table_name FROM information_schema.tables \
                 WHERE table_type = 'BASE TABLE'",
            )
            .await
        {
            Ok(t) => t,
            Err(e) => {
                tracing::warn!(error = %e, "listing the tables to make their topics beforehand failed; each table's topic is made at its first row");
                return;
            }
        };
        let mut topics: Vec<String> = tables
            .iter()
            .filter(|(db, table)| self.filter.wants(db, table))
            .filter_map(|(db, table)| self.topics.topic(db, table).ok())
            .collect();
        topics.sort();
        topics.dedup();
        if let Err(e) = self.publisher.prepare_topics(&topics).await {
            tracing::warn!(error = %e, topics = topics.len(), "making the tables' topics beforehand failed; each table's topic is made at its first row");
        }
    }

    /// Report a stall in `health` (the process's `/healthz`) while running.
    pub fn watched(mut self, health: sluice_common::metrics::Health) -> Self {
        self.health = health;
        self
    }

    /// Read until shutdown. Transient failures reconnect from the last commit.
    pub async fn run(mut self, shutdown: Shutdown) -> Result<(), CaptureError> {
        let watch = crate::stall::spawn(crate::stall::Watch {
            health: self.health.clone(),
            stalled: self.metrics.stalled.clone(),
            delivery: self.publisher.delivery(),
            after: Duration::from_millis(self.config.mysql.stalled_after_ms),
            probe: probe(
                self.opts.clone(),
                self.metrics.file_number.clone(),
                self.metrics.offset.clone(),
            ),
        });
        let result = self.read_until_shutdown(&shutdown).await;
        crate::stall::end(watch, &self.health, &self.metrics.stalled).await;
        let last = self.publisher.finish().await;
        match (&result, last) {
            (_, Ok(Some(c))) => tracing::info!(checkpoint = %c.next, "last checkpoint stored"),
            (_, Ok(None)) => {}
            (Ok(()), Err(e)) => return Err(e.into()),
            (Err(_), Err(e)) => tracing::error!(error = %e, "storing the last checkpoint failed"),
        }
        result
    }

    /// Read, reconnecting after transient failures, until shutdown or a failure that is not.
    async fn read_until_shutdown(&mut self, shutdown: &Shutdown) -> Result<(), CaptureError> {
        let mut backoff = Duration::from_millis(500);
        let result = loop {
            match self.read_binlog(shutdown).await {
                Ok(()) => break Ok(()),
                Err(e) if e.is_transient() && !shutdown.is_triggered() => {
                    self.publish_metrics
                        .errors
                        .with_label_values(&[e.label()])
                        .inc();
                    self.metrics.reconnects.inc();
                    tracing::warn!(server = %self.config.mysql.url, error = %e, resume = %self.resume, retry_in = ?backoff, "binlog connection lost; reconnecting");
                    tokio::select! {
                        _ = shutdown.wait() => break Ok(()),
                        _ = tokio::time::sleep(backoff) => {}
                    }
                    backoff = (backoff * 2).min(sluice_common::RETRY_MAX);
                    // The schema connection may be gone too.
                    if let Ok(c) = crate::mysql::connect::connect(self.opts.clone()).await {
                        self.schema_conn = c;
                    }
                }
                Err(e) => {
                    self.publish_metrics
                        .errors
                        .with_label_values(&[e.label()])
                        .inc();
                    break Err(e);
                }
            }
        };
        result
    }

    /// One connection's worth of reading: open the dump at the last commit, then take the
    /// snapshot's steps between transactions and handle each event, until shutdown.
    async fn read_binlog(&mut self, shutdown: &Shutdown) -> Result<(), CaptureError> {
        let heartbeat = Duration::from_millis(self.config.mysql.heartbeat_ms);
        let mut stream = self.open_binlog(heartbeat).await?;
        loop {
            // A stop, or a broken delivery (the acker ended), ends reading; checked between
            // events, which keep coming at least as heartbeats.
            if shutdown.is_triggered() || self.publisher.failed() {
                return Ok(());
            }
            if self.tx.is_none() && self.snapshot_between_transactions().await? {
                return Ok(());
            }
            let event = match self.next_input(&mut stream, shutdown, heartbeat).await? {
                Input::Event(event) => event,
                Input::Snapshot(message) => {
                    if let Some(m) = message {
                        self.on_snapshot_msg(m).await?;
                    }
                    continue;
                }
                Input::Stop => return Ok(()),
            };
            let table_map = table_map::stream_tables(&stream, &event);
            self.handle(&event, table_map).await?;
        }
    }

    /// The next thing to do: a snapshot message waiting, else the next binlog event (unless a
    /// keyless table's snapshot holds the stream), whichever comes first. No event nor
    /// heartbeat for three heartbeat periods is a dead connection.
    async fn next_input(
        &mut self,
        stream: &mut BinlogStream,
        shutdown: &Shutdown,
        heartbeat: Duration,
    ) -> Result<Input, CaptureError> {
        // Snapshot messages first: a busy binlog always has an event buffered, and would
        // otherwise starve them.
        if let Some(m) = self.snapshot.as_mut().and_then(|r| r.rx.try_recv().ok()) {
            return Ok(Input::Snapshot(Some(m)));
        }
        let next = if self.stream_held() {
            tokio::select! {
                biased;
                _ = shutdown.wait() => return Ok(Input::Stop),
                m = snapshot::recv(&mut self.snapshot) => return Ok(Input::Snapshot(m)),
            }
        } else {
            // An event already buffered is taken without arming a timer.
            match futures::FutureExt::now_or_never(stream.next()) {
                Some(n) => Ok(n),
                None => tokio::select! {
                    biased;
                    _ = shutdown.wait() => return Ok(Input::Stop),
                    m = snapshot::recv(&mut self.snapshot) => return Ok(Input::Snapshot(m)),
                    n = tokio::time::timeout(heartbeat * 3, stream.next()) => n,
                },
            }
        };
        match next {
            Err(_) => Err(
                mysql_async::Error::Io(mysql_async::IoError::Io(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    format!("no binlog event nor heartbeat for {:?}", heartbeat * 3),
                )))
                .into(),
            ),
            Ok(None) => {
                Err(mysql_async::Error::Driver(mysql_async::DriverError::ConnectionClosed).into())
            }
            Ok(Some(Err(mysql_async::Error::Server(e)))) if e.code == 1236 => {
                let files: Vec<mysql_async::Row> = mysql_async::prelude::Queryable::query(
                    &mut self.schema_conn,
                    "SHOW BINARY LOGS",
                )
                .await
                .unwrap_or_default();
                let newest: Option<String> = files.last().and_then(|r| r.get(0));
                Err(CaptureError::source(unsendable_binlog(
                    &self.resume,
                    &e.message,
                    newest.as_deref(),
                    self.generation,
                )))
            }
            Ok(Some(r)) => Ok(Input::Event(r?)),
        }
    }
}

/// The stall watch's look ([`crate::stall`]): the stream's binlog file and offset (as
/// exported) against the server's binlog end, asked on a connection of the watch's own
/// (re-opened when lost; while the server does not answer, nothing is said: the stream says
/// that itself).
fn probe(
    opts: mysql_async::Opts,
    file: prometheus::IntGauge,
    offset: prometheus::IntGauge,
) -> crate::stall::Probe {
    let conn = std::sync::Arc::new(tokio::sync::Mutex::new(None::<mysql_async::Conn>));
    Box::new(move || {
        let (opts, conn) = (opts.clone(), conn.clone());
        let at = (file.get(), offset.get());
        Box::pin(async move {
            let mut conn = conn.lock().await;
            if conn.is_none() {
                *conn = crate::mysql::connect::connect(opts).await.ok();
            }
            let asked = match conn.as_mut() {
                Some(c) => {
                    tokio::time::timeout(Duration::from_secs(10), crate::mysql::binlog_position(c))
                        .await
                }
                None => return unknown(at),
            };
            let end = match asked {
                Ok(Ok(Some(p))) => sluice_proto::binlog_file_seq(&p.file)
                    .ok()
                    .map(|seq| (seq as i64, p.pos as i64)),
                Ok(Ok(None)) => None,
                _ => {
                    *conn = None;
                    None
                }
            };
            let Some(end) = end else {
                return unknown(at);
            };
            crate::stall::Read {
                at,
                caught_up: end <= at,
                meanwhile: format!(
                    "while the source's binlog is at file {} offset {} and the capture at file \
                     {} offset {} (a snapshot holding the stream, Kafka not taking records, or a \
                     stuck connection: see its log)",
                    end.0, end.1, at.0, at.1
                ),
            }
        })
    })
}

/// A look that could not ask the server: nothing to say of the stream.
fn unknown(at: (i64, i64)) -> crate::stall::Read {
    crate::stall::Read {
        at,
        caught_up: true,
        meanwhile: String::new(),
    }
}

/// What to say when the server cannot send the binlog from `resume` (error 1236): its history
/// began again (every file it has is older: RESET MASTER, a restored server), and a new
/// connector needs the next generation, or the file was purged.
fn unsendable_binlog(
    resume: &crate::mysql::position::BinlogPos,
    message: &str,
    newest: Option<&str>,
    generation: u8,
) -> String {
    let seq = |f: &str| sluice_proto::binlog_file_seq(f).unwrap_or(0);
    let began_again = newest.is_none_or(|n| seq(n) < seq(&resume.file));
    if began_again {
        let next = match generation.checked_add(1) {
            Some(g) => format!("mysql.generation = {g}"),
            None => "a higher mysql.generation, but 255 is the last".to_string(),
        };
        format!(
            "the server cannot send the binlog from {resume} (error 1236: {message}): its newest \
             file is {}, so its binlog began again (RESET MASTER, or a restored server). Start \
             a new connector name with {next} (so that its versions stay above every one \
             published so far; the same generation would write lower versions, which the \
             targets would take for older) and re-snapshot the tables.",
            newest.unwrap_or("none")
        )
    } else {
        format!(
            "the server cannot send the binlog from {resume} (error 1236: {message}). If the \
             file was purged, the changes since are lost to the binlog: re-snapshot and start \
             from `end` under a new connector name (with mysql.generation = {generation} or \
             higher)."
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mysql::position::BinlogPos;

    #[test]
    fn a_binlog_that_began_again_names_the_next_generation() {
        let at = BinlogPos {
            file: "mysql-bin.000078".into(),
            pos: 4,
        };
        let m = unsendable_binlog(
            &at,
            "Could not find first log file",
            Some("mysql-bin.000002"),
            2,
        );
        assert!(
            m.contains("began again") && m.contains("mysql.generation = 3"),
            "{m}"
        );
        let m = unsendable_binlog(&at, "purged", Some("mysql-bin.000090"), 2);
        assert!(
            m.contains("purged") && m.contains("mysql.generation = 2 or higher"),
            "{m}"
        );
        let m = unsendable_binlog(&at, "x", None, 255);
        assert!(m.contains("255 is the last"), "{m}");
    }
}
