//! kill -9 of a broker child process in the middle of an acks=all produce:
//! after restart every acked record is where its ack said, offsets are
//! dense, and no acked record appears twice.

use crate::common;

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::producer::{FutureProducer, FutureRecord, Producer};
use rdkafka::{Offset, TopicPartitionList};

const TOPIC: &str = "crash.test.events";
const PARTITIONS: i32 = 2;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acked_records_survive_kill_9() {
    let dir = tempfile::tempdir().unwrap();
    let broker = common::ChildBroker::spawn(dir.path(), &["--num-partitions", "2"]);
    let addr = broker.kafka;

    let mut cfg = common::producer_config(addr, "all");
    cfg.set("message.timeout.ms", "3000").set("retries", "0");
    let producer: FutureProducer = cfg.create().unwrap();
    // Warm up: the topic exists and a first record is acked.
    producer
        .send(FutureRecord::to(TOPIC).partition(0).key("warm").payload("up"), Duration::from_secs(30))
        .await
        .expect("first record acked");

    let acked: Arc<Mutex<HashMap<String, (i32, i64)>>> = Arc::default();
    acked.lock().unwrap().insert("warm".into(), (0, 0));
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let task = {
        let producer = producer.clone();
        let acked = acked.clone();
        let stop = stop.clone();
        tokio::spawn(async move {
            let mut i = 0u64;
            let mut inflight = Vec::new();
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let key = format!("k{i}");
                let value = format!("v{i}");
                let rec = FutureRecord::to(TOPIC).partition((i % 2) as i32).key(&key).payload(&value);
                if let Ok(fut) = producer.send_result(rec) {
                    inflight.push((key.clone(), fut));
                }
                i += 1;
                if inflight.len() >= 200 {
                    for (k, f) in inflight.drain(..) {
                        if let Ok(Ok(d)) = f.await {
                            acked.lock().unwrap().insert(k, (d.partition, d.offset));
                        }
                    }
                }
            }
            for (k, f) in inflight.drain(..) {
                if let Ok(Ok(d)) = f.await {
                    acked.lock().unwrap().insert(k, (d.partition, d.offset));
                }
            }
        })
    };
    // Kill once a good number of records is acked, while more are in flight.
    while acked.lock().unwrap().len() < 5_000 {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    broker.kill9();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    task.await.unwrap();
    producer.flush(Duration::from_secs(5)).ok();
    drop(producer);
    let acked = acked.lock().unwrap().clone();
    assert!(acked.len() >= 5_000);

    let broker = common::ChildBroker::spawn(dir.path(), &[]);
    let addr = broker.kafka;
    let found = tokio::task::spawn_blocking(move || read_everything(addr)).await.unwrap();
    let mut seen_keys = HashSet::new();
    let mut by_pos = HashMap::new();
    for (p, records) in &found {
        for (i, (offset, key)) in records.iter().enumerate() {
            assert_eq!(*offset, i as i64, "partition {p}: offsets are dense");
            by_pos.insert((*p, *offset), key.clone());
            if acked.contains_key(key) {
                assert!(seen_keys.insert(key.clone()), "acked record {key} appears twice");
            }
        }
    }
    for (key, pos) in &acked {
        assert_eq!(by_pos.get(pos), Some(key), "acked {key} at {pos:?} is missing after kill -9");
    }
    let status = broker.terminate();
    assert!(status.success(), "clean shutdown after recovery: {status:?}");
}

fn read_everything(addr: std::net::SocketAddr) -> HashMap<i32, Vec<(i64, String)>> {
    let consumer: BaseConsumer = common::consumer_config(addr).create().unwrap();
    let (_, high0) = consumer.fetch_watermarks(TOPIC, 0, Duration::from_secs(30)).unwrap();
    let (_, high1) = consumer.fetch_watermarks(TOPIC, 1, Duration::from_secs(30)).unwrap();
    let mut tpl = TopicPartitionList::new();
    for p in 0..PARTITIONS {
        tpl.add_partition_offset(TOPIC, p, Offset::Beginning).unwrap();
    }
    consumer.assign(&tpl).unwrap();
    let total = (high0 + high1) as usize;
    let mut out: HashMap<i32, Vec<(i64, String)>> = HashMap::new();
    let mut n = 0;
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    while n < total {
        assert!(std::time::Instant::now() < deadline, "read {n} of {total}");
        let Some(m) = consumer.poll(Duration::from_millis(500)) else { continue };
        let m = m.unwrap();
        out.entry(m.partition()).or_default().push((m.offset(), String::from_utf8(m.key().unwrap().to_vec()).unwrap()));
        n += 1;
    }
    out
}
