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
