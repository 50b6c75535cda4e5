//! What Kafka's client alone costs per record: the floor under each stage's per-core figure.
//!
//! After a benchmark's stages have run, its topics hold every event they carried. These steps
//! read them again, in this process, with the appliers' consumer settings and nothing done per
//! record but what any consumer must do (take the payload, the key, the incarnation header,
//! the topic, partition and offset), three ways:
//!
//! - `stream`: the rdkafka crate's `StreamConsumer::recv`, as the appliers consume;
//! - `poll`: `BaseConsumer::poll`, one message per call, no async runtime in the way;
//! - `batch`: librdkafka's `rd_kafka_consume_batch_queue`, up to 1000 messages per call (no
//!   safe wrapper in the crate; this is what "consuming in batches" would save);
//!
//! then `decode`: each record's event read where it lies as the appliers read it
//! (`sluice_proto::view`: the event, every value of its row image, a MongoDB change's parts),
//! the least any applier does with an event of this contract; then `produce`: the same records (the first 100 000, cycled) sent to a fresh topic of as many
//! partitions with the captures' producer settings (idempotent, LZ4, `linger.ms` 5, one
//! header), counting delivery reports as the captures' ledger does.
//!
//! Each step's CPU is this process's user + system time over the step (`getrusage`,
//! librdkafka's threads included), so nothing else may run in the process meanwhile. Records per CPU second of a
//! step is a bound no stage doing that step can pass; against a goal of G records per CPU
//! second, a stage has 1/G seconds per record, of which the step takes 1/rate.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer, StreamConsumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Header, Headers, Message, OwnedHeaders};
use rdkafka::producer::{BaseRecord, DeliveryResult, Producer, ProducerContext, ThreadedProducer};
use rdkafka::{ClientContext, Offset, TopicPartitionList};
use sluice_common::kafka::{KafkaConfig, INCARNATION_HEADER};

/// A record kept for the produce step: its partition, key, payload and incarnation header.
type Kept = (i32, Vec<u8>, Vec<u8>, Vec<u8>);

/// One step: records handled, wall and CPU seconds.
#[derive(Debug, Clone, Copy, Default)]
pub struct Step {
    pub records: u64,
    pub wall: f64,
    pub cpu: f64,
}

impl Step {
    pub fn per_cpu_second(&self) -> f64 {
        self.records as f64 / self.cpu.max(1e-6)
    }

    /// Microseconds of CPU per record.
    pub fn micros(&self) -> f64 {
        self.cpu * 1e6 / self.records.max(1) as f64
    }

    pub fn json(&self) -> serde_json::Value {
        serde_json::json!({
            "records": self.records,
            "wall_seconds": self.wall,
            "cpu_seconds": self.cpu,
            "records_per_cpu_second": self.per_cpu_second(),
            "cpu_micros_per_record": self.micros(),
        })
    }
}

#[derive(Debug, Clone, Copy, Default)]
pub struct Floor {
    pub stream: Step,
    pub poll: Step,
    pub batch: Step,
    pub decode: Step,
    pub produce: Step,
    /// The source read by its client library alone, where measured ([`oplog_read`]).
    pub source: Option<Step>,
    /// The target written by its client library alone, where measured ([`driver_insert`]).
    pub target: Option<Step>,
}

impl Floor {
    pub fn json(&self) -> serde_json::Value {
        serde_json::json!({
            "stream": self.stream.json(),
            "poll": self.poll.json(),
            "batch": self.batch.json(),
            "decode": self.decode.json(),
            "produce": self.produce.json(),
            "source_read": self.source.map(|s| s.json()),
            "target_write": self.target.map(|s| s.json()),
        })
    }

    /// Lines for a benchmark's printout.
    pub fn lines(&self, what: &str) -> String {
        let line = |name: &str, s: &Step| {
            format!(
                "  {name:<44} {:>9.0} records per CPU s, {:.2} µs each\n",
                s.per_cpu_second(),
                s.micros()
            )
        };
        let source = self.source.map_or(String::new(), |s| {
            format!(
                "The source's client alone:\n{}",
                line(&format!("the oplog read, {} entries", s.records), &s)
            )
        });
        let target = self.target.map_or(String::new(), |s| {
            format!(
                "The target's client alone:\n{}",
                line(&format!("insert_many, {} documents", s.records), &s)
            )
        });
        format!(
            "The client libraries alone, over the same {} records of {what}:\n{}{}{}{}{}{source}{target}",
            self.stream.records,
            line("consume, StreamConsumer::recv (the appliers)", &self.stream),
            line("consume, BaseConsumer::poll", &self.poll),
            line("consume, rd_kafka_consume_batch_queue", &self.batch),
            line("produce, the captures' settings", &self.produce),
            line("decode the events (sluice_proto::view)", &self.decode),
        )
    }
}

/// Measure the floor over the topics whose names begin with `prefix.`, which hold `records`
/// records between them (each step reads exactly that many).
pub async fn measure(brokers: &str, prefix: &str, records: u64) -> anyhow::Result<Floor> {
    let kafka = KafkaConfig {
        brokers: brokers.to_string(),
        ..Default::default()
    };
    let probe: BaseConsumer = kafka
        .consumer_config("bench-floor", &format!("{prefix}.floor"))
        .create()?;
    let metadata = probe.fetch_metadata(None, Duration::from_secs(10))?;
    let mut all = TopicPartitionList::new();
    let mut partitions = 0;
    for t in metadata.topics() {
        if t.name().starts_with(&format!("{prefix}.")) {
            for p in t.partitions() {
                all.add_partition_offset(t.name(), p.id(), Offset::Beginning)?;
                partitions = partitions.max(p.id() + 1);
            }
        }
    }
    drop(probe);
    anyhow::ensure!(all.count() > 0, "no topic begins with {prefix}.");
    let config =
        |step: &str| kafka.consumer_config("bench-floor", &format!("{prefix}.floor.{step}"));

    // StreamConsumer::recv, on this (multi-threaded) runtime, as the appliers do.
    let consumer: StreamConsumer = config("stream").create()?;
    consumer.assign(&all)?;
    let (stream, _) = timed(records, || async {
        let mut sum = 0usize;
        for n in 0..records {
            let m = tokio::time::timeout(IDLE, consumer.recv())
                .await
                .map_err(|_| too_few(n, records))??;
            sum = sum.wrapping_add(touch(&m));
        }
        Ok(sum)
    })
    .await?;
    drop(consumer);

    let consumer: BaseConsumer = config("poll").create()?;
    consumer.assign(&all)?;
    let (poll, _) = timed(records, || async {
        let mut sum = 0usize;
        let mut n = 0;
        let mut last = Instant::now();
        while n < records {
            match consumer.poll(Duration::from_millis(100)) {
                Some(m) => {
                    sum = sum.wrapping_add(touch(&m?));
                    n += 1;
                    last = Instant::now();
                }
                None if last.elapsed() > IDLE => return Err(too_few(n, records)),
                None => continue,
            }
        }
        Ok(sum)
    })
    .await?;
    drop(consumer);

    // Kept for the produce step: the first 100 000 records' partition, key, payload and header.
    let mut kept: Vec<Kept> = Vec::new();
    let consumer: BaseConsumer = config("batch").create()?;
    consumer.assign(&all)?;
    let (batch, _) = timed(records, || async {
        consume_batches(&consumer, records, &mut kept)
    })
    .await?;
    drop(consumer);

    anyhow::ensure!(!kept.is_empty(), "nothing was read");
    let (decode, _) = timed(records, || async {
        let mut sum = 0usize;
        for i in 0..records {
            sum = sum.wrapping_add(decode(&kept[i as usize % kept.len()].2)?);
        }
        Ok(sum)
    })
    .await?;
    let produce = produce(&kafka, prefix, partitions, &kept, records).await?;
    Ok(Floor {
        stream,
        poll,
        batch,
        decode,
        produce,
        source: None,
        target: None,
    })
}

/// `local.oplog.rs` from `from_secs` on, read with the official driver as capture-mongo reads it
/// (a cursor of `batch_size` entries, each entry where the cursor holds it, its `op`, `ns` and
/// `o` found): what the driver alone costs per entry. Reads to the end of the oplog.
pub async fn oplog_read(
    source: &mongodb::Client,
    from_secs: u32,
    batch_size: u32,
) -> anyhow::Result<Step> {
    use mongodb::bson::{doc, RawDocumentBuf, Timestamp};
    let oplog = source
        .database("local")
        .collection::<RawDocumentBuf>("oplog.rs");
    let from = Timestamp {
        time: from_secs,
        increment: 0,
    };
    let mut records = 0u64;
    let (mut step, _) = timed(0, || async {
        let opts = mongodb::options::FindOptions::builder()
            .batch_size(batch_size)
            .build();
        let mut cursor = oplog
            .find(doc! { "ts": { "$gte": from } })
            .with_options(opts)
            .await?;
        let mut sum = 0usize;
        while cursor.advance().await? {
            let raw = cursor.current();
            for field in raw.iter() {
                let (key, value) = field?;
                if matches!(key, "op" | "ns" | "o") {
                    sum = sum.wrapping_add(value.as_str().map_or(1, str::len));
                }
            }
            records += 1;
        }
        Ok(sum)
    })
    .await?;
    step.records = records;
    Ok(step)
}

/// How long a step waits for the next record before it gives up.
const IDLE: Duration = Duration::from_secs(30);

fn too_few(n: u64, records: u64) -> anyhow::Error {
    anyhow::anyhow!(
        "no record for {IDLE:?} after {n} of {records}: the topics hold fewer records than that"
    )
}

/// What every consumer does with a record: reads its payload, key, incarnation header and
/// coordinates.
fn touch<M: Message>(m: &M) -> usize {
    let header = m
        .headers()
        .and_then(|h| h.iter().find(|h| h.key == INCARNATION_HEADER))
        .and_then(|h| h.value)
        .map_or(0, <[u8]>::len);
    m.payload().map_or(0, <[u8]>::len)
        + m.key().map_or(0, <[u8]>::len)
        + header
        + m.topic().len()
        + m.partition() as usize
        + m.offset() as usize
}

/// `docs` inserted into `db.floor` of `target` with the official driver, `per_command`
/// documents per `insert_many` (apply-mongo's default batch of 5000 events spread over W2's 10
/// collections makes commands of about 500): what the driver alone costs per document.
pub async fn driver_insert(
    target: &mongodb::Client,
    db: &str,
    docs: &[mongodb::bson::RawDocumentBuf],
    per_command: usize,
) -> anyhow::Result<Step> {
    let coll = target
        .database(db)
        .collection::<mongodb::bson::RawDocumentBuf>("floor");
    let (step, _) = timed(docs.len() as u64, || async {
        for chunk in docs.chunks(per_command.max(1)) {
            coll.insert_many(chunk).await?;
        }
        Ok(0)
    })
    .await?;
    target.database(db).drop().await?;
    Ok(step)
}

/// An event read as the appliers read it: its fields, every value of its row image, a MongoDB
/// change's parts.
fn decode(payload: &[u8]) -> anyhow::Result<usize> {
    use sluice_proto::view;
    let e = view::RowEvent::parse(payload)?;
    let mut sum = e.database.len() + e.table.len() + e.version as usize;
    for v in view::values(e.after.or(e.before).unwrap_or_default()) {
        std::hint::black_box(&v?);
        sum = sum.wrapping_add(1);
    }
    if let Some(m) = e.mongo {
        let m = view::MongoChangeRef::parse(m)?;
        sum = sum.wrapping_add(m.full_document.len() + m.document_key.len());
    }
    Ok(sum)
}

/// User + system CPU seconds of this process so far, all threads, to the microsecond
/// (`getrusage`; /proc counts in 10 ms ticks, coarse for a step of a fraction of a second).
fn process_cpu() -> f64 {
    // SAFETY: getrusage fills the struct it is given.
    let u = unsafe {
        let mut u: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_SELF, &mut u);
        u
    };
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    secs(u.ru_utime) + secs(u.ru_stime)
}

/// Run `f`, which handles `records` records, and measure it.
async fn timed<F, Fut>(records: u64, f: F) -> anyhow::Result<(Step, usize)>
where
    F: FnOnce() -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<usize>>,
{
    let cpu0 = process_cpu();
    let t0 = Instant::now();
    let sum = f().await?;
    let step = Step {
        records,
        wall: t0.elapsed().as_secs_f64(),
        cpu: process_cpu() - cpu0,
    };
    Ok((step, std::hint::black_box(sum)))
}

/// `records` messages from the consumer's queue, up to 1000 per call of librdkafka's
/// `rd_kafka_consume_batch_queue`; keeps the first 100 000 in `kept`.
fn consume_batches(
    consumer: &BaseConsumer,
    records: u64,
    kept: &mut Vec<Kept>,
) -> anyhow::Result<usize> {
    use rdkafka::bindings as rd;
    const KEEP: usize = 100_000;
    let mut sum = 0usize;
    let mut n = 0u64;
    // SAFETY: the queue is the consumer's own, released before the consumer is dropped; each
    // message returned is read while it lives and destroyed once.
    let name = std::ffi::CString::new(INCARNATION_HEADER).expect("no NUL");
    unsafe {
        let queue = rd::rd_kafka_queue_get_consumer(consumer.client().native_ptr());
        let mut batch: Vec<*mut rd::rd_kafka_message_t> = vec![std::ptr::null_mut(); 1000];
        let mut last = Instant::now();
        while n < records {
            let want = (records - n).min(batch.len() as u64) as usize;
            let got = rd::rd_kafka_consume_batch_queue(queue, 100, batch.as_mut_ptr(), want);
            if got < 0 || (got == 0 && last.elapsed() > IDLE) {
                rd::rd_kafka_queue_destroy(queue);
                return Err(too_few(n, records));
            }
            if got > 0 {
                last = Instant::now();
            }
            for &m in &batch[..got as usize] {
                let msg = &*m;
                if msg.err == rd::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR {
                    let mut headers = std::ptr::null_mut();
                    let mut header = 0;
                    let mut value: *const std::ffi::c_void = std::ptr::null();
                    let mut size = 0usize;
                    if rd::rd_kafka_message_headers(m, &mut headers)
                        == rd::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR
                        && rd::rd_kafka_header_get_last(
                            headers,
                            name.as_ptr(),
                            &mut value,
                            &mut size,
                        ) == rd::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR
                    {
                        header = size;
                    }
                    let topic = std::ffi::CStr::from_ptr(rd::rd_kafka_topic_name(msg.rkt));
                    sum = sum
                        .wrapping_add(msg.len + msg.key_len + header + topic.to_bytes().len())
                        .wrapping_add(msg.partition as usize + msg.offset as usize);
                    if kept.len() < KEEP {
                        let bytes = |p: *const std::ffi::c_void, len: usize| {
                            if p.is_null() {
                                Vec::new()
                            } else {
                                std::slice::from_raw_parts(p as *const u8, len).to_vec()
                            }
                        };
                        kept.push((
                            msg.partition,
                            bytes(msg.key, msg.key_len),
                            bytes(msg.payload, msg.len),
                            bytes(value, size),
                        ));
                    }
                    n += 1;
                }
                rd::rd_kafka_message_destroy(m);
            }
        }
        rd::rd_kafka_queue_destroy(queue);
    }
    Ok(sum)
}

/// Delivery reports: records and bytes acknowledged.
#[derive(Default)]
struct Counting {
    records: AtomicU64,
    bytes: AtomicU64,
}

impl ClientContext for Counting {}

impl ProducerContext for Counting {
    type DeliveryOpaque = ();
    fn delivery(&self, result: &DeliveryResult<'_>, _: Self::DeliveryOpaque) {
        if let Ok(m) = result {
            let size = m.payload().map_or(0, <[u8]>::len) + m.key().map_or(0, <[u8]>::len);
            self.bytes.fetch_add(size as u64, Ordering::Release);
            self.records.fetch_add(1, Ordering::Release);
        }
    }
}

/// The captures' default `publish.max_in_flight_bytes`: bytes sent and not yet acknowledged.
const IN_FLIGHT_BYTES: u64 = 4 << 20;

/// `records` records, cycling through `kept`, to a fresh topic of `partitions` partitions.
async fn produce(
    kafka: &KafkaConfig,
    prefix: &str,
    partitions: i32,
    kept: &[Kept],
    records: u64,
) -> anyhow::Result<Step> {
    anyhow::ensure!(!kept.is_empty(), "nothing was read to produce again");
    let topic = format!("{prefix}_floor");
    let admin: rdkafka::admin::AdminClient<_> = kafka.client_config("bench-floor").create()?;
    let new = rdkafka::admin::NewTopic::new(
        &topic,
        partitions,
        rdkafka::admin::TopicReplication::Fixed(1),
    );
    admin
        .create_topics([&new], &rdkafka::admin::AdminOptions::new())
        .await?;
    drop(admin);
    let producer: ThreadedProducer<Counting> = kafka
        .producer_config("bench-floor")
        .create_with_context(Counting::default())?;
    let acked = producer.context();
    let (step, _) = timed(records, || async {
        let mut sent = 0u64;
        for i in 0..records {
            let (partition, key, payload, header) = &kept[i as usize % kept.len()];
            let headers = OwnedHeaders::new_with_capacity(1).insert(Header {
                key: INCARNATION_HEADER,
                value: Some(header.as_slice()),
            });
            let mut record = BaseRecord::to(&topic)
                .key(key.as_slice())
                .payload(payload.as_slice())
                .partition(*partition)
                .headers(headers);
            // (as the captures do: wait while too much is unacknowledged)
            sent += (key.len() + payload.len()) as u64;
            while sent - acked.bytes.load(Ordering::Acquire) > IN_FLIGHT_BYTES {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            loop {
                match producer.send(record) {
                    Ok(()) => break,
                    Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), r)) => {
                        record = r;
                        tokio::time::sleep(Duration::from_millis(1)).await;
                    }
                    Err((e, _)) => anyhow::bail!("producing to {topic}: {e}"),
                }
            }
        }
        while acked.records.load(Ordering::Acquire) < records {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        Ok(0)
    })
    .await?;
    producer.flush(Duration::from_secs(10))?;
    Ok(step)
}
