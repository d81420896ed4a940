//! Group coordinator benchmarks against a release broker child process,
//! with `group.initial.rebalance.delay.ms=0`.
//!
//! ```text
//! cargo bench --bench groups            # full run
//! cargo bench --bench groups -- --quick # fewer trials, shorter runs
//! ```
//!
//! 1. Time from `subscribe()` to the first record for a new single-member
//!    librdkafka group; baseline: a librdkafka consumer that `assign()`s the
//!    same partitions (no group), in the same run. Both have connected and
//!    loaded metadata before the clock starts.
//! 2. Rebalance time when one member joins a 10-member group: from the
//!    newcomer's `subscribe()` until every member holds its new assignment.
//!    Members learn of a rebalance from their next heartbeat, so the
//!    baseline is the heartbeat interval they use.
//! 3. OffsetCommits per second one coordinator answers (each answered only
//!    once durable) with many clients committing one partition each, one
//!    commit in flight per client, like consumers committing every poll;
//!    baseline: fsyncs per second of a single writer in the same directory.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::Consumer;
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::{Offset, TopicPartitionList};

#[path = "../tests/it/common.rs"]
mod common;
#[path = "support/proc_cpu.rs"]
mod proc_cpu;
use proc_cpu::cpu_secs;

const TOPIC: &str = "bench.groups";
const PARTITIONS: i32 = 32;
const HEARTBEAT_MS: u64 = 500;

fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    let dir = tempfile::tempdir().unwrap();
    let broker = common::ChildBroker::spawn(dir.path(), &["--group-initial-rebalance-delay-ms", "0"]);
    let addr = broker.kafka;
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    rt.block_on(setup(addr));

    println!("group benchmarks (release broker, loopback, group.initial.rebalance.delay.ms=0)\n");
    let trials = if quick { 3 } else { 10 };
    let (assign, subscribe) = first_record(addr, trials);
    println!("first record, median of {trials}:");
    println!("  assign() (baseline)      {:>8.1} ms", assign);
    println!("  subscribe(), new group   {:>8.1} ms   {:.2}x baseline", subscribe, subscribe / assign);

    let handshake = rt.block_on(raw_handshake(addr, if quick { 200 } else { 1000 }));
    println!("  the broker's share: FindCoordinator, JoinGroup x2, SyncGroup, OffsetFetch");
    println!("  on one warm connection   {:>8.3} ms   (median of raw-protocol runs)", handshake);

    let joins = if quick { 2 } else { 5 };
    let rebalance = rebalance_times(addr, 10, joins);
    let mut sorted = rebalance.clone();
    sorted.sort_by(f64::total_cmp);
    let median = sorted[sorted.len() / 2];
    println!("\nrebalance when one member joins a group of 10 (then 11, ...), {joins} joins:");
    println!("  heartbeat interval (baseline) {:>6} ms", HEARTBEAT_MS);
    println!("  each join                {:?} ms", rebalance.iter().map(|t| t.round() as u64).collect::<Vec<_>>());
    println!("  median                   {:>8.1} ms   {:.2}x baseline", median, median / HEARTBEAT_MS as f64);

    let secs = if quick { 2.0 } else { 5.0 };
    let fsyncs = fsync_rate(dir.path(), secs);
    println!("\noffset commits, {secs} s per row:");
    println!("  fsync/s, one writer (baseline) {:>10.0}", fsyncs);
    for clients in [1usize, 16, 64, 256] {
        let (rate, cpu) = rt.block_on(commit_rate(addr, broker.child.id(), clients, secs));
        println!("  {clients:>3} clients: {rate:>10.0} commits/s   {:.1}x baseline   broker CPU {:.0}%", rate / fsyncs, cpu * 100.0);
    }
    broker.terminate();
}

async fn setup(addr: SocketAddr) {
    let admin: AdminClient<DefaultClientContext> = common::client(addr).create().unwrap();
    admin.create_topics([&NewTopic::new(TOPIC, PARTITIONS, TopicReplication::Fixed(1))], &AdminOptions::new()).await.unwrap()[0].as_ref().unwrap();
    let producer: FutureProducer = common::producer_config(addr, "all").create().unwrap();
    for p in 0..PARTITIONS {
        producer.send(FutureRecord::to(TOPIC).partition(p).key("k").payload("v"), Duration::from_secs(10)).await.unwrap();
    }
}

fn consumer(addr: SocketAddr, group: &str) -> BaseConsumer {
    let mut c = common::client(addr);
    c.set("group.id", group)
        .set("enable.auto.commit", "false")
        .set("auto.offset.reset", "earliest")
        .set("fetch.wait.max.ms", "100")
        .set("session.timeout.ms", "6000")
        .set("heartbeat.interval.ms", HEARTBEAT_MS.to_string());
    if std::env::var_os("BENCH_DEBUG").is_some() {
        c.set("debug", "cgrp,fetch,protocol").set_log_level(rdkafka::config::RDKafkaLogLevel::Debug);
        return c.create_with_context(DebugCtx(Instant::now())).unwrap();
    }
    c.create_with_context(DebugCtx(Instant::now())).unwrap()
}

/// With BENCH_DEBUG set, prints librdkafka's debug log with elapsed times.
struct DebugCtx(Instant);
impl rdkafka::ClientContext for DebugCtx {
    fn log(&self, _: rdkafka::config::RDKafkaLogLevel, fac: &str, msg: &str) {
        if std::env::var_os("BENCH_DEBUG").is_some() {
            eprintln!("{:>8.1} ms {fac}: {msg}", self.0.elapsed().as_secs_f64() * 1000.0);
        }
    }
}
impl rdkafka::consumer::ConsumerContext for DebugCtx {}
type BaseConsumer = rdkafka::consumer::BaseConsumer<DebugCtx>;

fn until_first(c: &BaseConsumer, started: Instant) -> f64 {
    loop {
        if let Some(m) = c.poll(Duration::from_millis(5)) {
            m.unwrap();
            return started.elapsed().as_secs_f64() * 1000.0;
        }
        assert!(started.elapsed() < Duration::from_secs(60), "no record within 60 s");
    }
}

/// Medians (ms) of time to first record: by assign(), then by subscribe().
fn first_record(addr: SocketAddr, trials: usize) -> (f64, f64) {
    let (mut assign, mut subscribe) = (Vec::new(), Vec::new());
    // Both consumers connect and load metadata before the clock starts, so
    // the difference is the group protocol (FindCoordinator, two JoinGroups,
    // SyncGroup, OffsetFetch) against a plain ListOffsets.
    let warm = |c: &BaseConsumer| {
        c.fetch_metadata(Some(TOPIC), Duration::from_secs(10)).unwrap();
    };
    for t in 0..trials {
        let c = consumer(addr, &format!("bench.assign.{t}"));
        warm(&c);
        let started = Instant::now();
        let mut tpl = TopicPartitionList::new();
        for p in 0..PARTITIONS {
            tpl.add_partition_offset(TOPIC, p, Offset::Beginning).unwrap();
        }
        c.assign(&tpl).unwrap();
        assign.push(until_first(&c, started));
        drop(c);

        let c = consumer(addr, &format!("bench.subscribe.{t}"));
        warm(&c);
        let started = Instant::now();
        c.subscribe(&[TOPIC]).unwrap();
        subscribe.push(until_first(&c, started));
        c.unsubscribe();
        drop(c);
    }
    let median = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    (median(assign), median(subscribe))
}

/// Members on their own threads, each publishing its assignment.
struct Member {
    owned: Arc<Mutex<BTreeSet<i32>>>,
    stop: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<()>,
}

fn member(addr: SocketAddr, group: &str) -> Member {
    let owned: Arc<Mutex<BTreeSet<i32>>> = Arc::default();
    let stop = Arc::new(AtomicBool::new(false));
    let c = consumer(addr, group);
    c.subscribe(&[TOPIC]).unwrap();
    let (o, s) = (owned.clone(), stop.clone());
    let thread = std::thread::spawn(move || {
        while !s.load(Ordering::Relaxed) {
            let _ = c.poll(Duration::from_millis(5));
            let now: BTreeSet<i32> = c.assignment().unwrap().elements().iter().map(|e| e.partition()).collect();
            *o.lock().unwrap() = now;
        }
        c.unsubscribe();
        let deadline = Instant::now() + Duration::from_secs(10);
        while !c.assignment().unwrap().elements().is_empty() && Instant::now() < deadline {
            let _ = c.poll(Duration::from_millis(5));
        }
    });
    Member { owned, stop, thread }
}

/// Every member holds a non-empty share and the shares partition the topic.
fn settled(members: &[Member]) -> bool {
    let mut all = BTreeSet::new();
    for m in members {
        let o = m.owned.lock().unwrap();
        if o.is_empty() {
            return false;
        }
        for p in o.iter() {
            if !all.insert(*p) {
                return false;
            }
        }
    }
    all.len() == PARTITIONS as usize
}

fn wait_settled(members: &[Member]) {
    let deadline = Instant::now() + Duration::from_secs(120);
    while !settled(members) {
        assert!(Instant::now() < deadline, "group never settled");
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Milliseconds each of `joins` successive joins took to settle, starting
/// from a stable group of `size`.
fn rebalance_times(addr: SocketAddr, size: usize, joins: usize) -> Vec<f64> {
    let group = "bench.rebalance";
    let mut members: Vec<Member> = (0..size).map(|_| member(addr, group)).collect();
    wait_settled(&members);
    // Let the first generation's stragglers (members that joined during the
    // first rebalance) finish before measuring.
    std::thread::sleep(Duration::from_secs(2));
    wait_settled(&members);
    let mut times = Vec::new();
    for _ in 0..joins {
        let started = Instant::now();
        members.push(member(addr, group));
        wait_settled(&members);
        times.push(started.elapsed().as_secs_f64() * 1000.0);
        std::thread::sleep(Duration::from_millis(500));
    }
    for m in &members {
        m.stop.store(true, Ordering::Relaxed);
    }
    for m in members {
        m.thread.join().unwrap();
    }
    times
}

/// fsync(2)s per second of one writer appending 100 bytes at a time.
fn fsync_rate(dir: &std::path::Path, secs: f64) -> f64 {
    use std::io::Write;
    let path = dir.join("fsync-baseline");
    let mut f = std::fs::File::create(&path).unwrap();
    let started = Instant::now();
    let mut n = 0u64;
    while started.elapsed().as_secs_f64() < secs {
        f.write_all(&[0u8; 100]).unwrap();
        f.sync_data().unwrap();
        n += 1;
    }
    let rate = n as f64 / started.elapsed().as_secs_f64();
    std::fs::remove_file(path).unwrap();
    rate
}

/// Commits/s and broker CPU (share of one core) with `clients` connections,
/// each committing one partition for its own group, one commit in flight.
async fn commit_rate(addr: SocketAddr, pid: u32, clients: usize, secs: f64) -> (f64, f64) {
    use kafka_protocol::messages::offset_commit_request::{OffsetCommitRequestPartition, OffsetCommitRequestTopic};
    use kafka_protocol::messages::{GroupId, OffsetCommitRequest, OffsetCommitResponse, TopicName};
    use kafka_protocol::protocol::StrBytes;

    let done = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let cpu0 = cpu_secs(pid);
    let started = Instant::now();
    let tasks: Vec<_> = (0..clients)
        .map(|i| {
            let (done, stop) = (done.clone(), stop.clone());
            tokio::spawn(async move {
                let mut sock = tokio::net::TcpStream::connect(addr).await.unwrap();
                sock.set_nodelay(true).unwrap();
                let group = GroupId(StrBytes::from_string(format!("bench.commits.{clients}.{i}")));
                let mut offset = 0i64;
                let mut id = 0i32;
                while !stop.load(Ordering::Relaxed) {
                    offset += 1;
                    id += 1;
                    let req = OffsetCommitRequest::default().with_group_id(group.clone()).with_generation_id_or_member_epoch(-1).with_topics(vec![
                        OffsetCommitRequestTopic::default().with_name(TopicName(StrBytes::from_static_str(TOPIC))).with_partitions(vec![
                            OffsetCommitRequestPartition::default().with_partition_index(i as i32 % PARTITIONS).with_committed_offset(offset),
                        ]),
                    ]);
                    let r: OffsetCommitResponse = common::call(&mut sock, 8, 2, id, &req).await;
                    assert_eq!(r.topics[0].partitions[0].error_code, 0, "commit failed");
                    done.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_secs_f64(secs)).await;
    stop.store(true, Ordering::Relaxed);
    let n = done.load(Ordering::Relaxed);
    let elapsed = started.elapsed().as_secs_f64();
    let cpu = (cpu_secs(pid) - cpu0) / elapsed;
    for t in tasks {
        t.await.unwrap();
    }
    (n as f64 / elapsed, cpu)
}

/// Median milliseconds of a new single-member group's handshake, as
/// librdkafka does it, over one warm connection: FindCoordinator, JoinGroup
/// (MEMBER_ID_REQUIRED), JoinGroup, SyncGroup, OffsetFetch.
async fn raw_handshake(addr: SocketAddr, runs: usize) -> f64 {
    use kafka_protocol::messages::join_group_request::JoinGroupRequestProtocol;
    use kafka_protocol::messages::offset_fetch_request::OffsetFetchRequestTopic;
    use kafka_protocol::messages::sync_group_request::SyncGroupRequestAssignment;
    use kafka_protocol::messages::{
        FindCoordinatorRequest, FindCoordinatorResponse, GroupId, JoinGroupRequest, JoinGroupResponse, OffsetFetchRequest, OffsetFetchResponse, SyncGroupRequest, SyncGroupResponse, TopicName,
    };
    use kafka_protocol::protocol::StrBytes;

    let mut sock = tokio::net::TcpStream::connect(addr).await.unwrap();
    sock.set_nodelay(true).unwrap();
    let mut id = 0;
    let mut times = Vec::with_capacity(runs);
    for run in 0..runs {
        let group = StrBytes::from_string(format!("bench.handshake.{run}"));
        let join = |member: StrBytes| {
            JoinGroupRequest::default()
                .with_group_id(GroupId(group.clone()))
                .with_session_timeout_ms(10_000)
                .with_rebalance_timeout_ms(10_000)
                .with_member_id(member)
                .with_protocol_type(StrBytes::from_static_str("consumer"))
                .with_protocols(vec![JoinGroupRequestProtocol::default().with_name(StrBytes::from_static_str("range")).with_metadata(bytes::Bytes::from_static(b"meta"))])
        };
        let started = Instant::now();
        id += 1;
        let r: FindCoordinatorResponse = common::call(&mut sock, 10, 2, id, &FindCoordinatorRequest::default().with_key(group.clone())).await;
        assert_eq!(r.error_code, 0);
        id += 1;
        let first: JoinGroupResponse = common::call(&mut sock, 11, 5, id, &join(StrBytes::new())).await;
        assert_eq!(first.error_code, 79);
        id += 1;
        let joined: JoinGroupResponse = common::call(&mut sock, 11, 5, id, &join(first.member_id.clone())).await;
        assert_eq!(joined.error_code, 0);
        id += 1;
        let sync = SyncGroupRequest::default()
            .with_group_id(GroupId(group.clone()))
            .with_generation_id(joined.generation_id)
            .with_member_id(joined.member_id.clone())
            .with_assignments(vec![SyncGroupRequestAssignment::default().with_member_id(joined.member_id.clone()).with_assignment(bytes::Bytes::from_static(b"assignment"))]);
        let r: SyncGroupResponse = common::call(&mut sock, 14, 3, id, &sync).await;
        assert_eq!(r.error_code, 0);
        id += 1;
        let fetch = OffsetFetchRequest::default().with_group_id(GroupId(group.clone())).with_topics(Some(vec![
            OffsetFetchRequestTopic::default().with_name(TopicName(StrBytes::from_static_str(TOPIC))).with_partition_indexes((0..PARTITIONS).collect()),
        ]));
        let r: OffsetFetchResponse = common::call(&mut sock, 9, 1, id, &fetch).await;
        assert_eq!(r.topics[0].partitions.len(), PARTITIONS as usize);
        times.push(started.elapsed().as_secs_f64() * 1000.0);
    }
    times.sort_by(f64::total_cmp);
    times[times.len() / 2]
}

