//! Replicated coordinators (step 4 of docs/cluster.md): a group's
//! committed offsets and membership live in its coordinator shard's
//! replicated log, so the kill -9 of the coordinator costs the group
//! seconds, not its offsets, and not a rebalance. Measured: the time from
//! the kill to the first commit the group's live member gets accepted
//! (printed, never asserted).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use kafka_protocol::messages::{FindCoordinatorRequest, FindCoordinatorResponse};
use kafka_protocol::protocol::StrBytes;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer, ConsumerContext, Rebalance};
use rdkafka::message::Message;
use rdkafka::{Offset, TopicPartitionList};

use super::{create_replicated, produce_acked, survivor_of, three_nodes, wait_isrs};
use crate::cluster_support::Etcd;
use crate::common::{self, ChildBroker};

const TOPIC: &str = "moving.events";
const PARTITIONS: i32 = 3;
const GROUP: &str = "movers";

/// The node `addr` names as `GROUP`'s coordinator, once the shards exist.
async fn coordinator(addr: SocketAddr) -> i32 {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let mut sock = tokio::net::TcpStream::connect(addr).await.unwrap();
        let r: FindCoordinatorResponse = common::call(&mut sock, 10, 3, 1, &FindCoordinatorRequest::default().with_key(StrBytes::from_static_str(GROUP))).await;
        if r.error_code == 0 {
            return r.node_id.0;
        }
        assert!(Instant::now() < deadline, "no coordinator for {GROUP} from {addr} in 60 s (error {})", r.error_code);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Counts a member's rebalances (revocations and assignments).
#[derive(Default)]
struct Rebalances(AtomicUsize);

impl rdkafka::ClientContext for Rebalances {}

impl ConsumerContext for Rebalances {
    fn pre_rebalance(&self, _: &BaseConsumer<Self>, _: &Rebalance<'_>) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
    fn post_rebalance(&self, _: &BaseConsumer<Self>, _: &Rebalance<'_>) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

/// A member of `GROUP` bootstrapping from `addr`, reading from where the
/// group committed, or from `reset` where it committed nothing. Its
/// session (10 s) outlasts a coordinator's failover, as librdkafka's
/// default (45 s) does.
fn member(addr: SocketAddr, reset: &str) -> BaseConsumer<Rebalances> {
    let c: BaseConsumer<Rebalances> = common::client(addr)
        .set("group.id", GROUP)
        .set("enable.auto.commit", "false")
        .set("auto.offset.reset", reset)
        .set("session.timeout.ms", "10000")
        .create_with_context(Rebalances::default())
        .unwrap();
    c.subscribe(&[TOPIC]).unwrap();
    c
}

/// `offsets` (one per partition) as a commit.
fn positions(offsets: &[i64]) -> TopicPartitionList {
    let mut tpl = TopicPartitionList::new();
    for (p, o) in offsets.iter().enumerate() {
        tpl.add_partition_offset(TOPIC, p as i32, Offset::Offset(*o)).unwrap();
    }
    tpl
}

/// The group's committed offsets per partition, read through `addr`.
fn committed(addr: SocketAddr) -> BTreeMap<i32, i64> {
    let c: BaseConsumer = common::client(addr).set("group.id", GROUP).create().unwrap();
    let mut tpl = TopicPartitionList::new();
    for p in 0..PARTITIONS {
        tpl.add_partition(TOPIC, p);
    }
    let got = c.committed_offsets(tpl, Duration::from_secs(30)).unwrap();
    got.elements().iter().map(|e| (e.partition(), if let Offset::Offset(o) = e.offset() { o } else { -1 })).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs etcd and a canopy built with --features cluster: see the module docs"]
async fn committed_offsets_survive_their_coordinators_death() {
    let root = tempfile::tempdir().unwrap();
    let etcd = Etcd::start(root.path());
    let mut nodes = three_nodes(root.path(), &etcd).await;
    let addr = |nodes: &[Option<ChildBroker>], id: i32| nodes[id as usize].as_ref().unwrap().kafka;
    create_replicated(addr(&nodes, 1), TOPIC, PARTITIONS).await;
    produce_acked(addr(&nodes, 1), TOPIC, "a", 300, PARTITIONS).await;

    // A member, once assigned every partition, commits twice (the later
    // commit must win), short of each partition's end, and stays.
    let coordinator_id = coordinator(addr(&nodes, 1)).await;
    let bootstrap = survivor_of(&nodes, coordinator_id);
    let commits = [[10, 11, 12], [20, 25, 30]];
    let (assigned_tx, assigned_rx) = std::sync::mpsc::channel();
    let (killed_tx, killed_rx) = std::sync::mpsc::channel::<Instant>();
    let live = std::thread::spawn(move || {
            let c = member(bootstrap, "earliest");
            let deadline = Instant::now() + Duration::from_secs(60);
            while c.assignment().unwrap().count() < PARTITIONS as usize {
                c.poll(Duration::from_millis(100));
                assert!(Instant::now() < deadline, "no assignment in 60 s");
            }
            for offsets in commits {
                c.commit(&positions(&offsets), CommitMode::Sync).unwrap();
            }
            let rebalances = c.context().0.load(Ordering::SeqCst);
            assigned_tx.send(()).unwrap();
            // Through the coordinator's death the member polls on, and
            // commits the same offsets until one is accepted: the group
            // is coordinated again.
            let killed = loop {
                c.poll(Duration::from_millis(100));
                if let Ok(at) = killed_rx.try_recv() {
                    break at;
                }
            };
            let deadline = Instant::now() + Duration::from_secs(60);
            let mut last_try = Instant::now() - Duration::from_secs(1);
            let accepted = loop {
                c.poll(Duration::from_millis(50));
                if last_try.elapsed() >= Duration::from_millis(200) {
                    last_try = Instant::now();
                    if c.commit(&positions(&commits[1]), CommitMode::Sync).is_ok() {
                        break killed.elapsed();
                    }
                }
                assert!(Instant::now() < deadline, "no commit accepted in 60 s after the coordinator's death");
            };
            // It heartbeats on at the new coordinator (every 3 s) for 4 s:
            // still the same generation, no rebalance.
            let until = Instant::now() + Duration::from_secs(4);
            while Instant::now() < until {
                c.poll(Duration::from_millis(100));
            }
            let after = (c.context().0.load(Ordering::SeqCst) - rebalances, c.assignment().unwrap().count());
            // It leaves (its LeaveGroup goes to the new coordinator).
            drop(c);
            (accepted, after)
    });
    tokio::task::spawn_blocking(move || assigned_rx.recv_timeout(Duration::from_secs(90)).expect("the first member assigned and committed")).await.unwrap();
    let expected = committed(bootstrap);
    assert_eq!(expected, (0..PARTITIONS).zip(commits[1]).collect::<BTreeMap<i32, i64>>(), "the later commit");

    // The coordinator dies.
    let killed = Instant::now();
    nodes[coordinator_id as usize].take().unwrap().kill9();
    killed_tx.send(killed).unwrap();
    let survivor = survivor_of(&nodes, coordinator_id);

    // The live member keeps its membership: the new coordinator restored
    // the group Stable from the shard's log, and the member's heartbeats
    // and commits go on at the generation it had.
    let (accepted, (rebalances, partitions)) = tokio::task::spawn_blocking(move || live.join().unwrap()).await.unwrap();
    eprintln!("group failover: the coordinator's kill -9 to the live member's first commit accepted: {:.2} s", accepted.as_secs_f64());
    assert_eq!((rebalances, partitions), (0, PARTITIONS as usize), "the member kept its assignment through the move, with no rebalance");

    // A member joining afterwards, through a survivor, starts at the
    // committed offsets: its first record of each partition is the one
    // at the offset the group committed before the coordinator died
    // (with offsets lost it would start at the end, `latest`, and read
    // nothing).
    // The live member has left (its LeaveGroup went to the new
    // coordinator); the next member reads from the committed offsets.
    let firsts = tokio::task::spawn_blocking(move || {
        let c = member(survivor, "latest");
        let deadline = Instant::now() + Duration::from_secs(90);
        let mut firsts: BTreeMap<i32, i64> = BTreeMap::new();
        while firsts.len() < PARTITIONS as usize {
            // Errors on the way (the dead broker's connection) are
            // librdkafka's to retry.
            if let Some(Ok(m)) = c.poll(Duration::from_millis(100)) {
                firsts.entry(m.partition()).or_insert(m.offset());
            }
            assert!(Instant::now() < deadline, "the new member read from {} of {PARTITIONS} partitions in 90 s: {firsts:?}", firsts.len());
        }
        c.commit_consumer_state(CommitMode::Sync).unwrap();
        firsts
    })
    .await
    .unwrap();
    assert_eq!(firsts, expected, "the new member starts where the group committed before its coordinator died");

    // The shards' log is the brokers' own: clients cannot write, delete,
    // grow or reconfigure it, and topic listings leave it out.
    let internal = "__canopy.coordinators";
    assert_eq!(super::produce(survivor, internal, common::producer_batch(-1, -1, -1, &[b"forged"])).await, 17, "INVALID_TOPIC_EXCEPTION");
    {
        use rdkafka::admin::{AdminClient, AdminOptions, NewPartitions};
        let admin: AdminClient<rdkafka::client::DefaultClientContext> = common::client(survivor).create().unwrap();
        let opts = AdminOptions::new();
        assert!(admin.delete_topics(&[internal], &opts).await.unwrap()[0].is_err(), "deleted");
        assert!(admin.create_partitions(&[NewPartitions::new(internal, 60)], &opts).await.unwrap()[0].is_err(), "grown");
        let listed = admin.inner().fetch_metadata(None, Duration::from_secs(10)).unwrap();
        let names: Vec<&str> = listed.topics().iter().map(|t| t.name()).collect();
        assert!(names.contains(&TOPIC) && !names.contains(&internal), "{names:?}");
    }
    {
        use kafka_protocol::messages::alter_configs_request::{AlterConfigsResource, AlterableConfig};
        use kafka_protocol::messages::{AlterConfigsRequest, AlterConfigsResponse};
        let req = AlterConfigsRequest::default().with_resources(vec![AlterConfigsResource::default()
            .with_resource_type(2)
            .with_resource_name(StrBytes::from_static_str(internal))
            .with_configs(vec![AlterableConfig::default().with_name(StrBytes::from_static_str("cleanup.policy")).with_value(Some(StrBytes::from_static_str("delete")))])]);
        let mut sock = tokio::net::TcpStream::connect(survivor).await.unwrap();
        let r: AlterConfigsResponse = common::call(&mut sock, 33, 2, 2, &req).await;
        assert_eq!(r.responses[0].error_code, 17, "INVALID_TOPIC_EXCEPTION for a change of its configs: {:?}", r.responses[0].error_message);
    }
    let rest = nodes.iter().flatten().next().unwrap().rest;
    let r = reqwest::Client::new().post(format!("http://{rest}/topics/{internal}")).header("content-type", "application/vnd.kafka.json.v2+json").body(r#"{"records":[{"value":"forged"}]}"#).send().await.unwrap();
    assert_eq!(r.status().as_u16(), 422, "REST refuses the internal topic");

    // The new coordinator has the group's later commits too, and a restart
    // of the dead node (a follower of the shard now) changes nothing.
    let now_committed = committed(survivor);
    assert!(now_committed.values().zip(expected.values()).all(|(n, e)| n >= e), "{now_committed:?} after {expected:?}");
    nodes[coordinator_id as usize] = Some(crate::cluster_support::spawn_node(root.path(), coordinator_id, &etcd));
    wait_isrs(survivor, TOPIC, "the restarted node in sync again", |ps| ps.iter().all(|(l, _, isr)| *l > 0 && *isr == vec![1, 2, 3])).await;
    assert_eq!(committed(addr(&nodes, coordinator_id)), now_committed, "read through the restarted node");
}
