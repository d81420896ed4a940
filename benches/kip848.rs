//! Issue 23's benchmarks, against a release broker child process, in one
//! run:
//!
//! ```text
//! cargo bench --bench kip848            # full run
//! cargo bench --bench kip848 -- --quick # shorter
//! ```
//!
//! 1. **A member joins a group of 10**, classic protocol (librdkafka's
//!    default eager `range`, and `cooperative-sticky`) against the
//!    consumer protocol (KIP-848), on a topic of 44 partitions a producer
//!    writes at a steady rate. Measured: time from the new member's
//!    `subscribe()` to its first record, and what the other ten consume
//!    in the 5 s after it starts against their rate in the 5 s before (the
//!    baseline, same run): over the whole window, scaled by the share of
//!    partitions they keep (40 of 44), and in the worst half second (a
//!    stop-the-world pause shows there, even when the ten catch up later).
//! 2. **Broker CPU per fetch of 1,000 partitions** (idle, no new records),
//!    full requests without a session against incremental requests in a
//!    session (KIP-227): broker CPU microseconds per request, from its
//!    `/proc` counters, over the same number of requests.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
use kafka_protocol::messages::{FetchRequest, FetchResponse, TopicName};
use kafka_protocol::protocol::StrBytes;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::producer::{BaseRecord, Producer, ThreadedProducer, DefaultProducerContext};

#[path = "../tests/it/common.rs"]
mod common;
#[path = "support/proc_cpu.rs"]
mod proc_cpu;
use proc_cpu::cpu_secs;

const PARTITIONS: i32 = 44;
const GROUP: usize = 10;

fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    let fetch_only = std::env::args().any(|a| a == "--fetch-only");
    let dir = tempfile::tempdir().unwrap();
    let broker = common::ChildBroker::spawn(dir.path(), &["--group-initial-rebalance-delay-ms", "0", "--group-consumer-heartbeat-interval-ms", "500", "--group-consumer-session-timeout-ms", "10000"]);
    let addr = broker.kafka;
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let window = Duration::from_secs(if quick { 3 } else { 5 });
    let rate = 20_000u64;

    if !fetch_only {
    println!("a member joins a group of {GROUP} (release broker, loopback, {PARTITIONS} partitions, producer at {rate} records/s, {} s windows)\n", window.as_secs());
    println!("  {:<30} {:>8} {:>12} {:>12} {:>10} {:>14}", "protocol", "first ms", "before r/s", "after r/s", "kept-share", "worst 0.5 s");
    for (label, protocol, assignor) in [("classic, eager range", "classic", "range"), ("classic, cooperative-sticky", "classic", "cooperative-sticky"), ("consumer (KIP-848), uniform", "consumer", "")] {
        let topic = format!("bench.kip848.{}", protocol.to_owned() + assignor);
        rt.block_on(common::create_topic(addr, &topic, PARTITIONS));
        let r = join_run(addr, &topic, protocol, assignor, rate, window);
        let kept = r.before * (PARTITIONS as f64 - 4.0) / PARTITIONS as f64;
        println!("  {label:<30} {:>8.0} {:>12.0} {:>12.0} {:>9.0}% {:>13.0}%", r.first_ms, r.before, r.after, 100.0 * r.after / kept, 100.0 * r.worst / kept);
    }
    }

    let requests = if quick { 300 } else { 1000 };
    rt.block_on(common::create_topic(addr, "bench.sessions", 1000));
    let (full, incremental) = rt.block_on(fetch_cpu(addr, broker.child.id(), "bench.sessions", requests));
    println!("\nbroker CPU per Fetch of 1,000 idle partitions, {requests} requests each:");
    println!("  full, no session (baseline)   {:>8.1} µs", full);
    println!("  incremental, in a session     {:>8.1} µs   {:.2}x baseline", incremental, incremental / full);
    println!("  request bytes: full {} vs incremental {}", encoded(&fetch("bench.sessions", (0, -1), 1000)), encoded(&fetch("bench.sessions", (1, 1), 0)));
    broker.terminate();
}

struct JoinRun {
    first_ms: f64,
    before: f64,
    after: f64,
    /// The ten's lowest rate over any half second after the newcomer
    /// started (records/s).
    worst: f64,
}

fn member(addr: SocketAddr, topic: &str, group: &str, protocol: &str, assignor: &str) -> BaseConsumer {
    let mut c = common::client(addr);
    c.set("group.id", group).set("enable.auto.commit", "true").set("auto.offset.reset", "latest").set("fetch.wait.max.ms", "100");
    if protocol == "consumer" {
        c.set("group.protocol", "consumer");
    } else {
        c.set("session.timeout.ms", "10000").set("heartbeat.interval.ms", "500").set("partition.assignment.strategy", assignor);
    }
    let m: BaseConsumer = c.create().unwrap();
    m.subscribe(&[topic]).unwrap();
    m
}

/// Ten members consume under a steady load; an eleventh joins.
fn join_run(addr: SocketAddr, topic: &str, protocol: &str, assignor: &str, rate: u64, window: Duration) -> JoinRun {
    let group = format!("{topic}.group");
    let stop = Arc::new(AtomicBool::new(false));
    let consumed = Arc::new(AtomicU64::new(0));
    // The producer: `rate` records/s, spread over the partitions.
    let producer_thread = {
        let (stop, topic) = (stop.clone(), topic.to_owned());
        let producer: ThreadedProducer<DefaultProducerContext> = common::producer_config(addr, "1").set("linger.ms", "5").create().unwrap();
        std::thread::spawn(move || {
            let started = Instant::now();
            let mut sent = 0u64;
            while !stop.load(Ordering::SeqCst) {
                let due = (started.elapsed().as_secs_f64() * rate as f64) as u64;
                while sent < due {
                    let key = sent.to_string();
                    if producer.send(BaseRecord::to(&topic).key(&key).payload("v").partition((sent % PARTITIONS as u64) as i32)).is_err() {
                        producer.poll(Duration::from_millis(1));
                        continue;
                    }
                    sent += 1;
                }
                std::thread::sleep(Duration::from_millis(2));
            }
            producer.flush(Duration::from_secs(10)).unwrap();
        })
    };
    let members: Vec<_> = (0..GROUP)
        .map(|_| {
            let (stop, consumed) = (stop.clone(), consumed.clone());
            let m = member(addr, topic, &group, protocol, assignor);
            std::thread::spawn(move || {
                while !stop.load(Ordering::SeqCst) {
                    if let Some(Ok(_)) = m.poll(Duration::from_millis(20)) {
                        consumed.fetch_add(1, Ordering::Relaxed);
                    }
                }
                m.unsubscribe();
                let _ = m.poll(Duration::from_millis(200));
            })
        })
        .collect();
    // Settle: every partition consumed at the producer's rate.
    std::thread::sleep(Duration::from_secs(8));
    let c0 = consumed.load(Ordering::Relaxed);
    std::thread::sleep(window);
    let before = (consumed.load(Ordering::Relaxed) - c0) as f64 / window.as_secs_f64();
    // The newcomer; a sampler notes the ten's count every 100 ms.
    let c1 = consumed.load(Ordering::Relaxed);
    let started = Instant::now();
    let sampler = {
        let consumed = consumed.clone();
        std::thread::spawn(move || {
            let mut samples = Vec::new();
            while started.elapsed() < window {
                samples.push(consumed.load(Ordering::Relaxed));
                std::thread::sleep(Duration::from_millis(100));
            }
            samples
        })
    };
    let newcomer = member(addr, topic, &group, protocol, assignor);
    let mut first_ms = f64::NAN;
    while started.elapsed() < Duration::from_secs(60) {
        if let Some(Ok(_)) = newcomer.poll(Duration::from_millis(5)) {
            first_ms = started.elapsed().as_secs_f64() * 1000.0;
            break;
        }
    }
    let rest = window.saturating_sub(started.elapsed());
    let until = Instant::now() + rest;
    while Instant::now() < until {
        let _ = newcomer.poll(Duration::from_millis(20));
    }
    let after = (consumed.load(Ordering::Relaxed) - c1) as f64 / started.elapsed().as_secs_f64();
    let samples = sampler.join().unwrap();
    let worst = samples.windows(6).map(|w| (w[5] - w[0]) as f64 / 0.5).fold(f64::INFINITY, f64::min);
    stop.store(true, Ordering::SeqCst);
    newcomer.unsubscribe();
    let _ = newcomer.poll(Duration::from_millis(200));
    for m in members {
        m.join().unwrap();
    }
    producer_thread.join().unwrap();
    JoinRun { first_ms, before, after, worst }
}

fn encoded(r: &FetchRequest) -> usize {
    use kafka_protocol::protocol::Encodable;
    let mut b = bytes::BytesMut::new();
    r.encode(&mut b, 12).unwrap();
    b.len()
}

fn fetch(topic: &str, session: (i32, i32), partitions: i32) -> FetchRequest {
    let topics = if partitions == 0 {
        vec![]
    } else {
        let parts = (0..partitions).map(|p| FetchPartition::default().with_partition(p).with_fetch_offset(0).with_partition_max_bytes(1 << 20)).collect();
        vec![FetchTopic::default().with_topic(TopicName(StrBytes::from_string(topic.to_owned()))).with_partitions(parts)]
    };
    FetchRequest::default().with_replica_id((-1).into()).with_max_wait_ms(0).with_max_bytes(50 << 20).with_session_id(session.0).with_session_epoch(session.1).with_topics(topics)
}

/// Broker CPU µs per request: full fetches without a session, then
/// incremental ones in a session (same count).
async fn fetch_cpu(addr: SocketAddr, pid: u32, topic: &str, requests: usize) -> (f64, f64) {
    let mut sock = tokio::net::TcpStream::connect(addr).await.unwrap();
    let full = fetch(topic, (0, -1), 1000);
    for i in 0..20 {
        let _: FetchResponse = common::call(&mut sock, 1, 12, i, &full).await;
    }
    let t0 = cpu_secs(pid);
    for i in 0..requests {
        let r: FetchResponse = common::call(&mut sock, 1, 12, i as i32, &full).await;
        assert_eq!(r.responses[0].partitions.len(), 1000);
    }
    let full_us = (cpu_secs(pid) - t0) * 1e6 / requests as f64;
    let r: FetchResponse = common::call(&mut sock, 1, 12, 0, &fetch(topic, (0, 0), 1000)).await;
    let id = r.session_id;
    assert!(id > 0, "a session");
    let t0 = cpu_secs(pid);
    for i in 0..requests {
        let r: FetchResponse = common::call(&mut sock, 1, 12, i as i32, &fetch(topic, (id, i as i32 + 1), 0)).await;
        assert_eq!(r.error_code, 0);
        assert!(r.responses.is_empty());
    }
    let inc_us = (cpu_secs(pid) - t0) * 1e6 / requests as f64;
    (full_us, inc_us)
}
