//! `sluice dead-letters`: the events an apply stage could not write, listed and replayed once
//! their cause is fixed (apply-mongo's: a document's history from the dead letter on).

use std::time::{Duration, Instant};

use mongodb::bson::{doc, Document};
use sluice_tests::mongo::*;
use sluice_tests::{mongo_source_url, mongo_target_url, unique};

/// Dead letters are replayed once their cause is fixed, with a filter by collection and
/// exactly once: the refused document comes back with the update the target could not apply
/// without it (its history from the dead letter on), another collection's dead letter is left
/// alone, and a second replay writes nothing.
#[tokio::test(flavor = "multi_thread")]
async fn dead_letters_are_replayed_once_the_cause_is_fixed() {
    let db = unique("sluice_m_replay");
    let (src, dst) = (
        client(mongo_source_url()).await,
        client(mongo_target_url()).await,
    );
    let dead_topic = unique("dead");
    let mut cap = capture(&db, "mode = \"oplog\"", "");
    let (ta, tb) = (
        dst.database(&db).collection::<Document>("a"),
        dst.database(&db).collection::<Document>("b"),
    );
    unique_email_index(&ta).await;
    unique_email_index(&tb).await;
    let mut app = apply(
        &cap.prefix,
        &unique("g"),
        &format!(
            "[errors]\non_bad_event = \"dead_letter\"\ndead_letter_topic = \"{dead_topic}\"\n"
        ),
    );
    started(&cap, true).await;
    let (a, b) = (
        src.database(&db).collection::<Document>("a"),
        src.database(&db).collection::<Document>("b"),
    );
    let arrived = |c: mongodb::Collection<Document>, id: i32| async move {
        let deadline = Instant::now() + Duration::from_secs(60);
        while c.count_documents(doc! { "_id": id }).await.unwrap() == 0 {
            assert!(Instant::now() < deadline, "document {id} never arrived");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    };
    // Document 2 of each collection is refused (the target's unique index); a's is updated
    // after, which the target cannot apply to a document it lacks.
    for c in [&a, &b] {
        c.insert_one(doc! { "_id": 1, "email": "x@example.com" })
            .await
            .unwrap();
    }
    arrived(ta.clone(), 1).await;
    arrived(tb.clone(), 1).await;
    for c in [&a, &b] {
        c.insert_one(doc! { "_id": 2, "email": "x@example.com" })
            .await
            .unwrap();
    }
    a.update_one(doc! { "_id": 2 }, doc! { "$set": { "n": 5 } })
        .await
        .unwrap();
    a.insert_one(doc! { "_id": 3, "email": "3@example.com" })
        .await
        .unwrap();
    arrived(ta.clone(), 3).await;
    let listed = |args: &[&str]| {
        let (code, out, err) = sluice_tests::capture::sluice(args);
        assert_eq!(code, Some(0), "{out}{err}");
        out
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    let list = loop {
        let out = listed(&["dead-letters", "list", "--topic", &dead_topic]);
        if out.lines().count() == 2 || Instant::now() > deadline {
            break out;
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    };
    assert_eq!(list.lines().count(), 2, "{list}");
    assert!(list.contains(&format!("{db}.a  insert key=2")), "{list}");
    assert!(
        list.contains("[duplicate_key]") && list.contains("E11000"),
        "{list}"
    );
    // The cause fixed (the index dropped), a's dead letters replayed.
    ta.drop_index("email_1").await.unwrap();
    let table = format!("{db}.a");
    let (code, out, err) = sluice_tests::capture::sluice(&[
        "dead-letters",
        "replay",
        "--topic",
        &dead_topic,
        "--table",
        &table,
    ]);
    assert_eq!(code, Some(0), "{out}{err}");
    assert!(
        out.contains("1 dead letters replayed, 2 events written again"),
        "{out}"
    );
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let d = ta.find_one(doc! { "_id": 2 }).await.unwrap();
        if d.as_ref().is_some_and(|d| d.get_i32("n") == Ok(5)) {
            break;
        }
        if Instant::now() > deadline {
            let (_, log) = app.stop();
            panic!("document 2 is {d:?} after the replay\n{log}");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // Once: a second replay writes nothing; b's dead letter is still there, not replayed.
    let (code, out, err) = sluice_tests::capture::sluice(&[
        "dead-letters",
        "replay",
        "--topic",
        &dead_topic,
        "--table",
        &table,
    ]);
    assert_eq!(code, Some(0), "{out}{err}");
    assert!(
        out.contains("0 dead letters replayed, 0 events written again"),
        "{out}"
    );
    let pending = listed(&["dead-letters", "list", "--topic", &dead_topic]);
    assert_eq!(pending.lines().count(), 1, "{pending}");
    assert!(pending.contains(&format!("{db}.b  insert")), "{pending}");
    let all = listed(&["dead-letters", "list", "--topic", &dead_topic, "--all"]);
    assert!(
        all.contains(&format!("{db}.a  insert key=2")) && all.contains("replayed"),
        "{all}"
    );
    assert_eq!(tb.count_documents(doc! {}).await.unwrap(), 1);
    converge(
        &src,
        &dst,
        &db,
        "a",
        Duration::from_secs(30),
        &mut [&mut cap, &mut app],
    )
    .await;
    stop_all(&mut [&mut cap, &mut app]).await;
    // (mongo-java-server drops a database holding a unique index with an error)
    tb.drop_index("email_1").await.unwrap();
    src.database(&db).drop().await.unwrap();
    dst.database(&db).drop().await.unwrap();
}
