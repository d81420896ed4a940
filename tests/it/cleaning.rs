//! Key compaction with real clients: librdkafka writes updates over a
//! few hundred keys to a `cleanup.policy=compact` topic (plain, and in
//! transactions it commits or aborts), then tombstones some keys; a busy
//! unkeyed sibling shares its branch. Compaction and cleaning are forced.
//! A read_committed consumer from offset 0 then sees exactly the latest
//! value of each live key, at the offset it was written at, and each
//! deleted key's tombstone; after `delete.retention.ms` and another
//! cleaning, no tombstone. The sibling reads back every record, and all
//! of it holds across a restart.

use crate::common;

use std::collections::BTreeMap;
use std::time::Duration;

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::producer::{BaseProducer, BaseRecord, FutureProducer, FutureRecord, Producer};

const KEYED: &str = "kv.app.state";
const SIBLING: &str = "kv.app.events";
const KEYS: usize = 300;

fn args(dir: &std::path::Path) -> canopy::config::ServeArgs {
    let mut a = common::args(dir);
    a.segment_bytes = Some(64 * 1024);
    a.message_max_bytes = Some(64 * 1024);
    a.compaction_lag_ms = Some(0);
    // Forced by the test, never by the timer.
    a.compaction_interval_ms = Some(3_600_000);
    a
}

/// Every record of `topic`'s `partitions` from offset 0 to the end,
/// read_committed: (partition, offset, key, value or None).
fn read_all(addr: std::net::SocketAddr, topic: &str, partitions: i32) -> Vec<(i32, i64, String, Option<String>)> {
    let mut cfg = common::consumer_config(addr);
    cfg.set("enable.partition.eof", "true").set("isolation.level", "read_committed");
    let c: BaseConsumer = cfg.create().unwrap();
    let mut tpl = rdkafka::TopicPartitionList::new();
    for p in 0..partitions {
        tpl.add_partition_offset(topic, p, rdkafka::Offset::Offset(0)).unwrap();
    }
    c.assign(&tpl).unwrap();
    let mut out = Vec::new();
    let mut eof = std::collections::BTreeSet::new();
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while eof.len() < partitions as usize {
        assert!(std::time::Instant::now() < deadline, "{topic} did not reach its end");
        match c.poll(Duration::from_millis(100)) {
            Some(Ok(m)) => {
                let key = String::from_utf8(m.key().unwrap_or_default().to_vec()).unwrap();
                out.push((m.partition(), m.offset(), key, m.payload().map(|v| String::from_utf8(v.to_vec()).unwrap())));
            }
            Some(Err(rdkafka::error::KafkaError::PartitionEOF(p))) => {
                eof.insert(p);
            }
            Some(Err(e)) => panic!("{e}"),
            None => {}
        }
    }
    out.sort();
    out
}

async fn force(broker: &canopy::server::Running) -> usize {
    loop {
        let e = broker.engine.clone();
        if tokio::task::spawn_blocking(move || e.compact()).await.unwrap().unwrap().is_none() {
            break;
        }
    }
    let mut cleanings = 0;
    loop {
        let e = broker.engine.clone();
        match tokio::task::spawn_blocking(move || e.clean()).await.unwrap().unwrap() {
            Some(_) => cleanings += 1,
            None => return cleanings,
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_compacted_topic_keeps_the_latest_value_per_key_at_its_offset() {
    let dir = tempfile::tempdir().unwrap();
    let broker = common::start(args(dir.path())).await;
    let addr = broker.kafka_addr;
    let admin: AdminClient<DefaultClientContext> = common::client(addr).create().unwrap();
    let opts = AdminOptions::new().operation_timeout(Some(Duration::from_secs(10)));
    let keyed = NewTopic::new(KEYED, 2, TopicReplication::Fixed(1))
        .set("cleanup.policy", "compact")
        .set("min.cleanable.dirty.ratio", "0.01")
        .set("delete.retention.ms", "2000");
    for t in [keyed, NewTopic::new(SIBLING, 1, TopicReplication::Fixed(1))] {
        admin.create_topics([&t], &opts).await.unwrap()[0].as_ref().unwrap();
    }

    // (partition, key) → (offset, value or None) of the latest committed write.
    let mut latest: BTreeMap<(i32, String), (i64, Option<String>)> = BTreeMap::new();
    let mut sibling = Vec::new();
    let mut cfg = common::producer_config(addr, "all");
    // Batches of a few segments' worth at most, however the client is
    // scheduled.
    cfg.set("compression.type", "lz4").set("linger.ms", "5").set("batch.size", "16384");
    let producer: FutureProducer = cfg.create().unwrap();
    let mut pending = Vec::new();
    for i in 0..6000 {
        let key = format!("key-{:03}", i % KEYS);
        let value = format!("{key}=v{i}");
        let p = (i % KEYS % 2) as i32;
        pending.push((p, key.clone(), Some(value.clone()), producer.send_result(FutureRecord::to(KEYED).partition(p).key(&key).payload(&value)).map_err(|(e, _)| e).unwrap()));
        if i % 3 == 0 {
            let v = format!("event-{i}-{}", "e".repeat(200));
            pending.push((0, String::new(), Some(v.clone()), producer.send_result(FutureRecord::to(SIBLING).partition(0).key("e").payload(&v)).map_err(|(e, _)| e).unwrap()));
            sibling.push(v);
        }
    }
    for (p, key, value, d) in pending.drain(..) {
        let offset = d.await.unwrap().map_err(|(e, _)| e).unwrap().offset;
        if !key.is_empty() {
            latest.insert((p, key), (offset, value));
        }
    }

    // Transactions: a committed one rewrites keys 0..50, an aborted one
    // 50..100 (their committed values stay the latest).
    let txn = {
        let mut cfg = common::producer_config(addr, "all");
        cfg.set("transactional.id", "cleaning-txn");
        let p: BaseProducer = cfg.create().unwrap();
        p.init_transactions(Duration::from_secs(30)).unwrap();
        p
    };
    for (range, commit) in [(0..50, true), (50..100, false)] {
        txn.begin_transaction().unwrap();
        for k in range.clone() {
            let key = format!("key-{k:03}");
            let value = format!("{key}=txn{}", if commit { "-committed" } else { "-aborted" });
            txn.send(BaseRecord::to(KEYED).partition(k % 2).key(&key).payload(&value)).map_err(|(e, _)| e).unwrap();
        }
        txn.flush(Duration::from_secs(30)).unwrap();
        if commit {
            txn.commit_transaction(Duration::from_secs(30)).unwrap();
        } else {
            txn.abort_transaction(Duration::from_secs(30)).unwrap();
        }
    }
    // The committed values' offsets, read back (the transactional producer
    // does not report them here).
    for (p, offset, key, value) in read_all(addr, KEYED, 2) {
        if value.as_deref().is_some_and(|v| v.ends_with("=txn-committed")) {
            latest.insert((p, key), (offset, value));
        }
    }
    // Tombstones for 30 keys.
    for k in (100..KEYS).step_by(7).take(30) {
        let key = format!("key-{k:03}");
        let p = (k % 2) as i32;
        let offset = producer.send(FutureRecord::<str, str>::to(KEYED).partition(p).key(&key), Duration::from_secs(10)).await.map_err(|(e, _)| e).unwrap().offset;
        latest.insert((p, key), (offset, None));
    }
    // The sibling fills the branch's active segment, so every keyed batch
    // lies in a sealed segment the compactor takes.
    for i in 0..400 {
        let v = format!("filler-{i}-{}", "f".repeat(400));
        producer.send(FutureRecord::to(SIBLING).partition(0).key("f").payload(&v), Duration::from_secs(10)).await.map_err(|(e, _)| e).unwrap();
        sibling.push(v);
    }

    let live = |with_tombstones: bool| -> Vec<(i32, i64, String, Option<String>)> {
        let mut v: Vec<_> = latest.iter().filter(|(_, (_, v))| with_tombstones || v.is_some()).map(|((p, k), (o, v))| (*p, *o, k.clone(), v.clone())).collect();
        v.sort();
        v
    };
    let before = read_all(addr, KEYED, 2).len();
    assert!(force(&broker).await >= 1, "the keyed topic was cleaned");
    let got = read_all(addr, KEYED, 2);
    assert_eq!(got, live(true), "one record per key, the latest, at its offset; tombstones until their horizon");
    assert!(got.len() * 10 < before, "{} of {before} records left", got.len());
    // High watermarks stay where they were.
    let consumer: BaseConsumer = common::consumer_config(addr).create().unwrap();
    let marks = |c: &BaseConsumer| (0..2).map(|p| c.fetch_watermarks(KEYED, p, Duration::from_secs(10)).unwrap()).collect::<Vec<_>>();
    let watermarks = marks(&consumer);
    assert!(watermarks.iter().all(|&(low, high)| low == 0 && high > 3000), "{watermarks:?}");

    // Past delete.retention.ms, the next cleaning removes the tombstones.
    tokio::time::sleep(Duration::from_millis(2100)).await;
    assert!(force(&broker).await >= 1);
    assert_eq!(read_all(addr, KEYED, 2), live(false), "no tombstone after delete.retention.ms");
    assert_eq!(marks(&consumer), watermarks);
    let sib: Vec<String> = read_all(addr, SIBLING, 1).into_iter().map(|r| r.3.unwrap()).collect();
    assert_eq!(sib, sibling, "the sibling keeps every record");
    drop(consumer);
    broker.shutdown().await;

    let broker = common::start(args(dir.path())).await;
    let addr = broker.kafka_addr;
    assert_eq!(read_all(addr, KEYED, 2), live(false), "after a restart");
    let consumer: BaseConsumer = common::consumer_config(addr).create().unwrap();
    assert_eq!(marks(&consumer), watermarks);
    let sib: Vec<String> = read_all(addr, SIBLING, 1).into_iter().map(|r| r.3.unwrap()).collect();
    assert_eq!(sib, sibling);
    broker.shutdown().await;
}
