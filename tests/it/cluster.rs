//! Cluster mode (issue 24, step 2: membership) against a real etcd
//! cluster: three etcd members (Debian's `etcd-server`; `.ci/run` installs
//! it) and Canopy nodes as child processes, all on loopback. Built only
//! with `--features cluster`; without etcd on the machine the test fails,
//! it does not skip.
//!
//! What is shown: nodes register and one becomes the controller; every
//! node (and librdkafka, bootstrapping from any one) sees the same cluster;
//! a node killed with -9 leaves when its lease lapses and the controller
//! moves; a restarted node registers again; a node paused past its session
//! is expired and registers again when woken; a node stopped cleanly leaves;
//! a second process with a live node's id, and a node whose etcd cannot be
//! reached, refuse to start.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use kafka_protocol::messages::{DescribeClusterRequest, DescribeClusterResponse};
use rdkafka::consumer::{BaseConsumer, Consumer};

use crate::common::{self, ChildBroker};

/// The etcd server binary: Debian's `etcd-server` package.
fn etcd_binary() -> PathBuf {
    let found = ["/usr/bin/etcd", "/usr/local/bin/etcd"].into_iter().map(PathBuf::from).find(|p| p.exists());
    found.expect("etcd is not installed: cluster tests need Debian's etcd-server (apt-get install etcd-server; .ci/run installs it)")
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
    let dir = root.join(format!("node{id}"));
    std::fs::create_dir_all(&dir).unwrap();
    let args = node_args(id, etcd, 3000);
    ChildBroker::spawn(&dir, &args.iter().map(String::as_str).collect::<Vec<_>>())
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
        let seen = wait_until(node.as_ref().unwrap().kafka, "the same view", |s| s.0 == all).await;
        assert_eq!((seen.1, &seen.2), (first.1, &first.2), "node {id} sees another controller or cluster");
    }
    assert_eq!(first.2.len(), 32, "a generated cluster id: {}", first.2);

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

    // A node paused past its session (SIGSTOP) is expired; woken, it finds
    // its lease gone, registers again and is back.
    let paused = (1..=3).map(|id| id as i32).find(|id| *id != after.1 && *id != old).unwrap();
    let pid = nodes[paused as usize].as_ref().unwrap().child.id().to_string();
    assert!(Command::new("kill").args(["-STOP", &pid]).status().unwrap().success());
    let seen = wait_until(survivor_of(&nodes, paused), "the paused node expired", |s| s.0.len() == 2 && !s.0.iter().any(|(id, _)| *id == paused)).await;
    assert_eq!(seen.1, after.1, "the controller did not change");
    assert!(Command::new("kill").args(["-CONT", &pid]).status().unwrap().success());
    wait_until(survivor_of(&nodes, paused), "the paused node back", |s| s.0.len() == 3).await;

    // A second process with a live node's id waits out a lease, then
    // refuses to start, naming the reason.
    let live = after.1;
    let dup = root.path().join("duplicate");
    std::fs::create_dir_all(&dup).unwrap();
    let out = refused_start(&dup, &node_args(live, &etcd, 2000));
    assert!(out.contains("is registered by a live node"), "{out}");

    // A clean stop leaves the cluster (the lease is revoked, not left to lapse).
    let quiet = (1..=3).map(|id| id as i32).find(|id| *id != live).unwrap();
    let status = nodes[quiet as usize].take().unwrap().terminate();
    assert!(status.success(), "{status:?}");
    let controller_addr = nodes[live as usize].as_ref().unwrap().kafka;
    let seen = wait_until(controller_addr, "the stopped node gone", |s| s.0.len() == 2 && !s.0.iter().any(|(id, _)| *id == quiet)).await;
    assert_eq!(seen.1, live, "the controller did not change");
}

/// The Kafka address of a running node other than `not`.
fn survivor_of(nodes: &[Option<ChildBroker>], not: i32) -> SocketAddr {
    nodes.iter().enumerate().find(|(id, n)| *id as i32 != not && n.is_some()).and_then(|(_, n)| n.as_ref()).unwrap().kafka
}

/// Starts a node expected to fail; returns its stderr.
fn refused_start(dir: &Path, extra: &[String]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_canopy"))
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
fn a_node_whose_etcd_cannot_be_reached_refuses_to_start() {
    let dir = tempfile::tempdir().unwrap();
    let nobody = format!("http://127.0.0.1:{}", free_port());
    let out = refused_start(dir.path(), &["--node-id", "1", "--etcd-endpoints", &nobody].map(String::from));
    assert!(out.contains("etcd"), "{out}");
}
