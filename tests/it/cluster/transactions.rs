//! Transactions across the cluster (docs/cluster.md, "Transaction
//! state"): librdkafka's transactional producer, bootstrapping from one
//! node, writes to partitions every node leads in one transaction; the
//! coordinator ends it with markers at each partition's leader
//! (WriteTxnMarkers), and each leader asked its coordinator before it let
//! the transaction's batches in (AddPartitionsToTxn, verify-only).
//! read_committed readers see exactly the committed transactions'
//! records, read_uncommitted readers everything, and no partition is left
//! with an open transaction. Then a partition leader other than the
//! coordinator is killed with -9 while a transaction is open on it: the
//! commit's marker reaches its new leader, and every committed record is
//! read once.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::time::Duration;

use kafka_protocol::messages::list_offsets_request::{ListOffsetsPartition, ListOffsetsTopic};
use kafka_protocol::messages::{BrokerId, FindCoordinatorRequest, FindCoordinatorResponse, ListOffsetsRequest, ListOffsetsResponse, TopicName};
use kafka_protocol::protocol::StrBytes;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer, ThreadedProducer};
use rdkafka::Message;

use super::{create_replicated, three_nodes, wait_isrs};
use crate::cluster_support::Etcd;
use crate::common::{self, ChildBroker};

const TOPIC: &str = "txn.t";
const PARTITIONS: i32 = 6;
const ID: &str = "cross";

type Txp = ThreadedProducer<DefaultProducerContext>;

fn producer(addr: SocketAddr) -> Txp {
    producer_as(addr, ID)
}

fn producer_as(addr: SocketAddr, id: &str) -> Txp {
    let mut cfg = common::producer_config(addr, "all");
    cfg.set("transactional.id", id).set("transaction.timeout.ms", "60000").set("message.timeout.ms", "60000");
    let p: Txp = cfg.create().unwrap();
    p.init_transactions(Duration::from_secs(60)).unwrap();
    p
}

/// One transaction of `count` records `<tag><i>`, record i to partition
/// i % PARTITIONS, committed or aborted.
fn transaction(p: &Txp, tag: &str, count: usize, commit: bool) {
    open(p, tag, count);
    if commit {
        p.commit_transaction(Duration::from_secs(60)).unwrap();
    } else {
        p.abort_transaction(Duration::from_secs(60)).unwrap();
    }
}

/// Begins a transaction of `count` records `<tag><i>`, record i to
/// partition i % PARTITIONS, and waits until every one is written.
fn open(p: &Txp, tag: &str, count: usize) {
    p.begin_transaction().unwrap();
    for i in 0..count {
        let v = format!("{tag}{i}");
        p.send(BaseRecord::<(), str>::to(TOPIC).partition(i as i32 % PARTITIONS).payload(&v)).map_err(|(e, _)| e).unwrap();
    }
    // Written before the end (an abort drops what is still queued).
    p.flush(Duration::from_secs(60)).unwrap();
}

/// Every record of the topic at `isolation`, per partition in offset
/// order, once `n` arrived and nothing more for a moment.
fn read(addr: SocketAddr, isolation: &str, n: usize) -> Vec<Vec<String>> {
    let mut cfg = common::consumer_config(addr);
    cfg.set("isolation.level", isolation);
    let c: BaseConsumer = cfg.create().unwrap();
    let mut tpl = rdkafka::TopicPartitionList::new();
    for p in 0..PARTITIONS {
        tpl.add_partition_offset(TOPIC, p, rdkafka::Offset::Beginning).unwrap();
    }
    c.assign(&tpl).unwrap();
    let mut out = vec![Vec::new(); PARTITIONS as usize];
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let total = |o: &Vec<Vec<String>>| o.iter().map(Vec::len).sum::<usize>();
    while total(&out) < n {
        assert!(std::time::Instant::now() < deadline, "{isolation}: read {} of {n}", total(&out));
        if let Some(m) = c.poll(Duration::from_millis(100)) {
            let m = m.unwrap();
            out[m.partition() as usize].push(String::from_utf8(m.payload().unwrap().to_vec()).unwrap());
        }
    }
    let end = std::time::Instant::now() + Duration::from_millis(700);
    while std::time::Instant::now() < end {
        if let Some(m) = c.poll(Duration::from_millis(100)) {
            panic!("{isolation}: more than {n} records: {:?}", m.unwrap().payload().map(String::from_utf8_lossy));
        }
    }
    out
}

/// What `tags` (tag, count) put in each partition, in order.
fn expected(tags: &[(&str, usize)]) -> Vec<Vec<String>> {
    let mut out = vec![Vec::new(); PARTITIONS as usize];
    for (tag, count) in tags {
        for i in 0..*count {
            out[i % PARTITIONS as usize].push(format!("{tag}{i}"));
        }
    }
    out
}

/// Per partition, (latest offset read_uncommitted, read_committed) at its
/// leader `leaders[p]`.
async fn stable(nodes: &[Option<ChildBroker>], leaders: &[i32]) -> Vec<(i64, i64)> {
    let mut out = Vec::new();
    for (p, leader) in leaders.iter().enumerate() {
        let mut sock = tokio::net::TcpStream::connect(nodes[*leader as usize].as_ref().unwrap().kafka).await.unwrap();
        let mut pair = [0i64; 2];
        for (i, isolation) in [0i8, 1].into_iter().enumerate() {
            let req = ListOffsetsRequest::default().with_replica_id(BrokerId(-1)).with_isolation_level(isolation).with_topics(vec![ListOffsetsTopic::default()
                .with_name(TopicName(StrBytes::from_static_str(TOPIC)))
                .with_partitions(vec![ListOffsetsPartition::default().with_partition_index(p as i32).with_timestamp(-1)])]);
            let r: ListOffsetsResponse = common::call(&mut sock, 2, 5, 1, &req).await;
            assert_eq!(r.topics[0].partitions[0].error_code, 0);
            pair[i] = r.topics[0].partitions[0].offset;
        }
        out.push((pair[0], pair[1]));
    }
    out
}

/// Three nodes on etcd, with TOPIC made (replication factor 3, every node
/// in sync); the layout [`create_replicated`] answers.
async fn cluster(root: &std::path::Path) -> (Etcd, Vec<Option<ChildBroker>>, Vec<(i32, i32, Vec<i32>)>) {
    let etcd = Etcd::start(root);
    let nodes = three_nodes(root, &etcd).await;
    let layout = create_replicated(nodes[1].as_ref().unwrap().kafka, TOPIC, PARTITIONS).await;
    (etcd, nodes, layout)
}

fn at(nodes: &[Option<ChildBroker>], id: i32) -> SocketAddr {
    nodes[id as usize].as_ref().unwrap().kafka
}

/// The node `addr` names as the coordinator of `id` (a transactional id
/// or a group: the shards are shared), once there is one.
async fn coordinator(addr: SocketAddr, id: &'static str) -> i32 {
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let mut sock = tokio::net::TcpStream::connect(addr).await.unwrap();
        let r: FindCoordinatorResponse = common::call(&mut sock, 10, 3, 1, &FindCoordinatorRequest::default().with_key(StrBytes::from_static_str(id)).with_key_type(1)).await;
        if r.error_code == 0 {
            return r.node_id.0;
        }
        assert!(std::time::Instant::now() < deadline, "no coordinator for {id} from {addr} in 60 s (error {})", r.error_code);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs etcd and a canopy built with --features cluster: see the module docs"]
async fn a_transaction_spans_partitions_every_node_leads() {
    let root = tempfile::tempdir().unwrap();
    let (_etcd, mut nodes, layout) = cluster(root.path()).await;
    let leaders: Vec<i32> = layout.iter().map(|(l, _, _)| *l).collect();
    assert_eq!(leaders.iter().collect::<BTreeSet<_>>().len(), 3, "every node leads some partition (precondition): {leaders:?}");

    let addr = at(&nodes, 1);
    let p = tokio::task::spawn_blocking(move || {
        let p = producer(addr);
        transaction(&p, "c", 60, true);
        transaction(&p, "a", 30, false);
        transaction(&p, "d", 60, true);
        p
    })
    .await
    .unwrap();
    let reader = at(&nodes, 2);
    let committed = tokio::task::spawn_blocking(move || read(reader, "read_committed", 120)).await.unwrap();
    assert_eq!(committed, expected(&[("c", 60), ("d", 60)]), "exactly the committed records");
    let all = tokio::task::spawn_blocking(move || read(reader, "read_uncommitted", 150)).await.unwrap();
    assert_eq!(all, expected(&[("c", 60), ("a", 30), ("d", 60)]));
    for (p, (end, lso)) in stable(&nodes, &leaders).await.into_iter().enumerate() {
        assert_eq!(end, lso, "partition {p}: no transaction left open");
    }

    // A partition leader that is not the coordinator dies with a
    // transaction open on it; the commit's marker reaches its successor.
    let tc = coordinator(at(&nodes, 1), ID).await;
    let victim = *leaders.iter().find(|l| **l != tc).unwrap();
    let survivor = (1..=3).find(|id| *id != victim).unwrap();
    let p = tokio::task::spawn_blocking(move || {
        open(&p, "e", 60);
        p
    })
    .await
    .unwrap();
    nodes[victim as usize].take().unwrap().kill9();
    wait_isrs(at(&nodes, survivor), TOPIC, "the dead leader's partitions led by others", |ps| ps.len() == PARTITIONS as usize && ps.iter().all(|(l, _, _)| *l > 0 && *l != victim)).await;
    tokio::task::spawn_blocking(move || p.commit_transaction(Duration::from_secs(60)).unwrap()).await.unwrap();
    let reader = at(&nodes, survivor);
    let committed = tokio::task::spawn_blocking(move || read(reader, "read_committed", 180)).await.unwrap();
    assert_eq!(committed, expected(&[("c", 60), ("d", 60), ("e", 60)]), "the open transaction committed at the dead leader's successors too");
}

/// A transaction's coordinator dies (kill -9) while the transaction is
/// open: its state is in the coordinator shard's log, so the shard's next
/// leader takes it up and the producer commits it there, then goes on
/// (docs/cluster.md, "Transaction state"). Then the coordinator dies again
/// while a commit is under way, at whatever step it has reached: the
/// commit completes all the same, once. read_committed readers see every
/// committed record once and no aborted one, and no partition is left
/// with an open transaction.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs etcd and a canopy built with --features cluster: see the module docs"]
async fn a_transaction_outlives_its_coordinator() {
    const OUTLIVES: &str = "outlives";
    let root = tempfile::tempdir().unwrap();
    let (etcd, mut nodes, _) = cluster(root.path()).await;
    let tc = coordinator(at(&nodes, 1), OUTLIVES).await;
    let boot = (1..=3).find(|id| *id != tc).unwrap();
    let addr = at(&nodes, boot);
    let p = tokio::task::spawn_blocking(move || {
        let p = producer_as(addr, OUTLIVES);
        transaction(&p, "c", 60, true);
        open(&p, "e", 60);
        p
    })
    .await
    .unwrap();

    // The coordinator dies with "e" open; the commit is taken by the
    // shard's next leader, which knows the transaction from the log.
    nodes[tc as usize].take().unwrap().kill9();
    // (The survivors name another coordinator once the dead node's
    // session ends.)
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while coordinator(addr, OUTLIVES).await == tc {
        assert!(std::time::Instant::now() < deadline, "node {tc} still coordinates {OUTLIVES} 60 s after its death");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let p = tokio::task::spawn_blocking(move || {
        p.commit_transaction(Duration::from_secs(60)).expect("the open transaction commits at the next coordinator");
        transaction(&p, "f", 30, false);
        transaction(&p, "g", 60, true);
        p
    })
    .await
    .unwrap();

    // Back to three nodes, then the coordinator dies during a commit.
    nodes[tc as usize] = Some(crate::cluster_support::spawn_node(root.path(), tc, &etcd));
    wait_isrs(addr, TOPIC, "every node in sync again", |ps| ps.len() == PARTITIONS as usize && ps.iter().all(|(l, _, isr)| *l > 0 && isr.len() == 3)).await;
    let tc = coordinator(addr, OUTLIVES).await;
    let survivor = (1..=3).find(|id| *id != tc).unwrap();
    let p = tokio::task::spawn_blocking(move || {
        open(&p, "h", 60);
        p
    })
    .await
    .unwrap();
    let committing = tokio::task::spawn_blocking(move || {
        p.commit_transaction(Duration::from_secs(60)).expect("a commit under way when its coordinator died completes");
        p
    });
    tokio::time::sleep(Duration::from_millis(20)).await;
    nodes[tc as usize].take().unwrap().kill9();
    let p = committing.await.unwrap();
    tokio::task::spawn_blocking(move || transaction(&p, "i", 60, true)).await.unwrap();

    let reader = at(&nodes, survivor);
    let committed = tokio::task::spawn_blocking(move || read(reader, "read_committed", 300)).await.unwrap();
    assert_eq!(committed, expected(&[("c", 60), ("e", 60), ("g", 60), ("h", 60), ("i", 60)]), "every committed record once, no aborted one");
    let layout = wait_isrs(reader, TOPIC, "every partition led by a live node", |ps| ps.len() == PARTITIONS as usize && ps.iter().all(|(l, _, _)| *l > 0 && *l != tc)).await;
    let leaders: Vec<i32> = layout.iter().map(|(l, _, _)| *l).collect();
    for (p, (end, lso)) in stable(&nodes, &leaders).await.into_iter().enumerate() {
        assert_eq!(end, lso, "partition {p}: no transaction left open");
    }
}

/// The group coordinator's answer: `group`'s committed offset of each
/// partition of TOPIC (-1001: none), through a consumer of the group
/// bootstrapping from `addr`.
fn committed_offsets(addr: SocketAddr, group: &str) -> Vec<i64> {
    let mut cfg = common::consumer_config(addr);
    cfg.set("group.id", group);
    let c: BaseConsumer = cfg.create().unwrap();
    let mut tpl = rdkafka::TopicPartitionList::new();
    for p in 0..PARTITIONS {
        tpl.add_partition(TOPIC, p);
    }
    let got = c.committed_offsets(tpl, Duration::from_secs(30)).unwrap();
    (0..PARTITIONS).map(|p| got.find_partition(TOPIC, p).unwrap().offset().to_raw().unwrap_or(-1)).collect()
}

/// A transaction commits offsets for a group another node coordinates
/// (docs/cluster.md, "Transaction state", step 5): the group's shard joins
/// the transaction (AddOffsetsToTxn at the transaction's coordinator),
/// the offsets wait at the group's coordinator (TxnOffsetCommit, which
/// asks the transaction's coordinator first), and the end's marker on the
/// group's shard commits or drops them. Then the group's coordinator dies
/// with offsets waiting: its successor has them from the shard's log, and
/// the commit reaches it there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs etcd and a canopy built with --features cluster: see the module docs"]
async fn a_transactions_offsets_reach_a_group_another_node_coordinates() {
    const TX: &str = "offsets-tx";
    let root = tempfile::tempdir().unwrap();
    let (_etcd, mut nodes, _) = cluster(root.path()).await;
    let tc = coordinator(at(&nodes, 1), TX).await;
    // A group whose coordinator is another node than the transaction's.
    let names: Vec<&'static str> = vec!["offsets-g0", "offsets-g1", "offsets-g2", "offsets-g3", "offsets-g4", "offsets-g5", "offsets-g6", "offsets-g7", "offsets-g8", "offsets-g9"];
    let mut chosen = None;
    for g in names {
        let gc = coordinator(at(&nodes, 1), g).await;
        if gc != tc {
            chosen = Some((g, gc));
            break;
        }
    }
    let (group, gc) = chosen.expect("one of ten groups is coordinated by another node (precondition)");
    let boot = (1..=3).find(|id| *id != tc && *id != gc).unwrap();
    let addr = at(&nodes, boot);
    let offsets = |o: i64| {
        let mut tpl = rdkafka::TopicPartitionList::new();
        for p in 0..PARTITIONS {
            tpl.add_partition_offset(TOPIC, p, rdkafka::Offset::Offset(o + p as i64)).unwrap();
        }
        tpl
    };
    let p = tokio::task::spawn_blocking(move || {
        let p = producer_as(addr, TX);
        let mut cfg = common::consumer_config(addr);
        cfg.set("group.id", group);
        let meta = cfg.create::<BaseConsumer>().unwrap().group_metadata().unwrap();
        open(&p, "c", 12);
        p.send_offsets_to_transaction(&offsets(5), &meta, Duration::from_secs(60)).expect("the group's shard joins the transaction");
        p.commit_transaction(Duration::from_secs(60)).unwrap();
        assert_eq!(committed_offsets(addr, group), (0..PARTITIONS as i64).map(|p| 5 + p).collect::<Vec<_>>(), "committed with the transaction");
        open(&p, "a", 12);
        p.send_offsets_to_transaction(&offsets(9), &meta, Duration::from_secs(60)).unwrap();
        p.abort_transaction(Duration::from_secs(60)).unwrap();
        assert_eq!(committed_offsets(addr, group), (0..PARTITIONS as i64).map(|p| 5 + p).collect::<Vec<_>>(), "an aborted transaction's offsets are dropped");
        open(&p, "d", 12);
        p.send_offsets_to_transaction(&offsets(20), &meta, Duration::from_secs(60)).unwrap();
        p
    })
    .await
    .unwrap();
    // The group's coordinator dies with the offsets waiting there.
    nodes[gc as usize].take().unwrap().kill9();
    let p = tokio::task::spawn_blocking(move || {
        p.commit_transaction(Duration::from_secs(60)).expect("the commit reaches the group's next coordinator");
        p
    })
    .await
    .unwrap();
    let got = tokio::task::spawn_blocking(move || committed_offsets(addr, group)).await.unwrap();
    assert_eq!(got, (0..PARTITIONS as i64).map(|p| 20 + p).collect::<Vec<_>>(), "the waiting offsets survived their coordinator and committed");
    drop(p);
    let reader = addr;
    let committed = tokio::task::spawn_blocking(move || read(reader, "read_committed", 24)).await.unwrap();
    assert_eq!(committed, expected(&[("c", 12), ("d", 12)]));
}
