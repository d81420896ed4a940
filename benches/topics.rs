//! A million topics on one broker (issue 20): a release broker child
//! process, driven over the Kafka protocol on loopback.
//!
//! ```text
//! cargo bench --bench topics                       # 1,000,000 topics in 10,000 branches
//! cargo bench --bench topics -- --topics 100000 --branches 1000
//! cargo bench --bench topics -- --data-mib 10240   # with 10 GiB of data for the restarts
//! cargo bench --bench topics -- --dir DIR          # keep the data directory in DIR
//! ```
//!
//! Topics are named `tenant<b>.svc.t<i>` (branch `tenant<b>.svc`), one
//! partition each, created by CreateTopics requests of 1,000 topics.
//! Reports: creation time; resident memory per idle topic (VmRSS after
//! minus before, over the topic count); Metadata latency for one topic and
//! for all; ApiVersions latency; the scrape's size and time; descriptors in
//! use; produce throughput to one topic (pipelined raw requests of ten
//! 100 B records, acks=1, broker CPU beside it; the better of two runs) on
//! the empty broker and with every topic present; clean and unclean restart
//! times.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use kafka_protocol::messages::create_topics_request::CreatableTopic;
use kafka_protocol::messages::metadata_request::MetadataRequestTopic;
use kafka_protocol::messages::*;
use kafka_protocol::protocol::{Decodable, Encodable, StrBytes};

#[path = "../tests/it/common.rs"]
mod common;

use common::ChildBroker as Broker;

struct Args {
    topics: usize,
    branches: usize,
    data_mib: u64,
    secs: f64,
    /// Keep the data directory here (for profiling restarts afterwards).
    dir: Option<std::path::PathBuf>,
}

fn args() -> Args {
    let mut a = Args { topics: 1_000_000, branches: 10_000, data_mib: 0, secs: 5.0, dir: None };
    let v: Vec<String> = std::env::args().collect();
    let mut i = 1;
    while i < v.len() {
        let next = |i: usize| v.get(i + 1).unwrap_or_else(|| panic!("{} needs a value", v[i])).clone();
        match v[i].as_str() {
            "--topics" => a.topics = next(i).parse().expect("--topics N"),
            "--branches" => a.branches = next(i).parse().expect("--branches N"),
            "--data-mib" => a.data_mib = next(i).parse().expect("--data-mib N"),
            "--secs" => a.secs = next(i).parse().expect("--secs S"),
            "--dir" => a.dir = Some(next(i).into()),
            "--bench" => {
                i += 1;
                continue;
            }
            other => panic!("unknown argument {other}"),
        }
        i += 2;
    }
    a
}

fn spawn(dir: &Path) -> (Broker, f64) {
    let started = Instant::now();
    // Descriptors: the broker's own bound (max_open_files), whatever the
    // topic count.
    let b = Broker::spawn(dir, &["--flush", "always", "--max-topics", "2000000"]);
    (b, started.elapsed().as_secs_f64())
}

fn status_kib(pid: u32, key: &str) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("proc status");
    let line = s.lines().find(|l| l.starts_with(key)).unwrap_or_else(|| panic!("{key} in /proc status"));
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

fn cpu_secs(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("proc stat");
    let after = &stat[stat.rfind(')').unwrap() + 2..];
    let f: Vec<&str> = after.split(' ').collect();
    (f[11].parse::<f64>().unwrap() + f[12].parse::<f64>().unwrap()) / 100.0
}

fn fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map(|d| d.count()).unwrap_or(0)
}

/// One request on a blocking connection: the decoded response and the
/// response's size on the wire.
fn call<Req: Encodable, Resp: Decodable>(s: &mut TcpStream, key: ApiKey, version: i16, id: i32, req: &Req) -> (Resp, usize) {
    let mut body = BytesMut::new();
    req.encode(&mut body, version).unwrap();
    s.write_all(&common::request_frame(key as i16, version, id, &body)).unwrap();
    let mut len = [0u8; 4];
    s.read_exact(&mut len).unwrap();
    let mut b = vec![0u8; i32::from_be_bytes(len) as usize];
    s.read_exact(&mut b).unwrap();
    let size = b.len() + 4;
    let mut b = Bytes::from(b);
    let h = ResponseHeader::decode(&mut b, key.response_header_version(version)).unwrap();
    assert_eq!(h.correlation_id, id);
    (Resp::decode(&mut b, version).unwrap(), size)
}

fn connect(addr: SocketAddr) -> TcpStream {
    let s = TcpStream::connect(addr).unwrap();
    s.set_nodelay(true).unwrap();
    s
}

fn name(t: usize, branches: usize) -> String {
    format!("tenant{}.svc.t{t}", t % branches)
}

fn s(v: &str) -> StrBytes {
    StrBytes::from_string(v.to_owned())
}

/// Creates topics `from..to` in requests of 1,000.
fn create(addr: SocketAddr, from: usize, to: usize, branches: usize) {
    let mut c = connect(addr);
    let mut id = 0;
    for chunk in (from..to).collect::<Vec<_>>().chunks(1000) {
        id += 1;
        let req = CreateTopicsRequest::default().with_timeout_ms(600_000).with_topics(
            chunk.iter().map(|&t| CreatableTopic::default().with_name(TopicName(s(&name(t, branches)))).with_num_partitions(1).with_replication_factor(1)).collect(),
        );
        let (r, _): (CreateTopicsResponse, _) = call(&mut c, ApiKey::CreateTopics, 5, id, &req);
        for t in &r.topics {
            assert_eq!(t.error_code, 0, "creating {}: {:?}", t.name.0, t.error_message);
        }
    }
}

/// Median and 99th percentile of `n` timed calls, in microseconds.
fn latency(n: usize, mut f: impl FnMut()) -> (f64, f64) {
    let mut v: Vec<f64> = (0..n)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed().as_secs_f64() * 1e6
        })
        .collect();
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    (v[n / 2], v[(n * 99 / 100).min(n - 1)])
}

/// A batch of `n` records of `len` bytes.
fn records(n: usize, len: usize) -> Bytes {
    use canopy::protocol::batch::{build, NewRecord};
    let values: Vec<Vec<u8>> = (0..n).map(|i| vec![b'a' + (i % 26) as u8; len]).collect();
    let recs: Vec<NewRecord<'_>> = values.iter().map(|v| NewRecord { value: Some(v), ..Default::default() }).collect();
    Bytes::from(build(&recs, 1_700_000_000_000))
}

fn produce_frame(topic: &str, batch: &Bytes) -> Vec<u8> {
    use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
    let req = ProduceRequest::default().with_acks(1).with_timeout_ms(30_000).with_topic_data(vec![TopicProduceData::default()
        .with_name(TopicName(s(topic)))
        .with_partition_data(vec![PartitionProduceData::default().with_index(0).with_records(Some(batch.clone()))])]);
    let mut body = BytesMut::new();
    req.encode(&mut body, 9).unwrap();
    common::request_frame(ApiKey::Produce as i16, 9, 0, &body)
}

/// Writes back and drops the page cache (best effort: it needs root), so
/// every run starts from the same state: writes into page-cache pages
/// that must first be reclaimed cost several times those into free ones,
/// and the runs before would otherwise tax the runs after.
fn settle_page_cache() -> bool {
    unsafe { libc::sync() };
    std::fs::write("/proc/sys/vm/drop_caches", "3").is_ok()
}

/// Pipelined produce of ten 100 B records per request on 4 connections
/// (64 in flight each) for `secs`: (records/s, broker CPU s per GB).
fn produce_rate(b: &Broker, topic: &str, secs: f64) -> (f64, f64) {
    let batch = records(10, 100);
    let frame = produce_frame(topic, &batch);
    if !settle_page_cache() {
        eprintln!("could not drop the page cache (not root?): runs may tax the ones after");
    }
    let pid = b.child.id();
    let cpu0 = cpu_secs(pid);
    let t0 = Instant::now();
    let deadline = t0 + Duration::from_secs_f64(secs);
    let threads: Vec<_> = (0..4)
        .map(|_| {
            let frame = frame.clone();
            let addr = b.kafka;
            std::thread::spawn(move || common::pipeline(addr, &frame, 64, deadline))
        })
        .collect();
    let requests: u64 = threads.into_iter().map(|t| t.join().unwrap()).sum();
    let elapsed = t0.elapsed().as_secs_f64();
    let cpu = cpu_secs(pid) - cpu0;
    let bytes = requests as f64 * batch.len() as f64;
    (requests as f64 * 10.0 / elapsed, cpu / (bytes / 1e9))
}

/// The better of two runs (the rate and its CPU cost): runs on these two
/// cores vary by about a tenth.
fn best_of_two(b: &Broker, topic: &str, secs: f64) -> (f64, f64) {
    let x = produce_rate(b, topic, secs);
    let y = produce_rate(b, topic, secs);
    if x.0 >= y.0 { x } else { y }
}


/// Writes about `mib` MiB of 1 KiB records spread over the first topics
/// (a hundred topics, each in its own branch), acks=1.
fn fill(b: &Broker, branches: usize, mib: u64) {
    let batch = records(100, 1024);
    let per_request = batch.len() as u64;
    let requests = (mib << 20) / per_request;
    let topics: Vec<String> = (0..100.min(branches)).map(|t| name(t, branches)).collect();
    let mut c = connect(b.kafka);
    for i in 0..requests {
        let frame = produce_frame(&topics[i as usize % topics.len()], &batch);
        c.write_all(&frame).unwrap();
        let mut len = [0u8; 4];
        c.read_exact(&mut len).unwrap();
        let mut r = vec![0u8; i32::from_be_bytes(len) as usize];
        c.read_exact(&mut r).unwrap();
    }
}

fn scrape(admin: SocketAddr) -> (usize, f64) {
    let t = Instant::now();
    let mut c = connect(admin);
    write!(c, "GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").unwrap();
    let mut out = Vec::new();
    c.read_to_end(&mut out).unwrap();
    (out.len(), t.elapsed().as_secs_f64())
}

fn main() {
    let a = args();
    let dir = tempfile::tempdir().expect("tempdir");
    let data = a.dir.clone().unwrap_or_else(|| dir.path().join("data"));
    let (b, _) = spawn(&data);
    let pid = b.child.id();
    let mut c = connect(b.kafka);
    // The hot topic, in a branch of its own, before the others.
    let hot = "hot.bench.t";
    let req = CreateTopicsRequest::default().with_timeout_ms(60_000).with_topics(vec![CreatableTopic::default().with_name(TopicName(s(hot))).with_num_partitions(1).with_replication_factor(1)]);
    let _: (CreateTopicsResponse, _) = call(&mut c, ApiKey::CreateTopics, 5, 1, &req);
    let (empty_rate, empty_cpu) = best_of_two(&b, hot, a.secs);
    eprintln!("empty broker: {empty_rate:.0} records/s, {empty_cpu:.2} CPU s/GB");
    let rss0 = status_kib(pid, "VmRSS:");

    let t = Instant::now();
    let step = (a.topics / 10).max(1000);
    let mut made = 0;
    while made < a.topics {
        let to = (made + step).min(a.topics);
        create(b.kafka, made, to, a.branches);
        made = to;
        eprintln!("{made} topics, {:.0} s, RSS {} MiB", t.elapsed().as_secs_f64(), status_kib(pid, "VmRSS:") / 1024);
    }
    let create_s = t.elapsed().as_secs_f64();
    // Let the allocator settle.
    std::thread::sleep(Duration::from_secs(2));
    let rss1 = status_kib(pid, "VmRSS:");
    let per_topic = (rss1.saturating_sub(rss0) * 1024) as f64 / a.topics as f64;

    let one = MetadataRequest::default().with_topics(Some(vec![MetadataRequestTopic::default().with_name(Some(TopicName(s(&name(a.topics / 2, a.branches)))))]));
    let mut id = 10;
    let (one_p50, one_p99) = latency(200, || {
        id += 1;
        let (r, _): (MetadataResponse, _) = call(&mut c, ApiKey::Metadata, 12, id, &one);
        assert_eq!(r.topics[0].error_code, 0);
    });
    let all = MetadataRequest::default().with_topics(None);
    let mut all_size = 0;
    let (all_p50, _) = latency(3, || {
        id += 1;
        let (r, size): (MetadataResponse, _) = call(&mut c, ApiKey::Metadata, 12, id, &all);
        assert!(r.topics.len() > a.topics);
        all_size = size;
    });
    let (av_p50, av_p99) = latency(1000, || {
        id += 1;
        let _: (ApiVersionsResponse, _) = call(&mut c, ApiKey::ApiVersions, 3, id, &ApiVersionsRequest::default());
    });
    let (scrape_bytes, scrape_s) = scrape(b.admin);
    let open_fds = fds(pid);
    let (full_rate, full_cpu) = best_of_two(&b, hot, a.secs);
    eprintln!("with {} topics: {full_rate:.0} records/s, {full_cpu:.2} CPU s/GB", a.topics);
    if a.data_mib > 0 {
        fill(&b, a.branches, a.data_mib);
    }
    drop(c);

    // Clean restart: SIGTERM, wait, start again. Each start reads from a
    // cold page cache (synced and dropped first), as after a reboot, and
    // not while the kernel writes back what the fill left.
    let cold = |what: &str| {
        if !settle_page_cache() {
            eprintln!("could not drop the page cache (not root?): the {what} restart reads from a warm one");
        }
    };
    let (clean_s, stop_s) = {
        let t = Instant::now();
        assert!(b.terminate().success(), "a clean stop");
        let stop_s = t.elapsed().as_secs_f64();
        cold("clean");
        let (b2, start_s) = spawn(&data);
        // Unclean: kill -9 and start again.
        b2.kill9();
        (start_s, stop_s)
    };
    cold("unclean");
    let (b3, unclean_s) = spawn(&data);
    let rss_restart = status_kib(b3.child.id(), "VmRSS:");
    drop(b3);

    println!("## A million topics: {} topics in {} branches, one partition each\n", a.topics, a.branches);
    println!("`cargo bench --bench topics -- --topics {} --branches {} --data-mib {}`\n", a.topics, a.branches, a.data_mib);
    println!("| | |\n|---|---:|");
    println!("| creation (CreateTopics, 1,000 per request) | {create_s:.1} s ({:.0} topics/s) |", a.topics as f64 / create_s);
    println!("| resident memory, empty broker | {} MiB |", rss0 / 1024);
    println!("| resident memory with every topic | {} MiB |", rss1 / 1024);
    println!("| resident memory per idle topic | {per_topic:.0} B |");
    println!("| Metadata, one topic (v12) | p50 {one_p50:.0} µs, p99 {one_p99:.0} µs |");
    println!("| Metadata, all topics (v12) | {:.2} s, {} MiB |", all_p50 / 1e6, all_size >> 20);
    println!("| ApiVersions | p50 {av_p50:.0} µs, p99 {av_p99:.0} µs |");
    println!("| /metrics scrape | {:.2} s, {} KiB |", scrape_s, scrape_bytes >> 10);
    println!("| descriptors in use | {open_fds} |");
    println!("| produce to one topic, empty broker | {empty_rate:.0} records/s, {empty_cpu:.2} CPU s/GB |");
    println!("| produce to one topic, every topic present | {full_rate:.0} records/s ({:.1}% of empty), {full_cpu:.2} CPU s/GB |", 100.0 * full_rate / empty_rate);
    println!("| data written before the restarts | {} MiB |", a.data_mib);
    println!("| clean stop (SIGTERM to exit) | {stop_s:.1} s |");
    println!("| clean restart (spawn to serving) | {clean_s:.1} s |");
    println!("| unclean restart after kill -9 | {unclean_s:.1} s |");
    println!("| resident memory after the restart | {} MiB |", rss_restart / 1024);
}
