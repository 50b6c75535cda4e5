//! Oplog entries (`local.oplog.rs`) to [`Change`]s: what `mode = "oplog"` reads.
//!
//! An entry is one operation (`op` `i`, `u`, `d`, `c`, `n`) or, for a transaction, an
//! `applyOps` command holding several; a transaction too large for one entry is split over
//! several with `partialTxn: true`, the last without it ([`OplogEntry::partial`]: the reader
//! holds them until then). A prepared transaction's `applyOps` (`prepare: true`) counts only at
//! its `commitTransaction` and is dropped at `abortTransaction` ([`OplogEntry::prepared`]). Updates come in three forms ([`UpdateForm`]): a replacement
//! document, MongoDB 5.0+'s `$v: 2` diff and 4.x's `$set`/`$unset`, all described as a change
//! stream would; other operators, and positional paths (`arr.$`, `arr.$[e]`: only
//! wire-compatible servers log them) leave the effect unknown, and the reader looks the document
//! up. Commands become DDL changes of the same kinds
//! as the change stream's; two-phase index builds count at `commitIndexBuild`.
//!
//! Each entry is read in one pass over its fields ([`Fields`]), not one lookup per field.

use mongodb::bson::raw::{RawBsonRef, RawDocument, RawDocumentBuf};
use mongodb::bson::{self, doc, Timestamp};

use super::{doc_field, get_doc, need_id, raw_to_document, typed, Change, OpKind, UpdateDesc};

/// What one oplog entry holds.
#[derive(Debug, Clone, PartialEq)]
pub struct OplogEntry {
    pub ts: Timestamp,
    /// In oplog order; several for a transaction (`applyOps`).
    pub changes: Vec<Change>,
    /// Part of a transaction whose commit comes in a later entry (`partialTxn`): hold the
    /// changes until then.
    pub partial: bool,
    /// A prepared transaction (`applyOps` with `prepare: true`, a sharded cluster's
    /// distributed transaction): its changes (with those of the `partialTxn` entries before
    /// it) happen only if a later `commitTransaction` of the same session and transaction
    /// number commits it, and not at all if `abortTransaction` ends it.
    pub prepared: bool,
    /// `commitTransaction` (true) or `abortTransaction` (false) of a prepared transaction.
    pub ends_prepared: Option<bool>,
    /// The session and transaction number of the entry, if any (which prepared transaction a
    /// commit or abort ends).
    pub lsid: Option<RawDocumentBuf>,
    pub txn_number: Option<i64>,
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
        prepared: false,
        ends_prepared: None,
        lsid: lsid.clone(),
        txn_number: txn,
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
    from_migrate: Option<RawBsonRef<'a>>,
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
                "fromMigrate" => &mut f.from_migrate,
                _ => continue,
            };
            slot.get_or_insert(value);
        }
        Ok(f)
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
    // A shard's side of a chunk migration (the recipient's copies, the donor's range deletes,
    // the collection made for them): the documents move between shards, and in the cluster
    // nothing changed. Published, they would be inserts of documents that exist already and
    // deletes of documents that still exist.
    if matches!(f.from_migrate, Some(RawBsonRef::Boolean(true))) {
        return Ok(());
    }
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
            out.prepared = matches!(o.get("prepare"), Ok(Some(RawBsonRef::Boolean(true))));
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
        // {collMod: coll, validator: ..., index: {name, expireAfterSeconds, hidden}, ...}
        "collMod" => push(Change::ddl(
            "modify",
            "modify",
            db,
            coll,
            ts,
            raw_to_document(o)?,
        )),
        // The end of a prepared transaction: its changes count from here, or not at all.
        "commitTransaction" => out.ends_prepared = Some(true),
        "abortTransaction" => out.ends_prepared = Some(false),
        // Index build bookkeeping carries no change of its own.
        "startIndexBuild" | "abortIndexBuild" => {}
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
/// `$set`/`$unset` form, or what only other servers write (other operators, positional
/// paths).
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
        return Ok(described(d));
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
        return Ok(described(d));
    }
    Ok(UpdateForm::Unknown)
}

/// A description whose paths a target can write as they are. One with a positional path
/// (`arr.$`, `arr.$[]`, `arr.$[e]`: a wire-compatible server logs the client's update as
/// written, where MongoDB logs `arr.3`) or a `$`-prefixed field cannot be: which elements it
/// changed is not in the entry, so the document is read instead.
fn described(d: UpdateDesc) -> UpdateForm {
    if d.operator_path().is_some() {
        UpdateForm::Unknown
    } else {
        UpdateForm::Described(d)
    }
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

#[cfg(test)]
mod tests;
