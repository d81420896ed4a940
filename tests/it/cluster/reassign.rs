//! Reassignment (step 5 of docs/cluster.md, KIP-455): a partition moves
//! to other brokers while it takes writes, and what it had before the
//! move is on its new replicas.
//!
//! A move whose new replica cannot copy (the node is stopped) stays under
//! way: ListPartitionReassignments, at another node, shows the target
//! first, then the replica it drops, with the adding and removing lists,
//! and Metadata names all three replicas; a cancel brings the partition
//! back to its two replicas, its leader unchanged. Then kafkajs asks the
//! move again (`tests/compat/node/reassign.js`, which needs `node` and
//! `tests/compat/node/node_modules`: `npm ci` there) and lists until it is
//! done: the partition ends on its target, led by the new replica, which
//! it handed to in the next epoch. Its replication factor then goes up
//! to 3 and back down to 2 (refused while the request does not allow
//! the factor to change), its leader and epoch kept. Records deleted before the move
//! (DeleteRecords) are not on the new replica, which started over at its
//! leader's log start, nor readable at the old follower, whose log start
//! followed its leader's. librdkafka then produces through the old leader
//! (it follows the partition to its new leader) and reads every record
//! left, those of before the move included, from the new replica, and
//! from the other target replica once it leads alone.

use std::net::SocketAddr;
use std::process::Command;

use kafka_protocol::messages::alter_partition_reassignments_request::{ReassignablePartition, ReassignableTopic};
use kafka_protocol::messages::list_partition_reassignments_request::ListPartitionReassignmentsTopics;
use kafka_protocol::messages::metadata_request::MetadataRequestTopic;
use kafka_protocol::messages::{AlterPartitionReassignmentsRequest, AlterPartitionReassignmentsResponse, BrokerId, ListPartitionReassignmentsRequest, ListPartitionReassignmentsResponse, MetadataRequest, MetadataResponse, TopicName};
use kafka_protocol::protocol::StrBytes;

use super::{poll, produce_acked, read_all, three_nodes, wait_isrs, wait_until};
use crate::cluster_support::Etcd;
use crate::common::{self, ChildBroker};

const TOPIC: &str = "move.t";

fn name() -> TopicName {
    TopicName(StrBytes::from_static_str(TOPIC))
}

/// Partition 0's (leader, replicas in order) as `addr` describes it.
async fn replicas(addr: SocketAddr) -> (i32, Vec<i32>) {
    let mut sock = tokio::net::TcpStream::connect(addr).await.unwrap();
    let req = MetadataRequest::default().with_topics(Some(vec![MetadataRequestTopic::default().with_name(Some(name()))])).with_allow_auto_topic_creation(false);
    let r: MetadataResponse = common::call(&mut sock, 3, 12, 1, &req).await;
    r.topics[0].partitions.iter().find(|p| p.partition_index == 0).map(|p| (p.leader_id.0, p.replica_nodes.iter().map(|n| n.0).collect())).unwrap_or((-1, Vec::new()))
}

/// AlterPartitionReassignments v0 for partition 0: its error code.
async fn alter(addr: SocketAddr, target: Option<Vec<i32>>) -> i16 {
    let mut sock = tokio::net::TcpStream::connect(addr).await.unwrap();
    let p = ReassignablePartition::default().with_partition_index(0).with_replicas(target.map(|t| t.into_iter().map(BrokerId).collect()));
    let req = AlterPartitionReassignmentsRequest::default().with_timeout_ms(30_000).with_topics(vec![ReassignableTopic::default().with_name(name()).with_partitions(vec![p])]);
    let r: AlterPartitionReassignmentsResponse = common::call(&mut sock, 45, 0, 1, &req).await;
    assert_eq!(r.error_code, 0);
    r.responses[0].partitions[0].error_code
}

/// AlterPartitionReassignments v1 for partition 0, with
/// AllowReplicationFactorChange `factor_may_change`: its error code.
async fn alter_v1(addr: SocketAddr, target: Vec<i32>, factor_may_change: bool) -> i16 {
    let mut sock = tokio::net::TcpStream::connect(addr).await.unwrap();
    let p = ReassignablePartition::default().with_partition_index(0).with_replicas(Some(target.into_iter().map(BrokerId).collect()));
    let req = AlterPartitionReassignmentsRequest::default().with_timeout_ms(30_000).with_allow_replication_factor_change(factor_may_change).with_topics(vec![ReassignableTopic::default().with_name(name()).with_partitions(vec![p])]);
    let r: AlterPartitionReassignmentsResponse = common::call(&mut sock, 45, 1, 1, &req).await;
    assert_eq!((r.error_code, r.allow_replication_factor_change), (0, factor_may_change));
    r.responses[0].partitions[0].error_code
}

/// ListPartitionReassignments v0 for partition 0: (replicas, adding,
/// removing), or `None` when it is not moving.
async fn listed(addr: SocketAddr) -> Option<(Vec<i32>, Vec<i32>, Vec<i32>)> {
    let mut sock = tokio::net::TcpStream::connect(addr).await.unwrap();
    let req = ListPartitionReassignmentsRequest::default().with_timeout_ms(30_000).with_topics(Some(vec![ListPartitionReassignmentsTopics::default().with_name(name()).with_partition_indexes(vec![0])]));
    let r: ListPartitionReassignmentsResponse = common::call(&mut sock, 46, 0, 1, &req).await;
    assert_eq!(r.error_code, 0);
    let ids = |v: &[BrokerId]| v.iter().map(|b| b.0).collect::<Vec<i32>>();
    r.topics.iter().flat_map(|t| &t.partitions).find(|p| p.partition_index == 0).map(|p| (ids(&p.replicas), ids(&p.adding_replicas), ids(&p.removing_replicas)))
}

fn signal(node: &ChildBroker, sig: &str) {
    assert!(Command::new("kill").arg(sig).arg(node.child.id().to_string()).status().unwrap().success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs etcd and a canopy built with --features cluster: see the module docs"]
async fn a_partition_moves_to_other_brokers_with_its_records() {
    use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
    let root = tempfile::tempdir().unwrap();
    let etcd = Etcd::start(root.path());
    let mut nodes = three_nodes(root.path(), &etcd).await;
    let at = |nodes: &[Option<ChildBroker>], id: i32| nodes[id as usize].as_ref().unwrap().kafka;
    let admin: AdminClient<rdkafka::client::DefaultClientContext> = common::client(at(&nodes, 1)).create().unwrap();
    let r = admin.create_topics(&[NewTopic::new(TOPIC, 1, TopicReplication::Fixed(2)).set("min.insync.replicas", "1")], &AdminOptions::new()).await.unwrap();
    r[0].as_ref().expect("created with two replicas");
    wait_isrs(at(&nodes, 1), TOPIC, "both replicas in sync", |ps| ps.len() == 1 && ps[0].0 > 0 && ps[0].2.len() == 2).await;
    produce_acked(at(&nodes, 1), TOPIC, "a", 50, 1).await;
    // The first 30 deleted (at the leader, which the follower follows):
    // a new replica has nothing the leader still has, and starts over at
    // its log start.
    let mut tpl = rdkafka::TopicPartitionList::new();
    tpl.add_partition_offset(TOPIC, 0, rdkafka::Offset::Offset(30)).unwrap();
    let deleted = admin.delete_records(&tpl, &AdminOptions::new()).await.unwrap();
    assert_eq!(deleted.find_partition(TOPIC, 0).unwrap().offset(), rdkafka::Offset::Offset(30));
    let (leader, reps) = replicas(at(&nodes, 1)).await;
    let follower = *reps.iter().find(|r| **r != leader).unwrap();
    let spare = (1..=3).find(|id| !reps.contains(id)).unwrap();

    // A move to a node that cannot copy (stopped, still registered for
    // its lease's 3 s) stays under way, seen from another node.
    signal(nodes[spare as usize].as_ref().unwrap(), "-STOP");
    assert_eq!(alter(at(&nodes, leader), Some(vec![spare, follower])).await, 0);
    let moving = poll(at(&nodes, follower), "the move listed", listed, |l| l.is_some()).await.unwrap();
    assert_eq!(moving, (vec![spare, follower, leader], vec![spare], vec![leader]), "the target, then the replica it drops");
    assert_eq!(replicas(at(&nodes, follower)).await, (leader, vec![spare, follower, leader]), "Metadata names every replica meanwhile, and the leader is unchanged");
    // Cancelled: back to its two replicas, the leader unchanged.
    assert_eq!(alter(at(&nodes, follower), None).await, 0);
    assert_eq!(listed(at(&nodes, follower)).await, None, "this node answered once its view showed the cancel");
    let (l, mut back) = replicas(at(&nodes, follower)).await;
    back.sort();
    let mut before = reps.clone();
    before.sort();
    assert_eq!((l, back), (leader, before));
    assert_eq!(alter(at(&nodes, follower), None).await, 85, "nothing more to cancel: NO_REASSIGNMENT_IN_PROGRESS");
    // Its lease lapses, then it registers again (so that it is certainly
    // registered when the move is asked again).
    wait_until(at(&nodes, leader), "the stopped node's lease lapsed", |s| s.0.len() == 2).await;
    signal(nodes[spare as usize].as_ref().unwrap(), "-CONT");
    wait_until(at(&nodes, leader), "the stopped node registered again", |s| s.0.len() == 3).await;

    // The move, by kafkajs, listed until done.
    let epoch = wait_isrs(at(&nodes, leader), TOPIC, "led", |ps| ps[0].0 == leader).await[0].1;
    let (boot, target) = (at(&nodes, follower).to_string(), format!("{spare},{follower}"));
    let js = tokio::task::spawn_blocking(move || {
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/compat/node/reassign.js");
        let out = Command::new("node").args([script, &boot, TOPIC, "0", &target]).output().unwrap_or_else(|e| panic!("node {script}: {e} (see the module docs)"));
        assert!(out.status.success(), "kafkajs: {}\n{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).lines().last().unwrap_or_default().to_owned()
    })
    .await
    .unwrap();
    let summary: serde_json::Value = serde_json::from_str(&js).unwrap_or_else(|e| panic!("{e}: {js}"));
    // What kafkajs saw while it moved, if it was not done by the first
    // listing, is the move asked.
    for seen in summary["seen"].as_array().unwrap() {
        assert_eq!(seen["addingReplicas"], serde_json::json!([spare]), "{summary}");
        assert_eq!(seen["removingReplicas"], serde_json::json!([leader]), "{summary}");
    }
    let done = wait_isrs(at(&nodes, follower), TOPIC, "led by the new replica", |ps| ps[0].0 == spare).await;
    let mut isr = vec![spare, follower];
    isr.sort();
    assert_eq!((done[0].1, done[0].2.clone()), (epoch + 1, isr), "handed over in the next epoch; the dropped replica out of the ISR");
    assert_eq!(replicas(at(&nodes, leader)).await, (spare, vec![spare, follower]), "the old leader's view: the target only");

    // The replication factor up to 3 (the old leader comes back, from
    // what it kept), then down to 2 again; a request that does not allow
    // the factor to change is refused.
    assert_eq!(alter_v1(at(&nodes, leader), vec![spare, follower, leader], false).await, 38, "INVALID_REPLICATION_FACTOR");
    assert_eq!(alter_v1(at(&nodes, leader), vec![spare, follower, leader], true).await, 0);
    let three = wait_isrs(at(&nodes, follower), TOPIC, "three replicas in sync", |ps| ps[0].2.len() == 3).await;
    assert_eq!(three[0].0, spare, "the leader kept");
    poll(at(&nodes, follower), "the move done", listed, |l| l.is_none()).await;
    assert_eq!(replicas(at(&nodes, follower)).await, (spare, vec![spare, follower, leader]));
    assert_eq!(alter_v1(at(&nodes, leader), vec![spare, follower], true).await, 0);
    poll(at(&nodes, follower), "back to two replicas", replicas, |r| r.1 == vec![spare, follower]).await;
    let two = wait_isrs(at(&nodes, follower), TOPIC, "two replicas in sync", |ps| ps[0].2.len() == 2).await;
    assert_eq!((two[0].0, two[0].1), (spare, epoch + 1), "the leader and its epoch kept throughout");

    // New records go to the new leader (librdkafka bootstrapping from the
    // old one), which serves every record from the log start it started
    // over at; so does the other target replica once it leads alone (its
    // log start followed the leader's: nothing deleted comes back).
    produce_acked(at(&nodes, leader), TOPIC, "b", 20, 1).await;
    let expected: Vec<String> = (30..50).map(|i| format!("a{i}")).chain((0..20).map(|i| format!("b{i}"))).collect();
    assert_eq!(read_all(at(&nodes, spare), TOPIC, 1, 40).await, vec![expected.clone()], "the new replica");
    nodes[spare as usize].take().unwrap().kill9();
    wait_isrs(at(&nodes, follower), TOPIC, "the other target replica leads alone", |ps| ps[0].0 == follower && ps[0].2 == vec![follower]).await;
    assert_eq!(read_all(at(&nodes, follower), TOPIC, 1, 40).await, vec![expected], "the other target replica");
}
