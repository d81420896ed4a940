//! Record shapes and timestamp limits through librdkafka: null keys, null
//! and empty values, headers with null values read back exactly;
//! CreateTime records outside message.timestamp.before/after.max.ms get
//! INVALID_TIMESTAMP; a LogAppendTime topic takes any timestamp and
//! replaces it.

use crate::common;

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Header, Headers, Message, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::Timestamp;

fn now_ms() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_millis() as i64
}

async fn create(addr: std::net::SocketAddr, name: &str, configs: &[(&str, &str)]) {
    let admin: AdminClient<DefaultClientContext> = common::client(addr).create().unwrap();
    let mut t = NewTopic::new(name, 1, TopicReplication::Fixed(1));
    for (k, v) in configs {
        t = t.set(k, v);
    }
    admin.create_topics([&t], &AdminOptions::new()).await.unwrap()[0].as_ref().unwrap();
}

type Read = (Option<Vec<u8>>, Option<Vec<u8>>, Vec<(String, Option<Vec<u8>>)>, Timestamp);

fn read_all(addr: std::net::SocketAddr, topic: &str, n: usize) -> Vec<Read> {
    common::read_exactly(addr, topic, &[0], n)
        .iter()
        .map(|m| {
            let headers = m.headers().map(|h| h.iter().map(|h| (h.key.to_owned(), h.value.map(<[u8]>::to_vec))).collect()).unwrap_or_default();
            (m.key().map(<[u8]>::to_vec), m.payload().map(<[u8]>::to_vec), headers, m.timestamp())
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn null_and_empty_keys_values_and_headers_read_back_exactly() {
    let dir = tempfile::tempdir().unwrap();
    let broker = common::start(common::args(dir.path())).await;
    let addr = broker.kafka_addr;
    create(addr, "shapes", &[]).await;
    let producer: FutureProducer = common::producer_config(addr, "all").create().unwrap();
    let t = Duration::from_secs(10);
    producer.send(FutureRecord::<[u8], [u8]>::to("shapes").partition(0).payload(&b"no key"[..]), t).await.unwrap();
    producer.send(FutureRecord::<[u8], [u8]>::to("shapes").partition(0).key(&b"no value"[..]), t).await.unwrap();
    producer.send(FutureRecord::<[u8], [u8]>::to("shapes").partition(0).key(&b""[..]).payload(&b""[..]), t).await.unwrap();
    let headers = OwnedHeaders::new().insert(Header { key: "null", value: None::<&[u8]> }).insert(Header { key: "empty", value: Some(&b""[..]) }).insert(Header { key: "some", value: Some(&b"v"[..]) });
    producer.send(FutureRecord::<[u8], [u8]>::to("shapes").partition(0).key(&b"k"[..]).payload(&b"v"[..]).headers(headers), t).await.unwrap();
    producer.send(FutureRecord::<[u8], [u8]>::to("shapes").partition(0), t).await.unwrap();

    let got = tokio::task::spawn_blocking(move || read_all(addr, "shapes", 5)).await.unwrap();
    let shape: Vec<_> = got.iter().map(|(k, v, h, _)| (k.clone(), v.clone(), h.clone())).collect();
    assert_eq!(
        shape,
        vec![
            (None, Some(b"no key".to_vec()), vec![]),
            (Some(b"no value".to_vec()), None, vec![]),
            (Some(vec![]), Some(vec![]), vec![]),
            (Some(b"k".to_vec()), Some(b"v".to_vec()), vec![("null".into(), None), ("empty".into(), Some(vec![])), ("some".into(), Some(b"v".to_vec()))]),
            (None, None, vec![]),
        ]
    );
    broker.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn timestamps_outside_the_topic_limits_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let broker = common::start(common::args(dir.path())).await;
    let addr = broker.kafka_addr;
    create(addr, "ts.strict", &[("message.timestamp.before.max.ms", "60000"), ("message.timestamp.after.max.ms", "60000")]).await;
    create(addr, "ts.default", &[]).await;
    create(addr, "ts.append", &[("message.timestamp.type", "LogAppendTime")]).await;
    let mut cfg = common::producer_config(addr, "all");
    cfg.set("message.timeout.ms", "10000");
    let producer: FutureProducer = cfg.create().unwrap();
    let send = |topic: &'static str, ts: i64| {
        let p = &producer;
        async move { p.send(FutureRecord::<(), [u8]>::to(topic).partition(0).payload(&b"x"[..]).timestamp(ts), Duration::from_secs(10)).await.map(|d| d.offset).map_err(|(e, _)| e) }
    };
    let invalid = |r: Result<i64, KafkaError>| matches!(r, Err(KafkaError::MessageProduction(RDKafkaErrorCode::InvalidTimestamp)));
    let now = now_ms();
    let hour = 3_600_000;

    assert_eq!(send("ts.strict", now).await.unwrap(), 0);
    assert!(invalid(send("ts.strict", now - hour).await), "an hour old, limit a minute");
    assert!(invalid(send("ts.strict", now + hour).await), "an hour ahead, limit a minute");
    // Defaults (Kafka 4): any age, at most an hour ahead.
    assert_eq!(send("ts.default", 1_000).await.unwrap(), 0);
    assert!(invalid(send("ts.default", now + 2 * hour).await), "two hours ahead");
    // LogAppendTime: the broker's clock replaces whatever was sent.
    assert_eq!(send("ts.append", 1_000).await.unwrap(), 0);
    assert_eq!(send("ts.append", now + 10 * hour).await.unwrap(), 1);
    drop(producer);

    let got = tokio::task::spawn_blocking(move || read_all(addr, "ts.append", 2)).await.unwrap();
    for (_, _, _, ts) in &got {
        match ts {
            Timestamp::LogAppendTime(t) => assert!((t - now).abs() < 60_000, "append time {t} near now {now}"),
            other => panic!("expected LogAppendTime, got {other:?}"),
        }
    }
    let strict = tokio::task::spawn_blocking(move || read_all(addr, "ts.strict", 1)).await.unwrap();
    assert_eq!(strict.len(), 1, "only the in-range record was stored");
    broker.shutdown().await;
}

/// KIP-467 through librdkafka: a null key on a compacted topic refuses
/// that record's batch (Kafka appends a batch whole or not at all); the
/// record is reported INVALID_RECORD, and the other partition's records
/// are written. On the wire, Produce v8+ names the record by its index in
/// the batch; v7 has only the code.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_null_key_on_a_compacted_topic_is_refused_record_by_record() {
    let dir = tempfile::tempdir().unwrap();
    let broker = common::start(common::args(dir.path())).await;
    let addr = broker.kafka_addr;
    let admin: AdminClient<DefaultClientContext> = common::client(addr).create().unwrap();
    let t = NewTopic::new("changelog", 2, TopicReplication::Fixed(1)).set("cleanup.policy", "compact");
    admin.create_topics([&t], &AdminOptions::new()).await.unwrap()[0].as_ref().unwrap();
    let mut cfg = common::producer_config(addr, "all");
    // One batch per partition, sent together.
    cfg.set("linger.ms", "500").set("message.timeout.ms", "10000");
    let producer: FutureProducer = cfg.create().unwrap();
    let t = Duration::from_secs(10);
    let sends = vec![
        producer.send_result(FutureRecord::<[u8], [u8]>::to("changelog").partition(0).key(&b"k0"[..]).payload(&b"a"[..])).unwrap(),
        producer.send_result(FutureRecord::<[u8], [u8]>::to("changelog").partition(0).payload(&b"no key"[..])).unwrap(),
        producer.send_result(FutureRecord::<[u8], [u8]>::to("changelog").partition(0).key(&b"k2"[..]).payload(&b"c"[..])).unwrap(),
        producer.send_result(FutureRecord::<[u8], [u8]>::to("changelog").partition(1).key(&b"k3"[..]).payload(&b"d"[..])).unwrap(),
        producer.send_result(FutureRecord::<[u8], [u8]>::to("changelog").partition(1).key(&b"k4"[..]).payload(&b"e"[..])).unwrap(),
    ];
    let mut outcomes = Vec::new();
    for s in sends {
        let r = tokio::time::timeout(t, s).await.expect("delivered").expect("not cancelled");
        outcomes.push(r.map(|d| (d.partition, d.offset)).map_err(|(e, _)| e));
    }
    let code = |r: &Result<(i32, i64), KafkaError>| match r {
        Err(KafkaError::MessageProduction(c)) => Some(*c),
        _ => None,
    };
    assert_eq!(code(&outcomes[1]), Some(RDKafkaErrorCode::InvalidRecord), "{outcomes:?}");
    // librdkafka 2.12 reports the batch mates of the refused record with
    // the partition's code too, though record_errors names record 1 alone
    // (checked on the wire below).
    assert!(code(&outcomes[0]).is_some() && code(&outcomes[2]).is_some(), "the batch is refused whole: {outcomes:?}");

    assert_eq!(outcomes[3].as_ref().ok(), Some(&(1, 0)));
    assert_eq!(outcomes[4].as_ref().ok(), Some(&(1, 1)));
    drop(producer);

    // On the wire: v9 names record 1; v7 carries the code alone.
    use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
    use kafka_protocol::messages::{ProduceRequest, ProduceResponse, TopicName};
    let records: Vec<kafka_protocol::records::Record> = [Some("k"), None, Some("k")]
        .iter()
        .enumerate()
        .map(|(i, k)| kafka_protocol::records::Record {
            transactional: false,
            control: false,
            delete_horizon: false,
            partition_leader_epoch: -1,
            producer_id: -1,
            producer_epoch: -1,
            timestamp_type: kafka_protocol::records::TimestampType::Creation,
            offset: i as i64,
            // Offsets and sequences in step keep the encoder to one batch.
            sequence: i as i32 - 1,
            timestamp: now_ms(),
            key: k.map(|k| bytes::Bytes::from(k.as_bytes().to_vec())),
            value: Some(bytes::Bytes::from_static(b"v")),
            headers: Default::default(),
        })
        .collect();
    let mut buf = bytes::BytesMut::new();
    kafka_protocol::records::RecordBatchEncoder::encode(&mut buf, &records, &kafka_protocol::records::RecordEncodeOptions { version: 2, compression: kafka_protocol::records::Compression::None }).unwrap();
    let batch = buf.freeze();
    let mut sock = tokio::net::TcpStream::connect(addr).await.unwrap();
    for version in [9i16, 7] {
        let req = ProduceRequest::default().with_acks(-1).with_timeout_ms(5000).with_transactional_id(None).with_topic_data(vec![TopicProduceData::default()
            .with_name(TopicName(kafka_protocol::protocol::StrBytes::from_static_str("changelog")))
            .with_partition_data(vec![PartitionProduceData::default().with_index(0).with_records(Some(batch.clone()))])]);
        let resp: ProduceResponse = common::call(&mut sock, 0, version, version as i32, &req).await;
        let p = &resp.responses[0].partition_responses[0];
        assert_eq!(p.error_code, 87, "INVALID_RECORD");
        if version >= 8 {
            assert_eq!(p.record_errors.iter().map(|e| e.batch_index).collect::<Vec<_>>(), [1], "{:?} {:?}", p.record_errors, p.error_message);
            assert!(p.error_message.as_ref().is_some_and(|m| m.contains("1 record errors")), "{:?}", p.error_message);
        }
    }
    let consumer: rdkafka::consumer::BaseConsumer = common::consumer_config(addr).create().unwrap();
    use rdkafka::consumer::Consumer;
    assert_eq!(consumer.fetch_watermarks("changelog", 0, t).unwrap(), (0, 0), "nothing of a refused batch is written");
    broker.shutdown().await;
}
