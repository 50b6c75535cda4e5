//! One MongoDB change, from either source the capture reads: a change stream event or an oplog
//! entry (`local.oplog.rs`). Both become the same [`Change`], so the events on Kafka do not depend
//! on the mode.
//!
//! Documents stay raw BSON throughout: nothing is decoded into a tree and re-encoded, so every
//! BSON type (Decimal128, MinKey, JavaScript with scope, regular expressions, ...) travels byte
//! for byte.

use mongodb::bson::raw::{RawBsonRef, RawDocument, RawDocumentBuf};
use mongodb::bson::{self, doc, Document, Timestamp};

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
    /// An oplog update written with operators MongoDB itself never logs (only wire-compatible
    /// servers do): its effect is unknown, the document must be read.
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
            c.update = Some(update_description(desc).map_err(|e| format!("{}: {e}", at()))?);
        }
        OpKind::Insert | OpKind::Replace if c.full_document.is_none() => {
            return Err(format!("{}: no fullDocument", at()));
        }
        _ => {}
    }
    Ok(StreamEvent::Change(Box::new(c)))
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

/// What one oplog entry holds.
#[derive(Debug, Clone, PartialEq)]
pub struct OplogEntry {
    pub ts: Timestamp,
    /// In oplog order; several for a transaction (`applyOps`).
    pub changes: Vec<Change>,
    /// Part of a transaction whose commit comes in a later entry (`partialTxn`): hold the
    /// changes until then.
    pub partial: bool,
}

/// Read an oplog entry.
pub fn from_oplog(entry: &RawDocument) -> Result<OplogEntry, String> {
    let f = Fields::read(entry).map_err(|e| format!("oplog entry: {e}"))?;
    let ts = typed("ts", f.ts, "a timestamp", RawBsonRef::as_timestamp)
        .map_err(|e| format!("oplog entry: {e}"))?
        .ok_or("oplog entry: no ts")?;
    let wall = match f.wall {
        Some(RawBsonRef::DateTime(d)) => Some(d.timestamp_millis()),
        _ => None,
    };
    let at = |what: &str| format!("oplog entry at {ts}: {what}");
    let lsid = doc_field("lsid", f.lsid)
        .map_err(|e| at(&e))?
        .map(RawDocument::to_raw_document_buf);
    let txn = match f.txn_number {
        Some(RawBsonRef::Int64(n)) => Some(n),
        _ => None,
    };
    let mut out = OplogEntry {
        ts,
        changes: Vec::new(),
        partial: false,
    };
    op_of(entry, &f, ts, &mut out, 0).map_err(|e| at(&e))?;
    for c in &mut out.changes {
        c.wall_millis = wall;
        c.lsid = lsid.clone();
        c.txn_number = txn;
    }
    Ok(out)
}

fn split_ns(ns: &str) -> (&str, &str) {
    ns.split_once('.').unwrap_or((ns, ""))
}

/// The fields of an oplog entry (or of an operation inside `applyOps`) the capture reads, found
/// in one pass over it: looking each one up walks the entry from its start again. As with a
/// lookup, the first of a repeated name counts.
#[derive(Default)]
struct Fields<'a> {
    ts: Option<RawBsonRef<'a>>,
    wall: Option<RawBsonRef<'a>>,
    lsid: Option<RawBsonRef<'a>>,
    txn_number: Option<RawBsonRef<'a>>,
    op: Option<RawBsonRef<'a>>,
    ns: Option<RawBsonRef<'a>>,
    o: Option<RawBsonRef<'a>>,
    o2: Option<RawBsonRef<'a>>,
}

impl<'a> Fields<'a> {
    fn read(e: &'a RawDocument) -> Result<Self, String> {
        let mut f = Fields::default();
        for el in e {
            let (name, value) = el.map_err(|e| e.to_string())?;
            let slot = match name {
                "ts" => &mut f.ts,
                "wall" => &mut f.wall,
                "lsid" => &mut f.lsid,
                "txnNumber" => &mut f.txn_number,
                "op" => &mut f.op,
                "ns" => &mut f.ns,
                "o" => &mut f.o,
                "o2" => &mut f.o2,
                _ => continue,
            };
            slot.get_or_insert(value);
        }
        Ok(f)
    }
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

fn oplog_op(e: &RawDocument, ts: Timestamp, out: &mut OplogEntry, depth: u8) -> Result<(), String> {
    let f = Fields::read(e)?;
    op_of(e, &f, ts, out, depth)
}

fn op_of(
    e: &RawDocument,
    f: &Fields<'_>,
    ts: Timestamp,
    out: &mut OplogEntry,
    depth: u8,
) -> Result<(), String> {
    let op = typed("op", f.op, "a string", RawBsonRef::as_str)?.ok_or("field op: missing")?;
    let ns = match f.ns {
        Some(RawBsonRef::String(ns)) => ns,
        _ => "",
    };
    let (db, coll) = split_ns(ns);
    let o = || doc_field("o", f.o)?.ok_or_else(|| format!("op {op:?} without o"));
    match op {
        "n" => Ok(()), // no-op (heartbeat): advances the position only
        "i" => {
            let doc = o()?;
            need_id(doc, "insert")?;
            let mut c = Change::new(OpKind::Insert, "insert", db, coll, ts);
            c.document_key = Some(match doc_field("o2", f.o2)? {
                Some(k) => k.to_raw_document_buf(),
                None => id_key(doc)?,
            });
            c.full_document = Some(doc.to_raw_document_buf());
            out.changes.push(c);
            Ok(())
        }
        "d" => {
            let key = o()?;
            need_id(key, "delete")?;
            let mut c = Change::new(OpKind::Delete, "delete", db, coll, ts);
            c.document_key = Some(key.to_raw_document_buf());
            out.changes.push(c);
            Ok(())
        }
        "u" => {
            let key = doc_field("o2", f.o2)?.ok_or("update without o2 (the document key)")?;
            need_id(key, "update")?;
            let spec = o()?;
            let mut c = Change::new(OpKind::Update, "update", db, coll, ts);
            c.document_key = Some(key.to_raw_document_buf());
            match update_form(spec)? {
                UpdateForm::Replacement => {
                    c.op = OpKind::Replace;
                    c.operation_type = "replace".into();
                    c.full_document = Some(spec.to_raw_document_buf());
                }
                UpdateForm::Described(d) => c.update = Some(d),
                UpdateForm::Unknown => c.lookup = true,
            }
            out.changes.push(c);
            Ok(())
        }
        "c" => command(e, ts, db, out, depth),
        other => Err(format!("unknown op {other:?}")),
    }
}

fn id_key(doc: &RawDocument) -> Result<RawDocumentBuf, String> {
    let id = doc.get("_id").map_err(|e| e.to_string())?.ok_or("no _id")?;
    let mut k = RawDocumentBuf::new();
    k.append_ref("_id", id);
    Ok(k)
}

fn command(
    e: &RawDocument,
    ts: Timestamp,
    db: &str,
    out: &mut OplogEntry,
    depth: u8,
) -> Result<(), String> {
    let o = get_doc(e, "o")?.ok_or("command without o")?;
    let (name, value) = o
        .iter()
        .next()
        .ok_or("empty command")?
        .map_err(|e| e.to_string())?;
    let coll = value.as_str().unwrap_or_default();
    let mut push = |c: Change| out.changes.push(c);
    match name {
        "applyOps" => {
            if depth > 0 {
                return Err("nested applyOps".into());
            }
            let ops = o
                .get_array("applyOps")
                .map_err(|e| format!("applyOps: {e}"))?;
            for op in ops {
                let op = op.map_err(|e| e.to_string())?;
                let op = op.as_document().ok_or("applyOps holds a non-document")?;
                oplog_op(op, ts, out, depth + 1)?;
            }
            out.partial = matches!(o.get("partialTxn"), Ok(Some(RawBsonRef::Boolean(true))));
        }
        "create" => {
            let mut cmd = raw_to_document(o)?;
            cmd.remove("idIndex");
            push(Change::ddl("create", "create", db, coll, ts, cmd));
        }
        "drop" => push(Change::ddl(
            "drop",
            "drop",
            db,
            coll,
            ts,
            doc! { "drop": coll },
        )),
        "dropDatabase" => push(Change::ddl(
            "drop_database",
            "dropDatabase",
            db,
            "",
            ts,
            doc! { "dropDatabase": 1 },
        )),
        "renameCollection" => {
            let from = coll;
            let to = o
                .get_str("to")
                .map_err(|e| format!("renameCollection: to: {e}"))?;
            let (fdb, fcoll) = split_ns(from);
            let (tdb, tcoll) = split_ns(to);
            let mut c = Change::ddl(
                "rename",
                "rename",
                fdb,
                fcoll,
                ts,
                doc! { "renameCollection": from, "to": to },
            );
            if let Some(d) = c.ddl.as_mut() {
                d.to = Some((tdb.to_string(), tcoll.to_string()));
            }
            push(c);
        }
        "createIndexes" => {
            // One index per entry: {createIndexes: coll, v, key, name, ...}.
            let mut spec = raw_to_document(o)?;
            spec.remove("createIndexes");
            push(Change::ddl(
                "create_indexes",
                "createIndexes",
                db,
                coll,
                ts,
                doc! { "createIndexes": coll, "indexes": [spec] },
            ));
        }
        "commitIndexBuild" => {
            // Two-phase index builds (4.4+): the indexes exist once this entry is written.
            let indexes = o
                .get("indexes")
                .map_err(|e| e.to_string())?
                .ok_or("commitIndexBuild without indexes")?;
            let indexes = bson::Bson::try_from(indexes.to_raw_bson()).map_err(|e| e.to_string())?;
            push(Change::ddl(
                "create_indexes",
                "createIndexes",
                db,
                coll,
                ts,
                doc! { "createIndexes": coll, "indexes": indexes },
            ));
        }
        "dropIndexes" | "deleteIndexes" => {
            let index = match o.get("index").map_err(|e| e.to_string())? {
                Some(RawBsonRef::String(s)) => bson::Bson::String(s.to_string()),
                Some(other) => {
                    bson::Bson::try_from(other.to_raw_bson()).map_err(|e| e.to_string())?
                }
                None => bson::Bson::String("*".into()),
            };
            push(Change::ddl(
                "drop_indexes",
                "dropIndexes",
                db,
                coll,
                ts,
                doc! { "dropIndexes": coll, "index": index },
            ));
        }
        // Transaction control and index build bookkeeping carry no change of their own.
        "commitTransaction" | "abortTransaction" | "startIndexBuild" | "abortIndexBuild" => {}
        other => {
            let mut c = Change::ddl("other", other, db, coll, ts, raw_to_document(o)?);
            c.collection = coll.to_string();
            push(c);
        }
    }
    Ok(())
}

enum UpdateForm {
    Replacement,
    Described(UpdateDesc),
    Unknown,
}

/// How an oplog update's `o` reads: a replacement document, MongoDB's `$v: 2` diff, the older
/// `$set`/`$unset` form, or operators only other servers write.
fn update_form(spec: &RawDocument) -> Result<UpdateForm, String> {
    let mut keys = Vec::new();
    for el in spec {
        let (k, _) = el.map_err(|e| e.to_string())?;
        keys.push(k);
    }
    if !keys.iter().any(|k| k.starts_with('$')) {
        return Ok(UpdateForm::Replacement);
    }
    if let Ok(diff) = spec.get_document("diff") {
        let mut d = UpdateDesc::default();
        object_diff(diff, "", &mut d)?;
        return Ok(UpdateForm::Described(d));
    }
    if keys.iter().all(|k| matches!(*k, "$v" | "$set" | "$unset")) {
        let mut d = UpdateDesc::default();
        if let Some(set) = get_doc(spec, "$set")? {
            d.updated = set.to_raw_document_buf();
        }
        if let Some(unset) = get_doc(spec, "$unset")? {
            for el in unset {
                d.removed.push(el.map_err(|e| e.to_string())?.0.to_string());
            }
        }
        return Ok(UpdateForm::Described(d));
    }
    Ok(UpdateForm::Unknown)
}

fn join(prefix: &str, field: &str) -> String {
    if prefix.is_empty() {
        field.to_string()
    } else {
        format!("{prefix}.{field}")
    }
}

/// MongoDB 5.0+ oplog update diff (`$v: 2`) of a document: `d` deleted fields, `u` updated,
/// `i` inserted, `s<field>` a nested document's or array's own diff.
fn object_diff(diff: &RawDocument, prefix: &str, out: &mut UpdateDesc) -> Result<(), String> {
    for el in diff {
        let (k, v) = el.map_err(|e| e.to_string())?;
        match k {
            "d" => {
                let d = v.as_document().ok_or("diff: d is not a document")?;
                for f in d {
                    out.removed
                        .push(join(prefix, f.map_err(|e| e.to_string())?.0));
                }
            }
            "u" | "i" => {
                let d = v.as_document().ok_or("diff: u/i is not a document")?;
                for f in d {
                    let (name, value) = f.map_err(|e| e.to_string())?;
                    out.updated.append_ref(join(prefix, name), value);
                }
            }
            _ if k.starts_with('s') => sub_diff(v, &join(prefix, &k[1..]), out)?,
            _ => return Err(format!("diff: unknown field {k:?}")),
        }
    }
    Ok(())
}

/// The diff of a nested document or array (`a: true` marks an array).
fn sub_diff(v: RawBsonRef<'_>, path: &str, out: &mut UpdateDesc) -> Result<(), String> {
    let sub = v
        .as_document()
        .ok_or("diff: a sub-diff is not a document")?;
    if matches!(sub.get("a"), Ok(Some(RawBsonRef::Boolean(true)))) {
        array_diff(sub, path, out)
    } else {
        object_diff(sub, path, out)
    }
}

/// An array's diff: `a: true`, `l` the new length (a truncation), `u<i>` a new element value,
/// `s<i>` an element's own diff.
fn array_diff(diff: &RawDocument, path: &str, out: &mut UpdateDesc) -> Result<(), String> {
    for el in diff {
        let (k, v) = el.map_err(|e| e.to_string())?;
        match k {
            "a" => {}
            "l" => {
                let n = match v {
                    RawBsonRef::Int32(n) => n as u32,
                    RawBsonRef::Int64(n) => n as u32,
                    _ => return Err("diff: array length is not an integer".into()),
                };
                out.truncated.push((path.to_string(), n));
            }
            _ if k.starts_with('u') => {
                out.updated.append_ref(join(path, &k[1..]), v);
            }
            _ if k.starts_with('s') => sub_diff(v, &join(path, &k[1..]), out)?,
            _ => return Err(format!("diff: unknown array field {k:?}")),
        }
    }
    Ok(())
}

/// The oplog time a resume token stands for, where it can be read: MongoDB's tokens are a
/// hex key string starting with `82` and the timestamp (8 bytes, big endian); mongo-java-server's
/// are the timestamp's 16 hex digits alone.
pub fn token_time(token: &Document) -> Option<Timestamp> {
    let hex = token.get_str("_data").ok()?;
    let bytes: Vec<u8> = (0..hex.len() / 2)
        .map(|i| u8::from_str_radix(hex.get(2 * i..2 * i + 2)?, 16).ok())
        .collect::<Option<_>>()?;
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
