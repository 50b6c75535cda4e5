//! The ownership fence: a member writes a partition's events only while it is that partition's
//! newest owner, so that a member that lost its partitions (it went past
//! `max.poll.interval.ms` while retrying an outage, or a network partition took it out of the
//! group) cannot overwrite what the new owner wrote with older states.
//!
//! MongoDB's writes are unconditional, and the documents stay as the source has them (no
//! version field is added to them), so the fence is on ownership, not on each document:
//! - `<meta_database>.partition_owners` has one document per group, topic and partition,
//!   `{_id: "<group>/<topic>/<partition>", epoch, member, at}`.
//! - When partitions are assigned (the rebalance callback, the one moment this member knows it
//!   owns them), the member claims each: the epoch goes up by one and is remembered. A claim
//!   that cannot be made (MongoDB unreachable for its whole retry) stops the sink before it
//!   writes anything: it never claims later, when it may no longer be the owner.
//! - Before each batch write or source command (every attempt of a retried one, and again
//!   between rounds once a second has gone by) the member reads the epochs of the partitions
//!   concerned; one that moved on means another member took the partition over, and one it
//!   never claimed is not its own. Nothing is written and the sink stops, saying so: what it
//!   held is read again from the committed offsets by the owner.
//! - Claims are written with `mongodb.write_concern` and epochs read with majority read
//!   concern, so an election cannot roll a claim back under the check.
//! - Partitions let go in a rebalance are forgotten, and claimed again if they come back.
//!
//! What it does not cover: a write already sent before the new owner's claim, held up in the
//! network and delivered after the new owner's writes. The check is before each write, not
//! part of it (that would need a transaction per batch).

use std::collections::HashMap;
use std::sync::Mutex;

use mongodb::bson::{doc, Bson, Document};
use mongodb::options::ReturnDocument;

use crate::error::{ApplyError, Origin};
use crate::group::Offsets;

pub(super) struct Fence {
    owners: mongodb::Collection<Document>,
    /// `<meta_database>.partition_owners`, for messages.
    name: String,
    group: String,
    /// Who this member is, in the owners' documents and messages.
    member: String,
    /// (topic, partition) -> the epoch this member claimed.
    held: Mutex<HashMap<(String, i32), i64>>,
}

impl Fence {
    pub(super) fn new(
        client: &mongodb::Client,
        meta_database: &str,
        group: &str,
        member: String,
        config: &crate::mongo::MongoTargetConfig,
    ) -> Self {
        let options = mongodb::options::CollectionOptions::builder()
            .write_concern(write_concern(config))
            .read_concern(mongodb::options::ReadConcern::majority())
            .build();
        Fence {
            owners: client
                .database(meta_database)
                .collection_with_options("partition_owners", options),
            name: format!("{meta_database}.partition_owners"),
            group: group.to_string(),
            member,
            held: Mutex::new(HashMap::new()),
        }
    }

    fn id(&self, topic: &str, partition: i32) -> String {
        format!("{}/{topic}/{partition}", self.group)
    }

    /// The partitions were let go (a rebalance): claimed again before their next write.
    pub(super) fn forget(&self) {
        self.held.lock().expect("fence lock").clear();
    }

    /// Claim `partitions`, just assigned to this member: each one's epoch goes up by one.
    pub(super) async fn claim(&self, partitions: &[(String, i32)]) -> Result<(), ApplyError> {
        for (topic, p) in partitions {
            let id = self.id(topic, *p);
            let d = self
                .owners
                .find_one_and_update(
                    doc! { "_id": &id },
                    doc! {
                        "$inc": { "epoch": 1_i64 },
                        "$set": { "member": &self.member, "at": mongodb::bson::DateTime::now() },
                    },
                )
                .upsert(true)
                .return_document(ReturnDocument::After)
                .await
                .map_err(|e| {
                    ApplyError::from(e).context(format!("claiming {id} in {}", self.name))
                })?
                .ok_or_else(|| {
                    ApplyError::transient(
                        Origin::Mongo,
                        format!("MongoDB: claiming {id} in {} returned nothing", self.name),
                    )
                })?;
            let epoch = epoch_of(&d);
            tracing::debug!(partition = %id, epoch, "claimed");
            self.held
                .lock()
                .expect("fence lock")
                .insert((topic.clone(), *p), epoch);
        }
        Ok(())
    }

    /// Check that this member still owns every partition of `offsets`: claimed at its
    /// assignment, and claimed by no one since. A definite error otherwise: write nothing of it.
    pub(super) async fn check(&self, offsets: &Offsets) -> Result<(), ApplyError> {
        let mut verify = Vec::new();
        {
            let held = self.held.lock().expect("fence lock");
            for (topic, partitions) in &offsets.0 {
                for &p in partitions.keys() {
                    match held.get(&(topic.clone(), p)) {
                        Some(&epoch) => verify.push((topic.clone(), p, epoch)),
                        None => {
                            return Err(ApplyError::definite(
                                Origin::Kafka,
                                format!(
                                    "partition {p} of {topic} has no claim of this member ({}) \
                                     in {}: it was not claimed at its assignment, so this member \
                                     cannot tell it still owns it. Stopping without writing; a \
                                     restart joins the group again",
                                    self.member, self.name
                                ),
                            ))
                        }
                    }
                }
            }
        }
        if verify.is_empty() {
            return Ok(());
        }
        let ids: Vec<Bson> = verify
            .iter()
            .map(|(t, p, _)| Bson::String(self.id(t, *p)))
            .collect();
        let mut now: HashMap<String, (i64, String)> = HashMap::new();
        let mut cursor = self.owners.find(doc! { "_id": { "$in": ids } }).await?;
        while cursor.advance().await? {
            let d = cursor.deserialize_current()?;
            let id = d.get_str("_id").unwrap_or_default().to_string();
            let epoch = epoch_of(&d);
            let member = d.get_str("member").unwrap_or("?").to_string();
            now.insert(id, (epoch, member));
        }
        for (topic, p, mine) in &verify {
            let id = self.id(topic, *p);
            let (epoch, member) = match now.get(&id) {
                Some((e, m)) => (*e, m.as_str()),
                None => (0, "nobody (its document is gone)"),
            };
            if epoch != *mine {
                return Err(self.taken_over(topic, *p, *mine, epoch, member));
            }
        }
        Ok(())
    }

    fn taken_over(
        &self,
        topic: &str,
        partition: i32,
        mine: i64,
        epoch: i64,
        member: &str,
    ) -> ApplyError {
        ApplyError::definite(
            Origin::Kafka,
            format!(
                "partition {partition} of {topic} was taken over by {member} (epoch {epoch} in \
                 {}; this member, {}, held epoch {mine}) while this member was writing or \
                 retrying: it is no longer in the group's assignment (past max.poll.interval.ms, \
                 or cut off from Kafka). Stopping without writing its batch, so that no older \
                 state overwrites the new owner's writes; the new owner reads those events again \
                 from the committed offsets",
                self.name, self.member
            ),
        )
    }
}

/// `mongodb.write_concern` (with `journal` and `wtimeout_ms`) as the driver's option.
fn write_concern(config: &crate::mongo::MongoTargetConfig) -> mongodb::options::WriteConcern {
    use mongodb::options::Acknowledgment;
    let w = config.write_concern.trim();
    let w = match w.parse::<u32>() {
        Ok(n) => Acknowledgment::Nodes(n),
        Err(_) if w == "majority" => Acknowledgment::Majority,
        Err(_) => Acknowledgment::Custom(w.to_string()),
    };
    let mut concern = mongodb::options::WriteConcern::builder().w(w).build();
    if config.journal {
        concern.journal = Some(true);
    }
    if config.wtimeout_ms > 0 {
        concern.w_timeout = Some(std::time::Duration::from_millis(config.wtimeout_ms));
    }
    concern
}

fn epoch_of(d: &Document) -> i64 {
    match d.get("epoch") {
        Some(Bson::Int64(e)) => *e,
        Some(Bson::Int32(e)) => *e as i64,
        Some(Bson::Double(e)) => *e as i64,
        _ => 0,
    }
}

/// Who this process is, for the owners' documents: the consumer's static instance id when it
/// has one, else the host name and process id.
pub(super) fn member_name(instance_id: &str) -> String {
    if !instance_id.is_empty() {
        return instance_id.to_string();
    }
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .ok()
        .filter(|h| !h.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| "unknown-host".into());
    format!("{host}:{}", std::process::id())
}
