//! Replicated coordinators (step 4 of docs/cluster.md): a group's
//! committed offsets live in its coordinator shard's replicated log, so
//! the kill -9 of the coordinator costs the group seconds, not its
//! offsets. Measured: the time from the kill to the group's first record
//! read by a member that joins afterwards (printed, never asserted).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use kafka_protocol::messages::{FindCoordinatorRequest, FindCoordinatorResponse};
use kafka_protocol::protocol::StrBytes;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
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

/// A member of `GROUP` bootstrapping from `addr`, reading from where the
/// group committed, or from `reset` where it committed nothing.
fn member(addr: SocketAddr, reset: &str) -> BaseConsumer {
    let c: BaseConsumer = common::client(addr).set("group.id", GROUP).set("enable.auto.commit", "false").set("auto.offset.reset", reset).set("session.timeout.ms", "6000").create().unwrap();
    c.subscribe(&[TOPIC]).unwrap();
    c
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
    // commit must win), short of each partition's end, then leaves.
    let coordinator_id = coordinator(addr(&nodes, 1)).await;
    let bootstrap = survivor_of(&nodes, coordinator_id);
    let commits = [[10, 11, 12], [20, 25, 30]];
    tokio::task::spawn_blocking(move || {
        let c = member(bootstrap, "earliest");
        let deadline = Instant::now() + Duration::from_secs(60);
        while c.assignment().unwrap().count() < PARTITIONS as usize {
            c.poll(Duration::from_millis(100));
            assert!(Instant::now() < deadline, "no assignment in 60 s");
        }
        for offsets in commits {
            let mut tpl = TopicPartitionList::new();
            for (p, o) in offsets.iter().enumerate() {
                tpl.add_partition_offset(TOPIC, p as i32, Offset::Offset(*o)).unwrap();
            }
            c.commit(&tpl, CommitMode::Sync).unwrap();
        }
    })
    .await
    .unwrap();
    let expected = committed(bootstrap);
    assert_eq!(expected, (0..PARTITIONS).zip(commits[1]).collect::<BTreeMap<i32, i64>>(), "the later commit");

    // The coordinator dies.
    let killed = Instant::now();
    nodes[coordinator_id as usize].take().unwrap().kill9();
    let survivor = survivor_of(&nodes, coordinator_id);

    // A member joining afterwards, through a survivor, starts at the
    // committed offsets: its first record of each partition is the one
    // at the offset the group committed before the coordinator died
    // (with offsets lost it would start at the end, `latest`, and read
    // nothing).
    let (first_after, firsts) = tokio::task::spawn_blocking(move || {
        let c = member(survivor, "latest");
        let deadline = Instant::now() + Duration::from_secs(90);
        let mut first_after = None;
        let mut firsts: BTreeMap<i32, i64> = BTreeMap::new();
        while firsts.len() < PARTITIONS as usize {
            // Errors on the way (the dead broker's connection) are
            // librdkafka's to retry.
            if let Some(Ok(m)) = c.poll(Duration::from_millis(100)) {
                first_after.get_or_insert_with(|| killed.elapsed());
                firsts.entry(m.partition()).or_insert(m.offset());
            }
            assert!(Instant::now() < deadline, "the new member read from {} of {PARTITIONS} partitions in 90 s: {firsts:?}", firsts.len());
        }
        c.commit_consumer_state(CommitMode::Sync).unwrap();
        (first_after.unwrap(), firsts)
    })
    .await
    .unwrap();
    eprintln!("group failover: the coordinator's kill -9 to the group's first record, read by a member joining after it: {:.2} s", first_after.as_secs_f64());
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
