//! Writing a batch: round by round, as commands per collection ([`crate::mongo::write`]), and
//! what the replies say.
//!
//! - A failure of a whole command, or a statement refused for now (an election, a shutdown),
//!   fails the batch write with an [`ApplyError`] whose kind decides what follows: transient,
//!   the sink writes the whole batch again (every write is idempotent, so the part already made
//!   changes nothing); definite, the sink stops.
//! - An insert refused as a duplicate of its key (a replay) is written again, in the same
//!   round, as the replacement it stands for.
//! - Any other statement refused for its document alone is collected, not dead-lettered at
//!   once: a transient failure later in the batch writes it all again, and it would be refused
//!   (and sent) twice. [`Writer::settle`] dead-letters them once the whole batch is written.
//!
//! The writer is shared by the sink and the rebalance callback ([`super::batch::MongoDrain`]).

use std::collections::HashMap;

use futures::StreamExt;
use mongodb::bson::{doc, Document};
use rdkafka::message::OwnedMessage;
use rdkafka::Message;

use super::batch::Batch;
use super::fence::Fence;
use super::metrics::Metrics;
use crate::consumer::OnBadEvent;
use crate::error::{ApplyError, BadEvent, Origin, Reason};
use crate::group::DeadLetters;
use crate::mongo::write::{commands, reply_errors, rounds, Write};
use crate::mongo::MongoTargetConfig;

/// MongoDB's code for a write that would duplicate a unique index's key.
const DUPLICATE_KEY: i32 = 11000;

/// Writes batches; shared by the sink and the rebalance callback.
#[derive(Clone)]
pub(super) struct Writer {
    client: mongodb::Client,
    write_concern: Document,
    /// `mongodb.bypass_validation`.
    bypass_validation: bool,
    dead: DeadLetters,
    on_bad_event: OnBadEvent,
    metrics: Metrics,
    /// Writes only partitions this member still owns ([`Fence`]).
    pub(super) fence: std::sync::Arc<Fence>,
    /// With `errors.on_bad_event = "stop_table"`: the collections a refused write stops, for
    /// the sink to record (the rebalance callback settles batches too).
    pub(super) to_stop: std::sync::Arc<Stops>,
    /// Where those stops are recorded, before the offsets of their events are stored.
    stop_log: super::ddl::StopLog,
}

/// Collections to stop, with a flag the sink reads for every row event (cheaper than the lock).
#[derive(Default)]
pub(super) struct Stops {
    pending: std::sync::atomic::AtomicBool,
    list: std::sync::Mutex<Vec<ToStop>>,
}

impl Stops {
    fn push(&self, stop: ToStop) {
        self.list.lock().expect("stops lock").push(stop);
        self.pending
            .store(true, std::sync::atomic::Ordering::Release);
    }

    /// The collections to stop since the last take (none without taking the lock).
    pub(super) fn take(&self) -> Vec<ToStop> {
        if !self
            .pending
            .swap(false, std::sync::atomic::Ordering::Acquire)
        {
            return Vec::new();
        }
        std::mem::take(&mut *self.list.lock().expect("stops lock"))
    }
}

/// A collection to stop: its namespace, why, and the version of the refused event.
pub(super) struct ToStop {
    pub(super) ns: String,
    pub(super) reason: String,
    pub(super) version: u64,
}

/// A statement MongoDB refused for its document alone.
struct Refusal {
    /// Index into `Batch::messages`.
    origin: usize,
    /// The target namespace.
    ns: String,
    bad: BadEvent,
}

/// What a batch write did.
#[derive(Default)]
pub(super) struct Outcome {
    refused: Vec<Refusal>,
    /// (namespace, kind) -> writes acknowledged.
    writes: HashMap<(String, &'static str), u64>,
}

/// The server refused the command for the user's rights (Unauthorized, 13).
fn unauthorized(e: &mongodb::error::Error) -> bool {
    matches!(&*e.kind, mongodb::error::ErrorKind::Command(c) if c.code == 13)
}

/// The write concern of every command: `mongodb.write_concern` (a number of members or a
/// name), `j` and `wtimeout` as configured.
fn write_concern(config: &MongoTargetConfig) -> Document {
    let mut write_concern = doc! {};
    let w = config.write_concern.trim();
    match w.parse::<i32>() {
        Ok(n) => write_concern.insert("w", n),
        Err(_) => write_concern.insert("w", w),
    };
    if config.journal {
        write_concern.insert("j", true);
    }
    if config.wtimeout_ms > 0 {
        write_concern.insert("wtimeout", config.wtimeout_ms as i64);
    }
    write_concern
}

impl Writer {
    pub(super) fn new(
        client: mongodb::Client,
        config: &MongoTargetConfig,
        dead: DeadLetters,
        on_bad_event: OnBadEvent,
        metrics: Metrics,
        fence: Fence,
    ) -> Self {
        Writer {
            fence: std::sync::Arc::new(fence),
            to_stop: Default::default(),
            stop_log: super::ddl::StopLog::new(&client, &config.meta_database),
            client,
            write_concern: write_concern(config),
            bypass_validation: config.bypass_validation,
            dead,
            on_bad_event,
            metrics,
        }
    }

    /// Write every item of `batch`, round by round. Statements refused for their document
    /// alone are returned, not dead-lettered yet: a transient failure later in the batch writes
    /// it all again, and they would be refused (and sent) twice.
    pub(super) async fn write(&self, batch: &Batch) -> Result<Outcome, ApplyError> {
        let mut outcome = Outcome::default();
        let keys: Vec<(&str, &str, &[u8])> = batch
            .items
            .iter()
            .map(|i| (&*i.db, &*i.coll, i.write.key().as_bytes()))
            .collect();
        // Still the owner of every partition of the batch: checked before each attempt, and
        // again between rounds once a second has gone by (a long batch).
        self.fence.check(&batch.offsets).await?;
        let mut checked = std::time::Instant::now();
        for round in rounds(&keys) {
            if checked.elapsed() >= std::time::Duration::from_secs(1) {
                self.fence.check(&batch.offsets).await?;
                checked = std::time::Instant::now();
            }
            let writes: Vec<(usize, &Write)> =
                round.iter().map(|&i| (i, &batch.items[i].write)).collect();
            let held = self.write_round(batch, &writes, &mut outcome).await?;
            if held.is_empty() {
                continue;
            }
            // Inserts of keys the target holds: written again, in the same round (before the
            // key's next write), as replacements.
            let again: Vec<(usize, Write)> = held
                .iter()
                .filter_map(|&i| Some((i, batch.items[i].write.as_replacement()?)))
                .collect();
            let again: Vec<(usize, &Write)> = again.iter().map(|(i, w)| (*i, w)).collect();
            self.write_round(batch, &again, &mut outcome).await?;
        }
        Ok(outcome)
    }

    /// Write `writes` (indexes into the batch's items, with the write to make for each; one
    /// per key) as commands per collection, and read the replies. Returns the inserts refused
    /// because the target already holds their key.
    async fn write_round(
        &self,
        batch: &Batch,
        writes: &[(usize, &Write)],
        outcome: &mut Outcome,
    ) -> Result<Vec<usize>, ApplyError> {
        // Per collection, in first-seen order.
        #[allow(clippy::type_complexity)] // (namespace, its writes with their indexes)
        let mut by_ns: Vec<((&str, &str), Vec<(usize, &Write)>)> = Vec::new();
        for &(i, w) in writes {
            let it = &batch.items[i];
            let ns = (&*it.db, &*it.coll);
            match by_ns.iter_mut().find(|(n, _)| *n == ns) {
                Some((_, v)) => v.push((i, w)),
                None => by_ns.push((ns, vec![(i, w)])),
            }
        }
        // A command's statements are positions in its collection's writes.
        let commands = by_ns.iter().flat_map(|((db, coll), writes)| {
            commands(
                coll,
                writes.iter().map(|(_, w)| *w),
                &self.write_concern,
                self.bypass_validation,
            )
            .into_iter()
            .map(move |c| (*db, *coll, writes, c))
        });
        let replies = futures::stream::iter(commands.map(|(db, coll, writes, cmd)| async move {
            let reply = self.client.database(db).run_raw_command(cmd.body).await;
            (db, coll, writes, cmd.statements, reply)
        }))
        .buffer_unordered(4)
        .collect::<Vec<_>>()
        .await;
        let mut held = Vec::new();
        for (db, coll, writes, statements, reply) in replies {
            let reply = match reply {
                Ok(r) => r,
                Err(e) if self.bypass_validation && unauthorized(&e) => {
                    return Err(ApplyError::from(e).context(format!(
                        "writing to {db}.{coll} with bypassDocumentValidation \
                         (mongodb.bypass_validation): the user needs the \
                         bypassDocumentValidation action (the dbAdmin or restore role, or a \
                         role of its own), or set mongodb.bypass_validation = false (a document \
                         the target's validator refuses is then dead-lettered)"
                    )))
                }
                Err(e) => return Err(e.into()),
            };
            let ns = format!("{db}.{coll}");
            let mut done = vec![true; statements.len()];
            for e in reply_errors(&reply)? {
                if e.transient() {
                    return Err(ApplyError::transient(
                        Origin::Mongo,
                        format!("{ns}: {} (code {})", e.message, e.code),
                    ));
                }
                let Some(&(item, write)) = statements.get(e.index).map(|&k| &writes[k]) else {
                    continue;
                };
                if e.code == DUPLICATE_KEY && matches!(write, Write::Insert { .. }) {
                    held.push(item);
                    done[e.index] = false;
                    continue;
                }
                // Refused, not acknowledged: not counted as a write.
                done[e.index] = false;
                outcome.refused.push(Refusal {
                    origin: batch.items[item].origin,
                    ns: ns.to_string(),
                    bad: BadEvent::new(
                        if e.code == DUPLICATE_KEY {
                            Reason::DuplicateKey
                        } else {
                            Reason::Refused
                        },
                        format!(
                            "{ns}: MongoDB refused the write: {} (code {})",
                            e.message, e.code
                        ),
                    ),
                });
            }
            let mut kinds: Vec<(&'static str, u64)> = Vec::new();
            for (k, done) in statements.iter().zip(done) {
                let kind = writes[*k].1.kind();
                match kinds.iter_mut().find(|(n, _)| *n == kind) {
                    Some((_, c)) => *c += u64::from(done),
                    None => kinds.push((kind, u64::from(done))),
                }
            }
            for (kind, n) in kinds {
                *outcome.writes.entry((ns.clone(), kind)).or_insert(0) += n;
            }
        }
        Ok(held)
    }

    /// After the whole batch is written: count the writes and dead-letter the refused events
    /// (an event refused in several statements is sent once).
    pub(super) async fn settle(&self, batch: &Batch, outcome: Outcome) -> Result<(), ApplyError> {
        for ((ns, kind), n) in &outcome.writes {
            self.metrics
                .writes
                .with_label_values(&[ns.as_str(), kind])
                .inc_by(*n);
        }
        let mut sent = std::collections::HashSet::new();
        for r in &outcome.refused {
            if sent.insert(r.origin) {
                let m = &batch.messages[r.origin];
                self.stop_for(m, &r.ns, &r.bad).await?;
                self.dead_letter(m, &r.bad).await?;
            }
        }
        if !outcome.refused.is_empty() {
            tracing::warn!(refused = outcome.refused.len(), "writes refused");
        }
        Ok(())
    }

    /// With `errors.on_bad_event = "stop_table"` (the default), a row event that can never be
    /// written stops its target collection: the target would silently lack the change (a
    /// refused insert leaves a document out, a refused update leaves an older state).
    pub(super) async fn stop_for(
        &self,
        m: &OwnedMessage,
        ns: &str,
        bad: &BadEvent,
    ) -> Result<(), ApplyError> {
        if self.on_bad_event != OnBadEvent::StopTable {
            return Ok(());
        }
        let version = sluice_proto::view::RowEvent::parse(m.payload().unwrap_or_default())
            .map(|e| e.version)
            .unwrap_or(0);
        let reason = format!(
            "the event at {}/{}@{} cannot be written: {}. The collection without it would \
             differ from the source; fix the cause, then copy the collection again (the \
             capture's snapshot) or set errors.on_bad_event = \"dead_letter\" to skip such \
             events",
            m.topic(),
            m.partition(),
            m.offset(),
            bad.message
        );
        tracing::error!(collection = %ns, %reason, "collection stopped");
        self.stop_log.write(ns, &reason, version).await?;
        self.to_stop.push(ToStop {
            ns: ns.to_string(),
            reason,
            version,
        });
        Ok(())
    }

    /// Send an event that can never be written to the dead-letter topic, counted by its
    /// reason; or stop, with `errors.on_bad_event = "stop"`. Either failure is definite.
    pub(super) async fn dead_letter(
        &self,
        m: &OwnedMessage,
        bad: &BadEvent,
    ) -> Result<(), ApplyError> {
        self.metrics
            .dead_letters
            .with_label_values(&[bad.reason.label()])
            .inc();
        if self.on_bad_event == OnBadEvent::Stop {
            return Err(ApplyError::definite(
                Origin::Sink,
                format!(
                    "event at {}/{}@{} cannot be written: {}",
                    m.topic(),
                    m.partition(),
                    m.offset(),
                    bad.message
                ),
            ));
        }
        self.dead
            .send(m, bad)
            .await
            .map_err(|e| ApplyError::definite(Origin::Sink, e))
    }
}

#[cfg(test)]
mod tests {
    use crate::error::{ApplyError, Origin};
    use mongodb::bson::doc;
    use mongodb::error::{CommandError, Error, ErrorKind};

    /// A whole write command refused by the server with `code`, as the driver returns it.
    fn refused(code: i32) -> ApplyError {
        let reply = doc! { "ok": 0, "code": code, "codeName": "X", "errmsg": "m" };
        let c: CommandError = mongodb::bson::from_document(reply).expect("a command error");
        ApplyError::from(Error::from(ErrorKind::Command(c)))
    }

    #[test]
    fn a_command_refused_for_an_unknown_reason_stops_the_sink() {
        // Elections, shutdowns, time limits: the batch is written again.
        for code in [91, 189, 10107, 11602, 50, 262] {
            assert!(refused(code).is_transient(), "{code}");
        }
        // Bad value, bad syntax, unauthorized, too large, and any code not known to be
        // transient: stop with the server's message rather than retry for ever.
        for code in [2, 9, 13, 14, 72, 10334, 11000, 12345] {
            let e = refused(code);
            assert!(!e.is_transient(), "{code}");
            assert_eq!(e.origin(), Origin::Mongo);
            assert!(e.to_string().starts_with("MongoDB: "), "{e}");
        }
    }
}
