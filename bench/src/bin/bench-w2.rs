//! Benchmark of reference workload W2 (MongoDB -> MongoDB through Kafka), stage by stage.
//!
//!     deploy/testbed.sh start && cargo build --release --bins
//!     cargo run --release -p sluice-bench --bin bench-w2 -- [--snapshot] [DOCS] [--batch B] [--every-ms T] [--seconds S]
//!
//! With `--snapshot`, step 2 copies the collections' contents instead of catching up with the
//! oplog (`[snapshot] mode = "snapshot+stream"`), measured until every document is published;
//! writes `target/bench/w2-snapshot.json`.
//!
//! 1. Writes DOCS (default 200 000) documents of 7 fields (about 140 bytes) into 10 collections
//!    of the source, then a mix of updates ($set of one field) and deletes on a tenth of them,
//!    the pipeline stopped.
//! 2. Capture catch-up: starts the release `capture-mongo` (oplog mode) at the time before them
//!    and measures until Kafka acknowledged every event.
//! 3. Apply drain: with the whole backlog in Kafka, starts the release `apply-mongo` and
//!    measures until MongoDB acknowledged every write.
//! 4. Checks the result: every target collection equals its source collection (count and an
//!    order-independent hash of the documents), so a fast wrong run cannot report.
//!
//! 5. Sustained end to end (not with `--snapshot`): both stages running, one writer per
//!    collection inserting `--batch B` documents (default 100) every `--every-ms T` ms (default
//!    100) for `--seconds S` (default 10), i.e. 10 000 documents/s offered (mongo-java-server
//!    keeps everything in its heap and falls behind at higher rates here); each batch's latency
//!    runs from the source acknowledging its insert to the target counting its documents
//!    (polled every 20 ms): p50, p99, max, and the rate achieved.
//! 6. The floor (not with `--snapshot`; `sluice_bench::floor`): the same records consumed,
//!    decoded and produced again by Kafka's client alone, the oplog read and the documents
//!    inserted (`insert_many`, 500 each) by the MongoDB driver alone, CPU per record of each.
//!
//! For each stage: wall time, events/s, CPU seconds of the process, events per CPU second and
//! peak resident memory. Prints a table and writes `target/bench/w2.json`.

use std::time::{Duration, Instant};

use futures::StreamExt;
use mongodb::bson::raw::RawDocumentBuf;
use mongodb::bson::{doc, Document};
use sluice_bench::measure::{measure, num_cores, spawn_stage, stop_child, Stage};
use sluice_tests::{kafka_brokers, mongo_source_url, mongo_target_url, unique};

const COLLECTIONS: usize = 10;
const CITIES: [&str; 4] = ["Lisbon", "Oslo", "Lima", "Pune"];

/// A W2 document: 7 fields, about 140 bytes of BSON.
fn w2_doc(i: i64) -> Document {
    doc! {
        "_id": i,
        "name": format!("user-{i:08}"),
        "email": format!("u{i:08}@example.com"),
        "age": (i % 90) as i32,
        "score": i as f64 * 0.5,
        "active": i % 3 == 0,
        "city": CITIES[(i % 4) as usize],
    }
}

/// Documents and an order-independent hash of their bytes.
async fn digest(c: &mongodb::Client, db: &str, coll: &str) -> (u64, u64) {
    let mut cur = c
        .database(db)
        .collection::<RawDocumentBuf>(coll)
        .find(doc! {})
        .await
        .unwrap();
    let (mut n, mut h) = (0u64, 0u64);
    while let Some(d) = cur.next().await {
        let d = d.unwrap();
        let mut x: u64 = 0xcbf2_9ce4_8422_2325;
        for b in d.as_bytes() {
            x ^= u64::from(*b);
            x = x.wrapping_mul(0x0000_0100_0000_01b3);
        }
        n += 1;
        h = h.wrapping_add(x);
    }
    (n, h)
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    // As the stages do: the Kafka floor step runs in this process (sluice_bench::floor).
    sluice_common::keep_memory_small();
    let args = sluice_bench::measure::Args::from_env(
        "bench-w2 [--snapshot] [DOCS] [--batch B] [--every-ms T] [--seconds S]",
        &["--batch", "--every-ms", "--seconds"],
        &["--snapshot"],
        true,
    );
    let snapshot = args.switch("--snapshot");
    let docs: i64 = args
        .first_bare()
        .map(|a| a.parse())
        .transpose()?
        .unwrap_or(200_000);
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let release = sluice_bench::measure::release_dir(&["capture-mongo", "apply-mongo"])?;
    let src = mongodb::Client::with_uri_str(mongo_source_url()).await?;
    let dst = mongodb::Client::with_uri_str(mongo_target_url()).await?;
    let db = unique("w2");
    // The oplog must reach back before the start time (a fresh server's begins at its first
    // write): one write elsewhere first.
    src.database("w2_marker")
        .collection::<Document>("m")
        .insert_one(doc! {})
        .await?;
    let start_secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_secs();
    tokio::time::sleep(Duration::from_millis(1100)).await;

    // 1. The workload, pipeline stopped.
    let t = Instant::now();
    let per = docs / COLLECTIONS as i64;
    let mut events: u64 = 0;
    for c in 0..COLLECTIONS {
        let coll = src.database(&db).collection::<Document>(&format!("c{c}"));
        for chunk in (0..per).collect::<Vec<_>>().chunks(1000) {
            coll.insert_many(chunk.iter().map(|i| w2_doc(*i))).await?;
            events += chunk.len() as u64;
        }
        for i in (0..per).step_by(10) {
            coll.update_one(doc! { "_id": i }, doc! { "$set": { "score": -1.0 } })
                .await?;
            events += 1;
        }
        for i in (5..per).step_by(20) {
            coll.delete_one(doc! { "_id": i }).await?;
            events += 1;
        }
    }
    println!(
        "wrote {events} changes ({docs} inserts, updates, deletes) in {:.1} s",
        t.elapsed().as_secs_f64()
    );

    // 2. Capture catch-up (or snapshot: the documents left, one event each).
    let prefix = unique("w2cdc");
    let (start, extra, counter, name) = if snapshot {
        let mut left = 0;
        for c in 0..COLLECTIONS {
            left += src
                .database(&db)
                .collection::<Document>(&format!("c{c}"))
                .count_documents(doc! {})
                .await?;
        }
        events = left;
        (
            "now".to_string(),
            "[snapshot]\nmode = \"snapshot+stream\"\nchunk_rows = 10000\n",
            "sluice_capture_snapshot_rows_total",
            "capture-mongo (snapshot)",
        )
    } else {
        (
            format!("time:{}", start_secs + 1),
            "",
            "sluice_capture_events_total",
            "capture-mongo",
        )
    };
    let capture_config = format!(
        "connector = \"{}\"\n[mongodb]\nuri = \"{}\"\nmode = \"oplog\"\nstart = \"{start}\"\nbatch_size = 10000\n\
         [filter]\ninclude = [\"{db}\\\\..*\"]\n[topics]\nprefix = \"{prefix}\"\n\
         [publish]\npartitions = 3\nreplication_factor = 1\n[kafka]\nbrokers = \"{}\"\n{extra}",
        unique("w2conn"),
        mongo_source_url(),
        kafka_brokers()
    );
    let (capture, cap_child) = measure(
        name,
        &release.join("capture-mongo"),
        capture_config,
        counter,
        events,
    )
    .await?;
    // Every event acknowledged: the checkpoint count moves after the last delivery.
    stop_child(cap_child);

    // 3. Apply drain.
    let apply_config = format!(
        "[mongodb]\nuri = \"{}\"\nmeta_database = \"{}\"\n[consumer]\ngroup_id = \"{}\"\n\
         topics = [\"^{}\\\\..*\"]\n[kafka]\nbrokers = \"{}\"\n",
        mongo_target_url(),
        unique("w2meta"),
        unique("w2g"),
        prefix,
        kafka_brokers(),
    );
    // Extra apply-mongo TOML, for experiments (e.g. consumer properties).
    let apply_config = sluice_bench::measure::with_extra(apply_config, "BENCH_APPLY_EXTRA")?;
    let (apply, app_child) = measure(
        "apply-mongo",
        &release.join("apply-mongo"),
        apply_config,
        "sluice_apply_writes_total",
        events,
    )
    .await?;
    stop_child(app_child);

    // 4. Check.
    for c in 0..COLLECTIONS {
        let name = format!("c{c}");
        let (a, b) = (
            digest(&src, &db, &name).await,
            digest(&dst, &db, &name).await,
        );
        anyhow::ensure!(a == b, "{db}.{name}: source {a:?} != target {b:?}");
    }
    println!("check: all {COLLECTIONS} target collections equal their sources (count and hash)");

    // 5. Sustained end to end (not with --snapshot).
    let e2e = if snapshot {
        None
    } else {
        let (batch, every_ms, seconds) = (
            args.option("--batch", 100)?,
            args.option("--every-ms", 100)?,
            args.option("--seconds", 10)?,
        );
        anyhow::ensure!(batch > 0 && every_ms > 0, "--batch and --every-ms above 0");
        eprintln!(
            "5/5 sustained: {COLLECTIONS} collections x {batch} documents every {every_ms} ms for {seconds} s ..."
        );
        Some(sustained(&release, &src, &dst, batch, every_ms, seconds).await?)
    };

    // 6. Kafka's client and the driver alone over the same records (not with --snapshot: the
    // floor of the streaming stages). Last: the documents it inserts fill mongo-java-server's
    // heap, which slows it down (not during the sustained step).
    let floor = if snapshot {
        None
    } else {
        eprintln!("6 Kafka's client alone over the same {events} records ...");
        let mut floor = sluice_bench::floor::measure(&kafka_brokers(), &prefix, events).await?;
        floor.source =
            Some(sluice_bench::floor::oplog_read(&src, start_secs as u32 + 1, 10_000).await?);
        let docs: Vec<mongodb::bson::RawDocumentBuf> = (0..docs)
            .map(|i| mongodb::bson::RawDocumentBuf::from_document(&w2_doc(i)))
            .collect::<Result<_, _>>()?;
        floor.target = Some(
            sluice_bench::floor::driver_insert(&dst, &format!("{db}_floor"), &docs, 500).await?,
        );
        Some(floor)
    };

    let cores = num_cores();
    let machine = sluice_bench::measure::machine();
    let version = |c: mongodb::Client| async move {
        c.database("admin")
            .run_command(doc! { "buildInfo": 1 })
            .await
            .ok()
            .and_then(|r| r.get_str("version").ok().map(str::to_string))
            .unwrap_or_default()
    };
    let (src_version, dst_version) = (version(src.clone()).await, version(dst.clone()).await);
    println!(
        "\nMachine: {} cores ({}), {:.1} GiB; source MongoDB-protocol server {src_version}, \
         target {dst_version}, Kafka at {}; every server on the same machine",
        machine.cores,
        machine.cpu,
        machine.memory_gib,
        kafka_brokers()
    );
    println!("\nW2, {events} changes, {cores} cores\n");
    println!("| stage | wall s | events/s | CPU s | events per CPU s | peak RSS MiB |");
    println!("|---|---|---|---|---|---|");
    let mut json = Vec::new();
    for s in [&capture, &apply] {
        let Stage {
            name,
            wall,
            cpu,
            rss,
        } = s;
        println!(
            "| {name} | {wall:.1} | {:.0} | {cpu:.2} | {:.0} | {:.0} |",
            events as f64 / wall,
            events as f64 / cpu.max(0.01),
            rss / 1048576.0
        );
        json.push(format!(
            "{{\"stage\":\"{name}\",\"events\":{events},\"wall_s\":{wall:.3},\"cpu_s\":{cpu:.3},\"peak_rss_bytes\":{rss:.0}}}"
        ));
    }
    if let Some(f) = &floor {
        print!("\n{}", f.lines("W2's events"));
        json.push(serde_json::json!({"stage": "kafka_floor", "floor": f.json()}).to_string());
    }
    if let Some(e) = &e2e {
        println!(
            "\nSustained end to end ({COLLECTIONS} collections x {} documents every {} ms): {} \
             documents/s offered for {} s ({} documents): achieved {:.0}/s; latency insert \
             acknowledged -> counted in the target p50 {:.3} s, p99 {:.3} s, max {:.3} s; CPU \
             capture {:.1} s, apply {:.1} s; peak RSS capture {:.0} MiB, apply {:.0} MiB",
            e.batch,
            e.every_ms,
            e.offered,
            e.seconds,
            e.docs,
            e.achieved,
            e.p50,
            e.p99,
            e.max,
            e.capture_cpu,
            e.apply_cpu,
            e.capture_rss / 1048576.0,
            e.apply_rss / 1048576.0
        );
        json.push(format!(
            "{{\"stage\":\"sustained\",\"offered_per_second\":{},\"seconds\":{},\"documents\":{},\
             \"achieved_per_second\":{:.1},\"latency_p50_s\":{:.4},\"latency_p99_s\":{:.4},\
             \"latency_max_s\":{:.4},\"capture_cpu_s\":{:.3},\"apply_cpu_s\":{:.3},\
             \"capture_peak_rss_bytes\":{:.0},\"apply_peak_rss_bytes\":{:.0}}}",
            e.offered,
            e.seconds,
            e.docs,
            e.achieved,
            e.p50,
            e.p99,
            e.max,
            e.capture_cpu,
            e.apply_cpu,
            e.capture_rss,
            e.apply_rss
        ));
    }
    let both_cpu = capture.cpu + apply.cpu;
    sluice_bench::measure::print_comparison(
        "Beside the report (D2T real-time sync, W2: 40-core Xeon, replica sets)",
        &[
            (
                "throughput, events/s",
                "72 000 – 120 000".into(),
                format!(
                    "catch-up {:.0}, drain {:.0} (each alone; the servers set the wall time here)",
                    events as f64 / capture.wall,
                    events as f64 / apply.wall
                ),
            ),
            (
                "events per CPU second of the sync process(es)",
                "20 000 – 50 000 (at 240 – 360 % CPU)".into(),
                format!(
                    "{:.0} for both stages (capture {:.0}, apply {:.0})",
                    events as f64 / both_cpu,
                    events as f64 / capture.cpu.max(0.01),
                    events as f64 / apply.cpu.max(0.01)
                ),
            ),
            (
                "memory",
                "8 – 15.7 GB".into(),
                format!(
                    "capture {:.0} MiB + apply {:.0} MiB (peaks)",
                    capture.rss / 1048576.0,
                    apply.rss / 1048576.0
                ),
            ),
        ],
    );
    json.push(format!(
        "{{\"machine\":{},\"servers\":{{\"source\":\"{src_version}\",\"target\":\"{dst_version}\"}},\
         \"reference\":{{\"report\":\"D2T\",\"events_per_second\":[72000,120000],\"events_per_cpu_second\":[20000,50000],\"memory_bytes\":[8e9,15.7e9]}}}}",
        machine.json()
    ));
    let out = root.join("target/bench");
    std::fs::create_dir_all(&out)?;
    let file = if snapshot {
        "w2-snapshot.json"
    } else {
        "w2.json"
    };
    std::fs::write(out.join(file), format!("[{}]\n", json.join(",")))?;
    src.database(&db).drop().await?;
    dst.database(&db).drop().await?;
    Ok(())
}

struct Sustained {
    batch: u64,
    every_ms: u64,
    seconds: u64,
    offered: u64,
    docs: u64,
    achieved: f64,
    p50: f64,
    p99: f64,
    max: f64,
    capture_cpu: f64,
    apply_cpu: f64,
    capture_rss: f64,
    apply_rss: f64,
}

/// Both stages running: one writer per collection inserting `batch` W2 documents every
/// `every_ms` ms for `seconds`; a batch's latency runs from the source acknowledging its
/// insert to the target counting its documents (every collection counted every 20 ms).
async fn sustained(
    release: &std::path::Path,
    src: &mongodb::Client,
    dst: &mongodb::Client,
    batch: u64,
    every_ms: u64,
    seconds: u64,
) -> anyhow::Result<Sustained> {
    let db = unique("w2e2e");
    let prefix = unique("w2e2ecdc");
    // The oplog must reach back before the capture's start: one write first.
    src.database(&db)
        .collection::<Document>("warm")
        .insert_one(doc! {})
        .await?;
    let (capture, _, _cf) = spawn_stage(
        &release.join("capture-mongo"),
        &format!(
            "connector = \"{}\"\n[mongodb]\nuri = \"{}\"\nmode = \"oplog\"\nmax_await_ms = 100\n\
             [filter]\ninclude = [\"{db}\\\\..*\"]\n[topics]\nprefix = \"{prefix}\"\n\
             [publish]\npartitions = 3\nreplication_factor = 1\n[kafka]\nbrokers = \"{}\"\n",
            unique("w2e2econn"),
            mongo_source_url(),
            kafka_brokers()
        ),
    )?;
    let (apply, _, _af) = spawn_stage(
        &release.join("apply-mongo"),
        &format!(
            "[mongodb]\nuri = \"{}\"\nmeta_database = \"{}\"\n[consumer]\ngroup_id = \"{}\"\n\
             topics = [\"^{prefix}\\\\..*\"]\n[batch]\nmax_wait_ms = 100\n[kafka]\nbrokers = \"{}\"\n",
            mongo_target_url(),
            unique("w2e2emeta"),
            unique("w2e2eg"),
            kafka_brokers()
        ),
    )?;
    let counts = |dst: mongodb::Client, db: String| async move {
        let mut out = vec![0u64; COLLECTIONS];
        for (c, n) in out.iter_mut().enumerate() {
            *n = dst
                .database(&db)
                .collection::<Document>(&format!("c{c}"))
                .estimated_document_count()
                .await
                .unwrap_or(0);
        }
        out
    };
    // Warm-up: one document per collection through the whole pipeline.
    tokio::time::sleep(Duration::from_secs(2)).await;
    for c in 0..COLLECTIONS {
        src.database(&db)
            .collection::<Document>(&format!("c{c}"))
            .insert_one(w2_doc(1_000_000_000))
            .await?;
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    while counts(dst.clone(), db.clone()).await.iter().any(|n| *n < 1) {
        anyhow::ensure!(Instant::now() < deadline, "warm-up documents never arrived");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let watcher = {
        let (dst, db, stop) = (dst.clone(), db.clone(), stop.clone());
        tokio::spawn(async move {
            let mut seen = Vec::new();
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let n = counts(dst.clone(), db.clone()).await;
                seen.push((Instant::now(), n));
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            seen
        })
    };
    let batches = seconds * 1000 / every_ms;
    let started = Instant::now();
    let mut writers = Vec::new();
    for c in 0..COLLECTIONS {
        let coll = src.database(&db).collection::<Document>(&format!("c{c}"));
        writers.push(tokio::spawn(async move {
            let mut ticker = tokio::time::interval(Duration::from_millis(every_ms));
            ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
            let mut acked = Vec::with_capacity(batches as usize);
            for k in 0..batches {
                ticker.tick().await;
                let from = (k * batch) as i64;
                coll.insert_many((from..from + batch as i64).map(w2_doc))
                    .await?;
                acked.push(Instant::now());
            }
            anyhow::Ok(acked)
        }));
    }
    let acked = sluice_bench::measure::join_writers(writers).await?;
    let want = 1 + batches * batch;
    let deadline = Instant::now() + Duration::from_secs(180);
    while counts(dst.clone(), db.clone())
        .await
        .iter()
        .any(|n| *n < want)
    {
        anyhow::ensure!(Instant::now() < deadline, "the pipeline never caught up");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_millis(50)).await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let seen = watcher.await?;
    let l = sluice_bench::measure::latencies(&acked, &seen, batch);
    let docs = batches * batch * COLLECTIONS as u64;
    let [(capture_cpu, capture_rss), (apply_cpu, apply_rss)] =
        sluice_bench::measure::usage_and_stop(capture, apply)?;
    let result = Sustained {
        batch,
        every_ms,
        seconds,
        offered: COLLECTIONS as u64 * batch * 1000 / every_ms,
        docs,
        achieved: docs as f64 / l.all_visible.duration_since(started).as_secs_f64(),
        p50: l.p50,
        p99: l.p99,
        max: l.max,
        capture_cpu,
        apply_cpu,
        capture_rss,
        apply_rss,
    };
    src.database(&db).drop().await?;
    dst.database(&db).drop().await?;
    Ok(result)
}
