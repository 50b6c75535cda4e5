//! Source commands repeated on the target, and the record that keeps a replay from undoing a
//! drop.
//!
//! - A DDL event is applied in order with its partition (the sink writes the batch so far
//!   first). `[ddl] apply` filters it by kind; `[namespaces]` maps its collection (and a
//!   rename's new name) to the target's. "Already so" answers (NamespaceNotFound 26,
//!   NamespaceExists 48, IndexNotFound 27) count as done. A transient failure (network,
//!   election) is retried with backoff until the server answers; one the server refuses is a
//!   [`BadEvent`] (`ddl`, or `undecodable` when it cannot be read), dead-lettered by the sink.
//!   If the record below cannot be written, the sink stops and reads the event again.
//! - Drops, renames and database drops arrive on every partition of the topic. The first
//!   applied is recorded with its version in `<meta_database>.applied_ddl` ([`AppliedDdl`]):
//!   the copies from the other partitions are then skipped, and so is a row event older than
//!   it (read late from another partition, or replayed after a restart), which would otherwise
//!   bring back what was dropped. The record is read at start and every 5 s (other instances
//!   apply commands too), so it survives restarts.
//! - A collection the capture refused (an event of kind "refused": a change it could not
//!   publish) is **stopped**: recorded with the reason in
//!   `<meta_database>.stopped_collections` ([`Stopped`]) with the refusal's version, and its
//!   events of that version or later are dead-lettered, since applying them without the
//!   refused change would leave it wrong (older ones, read late from another partition, are
//!   still written). A restart keeps it stopped; deleting its record takes it up again (after
//!   copying it again).

use std::collections::HashMap;
use std::time::{Duration, Instant};

use futures::StreamExt;
use mongodb::bson::{doc, Bson, Document};
use prost::Message as _;
use sluice_common::Shutdown;
use sluice_proto::ChangeEvent;

use super::Sink;
use crate::error::{ApplyError, BadEvent, Reason};
use crate::mongo::TtlPolicy;

/// The versions of the drops and renames applied to the target, as recorded in
/// `<meta_database>.applied_ddl`.
pub(super) struct AppliedDdl {
    collection: mongodb::Collection<Document>,
    /// `<meta_database>.applied_ddl`, for messages.
    name: String,
    /// Target namespace ("db.coll") or database ("db") -> version of the last drop or rename
    /// applied to it.
    versions: HashMap<String, u64>,
    read_at: Option<Instant>,
}

/// Every document of a bookkeeping collection (`name` for messages).
async fn read_all(
    collection: &mongodb::Collection<Document>,
    name: &str,
) -> Result<Vec<Document>, ApplyError> {
    let context = || format!("reading {name}");
    let mut cursor = collection
        .find(doc! {})
        .await
        .map_err(|e| ApplyError::from(e).context(context()))?;
    let mut out = Vec::new();
    while let Some(d) = cursor.next().await {
        out.push(d.map_err(|e| ApplyError::from(e).context(context()))?);
    }
    Ok(out)
}

/// The record of stopped collections, `<meta_database>.stopped_collections`
/// (`{_id: "db.coll", reason, version, at}`): written by the sink and by the batch writer (a
/// refused write stops its collection, from the rebalance callback too) before the offsets of
/// the event that stopped it are stored.
#[derive(Clone)]
pub(super) struct StopLog {
    collection: mongodb::Collection<Document>,
    pub(super) name: String,
}

impl StopLog {
    pub(super) fn new(client: &mongodb::Client, meta_database: &str) -> Self {
        Self {
            collection: client
                .database(meta_database)
                .collection("stopped_collections"),
            name: format!("{meta_database}.stopped_collections"),
        }
    }

    /// Record `ns` stopped from `version` on (an earlier stop's lower version stays).
    pub(super) async fn write(
        &self,
        ns: &str,
        reason: &str,
        version: u64,
    ) -> Result<(), ApplyError> {
        self.collection
            .update_one(
                doc! { "_id": ns },
                doc! {
                    "$min": { "version": version as i64 },
                    "$setOnInsert": { "reason": reason, "at": mongodb::bson::DateTime::now() },
                },
            )
            .upsert(true)
            .await
            .map_err(|e| {
                ApplyError::from(e)
                    .context(format!("recording a stopped collection in {}", self.name))
            })?;
        Ok(())
    }
}

/// The target collections stopped, as recorded in the [`StopLog`]; read at start and every 5 s
/// (other instances stop collections too).
pub(super) struct Stopped {
    pub(super) log: StopLog,
    /// Target namespace -> why, and the version from which its events are not applied.
    reasons: HashMap<String, (String, u64)>,
    read_at: Option<Instant>,
    /// Said in `/healthz` (degraded while one is stopped) and in a gauge.
    health: sluice_common::metrics::Health,
    gauge: prometheus::IntGauge,
}

impl Stopped {
    pub(super) fn new(
        client: &mongodb::Client,
        meta_database: &str,
        health: sluice_common::metrics::Health,
        gauge: prometheus::IntGauge,
    ) -> Self {
        Self {
            log: StopLog::new(client, meta_database),
            reasons: HashMap::new(),
            read_at: None,
            health,
            gauge,
        }
    }

    /// The stopped collections in the gauge and in `/healthz`.
    fn said(&self) {
        self.gauge.set(self.reasons.len() as i64);
        let why = (!self.reasons.is_empty()).then(|| {
            let mut names: Vec<&str> = self.reasons.keys().map(String::as_str).collect();
            names.sort_unstable();
            format!(
                "{} collection(s) stopped: {} (why: {}; their events are dead-lettered)",
                names.len(),
                names.join(", "),
                self.log.name
            )
        });
        self.health.set("stopped", why);
    }

    /// Load the stopped collections (a restart keeps them stopped; a record deleted takes its
    /// collection up again).
    pub(super) async fn read(&mut self) -> Result<(), ApplyError> {
        let mut reasons = HashMap::new();
        for d in read_all(&self.log.collection, &self.log.name).await? {
            if let (Ok(ns), Ok(reason)) = (d.get_str("_id"), d.get_str("reason")) {
                // (stored as the i64 of the same bits)
                let version = d.get_i64("version").map_or(0, |v| v as u64);
                if self.read_at.is_none() || !self.reasons.contains_key(ns) {
                    tracing::warn!(collection = %ns, %reason, "collection stopped: its events are dead-lettered (delete its document from {} to take it up again)", self.log.name);
                }
                reasons.insert(ns.to_string(), (reason.to_string(), version));
            }
        }
        for ns in self.reasons.keys() {
            if !reasons.contains_key(ns) {
                tracing::info!(collection = %ns, "collection taken up again (its document was deleted from {}): its events are written from here on", self.log.name);
            }
        }
        self.reasons = reasons;
        self.read_at = Some(Instant::now());
        self.said();
        Ok(())
    }

    /// Read the record again if 5 s have gone by.
    pub(super) async fn refresh(&mut self) -> Result<(), ApplyError> {
        if self
            .read_at
            .is_none_or(|t| t.elapsed() >= Duration::from_secs(5))
        {
            if let Err(e) = self.read().await {
                // (asked again in 5 s, not at every event of a target that is down)
                self.read_at = Some(Instant::now());
                return Err(e);
            }
        }
        Ok(())
    }

    pub(super) fn is_empty(&self) -> bool {
        self.reasons.is_empty()
    }

    /// Why an event of `ns` at `version` is not applied, if it is not: the collection is
    /// stopped from a version at or below it.
    pub(super) fn why(&self, ns: &str, version: u64) -> Option<&str> {
        self.reasons
            .get(ns)
            .filter(|(_, from)| version >= *from)
            .map(|(r, _)| r.as_str())
    }

    /// Take a stop already recorded in the log into memory.
    pub(super) fn remember(&mut self, ns: String, reason: String, version: u64) {
        let e = self.reasons.entry(ns).or_insert((reason, version));
        e.1 = e.1.min(version);
        self.said();
    }

    /// Record `ns` stopped from `version`, and remember it.
    pub(super) async fn stop(
        &mut self,
        ns: &str,
        reason: &str,
        version: u64,
    ) -> Result<(), ApplyError> {
        self.log.write(ns, reason, version).await?;
        self.remember(ns.to_string(), reason.to_string(), version);
        Ok(())
    }
}

impl AppliedDdl {
    pub(super) fn new(client: &mongodb::Client, meta_database: &str) -> Self {
        AppliedDdl {
            collection: client.database(meta_database).collection("applied_ddl"),
            name: format!("{meta_database}.applied_ddl"),
            versions: HashMap::new(),
            read_at: None,
        }
    }

    /// Load the versions of applied drops and renames (other instances apply them too).
    pub(super) async fn read(&mut self) -> Result<(), ApplyError> {
        for d in read_all(&self.collection, &self.name).await? {
            if let (Ok(ns), Ok(v)) = (d.get_str("_id"), d.get_i64("version")) {
                let v = v as u64;
                let e = self.versions.entry(ns.to_string()).or_insert(0);
                *e = (*e).max(v);
            }
        }
        self.read_at = Some(Instant::now());
        Ok(())
    }

    /// True when a drop or rename of the namespace (or a drop of its database) newer than
    /// `version` was applied: the event's effect is gone at the source too.
    pub(super) async fn stale(
        &mut self,
        db: &str,
        coll: &str,
        version: u64,
    ) -> Result<bool, ApplyError> {
        if self.versions.is_empty()
            && self
                .read_at
                .is_some_and(|t| t.elapsed() < Duration::from_secs(5))
        {
            return Ok(false);
        }
        if self
            .read_at
            .is_none_or(|t| t.elapsed() >= Duration::from_secs(5))
        {
            self.read().await?;
        }
        let v = |k: &str| self.versions.get(k).copied().unwrap_or(0);
        Ok(v(&format!("{db}.{coll}")).max(v(db)) > version)
    }

    fn version(&self, key: &str) -> u64 {
        self.versions.get(key).copied().unwrap_or(0)
    }

    async fn record(&mut self, key: String, version: u64) -> Result<(), ApplyError> {
        self.collection
            .update_one(
                doc! { "_id": &key },
                doc! { "$max": { "version": version as i64 } },
            )
            .upsert(true)
            .await
            .map_err(|e| {
                ApplyError::from(e).context(format!("recording the command in {}", self.name))
            })?;
        let e = self.versions.entry(key).or_insert(0);
        *e = (*e).max(version);
        Ok(())
    }
}

impl Sink {
    /// Read a DDL event whole and apply it. `Ok(Err(bad))`: it can never be applied (the sink
    /// dead-letters it); `Err`: the sink stops (a shutdown while the target was away, or the
    /// record of an applied drop not written), and the event is read again on restart.
    pub(super) async fn apply_ddl_event(
        &mut self,
        payload: &[u8],
        origin: &crate::group::Offsets,
        shutdown: &Shutdown,
    ) -> Result<Result<(), BadEvent>, ApplyError> {
        match ChangeEvent::decode(payload) {
            Ok(event) => self.apply_ddl(&event, origin, shutdown).await,
            Err(e) => Ok(Err(BadEvent::new(
                Reason::Undecodable,
                format!("not a change event: {e}"),
            ))),
        }
    }

    /// Run a command of a source DDL on the target: a transient failure (network, election)
    /// is retried with backoff until the server answers, as batch writes are; `Ok(Err)` is the
    /// server's refusal, and the "already so" codes are success.
    async fn run_command(
        &self,
        command: Document,
        on: mongodb::Database,
        origin: &crate::group::Offsets,
        shutdown: &Shutdown,
    ) -> Result<Result<(), String>, ApplyError> {
        // Codes that mean "already so": NamespaceNotFound, NamespaceExists, IndexNotFound.
        let ignore = |code: i32| matches!(code, 26 | 48 | 27);
        let mut backoff = Duration::from_millis(500);
        loop {
            // A member that lost the partition must not drop what the new owner made since.
            let e: ApplyError = match self.writer.fence.check(origin).await {
                Err(e) if e.is_transient() => e,
                Err(e) => return Err(e),
                Ok(()) => {
                    let e = match on.run_command(command.clone()).await {
                        Ok(_) => {
                            self.outage.ok();
                            return Ok(Ok(()));
                        }
                        Err(e) => e,
                    };
                    if matches!(&*e.kind, mongodb::error::ErrorKind::Command(c) if ignore(c.code)) {
                        return Ok(Ok(()));
                    }
                    if !sluice_common::mongo::transient(&e) {
                        return Ok(Err(e.to_string()));
                    }
                    ApplyError::from(e)
                }
            };
            self.metrics.retries.inc();
            self.outage
                .failing(&format!("MongoDB: a source command: {e}"));
            tracing::warn!(server = %self.config.mongodb.uri, error = %e, retry_in = ?backoff, "source command failed; retrying");
            if shutdown.is_triggered() {
                return Err(e.context(
                    "stopping with a source command not applied (read again on restart)",
                ));
            }
            tokio::select! {
                _ = shutdown.wait() => {}
                _ = tokio::time::sleep(backoff) => {}
            }
            backoff = (backoff * 2).min(sluice_common::RETRY_MAX);
        }
    }

    /// Repeat a source command on the target.
    async fn apply_ddl(
        &mut self,
        event: &ChangeEvent,
        origin: &crate::group::Offsets,
        shutdown: &Shutdown,
    ) -> Result<Result<(), BadEvent>, ApplyError> {
        let failed = |message: String| BadEvent::new(Reason::Ddl, message);
        let Some(ddl) = &event.ddl else {
            return Ok(Ok(()));
        };
        let kind = ddl.kind.as_str();
        if kind == "refused" {
            // Never filtered: the collection's later events cannot be applied exactly.
            let (db, coll) = self.config.target(&event.database, &event.table);
            let ns = format!("{db}.{coll}");
            if self.stopped.why(&ns, event.version).is_none() {
                let reason = format!(
                    "the source refused it: {} (at {})",
                    ddl.reason, ddl.statement
                );
                tracing::error!(collection = %ns, %reason, "collection stopped: its later events are dead-lettered");
                self.stopped.stop(&ns, &reason, event.version).await?;
            }
            self.metrics.ddl.with_label_values(&[kind, "stopped"]).inc();
            return Ok(Ok(()));
        }
        if !self.config.ddl.applies(kind) {
            self.metrics
                .ddl
                .with_label_values(&[kind, "filtered"])
                .inc();
            tracing::info!(kind, statement = %ddl.statement, "source command not applied (ddl.apply)");
            return Ok(Ok(()));
        }
        let (db, coll) = self.config.target(&event.database, &event.table);
        let destructive = matches!(kind, "drop" | "rename" | "drop_database");
        let key = if kind == "drop_database" {
            db.clone()
        } else {
            format!("{db}.{coll}")
        };
        if destructive {
            // Whether another instance applied it already decides: never from a stale record.
            self.applied.read().await?;
            if self.applied.version(&key) >= event.version {
                self.metrics.ddl.with_label_values(&[kind, "skipped"]).inc();
                return Ok(Ok(())); // applied already (from another partition, or before a restart)
            }
        }
        let json: serde_json::Value = match serde_json::from_str(&ddl.statement) {
            Ok(j) => j,
            Err(e) => {
                return Ok(Err(failed(format!(
                    "command {:?} is not JSON: {e}",
                    ddl.statement
                ))))
            }
        };
        let command = match Bson::try_from(json) {
            Ok(Bson::Document(d)) => d,
            _ => {
                return Ok(Err(failed(format!(
                    "command {:?} is not a document",
                    ddl.statement
                ))))
            }
        };
        let database = self.client.database(&db);
        let run =
            |cmd: Document, on: mongodb::Database| self.run_command(cmd, on, origin, shutdown);
        let result = match kind {
            "drop" => run(doc! { "drop": &coll }, database).await,
            "drop_database" => run(doc! { "dropDatabase": 1 }, database).await,
            "rename" => {
                let (tdb, tcoll) = self.config.target(&ddl.new_database, &ddl.new_table);
                run(
                    doc! { "renameCollection": format!("{db}.{coll}"), "to": format!("{tdb}.{tcoll}"), "dropTarget": false },
                    self.client.database("admin"),
                )
                .await
            }
            _ => match target_command(kind, &command, &coll, self.config.ddl.ttl) {
                Err(e) => return Ok(Err(failed(e))),
                Ok(None) => {
                    self.metrics
                        .ddl
                        .with_label_values(&[kind, "nothing_to_apply"])
                        .inc();
                    tracing::info!(
                        kind,
                        statement = %ddl.statement,
                        "source command changes nothing the target keeps (ddl.ttl)"
                    );
                    return Ok(Ok(()));
                }
                Ok(Some(cmd)) => run(cmd, database).await,
            },
        }?;
        match result {
            Ok(()) => {
                if destructive {
                    self.applied.record(key, event.version).await?;
                }
                self.metrics.ddl.with_label_values(&[kind, "applied"]).inc();
                tracing::info!(kind, target = %format!("{db}.{coll}"), "applied source command");
                Ok(Ok(()))
            }
            Err(e) => {
                self.metrics.ddl.with_label_values(&[kind, "failed"]).inc();
                Ok(Err(failed(format!("{kind} on {db}.{coll} failed: {e}"))))
            }
        }
    }
}

/// The command that repeats a source `create`, `createIndexes`, `dropIndexes` or `collMod`
/// (`modify`) on target collection `coll`, as `ttl` says: `None` when nothing of it is left to
/// apply (a collMod that only changed a TTL the target does not keep). `Err`: the command
/// cannot be read.
pub(super) fn target_command(
    kind: &str,
    command: &Document,
    coll: &str,
    ttl: TtlPolicy,
) -> Result<Option<Document>, String> {
    let strip = ttl == TtlPolicy::WithoutExpiry;
    match kind {
        "create" => {
            let mut cmd = doc! { "create": coll };
            for (k, v) in command {
                // A clustered collection's expiry: not kept (ddl.ttl).
                if k == "create" || (strip && k == "expireAfterSeconds") {
                    continue;
                }
                cmd.insert(k, v.clone());
            }
            Ok(Some(cmd))
        }
        "create_indexes" => {
            let indexes = command
                .get_array("indexes")
                .map_err(|e| format!("createIndexes without indexes: {e}"))?;
            let indexes: Vec<Bson> = indexes
                .iter()
                .map(|i| match i {
                    Bson::Document(d) => {
                        let mut d = d.clone();
                        d.remove("ns");
                        d.remove("v");
                        if strip {
                            d.remove("expireAfterSeconds");
                        }
                        Bson::Document(d)
                    }
                    other => other.clone(),
                })
                .collect();
            Ok(Some(doc! { "createIndexes": coll, "indexes": indexes }))
        }
        "drop_indexes" => {
            let index = command
                .get("index")
                .cloned()
                .unwrap_or(Bson::String("*".into()));
            Ok(Some(doc! { "dropIndexes": coll, "index": index }))
        }
        "modify" => {
            let mut cmd = doc! { "collMod": coll };
            for (k, v) in command {
                match (k.as_str(), v) {
                    ("collMod", _) => {}
                    ("expireAfterSeconds", _) if strip => {}
                    ("index", Bson::Document(index)) if strip => {
                        let mut index = index.clone();
                        index.remove("expireAfterSeconds");
                        // Only the index's name or keys left: nothing to change on it.
                        if index.keys().any(|k| k != "name" && k != "keyPattern") {
                            cmd.insert("index", index);
                        }
                    }
                    _ => {
                        cmd.insert(k, v.clone());
                    }
                }
            }
            Ok((cmd.len() > 1).then_some(cmd))
        }
        other => Err(format!("no command of kind {other:?} is known")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ttl_indexes_lose_their_expiry_unless_kept() {
        let w = TtlPolicy::WithoutExpiry;
        let ttl = doc! { "createIndexes": "src", "indexes": [
            { "v": 2, "key": { "at": 1 }, "name": "at_1", "expireAfterSeconds": 3600 },
            { "v": 2, "key": { "k": 1 }, "name": "k_1", "unique": true },
        ] };
        assert_eq!(
            target_command("create_indexes", &ttl, "dst", w).unwrap(),
            Some(doc! { "createIndexes": "dst", "indexes": [
                { "key": { "at": 1 }, "name": "at_1" },
                { "key": { "k": 1 }, "name": "k_1", "unique": true },
            ] })
        );
        assert_eq!(
            target_command("create_indexes", &ttl, "dst", TtlPolicy::AsSource).unwrap(),
            Some(doc! { "createIndexes": "dst", "indexes": [
                { "key": { "at": 1 }, "name": "at_1", "expireAfterSeconds": 3600 },
                { "key": { "k": 1 }, "name": "k_1", "unique": true },
            ] })
        );
        let create = doc! { "create": "src", "clusteredIndex": { "key": { "_id": 1 }, "unique": true }, "expireAfterSeconds": 60 };
        assert_eq!(
            target_command("create", &create, "dst", w).unwrap(),
            Some(
                doc! { "create": "dst", "clusteredIndex": { "key": { "_id": 1 }, "unique": true } }
            )
        );
        assert!(target_command("create_indexes", &doc! {}, "dst", w)
            .unwrap_err()
            .contains("without indexes"));
    }

    #[test]
    fn coll_mod_is_repeated_on_the_target_collection_without_a_ttl_it_does_not_keep() {
        let w = TtlPolicy::WithoutExpiry;
        // Only a TTL changed: nothing to do.
        let only_ttl =
            doc! { "collMod": "src", "index": { "name": "at_1", "expireAfterSeconds": 60 } };
        assert_eq!(target_command("modify", &only_ttl, "dst", w).unwrap(), None);
        assert_eq!(
            target_command("modify", &only_ttl, "dst", TtlPolicy::AsSource).unwrap(),
            Some(doc! { "collMod": "dst", "index": { "name": "at_1", "expireAfterSeconds": 60 } })
        );
        // A hidden index and a validator: applied, on the target's name.
        let hidden = doc! { "collMod": "src", "index": { "keyPattern": { "k": 1 }, "hidden": true, "expireAfterSeconds": 5 } };
        assert_eq!(
            target_command("modify", &hidden, "dst", w).unwrap(),
            Some(doc! { "collMod": "dst", "index": { "keyPattern": { "k": 1 }, "hidden": true } })
        );
        let validator = doc! { "collMod": "src", "validator": { "k": { "$gt": 0 } }, "validationLevel": "moderate" };
        assert_eq!(
            target_command("modify", &validator, "dst", w).unwrap(),
            Some(
                doc! { "collMod": "dst", "validator": { "k": { "$gt": 0 } }, "validationLevel": "moderate" }
            )
        );
        assert!(target_command("other", &validator, "dst", w).is_err());
    }
}
