//! Load tool: a real librdkafka producer and consumer against a release
//! broker child process, on loopback.
//!
//! ```text
//! cargo bench --bench load            # full run (~5 GiB written)
//! cargo bench --bench load -- --quick # 10x fewer records
//! cargo bench --bench load -- --producer [--quick]  # idempotence, codecs
//! cargo bench --bench load -- --transactions [--quick]  # 100 records per transaction
//! cargo bench --bench load -- --tip [--quick]  # catch-up readers in the tip, index vs scan
//! cargo bench --bench load -- --stream [--quick]  # subtree streams vs per-tp reads, tip and disk
//! cargo bench --bench load -- --metrics [--quick]  # produce with metrics on (scraped every second) vs off:
//!                                                   # pipelined raw requests (broker-bound), then librdkafka
//! cargo bench --bench load -- --baseline BIN [--quick]  # this build vs another (BIN: its release canopy):
//!                                                        # broker-bound produce (acks=1, all) and consume
//! ```
//!
//! Reports records/s, MB/s and broker CPU (utime+stime of the child from
//! /proc, as a share of one core) for: produce of 100-byte and 1 KiB
//! records with acks=1 and acks=all into 1 and 16 partitions; consume of a
//! 1 GiB log of 1 KiB records from the beginning; recovery of that log after
//! kill -9; and, as the baseline measured in the same run, loopback TCP
//! bandwidth with iperf3 (Debian package `iperf3`; the tool fails if it is
//! missing).

use std::net::SocketAddr;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::producer::{BaseRecord, Producer, ThreadedProducer};
use rdkafka::{Offset, TopicPartitionList};

#[path = "../tests/it/common.rs"]
mod common;
#[path = "support/delivery.rs"]
mod delivery;

use common::ChildBroker as Broker;
use delivery::{Counter, Ctx};

fn spawn_broker(dir: &Path) -> Broker {
    Broker::spawn(dir, &["--segment-bytes", "2147483648", "--flush", "always"])
}

/// CPU seconds (user + system) the broker process has used.
fn cpu_secs(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("proc stat");
    let after = &stat[stat.rfind(')').unwrap() + 2..];
    let f: Vec<&str> = after.split(' ').collect();
    let ticks: f64 = f[11].parse::<f64>().unwrap() + f[12].parse::<f64>().unwrap();
    ticks / 100.0
}


fn create_topic(addr: SocketAddr, name: &str, partitions: i32) {
    let admin: AdminClient<DefaultClientContext> = common::client(addr).create().unwrap();
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let r = rt.block_on(admin.create_topics([&NewTopic::new(name, partitions, TopicReplication::Fixed(1))], &AdminOptions::new())).unwrap();
    r[0].as_ref().expect("topic created");
}

struct Row {
    name: String,
    records: u64,
    bytes: u64,
    secs: f64,
    cpu: f64,
    client_cpu: f64,
}

impl Row {
    fn print(&self) {
        println!(
            "| {} | {} | {:.0} | {:.1} | {:.2} | {:.0}% | {:.0}% |",
            self.name,
            self.records,
            self.records as f64 / self.secs,
            self.bytes as f64 / self.secs / 1e6,
            self.secs,
            100.0 * self.cpu / self.secs,
            100.0 * self.client_cpu / self.secs
        );
    }
}

fn produce(broker: &Broker, topic: &str, partitions: i32, size: usize, acks: &str, records: u64) -> Row {
    produce_with(broker, topic, partitions, size, acks, records, &[], "")
}

/// Text-like payloads (words from a small vocabulary, so they compress
/// about as well as JSON events do), 1,024 of them, `size` bytes each.
fn payloads(size: usize) -> Vec<Vec<u8>> {
    const WORDS: [&str; 16] = ["user", "event", "click", "view", "id", "ts", "session", "page", "app", "codestore", "commit", "42", "true", "null", "ok", "sha"];
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    (0..1024)
        .map(|_| {
            let mut p = Vec::with_capacity(size + 16);
            while p.len() < size {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                p.extend_from_slice(WORDS[(x % 16) as usize].as_bytes());
                p.push(if x & 32 == 0 { b' ' } else { b':' });
                p.extend_from_slice((x % 10_000).to_string().as_bytes());
                p.push(b',');
            }
            p.truncate(size);
            p
        })
        .collect()
}

/// Produces `records` records of `size` bytes with librdkafka settings
/// `extra` on top of the defaults (no compression, no idempotence).
#[allow(clippy::too_many_arguments)]
fn produce_with(broker: &Broker, topic: &str, partitions: i32, size: usize, acks: &str, records: u64, extra: &[(&str, &str)], label: &str) -> Row {
    create_topic(broker.kafka, topic, partitions);
    let counter = Arc::new(Counter::default());
    let mut cfg = common::client(broker.kafka);
    cfg.set("acks", acks)
        .set("linger.ms", "5")
        .set("batch.size", "1000000")
        .set("batch.num.messages", "100000")
        .set("queue.buffering.max.messages", "2000000")
        .set("queue.buffering.max.kbytes", "1048576")
        .set("compression.type", "none")
        .set("enable.idempotence", "false");
    for (k, v) in extra {
        cfg.set(*k, *v);
    }
    let producer: ThreadedProducer<Ctx> = cfg.create_with_context(Ctx(counter.clone())).unwrap();
    let payloads = payloads(size);
    let cpu0 = cpu_secs(broker.child.id());
    let me0 = cpu_secs(std::process::id());
    let t0 = Instant::now();
    for i in 0..records {
        let rec: BaseRecord<'_, (), [u8]> = BaseRecord::to(topic).payload(&payloads[(i % 1024) as usize][..]).partition((i % partitions as u64) as i32);
        common::send_waiting(&producer, rec).unwrap_or_else(|e| panic!("produce: {e}"));
    }
    producer.flush(Duration::from_secs(600)).unwrap();
    let secs = t0.elapsed().as_secs_f64();
    let cpu = cpu_secs(broker.child.id()) - cpu0;
    let client_cpu = cpu_secs(std::process::id()) - me0;
    assert_eq!(counter.failed.load(Ordering::Relaxed), 0, "deliveries failed");
    assert_eq!(counter.ok.load(Ordering::Relaxed), records);
    Row { name: format!("produce {size} B, acks={acks}, {partitions} partition(s){label}"), records, bytes: records * size as u64, secs, cpu, client_cpu }
}

fn best(v: &[f64]) -> f64 {
    v.iter().copied().fold(0.0, f64::max)
}

fn least(v: &[f64]) -> f64 {
    v.iter().copied().fold(f64::MAX, f64::min)
}

/// Best of the runs with metrics on against best off, and the least
/// broker CPU of each; `[off, on]`.
fn on_vs_off(rate_unit: &str, rate: [&[f64]; 2], cpu_unit: &str, cpu: [&[f64]; 2]) -> String {
    let (r, c) = ([best(rate[0]), best(rate[1])], [least(cpu[0]), least(cpu[1])]);
    format!(
        "best of 3, metrics on {:.0} {rate_unit} vs off {:.0}: {:+.1}% throughput; least broker CPU {:.2} {cpu_unit} on vs {:.2} off ({:+.1}%)",
        r[1],
        r[0],
        100.0 * (r[1] / r[0] - 1.0),
        c[1],
        c[0],
        100.0 * (c[1] / c[0] - 1.0)
    )
}

/// Scrapes `/metrics` on `admin` once a second until `stop`, as a
/// Prometheus would; every scrape must answer 200. Returns the scrapes.
fn scrape_every_second(admin: SocketAddr, stop: Arc<std::sync::atomic::AtomicBool>) -> std::thread::JoinHandle<u64> {
    std::thread::spawn(move || {
        let mut n = 0u64;
        while !stop.load(Ordering::Relaxed) {
            use std::io::{Read, Write};
            let mut s = std::net::TcpStream::connect(admin).unwrap();
            s.write_all(b"GET /metrics HTTP/1.0\r\n\r\n").unwrap();
            let mut body = Vec::new();
            s.read_to_end(&mut body).unwrap();
            assert!(body.starts_with(b"HTTP/1.0 200") || body.starts_with(b"HTTP/1.1 200"));
            n += 1;
            std::thread::sleep(Duration::from_secs(1));
        }
        n
    })
}

/// What metrics cost (issue 8): the same produce load against a broker
/// with `--metrics-enabled false` and one with metrics on and scraped
/// every second, alternating three times so drift hits both alike; the
/// best run of each is compared. 100-byte records, acks=1 and acks=all,
/// 16 partitions.
fn metrics_cost(dir: &Path, scale: u64) {
    let n = 3_000_000 / scale;
    for acks in ["1", "all"] {
        let (mut off, mut on) = (Vec::new(), Vec::new());
        let (mut cpu_off, mut cpu_on) = (Vec::new(), Vec::new());
        let mut scrapes = 0u64;
        for run in 0..3 {
            for enabled in [false, true] {
                let data = dir.join(format!("metrics-{acks}-{run}-{enabled}"));
                let broker = Broker::spawn(&data, &["--segment-bytes", "2147483648", "--flush", "always", "--metrics-enabled", if enabled { "true" } else { "false" }]);
                let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
                let scraper = enabled.then(|| scrape_every_second(broker.admin, stop.clone()));
                let label = if enabled { ", metrics on, scraped every 1 s" } else { ", metrics off" };
                let r = produce_with(&broker, "bench.metrics", 16, 100, acks, n, &[], label);
                stop.store(true, Ordering::Relaxed);
                if let Some(s) = scraper {
                    scrapes += s.join().unwrap();
                }
                r.print();
                let (rate, cpu) = (r.records as f64 / r.secs, r.cpu / r.records as f64 * 1e6);
                if enabled {
                    on.push(rate);
                    cpu_on.push(cpu);
                } else {
                    off.push(rate);
                    cpu_off.push(cpu);
                }
                broker.kill9();
                let _ = std::fs::remove_dir_all(&data);
            }
        }
        println!("\nacks={acks}: {}; {scrapes} scrapes\n", on_vs_off("records/s", [&off, &on], "s per million records", [&cpu_off, &cpu_on]));
    }
}

/// The broker-bound arm of the metrics comparison. librdkafka needs most
/// of the 2 cores to produce, so its runs swing more than the 3% being
/// measured; here the client writes one pre-encoded Produce request (v9,
/// acks=1, one batch of 10 records of 100 bytes) over and over on 4
/// pipelined connections, 32 requests in flight each, so nearly all CPU
/// is the broker's and every request pays the probes (request counter,
/// latency histogram, traffic atomics). Each run lasts `secs`; after it
/// the high watermarks must add up to the records acknowledged.
fn metrics_cost_broker_bound(dir: &Path, secs: f64) {
    const CONNS: i32 = 4;
    const WINDOW: usize = 32;
    const RECORDS: u64 = 10;
    let payloads = payloads(100);
    let values: Vec<&[u8]> = payloads.iter().take(RECORDS as usize).map(|p| &p[..]).collect();
    let batch = common::record_batch(&values);
    let request = |partition: i32| produce_frame("bench.raw", partition, 1, &batch);
    let (mut rate, mut cpu) = ([Vec::new(), Vec::new()], [Vec::new(), Vec::new()]);
    println!("\n| broker-bound produce (4 conns x 32 in flight, 10 x 100 B per request, acks=1) | requests/s | records/s | broker CPU | broker CPU µs per request |");
    println!("| --- | --- | --- | --- | --- |");
    for run in 0..3 {
        for enabled in [false, true] {
            let data = dir.join(format!("metrics-raw-{run}-{enabled}"));
            let broker = Broker::spawn(&data, &["--segment-bytes", "2147483648", "--metrics-enabled", if enabled { "true" } else { "false" }]);
            create_topic(broker.kafka, "bench.raw", CONNS);
            let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
            let scraper = enabled.then(|| scrape_every_second(broker.admin, stop.clone()));
            let cpu0 = cpu_secs(broker.child.id());
            let t0 = Instant::now();
            let deadline = t0 + Duration::from_secs_f64(secs);
            let workers: Vec<_> = (0..CONNS)
                .map(|p| {
                    let (addr, req) = (broker.kafka, request(p));
                    std::thread::spawn(move || common::pipeline(addr, &req, WINDOW, deadline))
                })
                .collect();
            let done: u64 = workers.into_iter().map(|w| w.join().unwrap()).sum();
            let elapsed = t0.elapsed().as_secs_f64();
            let used = cpu_secs(broker.child.id()) - cpu0;
            stop.store(true, Ordering::Relaxed);
            if let Some(s) = scraper {
                s.join().unwrap();
            }
            let consumer: BaseConsumer = common::client(broker.kafka).create().unwrap();
            let stored: i64 = (0..CONNS).map(|p| consumer.fetch_watermarks("bench.raw", p, Duration::from_secs(10)).unwrap().1).sum();
            assert_eq!(stored as u64, done * RECORDS, "every acknowledged record is in the log");
            let (r, c) = (done as f64 / elapsed, used / done as f64 * 1e6);
            println!("| metrics {} {run} | {r:.0} | {:.0} | {:.0}% | {c:.2} |", if enabled { "on" } else { "off" }, r * RECORDS as f64, 100.0 * used / elapsed);
            rate[enabled as usize].push(r);
            cpu[enabled as usize].push(c);
            broker.kill9();
            let _ = std::fs::remove_dir_all(&data);
        }
    }
    println!("\nbroker-bound produce: {}\n", on_vs_off("requests/s", [&rate[0], &rate[1]], "µs per request", [&cpu[0], &cpu[1]]));
}

/// A framed Produce v9 request: `batch` for `partition` of `topic`.
fn produce_frame(topic: &str, partition: i32, acks: i16, batch: &bytes::Bytes) -> Vec<u8> {
    use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
    use kafka_protocol::messages::{ProduceRequest, TopicName};
    use kafka_protocol::protocol::{Encodable, StrBytes};
    let req = ProduceRequest::default().with_acks(acks).with_timeout_ms(30_000).with_topic_data(vec![TopicProduceData::default()
        .with_name(TopicName(StrBytes::from_string(topic.to_owned())))
        .with_partition_data(vec![PartitionProduceData::default().with_index(partition).with_records(Some(batch.clone()))])]);
    let mut body = bytes::BytesMut::new();
    req.encode(&mut body, 9).unwrap();
    common::request_frame(0, 9, partition, &body)
}


/// What the hardening costs (issue 19): the current build against a
/// baseline build (`--baseline BIN`, the broker before the memory budget,
/// the ordering gate, duplicate collapsing and the validation pool),
/// alternating three times, in this one run. Broker-bound, like the
/// metrics arm: pre-encoded Produce requests of 10 x 100 B records
/// pipelined on 4 connections (acks=1 and acks=all), then a raw consume of
/// a 4-partition log of 100 B records (10,000-record batches) from offset
/// 0, one connection per partition. Reports the best rate of each build
/// and the least broker CPU per GB.
fn hardening_cost(dir: &Path, baseline: &Path, secs: f64, scale: u64) {
    const CONNS: i32 = 4;
    const RECORDS: u64 = 10;
    let current = Path::new(env!("CARGO_BIN_EXE_canopy"));
    let payloads = payloads(100);
    let values: Vec<&[u8]> = payloads.iter().take(RECORDS as usize).map(|p| &p[..]).collect();
    let batch = common::record_batch(&values);
    let batch_bytes = batch.len() as f64;
    let request = |partition: i32, acks: i16| produce_frame("bench.hardening", partition, acks, &batch);
    let builds = [("baseline", baseline), ("current", current)];
    // [build][arm] rates and CPU s/GB
    let mut rate = vec![vec![Vec::new(); 3]; 2];
    let mut cpu = vec![vec![Vec::new(); 3]; 2];
    println!("\n| build | run | arm | rate | MB/s | broker CPU | broker CPU s/GB |");
    println!("| --- | --- | --- | --- | --- | --- | --- |");
    for run in 0..3 {
        for (b, (name, bin)) in builds.iter().enumerate() {
            for (arm, acks) in [(0usize, 1i16), (1, -1)] {
                let data = dir.join(format!("hardening-{name}-{run}-{acks}"));
                let broker = Broker::spawn_binary(bin, &[], &data, &["--segment-bytes", "2147483648", "--flush", "always"]);
                create_topic(broker.kafka, "bench.hardening", CONNS);
                let cpu0 = cpu_secs(broker.child.id());
                let t0 = Instant::now();
                let deadline = t0 + Duration::from_secs_f64(secs);
                let workers: Vec<_> = (0..CONNS)
                    .map(|p| {
                        let (addr, req) = (broker.kafka, request(p, acks));
                        std::thread::spawn(move || common::pipeline(addr, &req, 32, deadline))
                    })
                    .collect();
                let done: u64 = workers.into_iter().map(|w| w.join().unwrap()).sum();
                let elapsed = t0.elapsed().as_secs_f64();
                let used = cpu_secs(broker.child.id()) - cpu0;
                let consumer: BaseConsumer = common::client(broker.kafka).create().unwrap();
                let stored: i64 = (0..CONNS).map(|p| consumer.fetch_watermarks("bench.hardening", p, Duration::from_secs(10)).unwrap().1).sum();
                assert_eq!(stored as u64, done * RECORDS, "every acknowledged record is in the log");
                let bytes = done as f64 * batch_bytes;
                let (r, c) = (done as f64 * RECORDS as f64 / elapsed, used / (bytes / 1e9));
                println!("| {name} | {run} | produce acks={} | {r:.0} records/s | {:.1} | {:.0}% | {c:.2} |", if acks == 1 { "1" } else { "all" }, bytes / elapsed / 1e6, 100.0 * used / elapsed);
                rate[b][arm].push(r);
                cpu[b][arm].push(c);
                broker.kill9();
                let _ = std::fs::remove_dir_all(&data);
            }
            // Consume: a log written by librdkafka-sized batches, read raw.
            let data = dir.join(format!("hardening-{name}-{run}-consume"));
            let broker = Broker::spawn_binary(bin, &[], &data, &["--segment-bytes", "2147483648", "--flush", "interval:100", "--tip-bytes", "0"]);
            let per_partition = 1_000_000 / scale;
            fill_raw(broker.kafka, "bench.hardening.read", CONNS, per_partition);
            let cpu0 = cpu_secs(broker.child.id());
            let t0 = Instant::now();
            let readers: Vec<_> = (0..CONNS).map(|p| {
                let addr = broker.kafka;
                std::thread::spawn(move || read_raw(addr, "bench.hardening.read", p, per_partition as i64))
            }).collect();
            let bytes: u64 = readers.into_iter().map(|r| r.join().unwrap()).sum();
            let elapsed = t0.elapsed().as_secs_f64();
            let used = cpu_secs(broker.child.id()) - cpu0;
            let (r, c) = (bytes as f64 / elapsed, used / (bytes as f64 / 1e9));
            println!("| {name} | {run} | consume from disk | {:.0} records/s | {:.1} | {:.0}% | {c:.2} |", (per_partition * CONNS as u64) as f64 / elapsed, r / 1e6, 100.0 * used / elapsed);
            rate[b][2].push(r);
            cpu[b][2].push(c);
            broker.kill9();
            let _ = std::fs::remove_dir_all(&data);
        }
    }
    println!();
    for (arm, label) in ["produce 100 B acks=1", "produce 100 B acks=all", "consume 100 B records"].iter().enumerate() {
        let (rb, rc) = (best(&rate[0][arm]), best(&rate[1][arm]));
        let (cb, cc) = (least(&cpu[0][arm]), least(&cpu[1][arm]));
        println!("{label}: best of 3, current / baseline throughput {:+.1}%; least broker CPU per GB {cc:.2} s vs {cb:.2} s ({:+.1}%)", 100.0 * (rc / rb - 1.0), 100.0 * (cc / cb - 1.0));
    }
}

fn drive(addr: SocketAddr, secs: f64, acks: i16) {
    create_topic(addr, "bench.drive", 4);
    let payloads = payloads(100);
    let values: Vec<&[u8]> = payloads.iter().take(10).map(|p| &p[..]).collect();
    let batch = common::record_batch(&values);
    let deadline = Instant::now() + Duration::from_secs_f64(secs);
    let workers: Vec<_> = (0..4)
        .map(|p| {
let frame = produce_frame("bench.drive", p, acks, &batch);
            std::thread::spawn(move || common::pipeline(addr, &frame, 32, deadline))
        })
        .collect();
    let done: u64 = workers.into_iter().map(|w| w.join().unwrap()).sum();
    println!("drive: {done} produce requests in {secs} s");
}

/// Writes `per_partition` 100-byte records to each of `partitions`
/// partitions of a new topic, in batches of 10,000 (raw, acks=1).
fn fill_raw(addr: SocketAddr, topic: &str, partitions: i32, per_partition: u64) {
    create_topic(addr, topic, partitions);
    let payloads = payloads(100);
    let values: Vec<&[u8]> = (0..10_000).map(|i| &payloads[i % payloads.len()][..]).collect();
    let batch = common::record_batch(&values);
    let workers: Vec<_> = (0..partitions)
        .map(|p| {
let frame = produce_frame(topic, p, 1, &batch);
            let n = per_partition / 10_000;
            std::thread::spawn(move || {
                use std::io::{Read, Write};
                let mut s = std::net::TcpStream::connect(addr).unwrap();
                for _ in 0..n {
                    s.write_all(&frame).unwrap();
                    let mut len = [0u8; 4];
                    s.read_exact(&mut len).unwrap();
                    let mut b = vec![0u8; i32::from_be_bytes(len) as usize];
                    s.read_exact(&mut b).unwrap();
                }
            })
        })
        .collect();
    for w in workers {
        w.join().unwrap();
    }
}

/// Reads partition `p` of `topic` from offset 0 to `end` with raw Fetch
/// requests (v12, 1 MiB each); returns the record bytes read.
fn read_raw(addr: SocketAddr, topic: &str, p: i32, end: i64) -> u64 {
    use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
    use kafka_protocol::messages::{BrokerId, FetchRequest, FetchResponse, ResponseHeader, TopicName};
    use kafka_protocol::protocol::{Decodable, Encodable, StrBytes};
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_nodelay(true).unwrap();
    let (mut offset, mut bytes) = (0i64, 0u64);
    while offset < end {
        let req = FetchRequest::default().with_replica_id(BrokerId(-1)).with_max_wait_ms(100).with_min_bytes(1).with_max_bytes(1 << 20).with_topics(vec![FetchTopic::default()
            .with_topic(TopicName(StrBytes::from_string(topic.to_owned())))
            .with_partitions(vec![FetchPartition::default().with_partition(p).with_fetch_offset(offset).with_partition_max_bytes(1 << 20)])]);
        let mut body = bytes::BytesMut::new();
        req.encode(&mut body, 12).unwrap();
        s.write_all(&common::request_frame(1, 12, 1, &body)).unwrap();
        let mut len = [0u8; 4];
        s.read_exact(&mut len).unwrap();
        let mut b = vec![0u8; i32::from_be_bytes(len) as usize];
        s.read_exact(&mut b).unwrap();
        let mut b = bytes::Bytes::from(b);
        ResponseHeader::decode(&mut b, 1).unwrap();
        let r = FetchResponse::decode(&mut b, 12).unwrap();
        let part = &r.responses[0].partitions[0];
        assert_eq!(part.error_code, 0, "fetch error");
        let records = part.records.clone().unwrap_or_default();
        bytes += records.len() as u64;
        // Past the last complete batch.
        let mut rest = &records[..];
        while rest.len() >= 61 {
            let size = 12 + i32::from_be_bytes(rest[8..12].try_into().unwrap()) as usize;
            if size > rest.len() {
                break;
            }
            let base = i64::from_be_bytes(rest[0..8].try_into().unwrap());
            let delta = i32::from_be_bytes(rest[23..27].try_into().unwrap()) as i64;
            offset = base + delta + 1;
            rest = &rest[size..];
        }
    }
    bytes
}

/// Producer semantics (issue 4): idempotence on vs off, and each codec,
/// 100-byte text-like records, acks=all, 4 partitions. Runs alternate
/// off/on three times so drift hits both alike; the best of each is used.
/// librdkafka caps an idempotent producer at 5 requests in flight per
/// connection (off: 1,000,000), so "off" runs both ways: the 5-in-flight
/// arm is the baseline that isolates what idempotence costs the broker.
fn producer_semantics(broker: &Broker, scale: u64) {
    let n = 3_000_000 / scale;
    let (mut off, mut off5, mut on) = (Vec::new(), Vec::new(), Vec::new());
    let (mut cpu_off, mut cpu_on) = (Vec::new(), Vec::new());
    for run in 0..3 {
        let r = produce_with(broker, &format!("bench.idem.off.{run}"), 4, 100, "all", n, &[], ", idempotence off");
        r.print();
        off.push(r.records as f64 / r.secs);
        cpu_off.push(r.cpu / r.records as f64 * 1e6);
        let r = produce_with(broker, &format!("bench.idem.off5.{run}"), 4, 100, "all", n, &[("max.in.flight.requests.per.connection", "5")], ", idempotence off, 5 in flight");
        r.print();
        off5.push(r.records as f64 / r.secs);
        let r = produce_with(broker, &format!("bench.idem.on.{run}"), 4, 100, "all", n, &[("enable.idempotence", "true")], ", idempotence on");
        r.print();
        on.push(r.records as f64 / r.secs);
        cpu_on.push(r.cpu / r.records as f64 * 1e6);
    }
    let mut codecs = Vec::new();
    for codec in ["gzip", "snappy", "lz4", "zstd"] {
        let r = produce_with(broker, &format!("bench.codec.{codec}"), 4, 100, "all", n, &[("compression.type", codec)], &format!(", {codec}"));
        r.print();
        codecs.push((codec, r.records as f64 / r.secs));
    }
    println!("\nidempotence on / off with 5 in flight (best of 3 each), 100 B, acks=all, 4 partitions: {:.0}%", 100.0 * best(&on) / best(&off5));
    println!("idempotence on / off with librdkafka's default in-flight limit: {:.0}%", 100.0 * best(&on) / best(&off));
    println!(
        "broker CPU per million records (least of 3): idempotence off {:.3} s, on {:.3} s ({:.0}%); the client shares the 2 cores",
        least(&cpu_off),
        least(&cpu_on),
        100.0 * least(&cpu_on) / least(&cpu_off)
    );
    for (codec, rate) in codecs {
        println!("{codec} / uncompressed (best of 3), 100 B, acks=all, 4 partitions: {:.0}%", 100.0 * rate / best(&off));
    }
}

fn consume(broker: &Broker, topic: &str, records: u64) -> Row {
    let consumer: BaseConsumer = {
        let mut c = common::client(broker.kafka);
        c.set("group.id", "bench")
            .set("enable.auto.commit", "false")
            .set("fetch.max.bytes", "104857600")
            .set("queued.max.messages.kbytes", "262144")
            .set("fetch.wait.max.ms", "100")
            .set("max.partition.fetch.bytes", "4194304")
            .set("queued.min.messages", "1000000");
        c.create().unwrap()
    };
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(topic, 0, Offset::Beginning).unwrap();
    consumer.assign(&tpl).unwrap();
    let cpu0 = cpu_secs(broker.child.id());
    let me0 = cpu_secs(std::process::id());
    let t0 = Instant::now();
    let (mut n, mut bytes) = (0u64, 0u64);
    while n < records {
        if let Some(m) = consumer.poll(Duration::from_millis(1000)) {
            let m = m.expect("consume");
            bytes += m.payload().map(|p| p.len()).unwrap_or(0) as u64;
            n += 1;
        }
        assert!(t0.elapsed() < Duration::from_secs(900), "consume stalled at {n}");
    }
    let secs = t0.elapsed().as_secs_f64();
    let cpu = cpu_secs(broker.child.id()) - cpu0;
    let client_cpu = cpu_secs(std::process::id()) - me0;
    Row { name: "consume 1 KiB records from the beginning, 1 partition".into(), records: n, bytes, secs, cpu, client_cpu }
}

fn iperf3() -> f64 {
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port().to_string();
    let mut server = Command::new("iperf3")
        .args(["-s", "-1", "-p", &port])
        .stdout(Stdio::null())
        .spawn()
        .expect("iperf3 is required for the baseline: apt-get install iperf3");
    std::thread::sleep(Duration::from_millis(500));
    let out = Command::new("iperf3").args(["-c", "127.0.0.1", "-p", &port, "-t", "5", "-J"]).output().expect("iperf3 client");
    let _ = server.wait();
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("iperf3 json");
    v["end"]["sum_received"]["bits_per_second"].as_f64().expect("iperf3 result") / 8.0
}

/// Transactions of 100 records (100 B, acks=all, 4 partitions), one after
/// another from one librdkafka transactional producer, against the same
/// records from an idempotent producer in the same run (the baseline).
/// Every transaction pays AddPartitionsToTxn (a catalog flush), the
/// produce (an fsync) and EndTxn (a catalog flush, the markers' fsync).
fn transactions(broker: &Broker, scale: u64) {
    let txns = 3_000 / scale;
    let per = 100u64;
    let base = produce_with(broker, "bench.txn.baseline", 4, 100, "all", txns * per, &[("enable.idempotence", "true")], ", idempotent (baseline)");
    base.print();
    create_topic(broker.kafka, "bench.txn", 4);
    let mut cfg = common::client(broker.kafka);
    cfg.set("acks", "all").set("linger.ms", "0").set("transactional.id", "bench-txn").set("enable.idempotence", "true");
    if let Ok(d) = std::env::var("CANOPY_BENCH_RDKAFKA_DEBUG") {
        cfg.set("debug", d);
    }
    let counter = Arc::new(Counter::default());
    let producer: rdkafka::producer::BaseProducer<Ctx> = cfg.create_with_context(Ctx(counter.clone())).unwrap();
    producer.init_transactions(Duration::from_secs(30)).unwrap();
    let payloads = payloads(100);
    let cpu0 = cpu_secs(broker.child.id());
    let me0 = cpu_secs(std::process::id());
    let t0 = Instant::now();
    let mut commit_ms = Vec::with_capacity(txns as usize);
    for t in 0..txns {
        producer.begin_transaction().unwrap();
        for i in 0..per {
            let rec: BaseRecord<'_, (), [u8]> = BaseRecord::to("bench.txn").payload(&payloads[(i % 1024) as usize][..]).partition(((t * per + i) % 4) as i32);
            producer.send(rec).map_err(|(e, _)| e).unwrap();
        }
        let c0 = Instant::now();
        // Serve the delivery events until every record is acked: flush()
        // (and the flush inside commit_transaction) waits for them in
        // 100 ms steps under rust-rdkafka's event API, which would measure
        // the client's sleep, not the broker.
        let want = (t + 1) * per;
        while counter.ok.load(Ordering::Relaxed) + counter.failed.load(Ordering::Relaxed) < want {
            producer.poll(Duration::from_millis(1));
        }
        producer.commit_transaction(Duration::from_secs(30)).unwrap();
        commit_ms.push(c0.elapsed().as_secs_f64() * 1e3);
    }
    let secs = t0.elapsed().as_secs_f64();
    let row = Row { name: format!("produce 100 B, transactions of {per}, 4 partitions"), records: txns * per, bytes: txns * per * 100, secs, cpu: cpu_secs(broker.child.id()) - cpu0, client_cpu: cpu_secs(std::process::id()) - me0 };
    row.print();
    assert_eq!(counter.ok.load(Ordering::Relaxed), txns * per);
    commit_ms.sort_by(f64::total_cmp);
    println!(
        "\ntransactions/s {:.0}; acks of the last records + commit_transaction median {:.2} ms, p99 {:.2} ms",
        txns as f64 / secs,
        commit_ms[commit_ms.len() / 2],
        commit_ms[commit_ms.len() * 99 / 100]
    );
    println!("transactional (100 per transaction) / idempotent, records/s: {:.0}%", 100.0 * (row.records as f64 / row.secs) / (base.records as f64 / base.secs));
}

/// Catch-up readers in the tip (issue 5): 1,000 single-partition topics in
/// 100 branches hold a tip of 1 KiB records; `readers` librdkafka
/// consumers, each assigned one topic from the beginning (all of it in the
/// tip), read it to its end while a producer keeps writing to the other
/// topics at about `rate` MB/s. Broker CPU during the reading phase per
/// delivered GB, for `tip_lookup = index` and `scan`, one broker each,
/// same run. Every fetch asks for at most 64 KiB per partition, as a
/// consumer throttled to its share does, so a reader makes many fetches.
/// Batches hold one record each (the tip's worst case: most slots per
/// byte).
fn tip_catch_up(dir: &Path, scale: u64) {
    const TOPICS: usize = 1000;
    let fill_records = 600_000 / scale;
    let readers = (200 / scale).max(20) as usize;
    let rate = 20.0; // MB/s: what the 2 cores leave beside 200 readers
    let mut results = Vec::new();
    for lookup in ["index", "scan"] {
        let broker = Broker::spawn(&dir.join(lookup), &["--tip-bytes", "1073741824", "--tip-lookup", lookup, "--flush", "interval:100"]);
        let name = |i: usize| format!("bench.b{}.t{i}", i % 100);
        {
            let admin: AdminClient<DefaultClientContext> = common::client(broker.kafka).create().unwrap();
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            let names: Vec<String> = (0..TOPICS).map(name).collect();
            let topics: Vec<NewTopic> = names.iter().map(|n| NewTopic::new(n, 1, TopicReplication::Fixed(1))).collect();
            for chunk in topics.chunks(100) {
                let r = rt.block_on(admin.create_topics(chunk.iter(), &AdminOptions::new())).unwrap();
                assert!(r.iter().all(|x| x.is_ok()), "topics created");
            }
        }
        let payload = vec![b'r'; 1024];
        let mut cfg = common::client(broker.kafka);
        // One record per batch: the many small batches of a high-rate
        // stream over many topics, which is what fills a tip's slots.
        cfg.set("acks", "1").set("linger.ms", "5").set("batch.num.messages", "1").set("queue.buffering.max.messages", "2000000").set("queue.buffering.max.kbytes", "1048576");
        let producer: Arc<ThreadedProducer<rdkafka::producer::DefaultProducerContext>> = Arc::new(cfg.create().unwrap());
        let send = |p: &ThreadedProducer<rdkafka::producer::DefaultProducerContext>, i: u64| {
            let topic = name((i % TOPICS as u64) as usize);
            let mut rec: BaseRecord<'_, (), [u8]> = BaseRecord::to(&topic).payload(&payload[..]).partition(0);
            loop {
                match p.send(rec) {
                    Ok(()) => break,
                    Err((_, r)) => {
                        rec = r;
                        std::thread::sleep(Duration::from_micros(200));
                    }
                }
            }
        };
        for i in 0..fill_records {
            send(&producer, i);
        }
        producer.flush(Duration::from_secs(300)).unwrap();
        let per_topic = fill_records / TOPICS as u64;
        // The background producer: other topics (odd ones; readers take even ones).
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let bg = {
            let stop = stop.clone();
            let producer = producer.clone();
            let payload = payload.clone();
            std::thread::spawn(move || {
                let mut i = 0u64;
                let t0 = Instant::now();
                while !stop.load(Ordering::Relaxed) {
                    let due = (t0.elapsed().as_secs_f64() * rate * 1e6 / 1024.0) as u64;
                    while i < due {
                        let topic = format!("bench.b{}.t{}", (2 * i + 1) % 100, (2 * i + 1) % TOPICS as u64);
                        let _ = producer.send(BaseRecord::<(), [u8]>::to(&topic).payload(&payload[..]).partition(0));
                        i += 1;
                    }
                    std::thread::sleep(Duration::from_millis(5));
                }
                i
            })
        };
        let cpu0 = cpu_secs(broker.child.id());
        let t0 = Instant::now();
        let delivered = Arc::new(AtomicU64::new(0));
        let handles: Vec<_> = (0..readers)
            .map(|r| {
                let addr = broker.kafka;
                let topic = name(2 * r % TOPICS);
                let delivered = delivered.clone();
                std::thread::spawn(move || {
                    let mut c = common::client(addr);
                    c.set("group.id", "bench-tip").set("enable.auto.commit", "false").set("fetch.wait.max.ms", "100").set("max.partition.fetch.bytes", "65536").set("fetch.max.bytes", "65536").set("message.max.bytes", "65536");
                    let consumer: BaseConsumer = c.create().unwrap();
                    let mut tpl = TopicPartitionList::new();
                    tpl.add_partition_offset(&topic, 0, Offset::Beginning).unwrap();
                    consumer.assign(&tpl).unwrap();
                    let mut n = 0u64;
                    let deadline = Instant::now() + Duration::from_secs(600);
                    while n < per_topic {
                        if let Some(m) = consumer.poll(Duration::from_millis(200)) {
                            let m = m.expect("consume");
                            delivered.fetch_add(m.payload().map_or(0, |p| p.len()) as u64, Ordering::Relaxed);
                            n += 1;
                        }
                        assert!(Instant::now() < deadline, "reader of {topic} stalled at {n}");
                    }
                })
            })
            .collect();
        for h in handles {
            h.join().unwrap();
        }
        let secs = t0.elapsed().as_secs_f64();
        let cpu = cpu_secs(broker.child.id()) - cpu0;
        stop.store(true, Ordering::Relaxed);
        let produced = bg.join().unwrap();
        producer.flush(Duration::from_secs(60)).unwrap();
        let gb = delivered.load(Ordering::Relaxed) as f64 / 1e9;
        println!(
            "| tip_lookup={lookup}: {readers} readers catch up on {per_topic} records each | {:.1} MB delivered | {:.2} s | broker CPU {:.2} s | {:.1} CPU s per delivered GB | background producer {:.1} MB/s |",
            gb * 1e3,
            secs,
            cpu,
            cpu / gb,
            produced as f64 * 1024.0 / secs / 1e6
        );
        results.push(cpu / gb);
        broker.kill9();
    }
    println!("\nbroker CPU per delivered GB, scan / index: {:.1}x", results[1] / results[0]);
}

/// Reads `n` records with one consumer assigned to `tps` from the start;
/// returns (payload bytes, seconds, broker CPU seconds).
fn read_assigned(broker: &Broker, tps: &[(String, i32)], n: u64) -> (u64, f64, f64) {
    let mut c = common::client(broker.kafka);
    c.set("group.id", "bench-stream")
        .set("enable.auto.commit", "false")
        .set("fetch.wait.max.ms", "100")
        .set("fetch.max.bytes", "52428800")
        .set("max.partition.fetch.bytes", "4194304")
        .set("queued.min.messages", "1000000");
    let consumer: BaseConsumer = c.create().unwrap();
    let mut tpl = TopicPartitionList::new();
    for (t, p) in tps {
        tpl.add_partition_offset(t, *p, Offset::Beginning).unwrap();
    }
    consumer.assign(&tpl).unwrap();
    let cpu0 = cpu_secs(broker.child.id());
    let t0 = Instant::now();
    let (mut got, mut bytes) = (0u64, 0u64);
    while got < n {
        if let Some(m) = consumer.poll(Duration::from_millis(1000)) {
            bytes += m.expect("consume").payload().map_or(0, |p| p.len()) as u64;
            got += 1;
        }
        assert!(t0.elapsed() < Duration::from_secs(900), "read stalled at {got} of {n}");
    }
    (bytes, t0.elapsed().as_secs_f64(), cpu_secs(broker.child.id()) - cpu0)
}

/// Ordered subtree streams against the per-tp reads of the same records,
/// from the tip and (after a restart empties it) from the branch logs.
fn stream_reads(dir: &Path, scale: u64) {
    const BRANCHES: usize = 10;
    const PER_BRANCH: usize = 10;
    let records = 1_000_000 / scale;
    let args = ["--tip-bytes", "1073741824", "--flush", "interval:100", "--segment-bytes", "134217728"];
    let broker = Broker::spawn(dir, &args);
    let name = |b: usize, t: usize| format!("s.b{b}.t{t}");
    {
        let admin: AdminClient<DefaultClientContext> = common::client(broker.kafka).create().unwrap();
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let names: Vec<String> = (0..BRANCHES * PER_BRANCH).map(|i| name(i / PER_BRANCH, i % PER_BRANCH)).collect();
        let topics: Vec<NewTopic> = names.iter().map(|n| NewTopic::new(n, 1, TopicReplication::Fixed(1))).collect();
        let r = rt.block_on(admin.create_topics(topics.iter(), &AdminOptions::new())).unwrap();
        assert!(r.iter().all(|x| x.is_ok()), "topics created");
    }
    let counter = Arc::new(Counter::default());
    let mut cfg = common::client(broker.kafka);
    cfg.set("acks", "1").set("linger.ms", "5").set("queue.buffering.max.messages", "2000000").set("queue.buffering.max.kbytes", "1048576");
    let producer: ThreadedProducer<Ctx> = cfg.create_with_context(Ctx(counter.clone())).unwrap();
    let payloads = payloads(200);
    for i in 0..records {
        let topic = name((i as usize / 7) % BRANCHES, i as usize % PER_BRANCH);
        let mut rec: BaseRecord<'_, (), [u8], ()> = BaseRecord::to(&topic).payload(&payloads[i as usize % payloads.len()][..]).partition(0);
        loop {
            match producer.send(rec) {
                Ok(()) => break,
                Err((_, r)) => {
                    rec = r;
                    std::thread::sleep(Duration::from_micros(200));
                }
            }
        }
    }
    producer.flush(Duration::from_secs(300)).unwrap();
    assert_eq!(counter.ok.load(Ordering::Relaxed), records, "every record acked");
    drop(producer);
    let per_branch = records / BRANCHES as u64;
    let b0: Vec<(String, i32)> = (0..PER_BRANCH).map(|t| (name(0, t), 0)).collect();
    let all: Vec<(String, i32)> = (0..BRANCHES * PER_BRANCH).map(|i| (name(i / PER_BRANCH, i % PER_BRANCH), 0)).collect();
    let mut broker = broker;
    for from in ["tip", "disk"] {
        if from == "disk" {
            // A clean restart: the tip starts empty, everything is on disk.
            assert!(broker.terminate().success());
            broker = Broker::spawn(dir, &args);
        }
        let mut rows = Vec::new();
        for (what, tps, n) in [
            ("10 topics of s.b0, per-tp fetches", b0.clone(), per_branch),
            ("s.b0.__all (the same records, merged)", vec![("s.b0.__all".to_owned(), 0)], per_branch),
            ("100 topics, per-tp fetches", all.clone(), records),
            ("__all (the same records, merged)", vec![("__all".to_owned(), 0)], records),
        ] {
            let (bytes, secs, cpu) = read_assigned(&broker, &tps, n);
            println!(
                "| from the {from}: {what} | {n} | {:.0} | {:.1} | {:.2} | broker CPU {:.2} s = {:.1} s per GB |",
                n as f64 / secs,
                bytes as f64 / secs / 1e6,
                secs,
                cpu,
                cpu / (bytes as f64 / 1e9)
            );
            rows.push((n as f64 / secs, cpu / (bytes as f64 / 1e9)));
        }
        println!(
            "from the {from}: stream / per-tp records/s: subtree {:.2}x, whole stream {:.2}x; broker CPU per GB: subtree {:.2}x, whole stream {:.2}x",
            rows[1].0 / rows[0].0,
            rows[3].0 / rows[2].0,
            rows[1].1 / rows[0].1,
            rows[3].1 / rows[2].1
        );
    }
    broker.kill9();
}

fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    let consume_only = std::env::args().any(|a| a == "--consume-only");
    let scale = if quick { 10 } else { 1 };
    let dir = std::env::var("CANOPY_BENCH_DIR").map(std::path::PathBuf::from).unwrap_or_else(|_| std::env::temp_dir().join("canopy-bench"));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();

    let loopback = iperf3();
    println!("loopback TCP (iperf3, 5 s, 1 stream): {:.0} MB/s\n", loopback / 1e6);
    println!("| scenario | records | records/s | MB/s | seconds | broker CPU | client CPU |");
    println!("| --- | --- | --- | --- | --- | --- | --- |");

    if std::env::args().any(|a| a == "--stream") {
        stream_reads(&dir.join("stream"), scale);
        let _ = std::fs::remove_dir_all(&dir);
        return;
    }
    if std::env::args().any(|a| a == "--tip") {
        tip_catch_up(&dir, scale);
        let _ = std::fs::remove_dir_all(&dir);
        return;
    }
    // For profiling a broker started elsewhere (under valgrind, say):
    // pipelined produce (10 x 100 B, acks=1 unless ACKS) on 4 connections
    // for SECS: `--drive ADDR SECS [ACKS]`.
    if let Some(i) = std::env::args().position(|a| a == "--drive") {
        let addr: SocketAddr = std::env::args().nth(i + 1).expect("--drive ADDR SECS").parse().expect("an address");
        let secs: f64 = std::env::args().nth(i + 2).and_then(|s| s.parse().ok()).unwrap_or(10.0);
        let acks: i16 = std::env::args().nth(i + 3).and_then(|s| s.parse().ok()).unwrap_or(1);
        drive(addr, secs, acks);
        return;
    }
    if let Some(i) = std::env::args().position(|a| a == "--baseline") {
        let bin = std::env::args().nth(i + 1).expect("--baseline BIN: a release build of the broker to compare with");
        hardening_cost(&dir, Path::new(&bin), 10.0 / scale as f64, scale);
        let _ = std::fs::remove_dir_all(&dir);
        return;
    }
    if std::env::args().any(|a| a == "--metrics") {
        metrics_cost_broker_bound(&dir, 10.0 / scale as f64);
        metrics_cost(&dir, scale);
        let _ = std::fs::remove_dir_all(&dir);
        return;
    }
    let broker = spawn_broker(&dir.join("data"));
    if std::env::args().any(|a| a == "--transactions") {
        transactions(&broker, scale);
        broker.kill9();
        let _ = std::fs::remove_dir_all(&dir);
        return;
    }
    if std::env::args().any(|a| a == "--producer") {
        producer_semantics(&broker, scale);
        broker.kill9();
        let _ = std::fs::remove_dir_all(&dir);
        return;
    }
    let mut rows = Vec::new();
    for (size, n) in [(100usize, 5_000_000u64), (1024, 1_000_000)].into_iter().filter(|_| !consume_only) {
        for parts in [1, 16] {
            for acks in ["1", "all"] {
                let topic = format!("bench.produce.s{size}.p{parts}.a{acks}");
                let row = produce(&broker, &topic, parts, size, acks, n / scale);
                row.print();
                rows.push(row);
            }
        }
    }
    // 1 GiB log of 1 KiB records, then read it from the start.
    let consume_records = (1u64 << 30) / 1024 / scale;
    let fill = produce(&broker, "bench.consume", 1, 1024, "1", consume_records);
    fill.print();
    let c = consume(&broker, "bench.consume", consume_records);
    c.print();
    println!(
        "\nconsume / loopback TCP: {:.0}%",
        100.0 * (c.bytes as f64 / c.secs) / loopback
    );
    for size in [100, 1024].into_iter().filter(|_| !consume_only) {
        for parts in [1, 16] {
            let r1 = rows.iter().find(|r| r.name == format!("produce {size} B, acks=1, {parts} partition(s)")).unwrap();
            let ra = rows.iter().find(|r| r.name == format!("produce {size} B, acks=all, {parts} partition(s)")).unwrap();
            println!(
                "acks=all / acks=1, {size} B, {parts} partition(s): {:.0}%",
                100.0 * (ra.records as f64 / ra.secs) / (r1.records as f64 / r1.secs)
            );
        }
    }

    // Recovery after kill -9: the whole log is one active segment, deep-scanned.
    broker.kill9();
    let t0 = Instant::now();
    let broker = spawn_broker(&dir.join("data"));
    let ready = t0.elapsed();
    let mut recovered = None;
    while let Ok(l) = broker.log.recv_timeout(Duration::from_secs(1)) {
        if l.contains("storage recovered") {
            recovered = Some(l);
            break;
        }
    }
    let v: serde_json::Value = serde_json::from_str(&recovered.expect("recovery log line")).unwrap();
    let f = &v["fields"];
    println!(
        "\nrecovery after kill -9: {} bytes in {} segments, {} deep-scanned, {} truncated, storage recovery {} ms, process start to serving {} ms",
        f["bytes"], f["segments"], f["deep_scanned_bytes"], f["truncated_bytes"], f["elapsed_ms"], ready.as_millis()
    );
    broker.kill9();
    let _ = std::fs::remove_dir_all(&dir);
}
