use super::*;
use mongodb::bson::{doc, rawdoc};
use sluice_proto::v1::{MongoChange, TruncatedArray, UpdateDescription};
use sluice_proto::ChangeEvent;

fn bytes(d: Document) -> Vec<u8> {
    RawDocumentBuf::from_document(&d).unwrap().into_bytes()
}

fn event(op: Op, m: MongoChange) -> ChangeEvent {
    ChangeEvent {
        op: op as i32,
        mongo: Some(m),
        ..Default::default()
    }
}

/// [`writes_of`] of the event as it travels: encoded, then read where it lies.
fn writes_of_event(e: &ChangeEvent) -> Result<Vec<Write>, String> {
    let bytes = prost::Message::encode_to_vec(e);
    writes_of(&RowEvent::parse(&bytes).unwrap())
}

fn key() -> Vec<u8> {
    bytes(doc! { "_id": 1 })
}

#[test]
fn inserts_insert_and_replacements_upsert_the_whole_document() {
    let e = event(
        Op::Insert,
        MongoChange {
            document_key: key(),
            full_document: bytes(doc! { "_id": 1, "a": 2 }),
            operation_type: "insert".into(),
            ..Default::default()
        },
    );
    let insert = writes_of_event(&e).unwrap();
    assert_eq!(
        insert,
        vec![Write::Insert {
            key: rawdoc! { "_id": 1 },
            doc: rawdoc! { "_id": 1, "a": 2 }
        }]
    );
    // Refused as a duplicate, it is written again as this replacement.
    assert_eq!(
        insert[0].as_replacement(),
        Some(Write::Replace {
            key: rawdoc! { "_id": 1 },
            doc: rawdoc! { "_id": 1, "a": 2 }
        })
    );
    // A document without the key's `_id`, or with another, is not inserted under its own.
    for doc in [
        doc! { "a": 2 },
        doc! { "_id": 2, "a": 2 },
        doc! { "_id": 1i64, "a": 2 },
    ] {
        let mut odd = e.clone();
        odd.mongo.as_mut().unwrap().full_document = bytes(doc.clone());
        assert_eq!(
            writes_of_event(&odd).unwrap(),
            vec![Write::Replace {
                key: rawdoc! { "_id": 1 },
                doc: RawDocumentBuf::from_document(&doc).unwrap(),
            }],
            "{doc}"
        );
    }
    let mut s = e.clone();
    s.op = Op::SnapshotRead as i32;
    assert!(matches!(
        writes_of_event(&s).unwrap()[0],
        Write::Insert { .. }
    ));
    let mut r = e.clone();
    r.op = Op::Update as i32;
    r.mongo.as_mut().unwrap().operation_type = "replace".into();
    let replace = writes_of_event(&r).unwrap();
    assert!(matches!(replace[0], Write::Replace { .. }));
    assert_eq!(replace[0].as_replacement(), None);
    let d = event(
        Op::Delete,
        MongoChange {
            document_key: key(),
            ..Default::default()
        },
    );
    assert_eq!(
        writes_of_event(&d).unwrap(),
        vec![Write::Delete {
            key: rawdoc! { "_id": 1 }
        }]
    );
}

#[test]
fn updates_apply_their_description_truncation_first() {
    let e = event(
        Op::Update,
        MongoChange {
            document_key: key(),
            operation_type: "update".into(),
            update_description: Some(UpdateDescription {
                updated_fields: bytes(doc! { "a.b": 1, "arr.1": "x" }),
                removed_fields: vec!["gone".into()],
                truncated_arrays: vec![TruncatedArray {
                    field: "arr".into(),
                    new_size: 2,
                }],
            }),
            ..Default::default()
        },
    );
    let w = writes_of_event(&e).unwrap();
    assert_eq!(
        w,
        vec![
            Write::Update {
                key: rawdoc! { "_id": 1 },
                update: rawdoc! { "$push": { "arr": { "$each": [], "$slice": 2i64 } } }
            },
            Write::Update {
                key: rawdoc! { "_id": 1 },
                update: rawdoc! { "$set": { "a.b": 1, "arr.1": "x" }, "$unset": { "gone": "" } }
            },
        ]
    );
    // Nothing to do: no write (an empty $set is refused by the server).
    let mut empty = e.clone();
    empty.mongo.as_mut().unwrap().update_description = Some(UpdateDescription::default());
    assert!(writes_of_event(&empty).unwrap().is_empty());
    // A full document (updateLookup, or an oplog update looked up) replaces.
    let mut full = e.clone();
    let m = full.mongo.as_mut().unwrap();
    m.update_description = None;
    m.full_document = bytes(doc! { "_id": 1, "z": 1 });
    assert!(matches!(
        writes_of_event(&full).unwrap()[0],
        Write::Replace { .. }
    ));
}

#[test]
fn positional_paths_are_written_from_the_document_or_refused_by_name() {
    let update = |set: Document, removed: &[&str], truncated: &[&str], full: Option<Document>| {
        event(
            Op::Update,
            MongoChange {
                document_key: key(),
                operation_type: "update".into(),
                full_document: full.map(bytes).unwrap_or_default(),
                update_description: Some(UpdateDescription {
                    updated_fields: bytes(set),
                    removed_fields: removed.iter().map(|f| f.to_string()).collect(),
                    truncated_arrays: truncated
                        .iter()
                        .map(|f| TruncatedArray {
                            field: f.to_string(),
                            new_size: 1,
                        })
                        .collect(),
                }),
                ..Default::default()
            },
        )
    };
    // With the document (a post-image, updateLookup's, or the capture's lookup): replaced by it,
    // the description left aside.
    let doc = doc! { "_id": 1, "arr": [1, 20, 3] };
    for e in [
        update(doc! { "arr.$": 20 }, &[], &[], Some(doc.clone())),
        update(
            doc! { "n": 1, "objs.$[e].v": 9 },
            &[],
            &[],
            Some(doc.clone()),
        ),
        update(doc! {}, &["objs.$[].v"], &[], Some(doc.clone())),
        update(doc! {}, &[], &["a.$[]"], Some(doc.clone())),
    ] {
        assert_eq!(
            writes_of_event(&e).unwrap(),
            vec![Write::Replace {
                key: rawdoc! { "_id": 1 },
                doc: RawDocumentBuf::from_document(&doc).unwrap(),
            }]
        );
    }
    // Without it: refused, naming what it does, the path and the remedy (the collection stops).
    for (e, what, path) in [
        (
            update(doc! { "ok": 1, "arr.$": 20 }, &[], &[], None),
            "sets",
            "arr.$",
        ),
        (
            update(doc! { "objs.$[e].v": 9 }, &[], &[], None),
            "sets",
            "objs.$[e].v",
        ),
        (
            update(doc! {}, &["a", "objs.$.v"], &[], None),
            "removes",
            "objs.$.v",
        ),
        (
            update(doc! {}, &[], &["arr.$[]"], None),
            "truncates",
            "arr.$[]",
        ),
        (
            update(doc! { "a.$price": 1 }, &[], &[], None),
            "sets",
            "a.$price",
        ),
    ] {
        let m = writes_of_event(&e).unwrap_err();
        assert!(
            m.contains(&format!("an update that {what} the path \"{path}\"")),
            "{m}"
        );
        assert!(m.contains("copy the collection again"), "{m}");
    }
    // Paths MongoDB writes are applied as described, `$` inside a name or not.
    let e = update(doc! { "arr.3": 20, "a.b$": 1 }, &[], &[], None);
    assert!(matches!(
        writes_of_event(&e).unwrap()[..],
        [Write::Update { .. }]
    ));
}

#[test]
fn bad_events_are_refused_with_a_reason() {
    let e = event(Op::Insert, MongoChange::default());
    assert_eq!(writes_of_event(&e).unwrap_err(), "no document key");
    let e = event(
        Op::Insert,
        MongoChange {
            document_key: bytes(doc! { "x": 1 }),
            ..Default::default()
        },
    );
    assert!(writes_of_event(&e).unwrap_err().contains("no _id"));
    let e = event(
        Op::Insert,
        MongoChange {
            document_key: vec![1, 2, 3],
            ..Default::default()
        },
    );
    assert!(writes_of_event(&e).unwrap_err().contains("not BSON"));
    let e = ChangeEvent::default();
    assert!(writes_of_event(&e)
        .unwrap_err()
        .contains("not a MongoDB event"));
}

#[test]
fn rounds_keep_each_keys_order() {
    let keys = ["a", "b", "a", "c", "a", "b"];
    assert_eq!(rounds(&keys), vec![vec![0, 1, 3], vec![2, 5], vec![4]]);
    assert!(rounds::<u8>(&[]).is_empty());
}

#[test]
fn commands_split_updates_and_deletes_and_cut_to_size() {
    let writes: Vec<Write> = (0..(MAX_STATEMENTS + 5) as i32)
        .map(|i| Write::Replace {
            key: rawdoc! { "_id": i },
            doc: rawdoc! { "_id": i },
        })
        .chain([Write::Delete {
            key: rawdoc! { "_id": -1 },
        }])
        .collect();
    let cmds = commands("c", writes.iter(), &doc! { "w": "majority" }, false);
    assert_eq!(cmds.len(), 3);
    assert_eq!(cmds[0].statements.len(), MAX_STATEMENTS);
    assert_eq!(
        cmds[1].statements,
        (MAX_STATEMENTS..MAX_STATEMENTS + 5).collect::<Vec<_>>()
    );
    assert_eq!(cmds[2].statements, vec![MAX_STATEMENTS + 5]);
    let d = cmds[2].body.to_document().unwrap();
    assert_eq!(
        d,
        doc! { "delete": "c", "deletes": [{ "q": { "_id": -1 }, "limit": 1 }], "ordered": false, "writeConcern": { "w": "majority" } }
    );
    let u = cmds[1].body.to_document().unwrap();
    let first = u.get_array("updates").unwrap()[0]
        .as_document()
        .unwrap()
        .clone();
    assert_eq!(
        first,
        doc! { "q": { "_id": MAX_STATEMENTS as i32 }, "u": { "_id": MAX_STATEMENTS as i32 }, "upsert": true }
    );
}

#[test]
fn commands_are_the_bson_of_their_documents() {
    // Sixteen statements, so that array indexes of two digits are written too.
    let writes: Vec<Write> = (0..16i32)
        .map(|i| match i % 4 {
            0 => Write::Replace {
                key: rawdoc! { "_id": i },
                doc: rawdoc! { "_id": i, "s": "x".repeat(i as usize), "n": { "a": [1, 2] } },
            },
            1 => Write::Update {
                key: rawdoc! { "_id": i },
                update: rawdoc! { "$set": { "s": "y" }, "$unset": { "t": "" } },
            },
            2 => Write::Delete {
                key: rawdoc! { "_id": format!("k{i}") },
            },
            _ => Write::Insert {
                key: rawdoc! { "_id": i },
                doc: rawdoc! { "_id": i, "s": "z", "d": [{ "e": 1 }] },
            },
        })
        .collect();
    let wc = doc! { "w": "majority", "wtimeout": 5000 };
    let cmds = commands("coll", writes.iter(), &wc, false);
    assert_eq!(cmds.len(), 3);
    let statement = |w: &Write| -> Document {
        match w {
            Write::Insert { doc, .. } => doc.to_document().unwrap(),
            Write::Replace { key, doc } => {
                doc! { "q": key.to_document().unwrap(), "u": doc.to_document().unwrap(), "upsert": true }
            }
            Write::Update { key, update } => {
                doc! { "q": key.to_document().unwrap(), "u": update.to_document().unwrap() }
            }
            Write::Delete { key } => doc! { "q": key.to_document().unwrap(), "limit": 1 },
        }
    };
    let of = |f: fn(&Write) -> bool| -> Vec<Document> {
        writes.iter().filter(|w| f(w)).map(statement).collect()
    };
    let expected = [
        doc! { "insert": "coll", "documents": of(|w| matches!(w, Write::Insert { .. })), "ordered": false, "writeConcern": wc.clone() },
        doc! { "update": "coll", "updates": of(|w| matches!(w, Write::Replace { .. } | Write::Update { .. })), "ordered": false, "writeConcern": wc.clone() },
        doc! { "delete": "coll", "deletes": of(|w| matches!(w, Write::Delete { .. })), "ordered": false, "writeConcern": wc.clone() },
    ];
    for (c, e) in cmds.iter().zip(&expected) {
        // Byte for byte what the driver's own encoder writes.
        assert_eq!(
            c.body.as_bytes(),
            RawDocumentBuf::from_document(e).unwrap().as_bytes()
        );
    }
    assert_eq!(cmds[0].statements, vec![3, 7, 11, 15]);
    assert_eq!(cmds[1].statements, vec![0, 1, 4, 5, 8, 9, 12, 13]);
    assert_eq!(cmds[2].statements, vec![2, 6, 10, 14]);
    // mongodb.bypass_validation: inserts and updates skip the target's validator (a delete
    // takes no such option).
    let bypass = commands("coll", writes.iter(), &wc, true);
    for (c, e) in bypass.iter().zip(&expected) {
        let mut e = e.clone();
        if !e.contains_key("delete") {
            let wc = e.remove("writeConcern").unwrap();
            e.insert("bypassDocumentValidation", true);
            e.insert("writeConcern", wc);
        }
        assert_eq!(
            c.body.as_bytes(),
            RawDocumentBuf::from_document(&e).unwrap().as_bytes()
        );
    }
}

#[test]
fn replies_name_the_refused_statements() {
    let r = doc! { "n": 1, "ok": 1.0, "writeErrors": [{ "index": 3, "code": 11000, "errmsg": "E11000 duplicate key" }] };
    assert_eq!(
        reply_errors(&r).unwrap(),
        vec![StatementError {
            index: 3,
            code: 11000,
            message: "E11000 duplicate key".into()
        }]
    );
    // A statement refused for now (the primary stepping down) writes the batch again; one
    // refused for its document (duplicate key, validation) does not.
    let refused = |code| StatementError {
        index: 0,
        code,
        message: "m".into(),
    };
    assert!(refused(91).transient() && refused(10107).transient());
    assert!(!refused(11000).transient() && !refused(121).transient());
}

#[test]
fn write_concern_errors_are_classified_by_code() {
    let wce = |code: i32| doc! { "ok": 1.0, "writeConcernError": { "code": code, "errmsg": "waiting for replication timed out" } };
    // A wtimeout: the writes are made, their confirmation is waited for again.
    let e = reply_errors(&wce(WRITE_CONCERN_FAILED)).unwrap_err();
    assert!(
        e.is_transient() && e.to_string().contains("timed out"),
        "{e}"
    );
    assert_eq!(e.origin(), Origin::Mongo);
    assert!(reply_errors(&wce(189)).unwrap_err().is_transient());
    // A write concern this deployment cannot satisfy: stop and say so.
    for code in [79, 100] {
        let e = reply_errors(&wce(code)).unwrap_err();
        assert!(!e.is_transient(), "{code}");
        assert!(e.to_string().contains(&format!("(code {code})")), "{e}");
    }
}
