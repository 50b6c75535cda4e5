//! From change events to MongoDB write commands, without I/O (so every rule is unit-tested).
//!
//! - insert, replace, snapshot read, and an update carrying the full document: replace by the
//!   document key, inserting when missing (upsert);
//! - update with a description: the truncated arrays first (`$push` with an empty `$each` and
//!   `$slice`), then `$set` of the updated fields and `$unset` of the removed ones; no upsert (a
//!   document the target does not have is not invented from a partial update);
//! - delete: by the document key.
//!
//! Writes of one key keep their order: a batch is cut into rounds where each key appears at most
//! once, and the rounds run one after the other; within a round the writes go unordered
//! (`ordered: false`), so different keys never wait on each other. Every write is idempotent,
//! so a batch written again after a failure ends in the same state.

use std::collections::HashMap;

use mongodb::bson::raw::{RawArrayBuf, RawBson, RawDocument, RawDocumentBuf};
use mongodb::bson::{Bson, Document};
use sluice_proto::v1::Op;
use sluice_proto::ChangeEvent;

/// One write to one document.
#[derive(Debug, Clone, PartialEq)]
pub enum Write {
    Replace {
        key: RawDocumentBuf,
        doc: RawDocumentBuf,
    },
    Update {
        key: RawDocumentBuf,
        update: RawDocumentBuf,
    },
    Delete {
        key: RawDocumentBuf,
    },
}

impl Write {
    pub fn key(&self) -> &RawDocumentBuf {
        match self {
            Write::Replace { key, .. } | Write::Update { key, .. } | Write::Delete { key } => key,
        }
    }

    /// BSON bytes this write adds to a command.
    pub fn size(&self) -> usize {
        match self {
            Write::Replace { key, doc } => key.as_bytes().len() + doc.as_bytes().len() + 32,
            Write::Update { key, update } => key.as_bytes().len() + update.as_bytes().len() + 32,
            Write::Delete { key } => key.as_bytes().len() + 16,
        }
    }
}

fn raw(bytes: &[u8], what: &str) -> Result<RawDocumentBuf, String> {
    let d = RawDocument::from_bytes(bytes).map_err(|e| format!("{what} is not BSON: {e}"))?;
    Ok(d.to_raw_document_buf())
}

/// The writes that repeat a row event on the target (none for an update that carries nothing
/// to apply).
pub fn writes_of(event: &ChangeEvent) -> Result<Vec<Write>, String> {
    let m = event
        .mongo
        .as_ref()
        .ok_or("not a MongoDB event (no mongo part)")?;
    if m.document_key.is_empty() {
        return Err("no document key".into());
    }
    let key = raw(&m.document_key, "the document key")?;
    if key.get("_id").ok().flatten().is_none() {
        return Err("the document key has no _id".into());
    }
    let full = (!m.full_document.is_empty())
        .then(|| raw(&m.full_document, "the full document"))
        .transpose()?;
    match event.op() {
        Op::Insert | Op::SnapshotRead => Ok(vec![Write::Replace {
            key,
            doc: full.ok_or("insert without its document")?,
        }]),
        Op::Delete => Ok(vec![Write::Delete { key }]),
        Op::Update => {
            if m.operation_type == "replace" {
                return Ok(vec![Write::Replace {
                    key,
                    doc: full.ok_or("replace without its document")?,
                }]);
            }
            if let Some(desc) = &m.update_description {
                return update_writes(key, desc);
            }
            Ok(full
                .map(|doc| Write::Replace { key, doc })
                .into_iter()
                .collect())
        }
        other => Err(format!("{other:?} is not a row event")),
    }
}

fn update_writes(
    key: RawDocumentBuf,
    desc: &sluice_proto::v1::UpdateDescription,
) -> Result<Vec<Write>, String> {
    let mut out = Vec::new();
    if !desc.truncated_arrays.is_empty() {
        let mut push = RawDocumentBuf::new();
        for t in &desc.truncated_arrays {
            let mut spec = RawDocumentBuf::new();
            spec.append("$each", RawArrayBuf::new());
            spec.append("$slice", i64::from(t.new_size));
            push.append(&t.field, spec);
        }
        let mut update = RawDocumentBuf::new();
        update.append("$push", push);
        out.push(Write::Update {
            key: key.clone(),
            update,
        });
    }
    let set = raw(
        if desc.updated_fields.is_empty() {
            &[5, 0, 0, 0, 0]
        } else {
            &desc.updated_fields
        },
        "updatedFields",
    )?;
    let mut update = RawDocumentBuf::new();
    if !set.is_empty() {
        update.append("$set", set);
    }
    if !desc.removed_fields.is_empty() {
        let mut unset = RawDocumentBuf::new();
        for f in &desc.removed_fields {
            unset.append(f, "");
        }
        update.append("$unset", unset);
    }
    if !update.is_empty() {
        out.push(Write::Update { key, update });
    }
    Ok(out)
}

/// Cut `keys` (one per write, in event order) into rounds: round `i` holds the `i`-th write of
/// every key. Returns, per round, indexes into `keys`.
pub fn rounds<K: std::hash::Hash + Eq>(keys: &[K]) -> Vec<Vec<usize>> {
    let mut seen: HashMap<&K, usize> = HashMap::with_capacity(keys.len());
    let mut out: Vec<Vec<usize>> = Vec::new();
    for (i, k) in keys.iter().enumerate() {
        let n = seen.entry(k).or_insert(0);
        if out.len() <= *n {
            out.push(Vec::new());
        }
        out[*n].push(i);
        *n += 1;
    }
    out
}

/// Statements per command, at most (MongoDB allows 100 000).
pub const MAX_STATEMENTS: usize = 10_000;
/// Command size, at most (MongoDB allows 16 MiB plus a little).
pub const MAX_COMMAND_BYTES: usize = 12 << 20;

/// An `update` or `delete` command for `collection` and the indexes (into the given writes) of
/// its statements, in statement order.
pub struct Command {
    pub body: RawDocumentBuf,
    pub statements: Vec<usize>,
}

/// The commands that carry `writes` (all to one collection, at most one per key): updates and
/// replacements in `update` commands, deletes in `delete` commands, each cut to size.
pub fn commands(
    collection: &str,
    writes: &[(usize, &Write)],
    write_concern: &Document,
) -> Vec<Command> {
    let wc = RawDocumentBuf::from_document(write_concern).expect("write concern encodes");
    let mut out = Vec::new();
    for deletes in [false, true] {
        let mut stmts = RawArrayBuf::new();
        let mut idx = Vec::new();
        let mut bytes = 0;
        let flush = |stmts: &mut RawArrayBuf,
                     idx: &mut Vec<usize>,
                     bytes: &mut usize,
                     out: &mut Vec<Command>| {
            if idx.is_empty() {
                return;
            }
            let mut body = RawDocumentBuf::new();
            body.append(if deletes { "delete" } else { "update" }, collection);
            body.append(
                if deletes { "deletes" } else { "updates" },
                std::mem::take(stmts),
            );
            body.append("ordered", false);
            body.append("writeConcern", wc.clone());
            out.push(Command {
                body,
                statements: std::mem::take(idx),
            });
            *bytes = 0;
        };
        for (i, w) in writes {
            let stmt = match (w, deletes) {
                (Write::Delete { key }, true) => {
                    let mut s = RawDocumentBuf::new();
                    s.append("q", key.clone());
                    s.append("limit", 1i32);
                    s
                }
                (Write::Replace { key, doc }, false) => {
                    let mut s = RawDocumentBuf::new();
                    s.append("q", key.clone());
                    s.append("u", doc.clone());
                    s.append("upsert", true);
                    s
                }
                (Write::Update { key, update }, false) => {
                    let mut s = RawDocumentBuf::new();
                    s.append("q", key.clone());
                    s.append("u", update.clone());
                    s
                }
                _ => continue,
            };
            if !idx.is_empty()
                && (idx.len() >= MAX_STATEMENTS || bytes + w.size() > MAX_COMMAND_BYTES)
            {
                flush(&mut stmts, &mut idx, &mut bytes, &mut out);
            }
            bytes += w.size();
            stmts.push(RawBson::Document(stmt));
            idx.push(*i);
        }
        flush(&mut stmts, &mut idx, &mut bytes, &mut out);
    }
    out
}

/// A statement the server refused: its index in the command, code and message.
#[derive(Debug, Clone, PartialEq)]
pub struct StatementError {
    pub index: usize,
    pub code: i32,
    pub message: String,
}

/// Server codes that say "try again later", not "this write is wrong".
pub fn transient_code(code: i32) -> bool {
    matches!(
        code,
        6 | 7 | 50 | 89 | 91 | 112 | 189 | 262 | 9001 | 10107 | 11600 | 11602 | 13435 | 13436
    )
}

/// Read a write command's reply: per-statement errors, or the error of the whole command.
pub fn reply_errors(reply: &Document) -> Result<Vec<StatementError>, String> {
    if let Ok(wce) = reply.get_document("writeConcernError") {
        return Err(format!(
            "write concern not satisfied: {} (code {})",
            wce.get_str("errmsg").unwrap_or("?"),
            wce.get_i32("code").unwrap_or(0)
        ));
    }
    let mut out = Vec::new();
    if let Ok(errs) = reply.get_array("writeErrors") {
        for e in errs {
            let Bson::Document(e) = e else { continue };
            out.push(StatementError {
                index: e.get_i32("index").unwrap_or(0) as usize,
                code: e.get_i32("code").unwrap_or(0),
                message: e.get_str("errmsg").unwrap_or("?").to_string(),
            });
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests;
