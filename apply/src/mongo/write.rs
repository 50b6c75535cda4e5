//! From change events to MongoDB write commands, without I/O (so every rule is unit-tested).
//!
//! - insert and snapshot read: insert; where the target already holds the key (a replay, or a
//!   copy that outlived a delete), the insert is refused as a duplicate and written again as a
//!   replacement (see [`Write::as_replacement`]). Inserting first spares the server the lookup
//!   of an upsert and the reply its list of upserted ids;
//! - replace, and an update carrying the full document: replace by the document key, inserting
//!   when missing (upsert);
//! - update with a description: the truncated arrays first (`$push` with an empty `$each` and
//!   `$slice`), then `$set` of the updated fields and `$unset` of the removed ones; no upsert (a
//!   document the target does not have is not invented from a partial update). A description
//!   with a path no update can name (`arr.$`, `arr.$[e]`: never MongoDB's own) is replaced by
//!   the event's full document, or, without one, refused (its collection stops);
//! - delete: by the document key.
//!
//! Writes of one key keep their order: a batch is cut into rounds where each key appears at most
//! once, and the rounds run one after the other; within a round the writes go unordered
//! (`ordered: false`), so different keys never wait on each other. Every write is idempotent,
//! so a batch written again after a failure ends in the same state.

use std::collections::HashMap;

use mongodb::bson::raw::{RawArrayBuf, RawDocumentBuf};
use mongodb::bson::{Bson, Document};
use prost::Message as _;
use sluice_common::mongo::transient_code;
use sluice_proto::v1::{Op, UpdateDescription};
use sluice_proto::view::{MongoChangeRef, RowEvent};

use crate::error::{ApplyError, Origin};

/// One write to one document.
#[derive(Debug, Clone, PartialEq)]
pub enum Write {
    Insert {
        key: RawDocumentBuf,
        doc: RawDocumentBuf,
    },
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
            Write::Insert { key, .. }
            | Write::Replace { key, .. }
            | Write::Update { key, .. }
            | Write::Delete { key } => key,
        }
    }

    /// BSON bytes this write adds to a command.
    pub fn size(&self) -> usize {
        match self {
            Write::Insert { doc, .. } => doc.as_bytes().len() + 8,
            Write::Replace { key, doc } => key.as_bytes().len() + doc.as_bytes().len() + 32,
            Write::Update { key, update } => key.as_bytes().len() + update.as_bytes().len() + 32,
            Write::Delete { key } => key.as_bytes().len() + 16,
        }
    }

    /// An insert refused because the target holds its key, as the replacement (upsert) that
    /// leaves the inserted document there. `None` for other writes.
    pub fn as_replacement(&self) -> Option<Write> {
        match self {
            Write::Insert { key, doc } => Some(Write::Replace {
                key: key.clone(),
                doc: doc.clone(),
            }),
            _ => None,
        }
    }

    /// The `kind` label of the writes metric.
    pub fn kind(&self) -> &'static str {
        match self {
            Write::Insert { .. } => "insert",
            Write::Replace { .. } => "replace",
            Write::Update { .. } => "update",
            Write::Delete { .. } => "delete",
        }
    }
}

/// The document in `bytes`, taken (not copied) once its framing is checked.
fn raw(bytes: &[u8], what: &str) -> Result<RawDocumentBuf, String> {
    RawDocumentBuf::from_bytes(bytes.to_vec()).map_err(|e| format!("{what} is not BSON: {e}"))
}

/// The writes that repeat a row event on the target (none for an update that carries nothing
/// to apply). The event is read where it lies (`sluice_proto::view`): its documents are copied
/// once, into the writes; the fields writing does not need are not decoded.
pub fn writes_of(event: &RowEvent<'_>) -> Result<Vec<Write>, String> {
    let op = event.op();
    let m = MongoChangeRef::parse(event.mongo.ok_or("not a MongoDB event (no mongo part)")?)
        .map_err(|e| format!("the MongoDB change: {e}"))?;
    if m.document_key.is_empty() {
        return Err("no document key".into());
    }
    let key = raw(m.document_key, "the document key")?;
    if key.get("_id").ok().flatten().is_none() {
        return Err("the document key has no _id".into());
    }
    let full = (!m.full_document.is_empty())
        .then(|| raw(m.full_document, "the full document"))
        .transpose()?;
    match op {
        Op::Insert | Op::SnapshotRead => {
            let doc = full.ok_or("insert without its document")?;
            // An insert takes its `_id` from the document. One without it, or with another,
            // goes as the replacement by the key that it always was (the server then keeps the
            // key's `_id` or refuses the document), never inserted under an `_id` of its own.
            let same_id = matches!(
                (doc.get("_id"), key.get("_id")),
                (Ok(Some(a)), Ok(Some(b))) if a == b
            );
            Ok(vec![if same_id {
                Write::Insert { key, doc }
            } else {
                Write::Replace { key, doc }
            }])
        }
        Op::Delete => Ok(vec![Write::Delete { key }]),
        Op::Update => {
            if m.operation_type == "replace" {
                return Ok(vec![Write::Replace {
                    key,
                    doc: full.ok_or("replace without its document")?,
                }]);
            }
            if let Some(desc) = m.update_description {
                let desc = UpdateDescription::decode(desc)
                    .map_err(|e| format!("the update description: {e}"))?;
                if let Some((what, path)) = operator_path(&desc) {
                    // Not writable as described (see `operator_path`): the document the event
                    // carries, or the collection stops rather than keep the old values.
                    return match full {
                        Some(doc) => Ok(vec![Write::Replace { key, doc }]),
                        None => Err(format!(
                            "an update that {what} the path {path:?}, which names no field \
                             (a positional operator, or a field beginning with `$`), and carries \
                             no full document: which elements it changed is not known. MongoDB \
                             resolves such paths (arr.$ to arr.3) before its oplog and change \
                             streams; this event came from a server that logs updates as \
                             written, through a capture that published them so. Remedy: run a \
                             capture-mongo that publishes the document of such an update (this \
                             version's, which reads it) and copy the collection again \
                             (snapshot.tables, snapshot.request_id)"
                        )),
                    };
                }
                return update_writes(key, &desc);
            }
            Ok(full
                .map(|doc| Write::Replace { key, doc })
                .into_iter()
                .collect())
        }
        other => Err(format!("{other:?} is not a row event")),
    }
}

/// The first path of an update description that an update operator cannot name as written
/// ([`sluice_common::mongo::operator_segment`]: `arr.$`, `arr.$[]`, `arr.$[e]`, `a.$price`), with
/// what the description does there. `$set` with `arr.$` and only the key as the query is
/// refused by the server; `arr.$[e]` comes without its `arrayFilters`; `arr.$[]` would write
/// every element the target has. None comes from MongoDB itself, which describes the elements
/// it changed (`arr.3`).
fn operator_path(desc: &UpdateDescription) -> Option<(&'static str, String)> {
    use sluice_common::mongo::operator_segment;
    if let Ok(set) = mongodb::bson::raw::RawDocument::from_bytes(&desc.updated_fields) {
        for (name, _) in set.iter().filter_map(Result::ok) {
            if operator_segment(name).is_some() {
                return Some(("sets", name.to_string()));
            }
        }
    }
    if let Some(f) = desc
        .removed_fields
        .iter()
        .find(|f| operator_segment(f).is_some())
    {
        return Some(("removes", f.clone()));
    }
    desc.truncated_arrays
        .iter()
        .find(|t| operator_segment(&t.field).is_some())
        .map(|t| ("truncates", t.field.clone()))
}

fn update_writes(key: RawDocumentBuf, desc: &UpdateDescription) -> Result<Vec<Write>, String> {
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
    let set = if desc.updated_fields.is_empty() {
        RawDocumentBuf::new()
    } else {
        raw(&desc.updated_fields, "updatedFields")?
    };
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

/// An `insert`, `update` or `delete` command and the positions (in the writes given to
/// [`commands`]) of its statements, in statement order.
pub struct Command {
    pub body: RawDocumentBuf,
    pub statements: Vec<usize>,
}

/// The commands that carry `writes` (all to one collection, at most one per key): inserts in
/// `insert` commands, updates and replacements in `update` commands, deletes in `delete`
/// commands, each cut to size.
///
/// The BSON is written straight into each command's buffer: every key and document is copied
/// once, where building `RawDocumentBuf`s statement by statement copied each three more times.
///
/// With `bypass_validation`, inserts and updates carry `bypassDocumentValidation: true`: a
/// validator on the target (copied from the source, or its own) never refuses a document the
/// source took.
pub fn commands<'w>(
    collection: &str,
    writes: impl Iterator<Item = &'w Write> + Clone,
    write_concern: &Document,
    bypass_validation: bool,
) -> Vec<Command> {
    let wc = RawDocumentBuf::from_document(write_concern).expect("write concern encodes");
    let mut out = Vec::new();
    for kind in [
        CommandKind::Insert,
        CommandKind::Update,
        CommandKind::Delete,
    ] {
        let mut cmd: Option<CommandBuf> = None;
        for (i, w) in writes.clone().enumerate() {
            if CommandKind::of(w) != kind {
                continue;
            }
            if let Some(c) = cmd.take_if(|c| {
                c.statements.len() >= MAX_STATEMENTS || c.bytes + w.size() > MAX_COMMAND_BYTES
            }) {
                out.push(c.finish(&wc, bypass_validation));
            }
            cmd.get_or_insert_with(|| CommandBuf::new(collection, kind))
                .push(i, w);
        }
        if let Some(c) = cmd {
            out.push(c.finish(&wc, bypass_validation));
        }
    }
    out
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum CommandKind {
    Insert,
    Update,
    Delete,
}

impl CommandKind {
    fn of(w: &Write) -> Self {
        match w {
            Write::Insert { .. } => CommandKind::Insert,
            Write::Replace { .. } | Write::Update { .. } => CommandKind::Update,
            Write::Delete { .. } => CommandKind::Delete,
        }
    }

    /// The command's name and the name of its array.
    fn names(self) -> (&'static str, &'static str) {
        match self {
            CommandKind::Insert => ("insert", "documents"),
            CommandKind::Update => ("update", "updates"),
            CommandKind::Delete => ("delete", "deletes"),
        }
    }
}

/// One command being written: `{update: <coll>, updates: [<statement>...]` (or `insert` and
/// `documents`, `delete` and `deletes`), closed by [`CommandBuf::finish`].
struct CommandBuf {
    kind: CommandKind,
    buf: Vec<u8>,
    /// Where the statements' array starts (its length is written there).
    array_at: usize,
    statements: Vec<usize>,
    /// Sum of the statements' [`Write::size`], for the size limit.
    bytes: usize,
}

const BSON_STRING: u8 = 0x02;
const BSON_DOCUMENT: u8 = 0x03;
const BSON_ARRAY: u8 = 0x04;
const BSON_BOOL: u8 = 0x08;
const BSON_INT32: u8 = 0x10;

fn element(buf: &mut Vec<u8>, kind: u8, name: &str) {
    buf.push(kind);
    buf.extend_from_slice(name.as_bytes());
    buf.push(0);
}

/// Open a document (or array): a length to patch. Returns where it starts.
fn open(buf: &mut Vec<u8>) -> usize {
    let at = buf.len();
    buf.extend_from_slice(&[0; 4]);
    at
}

fn close(buf: &mut Vec<u8>, at: usize) {
    buf.push(0);
    let len = i32::try_from(buf.len() - at).expect("a command stays far below 2 GiB");
    buf[at..at + 4].copy_from_slice(&len.to_le_bytes());
}

impl CommandBuf {
    fn new(collection: &str, kind: CommandKind) -> Self {
        let (command, array) = kind.names();
        let mut buf = Vec::with_capacity(64 << 10);
        open(&mut buf);
        element(&mut buf, BSON_STRING, command);
        let len = i32::try_from(collection.len() + 1).expect("a collection name is short");
        buf.extend_from_slice(&len.to_le_bytes());
        buf.extend_from_slice(collection.as_bytes());
        buf.push(0);
        element(&mut buf, BSON_ARRAY, array);
        let array_at = open(&mut buf);
        CommandBuf {
            kind,
            buf,
            array_at,
            statements: Vec::new(),
            bytes: 0,
        }
    }

    fn push(&mut self, i: usize, w: &Write) {
        let b = &mut self.buf;
        // An array's element names are its indexes: "0", "1", ...
        b.push(BSON_DOCUMENT);
        crate::push_decimal(self.statements.len() as u64, 1, b);
        b.push(0);
        if let Write::Insert { doc, .. } = w {
            // An insert's array holds the documents themselves.
            b.extend_from_slice(doc.as_bytes());
            self.bytes += w.size();
            self.statements.push(i);
            return;
        }
        let at = open(b);
        element(b, BSON_DOCUMENT, "q");
        b.extend_from_slice(w.key().as_bytes());
        match w {
            Write::Replace { doc, .. } => {
                element(b, BSON_DOCUMENT, "u");
                b.extend_from_slice(doc.as_bytes());
                element(b, BSON_BOOL, "upsert");
                b.push(1);
            }
            Write::Update { update, .. } => {
                element(b, BSON_DOCUMENT, "u");
                b.extend_from_slice(update.as_bytes());
            }
            Write::Delete { .. } => {
                element(b, BSON_INT32, "limit");
                b.extend_from_slice(&1i32.to_le_bytes());
            }
            Write::Insert { .. } => unreachable!("written above"),
        }
        close(b, at);
        self.bytes += w.size();
        self.statements.push(i);
    }

    fn finish(mut self, write_concern: &RawDocumentBuf, bypass_validation: bool) -> Command {
        let b = &mut self.buf;
        close(b, self.array_at);
        element(b, BSON_BOOL, "ordered");
        b.push(0);
        if bypass_validation && self.kind != CommandKind::Delete {
            element(b, BSON_BOOL, "bypassDocumentValidation");
            b.push(1);
        }
        element(b, BSON_DOCUMENT, "writeConcern");
        b.extend_from_slice(write_concern.as_bytes());
        close(b, 0);
        Command {
            body: RawDocumentBuf::from_bytes(self.buf).expect("a command written whole"),
            statements: self.statements,
        }
    }
}

/// A statement the server refused: its index in the command, code and message.
#[derive(Debug, Clone, PartialEq)]
pub struct StatementError {
    pub index: usize,
    pub code: i32,
    pub message: String,
}

impl StatementError {
    /// The server refused the statement for now (an election, a shutdown, a write conflict:
    /// [`sluice_common::mongo::TRANSIENT_CODES`]), not for its document: the batch is
    /// written again.
    pub fn transient(&self) -> bool {
        transient_code(self.code)
    }
}

/// MongoDB's WriteConcernFailed: the writes were made but not confirmed by `w` members within
/// `wtimeout`. Every write here is idempotent (by document key), so writing the batch again,
/// and waiting for its confirmation again, is safe: it is transient.
pub const WRITE_CONCERN_FAILED: i32 = 64;

/// Read a write command's reply: per-statement errors, or the error of the whole command.
///
/// A write concern error is transient when its code is [`WRITE_CONCERN_FAILED`] (a
/// `wtimeout` ran out) or one of the shared transient codes (the primary stepped down or is
/// shutting down while waiting); otherwise it is definite: the deployment cannot satisfy the
/// configured `mongodb.write_concern` (UnknownReplWriteConcern 79, UnsatisfiableWriteConcern
/// 100, ...) and writing again would be refused again.
pub fn reply_errors(reply: &Document) -> Result<Vec<StatementError>, ApplyError> {
    if let Ok(wce) = reply.get_document("writeConcernError") {
        let code = wce.get_i32("code").unwrap_or(0);
        let message = format!(
            "write concern not satisfied: {} (code {code})",
            wce.get_str("errmsg").unwrap_or("?"),
        );
        return Err(if code == WRITE_CONCERN_FAILED || transient_code(code) {
            ApplyError::transient(Origin::Mongo, message)
        } else {
            ApplyError::definite(Origin::Mongo, message)
        });
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
