use super::*;
use mongodb::bson::{rawdoc, spec::BinarySubtype, Binary, Bson, Decimal128};

fn raw(d: Document) -> RawDocumentBuf {
    RawDocumentBuf::from_document(&d).unwrap()
}

fn ts(i: u32) -> Timestamp {
    Timestamp {
        time: 1_700_000_000,
        increment: i,
    }
}

fn change(e: StreamEvent) -> Change {
    match e {
        StreamEvent::Change(c) => *c,
        other => panic!("expected a change, got {other:?}"),
    }
}

#[test]
fn change_stream_insert_keeps_the_document_bytes() {
    let full = doc! { "_id": 7, "d": Decimal128::from_bytes([1; 16]), "b": Binary { subtype: BinarySubtype::UserDefined(0x80), bytes: vec![1, 2] }, "mk": Bson::MinKey };
    let ev = raw(doc! {
        "_id": { "_data": "82AB" },
        "operationType": "insert",
        "clusterTime": ts(3),
        "wallTime": bson::DateTime::from_millis(1_700_000_000_123),
        "ns": { "db": "shop", "coll": "orders" },
        "documentKey": { "_id": 7 },
        "fullDocument": full.clone(),
    });
    let c = change(from_change_stream(&ev, (None, None)).unwrap());
    assert_eq!(c.op, OpKind::Insert);
    assert_eq!(
        (c.database.as_str(), c.collection.as_str()),
        ("shop", "orders")
    );
    assert_eq!(
        c.full_document.as_ref().unwrap().as_bytes(),
        raw(full).as_bytes()
    );
    assert_eq!(c.id(), Some(RawBsonRef::Int32(7)));
    assert_eq!(c.ts, ts(3));
    assert_eq!(c.wall_millis, Some(1_700_000_000_123));
}

#[test]
fn change_stream_update_reads_the_description() {
    let ev = raw(doc! {
        "operationType": "update",
        "clusterTime": ts(4),
        "ns": { "db": "shop", "coll": "orders" },
        "documentKey": { "_id": "k" },
        "updateDescription": {
            "updatedFields": { "a.b": 1, "arr.2": "x" },
            "removedFields": ["gone"],
            "truncatedArrays": [{ "field": "arr", "newSize": 3 }],
        },
        "lsid": { "id": Binary { subtype: BinarySubtype::Uuid, bytes: vec![9; 16] } },
        "txnNumber": 12i64,
    });
    let c = change(from_change_stream(&ev, (None, None)).unwrap());
    let u = c.update.clone().unwrap();
    assert_eq!(u.updated, raw(doc! { "a.b": 1, "arr.2": "x" }));
    assert_eq!(u.removed, vec!["gone".to_string()]);
    assert_eq!(u.truncated, vec![("arr".to_string(), 3)]);
    assert_eq!(c.txn_number, Some(12));
    assert!(c.lsid.is_some());
}

#[test]
fn change_stream_updates_with_positional_paths_carry_the_document() {
    // MongoDB never describes an update so (it writes `arr.1`); were a server to, the
    // description cannot be replayed: the event's own document goes instead, or, without one,
    // the document is read from the source.
    let ev = |full: Option<Document>| {
        let mut d = doc! {
            "operationType": "update",
            "clusterTime": ts(4),
            "ns": { "db": "shop", "coll": "orders" },
            "documentKey": { "_id": 1 },
            "updateDescription": {
                "updatedFields": { "n": 2, "arr.$": 20 },
                "removedFields": [],
            },
        };
        if let Some(f) = full {
            d.insert("fullDocument", f);
        }
        raw(d)
    };
    let post = doc! { "_id": 1, "n": 2, "arr": [1, 20] };
    let c = change(from_change_stream(&ev(Some(post.clone())), (None, None)).unwrap());
    assert_eq!(
        (c.op, c.update.is_none(), c.lookup),
        (OpKind::Update, true, false)
    );
    assert_eq!(c.full_document, Some(raw(post)));
    let c = change(from_change_stream(&ev(None), (None, None)).unwrap());
    assert_eq!((c.update.is_none(), c.lookup), (true, true));
    // `whenAvailable` without a post-image: fullDocument null, looked up as well.
    let mut d = ev(None).to_document().unwrap();
    d.insert("fullDocument", Bson::Null);
    let c = change(from_change_stream(&raw(d), (None, None)).unwrap());
    assert_eq!((c.update.is_none(), c.lookup), (true, true));
    for (desc, path) in [
        (
            doc! { "updatedFields": {}, "removedFields": ["objs.$[e].v"] },
            "objs.$[e].v",
        ),
        (
            doc! { "updatedFields": {}, "removedFields": [], "truncatedArrays": [{ "field": "a.$[]", "newSize": 1 }] },
            "a.$[]",
        ),
    ] {
        let mut d = ev(None).to_document().unwrap();
        d.insert("updateDescription", desc);
        let c = change(from_change_stream(&raw(d.clone()), (None, None)).unwrap());
        assert!(c.lookup, "{path}");
        let u = update_description(&raw(d.get_document("updateDescription").unwrap().clone()));
        assert_eq!(u.unwrap().operator_path(), Some(path));
    }
}

#[test]
fn nonconforming_change_streams_are_refused_by_name() {
    // mongo-java-server: the update spec as documentKey, no updateDescription.
    let ev = raw(doc! {
        "operationType": "update",
        "clusterTime": ts(5),
        "documentKey": { "$set": { "x": 1 } },
        "fullDocument": { "x": 1 },
    });
    let e = from_change_stream(&ev, (Some("db"), Some("c"))).unwrap_err();
    assert!(e.contains("no _id"), "{e}");
    let ev = raw(doc! {
        "operationType": "update",
        "clusterTime": ts(5),
        "documentKey": { "_id": 1 },
    });
    let e = from_change_stream(&ev, (Some("db"), Some("c"))).unwrap_err();
    assert!(
        e.contains("updateDescription") && e.contains("oplog"),
        "{e}"
    );
    // No ns, and the stream is not on one collection: which collection changed is unknown.
    let ev =
        raw(doc! { "operationType": "delete", "clusterTime": ts(6), "documentKey": { "_id": 1 } });
    let e = from_change_stream(&ev, (Some("db"), None)).unwrap_err();
    assert!(e.contains("no ns"), "{e}");
    let c = change(from_change_stream(&ev, (Some("db"), Some("c"))).unwrap());
    assert_eq!(
        (c.database.as_str(), c.collection.as_str(), c.op),
        ("db", "c", OpKind::Delete)
    );
}

#[test]
fn change_stream_ddl_events() {
    let ev = raw(doc! {
        "operationType": "rename", "clusterTime": ts(1),
        "ns": { "db": "a", "coll": "x" }, "to": { "db": "b", "coll": "y" },
    });
    let c = change(from_change_stream(&ev, (None, None)).unwrap());
    let d = c.ddl.unwrap();
    assert_eq!(d.kind, "rename");
    assert_eq!(d.command, doc! { "renameCollection": "a.x", "to": "b.y" });
    assert_eq!(d.to, Some(("b".into(), "y".into())));

    let ev = raw(doc! {
        "operationType": "createIndexes", "clusterTime": ts(2),
        "ns": { "db": "a", "coll": "x" },
        "operationDescription": { "indexes": [{ "v": 2, "key": { "k": 1 }, "name": "k_1", "unique": true }] },
    });
    let d = change(from_change_stream(&ev, (None, None)).unwrap())
        .ddl
        .unwrap();
    assert_eq!(d.kind, "create_indexes");
    assert_eq!(
        d.command,
        doc! { "createIndexes": "x", "indexes": [{ "v": 2, "key": { "k": 1 }, "name": "k_1", "unique": true }] }
    );
    let ev = raw(doc! {
        "operationType": "dropIndexes", "clusterTime": ts(3),
        "ns": { "db": "a", "coll": "x" },
        "operationDescription": { "indexes": [{ "v": 2, "key": { "k": 1 }, "name": "k_1" }] },
    });
    let d = change(from_change_stream(&ev, (None, None)).unwrap())
        .ddl
        .unwrap();
    assert_eq!(d.command, doc! { "dropIndexes": "x", "index": ["k_1"] });
    // collMod, as MongoDB 6.0+ reports it: the fields of the command, and the state before.
    let ev = raw(doc! {
        "operationType": "modify", "clusterTime": ts(3),
        "ns": { "db": "a", "coll": "x" },
        "operationDescription": { "index": { "name": "t_1", "expireAfterSeconds": 60 } },
        "stateBeforeChange": { "indexOptions": { "expireAfterSeconds": 3600 } },
    });
    let d = change(from_change_stream(&ev, (None, None)).unwrap())
        .ddl
        .unwrap();
    assert_eq!(d.kind, "modify");
    assert_eq!(
        d.command,
        doc! { "collMod": "x", "index": { "name": "t_1", "expireAfterSeconds": 60 } }
    );
    let ev = raw(doc! { "operationType": "invalidate", "clusterTime": ts(4) });
    assert_eq!(
        from_change_stream(&ev, (None, None)).unwrap(),
        StreamEvent::Invalidate
    );
    let ev =
        raw(doc! { "operationType": "dropDatabase", "clusterTime": ts(5), "ns": { "db": "a" } });
    let c = change(from_change_stream(&ev, (None, None)).unwrap());
    assert_eq!(
        (c.collection.as_str(), c.ddl.unwrap().kind),
        ("", "drop_database")
    );
}

#[test]
fn resume_token_times() {
    // MongoDB: 82 + 8 bytes of timestamp + more key string.
    let t = token_time(&doc! { "_data": "8265A1B2C3000000042B022C0100296E5A1004" }).unwrap();
    assert_eq!((t.time, t.increment), (0x65A1_B2C3, 4));
    // mongo-java-server: the timestamp's hex alone.
    let t = token_time(&doc! { "_data": "6b0d2c8000000007" }).unwrap();
    assert_eq!((t.time, t.increment), (0x6b0d_2c80, 7));
    assert_eq!(token_time(&doc! { "_data": "zz" }), None);
    let _ = rawdoc! {};
}
