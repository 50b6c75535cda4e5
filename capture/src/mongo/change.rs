//! One MongoDB change, from either source the capture reads: a change stream event or an oplog
//! entry (`local.oplog.rs`). Both become the same [`Change`], so the events on Kafka do not depend
//! on the mode.
//!
//! This module reads change stream events ([`from_change_stream`]) and holds what both share;
//! [`oplog`] reads oplog entries.
//!
//! Documents stay raw BSON throughout: nothing is decoded into a tree and re-encoded, so every
//! BSON type (Decimal128, MinKey, JavaScript with scope, regular expressions, ...) travels byte
//! for byte.

use mongodb::bson::raw::{RawBsonRef, RawDocument, RawDocumentBuf};
use mongodb::bson::{self, doc, Document, Timestamp};

mod oplog;

pub use oplog::{from_oplog, OplogEntry};

/// What a change did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OpKind {
    Insert,
    /// A partial update: `update` holds what changed (or, with `lookup`, nothing is known but
    /// the key, and the capture must read the document).
    Update,
    /// The whole document replaced: `full_document` holds the new one.
    Replace,
    Delete,
    Ddl,
    /// A document read by a snapshot: `full_document` holds it.
    SnapshotRead,
}

/// An update's changes, as MongoDB's change streams describe them.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct UpdateDesc {
    /// Field path -> new value.
    pub updated: RawDocumentBuf,
    pub removed: Vec<String>,
    /// (array field path, new length).
    pub truncated: Vec<(String, u32)>,
}

impl UpdateDesc {
    /// The first path of the description that an update operator cannot name
    /// ([`sluice_common::mongo::operator_segment`]: a positional `$`, `$[]`, `$[id]`, or a
    /// field beginning with `$`). MongoDB never describes an update so (it resolves positional
    /// paths first); a wire-compatible server's oplog does. Such an update is published with
    /// its document instead of its description.
    pub fn operator_path(&self) -> Option<&str> {
        let is = |p: &&str| sluice_common::mongo::operator_segment(p).is_some();
        self.updated
            .iter()
            .filter_map(Result::ok)
            .map(|(k, _)| k)
            .find(is)
            .or_else(|| self.removed.iter().map(String::as_str).find(is))
            .or_else(|| self.truncated.iter().map(|(f, _)| f.as_str()).find(is))
    }
}

/// A collection or database command.
#[derive(Debug, Clone, PartialEq)]
pub struct DdlChange {
    /// The contract's kind: create, drop, rename, drop_database, create_indexes, drop_indexes,
    /// other.
    pub kind: &'static str,
    /// The command that repeats it on a target, e.g. `{drop: "c"}`,
    /// `{createIndexes: "c", indexes: [...]}`, `{renameCollection: "db.a", to: "db.b"}`.
    pub command: Document,
    /// For renames: the new database and collection.
    pub to: Option<(String, String)>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Change {
    pub op: OpKind,
    /// The change stream's `operationType` ("insert", "update", "replace", "delete", "drop",
    /// "rename", "dropDatabase", "create", "createIndexes", "dropIndexes", ...).
    pub operation_type: String,
    pub database: String,
    /// Empty for database-level commands (dropDatabase).
    pub collection: String,
    /// `{_id: ...}` (plus the shard key on sharded collections); absent on DDL.
    pub document_key: Option<RawDocumentBuf>,
    pub full_document: Option<RawDocumentBuf>,
    pub before: Option<RawDocumentBuf>,
    pub update: Option<UpdateDesc>,
    /// The oplog time of the change.
    pub ts: Timestamp,
    /// The wall-clock time of the change, milliseconds since the epoch, where known.
    pub wall_millis: Option<i64>,
    pub lsid: Option<RawDocumentBuf>,
    pub txn_number: Option<i64>,
    pub ddl: Option<DdlChange>,
    /// An update whose effect the source did not describe as a change stream would: written
    /// with operators MongoDB itself never logs, or with a path an update cannot name
    /// ([`UpdateDesc::operator_path`]), as only wire-compatible servers log them. The document
    /// must be read.
    pub lookup: bool,
}

impl Change {
    pub(crate) fn new(
        op: OpKind,
        operation_type: &str,
        database: &str,
        collection: &str,
        ts: Timestamp,
    ) -> Self {
        Self {
            op,
            operation_type: operation_type.to_string(),
            database: database.to_string(),
            collection: collection.to_string(),
            document_key: None,
            full_document: None,
            before: None,
            update: None,
            ts,
            wall_millis: None,
            lsid: None,
            txn_number: None,
            ddl: None,
            lookup: false,
        }
    }

    pub(crate) fn ddl(
        kind: &'static str,
        op_type: &str,
        db: &str,
        coll: &str,
        ts: Timestamp,
        command: Document,
    ) -> Self {
        let mut c = Self::new(OpKind::Ddl, op_type, db, coll, ts);
        c.ddl = Some(DdlChange {
            kind,
            command,
            to: None,
        });
        c
    }

    /// The document's `_id`, from its key.
    pub fn id(&self) -> Option<RawBsonRef<'_>> {
        self.document_key.as_ref()?.get("_id").ok().flatten()
    }
}

/// What one change stream event means.
#[derive(Debug, Clone, PartialEq)]
pub enum StreamEvent {
    Change(Box<Change>),
    /// The stream ended (its collection or database was dropped or renamed): reopen it after
    /// this event's token.
    Invalidate,
}

fn get_doc<'a>(d: &'a RawDocument, key: &str) -> Result<Option<&'a RawDocument>, String> {
    doc_field(key, d.get(key).map_err(|e| format!("field {key}: {e}"))?)
}

fn get_str<'a>(d: &'a RawDocument, key: &str) -> Result<&'a str, String> {
    d.get_str(key).map_err(|e| format!("field {key}: {e}"))
}

fn need_id(key: &RawDocument, what: &str) -> Result<(), String> {
    match key.get("_id") {
        Ok(Some(_)) => Ok(()),
        _ => Err(format!("{what}: the document key has no _id")),
    }
}

/// Read a change stream event. `scope` is the (database, collection) the stream was opened on,
/// used where the server leaves `ns` out of an event (some wire-compatible servers do).
pub fn from_change_stream(
    ev: &RawDocument,
    scope: (Option<&str>, Option<&str>),
) -> Result<StreamEvent, String> {
    let op_type = get_str(ev, "operationType")?;
    if op_type == "invalidate" {
        return Ok(StreamEvent::Invalidate);
    }
    let ts = ev
        .get_timestamp("clusterTime")
        .map_err(|e| format!("{op_type} event: clusterTime: {e}"))?;
    let (database, collection) = match get_doc(ev, "ns")? {
        Some(ns) => (
            get_str(ns, "db")?.to_string(),
            ns.get_str("coll").unwrap_or_default().to_string(),
        ),
        None => match scope {
            (Some(db), Some(coll)) => (db.to_string(), coll.to_string()),
            (Some(db), None) if op_type == "dropDatabase" => (db.to_string(), String::new()),
            _ => {
                return Err(format!(
                    "{op_type} event at {ts} has no ns: this server does not say which collection \
                     changed; open the stream on one collection (mongodb.collection) or use \
                     mode = \"oplog\""
                ))
            }
        },
    };
    let at = || format!("{op_type} event of {database}.{collection} at {ts}");
    let op = match op_type {
        "insert" => OpKind::Insert,
        "update" => OpKind::Update,
        "replace" => OpKind::Replace,
        "delete" => OpKind::Delete,
        _ => OpKind::Ddl,
    };
    let mut c = Change::new(op, op_type, &database, &collection, ts);
    c.wall_millis = ev
        .get_datetime("wallTime")
        .ok()
        .map(|d| d.timestamp_millis());
    c.lsid = get_doc(ev, "lsid")?.map(RawDocument::to_raw_document_buf);
    c.txn_number = ev.get_i64("txnNumber").ok();
    if op == OpKind::Ddl {
        let desc = get_doc(ev, "operationDescription")?;
        let (kind, command, to) = match op_type {
            "drop" => ("drop", doc! { "drop": &collection }, None),
            "dropDatabase" => ("drop_database", doc! { "dropDatabase": 1 }, None),
            "rename" => {
                let to = get_doc(ev, "to")?
                    .or(desc.and_then(|d| d.get_document("to").ok()))
                    .ok_or_else(|| format!("{}: no `to`", at()))?;
                let (tdb, tcoll) = (get_str(to, "db")?, get_str(to, "coll")?);
                (
                    "rename",
                    doc! { "renameCollection": format!("{database}.{collection}"),
                    "to": format!("{tdb}.{tcoll}") },
                    Some((tdb.to_string(), tcoll.to_string())),
                )
            }
            "create" => {
                let mut cmd = doc! { "create": &collection };
                if let Some(d) = desc {
                    for (k, v) in raw_to_document(d)? {
                        if k != "idIndex" {
                            cmd.insert(k, v);
                        }
                    }
                }
                ("create", cmd, None)
            }
            "createIndexes" => {
                let indexes = desc
                    .and_then(|d| d.get("indexes").ok().flatten())
                    .ok_or_else(|| format!("{}: no operationDescription.indexes", at()))?;
                let indexes = bson::Bson::try_from(indexes.to_raw_bson())
                    .map_err(|e| format!("{}: {e}", at()))?;
                (
                    "create_indexes",
                    doc! { "createIndexes": &collection, "indexes": indexes },
                    None,
                )
            }
            "dropIndexes" => {
                let names: Vec<String> = desc
                    .and_then(|d| d.get_array("indexes").ok())
                    .map(|a| {
                        a.into_iter()
                            .filter_map(|i| {
                                i.ok()?
                                    .as_document()?
                                    .get_str("name")
                                    .ok()
                                    .map(String::from)
                            })
                            .collect()
                    })
                    .unwrap_or_default();
                (
                    "drop_indexes",
                    doc! { "dropIndexes": &collection, "index": names },
                    None,
                )
            }
            // collMod (6.0+ with expanded events): operationDescription holds its fields.
            "modify" => {
                let mut cmd = doc! { "collMod": &collection };
                if let Some(d) = desc {
                    for (k, v) in raw_to_document(d)? {
                        cmd.insert(k, v);
                    }
                }
                ("modify", cmd, None)
            }
            _ => {
                let mut cmd = doc! { "operationType": op_type };
                if let Some(d) = desc {
                    cmd.insert("operationDescription", raw_to_document(d)?);
                }
                ("other", cmd, None)
            }
        };
        c.ddl = Some(DdlChange { kind, command, to });
        return Ok(StreamEvent::Change(Box::new(c)));
    }
    let key = get_doc(ev, "documentKey")?.ok_or_else(|| format!("{}: no documentKey", at()))?;
    need_id(key, &at()).map_err(|e| {
        format!("{e} (this server's change streams do not follow MongoDB's format; use mode = \"oplog\")")
    })?;
    c.document_key = Some(key.to_raw_document_buf());
    c.full_document = get_doc(ev, "fullDocument")?.map(RawDocument::to_raw_document_buf);
    c.before = get_doc(ev, "fullDocumentBeforeChange")?.map(RawDocument::to_raw_document_buf);
    match op {
        OpKind::Update => {
            let desc = get_doc(ev, "updateDescription")?.ok_or_else(|| {
                format!(
                    "{}: no updateDescription (this server's change streams do not follow \
                     MongoDB's format; use mode = \"oplog\")",
                    at()
                )
            })?;
            let desc = update_description(desc).map_err(|e| format!("{}: {e}", at()))?;
            if desc.operator_path().is_some() {
                // Not MongoDB's own description (it resolves `arr.$` to `arr.3`): the whole
                // document is published instead, the event's own (a post-image, or
                // updateLookup's) or, without one, the document read from the source.
                c.lookup = c.full_document.is_none();
            } else {
                c.update = Some(desc);
            }
        }
        OpKind::Insert | OpKind::Replace if c.full_document.is_none() => {
            return Err(format!("{}: no fullDocument", at()));
        }
        _ => {}
    }
    Ok(StreamEvent::Change(Box::new(c)))
}

/// A field's value as `pick` reads it: absent is `None`, another type an error naming the field.
fn typed<'a, T>(
    name: &str,
    v: Option<RawBsonRef<'a>>,
    expected: &str,
    pick: impl Fn(RawBsonRef<'a>) -> Option<T>,
) -> Result<Option<T>, String> {
    match v {
        None => Ok(None),
        Some(v) => pick(v).map(Some).ok_or_else(|| {
            format!(
                "field {name} is a {:?}, expected {expected}",
                v.element_type()
            )
        }),
    }
}

/// A document field: absent or null is `None`, another type an error.
fn doc_field<'a>(name: &str, v: Option<RawBsonRef<'a>>) -> Result<Option<&'a RawDocument>, String> {
    match v {
        Some(RawBsonRef::Null) => Ok(None),
        v => typed(name, v, "a document", RawBsonRef::as_document),
    }
}

fn raw_to_document(d: &RawDocument) -> Result<Document, String> {
    Document::try_from(d).map_err(|e| e.to_string())
}

fn update_description(d: &RawDocument) -> Result<UpdateDesc, String> {
    let updated = get_doc(d, "updatedFields")?
        .map(RawDocument::to_raw_document_buf)
        .unwrap_or_default();
    let mut removed = Vec::new();
    if let Ok(a) = d.get_array("removedFields") {
        for f in a {
            let f = f.map_err(|e| e.to_string())?;
            removed.push(
                f.as_str()
                    .ok_or("removedFields holds a non-string")?
                    .to_string(),
            );
        }
    }
    let mut truncated = Vec::new();
    if let Ok(a) = d.get_array("truncatedArrays") {
        for t in a {
            let t = t.map_err(|e| e.to_string())?;
            let t = t
                .as_document()
                .ok_or("truncatedArrays holds a non-document")?;
            let size = match t.get("newSize").map_err(|e| e.to_string())? {
                Some(RawBsonRef::Int32(n)) => n as u32,
                Some(RawBsonRef::Int64(n)) => n as u32,
                _ => return Err("truncatedArrays entry without newSize".into()),
            };
            truncated.push((get_str(t, "field")?.to_string(), size));
        }
    }
    Ok(UpdateDesc {
        updated,
        removed,
        truncated,
    })
}

/// The oplog time a resume token stands for, where it can be read: MongoDB's tokens are a
/// hex key string starting with `82` and the timestamp (8 bytes, big endian); mongo-java-server's
/// are the timestamp's 16 hex digits alone.
pub fn token_time(token: &Document) -> Option<Timestamp> {
    let bytes = sluice_common::hex::decode(token.get_str("_data").ok()?).ok()?;
    let ts = match bytes.len() {
        8 => &bytes[..8],
        n if n >= 9 && bytes[0] == 0x82 => &bytes[1..9],
        _ => return None,
    };
    Some(Timestamp {
        time: u32::from_be_bytes(ts[..4].try_into().ok()?),
        increment: u32::from_be_bytes(ts[4..8].try_into().ok()?),
    })
}

#[cfg(test)]
mod tests;
