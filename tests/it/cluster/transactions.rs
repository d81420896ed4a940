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
    let mut cfg = common::producer_config(addr, "all");
    cfg.set("transactional.id", ID).set("transaction.timeout.ms", "60000").set("message.timeout.ms", "60000");
    let p: Txp = cfg.create().unwrap();
    p.init_transactions(Duration::from_secs(60)).unwrap();
    p
}

/// One transaction of `count` records `<tag><i>`, record i to partition
/// i % PARTITIONS, committed or aborted.
fn transaction(p: &Txp, tag: &str, count: usize, commit: bool) {
    p.begin_transaction().unwrap();
    for i in 0..count {
        let v = format!("{tag}{i}");
        p.send(BaseRecord::<(), str>::to(TOPIC).partition(i as i32 % PARTITIONS).payload(&v)).map_err(|(e, _)| e).unwrap();
    }
    // Written before the end (an abort drops what is still queued).
    p.flush(Duration::from_secs(60)).unwrap();
    if commit {
        p.commit_transaction(Duration::from_secs(60)).unwrap();
    } else {
        p.abort_transaction(Duration::from_secs(60)).unwrap();
    }
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

async fn coordinator(addr: SocketAddr) -> i32 {
    let mut sock = tokio::net::TcpStream::connect(addr).await.unwrap();
    let r: FindCoordinatorResponse = common::call(&mut sock, 10, 3, 1, &FindCoordinatorRequest::default().with_key(StrBytes::from_static_str(ID)).with_key_type(1)).await;
    assert_eq!(r.error_code, 0);
    r.node_id.0
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs etcd and a canopy built with --features cluster: see the module docs"]
async fn a_transaction_spans_partitions_every_node_leads() {
    let root = tempfile::tempdir().unwrap();
    let etcd = Etcd::start(root.path());
    let mut nodes = three_nodes(root.path(), &etcd).await;
    let at = |nodes: &[Option<ChildBroker>], id: i32| nodes[id as usize].as_ref().unwrap().kafka;
    let layout = create_replicated(at(&nodes, 1), TOPIC, PARTITIONS).await;
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
    let tc = coordinator(at(&nodes, 1)).await;
    let victim = *leaders.iter().find(|l| **l != tc).unwrap();
    let survivor = (1..=3).find(|id| *id != victim).unwrap();
    let p = tokio::task::spawn_blocking(move || {
        p.begin_transaction().unwrap();
        for i in 0..60 {
            let v = format!("e{i}");
            p.send(BaseRecord::<(), str>::to(TOPIC).partition(i % PARTITIONS).payload(&v)).map_err(|(e, _)| e).unwrap();
        }
        p.flush(Duration::from_secs(60)).unwrap();
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
