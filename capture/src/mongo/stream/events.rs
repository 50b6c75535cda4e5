//! A [`Change`] to a `ChangeEvent` on its collection's topic.
//!
//! Key = database, collection and `_id` ([`sluice_proto::append_event_key`]): one document's
//! changes stay on one partition, in order. `version` is the oplog time, so an event published
//! again after a restart carries the version it had. DDL events go to every partition of the
//! collection's topic (a rename also to every partition of the new name's topic), so each
//! partition sees them in order with its documents. What is worked out once per collection (its
//! topic, key prefix and counters) is kept in a [`Namespace`]; the filter's answer once per
//! collection too.

use mongodb::bson::raw::RawDocumentBuf;
use mongodb::bson::{self, Bson};
use mongodb::change_stream::event::ResumeToken;
use prometheus::IntCounter;
use prost::Message;
use sluice_common::clock::now_micros;
use sluice_proto::v1::{self, Op};
use sluice_proto::{append_event_key, event_key_prefix, mongo_version, CONTRACT_VERSION};

use super::checkpoint::token_document;
use super::Capture;
use crate::error::CaptureError;
use crate::mongo::change::{Change, OpKind};

/// Worked out once per collection.
pub(super) struct Namespace {
    topic: std::sync::Arc<str>,
    /// The record key's bytes before the `_id` ([`sluice_proto::event_key_prefix`]).
    key_prefix: Vec<u8>,
    counters: [IntCounter; 5], // insert, update, delete, ddl, snapshot_read
    bytes: IntCounter,
}

impl Capture {
    /// Make sure the collection's topic exists and its metrics are there.
    async fn ensure_namespace(&mut self, db: &str, coll: &str) -> Result<(), CaptureError> {
        if self
            .namespaces
            .get(db)
            .is_some_and(|m| m.contains_key(coll))
        {
            return Ok(());
        }
        let topic = self.topics.topic(db, coll)?;
        self.publisher.ensure_topic(&topic, false).await?;
        let m = &self.publish_metrics;
        let counter = |op: &str| m.events.with_label_values(&[db, coll, op]);
        let ns = Namespace {
            topic: topic.into(),
            key_prefix: event_key_prefix(db, coll),
            counters: [
                counter("insert"),
                counter("update"),
                counter("delete"),
                counter("ddl"),
                counter("snapshot_read"),
            ],
            bytes: m.bytes.with_label_values(&[db, coll]),
        };
        self.namespaces
            .entry(db.to_string())
            .or_default()
            .insert(coll.to_string(), ns);
        Ok(())
    }

    /// Publish one change (nothing when the filter leaves it out), with the change stream's
    /// resume token where there is one. The caller moves the position once it returns: only a
    /// change handed to the publisher counts as reached. Nothing here reads the source, so every
    /// failure is Kafka's or the configuration's, both definite.
    pub(super) async fn publish(
        &mut self,
        mut c: Change,
        token: Option<&ResumeToken>,
    ) -> Result<(), CaptureError> {
        if !self.wanted(&c) {
            self.tx = None;
            return Ok(());
        }
        if !self.refused.is_empty()
            && self
                .refused
                .contains(&(c.database.clone(), c.collection.clone()))
        {
            return Ok(());
        }
        let now = now_micros();
        let micros = c
            .wall_millis
            .map(|w| w * 1000)
            .unwrap_or(i64::from(c.ts.time) * 1_000_000);
        self.publish_metrics
            .lag_seconds
            .set(crate::publish::lag_seconds(micros));
        let transaction = self.transaction(&c);
        let token_bytes = token
            .and_then(token_document)
            .and_then(|d| bson::to_vec(&d).ok())
            .unwrap_or_default();
        let commit_time_micros = c
            .wall_millis
            .map(|m| m * 1000)
            .unwrap_or(i64::from(c.ts.time) * 1_000_000);
        let op = match c.op {
            OpKind::Insert => Op::Insert,
            OpKind::Update | OpKind::Replace => Op::Update,
            OpKind::Delete => Op::Delete,
            OpKind::Ddl => Op::Ddl,
            OpKind::SnapshotRead => Op::SnapshotRead,
        };
        let key_values = match c.id() {
            Some(id) => {
                let mut wrapped = RawDocumentBuf::new();
                wrapped.append_ref("v", id);
                vec![sluice_proto::value::of(v1::value::Kind::Bson(
                    wrapped.into_bytes(),
                ))]
            }
            None => Vec::new(),
        };
        self.ensure_namespace(&c.database, &c.collection).await?;
        let mut key = Vec::with_capacity(64);
        append_event_key(
            &self.namespaces[&c.database][&c.collection].key_prefix,
            &key_values,
            &mut key,
        );
        let update_description = c.update.take().map(|u| v1::UpdateDescription {
            updated_fields: u.updated.into_bytes(),
            removed_fields: u.removed,
            truncated_arrays: u
                .truncated
                .into_iter()
                .map(|(field, new_size)| v1::TruncatedArray { field, new_size })
                .collect(),
        });
        let ddl = c.ddl.take().map(|d| {
            let (new_database, new_table) = d.to.clone().unwrap_or_default();
            (
                v1::Ddl {
                    statement: Bson::Document(d.command)
                        .into_canonical_extjson()
                        .to_string(),
                    schema: None,
                    new_database,
                    new_table,
                    kind: d.kind.to_string(),
                    reason: String::new(),
                    ..Default::default()
                },
                d.to,
            )
        });
        let rename_to = ddl.as_ref().and_then(|(_, to)| to.clone());
        let event = v1::ChangeEvent {
            contract: CONTRACT_VERSION,
            source: Some(self.source.clone()),
            op: op as i32,
            database: std::mem::take(&mut c.database),
            table: std::mem::take(&mut c.collection),
            version: mongo_version(c.ts.time, c.ts.increment),
            position: Some(v1::Position {
                kind: Some(v1::position::Kind::Oplog(v1::OplogPosition {
                    ts_seconds: c.ts.time,
                    ts_increment: c.ts.increment,
                    resume_token: token_bytes,
                })),
            }),
            commit_time_micros,
            capture_time_micros: now,
            transaction,
            key: (!key_values.is_empty()).then_some(v1::Row { values: key_values }),
            ddl: ddl.map(|(d, _)| d),
            mongo: Some(v1::MongoChange {
                document_key: c
                    .document_key
                    .take()
                    .map(RawDocumentBuf::into_bytes)
                    .unwrap_or_default(),
                full_document: c
                    .full_document
                    .take()
                    .map(RawDocumentBuf::into_bytes)
                    .unwrap_or_default(),
                full_document_before_change: c
                    .before
                    .take()
                    .map(RawDocumentBuf::into_bytes)
                    .unwrap_or_default(),
                update_description,
                operation_type: std::mem::take(&mut c.operation_type),
                lsid: c
                    .lsid
                    .take()
                    .map(RawDocumentBuf::into_bytes)
                    .unwrap_or_default(),
                txn_number: c.txn_number.unwrap_or(0),
            }),
            ..Default::default()
        };
        self.buf.clear();
        event.encode(&mut self.buf).expect("Vec grows");
        let payload = std::mem::take(&mut self.buf);
        if op != Op::Ddl && payload.len() + key.len() > self.config.publish.max_message_bytes {
            let size = payload.len() + key.len();
            self.buf = payload;
            return self.refuse_oversized(&event, size, &key).await;
        }
        let ns = &self.namespaces[&event.database][&event.table];
        ns.bytes.inc_by(payload.len() as u64);
        ns.counters[match c.op {
            OpKind::Insert => 0,
            OpKind::Update | OpKind::Replace => 1,
            OpKind::Delete => 2,
            OpKind::Ddl => 3,
            OpKind::SnapshotRead => 4,
        }]
        .inc();
        if op == Op::Ddl {
            // Every partition sees the command in order with its documents (a rename also
            // every partition of the new name's topic).
            let mut targets = vec![ns.topic.clone()];
            if let Some((db, coll)) = rename_to.filter(|(_, coll)| !coll.is_empty()) {
                self.ensure_namespace(&db, &coll).await?;
                targets.push(self.namespaces[&db][&coll].topic.clone());
            }
            for topic in targets {
                self.publisher
                    .send_to_every_partition(&topic, &key, &payload)
                    .await?;
            }
        } else {
            self.publisher.send(&ns.topic, &key, &payload, None).await?;
        }
        self.buf = payload;
        self.since_mark += 1;
        Ok(())
    }

    /// A change of `event`'s collection makes an event of `size` bytes, more than
    /// `publish.max_message_bytes`: the collection is refused (an event of kind "refused" on
    /// every partition of its topic, which stops it in the apply stages), with the document
    /// named, rather than handed to the producer, whose failure would stop the capture at the
    /// same change after every restart. Its later changes are not published; the others flow.
    async fn refuse_oversized(
        &mut self,
        event: &v1::ChangeEvent,
        size: usize,
        key: &[u8],
    ) -> Result<(), CaptureError> {
        let (db, coll) = (event.database.clone(), event.table.clone());
        let id = event
            .key
            .as_ref()
            .and_then(|k| k.values.first())
            .and_then(|v| match &v.kind {
                Some(v1::value::Kind::Bson(b)) => RawDocumentBuf::from_bytes(b.clone()).ok(),
                _ => None,
            })
            .and_then(|d| d.to_document().ok())
            .and_then(|d| d.get("v").cloned())
            .map(|v| v.into_relaxed_extjson().to_string())
            .unwrap_or_else(|| "(no _id)".into());
        let max = self.config.publish.max_message_bytes;
        let reason = format!(
            "the change of document _id {id} at oplog time {}.{} makes an event of {size} \
             bytes, more than publish.max_message_bytes ({max}). Raise \
             publish.max_message_bytes (up to the broker's message.max.bytes and the topic's \
             max.message.bytes), restart the capture, take the collection up again in the \
             apply stage, and copy it again (snapshot.request_id, snapshot.tables)",
            event.version >> 32,
            event.version & 0xffff_ffff
        );
        tracing::error!(database = %db, collection = %coll, size, max, %reason, "collection refused: a change too large to publish");
        self.refused.insert((db.clone(), coll.clone()));
        let refusal = v1::ChangeEvent {
            contract: event.contract,
            source: event.source.clone(),
            op: Op::Ddl as i32,
            database: db.clone(),
            table: coll.clone(),
            version: event.version,
            position: event.position.clone(),
            commit_time_micros: event.commit_time_micros,
            capture_time_micros: event.capture_time_micros,
            ddl: Some(v1::Ddl {
                statement: format!("(a change of document _id {id})"),
                kind: "refused".into(),
                reason,
                ..Default::default()
            }),
            ..Default::default()
        };
        let topic = self.namespaces[&db][&coll].topic.clone();
        self.publisher
            .send_to_every_partition(&topic, key, &refusal.encode_to_vec())
            .await?;
        self.publish_metrics
            .events
            .with_label_values(&[&db, &coll, "refused"])
            .inc();
        self.since_mark += 1;
        Ok(())
    }

    /// Whether the change is captured: its collection passes the filter (a rename also when its
    /// new name does, a database command when its database does) and is not a system
    /// collection.
    pub(super) fn wanted(&mut self, c: &Change) -> bool {
        let wanted = if c.collection.is_empty() {
            self.filter.wants_database(&c.database)
        } else {
            self.wants(&c.database, &c.collection)
                || c.ddl
                    .as_ref()
                    .and_then(|d| d.to.as_ref())
                    .is_some_and(|(db, coll)| self.filter.wants(db, coll))
        };
        wanted && !c.collection.starts_with("system.")
    }

    /// [`crate::filter::Filter::wants`], remembered per collection.
    fn wants(&mut self, db: &str, coll: &str) -> bool {
        if let Some(w) = self.wanted.get(db).and_then(|m| m.get(coll)) {
            return *w;
        }
        let w = self.filter.wants(db, coll);
        self.wanted
            .entry(db.to_string())
            .or_default()
            .insert(coll.to_string(), w);
        w
    }

    /// Transaction id (`<lsid.id as hex>:<txnNumber>`) and the event's index in it.
    fn transaction(&mut self, c: &Change) -> Option<v1::Transaction> {
        let (Some(lsid), Some(txn)) = (&c.lsid, c.txn_number) else {
            self.tx = None;
            return None;
        };
        let id_bytes = match lsid.get("id") {
            Ok(Some(bson::RawBsonRef::Binary(b))) => b.bytes,
            _ => lsid.as_bytes(),
        };
        let id = sluice_common::hex::encode(id_bytes) + ":" + &txn.to_string();
        let index = match &mut self.tx {
            Some((cur, n)) if *cur == id => {
                *n += 1;
                *n
            }
            _ => {
                self.tx = Some((id.clone(), 0));
                0
            }
        };
        Some(v1::Transaction {
            id,
            index,
            last: false,
        })
    }
}
