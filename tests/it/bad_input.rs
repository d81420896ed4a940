//! Bad input against the running broker. Each case gets the error a Kafka
//! client expects, or a closed connection — never a panic — and a second
//! client on another connection keeps working throughout.

use crate::common::{self, encode, Raw};

use std::net::SocketAddr;
use std::time::Duration;

use bytes::{BufMut, Bytes};
use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
use kafka_protocol::messages::{
    ApiVersionsResponse, MetadataRequest, MetadataResponse, ProduceRequest, ProduceResponse, TopicName,
};
use kafka_protocol::messages::metadata_request::MetadataRequestTopic;
use kafka_protocol::protocol::{Decodable, StrBytes};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::producer::{FutureProducer, FutureRecord};

fn batch(values: &[&[u8]]) -> Bytes {
    common::record_batch(values)
}

fn produce_body(topic: &str, records: Bytes, version: i16) -> Vec<u8> {
    let req = ProduceRequest::default().with_acks(-1).with_timeout_ms(5000).with_topic_data(vec![TopicProduceData::default()
        .with_name(TopicName(StrBytes::from_string(topic.to_owned())))
        .with_partition_data(vec![PartitionProduceData::default().with_index(0).with_records(Some(records))])]);
    encode(&req, version)
}

async fn produce_error(raw: &mut Raw, topic: &str, records: Bytes) -> i16 {
    let v = 9;
    let mut resp = raw.call(0, v, &produce_body(topic, records, v), true).await.expect("produce answered");
    let r = ProduceResponse::decode(&mut resp, v).unwrap();
    r.responses[0].partition_responses[0].error_code
}

async fn metadata_error(raw: &mut Raw, topic: &str) -> i16 {
    let v = 12;
    let req = MetadataRequest::default()
        .with_topics(Some(vec![MetadataRequestTopic::default().with_name(Some(TopicName(StrBytes::from_string(topic.to_owned()))))]))
        .with_allow_auto_topic_creation(true);
    let mut resp = raw.call(3, v, &encode(&req, v), true).await.expect("metadata answered");
    MetadataResponse::decode(&mut resp, v).unwrap().topics[0].error_code
}

/// Both bystanders still work: the long-lived raw connection answers
/// ApiVersions, and a fresh librdkafka client produces and reads offsets.
async fn check(steady: &mut Raw, addr: SocketAddr) {
    let mut resp = steady.call(18, 3, &[1, 1, 0], false).await.expect("steady connection still answers");
    assert_eq!(ApiVersionsResponse::decode(&mut resp, 3).unwrap().error_code, 0);
    bystander_works(addr, steady.next_id as usize).await;
}

/// The second client: a real librdkafka round trip.
async fn bystander_works(addr: SocketAddr, i: usize) {
    let producer: FutureProducer = common::producer_config(addr, "all").create().unwrap();
    let key = format!("bystander-{i}");
    let d = producer.send(FutureRecord::to("bystander").partition(0).key(&key).payload("ok"), Duration::from_secs(30)).await.expect("bystander produce");
    assert_eq!(d.partition, 0);
    let off = d.offset;
    let consumer: BaseConsumer = common::consumer_config(addr).create().unwrap();
    let (_, high) = tokio::task::spawn_blocking(move || consumer.fetch_watermarks("bystander", 0, Duration::from_secs(30)).unwrap()).await.unwrap();
    assert_eq!(high, off + 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_is_answered_or_closed_and_nothing_else_is_disturbed() {
    let dir = tempfile::tempdir().unwrap();
    let mut args = common::args(dir.path());
    args.auto_create_topics = Some(false);
    args.max_request_bytes = Some(64 * 1024);
    let broker = common::start(args).await;
    let addr = broker.kafka_addr;
    broker.engine.create_topic("bystander", 1, Default::default(), false).unwrap();
    let mut small = std::collections::BTreeMap::new();
    small.insert("max.message.bytes".to_string(), "2048".to_string());
    broker.engine.create_topic("small.messages", 1, small, false).unwrap();

    // A long-lived raw connection that must survive everything below.
    let mut steady = Raw::connect(addr).await;
    check(&mut steady, addr).await;

    // 1. Frame length over max_request_bytes: closed before the body is read.
    let mut c = Raw::connect(addr).await;
    c.send_bytes(&(1_000_000i32).to_be_bytes()).await;
    assert!(c.closed().await, "oversized frame");
    check(&mut steady, addr).await;

    // 2. Negative length.
    let mut c = Raw::connect(addr).await;
    c.send_bytes(&(-7i32).to_be_bytes()).await;
    assert!(c.closed().await, "negative length");
    check(&mut steady, addr).await;

    // 3. Garbage bytes.
    let mut c = Raw::connect(addr).await;
    let mut g = vec![0u8, 0, 0, 40];
    g.extend((0..40u8).map(|i| i.wrapping_mul(97).wrapping_add(0xa5)));
    c.send_bytes(&g).await;
    assert!(c.closed().await, "garbage");
    check(&mut steady, addr).await;

    // 4a. Truncated request body: a Metadata frame whose body stops short.
    let mut c = Raw::connect(addr).await;
    let body = encode(&MetadataRequest::default().with_topics(Some(vec![MetadataRequestTopic::default().with_name(Some(TopicName(StrBytes::from_static_str("abc"))))])), 4);
    c.send_bytes(&Raw::frame(3, 4, 1, &body[..body.len() - 3])).await;
    assert!(c.closed().await, "truncated body");
    // 4b. Truncated frame: the length promises more than ever arrives.
    let mut c = Raw::connect(addr).await;
    let full = Raw::frame(3, 4, 1, &body);
    c.send_bytes(&full[..full.len() / 2]).await;
    drop(c);
    check(&mut steady, addr).await;

    // 5. Unknown API key.
    let mut c = Raw::connect(addr).await;
    c.send_bytes(&Raw::frame(999, 0, 1, &[])).await;
    assert!(c.closed().await, "unknown api key");
    check(&mut steady, addr).await;

    // 6. Unsupported versions: ApiVersions answers v0 with error 35 and our
    // ranges; other APIs close.
    let mut c = Raw::connect(addr).await;
    let mut resp = c.call(18, 99, &[], false).await.expect("ApiVersions v99 answered");
    let av = ApiVersionsResponse::decode(&mut resp, 0).unwrap();
    assert_eq!(av.error_code, 35);
    assert!(av.api_keys.iter().any(|k| k.api_key == 1 && k.min_version == 4 && k.max_version == 18));
    c.send_bytes(&Raw::frame(1, 2, 9, &[0; 16])).await;
    assert!(c.closed().await, "Fetch v2 is not served");
    check(&mut steady, addr).await;

    // 7. A batch with a bad CRC: CORRUPT_MESSAGE, nothing appended.
    let mut b = batch(&[b"hello", b"world"]).to_vec();
    let last = b.len() - 1;
    b[last] ^= 0xff;
    assert_eq!(produce_error(&mut steady, "bystander", Bytes::from(b)).await, 2);
    // A torn batch (length says more than present) is corrupt too.
    let b = batch(&[b"hello"]);
    assert_eq!(produce_error(&mut steady, "bystander", b.slice(..b.len() - 4)).await, 2);
    check(&mut steady, addr).await;

    // 8. A batch over the topic's max.message.bytes: MESSAGE_TOO_LARGE.
    let big = vec![b'x'; 4096];
    assert_eq!(produce_error(&mut steady, "small.messages", batch(&[&big])).await, 10);
    assert_eq!(produce_error(&mut steady, "small.messages", batch(&[b"fits"])).await, 0);
    check(&mut steady, addr).await;

    // 9. Unknown topic with auto-create off: UNKNOWN_TOPIC_OR_PARTITION.
    assert_eq!(produce_error(&mut steady, "no.such.topic", batch(&[b"x"])).await, 3);
    assert_eq!(metadata_error(&mut steady, "no.such.topic").await, 3);
    // Unknown partition of a known topic.
    {
        let v = 9;
        let req = ProduceRequest::default().with_acks(1).with_timeout_ms(5000).with_topic_data(vec![TopicProduceData::default()
            .with_name(TopicName(StrBytes::from_static_str("bystander")))
            .with_partition_data(vec![PartitionProduceData::default().with_index(7).with_records(Some(batch(&[b"x"])))])]);
        let mut resp = steady.call(0, v, &encode(&req, v), true).await.unwrap();
        assert_eq!(ProduceResponse::decode(&mut resp, v).unwrap().responses[0].partition_responses[0].error_code, 3);
    }
    // acks outside 0, 1, -1: INVALID_REQUIRED_ACKS.
    {
        let v = 9;
        let req = ProduceRequest::default().with_acks(2).with_timeout_ms(5000).with_topic_data(vec![TopicProduceData::default()
            .with_name(TopicName(StrBytes::from_static_str("bystander")))
            .with_partition_data(vec![PartitionProduceData::default().with_index(0).with_records(Some(batch(&[b"x"])))])]);
        let mut resp = steady.call(0, v, &encode(&req, v), true).await.unwrap();
        assert_eq!(ProduceResponse::decode(&mut resp, v).unwrap().responses[0].partition_responses[0].error_code, 21);
    }
    check(&mut steady, addr).await;

    // 10. Illegal topic names: INVALID_TOPIC_EXCEPTION.
    assert_eq!(metadata_error(&mut steady, "bad name!").await, 17);
    assert_eq!(produce_error(&mut steady, "..", batch(&[b"x"])).await, 17);
    assert_eq!(metadata_error(&mut steady, &"x".repeat(250)).await, 17);
    check(&mut steady, addr).await;

    // 11. An array count far larger than the bytes present: closed, and no
    // allocation of what the count claims (the broker is still here).
    let mut c = Raw::connect(addr).await;
    let mut body = Vec::new();
    body.put_i32(0x7fff_ffff);
    c.send_bytes(&Raw::frame(3, 1, 1, &body)).await;
    assert!(c.closed().await, "huge array count");
    let mut c = Raw::connect(addr).await;
    let mut body = Vec::new(); // Produce v9: compact nullable string, acks, timeout, then topics
    body.push(0);
    body.put_i16(1);
    body.put_i32(1000);
    body.extend_from_slice(&[0xff, 0xff, 0xff, 0xff, 0x07]);
    c.send_bytes(&Raw::frame(0, 9, 1, &body)).await;
    assert!(c.closed().await, "huge compact array count");
    check(&mut steady, addr).await;

    // Nothing bad was appended anywhere: only the bystander's records and
    // the one record that fit.
    let (_, hw, _) = broker.engine.offsets(&broker.engine.topic("small.messages").unwrap().tp(0)).unwrap();
    assert_eq!(hw, 1);
    drop(steady);
    broker.shutdown().await;
}
