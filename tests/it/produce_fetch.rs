//! Produce 100,000 records with keys, headers and explicit timestamps to
//! 3 topics × 4 partitions with acks=all through librdkafka, read every
//! partition back by explicit assignment, then restart the broker and read
//! them again.

use crate::common;

use std::collections::HashMap;
use std::time::Duration;

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Header, Headers, Message, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::{Offset, TopicPartitionList};

const TOPICS: [&str; 3] = ["app.codestore.commits", "app.codestore.reviews", "metrics"];
const PARTITIONS: i32 = 4;
const RECORDS: usize = 100_000;

#[derive(Debug, Clone, PartialEq, Eq)]
struct Rec {
    key: Vec<u8>,
    value: Vec<u8>,
    header: Vec<u8>,
    ts: i64,
}

fn record(i: usize) -> (usize, i32, Rec) {
    let topic = i % TOPICS.len();
    let partition = ((i / TOPICS.len()) % PARTITIONS as usize) as i32;
    let rec = Rec {
        key: format!("key-{i}").into_bytes(),
        value: format!("value-{i}-{}", "x".repeat(i % 50)).into_bytes(),
        header: format!("h{i}").into_bytes(),
        ts: 1_700_000_000_000 + i as i64,
    };
    (topic, partition, rec)
}

async fn produce_all(addr: std::net::SocketAddr) -> HashMap<(usize, i32), Vec<(i64, Rec)>> {
    let producer: FutureProducer = common::producer_config(addr, "all").create().unwrap();
    let mut pending = Vec::with_capacity(RECORDS);
    for i in 0..RECORDS {
        let (t, p, rec) = record(i);
        let headers = OwnedHeaders::new().insert(Header { key: "h", value: Some(&rec.header) });
        let fr = FutureRecord::to(TOPICS[t]).partition(p).key(&rec.key).payload(&rec.value).timestamp(rec.ts).headers(headers);
        let fut = producer.send_result(fr).map_err(|(e, _)| e).expect("enqueue");
        pending.push((t, p, rec, fut));
    }
    let mut expected: HashMap<(usize, i32), Vec<(i64, Rec)>> = HashMap::new();
    for (t, p, rec, fut) in pending {
        let delivery = fut.await.expect("delivery future").expect("acked");
        assert_eq!(delivery.partition, p);
        expected.entry((t, p)).or_default().push((delivery.offset, rec));
    }
    expected
}

fn read_back(addr: std::net::SocketAddr, expected: &HashMap<(usize, i32), Vec<(i64, Rec)>>) {
    let consumer: BaseConsumer = common::consumer_config(addr).create().unwrap();
    let mut tpl = TopicPartitionList::new();
    for t in TOPICS {
        for p in 0..PARTITIONS {
            tpl.add_partition_offset(t, p, Offset::Beginning).unwrap();
        }
    }
    consumer.assign(&tpl).unwrap();
    let mut got: HashMap<(usize, i32), Vec<(i64, Rec)>> = HashMap::new();
    let mut n = 0;
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    while n < RECORDS {
        assert!(std::time::Instant::now() < deadline, "read only {n} of {RECORDS} records");
        let Some(m) = consumer.poll(Duration::from_millis(500)) else { continue };
        let m = m.expect("consume");
        let t = TOPICS.iter().position(|x| *x == m.topic()).unwrap();
        let header = m.headers().and_then(|h| h.iter().next()).map(|h| h.value.unwrap().to_vec()).unwrap_or_default();
        let rec = Rec {
            key: m.key().unwrap().to_vec(),
            value: m.payload().unwrap().to_vec(),
            header,
            ts: m.timestamp().to_millis().unwrap(),
        };
        got.entry((t, m.partition())).or_default().push((m.offset(), rec));
        n += 1;
    }
    for (tp, want) in expected {
        let have = got.get(tp).unwrap_or_else(|| panic!("nothing read from {tp:?}"));
        assert_eq!(have.len(), want.len(), "{tp:?}");
        for (i, ((o1, r1), (o2, r2))) in want.iter().zip(have).enumerate() {
            assert_eq!(*o2, i as i64, "offsets of {tp:?} are dense from 0");
            assert_eq!(o1, o2);
            assert_eq!(r1, r2, "record {i} of {tp:?}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hundred_thousand_records_round_trip_and_survive_restart() {
    let dir = tempfile::tempdir().unwrap();
    let broker = common::start(common::args(dir.path())).await;
    let addr = broker.kafka_addr;

    let admin: AdminClient<_> = common::client(addr).create().unwrap();
    let topics: Vec<_> = TOPICS.iter().map(|t| NewTopic::new(t, PARTITIONS, TopicReplication::Fixed(1))).collect();
    for r in admin.create_topics(&topics, &AdminOptions::new()).await.unwrap() {
        r.expect("topic created");
    }
    drop(admin);

    let expected = produce_all(addr).await;
    let read = tokio::task::spawn_blocking({
        let expected = expected.clone();
        move || read_back(addr, &expected)
    });
    read.await.unwrap();
    broker.shutdown().await;

    // Same data after a clean restart, on a new port.
    let broker = common::start(common::args(dir.path())).await;
    let addr = broker.kafka_addr;
    tokio::task::spawn_blocking(move || read_back(addr, &expected)).await.unwrap();
    broker.shutdown().await;
}
