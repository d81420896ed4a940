//! Preferred leaders (step 5 of docs/cluster.md): after its leader's
//! death a partition is led by another in-sync replica; once the
//! preferred replica (the first) is back and in sync, ElectLeaders
//! (PREFERRED, KIP-460) gives it the partition again in the next epoch,
//! and a second call finds nothing to do; with the controller's automatic
//! rebalance on, the same happens unasked. Unclean elections: a partition
//! whose only in-sync replica died stays without a leader until its topic
//! allows an unclean election, then a live replica leads it and what only
//! the dead one had is gone, on every replica.

use std::net::SocketAddr;
use std::path::Path;

use kafka_protocol::messages::elect_leaders_request::TopicPartitions;
use kafka_protocol::messages::metadata_request::MetadataRequestTopic;
use kafka_protocol::messages::{ElectLeadersRequest, ElectLeadersResponse, MetadataRequest, MetadataResponse, TopicName};
use kafka_protocol::protocol::StrBytes;

use super::{create_replicated, isrs, wait_isrs};
use crate::cluster_support::{spawn_node_extra, Etcd};
use crate::common::{self, ChildBroker};

const TOPIC: &str = "pref.t";

/// Per partition, its preferred leader (the first replica).
async fn preferred(addr: SocketAddr) -> Vec<i32> {
    let mut sock = tokio::net::TcpStream::connect(addr).await.unwrap();
    let req = MetadataRequest::default().with_topics(Some(vec![MetadataRequestTopic::default().with_name(Some(TopicName(StrBytes::from_static_str(TOPIC))))]));
    let r: MetadataResponse = common::call(&mut sock, 3, 12, 1, &req).await;
    let mut ps: Vec<(i32, i32)> = r.topics[0].partitions.iter().map(|p| (p.partition_index, p.replica_nodes[0].0)).collect();
    ps.sort();
    ps.into_iter().map(|(_, r)| r).collect()
}

/// ElectLeaders v2 (PREFERRED) for `partitions` of the topic (`None`:
/// every partition of every topic); (topic, partition, code), sorted.
async fn elect(addr: SocketAddr, partitions: Option<&[i32]>) -> Vec<(String, i32, i16)> {
    let mut sock = tokio::net::TcpStream::connect(addr).await.unwrap();
    let tps = partitions.map(|ps| vec![TopicPartitions::default().with_topic(TopicName(StrBytes::from_static_str(TOPIC))).with_partitions(ps.to_vec())]);
    let r: ElectLeadersResponse = common::call(&mut sock, 43, 2, 1, &ElectLeadersRequest::default().with_election_type(0).with_topic_partitions(tps).with_timeout_ms(30_000)).await;
    assert_eq!(r.error_code, 0);
    let mut out: Vec<(String, i32, i16)> = r.replica_election_results.iter().flat_map(|t| t.partition_result.iter().map(|p| (t.topic.to_string(), p.partition_id, p.error_code))).collect();
    out.sort();
    out
}

/// Three nodes with `extra` settings; index 0 is empty.
async fn nodes(root: &Path, etcd: &Etcd, extra: &[&str]) -> Vec<Option<ChildBroker>> {
    let extra: Vec<String> = extra.iter().map(|s| s.to_string()).collect();
    let mut nodes: Vec<Option<ChildBroker>> = vec![None];
    for id in 1..=3 {
        nodes.push(Some(spawn_node_extra(root, id, etcd, &extra)));
    }
    super::wait_until(nodes[1].as_ref().unwrap().kafka, "three nodes", |s| s.0.len() == 3 && s.1 > 0).await;
    nodes
}

/// Kills partition 0's preferred leader, waits for another to lead it,
/// restarts the node and waits until it is in sync again (without leading
/// it, unless the controller's rebalance gave it back already); returns
/// the node and the epoch partition 0 was led in by another.
async fn displace(root: &Path, etcd: &Etcd, nodes: &mut [Option<ChildBroker>], extra: &[&str]) -> (i32, i32) {
    let first = create_replicated(nodes[1].as_ref().unwrap().kafka, TOPIC, 3).await;
    let pref = preferred(nodes[1].as_ref().unwrap().kafka).await;
    assert_eq!(first.iter().map(|p| p.0).collect::<Vec<_>>(), pref, "a new topic is led by its preferred replicas");
    let dead = pref[0];
    nodes[dead as usize].take().unwrap().kill9();
    let other = (1..=3).find(|id| *id != dead).unwrap();
    let at = nodes[other as usize].as_ref().unwrap().kafka;
    let moved = wait_isrs(at, TOPIC, "partition 0 led by another", |ps| ps.len() == 3 && ps[0].0 > 0 && ps[0].0 != dead).await;
    nodes[dead as usize] = Some(spawn_node_extra(root, dead, etcd, &extra.iter().map(|s| s.to_string()).collect::<Vec<_>>()));
    wait_isrs(at, TOPIC, "the restarted node in sync", |ps| ps.len() == 3 && ps.iter().all(|p| p.2 == vec![1, 2, 3])).await;
    (dead, moved[0].1)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs etcd and a canopy built with --features cluster: see the module docs"]
async fn preferred_leaders_are_elected_back_on_request() {
    let root = tempfile::tempdir().unwrap();
    let etcd = Etcd::start(root.path());
    let extra = ["--auto-leader-rebalance-enable", "false"];
    let mut nodes = nodes(root.path(), &etcd, &extra).await;
    let (dead, epoch) = displace(root.path(), &etcd, &mut nodes, &extra).await;
    let addr = nodes[dead as usize].as_ref().unwrap().kafka;
    assert_ne!(isrs(addr, TOPIC).await[0].0, dead, "no election unasked");

    let t = |p: i32, code: i16| (TOPIC.to_owned(), p, code);
    // Partition 0 goes back; the others never left (ELECTION_NOT_NEEDED);
    // a partition that does not exist is UNKNOWN_TOPIC_OR_PARTITION.
    assert_eq!(elect(addr, Some(&[0, 1, 2, 7])).await, vec![t(0, 0), t(1, 84), t(2, 84), t(7, 3)]);
    let now = isrs(addr, TOPIC).await;
    assert_eq!((now[0].0, now[0].1), (dead, epoch + 1), "led by its preferred replica in the next epoch, as this node answered");
    // Nothing left to do, for it or for any partition of any topic (a
    // request for all lists only partitions an election was tried for).
    assert_eq!(elect(addr, Some(&[0])).await, vec![t(0, 84)]);
    assert_eq!(elect(addr, None).await, vec![]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs etcd and a canopy built with --features cluster: see the module docs"]
async fn the_controller_gives_preferred_leaders_their_partitions_back() {
    let root = tempfile::tempdir().unwrap();
    let etcd = Etcd::start(root.path());
    let extra = ["--leader-imbalance-check-interval-ms", "1000"];
    let mut nodes = nodes(root.path(), &etcd, &extra).await;
    let (dead, epoch) = displace(root.path(), &etcd, &mut nodes, &extra).await;
    let addr = nodes[dead as usize].as_ref().unwrap().kafka;
    let back = wait_isrs(addr, TOPIC, "partition 0 led by its preferred replica again", |ps| ps.len() == 3 && ps[0].0 == dead).await;
    assert_eq!(back[0].1, epoch + 1, "one election");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs etcd and a canopy built with --features cluster: see the module docs"]
async fn an_unclean_election_brings_a_partition_back_without_what_only_its_dead_leader_had() {
    use rdkafka::admin::{AdminClient, AdminOptions, AlterConfig, NewTopic, ResourceSpecifier, TopicReplication};
    const UNC: &str = "unc.t";
    let root = tempfile::tempdir().unwrap();
    let etcd = Etcd::start(root.path());
    let extra = ["--auto-leader-rebalance-enable", "false", "--replica-lag-time-max-ms", "2000"];
    let mut nodes = nodes(root.path(), &etcd, &extra).await;
    let at = |nodes: &[Option<ChildBroker>], id: i32| nodes[id as usize].as_ref().unwrap().kafka;
    let admin: AdminClient<rdkafka::client::DefaultClientContext> = common::client(at(&nodes, 1)).create().unwrap();
    let r = admin.create_topics(&[NewTopic::new(UNC, 1, TopicReplication::Fixed(3)).set("min.insync.replicas", "1")], &AdminOptions::new()).await.unwrap();
    r[0].as_ref().expect("created");
    let first = wait_isrs(at(&nodes, 1), UNC, "every node in sync", |ps| ps.len() == 1 && ps[0].0 > 0 && ps[0].2.len() == 3).await;
    super::produce_acked(at(&nodes, 1), UNC, "a", 20, 1).await;

    // Its followers stopped, the leader is alone in the ISR and takes
    // records only it has; then it dies.
    let leader = first[0].0;
    let followers: Vec<i32> = (1..=3).filter(|id| *id != leader).collect();
    let signal = |nodes: &[Option<ChildBroker>], sig: &str| {
        let pids: Vec<String> = followers.iter().map(|id| nodes[*id as usize].as_ref().unwrap().child.id().to_string()).collect();
        assert!(std::process::Command::new("kill").arg(sig).args(&pids).status().unwrap().success());
    };
    signal(&nodes, "-STOP");
    wait_isrs(at(&nodes, leader), UNC, "the leader alone in the ISR", |ps| ps.len() == 1 && ps[0].2 == vec![leader]).await;
    super::produce_acked(at(&nodes, leader), UNC, "b", 10, 1).await;
    nodes[leader as usize].take().unwrap().kill9();
    signal(&nodes, "-CONT");
    let witness = at(&nodes, followers[0]);
    let stuck = wait_isrs(witness, UNC, "no leader (no in-sync replica is live)", |ps| ps.len() == 1 && ps[0].0 == -1).await;

    // Allowed for the topic, the controller elects a live replica, alone
    // in the ISR, in the next epoch (the other one may join it at once).
    let alter = AlterConfig::new(ResourceSpecifier::Topic(UNC)).set("unclean.leader.election.enable", "true");
    let admin: AdminClient<rdkafka::client::DefaultClientContext> = common::client(witness).create().unwrap();
    admin.alter_configs(&[alter], &AdminOptions::new()).await.unwrap()[0].as_ref().expect("altered");
    let elected = wait_isrs(witness, UNC, "an out-of-sync replica leads", |ps| ps.len() == 1 && ps[0].0 > 0).await;
    // (Elected alone in the ISR, as the unit tests check; the other live
    // replica, as caught up as it, may have joined by the time this looks.)
    assert!(followers.contains(&elected[0].0) && elected[0].2.contains(&elected[0].0) && elected[0].1 > stuck[0].1, "{elected:?}");
    // ElectLeaders UNCLEAN finds nothing to do now.
    let mut sock = tokio::net::TcpStream::connect(witness).await.unwrap();
    let tps = vec![TopicPartitions::default().with_topic(TopicName(StrBytes::from_static_str(UNC))).with_partitions(vec![0])];
    let r: ElectLeadersResponse = common::call(&mut sock, 43, 2, 1, &ElectLeadersRequest::default().with_election_type(1).with_topic_partitions(Some(tps)).with_timeout_ms(10_000)).await;
    assert_eq!(r.replica_election_results[0].partition_result[0].error_code, 84, "ELECTION_NOT_NEEDED");

    // The partition takes records again; the dead leader comes back, cuts
    // what only it had, and joins the ISR.
    super::produce_acked(witness, UNC, "c", 10, 1).await;
    nodes[leader as usize] = Some(spawn_node_extra(root.path(), leader, &etcd, &extra.iter().map(|s| s.to_string()).collect::<Vec<_>>()));
    wait_isrs(witness, UNC, "every node in sync again", |ps| ps.len() == 1 && ps[0].2.len() == 3).await;
    let expected: Vec<String> = (0..20).map(|i| format!("a{i}")).chain((0..10).map(|i| format!("c{i}"))).collect();
    assert_eq!(super::read_all(witness, UNC, 1, 30).await, vec![expected], "the acknowledged records only the dead leader had are gone");
}
