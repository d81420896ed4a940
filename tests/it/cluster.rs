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
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
use kafka_protocol::messages::metadata_request::MetadataRequestTopic;
use kafka_protocol::messages::{DescribeClusterRequest, DescribeClusterResponse, FindCoordinatorRequest, FindCoordinatorResponse, InitProducerIdRequest, InitProducerIdResponse, MetadataRequest, MetadataResponse, ProduceRequest, ProduceResponse, TopicName};
use kafka_protocol::protocol::StrBytes;
use rdkafka::consumer::{BaseConsumer, Consumer};

use crate::common::{self, ChildBroker};
mod acls;
mod clients;
mod groups;
mod inter_broker;
mod leaders;
mod nemesis;
mod reassign;
mod transactions;

use crate::cluster_support::{canopy_binary, free_port, node_args, spawn_node, spawn_node_with, Etcd};


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
    poll(addr, what, seen_from, done).await
}

/// Asks `addr` (with `ask`) every 100 ms until the answer satisfies
/// `done`; fails after 60 s.
async fn poll<T: std::fmt::Debug, F: std::future::Future<Output = T>>(addr: SocketAddr, what: &str, ask: impl Fn(SocketAddr) -> F, done: impl Fn(&T) -> bool) -> T {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let seen = ask(addr).await;
        if done(&seen) {
            return seen;
        }
        assert!(Instant::now() < deadline, "{what}: {addr} still says {seen:?} after 60 s");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Waits until `addr` serves `partitions` of `topic` as their leader: a
/// node whose view names it leader begins its leader epoch first (a
/// moment later), answering NOT_LEADER_OR_FOLLOWER meanwhile, which
/// clients retry.
async fn wait_leading(addr: SocketAddr, topic: &str, partitions: &[i32]) {
    use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
    use kafka_protocol::messages::{FetchRequest, FetchResponse};
    let req = FetchRequest::default().with_max_wait_ms(0).with_max_bytes(1024).with_session_epoch(-1).with_topics(vec![FetchTopic::default()
        .with_topic(TopicName(StrBytes::from_string(topic.to_owned())))
        .with_partitions(partitions.iter().map(|p| FetchPartition::default().with_partition(*p).with_partition_max_bytes(1024)).collect())]);
    let ask = |a: SocketAddr| {
        let req = req.clone();
        async move {
            let mut sock = tokio::net::TcpStream::connect(a).await.unwrap();
            let r: FetchResponse = common::call(&mut sock, 1, 12, 1, &req).await;
            r.responses.iter().flat_map(|t| t.partitions.iter().map(|p| p.error_code)).collect::<Vec<i16>>()
        }
    };
    poll(addr, "leading", ask, |codes: &Vec<i16>| codes.len() == partitions.len() && codes.iter().all(|c| *c == 0)).await;
}

/// Three nodes (ids 1 to 3; index 0 is empty), registered.
async fn three_nodes(root: &Path, etcd: &Etcd) -> Vec<Option<ChildBroker>> {
    let mut nodes: Vec<Option<ChildBroker>> = vec![None];
    for id in 1..=3 {
        nodes.push(Some(spawn_node(root, id, etcd)));
    }
    wait_until(nodes[1].as_ref().unwrap().kafka, "three nodes", |s| s.0.len() == 3 && s.1 > 0).await;
    nodes
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
    // The first unit goes to the lowest node id (loads all equal): node 1
    // leads the partition, and knows it once CreateTopics is answered.
    assert_eq!(layout(b, "ids").await.map(|l| l.1), Some(vec![(1, 0, 0)]), "node 1 leads ids-0");
    wait_leading(b, "ids", &[0]).await;
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
/// OffsetForLeaderEpoch v4 as a consumer asks it, for partition 0 of
/// `topic` in leader epoch `current`: (epoch, end offset) for each of
/// `epochs`.
async fn epoch_ends(leader: SocketAddr, topic: &str, current: i32, epochs: &[i32]) -> Vec<(i32, i64)> {
    use kafka_protocol::messages::offset_for_leader_epoch_request::{OffsetForLeaderPartition, OffsetForLeaderTopic};
    use kafka_protocol::messages::{BrokerId, OffsetForLeaderEpochRequest, OffsetForLeaderEpochResponse};
    use kafka_protocol::protocol::Decodable;
    let mut raw = common::Raw::connect(leader).await;
    let mut ends = Vec::new();
    for &e in epochs {
        let p = OffsetForLeaderPartition::default().with_partition(0).with_current_leader_epoch(current).with_leader_epoch(e);
        let req = OffsetForLeaderEpochRequest::default().with_replica_id(BrokerId(-1)).with_topics(vec![OffsetForLeaderTopic::default().with_topic(TopicName(StrBytes::from_string(topic.to_owned()))).with_partitions(vec![p])]);
        let mut body = raw.call(23, 4, &common::encode(&req, 4), true).await.expect("an answer");
        let r = OffsetForLeaderEpochResponse::decode(&mut body, 4).unwrap();
        let p = &r.topics[0].partitions[0];
        assert_eq!(p.error_code, 0, "{p:?}");
        ends.push((p.leader_epoch, p.end_offset));
    }
    ends
}

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

/// (topic id, per partition (leader, leader epoch, error code)) as `addr`
/// describes `topic` (Metadata v12); `None` while it does not know it.
async fn layout(addr: SocketAddr, topic: &str) -> Option<(uuid::Uuid, Vec<(i32, i32, i16)>)> {
    let mut sock = tokio::net::TcpStream::connect(addr).await.unwrap();
    let req = MetadataRequest::default().with_topics(Some(vec![MetadataRequestTopic::default().with_name(Some(TopicName(StrBytes::from_string(topic.to_owned()))))])).with_allow_auto_topic_creation(false);
    let r: MetadataResponse = common::call(&mut sock, 3, 12, 3, &req).await;
    let t = &r.topics[0];
    if t.error_code == 3 {
        return None;
    }
    assert_eq!(t.error_code, 0, "{t:?}");
    let mut parts: Vec<(i32, (i32, i32, i16))> = t.partitions.iter().map(|p| (p.partition_index, (p.leader_id.0, p.leader_epoch, p.error_code))).collect();
    parts.sort();
    Some((t.topic_id, parts.into_iter().map(|(_, l)| l).collect()))
}

/// Polls `addr` until its layout of `topic` satisfies `done`.
async fn wait_layout(addr: SocketAddr, topic: &str, what: &str, done: impl Fn(&Option<(uuid::Uuid, Vec<(i32, i32, i16)>)>) -> bool) -> Option<(uuid::Uuid, Vec<(i32, i32, i16)>)> {
    poll(addr, what, |a| layout(a, topic), done).await
}

/// Every record of `topic` (partitions 0..n) read from the start through
/// a librdkafka consumer bootstrapping from `addr`, until `count` are in:
/// per partition, the values in offset order.
async fn read_all(addr: SocketAddr, topic: &'static str, partitions: i32, count: usize) -> Vec<Vec<String>> {
    tokio::task::spawn_blocking(move || {
        use rdkafka::Message;
        let c: BaseConsumer = common::client(addr).set("group.id", "reader").set("enable.auto.commit", "false").create().unwrap();
        let mut tpl = rdkafka::TopicPartitionList::new();
        for p in 0..partitions {
            tpl.add_partition_offset(topic, p, rdkafka::Offset::Beginning).unwrap();
        }
        c.assign(&tpl).unwrap();
        let mut out = vec![Vec::new(); partitions as usize];
        let deadline = Instant::now() + Duration::from_secs(60);
        while out.iter().map(Vec::len).sum::<usize>() < count {
            assert!(Instant::now() < deadline, "read {} of {count} records in 60 s", out.iter().map(Vec::len).sum::<usize>());
            if let Some(Ok(m)) = c.poll(Duration::from_millis(200)) {
                out[m.partition() as usize].push(String::from_utf8(m.payload().unwrap().to_vec()).unwrap());
            }
        }
        out
    })
    .await
    .unwrap()
}

/// Topics live in etcd (step 2 of docs/cluster.md, replication factor 1):
/// a topic created through one node is followed by every node with the
/// same id; its partitions' units are spread over the nodes; librdkafka,
/// bootstrapping from one node, produces to every leader and reads it all
/// back through another; a node that does not lead a partition answers
/// NOT_LEADER_OR_FOLLOWER naming the leader (KIP-951); a leader killed
/// with -9 leaves its partitions without a leader (no other copy) while
/// the rest go on, and leads them again in a new epoch, with their
/// records, when it returns; auto-created topics and config changes are
/// the cluster's; a subtree stream is served by the node that
/// leads all it covers; every node names the same coordinator for a
/// group, whose commits any node's clients read; a deletion through any
/// node reaches all; a cluster node's data directory refuses single-node
/// mode.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs etcd and a canopy built with --features cluster: see the module docs"]
async fn topics_spread_over_the_nodes_and_clients_follow_their_leaders() {
    let root = tempfile::tempdir().unwrap();
    let etcd = Etcd::start(root.path());
    let mut nodes = three_nodes(root.path(), &etcd).await;
    let addr = |nodes: &[Option<ChildBroker>], id: i32| nodes[id as usize].as_ref().unwrap().kafka;

    // Created through node 2; recorded in etcd; every node follows it, with
    // one id and one layout, two partitions led by each node.
    common::create_topic(addr(&nodes, 2), "spread", 6).await;
    assert!(etcd.get("/canopy/it/topics/spread").contains("\"partitions\":6"), "{}", etcd.get("/canopy/it/topics/spread"));
    let led = |l: &Option<(uuid::Uuid, Vec<(i32, i32, i16)>)>| l.as_ref().is_some_and(|(_, ps)| ps.len() == 6 && ps.iter().all(|(leader, epoch, e)| *leader > 0 && *epoch == 0 && *e == 0));
    let first = wait_layout(addr(&nodes, 1), "spread", "created", led).await.unwrap();
    for id in 2..=3 {
        assert_eq!(wait_layout(addr(&nodes, id), "spread", "created", led).await.unwrap(), first, "node {id} sees another id or layout");
    }
    let leader_of: Vec<i32> = first.1.iter().map(|(l, _, _)| *l).collect();
    for id in 1..=3 {
        assert_eq!(leader_of.iter().filter(|l| **l == id).count(), 2, "leaders {leader_of:?}");
    }

    // librdkafka produces to every partition bootstrapping from node 1,
    // and reads it all back bootstrapping from node 3.
    produce_acked(addr(&nodes, 1), "spread", "v", 600, 6).await;
    let expected: Vec<Vec<String>> = (0..6).map(|p| (0..600).filter(|i| i % 6 == p).map(|i| format!("v{i}")).collect()).collect();
    assert_eq!(read_all(addr(&nodes, 3), "spread", 6, 600).await, expected, "every record, once, in order, per partition");

    // A topic auto-created by a produce through node 3 is the cluster's;
    // a config changed through node 1 is what node 2 describes.
    let via3 = addr(&nodes, 3);
    tokio::task::spawn_blocking(move || {
        use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer, ThreadedProducer};
        let p: ThreadedProducer<DefaultProducerContext> = common::client(via3).set("acks", "all").create().unwrap();
        p.send(BaseRecord::<str, str>::to("auto.made").payload("first")).map_err(|(e, _)| e).unwrap();
        p.flush(Duration::from_secs(30)).unwrap();
        assert_eq!(p.in_flight_count(), 0, "delivered");
    })
    .await
    .unwrap();
    assert!(etcd.get("/canopy/it/topics/auto.made").contains("\"partitions\""), "auto-created in the cluster");
    {
        use rdkafka::admin::{AdminClient, AdminOptions, AlterConfig, ResourceSpecifier};
        let admin: AdminClient<rdkafka::client::DefaultClientContext> = common::client(addr(&nodes, 1)).create().unwrap();
        let r = admin.alter_configs(&[AlterConfig::new(ResourceSpecifier::Topic("spread")).set("retention.ms", "12345678")], &AdminOptions::new()).await.unwrap();
        r[0].as_ref().expect("altered");
        let admin: AdminClient<rdkafka::client::DefaultClientContext> = common::client(addr(&nodes, 2)).create().unwrap();
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let d = admin.describe_configs(&[ResourceSpecifier::Topic("spread")], &AdminOptions::new()).await.unwrap();
            let value = d[0].as_ref().unwrap().get("retention.ms").and_then(|e| e.value.clone());
            if value.as_deref() == Some("12345678") {
                break;
            }
            assert!(Instant::now() < deadline, "node 2 still describes retention.ms {value:?}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    // Consumer groups: every node names the same coordinator for a group
    // (its shard's leader; the shards are created at the first lookup), a
    // group member bootstrapping from node 2 reads everything and commits,
    // and the commits are read back through node 3.
    let mut coordinator = None;
    for id in 1..=3 {
        let deadline = Instant::now() + Duration::from_secs(60);
        let found = loop {
            let mut sock = tokio::net::TcpStream::connect(addr(&nodes, id)).await.unwrap();
            let r: FindCoordinatorResponse = common::call(&mut sock, 10, 3, 6, &FindCoordinatorRequest::default().with_key(StrBytes::from_static_str("readers"))).await;
            if r.error_code == 0 {
                break (r.node_id.0, r.port);
            }
            assert_eq!(r.error_code, 15, "COORDINATOR_NOT_AVAILABLE until the shards exist");
            assert!(Instant::now() < deadline, "no coordinator from node {id} in 60 s");
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        assert_eq!(found.1, addr(&nodes, found.0).port() as i32);
        assert_eq!(*coordinator.get_or_insert(found), found, "node {id} names another coordinator");
    }
    let member = addr(&nodes, 2);
    let consumed = tokio::task::spawn_blocking(move || {
        use rdkafka::consumer::CommitMode;
        let c: BaseConsumer = common::client(member).set("group.id", "readers").set("enable.auto.commit", "false").set("auto.offset.reset", "earliest").create().unwrap();
        c.subscribe(&["spread"]).unwrap();
        let mut n = 0;
        let deadline = Instant::now() + Duration::from_secs(60);
        while n < 600 {
            assert!(Instant::now() < deadline, "the group read {n} of 600 records in 60 s");
            if let Some(m) = c.poll(Duration::from_millis(200)) {
                m.unwrap();
                n += 1;
            }
        }
        c.commit_consumer_state(CommitMode::Sync).unwrap();
        n
    })
    .await
    .unwrap();
    assert_eq!(consumed, 600);
    let other = addr(&nodes, 3);
    let committed = tokio::task::spawn_blocking(move || {
        let c: BaseConsumer = common::client(other).set("group.id", "readers").create().unwrap();
        let mut tpl = rdkafka::TopicPartitionList::new();
        for p in 0..6 {
            tpl.add_partition("spread", p);
        }
        let got = c.committed_offsets(tpl, Duration::from_secs(30)).unwrap();
        got.elements().iter().map(|e| e.offset()).collect::<Vec<_>>()
    })
    .await
    .unwrap();
    assert_eq!(committed, vec![rdkafka::Offset::Offset(100); 6], "the group's commits, read through another node");

    // Elsewhere, the group's requests are NOT_COORDINATOR (the client looks
    // its coordinator up again): a commit there would be lost to it.
    let (coord, _) = coordinator.unwrap();
    let stranger = (1..=3).find(|id| *id != coord).unwrap();
    {
        use kafka_protocol::messages::offset_commit_request::{OffsetCommitRequestPartition, OffsetCommitRequestTopic};
        use kafka_protocol::messages::{GroupId, OffsetCommitRequest, OffsetCommitResponse};
        let mut sock = tokio::net::TcpStream::connect(addr(&nodes, stranger)).await.unwrap();
        let req = OffsetCommitRequest::default().with_group_id(GroupId(StrBytes::from_static_str("readers"))).with_generation_id_or_member_epoch(-1).with_topics(vec![OffsetCommitRequestTopic::default()
            .with_name(TopicName(StrBytes::from_static_str("spread")))
            .with_partitions(vec![OffsetCommitRequestPartition::default().with_partition_index(0).with_committed_offset(7)])]);
        let r: OffsetCommitResponse = common::call(&mut sock, 8, 8, 7, &req).await;
        assert_eq!(r.topics[0].partitions[0].error_code, 16, "NOT_COORDINATOR");
    }

    // Transactions: a transactional id's coordinator is its shard's leader;
    // there, a partition it leads joins the transaction, and so does one
    // another node leads (its markers go there by WriteTxnMarkers: see
    // `cluster::transactions`).
    {
        use kafka_protocol::messages::add_partitions_to_txn_request::AddPartitionsToTxnTopic;
        use kafka_protocol::messages::{AddPartitionsToTxnRequest, AddPartitionsToTxnResponse, ProducerId, TransactionalId};
        let mut txn_coordinator = None;
        for attempt in 0.. {
            let mut sock = tokio::net::TcpStream::connect(addr(&nodes, 1)).await.unwrap();
            let r: FindCoordinatorResponse = common::call(&mut sock, 10, 3, 8, &FindCoordinatorRequest::default().with_key(StrBytes::from_static_str("tx-1")).with_key_type(1)).await;
            if r.error_code == 0 {
                txn_coordinator = Some(r.node_id.0);
                break;
            }
            assert!(attempt < 600, "no transaction coordinator");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let tc = txn_coordinator.unwrap();
        let mut sock = tokio::net::TcpStream::connect(addr(&nodes, tc)).await.unwrap();
        // COORDINATOR_LOAD_IN_PROGRESS while the coordinator loads its
        // shard's log (NOT_COORDINATOR while leadership settles).
        let deadline = Instant::now() + Duration::from_secs(30);
        let init = loop {
            let init: InitProducerIdResponse = common::call(&mut sock, 22, 4, 9, &InitProducerIdRequest::default().with_transactional_id(Some(TransactionalId(StrBytes::from_static_str("tx-1")))).with_transaction_timeout_ms(60_000)).await;
            if ![14, 16].contains(&init.error_code) || Instant::now() > deadline {
                break init;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        assert_eq!(init.error_code, 0);
        let here = leader_of.iter().position(|l| *l == tc).unwrap() as i32;
        let there = leader_of.iter().position(|l| *l != tc).unwrap() as i32;
        let add = |p: i32| AddPartitionsToTxnRequest::default()
            .with_v3_and_below_transactional_id(TransactionalId(StrBytes::from_static_str("tx-1")))
            .with_v3_and_below_producer_id(ProducerId(init.producer_id.0))
            .with_v3_and_below_producer_epoch(init.producer_epoch)
            .with_v3_and_below_topics(vec![AddPartitionsToTxnTopic::default().with_name(TopicName(StrBytes::from_static_str("spread"))).with_partitions(vec![p])]);
        let r: AddPartitionsToTxnResponse = common::call(&mut sock, 24, 3, 10, &add(there)).await;
        assert_eq!(r.results_by_topic_v3_and_below[0].results_by_partition[0].partition_error_code, 0, "a partition led elsewhere joins");
        let r: AddPartitionsToTxnResponse = common::call(&mut sock, 24, 3, 11, &add(here)).await;
        assert_eq!(r.results_by_topic_v3_and_below[0].results_by_partition[0].partition_error_code, 0, "a partition led by the coordinator joins");
        let other = (1..=3).find(|id| *id != tc).unwrap();
        let mut sock = tokio::net::TcpStream::connect(addr(&nodes, other)).await.unwrap();
        let init: InitProducerIdResponse = common::call(&mut sock, 22, 4, 12, &InitProducerIdRequest::default().with_transactional_id(Some(TransactionalId(StrBytes::from_static_str("tx-1")))).with_transaction_timeout_ms(60_000)).await;
        assert_eq!(init.error_code, 16, "NOT_COORDINATOR elsewhere");
    }

    // A subtree stream is served by the node leading every unit it covers:
    // a branch's topics share its units, so `app.s.__all` has one server,
    // which every node names and librdkafka follows; `app.__all` spans two
    // branches led by two nodes, so no node holds it all.
    common::create_topics(addr(&nodes, 1), &[("app.s.a", 1), ("app.s.b", 1)]).await;
    common::create_topic(addr(&nodes, 1), "app.t.a", 1).await;
    let leader_at = |l: Option<(uuid::Uuid, Vec<(i32, i32, i16)>)>| l.expect("known").1[0].0;
    let s_leader = leader_at(layout(addr(&nodes, 1), "app.s.a").await);
    assert_eq!(leader_at(layout(addr(&nodes, 1), "app.s.b").await), s_leader, "one branch, one unit");
    assert_ne!(leader_at(layout(addr(&nodes, 1), "app.t.a").await), s_leader, "placement spreads the two branches (precondition)");
    for t in ["app.s.a", "app.s.b"] {
        wait_layout(addr(&nodes, s_leader), t, "followed", Option::is_some).await;
        wait_leading(addr(&nodes, s_leader), t, &[0]).await;
    }
    for (t, v) in [("app.s.a", b"sa".as_slice()), ("app.s.b", b"sb".as_slice())] {
        assert_eq!(produce(addr(&nodes, s_leader), t, common::producer_batch(-1, -1, -1, &[v])).await, 0);
    }
    let elsewhere = (1..=3).find(|id| *id != s_leader).unwrap();
    for id in 1..=3 {
        assert_eq!(leader_at(layout(addr(&nodes, id), "app.s.__all").await), s_leader, "node {id} names the stream's server");
        assert_eq!(layout(addr(&nodes, id), "app.__all").await, None, "no node holds both branches");
    }
    let stream = read_all(addr(&nodes, elsewhere), "app.s.__all", 1, 2).await;
    assert_eq!(stream, vec![vec!["sa".to_owned(), "sb".to_owned()]], "the stream, in arrival order, through its server");

    // Asked of a node that does not lead it, a partition is refused with
    // the leader's id, epoch and address (Produce v10+, KIP-951).
    let (p, leader) = (0, leader_of[0]);
    let other = (1..=3).find(|id| *id != leader).unwrap();
    let mut sock = tokio::net::TcpStream::connect(addr(&nodes, other)).await.unwrap();
    let req = ProduceRequest::default().with_acks(-1).with_timeout_ms(10_000).with_topic_data(vec![TopicProduceData::default()
        .with_name(TopicName(StrBytes::from_static_str("spread")))
        .with_partition_data(vec![PartitionProduceData::default().with_index(p).with_records(Some(common::producer_batch(-1, -1, -1, &[b"misplaced"])))])]);
    let r: ProduceResponse = common::call(&mut sock, 0, 11, 4, &req).await;
    let pr = &r.responses[0].partition_responses[0];
    assert_eq!((pr.error_code, pr.current_leader.leader_id.0, pr.current_leader.leader_epoch), (6, leader, 0), "{pr:?}");
    let hint: Vec<(i32, i32)> = r.node_endpoints.iter().map(|n| (n.node_id.0, n.port)).collect();
    assert_eq!(hint, vec![(leader, addr(&nodes, leader).port() as i32)]);
    // The REST bridge of a node spreads keyless records over the
    // partitions it leads.
    {
        common::create_topic(addr(&nodes, 1), "via.rest", 6).await;
        let led: Vec<i32> = layout(addr(&nodes, 1), "via.rest").await.unwrap().1.iter().map(|(l, _, _)| *l).collect();
        let node = led[0];
        // The node has followed the topic (it was created through node 1).
        wait_layout(addr(&nodes, node), "via.rest", "followed", Option::is_some).await;
        let its: Vec<i32> = (0..6).filter(|p| led[*p as usize] == node).collect();
        wait_leading(addr(&nodes, node), "via.rest", &its).await;
        let rest = nodes[node as usize].as_ref().unwrap().rest;
        let http = reqwest::Client::new();
        let post = |path: String, n: usize| {
            let records: Vec<serde_json::Value> = (0..n).map(|i| serde_json::json!({"value": {"n": i}})).collect();
            http.post(format!("http://{rest}{path}")).header("content-type", "application/vnd.kafka.json.v2+json").body(serde_json::json!({"records": records}).to_string()).send()
        };
        let json = |b: bytes::Bytes| serde_json::from_slice::<serde_json::Value>(&b).unwrap();
        let r = json(post("/topics/via.rest".into(), 1000).await.unwrap().bytes().await.unwrap());
        let mine: BTreeSet<i64> = led.iter().enumerate().filter(|(_, l)| **l == node).map(|(p, _)| p as i64).collect();
        let used: BTreeSet<i64> = r["offsets"]
            .as_array()
            .unwrap()
            .iter()
            .map(|o| {
                assert!(o["error_code"].is_null(), "{o}");
                o["partition"].as_i64().unwrap()
            })
            .collect();
        assert_eq!(used, mine, "keyless records go to the partitions node {node} leads");
        // Records for a partition another node leads go to that node (a
        // Produce over the inter-broker listener), with the offsets they
        // got there; so do keyed records, wherever their keys put them.
        let q = led.iter().position(|l| *l != node).expect("six partitions are not all led by one of three nodes");
        // Every leader has taken its partitions over (until then a
        // forwarded record is refused, retriably, as a client's would be).
        for other in (1..=3).filter(|id| *id != node) {
            let theirs: Vec<i32> = (0..6).filter(|p| led[*p as usize] == other).collect();
            wait_leading(addr(&nodes, other), "via.rest", &theirs).await;
        }
        let placed = |r: &serde_json::Value| -> Vec<(usize, usize)> {
            r["offsets"].as_array().unwrap().iter().map(|o| {
                assert!(o["error_code"].is_null(), "{o}");
                (o["partition"].as_u64().unwrap() as usize, o["offset"].as_u64().unwrap() as usize)
            }).collect()
        };
        let r = json(post(format!("/topics/via.rest/partitions/{q}"), 3).await.unwrap().bytes().await.unwrap());
        assert_eq!(placed(&r), vec![(q, 0), (q, 1), (q, 2)], "{r}");
        let keyed: Vec<serde_json::Value> = (0..30).map(|i| serde_json::json!({"key": format!("k{i}"), "value": {"k": i}})).collect();
        let r = http.post(format!("http://{rest}/topics/via.rest")).header("content-type", "application/vnd.kafka.json.v2+json").body(serde_json::json!({"records": keyed}).to_string()).send().await.unwrap();
        let keyed_at = placed(&json(r.bytes().await.unwrap()));
        assert!(keyed_at.iter().any(|(p, _)| led[*p] != node), "some keys land on other nodes' partitions: {keyed_at:?}");
        let logs = read_all(addr(&nodes, 1), "via.rest", 6, 1000 + 3 + 30).await;
        for (i, want) in (0..3).enumerate() {
            assert_eq!(logs[q][i], serde_json::json!({"n": want}).to_string());
        }
        for (i, (p, o)) in keyed_at.iter().enumerate() {
            assert_eq!(logs[*p][*o], serde_json::json!({"k": i}).to_string(), "keyed record {i} at partition {p} offset {o}");
        }
        // The forwarder's metrics at the posting node: the produces the
        // leaders answered (one per leader for the keyed post, one for
        // partition q), none failed, links open.
        let admin = nodes[node as usize].as_ref().unwrap().admin;
        let scrape = reqwest::get(format!("http://{admin}/metrics")).await.unwrap().text().await.unwrap();
        let line = |series: &str| scrape.lines().find_map(|l| l.strip_prefix(series).and_then(|v| v.strip_prefix(' ')).map(|v| v.parse::<f64>().unwrap())).unwrap_or_else(|| panic!("no {series} in:\n{scrape}"));
        let leaders_keyed: BTreeSet<i32> = keyed_at.iter().map(|(p, _)| led[*p]).filter(|l| *l != node).collect();
        assert_eq!(line("canopy_rest_forwarded_requests_total{outcome=\"answered\"}"), 1.0 + leaders_keyed.len() as f64);
        assert_eq!(line("canopy_rest_forwarded_requests_total{outcome=\"failed\"}"), 0.0);
        assert!(line("canopy_rest_forwarded_bytes_total") > 0.0);
        assert!(line("canopy_rest_forward_links") >= 1.0);
    }
    // The same for Fetch (v16: by topic id, with the hints).
    {
        use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
        use kafka_protocol::messages::{FetchRequest, FetchResponse};
        let req = FetchRequest::default().with_max_wait_ms(0).with_max_bytes(1 << 20).with_session_epoch(-1).with_topics(vec![FetchTopic::default()
            .with_topic_id(first.0)
            .with_partitions(vec![FetchPartition::default().with_partition(p).with_fetch_offset(0).with_partition_max_bytes(1 << 20).with_current_leader_epoch(-1)])]);
        let r: FetchResponse = common::call(&mut sock, 1, 16, 5, &req).await;
        let part = &r.responses[0].partitions[0];
        assert_eq!((part.error_code, part.current_leader.leader_id.0, part.current_leader.leader_epoch), (6, leader, 0), "{part:?}");
        let hint: Vec<(i32, i32)> = r.node_endpoints.iter().map(|n| (n.node_id.0, n.port)).collect();
        assert_eq!(hint, vec![(leader, addr(&nodes, leader).port() as i32)]);
        // At the leader, an epoch the client should not know yet is
        // UNKNOWN_LEADER_EPOCH (KIP-320).
        let mut at_leader = tokio::net::TcpStream::connect(addr(&nodes, leader)).await.unwrap();
        let mut ahead = req.clone();
        ahead.topics[0].partitions[0].current_leader_epoch = 3;
        let r: FetchResponse = common::call(&mut at_leader, 1, 16, 6, &ahead).await;
        assert_eq!(r.responses[0].partitions[0].error_code, 75, "UNKNOWN_LEADER_EPOCH");
    }

    // kill -9 of a leader: with one copy, its partitions have no leader
    // (LEADER_NOT_AVAILABLE, epoch moved); the others go on.
    let victim = leader_of[5];
    let witness = (1..=3).find(|id| *id != victim).unwrap();
    nodes[victim as usize].take().unwrap().kill9();
    let orphaned = |l: &Option<(uuid::Uuid, Vec<(i32, i32, i16)>)>| {
        l.as_ref().is_some_and(|(_, ps)| ps.iter().zip(&leader_of).all(|((leader, epoch, e), was)| if *was == victim { (*leader, *epoch, *e) == (-1, 1, 5) } else { (*leader, *epoch, *e) == (*was, 0, 0) }))
    };
    wait_layout(addr(&nodes, witness), "spread", "the killed leader's partitions orphaned", orphaned).await;
    let alive = leader_of.iter().position(|l| *l == witness).unwrap() as i32;
    let mut sock = tokio::net::TcpStream::connect(addr(&nodes, witness)).await.unwrap();
    let req = ProduceRequest::default().with_acks(-1).with_timeout_ms(10_000).with_topic_data(vec![TopicProduceData::default()
        .with_name(TopicName(StrBytes::from_static_str("spread")))
        .with_partition_data(vec![PartitionProduceData::default().with_index(alive).with_records(Some(common::producer_batch(-1, -1, -1, &[b"meanwhile"])))])]);
    let r: ProduceResponse = common::call(&mut sock, 0, 11, 5, &req).await;
    assert_eq!(r.responses[0].partition_responses[0].error_code, 0, "a partition led by a live node goes on");

    // Back, the node leads its partitions again in a new epoch, with
    // every record it had.
    nodes[victim as usize] = Some(spawn_node(root.path(), victim, &etcd));
    let back = |l: &Option<(uuid::Uuid, Vec<(i32, i32, i16)>)>| {
        l.as_ref().is_some_and(|(_, ps)| ps.iter().zip(&leader_of).all(|((leader, epoch, e), was)| *leader == *was && *e == 0 && *epoch == if *was == victim { 2 } else { 0 }))
    };
    wait_layout(addr(&nodes, witness), "spread", "the leader back", back).await;
    // A client still naming the epoch before the restart is told it is
    // fenced (KIP-320), and one naming the new epoch is served.
    {
        use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
        use kafka_protocol::messages::{FetchRequest, FetchResponse};
        let mine = leader_of.iter().position(|l| *l == victim).unwrap() as i32;
        let fetch = |epoch: i32| FetchRequest::default().with_max_wait_ms(0).with_max_bytes(1 << 20).with_session_epoch(-1).with_topics(vec![FetchTopic::default()
            .with_topic_id(first.0)
            .with_partitions(vec![FetchPartition::default().with_partition(mine).with_fetch_offset(0).with_partition_max_bytes(1 << 20).with_current_leader_epoch(epoch)])]);
        let mut sock = tokio::net::TcpStream::connect(addr(&nodes, victim)).await.unwrap();
        // Leading once it has begun the epoch (NOT_LEADER_OR_FOLLOWER, its
        // own id named, until then).
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let r: FetchResponse = common::call(&mut sock, 1, 16, 21, &fetch(2)).await;
            match r.responses[0].partitions[0].error_code {
                0 => break,
                6 if Instant::now() < deadline => tokio::time::sleep(Duration::from_millis(50)).await,
                code => panic!("a fetch in the new epoch answered {code}"),
            }
        }
        let r: FetchResponse = common::call(&mut sock, 1, 16, 20, &fetch(0)).await;
        assert_eq!(r.responses[0].partitions[0].error_code, 74, "FENCED_LEADER_EPOCH");
    }
    let mut again = expected.clone();
    again[alive as usize].push("meanwhile".into());
    assert_eq!(read_all(addr(&nodes, victim), "spread", 6, 601).await, again);

    // Deleted through node 3: gone from etcd and from every node.
    {
        use rdkafka::admin::{AdminClient, AdminOptions};
        let admin: AdminClient<rdkafka::client::DefaultClientContext> = common::client(addr(&nodes, 3)).create().unwrap();
        for r in admin.delete_topics(&["spread"], &AdminOptions::new()).await.unwrap() {
            r.expect("deleted");
        }
    }
    assert_eq!(etcd.get("/canopy/it/topics/spread"), "");
    for id in 1..=3 {
        wait_layout(addr(&nodes, id), "spread", "deleted", Option::is_none).await;
    }

    // A cluster node's data directory is its cluster's: single-node mode
    // refuses it.
    nodes[1].take().unwrap().kill9();
    let out = refused_start(&root.path().join("node1"), &[]);
    assert!(out.contains("belongs to cluster"), "{out}");
}

/// Per partition of `topic`, (leader, leader epoch, ISR sorted) as `addr`
/// describes it (Metadata v12); empty while it does not know the topic.
async fn isrs(addr: SocketAddr, topic: &str) -> Vec<(i32, i32, Vec<i32>)> {
    let mut sock = tokio::net::TcpStream::connect(addr).await.unwrap();
    let req = MetadataRequest::default().with_topics(Some(vec![MetadataRequestTopic::default().with_name(Some(TopicName(StrBytes::from_string(topic.to_owned()))))])).with_allow_auto_topic_creation(false);
    let r: MetadataResponse = common::call(&mut sock, 3, 12, 3, &req).await;
    let mut parts: Vec<(i32, (i32, i32, Vec<i32>))> = r.topics[0]
        .partitions
        .iter()
        .map(|p| {
            let mut isr: Vec<i32> = p.isr_nodes.iter().map(|n| n.0).collect();
            isr.sort();
            (p.partition_index, (p.leader_id.0, p.leader_epoch, isr))
        })
        .collect();
    parts.sort();
    parts.into_iter().map(|(_, p)| p).collect()
}

/// Polls `addr` until its ISRs of `topic` satisfy `done`.
async fn wait_isrs(addr: SocketAddr, topic: &str, what: &str, done: impl Fn(&[(i32, i32, Vec<i32>)]) -> bool) -> Vec<(i32, i32, Vec<i32>)> {
    poll(addr, what, |a| isrs(a, topic), |v: &Vec<_>| done(v)).await
}

/// Creates `topic` through `addr` with `partitions`, replication factor 3
/// and min.insync.replicas 2 (librdkafka's admin client), and waits until
/// every partition has a leader and all three nodes in its ISR; returns
/// (leader, epoch, ISR) per partition.
async fn create_replicated(addr: SocketAddr, topic: &str, partitions: i32) -> Vec<(i32, i32, Vec<i32>)> {
    use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
    let admin: AdminClient<rdkafka::client::DefaultClientContext> = common::client(addr).create().unwrap();
    let r = admin.create_topics(&[NewTopic::new(topic, partitions, TopicReplication::Fixed(3)).set("min.insync.replicas", "2")], &AdminOptions::new()).await.unwrap();
    r[0].as_ref().expect("created with three replicas");
    wait_isrs(addr, topic, "every node in sync", |ps| ps.len() == partitions as usize && ps.iter().all(|(l, _, isr)| *l > 0 && *isr == vec![1, 2, 3])).await
}

/// `count` records `<tag><i>` produced idempotently with acks=all through
/// a librdkafka producer bootstrapping from `addr`, to partition
/// i % `partitions`; every one must be acknowledged.
async fn produce_acked(addr: SocketAddr, topic: &'static str, tag: &'static str, count: usize, partitions: i32) {
    tokio::task::spawn_blocking(move || {
        use rdkafka::producer::{FutureProducer, FutureRecord};
        let p: FutureProducer = common::client(addr).set("acks", "all").set("enable.idempotence", "true").set("message.timeout.ms", "60000").create().unwrap();
        let values: Vec<String> = (0..count).map(|i| format!("{tag}{i}")).collect();
        // All queued first (librdkafka batches them), then each awaited.
        let sent: Vec<_> = values.iter().enumerate().map(|(i, v)| p.send_result(FutureRecord::to(topic).partition(i as i32 % partitions).key(v).payload(v)).map_err(|(e, _)| e).expect("queued")).collect();
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        for d in sent {
            rt.block_on(d).expect("delivered").expect("every record acknowledged");
        }
    })
    .await
    .unwrap();
}

/// The sum of `name`'s series in the scrape of the admin listener `admin`
/// (0 when absent).
async fn metric(admin: SocketAddr, name: &str) -> f64 {
    let text = reqwest::get(format!("http://{admin}/metrics")).await.unwrap().text().await.unwrap();
    text.lines().filter(|l| l.starts_with(name) && l[name.len()..].starts_with([' ', '{'])).map(|l| l.rsplit(' ').next().unwrap().parse::<f64>().unwrap()).sum()
}

/// The `canopy_*` metric names the cluster dashboard queries.
fn cluster_dashboard_metrics() -> BTreeSet<String> {
    let d: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/grafana/dashboards/canopy-cluster.json")).unwrap()).unwrap();
    let mut names = BTreeSet::new();
    for p in d["panels"].as_array().unwrap() {
        for t in p["targets"].as_array().into_iter().flatten() {
            let e = t["expr"].as_str().unwrap();
            for (i, _) in e.match_indices("canopy_") {
                names.insert(e[i..].chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect::<String>());
            }
        }
    }
    assert!(names.len() >= 7, "{names:?}");
    names
}

/// Replication (step 3 of docs/cluster.md): a topic with replication
/// factor 3 and min.insync.replicas 2 has every node in each partition's
/// ISR; librdkafka's idempotent acks=all records survive the kill -9 of
/// a partition's leader, whose successor comes from the ISR in a new
/// epoch and takes produce at once; the killed node, restarted, catches
/// up and joins the ISR again; after the next leader's death every
/// acknowledged record is still there, once and in order; with one node
/// left of three, acks=all is refused with NOT_ENOUGH_REPLICAS, and taken
/// once min.insync.replicas is lowered to 1.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs etcd and a canopy built with --features cluster: see the module docs"]
async fn replicated_records_survive_their_leaders_death() {
    let root = tempfile::tempdir().unwrap();
    let etcd = Etcd::start(root.path());
    let mut nodes = three_nodes(root.path(), &etcd).await;
    let addr = |nodes: &[Option<ChildBroker>], id: i32| nodes[id as usize].as_ref().unwrap().kafka;
    {
        use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
        let admin: AdminClient<rdkafka::client::DefaultClientContext> = common::client(addr(&nodes, 1)).create().unwrap();
        let r = admin.create_topics(&[NewTopic::new("rep.t", 2, TopicReplication::Fixed(3)).set("min.insync.replicas", "2"), NewTopic::new("paused.t", 1, TopicReplication::Fixed(3)).set("min.insync.replicas", "2")], &AdminOptions::new()).await.unwrap();
        r[0].as_ref().expect("created with three replicas");
        r[1].as_ref().expect("created with three replicas");
        let r = admin.create_topics(&[NewTopic::new("four", 1, TopicReplication::Fixed(4))], &AdminOptions::new()).await.unwrap();
        assert!(matches!(r[0], Err((_, rdkafka::types::RDKafkaErrorCode::InvalidReplicationFactor))), "{r:?}");
    }
    let all = |ps: &[(i32, i32, Vec<i32>)]| ps.len() == 2 && ps.iter().all(|(l, _, isr)| *l > 0 && *isr == vec![1, 2, 3]);
    let first = wait_isrs(addr(&nodes, 1), "rep.t", "every node in sync", all).await;

    // Its followers paused (SIGSTOP, for less than their session), a
    // leader does not answer a REST acks=all append: its in-sync replicas
    // do not have the records yet.
    let p_leader = wait_isrs(addr(&nodes, 1), "paused.t", "every node in sync", |ps| ps.len() == 1 && ps[0].0 > 0 && ps[0].2 == vec![1, 2, 3]).await[0].0;
    wait_leading(addr(&nodes, p_leader), "paused.t", &[0]).await;
    let paused: Vec<String> = (1..=3).filter(|id| *id != p_leader).map(|id| nodes[id as usize].as_ref().unwrap().child.id().to_string()).collect();
    assert!(Command::new("kill").arg("-STOP").args(&paused).status().unwrap().success());
    let rest = nodes[p_leader as usize].as_ref().unwrap().rest;
    let impatient = reqwest::Client::builder().timeout(Duration::from_millis(1500)).build().unwrap();
    let r = impatient.post(format!("http://{rest}/topics/paused.t/partitions/0")).header("content-type", "application/vnd.kafka.json.v2+json").body(r#"{"records":[{"value":"p"}]}"#).send().await;
    assert!(Command::new("kill").arg("-CONT").args(&paused).status().unwrap().success());
    assert!(r.as_ref().is_err_and(|e| e.is_timeout()), "answered while the followers were paused: {r:?}");

    produce_acked(addr(&nodes, 2), "rep.t", "a", 400, 2).await;
    // The leader of partition 0 dies: a follower from its ISR takes over
    // in the next epoch, and the ISR loses the dead node.
    let (dead, epoch) = (first[0].0, first[0].1);
    nodes[dead as usize].take().unwrap().kill9();
    let survivor = survivor_of(&nodes, dead);
    let after = wait_isrs(survivor, "rep.t", "a new leader for partition 0", |ps| ps.len() == 2 && ps[0].0 > 0 && ps[0].0 != dead && ps[0].1 > epoch && !ps[0].2.contains(&dead)).await;
    assert_eq!(after[0].2.len(), 2, "{after:?}");
    // Its new leader says so in its metrics (Kafka's names): a partition
    // under-replicated, a leader election.
    let admin_of = |nodes: &[Option<ChildBroker>], id: i32| nodes[id as usize].as_ref().unwrap().admin;
    let new_leader = admin_of(&nodes, after[0].0);
    poll(new_leader, "an under-replicated partition in the metrics", |a| metric(a, "canopy_under_replicated_partitions"), |v| *v >= 1.0).await;
    assert!(metric(new_leader, "canopy_leader_elections_total").await >= 1.0);
    produce_acked(survivor, "rep.t", "b", 400, 2).await;
    // KIP-320 validation at the new leader: the dead leader's epoch ends
    // where the new one began (its 200 acknowledged records), not at the
    // high watermark; the new epoch ends at the log end.
    let ends = epoch_ends(addr(&nodes, after[0].0), "rep.t", after[0].1, &[epoch, after[0].1]).await;
    assert_eq!(ends, vec![(epoch, 200), (after[0].1, 400)], "OffsetForLeaderEpoch at the new leader");
    let expected = |tags: &[(&str, usize)]| -> Vec<Vec<String>> {
        (0..2).map(|p| tags.iter().flat_map(|(tag, n)| (0..*n).filter(move |i| i % 2 == p).map(move |i| format!("{tag}{i}"))).collect()).collect()
    };
    assert_eq!(read_all(survivor, "rep.t", 2, 800).await, expected(&[("a", 400), ("b", 400)]), "every acknowledged record, once, in order");

    // Back, the killed node catches up and joins every ISR again.
    nodes[dead as usize] = Some(spawn_node(root.path(), dead, &etcd));
    let back = wait_isrs(survivor, "rep.t", "the restarted node in sync again", all).await;
    // Every leader that took the restarted node back counted the expansion,
    // and no partition of any node is under-replicated any more; every
    // metric the cluster dashboard asks for is exported.
    let live: Vec<SocketAddr> = (1..=3).map(|id| admin_of(&nodes, id)).collect();
    let mut expands = 0.0;
    for a in &live {
        expands += metric(*a, "canopy_isr_expands_total").await;
        poll(*a, "no under-replicated partition", |a| metric(a, "canopy_under_replicated_partitions"), |v| *v == 0.0).await;
    }
    assert!(expands >= 2.0, "ISR expansions of both partitions: {expands}");
    let scraped = reqwest::get(format!("http://{}/metrics", live[0])).await.unwrap().text().await.unwrap();
    for name in cluster_dashboard_metrics() {
        assert!(scraped.lines().any(|l| l.starts_with(&name) && l[name.len()..].starts_with([' ', '{'])), "{name}, which grafana/dashboards/canopy-cluster.json queries, is not exported");
    }
    produce_acked(survivor, "rep.t", "c", 200, 2).await;

    // A clean stop (SIGTERM) of partition 1's leader is Kafka's controlled
    // shutdown: while it still serves, it hands each unit it leads to an
    // in-sync follower in the next epoch and leaves their ISRs; then it
    // goes. Idempotent acks=all producers run through it: every record
    // they were told was written is there (read below). Back, the node
    // catches up and joins again.
    const BURSTS: usize = 30;
    let (quitter, epoch) = (back[1].0, back[1].1);
    let survivor = survivor_of(&nodes, quitter);
    // The units it leads with another in-sync replica: those of both
    // topics, which are two branches, so two units apiece at most, and
    // the coordinator shards it leads (counted apart in its log).
    let led = back.iter().chain(&isrs(survivor, "paused.t").await).filter(|(l, _, isr)| *l == quitter && isr.len() > 1).count();
    // Bursts of 100, each acknowledged before the next: they span the stop.
    let during = tokio::spawn(async move {
        for _ in 0..BURSTS {
            produce_acked(survivor, "rep.t", "d", 100, 2).await;
        }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut node = nodes[quitter as usize].take().unwrap();
    assert!(Command::new("kill").arg("-TERM").arg(node.child.id().to_string()).status().unwrap().success());
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(s) = node.child.try_wait().unwrap() {
            break s;
        }
        assert!(Instant::now() < deadline, "node {quitter} did not stop within 60 s of SIGTERM");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(status.success(), "a clean stop: {status}");
    let mut said: Vec<String> = Vec::new();
    while !said.last().is_some_and(|l| l.contains("left the cluster")) {
        said.push(node.log.recv_timeout(Duration::from_secs(10)).unwrap_or_else(|_| panic!("node {quitter} never said it left the cluster: {said:#?}")));
    }
    let handed = said.iter().position(|l| l.contains("controlled shutdown: leadership handed over")).unwrap_or_else(|| panic!("no handover in the log of node {quitter}"));
    let left = said.iter().position(|l| l.contains("left the cluster")).expect("left the cluster");
    assert!(handed < left, "leadership was handed over before the node left");
    let units: serde_json::Value = serde_json::from_str(&said[handed]).unwrap();
    let (units, shards) = (units["fields"]["units"].as_u64().unwrap(), units["fields"]["coordinator_shards"].as_u64().unwrap());
    assert_eq!(units - shards, led as u64, "every unit it led: {}", said[handed]);
    let moved = wait_isrs(survivor, "rep.t", "partition 1 handed over", |ps| ps.len() == 2 && ps[1].0 > 0 && ps[1].0 != quitter).await;
    assert_eq!(moved[1].1, epoch + 1, "one election: the handover");
    assert!(!moved[1].2.contains(&quitter), "{moved:?}");
    drop(node);
    nodes[quitter as usize] = Some(spawn_node(root.path(), quitter, &etcd));
    let back = wait_isrs(survivor, "rep.t", "the stopped node in sync again", all).await;
    during.await.unwrap();

    // Through its REST bridge, the leader of partition 0 takes 100 records
    // (answered once the in-sync replicas have them), and then dies: what
    // its successor (either of the others, the restarted node among them)
    // has is everything.
    let next = back[0].0;
    let rest = nodes[next as usize].as_ref().unwrap().rest;
    let records: Vec<serde_json::Value> = (0..100).map(|i| serde_json::json!({"value": format!("r{i}")})).collect();
    let r = reqwest::Client::new().post(format!("http://{rest}/topics/rep.t/partitions/0")).header("content-type", "application/vnd.kafka.json.v2+json").body(serde_json::json!({"records": records}).to_string()).send().await.unwrap();
    assert!(r.status().is_success(), "{}", r.status());
    let answer: serde_json::Value = serde_json::from_slice(&r.bytes().await.unwrap()).unwrap();
    assert!(answer["offsets"].as_array().unwrap().iter().all(|o| o["error_code"].is_null()), "{answer}");
    nodes[next as usize].take().unwrap().kill9();
    let survivor = survivor_of(&nodes, next);
    wait_isrs(survivor, "rep.t", "partition 0 led again", |ps| ps.len() == 2 && ps.iter().all(|(l, _, isr)| *l > 0 && *l != next && !isr.contains(&next))).await;
    let mut tags = vec![("a", 400), ("b", 400), ("c", 200)];
    tags.extend([("d", 100); BURSTS]);
    let mut after_two = expected(&tags);
    after_two[0].extend((0..100).map(|i| format!("\"r{i}\"")));
    assert_eq!(read_all(survivor, "rep.t", 2, 1100 + 100 * BURSTS).await, after_two, "every acknowledged record after two leaders died");

    // One node of three left: acks=all is refused before anything is
    // appended (min.insync.replicas 2).
    let other = (1..=3).find(|id| *id != next && nodes[*id as usize].is_some() && addr(&nodes, *id) != survivor).unwrap();
    nodes[other as usize].take().unwrap().kill9();
    wait_isrs(survivor, "rep.t", "one node left in the ISR", |ps| ps.len() == 2 && ps.iter().all(|(_, _, isr)| isr.len() == 1)).await;
    assert_eq!(produce(survivor, "rep.t", common::producer_batch(-1, -1, -1, &[b"alone"])).await, 19, "NOT_ENOUGH_REPLICAS");
    // With min.insync.replicas 1, the lone leader's hw moves with what it
    // makes durable, no follower fetching: acks=all goes through.
    {
        use rdkafka::admin::{AdminClient, AdminOptions, AlterConfig, ResourceSpecifier};
        let admin: AdminClient<rdkafka::client::DefaultClientContext> = common::client(survivor).create().unwrap();
        let r = admin.alter_configs(&[AlterConfig::new(ResourceSpecifier::Topic("rep.t")).set("min.insync.replicas", "1")], &AdminOptions::new()).await.unwrap();
        r[0].as_ref().expect("altered");
    }
    assert_eq!(produce(survivor, "rep.t", common::producer_batch(-1, -1, -1, &[b"alone"])).await, 0, "acks=all with the leader alone in sync");
}
