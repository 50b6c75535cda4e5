use super::*;
use mongodb::bson::{rawdoc, spec::BinarySubtype, Binary, Document};

fn raw(d: Document) -> RawDocumentBuf {
    RawDocumentBuf::from_document(&d).unwrap()
}

fn ts(i: u32) -> Timestamp {
    Timestamp {
        time: 1_700_000_000,
        increment: i,
    }
}

fn oplog(d: Document) -> OplogEntry {
    from_oplog(&raw(d)).unwrap()
}

#[test]
fn oplog_insert_delete_and_replacement() {
    let e = oplog(
        doc! { "ts": ts(1), "op": "i", "ns": "shop.orders", "o": { "_id": 1, "x": 2 }, "wall": bson::DateTime::from_millis(5) },
    );
    let c = &e.changes[0];
    assert_eq!(c.op, OpKind::Insert);
    assert_eq!(c.document_key, Some(raw(doc! { "_id": 1 })));
    assert_eq!(c.wall_millis, Some(5));
    let e = oplog(doc! { "ts": ts(2), "op": "d", "ns": "shop.orders", "o": { "_id": 1 } });
    assert_eq!(e.changes[0].op, OpKind::Delete);
    let e = oplog(
        doc! { "ts": ts(3), "op": "u", "ns": "shop.orders", "o": { "_id": 1, "y": 3 }, "o2": { "_id": 1 } },
    );
    assert_eq!(e.changes[0].op, OpKind::Replace);
    assert_eq!(
        e.changes[0].full_document,
        Some(raw(doc! { "_id": 1, "y": 3 }))
    );
    let e = oplog(doc! { "ts": ts(4), "op": "n", "ns": "", "o": { "msg": "periodic noop" } });
    assert!(e.changes.is_empty());
    assert_eq!(e.ts, ts(4));
}

#[test]
fn oplog_updates_in_every_form() {
    // 4.x: $set/$unset.
    let e = oplog(
        doc! { "ts": ts(1), "op": "u", "ns": "d.c", "o": { "$v": 1, "$set": { "a": 1, "n.m": 2 }, "$unset": { "b": true } }, "o2": { "_id": 1 } },
    );
    let u = e.changes[0].update.clone().unwrap();
    assert_eq!(u.updated, raw(doc! { "a": 1, "n.m": 2 }));
    assert_eq!(u.removed, vec!["b".to_string()]);
    // 5.0+: the diff format, nested documents and arrays.
    let e = oplog(
        doc! { "ts": ts(2), "op": "u", "ns": "d.c", "o2": { "_id": 1 }, "o": { "$v": 2, "diff": {
            "d": { "gone": false },
            "u": { "a": 5 },
            "i": { "new": "x" },
            "sn": { "u": { "m": 3 }, "sdeep": { "d": { "z": false } } },
            "sarr": { "a": true, "l": 2, "u1": "b", "s0": { "u": { "f": 1 } } },
        } } },
    );
    let u = e.changes[0].update.clone().unwrap();
    assert_eq!(
        u.updated,
        raw(doc! { "a": 5, "new": "x", "n.m": 3, "arr.1": "b", "arr.0.f": 1 })
    );
    assert_eq!(u.removed, vec!["gone".to_string(), "n.deep.z".to_string()]);
    assert_eq!(u.truncated, vec![("arr".to_string(), 2)]);
    // Operators MongoDB never logs (wire-compatible servers do): the document is looked up.
    let e = oplog(
        doc! { "ts": ts(3), "op": "u", "ns": "d.c", "o": { "$inc": { "a": 1 } }, "o2": { "_id": 1 } },
    );
    assert!(e.changes[0].lookup);
    assert_eq!(e.changes[0].op, OpKind::Update);
    // Positional paths, as mongo-java-server logs the client's update (MongoDB logs `arr.1`):
    // which elements changed is not in the entry, the document is looked up; so is a `$set`
    // of a `$`-prefixed field, and a diff that reaches one.
    for o in [
        doc! { "$set": { "arr.$": 20 } },
        doc! { "$set": { "ok": 1, "objs.$[e].v": 9 } },
        doc! { "$set": { "arr.$[]": 7 } },
        doc! { "$unset": { "objs.$.v": "" } },
        doc! { "$v": 1, "$set": { "a.$[o].b.$[i]": 1 } },
        doc! { "$set": { "a.$price": 1 } },
        doc! { "$v": 2, "diff": { "sa": { "u": { "$price": 1 } } } },
    ] {
        let e =
            oplog(doc! { "ts": ts(4), "op": "u", "ns": "d.c", "o": o.clone(), "o2": { "_id": 1 } });
        let c = &e.changes[0];
        assert!(c.lookup && c.update.is_none(), "{o}");
        assert_eq!(
            (c.op, c.operation_type.as_str()),
            (OpKind::Update, "update")
        );
    }
    // `$` inside a name is no operator.
    let e = oplog(
        doc! { "ts": ts(5), "op": "u", "ns": "d.c", "o": { "$set": { "a.b$": 1, "arr.3": 2 } }, "o2": { "_id": 1 } },
    );
    assert!(!e.changes[0].lookup && e.changes[0].update.is_some());
    // A broken diff is an error that names the entry.
    let err = from_oplog(&raw(doc! { "ts": ts(9), "op": "u", "ns": "d.c", "o": { "$v": 2, "diff": { "q": 1 } }, "o2": { "_id": 1 } })).unwrap_err();
    assert!(
        err.contains("oplog entry at") && err.contains("\"q\""),
        "{err}"
    );
}

#[test]
fn oplog_transactions_and_commands() {
    let lsid = doc! { "id": Binary { subtype: BinarySubtype::Uuid, bytes: vec![1; 16] } };
    let e = oplog(
        doc! { "ts": ts(1), "op": "c", "ns": "admin.$cmd", "lsid": lsid.clone(), "txnNumber": 3i64,
        "o": { "applyOps": [
            { "op": "i", "ns": "d.a", "o": { "_id": 1 } },
            { "op": "d", "ns": "d.b", "o": { "_id": 2 } },
        ], "partialTxn": true } },
    );
    assert!(e.partial);
    assert_eq!(e.changes.len(), 2);
    assert_eq!(e.changes[1].collection, "b");
    assert!(e
        .changes
        .iter()
        .all(|c| c.txn_number == Some(3) && c.lsid == Some(raw(lsid.clone())) && c.ts == ts(1)));

    let cmd = |o: Document| oplog(doc! { "ts": ts(2), "op": "c", "ns": "d.$cmd", "o": o }).changes;
    let c = cmd(doc! { "drop": "a" });
    assert_eq!(
        (c[0].collection.as_str(), c[0].ddl.clone().unwrap().kind),
        ("a", "drop")
    );
    let c = cmd(doc! { "create": "a", "capped": true, "size": 4096, "idIndex": { "v": 2 } });
    assert_eq!(
        c[0].ddl.clone().unwrap().command,
        doc! { "create": "a", "capped": true, "size": 4096 }
    );
    let c = cmd(doc! { "createIndexes": "a", "v": 2, "key": { "k": -1 }, "name": "k_-1" });
    assert_eq!(
        c[0].ddl.clone().unwrap().command,
        doc! { "createIndexes": "a", "indexes": [{ "v": 2, "key": { "k": -1 }, "name": "k_-1" }] }
    );
    let c = cmd(
        doc! { "collMod": "a", "validator": { "k": { "$gt": 0 } }, "validationAction": "warn" },
    );
    let d = c[0].ddl.clone().unwrap();
    assert_eq!((c[0].collection.as_str(), d.kind), ("a", "modify"));
    assert_eq!(
        d.command,
        doc! { "collMod": "a", "validator": { "k": { "$gt": 0 } }, "validationAction": "warn" }
    );
    let c = cmd(doc! { "dropIndexes": "a", "index": "k_-1" });
    assert_eq!(
        c[0].ddl.clone().unwrap().command,
        doc! { "dropIndexes": "a", "index": "k_-1" }
    );
    let c = oplog(doc! { "ts": ts(3), "op": "c", "ns": "admin.$cmd", "o": { "renameCollection": "d.a", "to": "e.b", "stayTemp": false } }).changes;
    let d = c[0].ddl.clone().unwrap();
    assert_eq!(
        (c[0].database.as_str(), c[0].collection.as_str()),
        ("d", "a")
    );
    assert_eq!(d.to, Some(("e".into(), "b".into())));
    assert!(cmd(doc! { "commitTransaction": 1 }).is_empty());
    let c = cmd(doc! { "dropDatabase": 1 });
    assert_eq!(c[0].ddl.clone().unwrap().kind, "drop_database");
}

#[test]
fn oplog_entries_read_in_one_pass_keep_the_lookup_rules() {
    // The first of a repeated name counts, as with a lookup; other fields are skipped.
    let mut d = RawDocumentBuf::new();
    d.append("x", 1);
    d.append("ts", ts(4));
    d.append("op", "i");
    d.append("ns", "d.c");
    d.append("o", rawdoc! { "_id": 1, "a": 1 });
    d.append("o", rawdoc! { "_id": 2, "a": 2 });
    d.append("wall", bson::DateTime::from_millis(1_700_000_000_456));
    d.append("txnNumber", 7i64);
    let e = from_oplog(&d).unwrap();
    assert_eq!(e.ts, ts(4));
    let c = &e.changes[0];
    assert_eq!(
        c.full_document.as_ref().unwrap(),
        &rawdoc! { "_id": 1, "a": 1 }
    );
    assert_eq!(c.document_key.as_ref().unwrap(), &rawdoc! { "_id": 1 });
    assert_eq!(c.wall_millis, Some(1_700_000_000_456));
    assert_eq!(c.txn_number, Some(7));
    assert_eq!((c.database.as_str(), c.collection.as_str()), ("d", "c"));
    // Each refusal names the field.
    let err = |d: Document| from_oplog(&raw(d)).unwrap_err();
    assert!(err(doc! { "op": "i" }).contains("no ts"));
    assert!(err(doc! { "ts": 5, "op": "i" }).contains("ts is a Int32"));
    let e = err(doc! { "ts": ts(1), "ns": "d.c", "o": { "_id": 1 } });
    assert!(e.contains("oplog entry at") && e.contains("op"), "{e}");
    assert!(err(doc! { "ts": ts(1), "op": 3 }).contains("field op"));
    assert!(
        err(doc! { "ts": ts(1), "op": "i", "ns": "d.c", "o": 5 }).contains("field o is a Int32")
    );
    assert!(err(
        doc! { "ts": ts(1), "op": "u", "ns": "d.c", "o": { "$set": { "a": 1 } }, "o2": "k" }
    )
    .contains("field o2 is a String"));
    assert!(
        err(doc! { "ts": ts(1), "op": "i", "ns": "d.c", "o": { "_id": 1 }, "lsid": 1 })
            .contains("field lsid")
    );
    // Null counts as absent.
    let e = from_oplog(&raw(
        doc! { "ts": ts(2), "op": "d", "ns": "d.c", "o": { "_id": 3 }, "lsid": null },
    ))
    .unwrap();
    assert_eq!(e.changes[0].lsid, None);
}

#[test]
fn chunk_migrations_are_not_changes() {
    // A recipient shard's copy and a donor's range delete, as the shards log them.
    let e = oplog(doc! {
        "ts": ts(1), "op": "i", "ns": "d.a", "fromMigrate": true, "o": { "_id": 1, "k": 1 },
    });
    assert!(e.changes.is_empty(), "{e:?}");
    let e = oplog(doc! {
        "ts": ts(2), "op": "d", "ns": "d.a", "fromMigrate": true, "o": { "_id": 1 },
    });
    assert!(e.changes.is_empty(), "{e:?}");
    let e = oplog(doc! {
        "ts": ts(3), "op": "c", "ns": "d.$cmd", "fromMigrate": true, "o": { "create": "a" },
    });
    assert!(e.changes.is_empty(), "{e:?}");
    // Inside applyOps too; the operations of the same entry that are not migrations count.
    let e = oplog(doc! {
        "ts": ts(4), "op": "c", "ns": "admin.$cmd", "o": { "applyOps": [
            { "op": "i", "ns": "d.a", "fromMigrate": true, "o": { "_id": 2 } },
            { "op": "i", "ns": "d.a", "o": { "_id": 3 } },
        ] },
    });
    assert_eq!(e.changes.len(), 1, "{e:?}");
    assert_eq!(e.changes[0].id(), Some(RawBsonRef::Int32(3)));
    // fromMigrate: false is an ordinary write.
    let e = oplog(doc! {
        "ts": ts(5), "op": "i", "ns": "d.a", "fromMigrate": false, "o": { "_id": 4 },
    });
    assert_eq!(e.changes.len(), 1);
}
