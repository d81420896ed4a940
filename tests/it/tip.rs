//! The tip with real clients: a consumer catching up from inside the tip
//! gets exactly the produced records (served from memory), and one reading
//! from offsets the small tip has already evicted falls through to the
//! branch logs and gets them too, interleaved across branches.

use crate::common;

use std::time::Duration;

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer, ThreadedProducer};

fn read_from(addr: std::net::SocketAddr, topic: &str, from: i64, n: usize) -> Vec<(i64, Vec<u8>)> {
    let consumer: BaseConsumer = common::consumer_config(addr).create().unwrap();
    let mut tpl = rdkafka::TopicPartitionList::new();
    tpl.add_partition_offset(topic, 0, rdkafka::Offset::Offset(from)).unwrap();
    consumer.assign(&tpl).unwrap();
    let mut out = Vec::new();
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while out.len() < n {
        assert!(std::time::Instant::now() < deadline, "read {} of {n}", out.len());
        if let Some(m) = consumer.poll(Duration::from_millis(100)) {
            let m = m.unwrap();
            out.push((m.offset(), m.payload().unwrap().to_vec()));
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn catch_up_reads_come_from_the_tip_and_evicted_ones_from_the_logs() {
    let dir = tempfile::tempdir().unwrap();
    let mut args = common::args(dir.path());
    // A small tip: 256 KiB holds about the last quarter of what is produced.
    args.tip_bytes = Some(256 << 10);
    let broker = common::start(args).await;
    let addr = broker.kafka_addr;
    let topics = ["app.a.x", "app.b.y", "other.c.z"];
    tokio::task::spawn_blocking(move || {
        let mut cfg = common::producer_config(addr, "all");
        cfg.set("linger.ms", "0");
        let p: ThreadedProducer<DefaultProducerContext> = cfg.create().unwrap();
        for i in 0..3000 {
            let t = topics[i % 3];
            let v = format!("{t}-{:05}-{}", i / 3, "p".repeat(200));
            p.send(BaseRecord::<(), str>::to(t).partition(0).payload(&v)).map_err(|(e, _)| e).unwrap();
            if i % 50 == 0 {
                p.flush(Duration::from_secs(30)).unwrap();
            }
        }
        p.flush(Duration::from_secs(30)).unwrap();
    })
    .await
    .unwrap();
    let before = broker.engine.tip_stats();
    assert!(before.bytes_used <= 256 << 10 && before.batches > 0);
    // From inside the tip: the last 100 records of each topic.
    let recent = tokio::task::spawn_blocking(move || topics.iter().map(|t| read_from(addr, t, 900, 100)).collect::<Vec<_>>()).await.unwrap();
    for (t, got) in topics.iter().zip(&recent) {
        for (k, (offset, v)) in got.iter().enumerate() {
            assert_eq!(*offset, 900 + k as i64);
            assert!(v.starts_with(format!("{t}-{:05}-", 900 + k).as_bytes()), "{t} @ {offset}");
        }
    }
    let mid = broker.engine.tip_stats();
    assert!(mid.hits > before.hits, "recent reads were served by the tip: {mid:?}");
    // From the start: long evicted, read from the logs.
    let old = tokio::task::spawn_blocking(move || read_from(addr, "app.b.y", 0, 1000)).await.unwrap();
    for (k, (offset, v)) in old.iter().enumerate() {
        assert_eq!(*offset, k as i64);
        assert!(v.starts_with(format!("app.b.y-{k:05}-").as_bytes()));
    }
    let after = broker.engine.tip_stats();
    assert!(after.misses > mid.misses, "evicted offsets fell through: {after:?}");
    broker.shutdown().await;
}
