//! Cluster mode (issue 24, step 2: membership) against a real etcd
//! cluster: three etcd members (Debian's `etcd-server`; `.ci/run` installs
//! it) and Canopy nodes as child processes, all on loopback.
//!
//! The nodes run a Canopy binary built with `--features cluster` (the
//! etcd client needs protoc to build, which `cargo test` on a fresh
//! machine must not): `CANOPY_CLUSTER_BIN`, or this test build's own
//! binary when it has the feature. Because of that these tests are
//! ignored by a plain `cargo test`; `.ci/run` runs them against its
//! release build:
//!
//!     CANOPY_CLUSTER_BIN=target/release/canopy cargo test --test it cluster:: -- --ignored
//!
//! Without etcd, or with a binary lacking the feature, they fail.
//!
//! What is shown: nodes register and one becomes the controller; every
//! node (and librdkafka, bootstrapping from any one) sees the same cluster;
//! producer ids come from blocks in etcd, never twice, and are taken by
//! every node's Produce;
//! a node killed with -9 leaves when its lease lapses and the controller
//! moves; a restarted node registers again (at once, or after waiting out
//! its previous lease); the controller paused past its session is expired,
//! replaced, and registers again when woken; after etcd itself is paused
//! past every session, all nodes register again; a node stopped cleanly
//! leaves at once;
//! a second process with a live node's id, and a node whose etcd cannot be
//! reached, refuse to start.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
use kafka_protocol::messages::{DescribeClusterRequest, DescribeClusterResponse, InitProducerIdRequest, InitProducerIdResponse, ProduceRequest, ProduceResponse, TopicName};
use kafka_protocol::protocol::StrBytes;
use rdkafka::consumer::{BaseConsumer, Consumer};

use crate::common::{self, ChildBroker};

/// The etcd server binary: Debian's `etcd-server` package.
fn etcd_binary() -> PathBuf {
    let found = ["/usr/bin/etcd", "/usr/local/bin/etcd"].into_iter().map(PathBuf::from).find(|p| p.exists());
    found.expect("etcd is not installed: cluster tests need Debian's etcd-server (apt-get install etcd-server; .ci/run installs it)")
}

/// The Canopy binary the nodes run (see the module docs).
fn canopy_binary() -> PathBuf {
    match std::env::var_os("CANOPY_CLUSTER_BIN") {
        Some(p) => PathBuf::from(p),
        None if cfg!(feature = "cluster") => PathBuf::from(env!("CARGO_BIN_EXE_canopy")),
        None => panic!("set CANOPY_CLUSTER_BIN to a canopy built with --features cluster (cargo build --release --features cluster)"),
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// A three-member etcd cluster on loopback, killed when dropped.
struct Etcd {
    members: Vec<Child>,
    endpoints: Vec<String>,
}

impl Etcd {
    fn start(dir: &Path) -> Etcd {
        let bin = etcd_binary();
        let ports: Vec<(u16, u16)> = (0..3).map(|_| (free_port(), free_port())).collect();
        let initial: Vec<String> = ports.iter().enumerate().map(|(i, (_, peer))| format!("e{i}=http://127.0.0.1:{peer}")).collect();
        let initial = initial.join(",");
        let mut members = Vec::new();
        for (i, (client, peer)) in ports.iter().enumerate() {
            let log = std::fs::File::create(dir.join(format!("etcd{i}.log"))).unwrap();
            let child = Command::new(&bin)
                .args(["--name", &format!("e{i}")])
                .arg("--data-dir")
                .arg(dir.join(format!("etcd{i}")))
                .args(["--listen-client-urls", &format!("http://127.0.0.1:{client}")])
                .args(["--advertise-client-urls", &format!("http://127.0.0.1:{client}")])
                .args(["--listen-peer-urls", &format!("http://127.0.0.1:{peer}")])
                .args(["--initial-advertise-peer-urls", &format!("http://127.0.0.1:{peer}")])
                .args(["--initial-cluster", &initial, "--initial-cluster-state", "new", "--initial-cluster-token", "canopy-test"])
                .stdout(Stdio::null())
                .stderr(log)
                .spawn()
                .expect("start etcd");
            members.push(child);
        }
        let endpoints: Vec<String> = ports.iter().map(|(c, _)| format!("http://127.0.0.1:{c}")).collect();
        let etcd = Etcd { members, endpoints };
        etcd.wait_healthy();
        etcd
    }

    /// Until every member answers a quorum read (etcdctl, from Debian's
    /// etcd-client package, which etcd-server depends on).
    fn wait_healthy(&self) {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let ok = Command::new("etcdctl").env("ETCDCTL_API", "3").args(["--endpoints", &self.endpoints.join(","), "endpoint", "health"]).output().is_ok_and(|o| o.status.success());
            if ok {
                return;
            }
            assert!(Instant::now() < deadline, "etcd did not become healthy in 60 s");
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    fn endpoints(&self) -> String {
        self.endpoints.join(",")
    }

    /// The value of `key` (empty if absent), by etcdctl.
    fn get(&self, key: &str) -> String {
        let out = Command::new("etcdctl").env("ETCDCTL_API", "3").args(["--endpoints", &self.endpoints(), "get", "--print-value-only", key]).output().expect("etcdctl");
        assert!(out.status.success(), "etcdctl get: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        for m in &mut self.members {
            let _ = m.kill();
            let _ = m.wait();
        }
    }
}

fn node_args(id: i32, etcd: &Etcd, session_timeout_ms: u32) -> Vec<String> {
    let (id, timeout) = (id.to_string(), session_timeout_ms.to_string());
    ["--node-id", &id, "--etcd-endpoints", &etcd.endpoints(), "--cluster-name", "it", "--broker-session-timeout-ms", &timeout, "--broker-heartbeat-interval-ms", "500"].iter().map(|s| s.to_string()).collect()
}

fn spawn_node(root: &Path, id: i32, etcd: &Etcd) -> ChildBroker {
    spawn_node_with(root, id, etcd, 3000)
}

fn spawn_node_with(root: &Path, id: i32, etcd: &Etcd, session_timeout_ms: u32) -> ChildBroker {
    let dir = root.join(format!("node{id}"));
    std::fs::create_dir_all(&dir).unwrap();
    let args = node_args(id, etcd, session_timeout_ms);
    ChildBroker::spawn_binary(&canopy_binary(), &[], &dir, &args.iter().map(String::as_str).collect::<Vec<_>>())
}

async fn describe(addr: SocketAddr) -> DescribeClusterResponse {
    let mut sock = tokio::net::TcpStream::connect(addr).await.unwrap();
    common::call(&mut sock, 60, 0, 1, &DescribeClusterRequest::default()).await
}

/// (broker id → port, controller, cluster id) as `addr` describes it.
async fn seen_from(addr: SocketAddr) -> (Vec<(i32, i32)>, i32, String) {
    let r = describe(addr).await;
    assert_eq!(r.error_code, 0);
    let mut brokers: Vec<(i32, i32)> = r.brokers.iter().map(|b| (b.broker_id.0, b.port)).collect();
    brokers.sort();
    (brokers, r.controller_id.0, r.cluster_id.to_string())
}

/// Polls `addr` until its view satisfies `done` (a bound for a liveness
/// property, not a timing claim: leases lapse in 3 s here).
async fn wait_until(addr: SocketAddr, what: &str, done: impl Fn(&(Vec<(i32, i32)>, i32, String)) -> bool) -> (Vec<(i32, i32)>, i32, String) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let seen = seen_from(addr).await;
        if done(&seen) {
            return seen;
        }
        assert!(Instant::now() < deadline, "{what}: still {seen:?} after 60 s");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs etcd and a canopy built with --features cluster: see the module docs"]
async fn nodes_join_elect_a_controller_and_follow_deaths_and_restarts() {
    let root = tempfile::tempdir().unwrap();
    let etcd = Etcd::start(root.path());
    let mut nodes: Vec<Option<ChildBroker>> = vec![None];
    for id in 1..=3 {
        nodes.push(Some(spawn_node(root.path(), id, &etcd)));
    }
    let port = |n: &Option<ChildBroker>| n.as_ref().unwrap().kafka.port() as i32;
    let all: Vec<(i32, i32)> = (1..=3).map(|id| (id as i32, port(&nodes[id]))).collect();

    // Every node describes the same three brokers, controller and id.
    let first = wait_until(nodes[1].as_ref().unwrap().kafka, "three nodes", |s| s.0 == all && s.1 > 0).await;
    for (id, node) in nodes.iter().enumerate().skip(2) {
        let seen = wait_until(node.as_ref().unwrap().kafka, "the same view", |s| s.0 == all && s.1 > 0).await;
        assert_eq!((seen.1, &seen.2), (first.1, &first.2), "node {id} sees another controller or cluster");
    }
    assert_eq!(first.2.len(), 22, "a generated cluster id, as Kafka writes them: {}", first.2);

    // librdkafka, bootstrapping from node 3 only, learns all three.
    let addr = nodes[3].as_ref().unwrap().kafka;
    let md = tokio::task::spawn_blocking(move || {
        let c: BaseConsumer = common::client(addr).create().unwrap();
        let md = c.fetch_metadata(None, Duration::from_secs(10)).unwrap();
        md.brokers().iter().map(|b| (b.id(), b.port())).collect::<BTreeSet<_>>()
    })
    .await
    .unwrap();
    assert_eq!(md, all.iter().copied().collect::<BTreeSet<_>>(), "librdkafka's view of the cluster");

    // Producer ids come from blocks in etcd: no two nodes hand out the
    // same one, and an id one node handed out is taken by another's
    // Produce (ids below no block are refused there, as before).
    let mut ids = BTreeSet::new();
    for node in nodes.iter().flatten() {
        for _ in 0..5 {
            assert!(ids.insert(init_producer_id(node.kafka).await), "a producer id handed out twice: {ids:?}");
        }
    }
    // Node 3 joined last: its block is above node 1's own, so node 1
    // takes its id only by knowing the cluster's counter.
    let (a, b) = (nodes[3].as_ref().unwrap().kafka, nodes[1].as_ref().unwrap().kafka);
    let pid = init_producer_id(a).await;
    common::create_topic(b, "ids", 1).await;
    assert_eq!(produce(b, "ids", common::producer_batch(pid, 0, 0, &[b"x"])).await, 0, "node 1 takes node 3's producer id");
    let never = ids.iter().max().unwrap() + 100_000;
    assert_eq!(produce(b, "ids", common::producer_batch(never, 0, 0, &[b"y"])).await, 59, "an id no block holds: UNKNOWN_PRODUCER_ID");

    // kill -9 the controller: it leaves once its lease lapses, and one of
    // the two others takes over.
    let old = first.1;
    nodes[old as usize].take().unwrap().kill9();
    let survivor = nodes.iter().flatten().next().unwrap().kafka;
    let rest: Vec<(i32, i32)> = all.iter().copied().filter(|(id, _)| *id != old).collect();
    let after = wait_until(survivor, "the killed controller gone", |s| s.0 == rest && s.1 > 0 && s.1 != old).await;
    assert!(rest.iter().any(|(id, _)| *id == after.1));
    assert_eq!(after.2, first.2, "the cluster id stays");

    // The killed node comes back (same id and data): registered again.
    nodes[old as usize] = Some(spawn_node(root.path(), old, &etcd));
    let back = port(&nodes[old as usize]);
    wait_until(survivor, "the restarted node back", |s| s.0.len() == 3 && s.0.contains(&(old, back))).await;

    // The restarted node hands out ids from a new block, not its old one's.
    let fresh = init_producer_id(nodes[old as usize].as_ref().unwrap().kafka).await;
    assert!(!ids.contains(&fresh) && fresh > *ids.iter().max().unwrap(), "{fresh} after {ids:?}");

    // The controller paused past its session (SIGSTOP) is expired and
    // another takes over; woken, it finds its lease gone, registers again
    // and is back, no longer the controller.
    let paused = after.1;
    nodes[paused as usize].as_ref().unwrap().log.try_iter().for_each(drop);
    let pid = nodes[paused as usize].as_ref().unwrap().child.id().to_string();
    assert!(Command::new("kill").args(["-STOP", &pid]).status().unwrap().success());
    let seen = wait_until(survivor_of(&nodes, paused), "the paused controller expired", |s| s.0.len() == 2 && !s.0.iter().any(|(id, _)| *id == paused) && s.1 > 0 && s.1 != paused).await;
    let controller = seen.1;
    assert!(Command::new("kill").args(["-CONT", &pid]).status().unwrap().success());
    wait_log(nodes[paused as usize].as_ref().unwrap(), "registered again").await;
    // (Seen by another node: a node always lists itself.)
    wait_until(survivor_of(&nodes, paused), "the paused node back", |s| s.0.len() == 3 && s.1 == controller).await;

    // kill -9 and an immediate restart: the new process waits out its old
    // lease, then registers. A fourth node with an 8 s session, so that
    // its restart surely comes before the old lease lapses; it leaves
    // cleanly afterwards.
    let hasty = 4;
    nodes.push(Some(spawn_node_with(root.path(), hasty, &etcd, 8000)));
    wait_until(nodes[1].as_ref().unwrap().kafka, "a fourth node", |s| s.0.len() == 4).await;
    nodes[hasty as usize].take().unwrap().kill9();
    nodes[hasty as usize] = Some(spawn_node_with(root.path(), hasty, &etcd, 8000));
    let again = port(&nodes[hasty as usize]);
    let log: Vec<String> = nodes[hasty as usize].as_ref().unwrap().log.try_iter().collect();
    assert!(log.iter().any(|l| l.contains("waiting for its lease to lapse")), "the restart did not wait for the old lease");
    wait_until(nodes[1].as_ref().unwrap().kafka, "the hasty restart registered", |s| s.0.len() == 4 && s.0.contains(&(hasty, again))).await;
    assert!(nodes[hasty as usize].take().unwrap().terminate().success());
    wait_until(nodes[1].as_ref().unwrap().kafka, "the fourth node gone", |s| s.0.len() == 3).await;

    // etcd itself stops answering for longer than a session (all three
    // members paused): every lease lapses. When etcd is back, every node
    // finds its lease gone, registers again, and a controller is elected.
    // All members are stopped and resumed at once: a skew could make
    // etcd elect a new leader on resuming, which extends every lease.
    let members: Vec<String> = etcd.members.iter().map(|m| m.id().to_string()).collect();
    for node in nodes.iter().flatten() {
        node.log.try_iter().for_each(drop);
    }
    assert!(Command::new("kill").arg("-STOP").args(&members).status().unwrap().success());
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert!(Command::new("kill").arg("-CONT").args(&members).status().unwrap().success());
    for node in nodes.iter().flatten() {
        wait_log(node, "registered again").await;
    }
    let mut live = -1;
    for node in nodes.iter().flatten() {
        live = wait_until(node.kafka, "every node back after etcd's outage", |s| s.0.len() == 3 && s.1 > 0).await.1;
    }

    // A second process with a live node's id waits out a lease, then
    // refuses to start, naming the reason.
    let dup = root.path().join("duplicate");
    std::fs::create_dir_all(&dup).unwrap();
    let out = refused_start(&dup, &node_args(live, &etcd, 2000));
    assert!(out.contains("is registered by a live node"), "{out}");

    // A clean stop leaves the cluster at once: the lease is revoked, so the
    // node's key is gone as soon as the process has exited (no lapse).
    let quiet = (1..=3i32).find(|id| *id != live).unwrap();
    let status = nodes[quiet as usize].take().unwrap().terminate();
    assert!(status.success(), "{status:?}");
    assert_eq!(etcd.get(&format!("/canopy/it/nodes/{quiet}")), "", "the stopped node's registration outlived it");
    let seen = wait_until(nodes[live as usize].as_ref().unwrap().kafka, "the stopped node gone", |s| s.0.len() == 2 && !s.0.iter().any(|(id, _)| *id == quiet)).await;
    assert_eq!(seen.1, live, "the controller did not change");
}

async fn init_producer_id(addr: SocketAddr) -> i64 {
    let mut sock = tokio::net::TcpStream::connect(addr).await.unwrap();
    let r: InitProducerIdResponse = common::call(&mut sock, 22, 4, 1, &InitProducerIdRequest::default().with_transaction_timeout_ms(60_000)).await;
    assert_eq!(r.error_code, 0);
    r.producer_id.0
}

/// Produces `batch` (acks=all) to partition 0 of `topic`; the error code.
async fn produce(addr: SocketAddr, topic: &str, batch: bytes::Bytes) -> i16 {
    let mut sock = tokio::net::TcpStream::connect(addr).await.unwrap();
    let req = ProduceRequest::default().with_acks(-1).with_timeout_ms(10_000).with_topic_data(vec![TopicProduceData::default()
        .with_name(TopicName(StrBytes::from_string(topic.to_owned())))
        .with_partition_data(vec![PartitionProduceData::default().with_index(0).with_records(Some(batch))])]);
    let r: ProduceResponse = common::call(&mut sock, 0, 8, 2, &req).await;
    r.responses[0].partition_responses[0].error_code
}

/// Waits (at most 60 s) for a log line of `node` containing `needle`
/// (lines read are consumed: drain the log before the step that should
/// write it). If it never comes after etcd's pause, etcd may have
/// elected a new leader on resuming, which extends every lease.
async fn wait_log(node: &ChildBroker, needle: &str) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if node.log.try_iter().any(|l| l.contains(needle)) {
            return;
        }
        assert!(Instant::now() < deadline, "no {needle:?} in the log of the node on {} after 60 s", node.kafka);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The Kafka address of a running node other than `not`.
fn survivor_of(nodes: &[Option<ChildBroker>], not: i32) -> SocketAddr {
    nodes.iter().enumerate().find(|(id, n)| *id as i32 != not && n.is_some()).and_then(|(_, n)| n.as_ref()).unwrap().kafka
}

/// Starts a node expected to fail; returns its stderr.
fn refused_start(dir: &Path, extra: &[String]) -> String {
    let out = Command::new(canopy_binary())
        .arg("serve")
        .arg("--data-dir")
        .arg(dir)
        .args(["--kafka-listener", "127.0.0.1:0", "--admin-listener", "127.0.0.1:0", "--rest-listener", ""])
        .args(extra)
        .output()
        .expect("run canopy");
    assert!(!out.status.success(), "it started");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
#[ignore = "needs etcd and a canopy built with --features cluster: see the module docs"]
fn a_node_whose_etcd_cannot_be_reached_refuses_to_start() {
    let dir = tempfile::tempdir().unwrap();
    let nobody = format!("http://127.0.0.1:{}", free_port());
    let out = refused_start(dir.path(), &["--node-id", "1", "--etcd-endpoints", &nobody].map(String::from));
    assert!(out.contains("reading the cluster id") && out.contains(&nobody), "{out}");
}
