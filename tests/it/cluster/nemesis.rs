//! The nemesis (issue 24, "What must be shown"): three etcd members and
//! three Canopy nodes, each node in a network namespace of its own; two topics of replication factor 3 and
//! min.insync.replicas 2 in one branch; two idempotent acks=all
//! librdkafka producers and a consumer group committing its offsets, while
//! a nemesis kills leaders with -9 (and restarts them on their address),
//! pauses nodes (SIGSTOP, past their session or not), kills a leader
//! while both its followers are paused (a leader cut off from its
//! replicas but not from its clients) and kills etcd members, one fault
//! at a time, cuts the link between two nodes, cuts a node from etcd,
//! and restarts a leader cleanly (controlled shutdown)
//! (each node runs in a network namespace of its own: see
//! `cluster_support::Net`; the test needs root).
//!
//! Afterwards everything is healed and the history is checked, in the
//! spirit of Jepsen's Kafka queue checker: every acknowledged record is
//! in the log at the offset it was acknowledged for; no record is in the
//! log twice; per partition, each producer's records keep the order it
//! sent them in; every record a consumer read is the log's record at that
//! offset (nothing read was later cut away); the group's committed
//! offsets never move backwards (nor vanish), also across its
//! coordinator's death, and never past the log's end; every log
//! is whole (no offset without its record); the group skipped nothing;
//! no producer hit a fatal error.
//!
//! It runs `CANOPY_NEMESIS_SECS` seconds of faults (60 by default: the
//! bounded run of `.ci/run`; the long run is 300 or more), with the fault
//! schedule drawn from `CANOPY_NEMESIS_SEED` (printed, so a failure can
//! be replayed as far as timing allows):
//!
//!     CANOPY_NEMESIS_SECS=300 CANOPY_CLUSTER_BIN=target/release/canopy \
//!         cargo test --release --test it cluster::nemesis -- --ignored --nocapture
//!
//! On a violation the test keeps, under `target/tmp/nemesis-<seed>/`, the
//! group consumer's librdkafka log (`debug=consumer`), every node's log,
//! the final records and the faults, and prints where the consumer's
//! position jumped: that is how the skipped offsets of docs/cluster.md
//! ("The harness") were traced to OffsetForLeaderEpoch.

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::message::DeliveryResult;
use rdkafka::producer::{BaseRecord, Producer, ProducerContext, ThreadedProducer};
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::{ClientContext, Message, Offset, TopicPartitionList};

use super::{isrs, wait_isrs};
use crate::common::{self, ChildBroker};
use crate::cluster_support::{spawn_node_on, Etcd, Net};

const TOPICS: [&str; 2] = ["nem.a", "nem.b"];
const PARTITIONS: i32 = 3;
const GROUP: &str = "nem.g";

/// (topic, partition).
type Tp = (String, i32);

/// What the clients saw, in the order they saw it.
#[derive(Default)]
struct History {
    /// Acknowledged: where each value was written.
    acked: Vec<(Tp, i64, String)>,
    /// Deliveries that failed (their records may or may not be in the log).
    failed: Vec<(String, String)>,
    /// What the group's consumer read.
    consumed: Vec<(Tp, i64, String)>,
    /// Errors the group's consumer was given instead of a record, with the
    /// second they came and what the consumer had last read (for a
    /// violation's diagnosis: a bad message is skipped by librdkafka).
    consumer_errors: Vec<String>,
    /// Each time the group's consumer read a partition at another offset
    /// than the one after its last read there, with the second it came.
    jumps: Vec<String>,
    /// librdkafka's debug log of the group's consumer (fetch and group
    /// events), with seconds since the start: written out on a violation.
    consumer_log: Vec<String>,
    /// librdkafka's debug log of the producers (idempotence and message
    /// sets: implicit acknowledgements, retries, drains), with seconds
    /// since the start: written out on a violation.
    producer_log: Vec<String>,
    /// The nodes' log lines, per node id: written out on a violation.
    node_logs: BTreeMap<i32, Vec<String>>,
    /// The group's committed offsets, as an observer read them over time.
    committed: BTreeMap<Tp, Vec<i64>>,
    /// Fatal errors of producers (each replaced by a new one).
    fatal: Vec<String>,
    /// The nemesis's log, with seconds since the start.
    faults: Vec<String>,
}

type Shared = Arc<Mutex<History>>;

/// A producer's context: keeps its deliveries and its log lines.
struct Recorder(Shared, u32, Instant);

impl ClientContext for Recorder {
    fn log(&self, level: rdkafka::config::RDKafkaLogLevel, fac: &str, line: &str) {
        self.0.lock().unwrap().producer_log.push(format!("[{:7.3}s] w{} {level:?} {fac} {line}", self.2.elapsed().as_secs_f64(), self.1));
    }
}

impl ProducerContext for Recorder {
    type DeliveryOpaque = Box<String>;
    fn delivery(&self, r: &DeliveryResult<'_>, value: Box<String>) {
        let mut h = self.0.lock().unwrap();
        match r {
            Ok(m) => h.acked.push(((m.topic().to_owned(), m.partition()), m.offset(), *value)),
            Err((e, _)) => h.failed.push((*value, e.to_string())),
        }
    }
}

/// The group consumer's context: keeps librdkafka's log lines.
struct Logger(Shared, Instant);

impl ClientContext for Logger {
    fn log(&self, level: rdkafka::config::RDKafkaLogLevel, fac: &str, line: &str) {
        self.0.lock().unwrap().consumer_log.push(format!("[{:7.3}s] {level:?} {fac} {line}", self.1.elapsed().as_secs_f64()));
    }
}

impl rdkafka::consumer::ConsumerContext for Logger {}

/// A small deterministic generator (xorshift64*) for the fault schedule.
struct Dice(u64);

impl Dice {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) % n
    }

    fn millis(&mut self, from: u64, to: u64) -> Duration {
        Duration::from_millis(from + self.below(to - from))
    }
}

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().map(|v| v.parse().unwrap_or_else(|_| panic!("{name} is not a number: {v}")))
}

/// Producer `w`: records `w<w>.<generation>.<i>` to partition i/2 % 3 of
/// topic i % 2, in small bursts, until `stop`; a producer that hits a
/// fatal error is replaced by a new one (a new generation, a new producer
/// id). Waits for every delivery report before it returns.
fn producer(w: u32, boot: String, h: Shared, began: Instant, stop: Instant) {
    let make = || -> ThreadedProducer<Recorder> {
        let mut cfg = config(&boot);
        cfg.set("acks", "all").set("enable.idempotence", "true").set("linger.ms", "5").set("message.timeout.ms", "120000").set("debug", "eos,msg");
        cfg.set_log_level(rdkafka::config::RDKafkaLogLevel::Debug);
        cfg.create_with_context(Recorder(h.clone(), w, began)).unwrap()
    };
    let (mut generation, mut i) = (0u32, 0u64);
    let mut p = make();
    'sending: while Instant::now() < stop {
        for _ in 0..10 {
            let (topic, partition) = (TOPICS[(i % 2) as usize], ((i / 2) % PARTITIONS as u64) as i32);
            let value = format!("w{w}.{generation}.{i}");
            let record = BaseRecord::<(), String, Box<String>>::with_opaque_to(topic, Box::new(value.clone())).partition(partition).payload(&value);
            match common::send_waiting(&p, record) {
                // Replaced below.
                Ok(()) | Err(KafkaError::MessageProduction(RDKafkaErrorCode::Fatal)) => {}
                Err(e) => panic!("producer {w}: {e}"),
            }
            i += 1;
            if let Some((code, reason)) = p.client().fatal_error() {
                h.lock().unwrap().fatal.push(format!("producer {w} generation {generation}: {code:?} {reason}"));
                let _ = p.flush(Duration::from_secs(10));
                generation += 1;
                p = make();
                continue 'sending;
            }
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    p.flush(Duration::from_secs(180)).expect("every delivery reported");
}

/// A client bootstrapping from every node (`boot` lists them).
fn config(boot: &str) -> rdkafka::ClientConfig {
    let mut c = rdkafka::ClientConfig::new();
    c.set("bootstrap.servers", boot).set("broker.address.family", "v4");
    c
}

fn all_partitions() -> TopicPartitionList {
    let mut tpl = TopicPartitionList::new();
    for t in TOPICS {
        for p in 0..PARTITIONS {
            tpl.add_partition(t, p);
        }
    }
    tpl
}

/// The group's consumer: reads and commits synchronously every 300 ms
/// until `done`.
fn consumer(boot: String, h: Shared, done: Arc<AtomicBool>) {
    let mut cfg = config(&boot);
    cfg.set("group.id", GROUP).set("enable.auto.commit", "false").set("auto.offset.reset", "earliest").set("debug", "consumer");
    let start = Instant::now();
    cfg.set_log_level(rdkafka::config::RDKafkaLogLevel::Debug);
    let c: BaseConsumer<Logger> = cfg.create_with_context(Logger(h.clone(), start)).unwrap();
    c.subscribe(&TOPICS).unwrap();
    let mut committed = Instant::now();
    let mut last: HashMap<Tp, i64> = HashMap::new();
    while !done.load(Ordering::Relaxed) {
        match c.poll(Duration::from_millis(100)) {
            Some(Ok(m)) => {
                let value = String::from_utf8(m.payload().unwrap_or_default().to_vec()).unwrap();
                let tp = (m.topic().to_owned(), m.partition());
                let mut h = h.lock().unwrap();
                if let Some(before) = last.insert(tp.clone(), m.offset()).filter(|b| b + 1 != m.offset()) {
                    h.jumps.push(format!("[{:.3}s] {tp:?}: read offset {} after offset {before}", start.elapsed().as_secs_f64(), m.offset()));
                }
                h.consumed.push((tp, m.offset(), value));
            }
            Some(Err(e)) => {
                let mut h = h.lock().unwrap();
                let last = h.consumed.last().map(|(tp, o, _)| format!("{tp:?}@{o}")).unwrap_or_default();
                h.consumer_errors.push(format!("[{:.1}s] {e} (last read {last})", start.elapsed().as_secs_f64()));
            }
            None => {}
        }
        if committed.elapsed() > Duration::from_millis(300) {
            // Fails while the coordinator moves or nothing is assigned.
            let _ = c.commit_consumer_state(CommitMode::Sync);
            committed = Instant::now();
        }
    }
    let _ = c.commit_consumer_state(CommitMode::Sync);
}

/// Reads the group's committed offsets every 250 ms (OffsetFetch, without
/// joining) until `done`; across coordinator deaths, since the offsets
/// live in the coordinator shards' replicated logs.
fn observer(boot: String, h: Shared, done: Arc<AtomicBool>) {
    let mut cfg = config(&boot);
    cfg.set("group.id", GROUP).set("enable.auto.commit", "false");
    let c: BaseConsumer = cfg.create().unwrap();
    while !done.load(Ordering::Relaxed) {
        if let Ok(tpl) = c.committed_offsets(all_partitions(), Duration::from_secs(5)) {
            let mut h = h.lock().unwrap();
            for e in tpl.elements() {
                let tp = (e.topic().to_owned(), e.partition());
                match e.offset() {
                    Offset::Offset(o) => h.committed.entry(tp).or_default().push(o),
                    // No commit, answered without error, after one was
                    // seen: the commit was lost (a new coordinator that
                    // did not have it), which counts as moving back.
                    Offset::Invalid if e.error().is_ok() && h.committed.contains_key(&tp) => h.committed.entry(tp).or_default().push(-1),
                    _ => {}
                }
            }
        }
        std::thread::sleep(Duration::from_millis(250));
    }
}

/// Every record of every partition, from the start to its high
/// watermark, read through a fresh librdkafka consumer: offset → value.
fn read_logs(boot: &str) -> HashMap<Tp, BTreeMap<i64, String>> {
    let mut cfg = config(boot);
    cfg.set("group.id", "nem.reader").set("enable.auto.commit", "false");
    let c: BaseConsumer = cfg.create().unwrap();
    let mut tpl = TopicPartitionList::new();
    let mut ends = HashMap::new();
    for t in TOPICS {
        for p in 0..PARTITIONS {
            let (_, high) = c.fetch_watermarks(t, p, Duration::from_secs(30)).expect("watermarks");
            ends.insert((t.to_owned(), p), high);
            tpl.add_partition_offset(t, p, Offset::Beginning).unwrap();
        }
    }
    c.assign(&tpl).unwrap();
    let mut logs: HashMap<Tp, BTreeMap<i64, String>> = HashMap::new();
    let deadline = Instant::now() + Duration::from_secs(120);
    let behind = |logs: &HashMap<Tp, BTreeMap<i64, String>>| ends.iter().filter(|(tp, end)| **end > 0 && logs.get(*tp).and_then(|l| l.keys().next_back()).is_none_or(|last| last + 1 < **end)).count();
    while behind(&logs) > 0 {
        assert!(Instant::now() < deadline, "the final read did not reach the high watermarks {ends:?} in 120 s");
        if let Some(Ok(m)) = c.poll(Duration::from_millis(200)) {
            let value = String::from_utf8(m.payload().unwrap_or_default().to_vec()).unwrap();
            logs.entry((m.topic().to_owned(), m.partition())).or_default().insert(m.offset(), value);
        }
    }
    logs
}

/// What the history breaks, as sentences (empty when it holds).
fn check(h: &History, logs: &HashMap<Tp, BTreeMap<i64, String>>) -> Vec<String> {
    // librdkafka's idempotent producer turns fatal only on what a broker
    // must not do (a sequence gap: acknowledged records gone).
    let mut wrong: Vec<String> = h.fatal.iter().map(|f| format!("a producer hit a fatal error: {f}")).collect();
    let at = |tp: &Tp, o: i64| logs.get(tp).and_then(|l| l.get(&o));
    for (tp, o, v) in &h.acked {
        if *o < 0 {
            // Acknowledged without an offset (librdkafka's implicit
            // acknowledgement: a later batch of the producer was taken,
            // so the broker vouched for this one): it must be in the log.
            if !logs.get(tp).is_some_and(|l| l.values().any(|found| found == v)) {
                wrong.push(format!("{v} was acknowledged at {tp:?} without an offset ({o}) and is not in its log"));
            }
            continue;
        }
        match at(tp, *o) {
            Some(found) if found == v => {}
            found => wrong.push(format!("{v} was acknowledged at {tp:?} offset {o}, which holds {found:?}")),
        }
    }
    let mut seen: HashMap<&str, (&Tp, i64)> = HashMap::new();
    for (tp, log) in logs {
        // Per (producer, generation), the sequence numbers rise.
        let mut last: HashMap<&str, u64> = HashMap::new();
        for (o, v) in log {
            if let Some((first_tp, first_o)) = seen.insert(v, (tp, *o)) {
                wrong.push(format!("{v} is in the log twice: {first_tp:?} offset {first_o} and {tp:?} offset {o}"));
            }
            let (writer, i) = v.rsplit_once('.').unwrap_or_else(|| panic!("a value that no producer wrote: {v}"));
            let i: u64 = i.parse().unwrap();
            if let Some(before) = last.insert(writer, i) {
                if before >= i {
                    wrong.push(format!("{tp:?}: {writer}.{i} at offset {o} comes after {writer}.{before}"));
                }
            }
        }
    }
    // No transactions, no retention: every log is offsets 0..end, each
    // holding a record.
    for (tp, log) in logs {
        if let Some((i, o)) = log.keys().enumerate().find(|(i, o)| **o != *i as i64) {
            wrong.push(format!("{tp:?}: the log has no record at offset {i} (the next is at {o})"));
        }
    }
    let mut read: HashMap<&Tp, std::collections::BTreeSet<i64>> = HashMap::new();
    for (tp, o, v) in &h.consumed {
        if at(tp, *o) != Some(v) {
            wrong.push(format!("the group read {v} at {tp:?} offset {o}, which holds {:?}", at(tp, *o)));
        }
        read.entry(tp).or_default().insert(*o);
    }
    // The group skipped nothing below the furthest it read.
    for (tp, offsets) in &read {
        let furthest = *offsets.last().expect("a read offset");
        if let Some(skipped) = (0..furthest).find(|o| !offsets.contains(o)) {
            wrong.push(format!("{tp:?}: the group read up to offset {furthest} but never offset {skipped}"));
        }
    }
    for (tp, seen) in &h.committed {
        if let Some(w) = seen.windows(2).find(|w| w[1] < w[0]) {
            wrong.push(format!("{tp:?}: the committed offset moved back from {} to {}", w[0], w[1]));
        }
        let end = logs.get(tp).and_then(|l| l.keys().next_back()).map_or(0, |o| o + 1);
        if seen.iter().any(|c| *c > end) {
            wrong.push(format!("{tp:?}: an offset past the log's end {end} was committed: {seen:?}"));
        }
    }
    wrong
}

/// The leader of a random partition of the nemesis's topics, as a live
/// node describes it (None while it has none).
async fn a_leader(nodes: &[Option<ChildBroker>], dice: &mut Dice) -> Option<i32> {
    let live: Vec<SocketAddr> = nodes.iter().flatten().map(|n| n.kafka).collect();
    let ask = live[dice.below(live.len() as u64) as usize];
    let topic = TOPICS[dice.below(2) as usize];
    let parts = tokio::time::timeout(Duration::from_secs(5), isrs(ask, topic)).await.ok()?;
    let leader = parts.get(dice.below(PARTITIONS as u64) as usize)?.0;
    (leader > 0).then_some(leader)
}

fn signal(node: &ChildBroker, sig: &str) {
    assert!(Command::new("kill").arg(sig).arg(node.child.id().to_string()).status().unwrap().success());
}

struct DoneOnDrop(Arc<AtomicBool>);

impl Drop for DoneOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

/// The nodes (index 0 unused), each in a network namespace of its own,
/// and etcd. Fields drop in order: the nodes before their namespaces.
struct Cluster<'a> {
    root: &'a Path,
    nodes: Vec<Option<ChildBroker>>,
    etcd: Etcd,
    net: Net,
}

impl Cluster<'_> {
    /// Node `id`'s Kafka address; a restart keeps it.
    fn addr(&self, id: i32) -> SocketAddr {
        SocketAddr::from((self.net.node(id), 9092))
    }

    /// Takes node `id` out (to kill it), keeping its log lines so far.
    fn take(&mut self, id: i32, h: &Shared) -> ChildBroker {
        let node = self.nodes[id as usize].take().expect("a running node");
        h.lock().unwrap().node_logs.entry(id).or_default().extend(node.log.try_iter());
        node
    }

    async fn restart(&mut self, id: i32) {
        let (root, addr, endpoints) = (self.root.to_owned(), self.addr(id), self.etcd.endpoints());
        let wrapper: Vec<String> = self.net.exec(id).map(String::from).to_vec();
        let node = tokio::task::spawn_blocking(move || {
            let wrapper: Vec<&str> = wrapper.iter().map(String::as_str).collect();
            spawn_node_on(&root, id, &endpoints, addr, &wrapper, &["--replica-lag-time-max-ms", "5000"])
        })
        .await
        .unwrap();
        self.nodes[id as usize] = Some(node);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs etcd, root (network namespaces) and a canopy built with --features cluster: see the module docs of tests/it/cluster.rs"]
async fn acknowledged_records_survive_the_nemesis() {
    let secs = env_u64("CANOPY_NEMESIS_SECS").unwrap_or(60);
    let seed = env_u64("CANOPY_NEMESIS_SEED").unwrap_or_else(|| std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64 | 1);
    println!("nemesis: {secs} s, seed {seed} (CANOPY_NEMESIS_SEED={seed} replays the schedule)");
    let mut dice = Dice(seed);
    let root = tempfile::tempdir().unwrap();
    let net = Net::create(3);
    let etcd = Etcd::start_on(root.path(), net.etcd());
    let mut c = Cluster { root: root.path(), nodes: vec![None, None, None, None], etcd, net };
    for id in 1..=3 {
        c.restart(id).await;
    }
    let addrs: Vec<SocketAddr> = (0..4).map(|id| c.addr(id)).collect();
    let boot = addrs[1..].iter().map(|a| a.to_string()).collect::<Vec<_>>().join(",");
    {
        use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
        let admin: AdminClient<rdkafka::client::DefaultClientContext> = common::client(addrs[1]).create().unwrap();
        let topics: Vec<NewTopic> = TOPICS.iter().map(|t| NewTopic::new(t, PARTITIONS, TopicReplication::Fixed(3)).set("min.insync.replicas", "2")).collect();
        for r in admin.create_topics(&topics, &AdminOptions::new()).await.unwrap() {
            r.expect("created with three replicas");
        }
    }
    for t in TOPICS {
        wait_isrs(addrs[1], t, "every node in sync", |ps| ps.len() == PARTITIONS as usize && ps.iter().all(|(l, _, isr)| *l > 0 && *isr == vec![1, 2, 3])).await;
    }

    let h: Shared = Arc::default();
    let start = Instant::now();
    let stop = start + Duration::from_secs(secs);
    let done = Arc::new(AtomicBool::new(false));
    // The readers stop with the test, also when it fails.
    let _done_on_drop = DoneOnDrop(done.clone());
    let producers: Vec<_> = (0..2).map(|w| {
        let (boot, h) = (boot.clone(), h.clone());
        std::thread::spawn(move || producer(w, boot, h, start, stop))
    }).collect();
    let readers: Vec<_> = [consumer as fn(String, Shared, Arc<AtomicBool>), observer].into_iter().map(|f| {
        let (boot, h, done) = (boot.clone(), h.clone(), done.clone());
        std::thread::spawn(move || f(boot, h, done))
    }).collect();

    // One fault at a time, each healed before the next.
    let log = |h: &Shared, what: String| {
        println!("[{:6.1}s] {what}", start.elapsed().as_secs_f64());
        h.lock().unwrap().faults.push(format!("[{:.1}s] {what}", start.elapsed().as_secs_f64()));
    };
    let mut counts = [0u32; 8];
    while Instant::now() < stop {
        tokio::time::sleep(dice.millis(1000, 3000)).await;
        let kind = dice.below(8) as usize;
        match kind {
            0 | 1 => {
                // kill -9 a partition's leader (or, for kind 1, any node).
                let victim = if kind == 0 { a_leader(&c.nodes, &mut dice).await } else { Some(1 + dice.below(3) as i32) };
                let Some(victim) = victim else { continue };
                let down = dice.millis(500, 4000);
                log(&h, format!("kill -9 node {victim} ({}), restart after {down:?}", if kind == 0 { "a leader" } else { "any node" }));
                c.take(victim, &h).kill9();
                tokio::time::sleep(down).await;
                c.restart(victim).await;
                log(&h, format!("node {victim} serving again"));
            }
            4 => {
                // A leader alone: both its followers paused (for less than
                // their session, so they stay in the ISR) while clients
                // still reach it; then it dies. What it had acknowledged
                // must be on a follower already.
                let Some(leader) = a_leader(&c.nodes, &mut dice).await else { continue };
                let alone = dice.millis(300, 2000);
                log(&h, format!("node {leader} (a leader) alone for {alone:?}, then kill -9, its followers resumed"));
                let others: Vec<usize> = (1..=3).filter(|n| *n != leader as usize).collect();
                for n in &others {
                    signal(c.nodes[*n].as_ref().unwrap(), "-STOP");
                }
                tokio::time::sleep(alone).await;
                c.take(leader, &h).kill9();
                for n in &others {
                    signal(c.nodes[*n].as_ref().unwrap(), "-CONT");
                }
                tokio::time::sleep(dice.millis(500, 3000)).await;
                c.restart(leader).await;
                log(&h, format!("node {leader} serving again"));
            }
            2 => {
                let victim = 1 + dice.below(3) as usize;
                let paused = dice.millis(500, 6000);
                log(&h, format!("SIGSTOP node {victim} for {paused:?}"));
                signal(c.nodes[victim].as_ref().unwrap(), "-STOP");
                tokio::time::sleep(paused).await;
                signal(c.nodes[victim].as_ref().unwrap(), "-CONT");
            }
            3 => {
                let member = dice.below(3) as usize;
                let down = dice.millis(500, 4000);
                log(&h, format!("kill -9 etcd member {member}, restart after {down:?}"));
                c.etcd.kill_member(member);
                tokio::time::sleep(down).await;
                c.etcd.restart_member(member);
                // Back in the quorum before the next fault.
                tokio::task::block_in_place(|| c.etcd.wait_healthy());
            }
            5 => {
                // A cut link between two nodes: neither reaches the other,
                // both reach etcd and their clients.
                let a = 1 + dice.below(3) as i32;
                let b = 1 + (a as u64 + dice.below(2)) as i32 % 3;
                let cut = dice.millis(1000, 8000);
                log(&h, format!("link between nodes {a} and {b} cut for {cut:?}"));
                c.net.link(a, b, true);
                tokio::time::sleep(cut).await;
                c.net.link(a, b, false);
            }
            6 => {
                // A node cut from etcd, not from its clients or peers.
                let id = 1 + dice.below(3) as i32;
                let cut = dice.millis(1000, 6000);
                log(&h, format!("node {id} cut from etcd for {cut:?}"));
                c.net.etcd_link(id, true);
                tokio::time::sleep(cut).await;
                c.net.etcd_link(id, false);
            }
            7 => {
                // A clean restart of a leader (controlled shutdown: its
                // leadership is handed over before it goes).
                let Some(victim) = a_leader(&c.nodes, &mut dice).await else { continue };
                log(&h, format!("node {victim} (a leader) stopped cleanly, restarted"));
                let node = c.take(victim, &h);
                let status = tokio::task::spawn_blocking(move || node.terminate_within(Duration::from_secs(60))).await.unwrap();
                assert!(status.is_some_and(|s| s.success()), "node {victim} did not stop cleanly within 60 s: {status:?}");
                c.restart(victim).await;
                log(&h, format!("node {victim} serving again"));
            }
            _ => unreachable!(),
        }
        counts[kind] += 1;
    }
    log(&h, format!("healed; faults: {} leader kills, {} node kills, {} pauses, {} etcd member kills, {} leaders killed alone, {} cut links, {} nodes cut from etcd, {} clean restarts of leaders", counts[0], counts[1], counts[2], counts[3], counts[4], counts[5], counts[6], counts[7]));

    for p in producers {
        tokio::task::spawn_blocking(move || p.join().expect("producer")).await.unwrap();
    }
    c.etcd.wait_healthy();
    for t in TOPICS {
        wait_isrs(addrs[1], t, "every node in sync after the nemesis", |ps| ps.len() == PARTITIONS as usize && ps.iter().all(|(l, _, isr)| *l > 0 && *isr == vec![1, 2, 3])).await;
    }
    // The group reads on until it has read past every acknowledged offset.
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let behind = {
            let h = h.lock().unwrap();
            let mut read: HashMap<&Tp, i64> = HashMap::new();
            for (tp, o, _) in &h.consumed {
                let e = read.entry(tp).or_insert(-1);
                *e = (*e).max(*o);
            }
            h.acked.iter().filter(|(tp, o, _)| read.get(tp).is_none_or(|r| r < o)).count()
        };
        if behind == 0 {
            break;
        }
        assert!(Instant::now() < deadline, "the group has not read {behind} acknowledged records 120 s after the nemesis");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // A last commit and a last observation.
    tokio::time::sleep(Duration::from_secs(1)).await;
    done.store(true, Ordering::Relaxed);
    for r in readers {
        tokio::task::spawn_blocking(move || r.join().expect("reader")).await.unwrap();
    }
    let logs = {
        let boot = boot.clone();
        tokio::task::spawn_blocking(move || read_logs(&boot)).await.unwrap()
    };

    for id in 1..=3 {
        let node = c.take(id, &h);
        c.nodes[id as usize] = Some(node);
    }
    let h = h.lock().unwrap();
    let in_log: usize = logs.values().map(BTreeMap::len).sum();
    println!(
        "nemesis: {} acknowledged, {} failed, {} in the log, {} read by the group, {} committed-offset observations, {} consumer errors, producers replaced: {:?}",
        h.acked.len(),
        h.failed.len(),
        in_log,
        h.consumed.len(),
        h.committed.values().map(Vec::len).sum::<usize>(),
        h.consumer_errors.len(),
        h.fatal
    );
    let wrong = check(&h, &logs);
    if !wrong.is_empty() {
        let kept = keep_logs(seed, &h, &logs);
        panic!(
            "seed {seed}: {} violations, the first: {:#?}\nfaults: {:#?}\nthe group consumer's errors: {:#?}\nits jumps: {:#?}\nlogs kept in {}",
            wrong.len(),
            &wrong[..wrong.len().min(20)],
            h.faults,
            h.consumer_errors,
            &h.jumps[..h.jumps.len().min(40)],
            kept.display()
        );
    }
    // The run did something: records were acknowledged across the faults,
    // and the group committed.
    assert!(h.acked.len() > 100 * secs as usize / 10, "only {} records acknowledged in {secs} s", h.acked.len());
    assert!(!h.committed.is_empty(), "the group never committed");
}

/// Writes the consumer's and the nodes' logs under the target directory
/// (CI keeps nothing else of a failed run).
fn keep_logs(seed: u64, h: &History, logs: &HashMap<Tp, BTreeMap<i64, String>>) -> std::path::PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("nemesis-{seed}"));
    std::fs::create_dir_all(&dir).unwrap();
    let mut sorted: Vec<_> = logs.iter().collect();
    sorted.sort();
    let records: Vec<String> = sorted.iter().flat_map(|(tp, log)| log.iter().map(move |(o, v)| format!("{tp:?} {o} {v}"))).collect();
    std::fs::write(dir.join("records.log"), records.join("\n")).unwrap();
    std::fs::write(dir.join("consumer.log"), h.consumer_log.join("\n")).unwrap();
    std::fs::write(dir.join("producers.log"), h.producer_log.join("\n")).unwrap();
    std::fs::write(dir.join("faults.log"), [&h.faults[..], &h.jumps[..], &h.consumer_errors[..]].concat().join("\n")).unwrap();
    for (id, lines) in &h.node_logs {
        std::fs::write(dir.join(format!("node{id}.log")), lines.join("\n")).unwrap();
    }
    dir
}

#[test]
fn the_checker_finds_what_it_is_for() {
    let tp = |p| ("nem.a".to_owned(), p);
    let log: HashMap<Tp, BTreeMap<i64, String>> = [(tp(0), BTreeMap::from([(0, "w0.0.0".to_owned()), (1, "w0.0.2".to_owned()), (2, "w1.0.1".to_owned())]))].into();
    let good = History { acked: vec![(tp(0), 0, "w0.0.0".into()), (tp(0), 2, "w1.0.1".into())], consumed: vec![(tp(0), 0, "w0.0.0".into()), (tp(0), 1, "w0.0.2".into()), (tp(0), 1, "w0.0.2".into())], committed: [(tp(0), vec![0, 2, 3])].into(), ..Default::default() };
    assert_eq!(check(&good, &log), Vec::<String>::new());
    let lost = History { acked: vec![(tp(0), 3, "w0.0.4".into())], ..Default::default() };
    assert_eq!(check(&lost, &log).len(), 1, "an acknowledged record lost");
    let implicit = History { acked: vec![(tp(0), -1001, "w0.0.2".into())], ..Default::default() };
    assert_eq!(check(&implicit, &log), Vec::<String>::new(), "acknowledged without an offset, in the log");
    let implicit_lost = History { acked: vec![(tp(0), -1001, "w0.0.4".into())], ..Default::default() };
    assert_eq!(check(&implicit_lost, &log).len(), 1, "acknowledged without an offset, lost");
    let moved = History { acked: vec![(tp(0), 1, "w0.0.0".into())], ..Default::default() };
    assert_eq!(check(&moved, &log).len(), 1, "an acknowledged offset holding another record");
    let ghost = History { consumed: vec![(tp(0), 0, "w0.0.0".into()), (tp(0), 1, "w0.0.9".into())], ..Default::default() };
    assert_eq!(check(&ghost, &log).len(), 1, "a read record that is not in the log");
    let skipped = History { consumed: vec![(tp(0), 0, "w0.0.0".into()), (tp(0), 2, "w1.0.1".into())], ..Default::default() };
    assert_eq!(check(&skipped, &log).len(), 1, "a record the group skipped");
    let gap: HashMap<Tp, BTreeMap<i64, String>> = [(tp(0), BTreeMap::from([(0, "w0.0.0".to_owned()), (2, "w0.0.2".to_owned())]))].into();
    assert_eq!(check(&History::default(), &gap).len(), 1, "a log with a hole");
    let back = History { committed: [(tp(0), vec![2, 1])].into(), ..Default::default() };
    assert_eq!(check(&back, &log).len(), 1, "a committed offset moving back");
    let past = History { committed: [(tp(0), vec![4])].into(), ..Default::default() };
    assert_eq!(check(&past, &log).len(), 1, "a committed offset past the end");
    let fatal = History { fatal: vec!["producer 0 generation 0: OutOfOrderSequenceNumber".into()], ..Default::default() };
    assert_eq!(check(&fatal, &log).len(), 1, "a producer's fatal error");
    let twice: HashMap<Tp, BTreeMap<i64, String>> = [(tp(0), BTreeMap::from([(0, "w0.0.0".to_owned())])), (tp(1), BTreeMap::from([(0, "w0.0.0".to_owned())]))].into();
    assert_eq!(check(&History::default(), &twice).len(), 1, "a record twice");
    let reordered: HashMap<Tp, BTreeMap<i64, String>> = [(tp(0), BTreeMap::from([(0, "w0.0.4".to_owned()), (1, "w0.0.2".to_owned())]))].into();
    assert_eq!(check(&History::default(), &reordered).len(), 1, "a producer's records out of order");
}
