//! Hostile and broken clients against a real broker: a child process, so
//! its memory is its own and an abort is seen as an exit.
//!
//! Every case runs under a [`Siege`]: a bystander connection asks
//! ApiVersions and Metadata every 100 ms throughout and must be answered
//! within a second each time; the broker's resident memory, sampled at the
//! same pace, must not grow by 128 MiB over its level before the attack;
//! and the broker must still be running at the end. The attacker gets
//! Kafka's error or a closed connection; each case says which.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::{BufMut, Bytes, BytesMut};
use kafka_protocol::messages::add_partitions_to_txn_request::AddPartitionsToTxnTopic;
use kafka_protocol::messages::create_topics_request::CreatableTopic;
use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
use kafka_protocol::messages::join_group_request::JoinGroupRequestProtocol;
use kafka_protocol::messages::metadata_request::MetadataRequestTopic;
use kafka_protocol::messages::offset_delete_request::{OffsetDeleteRequestPartition, OffsetDeleteRequestTopic};
use kafka_protocol::messages::txn_offset_commit_request::{TxnOffsetCommitRequestPartition, TxnOffsetCommitRequestTopic};
use kafka_protocol::messages::*;
use kafka_protocol::protocol::{Decodable, StrBytes};

use crate::common::{self, encode, ChildBroker, Raw};

/// Resident memory may grow by less than this during an attack.
const RSS_GROWTH_MAX: u64 = 128 << 20;
/// The bystander's ApiVersions + Metadata must be answered within this.
const BYSTANDER_MAX: Duration = Duration::from_secs(1);

struct Watch {
    rounds: usize,
    worst: Duration,
    peak_rss: u64,
    failure: Option<String>,
}

/// A broker under attack, watched by a bystander.
struct Siege {
    broker: ChildBroker,
    baseline_rss: u64,
    stop: Arc<AtomicBool>,
    watcher: tokio::task::JoinHandle<Watch>,
}

impl Siege {
    async fn start(extra: &[&str]) -> (Siege, tempfile::TempDir) {
        let dir = tempfile::tempdir().unwrap();
        let broker = ChildBroker::spawn(dir.path(), extra);
        let pid = broker.child.id();
        // Warm up the bystander's path once before the baseline.
        let mut bystander = Raw::connect(broker.kafka).await;
        bystander_round(&mut bystander).await.expect("bystander answered before the attack");
        let baseline_rss = common::proc_status_bytes(pid, "VmRSS:");
        let stop = Arc::new(AtomicBool::new(false));
        let watcher = tokio::spawn(watch(bystander, pid, stop.clone()));
        (Siege { broker, baseline_rss, stop, watcher }, dir)
    }

    fn addr(&self) -> SocketAddr {
        self.broker.kafka
    }

    /// Ends the watch and checks what it saw; returns the broker, still up.
    async fn finish(mut self) -> ChildBroker {
        // One more round after the attack, so the end state is seen too.
        tokio::time::sleep(Duration::from_millis(300)).await;
        self.stop.store(true, Ordering::Release);
        let w = self.watcher.await.unwrap();
        assert!(self.broker.child.try_wait().unwrap().is_none(), "the broker exited during the attack");
        if let Some(f) = w.failure {
            panic!("bystander: {f}");
        }
        assert!(w.rounds > 0, "the bystander ran");
        assert!(w.worst < BYSTANDER_MAX, "a bystander round took {:?}", w.worst);
        let grown = w.peak_rss.saturating_sub(self.baseline_rss);
        assert!(grown < RSS_GROWTH_MAX, "resident memory grew by {} MiB (from {} MiB)", grown >> 20, self.baseline_rss >> 20);
        eprintln!("siege: {} bystander rounds, worst {:?}, RSS +{} MiB", w.rounds, w.worst, grown >> 20);
        self.broker
    }
}

async fn bystander_round(c: &mut Raw) -> Result<(), String> {
    let mut r = c.call(18, 3, &[1, 1, 0], false).await.ok_or("ApiVersions: connection closed")?;
    let av = ApiVersionsResponse::decode(&mut r, 3).map_err(|e| e.to_string())?;
    if av.error_code != 0 {
        return Err(format!("ApiVersions error {}", av.error_code));
    }
    let req = MetadataRequest::default().with_topics(Some(Vec::new()));
    let mut r = c.call(3, 12, &encode(&req, 12), true).await.ok_or("Metadata: connection closed")?;
    let md = MetadataResponse::decode(&mut r, 12).map_err(|e| e.to_string())?;
    if md.brokers.len() != 1 {
        return Err("Metadata lists no broker".into());
    }
    Ok(())
}

async fn watch(mut c: Raw, pid: u32, stop: Arc<AtomicBool>) -> Watch {
    let mut w = Watch { rounds: 0, worst: Duration::ZERO, peak_rss: 0, failure: None };
    while !stop.load(Ordering::Acquire) {
        let t = Instant::now();
        match tokio::time::timeout(Duration::from_secs(20), bystander_round(&mut c)).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                w.failure = Some(e);
                break;
            }
            Err(_) => {
                w.failure = Some("no answer within 20 s".into());
                break;
            }
        }
        w.worst = w.worst.max(t.elapsed());
        w.rounds += 1;
        if let Ok(s) = std::fs::read_to_string(format!("/proc/{pid}/status")) {
            if let Some(kb) = s.lines().find(|l| l.starts_with("VmRSS:")).and_then(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok()) {
                w.peak_rss = w.peak_rss.max(kb * 1024);
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    w
}

fn name(s: &str) -> StrBytes {
    StrBytes::from_string(s.to_owned())
}

fn topic(s: &str) -> TopicName {
    TopicName(name(s))
}

/// Sends a request and decodes its answer; `None` if the broker closed.
async fn ask<Resp: Decodable>(c: &mut Raw, key: ApiKey, version: i16, body: &[u8]) -> Option<Resp> {
    let flexible = key.response_header_version(version) >= 1;
    let mut r = tokio::time::timeout(Duration::from_secs(60), c.call(key as i16, version, body, flexible)).await.expect("answered or closed within 60 s")?;
    Some(Resp::decode(&mut r, version).expect("a well-formed response"))
}

async fn create_topic(c: &mut Raw, t: &str, partitions: i32) {
    let req = CreateTopicsRequest::default().with_timeout_ms(30_000).with_topics(vec![CreatableTopic::default().with_name(topic(t)).with_num_partitions(partitions).with_replication_factor(1)]);
    let r: CreateTopicsResponse = ask(c, ApiKey::CreateTopics, 5, &encode(&req, 5)).await.expect("CreateTopics answered");
    assert_eq!(r.topics[0].error_code, 0, "create {t}: {:?}", r.topics[0].error_message);
}

async fn join(c: &mut Raw, group: &str, member: &str, protocols: Vec<(String, Bytes)>) -> JoinGroupResponse {
    let req = JoinGroupRequest::default()
        .with_group_id(GroupId(name(group)))
        .with_session_timeout_ms(30_000)
        .with_rebalance_timeout_ms(30_000)
        .with_member_id(name(member))
        .with_protocol_type(name("consumer"))
        .with_protocols(protocols.into_iter().map(|(n, m)| JoinGroupRequestProtocol::default().with_name(name(&n)).with_metadata(m)).collect());
    ask(c, ApiKey::JoinGroup, 5, &encode(&req, 5)).await.expect("JoinGroup answered")
}

/// Joins `group` as its only member (two steps: JoinGroup v4+ hands out an
/// id first) with one protocol carrying `metadata`.
async fn join_alone(c: &mut Raw, group: &str, metadata: Bytes) -> JoinGroupResponse {
    let first = join(c, group, "", vec![("range".into(), metadata.clone())]).await;
    assert_eq!(first.error_code, 79, "MEMBER_ID_REQUIRED");
    let r = join(c, group, &first.member_id, vec![("range".into(), metadata)]).await;
    assert_eq!(r.error_code, 0);
    r
}

const NO_REBALANCE_DELAY: &[&str] = &["--group-initial-rebalance-delay-ms", "0"];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscription_claiming_two_billion_owned_partitions_is_harmless() {
    let (siege, _dir) = Siege::start(NO_REBALANCE_DELAY).await;
    let mut c = Raw::connect(siege.addr()).await;
    // ConsumerProtocolSubscription v1: no topics, null user data, then
    // owned_partitions with a count of 0x7fffffff and nothing after it.
    let mut m = BytesMut::new();
    m.put_i16(1);
    m.put_i32(0);
    m.put_i32(-1);
    m.put_i32(i32::MAX);
    join_alone(&mut c, "lying.group", m.freeze()).await;
    let req = OffsetDeleteRequest::default().with_group_id(GroupId(name("lying.group"))).with_topics(vec![OffsetDeleteRequestTopic::default()
        .with_name(topic("some.topic"))
        .with_partitions(vec![OffsetDeleteRequestPartition::default().with_partition_index(0)])]);
    let r: OffsetDeleteResponse = ask(&mut c, ApiKey::OffsetDelete, 0, &encode(&req, 0)).await.expect("OffsetDelete answered");
    assert_eq!(r.error_code, 0);
    // The lie hides nothing: the member subscribes to no topic we know.
    assert_eq!(r.topics[0].partitions[0].error_code, 0);
    // A nested partition list that lies is just as harmless.
    let mut m = BytesMut::new();
    m.put_i16(3);
    m.put_i32(0);
    m.put_i32(-1);
    m.put_i32(1);
    m.put_i16(1);
    m.put_u8(b't');
    m.put_i32(i32::MAX);
    join_alone(&mut c, "lying.group.2", m.freeze()).await;
    let req = req.with_group_id(GroupId(name("lying.group.2")));
    let r: OffsetDeleteResponse = ask(&mut c, ApiKey::OffsetDelete, 0, &encode(&req, 0)).await.expect("OffsetDelete answered");
    assert_eq!(r.error_code, 0);
    siege.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metadata_naming_a_big_topic_twenty_thousand_times_answers_it_once() {
    let (siege, _dir) = Siege::start(&[]).await;
    let mut c = Raw::connect(siege.addr()).await;
    create_topic(&mut c, "big.topic", 1000).await;
    let wanted = vec![MetadataRequestTopic::default().with_name(Some(topic("big.topic"))); 20_000];
    let req = MetadataRequest::default().with_topics(Some(wanted));
    let r: MetadataResponse = ask(&mut c, ApiKey::Metadata, 12, &encode(&req, 12)).await.expect("Metadata answered");
    assert_eq!(r.topics.len(), 1, "duplicates collapse, as Kafka's set of names does");
    assert_eq!(r.topics[0].partitions.len(), 1000);
    siege.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn describe_groups_naming_a_fat_group_a_million_times_answers_it_once() {
    let (siege, _dir) = Siege::start(NO_REBALANCE_DELAY).await;
    let mut c = Raw::connect(siege.addr()).await;
    // A member with 256 KiB of metadata (a valid subscription plus user data).
    let mut m = BytesMut::new();
    m.put_i16(0);
    m.put_i32(0);
    m.put_i32(256 << 10);
    m.put_bytes(b'u', 256 << 10);
    join_alone(&mut c, "fat.group", m.freeze()).await;
    let req = DescribeGroupsRequest::default().with_groups(vec![GroupId(name("fat.group")); 1_000_000]);
    let r: DescribeGroupsResponse = ask(&mut c, ApiKey::DescribeGroups, 5, &encode(&req, 5)).await.expect("DescribeGroups answered");
    assert_eq!(r.groups.len(), 1, "each group is described once");
    assert_eq!(r.groups[0].members.len(), 1);
    siege.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_poll_listing_one_partition_300_000_times_is_answered_once() {
    let (siege, _dir) = Siege::start(&[]).await;
    let mut c = Raw::connect(siege.addr()).await;
    create_topic(&mut c, "poll.topic", 1).await;
    let parts = vec![FetchPartition::default().with_partition(0).with_fetch_offset(0).with_partition_max_bytes(1 << 20); 300_000];
    let req = FetchRequest::default()
        .with_replica_id(BrokerId(-1))
        .with_max_wait_ms(2000)
        .with_min_bytes(1)
        .with_max_bytes(1 << 20)
        .with_topics(vec![FetchTopic::default().with_topic(topic("poll.topic")).with_partitions(parts)]);
    let started = Instant::now();
    let r: FetchResponse = ask(&mut c, ApiKey::Fetch, 12, &encode(&req, 12)).await.expect("Fetch answered");
    assert_eq!(r.responses.len(), 1);
    assert_eq!(r.responses[0].partitions.len(), 1, "the partition is answered once");
    assert!(started.elapsed() >= Duration::from_millis(1500), "it long-polled");
    siege.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn joins_with_a_hundred_thousand_protocols_cost_linear_work() {
    let (siege, _dir) = Siege::start(NO_REBALANCE_DELAY).await;
    let protocols: Vec<(String, Bytes)> = (0..100_000).map(|i| (format!("p{i}"), Bytes::from_static(b"\x00\x00\x00\x00\x00\x00\xff\xff\xff\xff"))).collect();
    let mut a = Raw::connect(siege.addr()).await;
    let first = join(&mut a, "many.protocols", "", protocols.clone()).await;
    assert_eq!(first.error_code, 79);
    let r = join(&mut a, "many.protocols", &first.member_id, protocols.clone()).await;
    assert_eq!(r.error_code, 0);
    // The same names again, each repeated: duplicates count once.
    let mut doubled = protocols.clone();
    doubled.extend(protocols.iter().cloned());
    let mut b = Raw::connect(siege.addr()).await;
    let first = join(&mut b, "many.protocols", "", doubled.clone()).await;
    assert_eq!(first.error_code, 79);
    // The second member's join starts a rebalance that waits for the first:
    // it parks, so send it and check the coordinator still answers others.
    let req = JoinGroupRequest::default()
        .with_group_id(GroupId(name("many.protocols")))
        .with_session_timeout_ms(30_000)
        .with_rebalance_timeout_ms(5_000)
        .with_member_id(first.member_id.clone())
        .with_protocol_type(name("consumer"))
        .with_protocols(doubled.into_iter().map(|(n, m)| JoinGroupRequestProtocol::default().with_name(name(&n)).with_metadata(m)).collect());
    b.send_bytes(&Raw::frame(ApiKey::JoinGroup as i16, 5, 99, &encode(&req, 5))).await;
    let mut d = Raw::connect(siege.addr()).await;
    let t = Instant::now();
    let req = DescribeGroupsRequest::default().with_groups(vec![GroupId(name("many.protocols"))]);
    let r: DescribeGroupsResponse = ask(&mut d, ApiKey::DescribeGroups, 5, &encode(&req, 5)).await.expect("DescribeGroups answered");
    assert!(t.elapsed() < BYSTANDER_MAX, "the coordinator answered in {:?}", t.elapsed());
    assert_eq!(r.groups[0].error_code, 0);
    siege.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transactions_naming_many_partitions_many_times_cost_linear_work() {
    let (siege, _dir) = Siege::start(&[]).await;
    let mut c = Raw::connect(siege.addr()).await;
    let topics = ["txn.a", "txn.b", "txn.c"];
    for t in topics {
        create_topic(&mut c, t, 10_000).await;
    }
    // Two transactions at once, each naming 30,000 partitions twice over.
    let attack = |id: &'static str| {
        let addr = siege.addr();
        async move {
            let mut c = Raw::connect(addr).await;
            let req = InitProducerIdRequest::default().with_transactional_id(Some(TransactionalId(name(id)))).with_transaction_timeout_ms(60_000).with_producer_id(ProducerId(-1)).with_producer_epoch(-1);
            let pid: InitProducerIdResponse = ask(&mut c, ApiKey::InitProducerId, 3, &encode(&req, 3)).await.expect("InitProducerId answered");
            assert_eq!(pid.error_code, 0);
            let named: Vec<i32> = (0..10_000).chain(0..10_000).collect();
            let req = AddPartitionsToTxnRequest::default()
                .with_v3_and_below_transactional_id(TransactionalId(name(id)))
                .with_v3_and_below_producer_id(pid.producer_id)
                .with_v3_and_below_producer_epoch(pid.producer_epoch)
                .with_v3_and_below_topics(topics.iter().map(|t| AddPartitionsToTxnTopic::default().with_name(topic(t)).with_partitions(named.clone())).collect());
            let r: AddPartitionsToTxnResponse = ask(&mut c, ApiKey::AddPartitionsToTxn, 3, &encode(&req, 3)).await.expect("AddPartitionsToTxn answered");
            let codes: Vec<i16> = r.results_by_topic_v3_and_below.iter().flat_map(|t| t.results_by_partition.iter().map(|p| p.partition_error_code)).collect();
            assert_eq!(codes.len(), 60_000, "Kafka answers each occurrence");
            assert!(codes.iter().all(|c| *c == 0));
            let req = AddOffsetsToTxnRequest::default().with_transactional_id(TransactionalId(name(id))).with_producer_id(pid.producer_id).with_producer_epoch(pid.producer_epoch).with_group_id(GroupId(name("txn.group")));
            let r: AddOffsetsToTxnResponse = ask(&mut c, ApiKey::AddOffsetsToTxn, 3, &encode(&req, 3)).await.expect("AddOffsetsToTxn answered");
            assert_eq!(r.error_code, 0);
            let parts: Vec<TxnOffsetCommitRequestPartition> = named.iter().map(|p| TxnOffsetCommitRequestPartition::default().with_partition_index(*p).with_committed_offset(0)).collect();
            let req = TxnOffsetCommitRequest::default()
                .with_transactional_id(TransactionalId(name(id)))
                .with_group_id(GroupId(name("txn.group")))
                .with_producer_id(pid.producer_id)
                .with_producer_epoch(pid.producer_epoch)
                .with_generation_id(-1)
                .with_topics(topics.iter().map(|t| TxnOffsetCommitRequestTopic::default().with_name(topic(t)).with_partitions(parts.clone())).collect());
            let r: TxnOffsetCommitResponse = ask(&mut c, ApiKey::TxnOffsetCommit, 3, &encode(&req, 3)).await.expect("TxnOffsetCommit answered");
            assert_eq!(r.topics.iter().map(|t| t.partitions.len()).sum::<usize>(), 60_000);
            assert!(r.topics.iter().all(|t| t.partitions.iter().all(|p| p.error_code == 0)));
        }
    };
    tokio::join!(attack("hostile.txn.1"), attack("hostile.txn.2"));
    siege.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trailing_bytes_close_the_connection_but_librdkafkas_metadata_is_understood() {
    let (siege, _dir) = Siege::start(&[]).await;
    // ApiVersions v3 with bytes after its body.
    let mut c = Raw::connect(siege.addr()).await;
    c.send_bytes(&Raw::frame(18, 3, 1, &[1, b'x', 1, 0, 0xde, 0xad])).await;
    assert!(c.closed().await, "trailing bytes");
    // Metadata v12 with one topic and a stray byte.
    let mut c = Raw::connect(siege.addr()).await;
    let mut body = encode(&MetadataRequest::default().with_topics(Some(Vec::new())), 12);
    body.push(0);
    c.send_bytes(&Raw::frame(3, 12, 1, &body)).await;
    assert!(c.closed().await, "trailing byte after Metadata");
    // librdkafka 2.1+ asks for all topics at v9+ with a 4-byte null count
    // (librdkafka issue 5049): that exact shape is read as all topics.
    let mut c = Raw::connect(siege.addr()).await;
    create_topic(&mut c, "listed.topic", 1).await;
    let r: MetadataResponse = ask(&mut c, ApiKey::Metadata, 12, &[0, 0, 0, 0, 1, 0, 0]).await.expect("librdkafka's all-topics Metadata answered");
    assert!(r.topics.iter().any(|t| t.name.as_ref().map(|n| n.0.as_str()) == Some("listed.topic")), "all topics listed");
    let r: MetadataResponse = ask(&mut c, ApiKey::Metadata, 9, &[0, 0, 0, 0, 0, 0, 0, 0]).await.expect("v9 form answered");
    assert!(!r.topics.is_empty());
    siege.finish().await;
}
