//! Compaction with real clients: a skewed tree (one big topic beside small
//! siblings) is produced with librdkafka, compaction is forced, the broker
//! restarts (empty tip: every old read comes from disk), and consumers read
//! each topic from the beginning and the subtree as a stream. The small
//! topic reads back exactly its records without reading its big sibling's
//! bytes; the split plan is in the catalog; `canopy split-report` reads
//! the stopped broker's data directory.

use crate::common;

use std::collections::HashMap;
use std::time::Duration;

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Headers, Message};
use rdkafka::producer::{FutureProducer, FutureRecord};

const BIG: &str = "app.codestore.commits";
const SMALL: &str = "app.codestore.tags";
const OTHER: &str = "app.codestore.reviews";

fn args(dir: &std::path::Path) -> canopy::config::ServeArgs {
    let mut a = common::args(dir);
    a.segment_bytes = Some(256 * 1024);
    a.message_max_bytes = Some(128 * 1024);
    a.compaction_lag_ms = Some(0);
    // Forced by the test, never by the timer.
    a.compaction_interval_ms = Some(3_600_000);
    a.compaction_min_store_bytes = Some(512 * 1024);
    a
}

/// Produces a skewed mix: 4,000 records of 1 KiB to BIG, one in 80 to
/// SMALL, one in 130 to OTHER. Returns each topic's payloads in order.
async fn produce(addr: std::net::SocketAddr) -> HashMap<&'static str, Vec<String>> {
    let mut cfg = common::producer_config(addr, "all");
    // Batches well under the broker's message.max.bytes.
    cfg.set("batch.size", "65536");
    let producer: FutureProducer = cfg.create().unwrap();
    let mut sent: HashMap<&'static str, Vec<String>> = HashMap::new();
    let mut pending = Vec::new();
    for i in 0..4000 {
        let mut to = vec![BIG];
        if i % 80 == 0 {
            to.push(SMALL);
        }
        if i % 130 == 0 {
            to.push(OTHER);
        }
        for topic in to {
            let payload = if topic == BIG { format!("{i:06}{}", "x".repeat(1018)) } else { format!("{topic}#{i}") };
            let record = FutureRecord::<str, str>::to(topic).partition(0).key("k").payload(&payload);
            pending.push((topic, producer.send_result(record).map_err(|(e, _)| e).unwrap()));
            sent.entry(topic).or_default().push(payload);
        }
    }
    let mut next: HashMap<&str, i64> = HashMap::new();
    for (topic, delivery) in pending {
        let d = delivery.await.unwrap().map_err(|(e, _)| e).unwrap();
        let expect = next.entry(topic).or_insert(0);
        assert_eq!(d.offset, *expect, "{topic} offsets in produce order");
        *expect += 1;
    }
    sent
}

fn payloads(msgs: &[rdkafka::message::OwnedMessage]) -> Vec<String> {
    msgs.iter().map(|m| String::from_utf8(m.payload().unwrap().to_vec()).unwrap()).collect()
}

/// Reads the stream `name` from earliest to partition EOF; per source
/// topic, the payloads in stream order.
fn read_stream(addr: std::net::SocketAddr, name: &str) -> (usize, HashMap<String, Vec<String>>) {
    let mut cfg = common::consumer_config(addr);
    cfg.set("enable.partition.eof", "true");
    let c: BaseConsumer = cfg.create().unwrap();
    let mut tpl = rdkafka::TopicPartitionList::new();
    tpl.add_partition_offset(name, 0, rdkafka::Offset::Beginning).unwrap();
    c.assign(&tpl).unwrap();
    let mut by_topic: HashMap<String, Vec<String>> = HashMap::new();
    let mut n = 0;
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    loop {
        assert!(std::time::Instant::now() < deadline, "stream {name} did not reach its end");
        match c.poll(Duration::from_millis(100)) {
            Some(Ok(m)) => {
                let h = m.headers().unwrap();
                let topic = (0..h.count()).map(|i| h.get(i)).find(|h| h.key == "canopy.topic").map(|h| String::from_utf8(h.value.unwrap().to_vec()).unwrap()).unwrap();
                by_topic.entry(topic).or_default().push(String::from_utf8(m.payload().unwrap().to_vec()).unwrap());
                n += 1;
            }
            Some(Err(rdkafka::error::KafkaError::PartitionEOF(_))) => return (n, by_topic),
            Some(Err(e)) => panic!("{e}"),
            None => {}
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_small_topic_beside_a_huge_sibling_reads_exactly_its_records_from_its_store() {
    let dir = tempfile::tempdir().unwrap();
    let broker = common::start(args(dir.path())).await;
    let sent = produce(broker.kafka_addr).await;
    let segments_before = broker.engine.storage().segment_count();

    // Force compaction until nothing is due.
    let mut windows = 0;
    loop {
        let e = broker.engine.clone();
        match tokio::task::spawn_blocking(move || e.compact()).await.unwrap().unwrap() {
            Some(done) => {
                windows += 1;
                assert!(done.segments > 0 && done.bytes_out > 0);
            }
            None => break,
        }
    }
    assert!(windows >= 1);
    assert!(broker.engine.storage().store_count() >= 2);
    assert!(broker.engine.storage().segment_count() < segments_before);
    // The plan is in the catalog: the big topic has a store of its own, the
    // small ones share one.
    let recorded = broker.engine.compaction_windows().unwrap();
    assert_eq!(recorded.len(), windows);
    let w = &recorded[0];
    assert_eq!(w.split, "adaptive");
    assert!(w.stores.iter().any(|s| s.topics == [BIG]), "{:?}", w.stores);
    assert!(w.stores.iter().any(|s| s.topics.contains(&SMALL.to_owned()) && s.topics.contains(&OTHER.to_owned())), "{:?}", w.stores);
    broker.shutdown().await;

    // After a restart the tip is empty: old batches come from the stores.
    let broker = common::start(args(dir.path())).await;
    let addr = broker.kafka_addr;
    let stats = broker.engine.storage().read_stats();
    let scanned_before = stats.scanned.load(std::sync::atomic::Ordering::Relaxed);
    let n = sent[SMALL].len();
    let small = tokio::task::spawn_blocking(move || common::read_exactly(addr, SMALL, &[0], n)).await.unwrap();
    assert_eq!(payloads(&small), sent[SMALL]);
    let scanned = stats.scanned.load(std::sync::atomic::Ordering::Relaxed) - scanned_before;
    let big_bytes = 4000 * 1024;
    eprintln!("reading {n} records of {SMALL} scanned {scanned} bytes from disk");
    assert!(scanned > 0 && scanned < big_bytes / 4, "reading {n} small records scanned {scanned} bytes (the sibling holds {big_bytes})");
    let n = sent[BIG].len();
    let big = tokio::task::spawn_blocking(move || common::read_exactly(addr, BIG, &[0], n)).await.unwrap();
    assert_eq!(payloads(&big), sent[BIG]);
    let n = sent[OTHER].len();
    let other = tokio::task::spawn_blocking(move || common::read_exactly(addr, OTHER, &[0], n)).await.unwrap();
    assert_eq!(payloads(&other), sent[OTHER]);

    // The subtree stream merges stores and the branch log's tail: every
    // record once, each topic in its own order.
    let (count, by_topic) = tokio::task::spawn_blocking(move || read_stream(addr, "app.__all")).await.unwrap();
    assert_eq!(count, sent.values().map(Vec::len).sum::<usize>());
    for (topic, want) in &sent {
        assert_eq!(&by_topic[*topic], want, "{topic} in the stream");
    }
    broker.shutdown().await;

    // `canopy split-report` on the stopped broker's data directory: every
    // topic in both plans, with its bytes from stores and segments.
    let html = dir.path().join("report.html");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_canopy"))
        .args(["split-report", "--format", "json", "--data-dir"])
        .arg(dir.path())
        .arg("--html")
        .arg(&html)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    for plan in ["adaptive", "prefix3"] {
        let assigned = report[plan]["topic_store"].as_object().unwrap();
        assert_eq!(assigned.len(), 3, "{plan}: {assigned:?}");
        assert!(assigned.contains_key(BIG) && assigned.contains_key(SMALL) && assigned.contains_key(OTHER));
    }
    assert!(report["bytes"].as_u64().unwrap() > 4000 * 1024);
    let page = std::fs::read_to_string(&html).unwrap();
    assert!(page.contains("<svg") && page.contains("app.codestore"));
    // A CSV with a bad line is refused with its line number, exit code 2.
    let csv = dir.path().join("bad.csv");
    std::fs::write(&csv, "topic,bytes\na.b,10\nc.d,ten\n").unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_canopy")).arg("split-report").arg("--csv").arg(&csv).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("line 3"), "{}", String::from_utf8_lossy(&out.stderr));
}
