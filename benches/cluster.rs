//! Replication's cost and failover, measured (issue 24; docs/cluster.md):
//! a real librdkafka producer against, in one run,
//!
//! - one node in single-node mode (the baseline), acks=1 and acks=all,
//! - three cluster nodes with replication factor 1,
//! - three cluster nodes with replication factor 3, acks=1,
//! - three cluster nodes with replication factor 3, acks=all and
//!   `min.insync.replicas` 2,
//! - the same again with followers fetching over mutual TLS (an SSL
//!   inter-broker listener requiring client certificates),
//! - the REST bridge, acks=all on replication factor 3: at the
//!   partition's leader, and through another node that forwards each
//!   request to it,
//!
//! all on this machine's two cores (three brokers, a three-member etcd
//! and the client share them). For each: records/s, MB/s, and the
//! brokers' CPU seconds per GB produced (all nodes together). For
//! replication factor 3 with acks=1, the replication lag: how long after
//! the producer's last acknowledgement every partition's high watermark
//! (what all in-sync replicas have) reaches its log end. Then failover:
//! the time from the kill -9 of a partition's leader to the first
//! acks=all record acknowledged by its successor, as librdkafka sees it
//! (the default 3 s broker session timeout).
//!
//! ```text
//! cargo bench --features cluster --bench cluster [-- --quick]
//! ```
//!
//! Needs etcd (Debian's `etcd-server`) and the `cluster` feature (or
//! `CANOPY_CLUSTER_BIN` naming a canopy built with it); fails loudly
//! without them.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::producer::{BaseRecord, FutureProducer, FutureRecord, Producer, ThreadedProducer};

#[path = "../tests/it/common.rs"]
mod common;
#[path = "support/delivery.rs"]
mod delivery;
#[path = "../tests/it/cluster_support.rs"]
mod cluster_support;
#[path = "support/proc_cpu.rs"]
mod proc_cpu;

use cluster_support::{canopy_binary, mtls_args, pki, spawn_node, spawn_node_extra, Etcd};
use common::ChildBroker;
use delivery::{Counter, Ctx};

const PARTITIONS: i32 = 6;
const SIZE: usize = 1024;


fn block_on<F: std::future::Future>(f: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(f)
}

fn create_topic(bootstrap: std::net::SocketAddr, name: &str, rf: i32, configs: &[(&str, &str)]) {
    let admin: AdminClient<DefaultClientContext> = common::client(bootstrap).create().unwrap();
    let mut t = NewTopic::new(name, PARTITIONS, TopicReplication::Fixed(rf));
    for (k, v) in configs {
        t = t.set(k, v);
    }
    let r = block_on(admin.create_topics([&t], &AdminOptions::new())).unwrap();
    r[0].as_ref().expect("topic created");
}

/// Every node's CPU seconds so far.
fn cpu(nodes: &[&ChildBroker]) -> f64 {
    nodes.iter().map(|n| proc_cpu::cpu_secs(n.child.id())).sum()
}

struct Row {
    name: String,
    records: u64,
    secs: f64,
    cpu: f64,
}

impl Row {
    fn print(&self) {
        let gb = self.records as f64 * SIZE as f64 / 1e9;
        println!("| {} | {} | {:.0} | {:.1} | {:.2} | {:.1} |", self.name, self.records, self.records as f64 / self.secs, gb * 1e3 / self.secs, self.secs, self.cpu_per_gb());
    }

    /// The brokers' CPU seconds per GB produced.
    fn cpu_per_gb(&self) -> f64 {
        self.cpu / (self.records as f64 * SIZE as f64 / 1e9)
    }
}

/// Produces `records` records of 1 KiB over the topic's partitions with
/// librdkafka (linger 5 ms, 1 MB batches, no compression, idempotence on
/// for acks=all as a real acks=all producer runs).
fn produce(bootstrap: std::net::SocketAddr, nodes: &[&ChildBroker], topic: &str, acks: &str, records: u64, name: &str) -> Row {
    let counter = Arc::new(Counter::default());
    let mut cfg = common::client(bootstrap);
    cfg.set("acks", acks)
        .set("linger.ms", "5")
        .set("batch.size", "1000000")
        .set("batch.num.messages", "100000")
        .set("queue.buffering.max.messages", "2000000")
        .set("queue.buffering.max.kbytes", "1048576")
        .set("compression.type", "none")
        .set("message.timeout.ms", "120000")
        .set("enable.idempotence", if acks == "all" { "true" } else { "false" });
    let producer: ThreadedProducer<Ctx> = cfg.create_with_context(Ctx(counter.clone())).unwrap();
    let payload = vec![b'x'; SIZE];
    let cpu0 = cpu(nodes);
    let t0 = Instant::now();
    for i in 0..records {
        let rec: BaseRecord<'_, (), [u8]> = BaseRecord::to(topic).payload(&payload[..]).partition((i % PARTITIONS as u64) as i32);
        common::send_waiting(&producer, rec).unwrap_or_else(|e| panic!("produce: {e}"));
    }
    producer.flush(Duration::from_secs(600)).unwrap();
    let secs = t0.elapsed().as_secs_f64();
    assert_eq!(counter.failed.load(Ordering::Relaxed), 0, "deliveries failed");
    assert_eq!(counter.ok.load(Ordering::Relaxed), records);
    Row { name: name.to_owned(), records, secs, cpu: cpu(nodes) - cpu0 }
}

/// Waits until every partition's high watermark (as the leaders answer
/// ListOffsets: what every in-sync replica has) reaches `per_partition`;
/// the time it took.
fn hw_caught_up(bootstrap: std::net::SocketAddr, topic: &str, per_partition: i64) -> Duration {
    let c: BaseConsumer = common::client(bootstrap).set("group.id", "lag").create().unwrap();
    let t0 = Instant::now();
    for p in 0..PARTITIONS {
        loop {
            let (_, high) = c.fetch_watermarks(topic, p, Duration::from_secs(10)).unwrap();
            if high >= per_partition {
                break;
            }
            assert!(t0.elapsed() < Duration::from_secs(120), "partition {p}: hw {high} of {per_partition} after 120 s");
            std::thread::sleep(Duration::from_millis(5));
        }
    }
    t0.elapsed()
}

/// The median time of 50 acks=all records sent one at a time (linger 0)
/// to partition 0 of `topic`.
fn latency(bootstrap: std::net::SocketAddr, topic: &str) -> Duration {
    let p: FutureProducer = common::client(bootstrap).set("acks", "all").set("enable.idempotence", "true").set("linger.ms", "0").create().unwrap();
    let mut took: Vec<Duration> = block_on(async {
        let mut v = Vec::new();
        for i in 0..51 {
            let t0 = Instant::now();
            p.send(FutureRecord::<(), [u8]>::to(topic).partition(0).payload(&b"ping"[..]), Duration::from_secs(30)).await.expect("acknowledged");
            // The first warms the connection.
            if i > 0 {
                v.push(t0.elapsed());
            }
        }
        v
    });
    took.sort();
    took[took.len() / 2]
}

/// Posts `records` records of 1 KiB to partition 0 of `topic` through the
/// REST bridge at `rest`: 100 records per request (JSON values, acks=all,
/// the bridge's default), 8 requests in flight. Through a node that does
/// not lead the partition, every request is forwarded to its leader.
fn rest_post(rest: std::net::SocketAddr, nodes: &[&ChildBroker], topic: &str, records: u64, name: &str) -> Row {
    const PER_REQUEST: u64 = 100;
    // A JSON string of SIZE bytes, quotes included: the stored value.
    let value = serde_json::Value::String("x".repeat(SIZE - 2));
    let body = serde_json::json!({ "records": (0..PER_REQUEST).map(|_| serde_json::json!({ "value": value })).collect::<Vec<_>>() }).to_string();
    let url = format!("http://{rest}/topics/{topic}/partitions/0");
    // Until the partition's leader has taken it over (a new topic's first
    // epoch begins a moment after Metadata names it): 503s, retried.
    block_on(async {
        let http = reqwest::Client::new();
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let r = http.post(&url).header("content-type", "application/vnd.kafka.json.v2+json").body(r#"{"records":[{"value":"warm"}]}"#).send().await.expect("answered");
            let answer: serde_json::Value = serde_json::from_slice(&r.bytes().await.expect("an answer")).expect("a JSON answer");
            if answer["offsets"][0]["error_code"].is_null() {
                break;
            }
            assert!(Instant::now() < deadline, "partition 0 of {topic} not writable through {rest} in 30 s: {answer}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    });
    let requests = records.div_ceil(PER_REQUEST);
    let next = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let cpu0 = cpu(nodes);
    let t0 = Instant::now();
    block_on(async {
        let http = reqwest::Client::new();
        let mut inflight = tokio::task::JoinSet::new();
        for _ in 0..8 {
            let (http, url, body, next) = (http.clone(), url.clone(), body.clone(), next.clone());
            inflight.spawn(async move {
                while next.fetch_add(1, Ordering::Relaxed) < requests {
                    let r = http.post(&url).header("content-type", "application/vnd.kafka.json.v2+json").body(body.clone()).send().await.expect("answered");
                    let status = r.status();
                    let answer: serde_json::Value = serde_json::from_slice(&r.bytes().await.expect("an answer")).expect("a JSON answer");
                    assert!(status.is_success() && answer["offsets"].as_array().unwrap().iter().all(|o| o["error_code"].is_null()), "{status}: {answer}");
                }
            });
        }
        while let Some(r) = inflight.join_next().await {
            r.unwrap();
        }
    });
    let secs = t0.elapsed().as_secs_f64();
    Row { name: name.to_owned(), records: requests * PER_REQUEST, secs, cpu: cpu(nodes) - cpu0 }
}

/// The leader of `topic`'s partition 0, from Metadata.
fn leader_of_0(bootstrap: std::net::SocketAddr, topic: &str) -> i32 {
    let c: BaseConsumer = common::client(bootstrap).create().unwrap();
    let md = c.fetch_metadata(Some(topic), Duration::from_secs(10)).unwrap();
    md.topics()[0].partitions().iter().find(|p| p.id() == 0).unwrap().leader()
}

/// From the kill -9 of partition 0's leader to the first acks=all record
/// its successor acknowledges, with a producer that was warm before.
fn failover(nodes: &mut [Option<ChildBroker>], topic: &str) -> Duration {
    let bootstrap = nodes.iter().flatten().next().unwrap().kafka;
    let leader = leader_of_0(bootstrap, topic);
    let survivor = nodes.iter().enumerate().find(|(id, n)| *id as i32 != leader && n.is_some()).and_then(|(_, n)| n.as_ref()).unwrap().kafka;
    let p: FutureProducer = common::client(survivor).set("acks", "all").set("enable.idempotence", "true").set("message.timeout.ms", "60000").set("linger.ms", "0").create().unwrap();
    block_on(async {
        p.send(FutureRecord::<(), [u8]>::to(topic).partition(0).payload(&b"warm"[..]), Duration::from_secs(30)).await.expect("warm-up acknowledged");
    });
    nodes[leader as usize].take().unwrap().kill9();
    let t0 = Instant::now();
    block_on(async {
        p.send(FutureRecord::<(), [u8]>::to(topic).partition(0).payload(&b"after"[..]), Duration::from_secs(60)).await.expect("acknowledged by the new leader");
    });
    t0.elapsed()
}

fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    let records: u64 = if quick { 50_000 } else { 500_000 };
    let bin = canopy_binary();
    let root = tempfile::tempdir().unwrap();
    println!("records of {SIZE} B over {PARTITIONS} partitions; broker CPU summed over the nodes");
    println!();
    println!("| setup | records | records/s | MB/s | seconds | broker CPU s/GB |");
    println!("| --- | --- | --- | --- | --- | --- |");

    // The baseline: one node, single-node mode.
    let single = {
        let dir = root.path().join("single");
        std::fs::create_dir_all(&dir).unwrap();
        let b = ChildBroker::spawn_binary(&bin, &[], &dir, &["--flush", "always"]);
        create_topic(b.kafka, "bench.single1", 1, &[]);
        let one = produce(b.kafka, &[&b], "bench.single1", "1", records, "single node, acks=1");
        one.print();
        create_topic(b.kafka, "bench.single", 1, &[]);
        let all = produce(b.kafka, &[&b], "bench.single", "all", records, "single node, acks=all");
        all.print();
        println!("| (single node: one acks=all record at a time, median {:.1} ms) | | | | | |", latency(b.kafka, "bench.single").as_secs_f64() * 1e3);
        b.kill9();
        (one, all)
    };

    let etcd = Etcd::start(root.path());
    let mut nodes: Vec<Option<ChildBroker>> = vec![None];
    for id in 1..=3 {
        nodes.push(Some(spawn_node(root.path(), id, &etcd)));
    }
    let bootstrap = nodes[1].as_ref().unwrap().kafka;
    // Every node registered and a controller elected.
    std::thread::sleep(Duration::from_secs(3));
    let all: Vec<&ChildBroker> = nodes.iter().flatten().collect();
    create_topic(bootstrap, "rf1.t", 1, &[]);
    let rf1 = produce(bootstrap, &all, "rf1.t", "all", records, "3 nodes, RF=1, acks=all");
    rf1.print();
    create_topic(bootstrap, "rf3a.t", 3, &[("min.insync.replicas", "2")]);
    let rf3_1 = produce(bootstrap, &all, "rf3a.t", "1", records, "3 nodes, RF=3, acks=1");
    let lag = hw_caught_up(bootstrap, "rf3a.t", (records / PARTITIONS as u64) as i64);
    rf3_1.print();
    create_topic(bootstrap, "rf3b.t", 3, &[("min.insync.replicas", "2")]);
    let rf3_all = produce(bootstrap, &all, "rf3b.t", "all", records, "3 nodes, RF=3, acks=all, min.insync.replicas=2");
    rf3_all.print();
    println!("| (RF=3: one acks=all record at a time, median {:.1} ms) | | | | | |", latency(bootstrap, "rf3b.t").as_secs_f64() * 1e3);
    drop(all);
    println!();
    println!("| ratio | value |");
    println!("| --- | --- |");
    let rate = |r: &Row| r.records as f64 / r.secs;
    println!("| RF=3 acks=all / single node acks=all | {:.0}% |", 100.0 * rate(&rf3_all) / rate(&single.1));
    println!("| RF=3 acks=1 / single node acks=1 | {:.0}% |", 100.0 * rate(&rf3_1) / rate(&single.0));
    println!("| RF=1 on 3 nodes / single node, acks=all | {:.0}% |", 100.0 * rate(&rf1) / rate(&single.1));
    println!();
    println!("replication lag, RF=3 acks=1: every hw at the log end {:.0} ms after the last acknowledgement", lag.as_secs_f64() * 1e3);
    // REST through the partition's leader, and through another node, which
    // forwards each request to the leader (acks=all, RF=3).
    let all: Vec<&ChildBroker> = nodes.iter().flatten().collect();
    create_topic(bootstrap, "rest.t", 3, &[("min.insync.replicas", "2")]);
    let leader = leader_of_0(bootstrap, "rest.t");
    let other = (1..=3).find(|id| *id != leader).unwrap();
    let rest_records = records / 5;
    println!();
    println!("| setup | records | records/s | MB/s | seconds | broker CPU s/GB |");
    println!("| --- | --- | --- | --- | --- | --- |");
    let direct = rest_post(nodes[leader as usize].as_ref().unwrap().rest, &all, "rest.t", rest_records, "REST to partition 0's leader, RF=3, acks=all");
    direct.print();
    let forwarded = rest_post(nodes[other as usize].as_ref().unwrap().rest, &all, "rest.t", rest_records, "REST through another node (forwarded), RF=3, acks=all");
    forwarded.print();
    println!();
    println!("| REST forwarded / REST at the leader | {:.0}% (broker CPU s/GB {:.0}% of the leader's) |", 100.0 * rate(&forwarded) / rate(&direct), 100.0 * forwarded.cpu_per_gb() / direct.cpu_per_gb());
    drop(all);
    let took = failover(&mut nodes, "rf3b.t");
    println!("failover: kill -9 of partition 0's leader to the first acks=all record acknowledged by its successor: {:.2} s (broker session timeout 3 s)", took.as_secs_f64());
    drop(nodes);
    drop(etcd);

    // RF=3 acks=all with followers fetching over plaintext and over mutual
    // TLS (an SSL inter-broker listener requiring client certificates),
    // each on a fresh cluster, so neither runs on the other's leftovers.
    println!();
    println!("| setup | records | records/s | MB/s | seconds | broker CPU s/GB |");
    println!("| --- | --- | --- | --- | --- | --- |");
    let fresh = |name: &str, tls: bool| -> Row {
        let dir = root.path().join(name);
        std::fs::create_dir_all(&dir).unwrap();
        if tls {
            pki(&dir, &["node-1", "node-2", "node-3"]);
        }
        let etcd = Etcd::start(&dir);
        let nodes: Vec<ChildBroker> = (1..=3).map(|id| if tls { spawn_node_extra(&dir, id, &etcd, &mtls_args(&dir, id)) } else { spawn_node(&dir, id, &etcd) }).collect();
        std::thread::sleep(Duration::from_secs(3));
        let all: Vec<&ChildBroker> = nodes.iter().collect();
        create_topic(nodes[0].kafka, "rf3.t", 3, &[("min.insync.replicas", "2")]);
        let row = produce(nodes[0].kafka, &all, "rf3.t", "all", records, if tls { "fresh 3 nodes, RF=3, acks=all, followers over mutual TLS" } else { "fresh 3 nodes, RF=3, acks=all, followers over plaintext" });
        row.print();
        row
    };
    let plain = fresh("plain", false);
    let tls = fresh("mtls", true);
    println!();
    println!("| RF=3 acks=all, followers over mutual TLS / over plaintext (fresh clusters) | {:.0}% (broker CPU s/GB {:.0}% of plaintext's) |", 100.0 * rate(&tls) / rate(&plain), 100.0 * tls.cpu_per_gb() / plain.cpu_per_gb());
}
