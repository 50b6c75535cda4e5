//! The Kafka broker of the test bed, through the client settings both stages use: an
//! idempotent acks=all producer, a group consumer that stores offsets only when told, and the
//! contract's events and keys.

use std::time::Duration;

use prost::Message;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{CommitMode, Consumer, StreamConsumer};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::Message as _;
use sluice_common::KafkaConfig;
use sluice_proto::{event_key, v1, value, ChangeEvent, Op};
use sluice_tests::{kafka_brokers, unique};

fn config() -> KafkaConfig {
    KafkaConfig {
        brokers: kafka_brokers(),
        ..Default::default()
    }
}

async fn create_topic(name: &str, partitions: i32) {
    let admin: AdminClient<DefaultClientContext> =
        config().client_config("sluice-tests").create().unwrap();
    let res = admin
        .create_topics(
            &[NewTopic::new(name, partitions, TopicReplication::Fixed(1))],
            &AdminOptions::new().operation_timeout(Some(Duration::from_secs(10))),
        )
        .await
        .expect("create_topics request");
    for r in res {
        r.expect("topic created");
    }
}

fn event(id: u64, version: u64) -> ChangeEvent {
    ChangeEvent {
        contract: sluice_proto::CONTRACT_VERSION,
        op: Op::Insert as i32,
        database: "shop".into(),
        table: "orders".into(),
        version,
        key: Some(v1::Row {
            values: vec![value::uint(id)],
        }),
        after: Some(v1::Row {
            values: vec![
                value::uint(id),
                value::decimal(
                    "-99999999999999999999999999999999999.999999999999999999999999999999",
                ),
                value::bytes(vec![0u8, 1, 0, 255]),
            ],
        }),
        ..Default::default()
    }
}

#[tokio::test]
async fn events_round_trip_through_the_broker_in_key_order() {
    let topic = unique("sluice_t_kafka");
    create_topic(&topic, 3).await;

    let producer: FutureProducer = config().producer_config("sluice-tests").create().unwrap();
    // Ten versions of each of three rows.
    let mut sent = Vec::new();
    for version in 0..10u64 {
        for id in [1u64, 2, 3] {
            let ev = event(id, version);
            let key = event_key("shop", "orders", &[value::uint(id)]);
            let payload = ev.encode_to_vec();
            producer
                .send(
                    FutureRecord::to(&topic).key(&key).payload(&payload),
                    Duration::from_secs(10),
                )
                .await
                .map_err(|(e, _)| e)
                .expect("acknowledged");
            sent.push(ev);
        }
    }

    let group = unique("sluice_t_group");
    let consumer: StreamConsumer = config()
        .consumer_config("sluice-tests", &group)
        .create()
        .unwrap();
    consumer.subscribe(&[&topic]).unwrap();
    let mut got: Vec<(Vec<u8>, ChangeEvent)> = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while got.len() < sent.len() {
        let msg = tokio::time::timeout_at(deadline, consumer.recv())
            .await
            .expect("all events consumed within 60 s")
            .expect("consume");
        let ev = ChangeEvent::decode(msg.payload().unwrap()).expect("payload decodes");
        got.push((msg.key().unwrap().to_vec(), ev));
        consumer.store_offset_from_message(&msg).unwrap();
    }
    consumer.commit_consumer_state(CommitMode::Sync).unwrap();

    // Everything arrived, unchanged.
    let order = |e: &ChangeEvent| (e.version, e.key.clone().unwrap().encode_to_vec());
    let mut decoded: Vec<ChangeEvent> = got.iter().map(|(_, e)| e.clone()).collect();
    decoded.sort_by_key(order);
    let mut expected = sent.clone();
    expected.sort_by_key(order);
    assert_eq!(decoded, expected);
    // Per key, versions arrive in order (one key, one partition).
    for id in [1u64, 2, 3] {
        let key = event_key("shop", "orders", &[value::uint(id)]);
        let versions: Vec<u64> = got
            .iter()
            .filter(|(k, _)| *k == key)
            .map(|(_, e)| e.version)
            .collect();
        assert_eq!(
            versions,
            (0..10).collect::<Vec<_>>(),
            "row {id} out of order"
        );
    }
    // The committed offsets cover everything consumed.
    let committed = consumer
        .committed(Duration::from_secs(10))
        .expect("committed offsets");
    let total: i64 = committed
        .elements()
        .iter()
        .filter_map(|e| match e.offset() {
            rdkafka::Offset::Offset(o) => Some(o),
            _ => None, // a partition no key hashed to has no commit
        })
        .sum();
    assert_eq!(total, sent.len() as i64);
}

#[tokio::test]
async fn topics_are_not_created_by_producing() {
    // The test bed runs with auto.create.topics.enable=false: the capture stage must create
    // its topics (with the partitions it wants) itself.
    let topic = unique("sluice_t_absent");
    let producer: FutureProducer = config()
        .producer_config("sluice-tests")
        .set("message.timeout.ms", "5000")
        .create()
        .unwrap();
    let res = producer
        .send(
            FutureRecord::to(&topic).key("k").payload("v"),
            Duration::from_secs(10),
        )
        .await;
    assert!(res.is_err(), "producing to a missing topic succeeded");
    let topic_name = topic.clone();
    let md = tokio::task::spawn_blocking(move || {
        let c: rdkafka::consumer::BaseConsumer =
            config().client_config("sluice-tests").create().unwrap();
        c.fetch_metadata(None, Duration::from_secs(10)).unwrap()
    })
    .await
    .unwrap();
    assert!(
        md.topics()
            .iter()
            .all(|t| t.name() != topic_name || t.error().is_some()),
        "a topic was auto-created"
    );
}

/// The capture picks a key's partition itself (so that partitions added later do not move
/// keys): it must be the partition Kafka's default partitioner, librdkafka's
/// `murmur2_random` included, picks for that key.
#[tokio::test]
async fn the_capture_picks_the_partition_the_producer_would() {
    let topic = unique("sluice_t_keying");
    create_topic(&topic, 7).await;
    let producer: FutureProducer = config().producer_config("sluice-tests").create().unwrap();
    let keys: Vec<Vec<u8>> = (0..200u64)
        .map(|i| event_key("shop", "orders", &[value::uint(i * 7919)]))
        .chain((0..50).map(|i| format!("key-{i}").into_bytes()))
        .collect();
    for k in &keys {
        let delivered = producer
            .send(
                FutureRecord::to(&topic).key(k).payload("v"),
                Duration::from_secs(10),
            )
            .await
            .expect("delivered");
        let partition = delivered.partition;
        assert_eq!(
            partition,
            sluice_capture::publish::keying::partition_of(k, 7),
            "key {k:?}"
        );
    }
}

/// A read of the schema topic that does not reach its end in time is an error (the stage
/// retries, then stops, and reads the event again on restart), never "unknown schema" (which
/// would dead-letter the event); a read to the end finds the schema, and an id the whole topic
/// lacks is unknown.
#[tokio::test]
async fn a_schema_read_cut_short_is_an_error_never_an_unknown_schema() {
    let topic = unique("schemas");
    create_topic(&topic, 1).await;
    let producer: FutureProducer = config().producer_config("sluice-tests").create().unwrap();
    for id in 1..=300u64 {
        let record = v1::SchemaRecord {
            schema: Some(v1::TableSchema {
                schema_id: id,
                database: "db".into(),
                table: format!("t{id}"),
                ..Default::default()
            }),
            position: None,
        }
        .encode_to_vec();
        let key = format!("db.t{id}/{id}");
        producer
            .send(
                FutureRecord::to(&topic).key(&key).payload(&record),
                Duration::from_secs(10),
            )
            .await
            .unwrap();
    }
    use sluice_apply::schemas::SchemaCache;
    let mut slow = SchemaCache::new(&config(), &topic, "sluice-tests")
        .with_read_deadline(Duration::from_millis(1));
    match slow.get(300).await {
        Err(e) => assert!(e.to_string().contains("Timed out"), "{e}"),
        Ok(found) => panic!("a read cut short answered {found:?}"),
    }
    let mut cache = SchemaCache::new(&config(), &topic, "sluice-tests");
    let s = cache.get(300).await.unwrap().expect("schema 300");
    assert_eq!(s.table, "t300");
    assert_eq!(cache.get(301).await.unwrap(), None);
}

/// The compacted topics the stages make (schemas, checkpoints) roll a segment every hour, so
/// the broker compacts them: by its defaults (7 days, 1 GiB) a checkpoint topic written every
/// second keeps growing, and every capture's start reads it from the beginning.
#[tokio::test]
async fn compacted_topics_are_made_to_be_compacted_within_the_hour() {
    let topic = unique("compacted");
    let made = config()
        .ensure_topic("sluice-tests", &topic, 1, 1, true, None)
        .await
        .unwrap();
    assert!(made);
    let admin: AdminClient<DefaultClientContext> =
        config().client_config("sluice-tests").create().unwrap();
    let described = admin
        .describe_configs(
            &[rdkafka::admin::ResourceSpecifier::Topic(&topic)],
            &AdminOptions::new().request_timeout(Some(Duration::from_secs(10))),
        )
        .await
        .unwrap();
    let resource = described.into_iter().next().unwrap().unwrap();
    let value = |name: &str| {
        resource
            .get(name)
            .and_then(|e| e.value.clone())
            .unwrap_or_default()
    };
    assert_eq!(value("cleanup.policy"), "compact");
    assert_eq!(value("segment.ms"), "3600000");
    // Made again: nothing to do, and said so.
    let again = config()
        .ensure_topic("sluice-tests", &topic, 1, 1, true, None)
        .await
        .unwrap();
    assert!(!again);
}
