//! Transactions with librdkafka's transactional producer: a committed and
//! an aborted transaction across three partitions and a group's offsets
//! (read_committed readers see exactly the committed records and offsets,
//! read_uncommitted readers everything), a zombie fenced by a newer
//! producer of the same id, a transaction left open by a broker killed with
//! -9 (aborted at restart: readers are not held back), a transaction past
//! its timeout (aborted), and the coordinator's answers to bad requests on
//! the wire.

use crate::common;

use std::net::SocketAddr;
use std::time::Duration;

use kafka_protocol::messages::add_partitions_to_txn_request::{AddPartitionsToTxnTopic, AddPartitionsToTxnTransaction};
use kafka_protocol::messages::list_offsets_request::{ListOffsetsPartition, ListOffsetsTopic};
use kafka_protocol::messages::offset_fetch_request::OffsetFetchRequestTopic;
use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
use kafka_protocol::messages::*;
use kafka_protocol::protocol::StrBytes;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::message::Message;
use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer, ThreadedProducer};
use rdkafka::TopicPartitionList;

type Txp = ThreadedProducer<DefaultProducerContext>;

fn s(v: &str) -> StrBytes {
    StrBytes::from_string(v.to_owned())
}

fn txn_producer(addr: SocketAddr, id: &str, timeout_ms: u32) -> Txp {
    let mut cfg = common::producer_config(addr, "all");
    cfg.set("transactional.id", id).set("transaction.timeout.ms", timeout_ms.to_string()).set("message.timeout.ms", timeout_ms.min(30_000).to_string());
    let p: Txp = cfg.create().unwrap();
    p.init_transactions(Duration::from_secs(30)).unwrap();
    p
}

fn send(p: &Txp, topic: &str, partition: i32, value: &str) {
    p.send(BaseRecord::<(), str>::to(topic).partition(partition).payload(value)).map_err(|(e, _)| e).unwrap();
}

/// Reads `topic`'s partitions from the start with the given isolation
/// level until `n` values arrived, then checks nothing more comes.
fn read_values(addr: SocketAddr, topic: &str, partitions: i32, isolation: &str, n: usize) -> Vec<String> {
    let mut cfg = common::consumer_config(addr);
    cfg.set("isolation.level", isolation);
    let consumer: BaseConsumer = cfg.create().unwrap();
    let mut tpl = TopicPartitionList::new();
    for p in 0..partitions {
        tpl.add_partition_offset(topic, p, rdkafka::Offset::Beginning).unwrap();
    }
    consumer.assign(&tpl).unwrap();
    let mut out = Vec::new();
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while out.len() < n {
        assert!(std::time::Instant::now() < deadline, "{isolation}: read {} of {n} records of {topic}: {out:?}", out.len());
        if let Some(m) = consumer.poll(Duration::from_millis(100)) {
            out.push(String::from_utf8(m.unwrap().payload().unwrap().to_vec()).unwrap());
        }
    }
    let end = std::time::Instant::now() + Duration::from_millis(700);
    while std::time::Instant::now() < end {
        if let Some(m) = consumer.poll(Duration::from_millis(100)) {
            panic!("{isolation}: more than {n} records in {topic}: {:?}", m.unwrap().payload().map(String::from_utf8_lossy));
        }
    }
    out
}

async fn committed_offset(sock: &mut tokio::net::TcpStream, group: &str, topic: &str) -> i64 {
    let req = OffsetFetchRequest::default()
        .with_group_id(GroupId(s(group)))
        .with_topics(Some(vec![OffsetFetchRequestTopic::default().with_name(TopicName(s(topic))).with_partition_indexes(vec![0])]));
    let r: OffsetFetchResponse = common::call(sock, 9, 5, 1, &req).await;
    r.topics[0].partitions[0].committed_offset
}

/// (latest offset read_uncommitted, latest read_committed) of partition 0.
async fn latest_offsets(sock: &mut tokio::net::TcpStream, topic: &str) -> (i64, i64) {
    let mut out = [0i64; 2];
    for (i, isolation) in [0i8, 1].into_iter().enumerate() {
        let req = ListOffsetsRequest::default().with_replica_id(BrokerId(-1)).with_isolation_level(isolation).with_topics(vec![ListOffsetsTopic::default()
            .with_name(TopicName(s(topic)))
            .with_partitions(vec![ListOffsetsPartition::default().with_partition_index(0).with_timestamp(-1)])]);
        let r: ListOffsetsResponse = common::call(sock, 2, 5, 2, &req).await;
        out[i] = r.topics[0].partitions[0].offset;
    }
    (out[0], out[1])
}

async fn describe(sock: &mut tokio::net::TcpStream, id: &str) -> describe_transactions_response::TransactionState {
    let req = DescribeTransactionsRequest::default().with_transactional_ids(vec![TransactionalId(s(id))]);
    let mut r: DescribeTransactionsResponse = common::call(sock, 65, 0, 3, &req).await;
    r.transaction_states.remove(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn committed_and_aborted_transactions_across_partitions_and_offsets() {
    let dir = tempfile::tempdir().unwrap();
    let broker = common::start(common::args(dir.path())).await;
    let addr = broker.kafka_addr;
    common::create_topic(addr, "txn.out", 3).await;
    common::create_topic(addr, "txn.in", 1).await;
    let mut sock = tokio::net::TcpStream::connect(addr).await.unwrap();

    let producer = tokio::task::spawn_blocking(move || {
        let p = txn_producer(addr, "txn-app", 60_000);
        // A consumer of the group whose offsets the transactions commit.
        let mut cfg = common::consumer_config(addr);
        cfg.set("group.id", "txn-app-group");
        let consumer: BaseConsumer = cfg.create().unwrap();
        let meta = consumer.group_metadata().unwrap();
        let offsets = |o: i64| {
            let mut tpl = TopicPartitionList::new();
            tpl.add_partition_offset("txn.in", 0, rdkafka::Offset::Offset(o)).unwrap();
            tpl
        };
        p.begin_transaction().unwrap();
        for i in 0..30 {
            send(&p, "txn.out", i % 3, &format!("commit-{i}"));
        }
        p.send_offsets_to_transaction(&offsets(5), &meta, Duration::from_secs(30)).unwrap();
        p.commit_transaction(Duration::from_secs(30)).unwrap();

        p.begin_transaction().unwrap();
        for i in 0..30 {
            send(&p, "txn.out", i % 3, &format!("abort-{i}"));
        }
        p.send_offsets_to_transaction(&offsets(9), &meta, Duration::from_secs(30)).unwrap();
        p.flush(Duration::from_secs(30)).unwrap();
        (p, consumer, meta)
    })
    .await
    .unwrap();
    // While the second transaction is open (its records written): the
    // coordinator shows it, and read_committed's end stops before it.
    let d = describe(&mut sock, "txn-app").await;
    assert_eq!((d.error_code, d.transaction_state.as_str()), (0, "Ongoing"));
    let mut parts: Vec<(String, Vec<i32>)> = d.topics.iter().map(|t| (t.topic.0.to_string(), t.partitions.clone())).collect();
    parts.sort();
    assert_eq!(parts, vec![("txn.out".to_string(), vec![0, 1, 2])]);
    let (uncommitted, committed) = latest_offsets(&mut sock, "txn.out").await;
    // Partition 0: 10 committed records + a commit marker, then 10 open.
    assert_eq!((uncommitted, committed), (21, 11));
    let listed: ListTransactionsResponse = common::call(&mut sock, 66, 1, 4, &ListTransactionsRequest::default().with_state_filters(vec![s("Ongoing"), s("Bogus")]).with_duration_filter(-1)).await;
    assert_eq!(listed.transaction_states.iter().map(|t| t.transactional_id.0.to_string()).collect::<Vec<_>>(), vec!["txn-app"]);
    assert_eq!(listed.unknown_state_filters, vec![s("Bogus")]);

    let producer = tokio::task::spawn_blocking(move || {
        let (p, consumer, meta) = producer;
        p.abort_transaction(Duration::from_secs(30)).unwrap();
        // Committed records after the aborted ones are read past them.
        p.begin_transaction().unwrap();
        for i in 0..3 {
            send(&p, "txn.out", i, &format!("final-{i}"));
        }
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition_offset("txn.in", 0, rdkafka::Offset::Offset(7)).unwrap();
        p.send_offsets_to_transaction(&tpl, &meta, Duration::from_secs(30)).unwrap();
        p.commit_transaction(Duration::from_secs(30)).unwrap();
        drop(consumer);
        p
    })
    .await
    .unwrap();
    assert_eq!(describe(&mut sock, "txn-app").await.transaction_state.as_str(), "CompleteCommit");
    assert_eq!(committed_offset(&mut sock, "txn-app-group", "txn.in").await, 7, "the aborted transaction's offset (9) was dropped");

    let (committed, everything) = tokio::task::spawn_blocking(move || (read_values(addr, "txn.out", 3, "read_committed", 33), read_values(addr, "txn.out", 3, "read_uncommitted", 63))).await.unwrap();
    let mut got = committed.clone();
    got.sort();
    let mut want: Vec<String> = (0..30).map(|i| format!("commit-{i}")).chain((0..3).map(|i| format!("final-{i}"))).collect();
    want.sort();
    assert_eq!(got, want, "read_committed sees exactly the committed records");
    assert_eq!(everything.iter().filter(|v| v.starts_with("abort-")).count(), 30, "read_uncommitted sees the aborted ones too");

    // A second producer with the same transactional id fences the first:
    // the zombie's next transaction fails, fatally, and nothing of it is
    // visible.
    let (zombie_err, fatal) = tokio::task::spawn_blocking(move || {
        let newer = txn_producer(addr, "txn-app", 60_000);
        producer.begin_transaction().unwrap();
        send(&producer, "txn.out", 0, "zombie");
        let r = producer.commit_transaction(Duration::from_secs(30));
        drop(newer);
        match r {
            Err(KafkaError::Transaction(e)) => (e.to_string(), e.is_fatal()),
            other => panic!("the zombie's commit went through: {other:?}"),
        }
    })
    .await
    .unwrap();
    assert!(fatal, "fenced is fatal: {zombie_err}");
    assert!(zombie_err.to_lowercase().contains("fenced") || zombie_err.contains("epoch"), "{zombie_err}");
    let all = tokio::task::spawn_blocking(move || read_values(addr, "txn.out", 3, "read_uncommitted", 63)).await.unwrap();
    assert!(!all.iter().any(|v| v == "zombie"), "the zombie's record was refused");
    broker.shutdown().await;
}

/// A broker killed with -9 while a transaction is open: at restart the
/// transaction is aborted, read_committed readers get what follows, and
/// the coordinator says how it ended.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_open_transaction_is_aborted_when_the_broker_restarts() {
    let dir = tempfile::tempdir().unwrap();
    let child = common::ChildBroker::spawn(dir.path(), &[]);
    let addr = child.kafka;
    common::create_topic(addr, "txn.crash", 1).await;
    let producer = tokio::task::spawn_blocking(move || {
        let p = txn_producer(addr, "crashy", 60_000);
        p.begin_transaction().unwrap();
        send(&p, "txn.crash", 0, "kept");
        p.commit_transaction(Duration::from_secs(30)).unwrap();
        p.begin_transaction().unwrap();
        for i in 0..10 {
            send(&p, "txn.crash", 0, &format!("open-{i}"));
        }
        // Offsets of the open transaction must not be committed either.
        let mut cfg = common::consumer_config(addr);
        cfg.set("group.id", "crashy-group");
        let consumer: BaseConsumer = cfg.create().unwrap();
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition_offset("txn.crash", 0, rdkafka::Offset::Offset(3)).unwrap();
        p.send_offsets_to_transaction(&tpl, &consumer.group_metadata().unwrap(), Duration::from_secs(30)).unwrap();
        p.flush(Duration::from_secs(30)).unwrap();
        p
    })
    .await
    .unwrap();
    child.kill9();
    // The old producer is left behind; its transaction must not be.
    drop(producer);
    let child = common::ChildBroker::spawn(dir.path(), &[]);
    let addr = child.kafka;
    let mut sock = tokio::net::TcpStream::connect(addr).await.unwrap();
    let d = describe(&mut sock, "crashy").await;
    assert_eq!((d.error_code, d.transaction_state.as_str()), (0, "CompleteAbort"));
    let (uncommitted, committed) = latest_offsets(&mut sock, "txn.crash").await;
    assert_eq!(committed, uncommitted, "nothing is open: the stable offset is the end");
    assert_eq!(committed_offset(&mut sock, "crashy-group", "txn.crash").await, -1, "the open transaction's offsets were dropped");
    tokio::task::spawn_blocking(move || {
        let mut cfg = common::producer_config(addr, "all");
        cfg.set("enable.idempotence", "true");
        let p: Txp = cfg.create().unwrap();
        send(&p, "txn.crash", 0, "after");
        p.flush(Duration::from_secs(30)).unwrap();
        let seen = read_values(addr, "txn.crash", 1, "read_committed", 2);
        assert_eq!(seen, vec!["kept", "after"]);
    })
    .await
    .unwrap();
    child.terminate();
}

/// A transaction open past its timeout is aborted by the coordinator.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transaction_past_its_timeout_is_aborted() {
    let dir = tempfile::tempdir().unwrap();
    let mut args = common::args(dir.path());
    args.transaction_timeout_check_ms = Some(100);
    let broker = common::start(args).await;
    let addr = broker.kafka_addr;
    common::create_topic(addr, "txn.slow", 1).await;
    let p = tokio::task::spawn_blocking(move || {
        let p = txn_producer(addr, "slowpoke", 1_000);
        p.begin_transaction().unwrap();
        send(&p, "txn.slow", 0, "late");
        p.flush(Duration::from_secs(10)).unwrap();
        p
    })
    .await
    .unwrap();
    let mut sock = tokio::net::TcpStream::connect(addr).await.unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let d = describe(&mut sock, "slowpoke").await;
        if d.transaction_state.as_str() == "CompleteAbort" {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "still {}", d.transaction_state.as_str());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (uncommitted, committed) = latest_offsets(&mut sock, "txn.slow").await;
    assert_eq!((uncommitted, committed), (2, 2), "the record and the abort marker, nothing open");
    // The producer's epoch was bumped: its commit is refused.
    let r = tokio::task::spawn_blocking(move || p.commit_transaction(Duration::from_secs(10))).await.unwrap();
    assert!(r.is_err(), "a timed-out transaction cannot commit");
    broker.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_coordinator_refuses_bad_requests_with_kafkas_codes() {
    let dir = tempfile::tempdir().unwrap();
    let broker = common::start(common::args(dir.path())).await;
    let addr = broker.kafka_addr;
    common::create_topic(addr, "txn.wire", 2).await;
    let mut sock = tokio::net::TcpStream::connect(addr).await.unwrap();
    let mut id = 10;
    let mut next = || {
        id += 1;
        id
    };
    let tid = |v: &str| TransactionalId(s(v));
    let init = |timeout: i32| InitProducerIdRequest::default().with_transactional_id(Some(tid("wire"))).with_transaction_timeout_ms(timeout);
    let r: InitProducerIdResponse = common::call(&mut sock, 22, 4, next(), &init(0)).await;
    assert_eq!(r.error_code, 50, "INVALID_TRANSACTION_TIMEOUT");
    let r: InitProducerIdResponse = common::call(&mut sock, 22, 4, next(), &init(3_600_000)).await;
    assert_eq!(r.error_code, 50, "past transaction.max.timeout.ms");
    let r: InitProducerIdResponse = common::call(&mut sock, 22, 4, next(), &init(60_000)).await;
    assert_eq!(r.error_code, 0);
    let (pid, epoch) = (r.producer_id, r.producer_epoch);
    // Re-init bumps the epoch of the same producer id.
    let r: InitProducerIdResponse = common::call(&mut sock, 22, 4, next(), &init(60_000)).await;
    assert_eq!((r.producer_id, r.producer_epoch), (pid, epoch + 1));
    let epoch = epoch + 1;
    // KIP-360 re-init naming a stale epoch: fenced.
    let r: InitProducerIdResponse = common::call(&mut sock, 22, 4, next(), &init(60_000).with_producer_id(pid).with_producer_epoch(epoch - 1)).await;
    assert_eq!(r.error_code, 90, "PRODUCER_FENCED");

    let add = |txn: &str, pid: ProducerId, epoch: i16, topic: &str, parts: Vec<i32>| {
        AddPartitionsToTxnRequest::default()
            .with_v3_and_below_transactional_id(tid(txn))
            .with_v3_and_below_producer_id(pid)
            .with_v3_and_below_producer_epoch(epoch)
            .with_v3_and_below_topics(vec![AddPartitionsToTxnTopic::default().with_name(TopicName(s(topic))).with_partitions(parts)])
    };
    let codes = |r: &AddPartitionsToTxnResponse| r.results_by_topic_v3_and_below.iter().flat_map(|t| t.results_by_partition.iter().map(|p| p.partition_error_code)).collect::<Vec<_>>();
    let r: AddPartitionsToTxnResponse = common::call(&mut sock, 24, 3, next(), &add("nobody", pid, epoch, "txn.wire", vec![0])).await;
    assert_eq!(codes(&r), vec![49], "INVALID_PRODUCER_ID_MAPPING");
    let r: AddPartitionsToTxnResponse = common::call(&mut sock, 24, 3, next(), &add("wire", pid, epoch - 1, "txn.wire", vec![0])).await;
    assert_eq!(codes(&r), vec![90], "PRODUCER_FENCED");
    let r: AddPartitionsToTxnResponse = common::call(&mut sock, 24, 1, next(), &add("wire", pid, epoch - 1, "txn.wire", vec![0])).await;
    assert_eq!(codes(&r), vec![47], "INVALID_PRODUCER_EPOCH before KIP-588");
    let r: AddPartitionsToTxnResponse = common::call(&mut sock, 24, 3, next(), &add("wire", pid, epoch, "txn.wire", vec![0, 7])).await;
    assert_eq!(codes(&r), vec![55, 3], "OPERATION_NOT_ATTEMPTED, UNKNOWN_TOPIC_OR_PARTITION");
    // EndTxn with nothing begun.
    let end = |commit: bool| EndTxnRequest::default().with_transactional_id(tid("wire")).with_producer_id(pid).with_producer_epoch(epoch).with_committed(commit);
    let r: EndTxnResponse = common::call(&mut sock, 26, 3, next(), &end(true)).await;
    assert_eq!(r.error_code, 48, "INVALID_TXN_STATE");

    // A transactional batch for a partition the transaction did not add.
    let produce = |partition: i32, seq: i32| txn_produce("wire", "txn.wire", partition, txn_batch(pid.0, epoch, seq, "t"));
    let r: AddPartitionsToTxnResponse = common::call(&mut sock, 24, 3, next(), &add("wire", pid, epoch, "txn.wire", vec![0])).await;
    assert_eq!(codes(&r), vec![0]);
    let r: ProduceResponse = common::call(&mut sock, 0, 8, next(), &produce(1, 0)).await;
    assert_eq!(r.responses[0].partition_responses[0].error_code, 48, "INVALID_TXN_STATE: partition 1 is not in the transaction");
    let r: ProduceResponse = common::call(&mut sock, 0, 8, next(), &produce(0, 0)).await;
    assert_eq!(r.responses[0].partition_responses[0].error_code, 0);
    // v4+: the batched form, and verify_only.
    let batched = |verify_only: bool, parts: Vec<i32>| {
        AddPartitionsToTxnRequest::default().with_transactions(vec![AddPartitionsToTxnTransaction::default()
            .with_transactional_id(tid("wire"))
            .with_producer_id(pid)
            .with_producer_epoch(epoch)
            .with_verify_only(verify_only)
            .with_topics(vec![AddPartitionsToTxnTopic::default().with_name(TopicName(s("txn.wire"))).with_partitions(parts)])])
    };
    let r: AddPartitionsToTxnResponse = common::call(&mut sock, 24, 4, next(), &batched(true, vec![0, 1])).await;
    let v: Vec<i16> = r.results_by_transaction[0].topic_results[0].results_by_partition.iter().map(|p| p.partition_error_code).collect();
    assert_eq!(v, vec![0, 48], "partition 0 is in the transaction, 1 is not");
    let r: AddPartitionsToTxnResponse = common::call(&mut sock, 24, 5, next(), &batched(false, vec![1])).await;
    assert_eq!(r.results_by_transaction[0].topic_results[0].results_by_partition[0].partition_error_code, 0);
    let r: ProduceResponse = common::call(&mut sock, 0, 8, next(), &produce(1, 0)).await;
    assert_eq!(r.responses[0].partition_responses[0].error_code, 0, "added now");
    // TxnOffsetCommit naming a member the group does not have.
    let toc = TxnOffsetCommitRequest::default()
        .with_transactional_id(tid("wire"))
        .with_group_id(GroupId(s("wire-group")))
        .with_producer_id(pid)
        .with_producer_epoch(epoch)
        .with_generation_id(3)
        .with_member_id(s("nobody"))
        .with_topics(vec![txn_offset_commit_request::TxnOffsetCommitRequestTopic::default()
            .with_name(TopicName(s("txn.wire")))
            .with_partitions(vec![txn_offset_commit_request::TxnOffsetCommitRequestPartition::default().with_partition_index(0).with_committed_offset(1)])]);
    let r: TxnOffsetCommitResponse = common::call(&mut sock, 28, 3, next(), &toc).await;
    assert_ne!(r.topics[0].partitions[0].error_code, 0, "an unknown member is refused");
    // Commit; a retried commit is fine, an abort after it is not.
    let r: EndTxnResponse = common::call(&mut sock, 26, 3, next(), &end(true)).await;
    assert_eq!(r.error_code, 0);
    let r: EndTxnResponse = common::call(&mut sock, 26, 3, next(), &end(true)).await;
    assert_eq!(r.error_code, 0, "a retry of the commit");
    let r: EndTxnResponse = common::call(&mut sock, 26, 3, next(), &end(false)).await;
    assert_eq!(r.error_code, 48, "INVALID_TXN_STATE");
    // Both partitions got a commit marker: stable offset = end.
    for p in 0..2 {
        let (u, c) = {
            let req = ListOffsetsRequest::default().with_isolation_level(1).with_topics(vec![ListOffsetsTopic::default()
                .with_name(TopicName(s("txn.wire")))
                .with_partitions(vec![ListOffsetsPartition::default().with_partition_index(p).with_timestamp(-1)])]);
            let r: ListOffsetsResponse = common::call(&mut sock, 2, 5, next(), &req).await;
            (2, r.topics[0].partitions[0].offset)
        };
        assert_eq!(c, u, "partition {p}: the record and its marker are stable");
    }
    let d = describe(&mut sock, "unknown-id").await;
    assert_eq!(d.error_code, 105, "TRANSACTIONAL_ID_NOT_FOUND");
    broker.shutdown().await;
}

/// A transactional batch of producer `pid` at `epoch`, first sequence `seq`.
fn txn_batch(pid: i64, epoch: i16, seq: i32, value: &str) -> bytes::Bytes {
    let mut b = common::producer_batch(pid, epoch, seq, &[value.as_bytes()]).to_vec();
    b[22] |= 0x10; // the transactional attribute bit
    let crc = crc32c::crc32c(&b[21..]);
    b[17..21].copy_from_slice(&crc.to_be_bytes());
    bytes::Bytes::from(b)
}

/// A Produce (acks=all) of `batch` to one partition, under transactional id `txn`.
fn txn_produce(txn: &str, topic: &str, partition: i32, batch: bytes::Bytes) -> ProduceRequest {
    ProduceRequest::default().with_transactional_id(Some(TransactionalId(s(txn)))).with_acks(-1).with_timeout_ms(5000).with_topic_data(vec![TopicProduceData::default()
        .with_name(TopicName(s(topic)))
        .with_partition_data(vec![PartitionProduceData::default().with_index(partition).with_records(Some(batch))])])
}

/// Transactions v2 (KIP-890 part 2) as a Kafka 4 producer speaks them:
/// the broker says `transaction.version` 2, partitions join on Produce v12
/// and groups on TxnOffsetCommit v5 (no AddPartitionsToTxn, no
/// AddOffsetsToTxn), every EndTxn v5 moves the epoch and answers it,
/// retries are told from new ends by their epoch, a late batch of an ended
/// transaction is refused instead of joining the next, and an abort of a
/// transaction that wrote nothing ends it. librdkafka (up to 2.15) and
/// kafkajs do not speak v2; the Java client's run is in the compat suite.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transactions_v2_on_the_wire() {
    let dir = tempfile::tempdir().unwrap();
    let broker = common::start(common::args(dir.path())).await;
    let addr = broker.kafka_addr;
    common::create_topic(addr, "txn2.wire", 2).await;
    let mut sock = tokio::net::TcpStream::connect(addr).await.unwrap();
    let mut id = 100;
    let mut next = || {
        id += 1;
        id
    };
    let tid = || TransactionalId(s("v2"));

    let versions: ApiVersionsResponse = common::call(&mut sock, 18, 4, next(), &ApiVersionsRequest::default().with_client_software_name(s("t")).with_client_software_version(s("1"))).await;
    let tv = versions.finalized_features.iter().find(|f| f.name.as_str() == "transaction.version").expect("transaction.version is finalized");
    assert_eq!(tv.max_version_level, 2);
    assert!(versions.finalized_features_epoch > 0, "clients read the levels only from an epoch >= 0");
    let max = |key: i16| versions.api_keys.iter().find(|k| k.api_key == key).unwrap().max_version;
    assert_eq!((max(26), max(28)), (5, 5), "EndTxn and TxnOffsetCommit v5");

    let r: InitProducerIdResponse = common::call(&mut sock, 22, 5, next(), &InitProducerIdRequest::default().with_transactional_id(Some(tid())).with_transaction_timeout_ms(60_000)).await;
    assert_eq!(r.error_code, 0);
    let (pid, e0) = (r.producer_id, r.producer_epoch);
    let produce = |partition: i32, epoch: i16, seq: i32, value: &str| txn_produce("v2", "txn2.wire", partition, txn_batch(pid.0, epoch, seq, value));
    let code = |r: &ProduceResponse| r.responses[0].partition_responses[0].error_code;
    let end = |epoch: i16, commit: bool| EndTxnRequest::default().with_transactional_id(tid()).with_producer_id(pid).with_producer_epoch(epoch).with_committed(commit);

    // Produce v12 joins partition 0 to the transaction; below v12 a
    // transaction still has to add its partitions first.
    let r: ProduceResponse = common::call(&mut sock, 0, 12, next(), &produce(0, e0, 0, "one")).await;
    assert_eq!(code(&r), 0, "joined by the produce");
    let r: ProduceResponse = common::call(&mut sock, 0, 11, next(), &produce(1, e0, 0, "v11")).await;
    assert_eq!(code(&r), 48, "INVALID_TXN_STATE: v11 does not join");
    let r: ProduceResponse = common::call(&mut sock, 0, 12, next(), &produce(0, e0, 1, "two")).await;
    assert_eq!(code(&r), 0);
    let d = describe(&mut sock, "v2").await;
    assert_eq!((d.transaction_state.as_str(), d.topics.len(), d.topics[0].partitions.clone()), ("Ongoing", 1, vec![0]));
    // TxnOffsetCommit v5 brings the group in, without AddOffsetsToTxn.
    let toc = |version_epoch: i16, offset: i64| {
        TxnOffsetCommitRequest::default()
            .with_transactional_id(tid())
            .with_group_id(GroupId(s("v2-group")))
            .with_producer_id(pid)
            .with_producer_epoch(version_epoch)
            .with_generation_id(-1)
            .with_topics(vec![txn_offset_commit_request::TxnOffsetCommitRequestTopic::default()
                .with_name(TopicName(s("txn2.wire")))
                .with_partitions(vec![txn_offset_commit_request::TxnOffsetCommitRequestPartition::default().with_partition_index(0).with_committed_offset(offset)])])
    };
    let r: TxnOffsetCommitResponse = common::call(&mut sock, 28, 5, next(), &toc(e0, 42)).await;
    assert_eq!(r.topics[0].partitions[0].error_code, 0);

    // Commit: the answer carries the next epoch.
    let r: EndTxnResponse = common::call(&mut sock, 26, 5, next(), &end(e0, true)).await;
    assert_eq!((r.error_code, r.producer_id, r.producer_epoch), (0, pid, e0 + 1));
    assert_eq!(committed_offset(&mut sock, "v2-group", "txn2.wire").await, 42);
    // A retry (the epoch before the bump) is answered the same; an abort
    // of what was committed, or a commit at the new epoch, is not.
    let r: EndTxnResponse = common::call(&mut sock, 26, 5, next(), &end(e0, true)).await;
    assert_eq!((r.error_code, r.producer_id, r.producer_epoch), (0, pid, e0 + 1), "a retried commit");
    let r: EndTxnResponse = common::call(&mut sock, 26, 5, next(), &end(e0, false)).await;
    assert_eq!((r.error_code, r.producer_epoch), (48, -1), "INVALID_TXN_STATE");
    let r: EndTxnResponse = common::call(&mut sock, 26, 5, next(), &end(e0 + 1, true)).await;
    assert_eq!(r.error_code, 48, "nothing to commit at the new epoch");
    // The point of KIP-890: a late batch of the committed transaction is
    // refused, not taken into the next one.
    let (end_before, _) = latest_offsets(&mut sock, "txn2.wire").await;
    let r: ProduceResponse = common::call(&mut sock, 0, 12, next(), &produce(0, e0, 2, "late")).await;
    assert_eq!(code(&r), 47, "INVALID_PRODUCER_EPOCH");
    // The partition refuses it on its own too (v11 does not ask the
    // coordinator): the commit marker carried the new epoch.
    let r: ProduceResponse = common::call(&mut sock, 0, 11, next(), &produce(0, e0, 2, "late")).await;
    assert_eq!(code(&r), 47, "INVALID_PRODUCER_EPOCH, not INVALID_TXN_STATE");
    assert_eq!(latest_offsets(&mut sock, "txn2.wire").await.0, end_before, "nothing appended");

    // The next transaction, at the new epoch with sequences from 0, aborted.
    let e1 = e0 + 1;
    let r: ProduceResponse = common::call(&mut sock, 0, 12, next(), &produce(0, e1, 3, "gap")).await;
    assert_eq!(code(&r), 45, "OUT_OF_ORDER_SEQUENCE_NUMBER: a new epoch starts at 0");
    let r: ProduceResponse = common::call(&mut sock, 0, 12, next(), &produce(0, e1, 0, "aborted")).await;
    assert_eq!(code(&r), 0);
    let r: TxnOffsetCommitResponse = common::call(&mut sock, 28, 5, next(), &toc(e1, 99)).await;
    assert_eq!(r.topics[0].partitions[0].error_code, 0);
    let r: EndTxnResponse = common::call(&mut sock, 26, 5, next(), &end(e1, false)).await;
    assert_eq!((r.error_code, r.producer_epoch), (0, e1 + 1));
    assert_eq!(committed_offset(&mut sock, "v2-group", "txn2.wire").await, 42, "the aborted offset is dropped");
    // An abort with nothing written (a client that added partitions it
    // never reached) ends a transaction too, and moves the epoch; a stale
    // epoch is fenced.
    let e2 = e1 + 1;
    let r: EndTxnResponse = common::call(&mut sock, 26, 5, next(), &end(e2, false)).await;
    assert_eq!((r.error_code, r.producer_epoch), (0, e2 + 1), "an empty abort");
    let r: EndTxnResponse = common::call(&mut sock, 26, 5, next(), &end(e0, false)).await;
    assert_eq!(r.error_code, 90, "PRODUCER_FENCED");
    let r: EndTxnResponse = common::call(&mut sock, 26, 5, next(), &end(e2 + 1, true)).await;
    assert_eq!(r.error_code, 48, "a commit with nothing begun");
    let r: EndTxnResponse = common::call(&mut sock, 26, 5, next(), &EndTxnRequest::default().with_transactional_id(TransactionalId(s("nobody"))).with_producer_id(pid).with_producer_epoch(e0).with_committed(true)).await;
    assert_eq!((r.error_code, r.producer_id, r.producer_epoch), (49, ProducerId(-1), -1), "INVALID_PRODUCER_ID_MAPPING");
    // A produce of another producer id under this transactional id.
    let other = txn_produce("v2", "txn2.wire", 1, txn_batch(pid.0 + 1000, e2 + 1, 0, "other"));
    let r: ProduceResponse = common::call(&mut sock, 0, 12, next(), &other).await;
    assert_eq!(code(&r), 49, "INVALID_PRODUCER_ID_MAPPING");
    let d = describe(&mut sock, "v2").await;
    assert_eq!((d.transaction_state.as_str(), d.producer_epoch), ("CompleteAbort", e2 + 1));

    // Readers: read_committed sees the committed two, nothing is left open.
    let (u, c) = latest_offsets(&mut sock, "txn2.wire").await;
    assert_eq!(u, c, "no open transaction holds the stable offset back");
    let (committed, everything) = tokio::task::spawn_blocking(move || (read_values(addr, "txn2.wire", 2, "read_committed", 2), read_values(addr, "txn2.wire", 2, "read_uncommitted", 3))).await.unwrap();
    assert_eq!(committed, vec!["one", "two"]);
    assert_eq!(everything, vec!["one", "two", "aborted"]);
    broker.shutdown().await;
}

/// Epochs run out: the end at the last epoch handed out (32,766) writes its
/// markers at 32,767 and the producer goes on under a new producer id —
/// after its own end (transactions v2), after a timeout (the coordinator's
/// fence), and after a restart that finds such an end decided but not
/// finished. Retries and KIP-360 re-inits naming the old id are still
/// recognised; a batch of the old id is refused. The records are moved
/// to their last epochs in the catalog between two runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn epochs_run_out_into_a_new_producer_id() {
    use canopy::meta::{Catalog, TxnRecord, TxnState};
    const LAST: i16 = i16::MAX - 1;
    let dir = tempfile::tempdir().unwrap();
    let mut args = common::args(dir.path());
    args.transaction_timeout_check_ms = Some(100);
    let init = |id: &str, timeout: i32| InitProducerIdRequest::default().with_transactional_id(Some(TransactionalId(s(id)))).with_transaction_timeout_ms(timeout);
    let (pid_a, pid_b) = {
        let broker = common::start(args.clone()).await;
        common::create_topic(broker.kafka_addr, "txn2.ovf", 1).await;
        let mut sock = tokio::net::TcpStream::connect(broker.kafka_addr).await.unwrap();
        let a: InitProducerIdResponse = common::call(&mut sock, 22, 5, 1, &init("ovf", 60_000)).await;
        let b: InitProducerIdResponse = common::call(&mut sock, 22, 5, 2, &init("slow", 1_000)).await;
        broker.shutdown().await;
        (a.producer_id.0, b.producer_id.0)
    };
    let (prepared_old, prepared_next) = {
        let c = Catalog::open(&dir.path().join("catalog")).unwrap();
        for (id, mut rec) in c.txns().unwrap() {
            rec.epoch = if id == "ovf" { LAST - 1 } else { LAST };
            c.put_txn(&id, &rec).unwrap();
        }
        // A commit decided at the last epoch, its end not finished.
        let (old, next) = (c.allocate_producer_id().unwrap(), c.allocate_producer_id().unwrap());
        let rec = TxnRecord {
            producer_id: old,
            epoch: i16::MAX,
            last_epoch: LAST,
            state: TxnState::PrepareCommit,
            timeout_ms: 60_000,
            start_ms: 1,
            update_ms: 1,
            partitions: vec![],
            groups: vec![],
            offsets: vec![],
            ends: vec![],
            previous_producer_id: -1,
            next_producer_id: next,
        };
        c.put_txn("prepared", &rec).unwrap();
        c.flush().unwrap();
        (old, next)
    };
    let broker = common::start(args).await;
    let addr = broker.kafka_addr;
    let mut sock = tokio::net::TcpStream::connect(addr).await.unwrap();
    let mut id = 10;
    let mut next = || {
        id += 1;
        id
    };
    let end = |txn: &str, pid: i64, epoch: i16, commit: bool| EndTxnRequest::default().with_transactional_id(TransactionalId(s(txn))).with_producer_id(ProducerId(pid)).with_producer_epoch(epoch).with_committed(commit);
    let produce = |txn: &str, pid: i64, epoch: i16, seq: i32, value: &str| txn_produce(txn, "txn2.ovf", 0, txn_batch(pid, epoch, seq, value));
    let code = |r: &ProduceResponse| r.responses[0].partition_responses[0].error_code;

    // Finished at start-up, under the next id.
    let d = describe(&mut sock, "prepared").await;
    assert_eq!((d.transaction_state.as_str(), d.producer_id.0, d.producer_epoch), ("CompleteCommit", prepared_next, 0));
    let r: EndTxnResponse = common::call(&mut sock, 26, 5, next(), &end("prepared", prepared_old, LAST, true)).await;
    assert_eq!((r.error_code, r.producer_id.0, r.producer_epoch), (0, prepared_next, 0), "a retry naming the old id");

    // The producer's own ends.
    let r: ProduceResponse = common::call(&mut sock, 0, 12, next(), &produce("ovf", pid_a, LAST - 1, 0, "a")).await;
    assert_eq!(code(&r), 0);
    let r: EndTxnResponse = common::call(&mut sock, 26, 5, next(), &end("ovf", pid_a, LAST - 1, true)).await;
    assert_eq!((r.error_code, r.producer_id.0, r.producer_epoch), (0, pid_a, LAST));
    let r: ProduceResponse = common::call(&mut sock, 0, 12, next(), &produce("ovf", pid_a, LAST, 0, "b")).await;
    assert_eq!(code(&r), 0);
    let r: EndTxnResponse = common::call(&mut sock, 26, 5, next(), &end("ovf", pid_a, LAST, true)).await;
    let new_a = r.producer_id.0;
    assert_eq!((r.error_code, r.producer_epoch), (0, 0));
    assert_ne!(new_a, pid_a, "a new producer id");
    let r: EndTxnResponse = common::call(&mut sock, 26, 5, next(), &end("ovf", pid_a, LAST, true)).await;
    assert_eq!((r.error_code, r.producer_id.0, r.producer_epoch), (0, new_a, 0), "a retry naming the old id and its last epoch");
    // A late batch of the old id at its last epoch: the marker at 32,767
    // fenced it in the partition (v11 skips the coordinator).
    let r: ProduceResponse = common::call(&mut sock, 0, 11, next(), &produce("ovf", pid_a, LAST, 1, "late")).await;
    assert_eq!(code(&r), 47, "INVALID_PRODUCER_EPOCH");
    let r: ProduceResponse = common::call(&mut sock, 0, 12, next(), &produce("ovf", new_a, 0, 0, "c")).await;
    assert_eq!(code(&r), 0);
    let r: EndTxnResponse = common::call(&mut sock, 26, 5, next(), &end("ovf", new_a, 0, true)).await;
    assert_eq!((r.error_code, r.producer_id.0, r.producer_epoch), (0, new_a, 1));

    // A timeout at the last epoch fences by the new id too.
    let r: ProduceResponse = common::call(&mut sock, 0, 12, next(), &produce("slow", pid_b, LAST, 0, "timed out")).await;
    assert_eq!(code(&r), 0);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    let new_b = loop {
        let d = describe(&mut sock, "slow").await;
        if d.transaction_state.as_str() == "CompleteAbort" {
            assert_eq!(d.producer_epoch, 0);
            break d.producer_id.0;
        }
        assert!(tokio::time::Instant::now() < deadline, "still {}", d.transaction_state.as_str());
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_ne!(new_b, pid_b);
    let r: ProduceResponse = common::call(&mut sock, 0, 12, next(), &produce("slow", pid_b, LAST, 1, "after")).await;
    assert_eq!(code(&r), 49, "INVALID_PRODUCER_ID_MAPPING: the timed-out producer cannot go on");
    let r: EndTxnResponse = common::call(&mut sock, 26, 5, next(), &end("slow", pid_b, LAST, false)).await;
    assert_eq!((r.error_code, r.producer_id.0, r.producer_epoch), (0, new_b, 0), "its abort is answered as done, with the new id");
    let r: InitProducerIdResponse = common::call(&mut sock, 22, 5, next(), &init("slow", 1_000).with_producer_id(ProducerId(pid_b)).with_producer_epoch(LAST)).await;
    assert_eq!((r.error_code, r.producer_id.0, r.producer_epoch), (0, new_b, 1), "KIP-360 naming the old id at its last epoch");

    let (u, c) = latest_offsets(&mut sock, "txn2.ovf").await;
    assert_eq!(u, c, "nothing left open");
    let committed = tokio::task::spawn_blocking(move || read_values(addr, "txn2.ovf", 1, "read_committed", 3)).await.unwrap();
    assert_eq!(committed, vec!["a", "b", "c"]);
    broker.shutdown().await;
}

/// WriteTxnMarkers (v1, the brokers' request, and what
/// `kafka-transactions abort` sends for a hanging transaction): an abort
/// marker written to the partition ends the transaction there
/// (read_committed readers pass it; its records stay hidden), partitions
/// that do not exist are UNKNOWN_TOPIC_OR_PARTITION, and once a newer
/// producer of the same id has moved the epoch at the partition, a
/// marker of the old epoch is INVALID_PRODUCER_EPOCH.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn write_txn_markers_ends_a_hanging_transaction() {
    use kafka_protocol::messages::write_txn_markers_request::{WritableTxnMarker, WritableTxnMarkerTopic};
    let dir = tempfile::tempdir().unwrap();
    let broker = common::start(common::args(dir.path())).await;
    let addr = broker.kafka_addr;
    common::create_topic(addr, "wtm.t", 1).await;
    // A transaction left open: its producer goes quiet.
    let hanging = tokio::task::spawn_blocking(move || {
        let p = txn_producer(addr, "hangs", 60_000);
        p.begin_transaction().unwrap();
        for i in 0..3 {
            send(&p, "wtm.t", 0, &format!("open-{i}"));
        }
        p.flush(Duration::from_secs(30)).unwrap();
        p
    })
    .await
    .unwrap();
    let mut sock = tokio::net::TcpStream::connect(addr).await.unwrap();
    assert_eq!(latest_offsets(&mut sock, "wtm.t").await, (3, 0), "read_committed is held at the open transaction");
    let d = describe(&mut sock, "hangs").await;
    let (pid, epoch) = (d.producer_id.0, d.producer_epoch);
    let marked = |commit: bool, epoch: i16, coordinator_epoch: i32, topics: Vec<(&str, Vec<i32>)>| {
        let topics = topics.into_iter().map(|(t, ps)| WritableTxnMarkerTopic::default().with_name(TopicName(s(t))).with_partition_indexes(ps)).collect();
        WriteTxnMarkersRequest::default().with_markers(vec![WritableTxnMarker::default().with_producer_id(ProducerId(pid)).with_producer_epoch(epoch).with_transaction_result(commit).with_coordinator_epoch(coordinator_epoch).with_topics(topics)])
    };
    let markers = |commit: bool, epoch: i16, topics: Vec<(&str, Vec<i32>)>| marked(commit, epoch, 3, topics);
    let codes = |r: &WriteTxnMarkersResponse| -> Vec<(String, i32, i16)> { r.markers.iter().flat_map(|m| m.topics.iter().flat_map(|t| t.partitions.iter().map(|p| (t.name.to_string(), p.partition_index, p.error_code)))).collect() };
    let r: WriteTxnMarkersResponse = common::call(&mut sock, 27, 1, 4, &markers(false, epoch, vec![("wtm.t", vec![0, 0, 5]), ("no.such", vec![0])])).await;
    assert_eq!(r.markers[0].producer_id.0, pid);
    assert_eq!(codes(&r), vec![("wtm.t".into(), 0, 0), ("wtm.t".into(), 0, 0), ("wtm.t".into(), 5, 3), ("no.such".into(), 0, 3)]);
    assert_eq!(latest_offsets(&mut sock, "wtm.t").await, (4, 4), "one marker, past which read_committed goes");
    // A marker from an older coordinator than the last one's (a deposed
    // one, late) is refused, and writes nothing.
    let r: WriteTxnMarkersResponse = common::call(&mut sock, 27, 1, 6, &marked(true, epoch, 2, vec![("wtm.t", vec![0])])).await;
    assert_eq!(codes(&r), vec![("wtm.t".into(), 0, 52)], "TRANSACTION_COORDINATOR_FENCED");
    assert_eq!(latest_offsets(&mut sock, "wtm.t").await, (4, 4));
    // DescribeProducers shows the coordinator epoch, which
    // `kafka-transactions abort` sends back on its marker.
    {
        use kafka_protocol::messages::describe_producers_request::TopicRequest;
        use kafka_protocol::messages::{DescribeProducersRequest, DescribeProducersResponse};
        let req = DescribeProducersRequest::default().with_topics(vec![TopicRequest::default().with_name(TopicName(s("wtm.t"))).with_partition_indexes(vec![0])]);
        let d: DescribeProducersResponse = common::call(&mut sock, 61, 0, 7, &req).await;
        let producers = &d.topics[0].partitions[0].active_producers;
        assert_eq!(producers.iter().map(|a| (a.producer_id.0, a.coordinator_epoch)).collect::<Vec<_>>(), vec![(pid, 3)]);
    }
    // A newer producer of the id fences the old one (its abort marker
    // moves the epoch at the partition): an old-epoch marker is refused.
    let newer = tokio::task::spawn_blocking(move || txn_producer(addr, "hangs", 60_000)).await.unwrap();
    let r: WriteTxnMarkersResponse = common::call(&mut sock, 27, 1, 5, &markers(true, epoch, vec![("wtm.t", vec![0])])).await;
    assert_eq!(codes(&r), vec![("wtm.t".into(), 0, 47)], "INVALID_PRODUCER_EPOCH");
    let end = latest_offsets(&mut sock, "wtm.t").await;
    assert_eq!(end.0, end.1, "nothing open");
    // The hanging records were aborted: read_committed sees only what
    // comes after.
    tokio::task::spawn_blocking(move || {
        newer.begin_transaction().unwrap();
        send(&newer, "wtm.t", 0, "after");
        newer.commit_transaction(Duration::from_secs(30)).unwrap();
        assert_eq!(read_values(addr, "wtm.t", 1, "read_committed", 1), vec!["after"]);
        drop(hanging);
    })
    .await
    .unwrap();
    broker.shutdown().await;
}
