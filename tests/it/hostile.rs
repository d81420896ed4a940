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
        let s = Siege::start_in(&[], dir.path(), extra).await;
        (s, dir)
    }

    /// A broker run by `wrapper`, with its data in `dir`.
    async fn start_in(wrapper: &[&str], dir: &std::path::Path, extra: &[&str]) -> Siege {
        let broker = ChildBroker::spawn_under(wrapper, dir, extra);
        let pid = broker.child.id();
        // Warm up the bystander's path once before the baseline.
        let mut bystander = Raw::connect(broker.kafka).await;
        bystander_round(&mut bystander).await.expect("bystander answered before the attack");
        let baseline_rss = common::proc_status_bytes(pid, "VmRSS:");
        let stop = Arc::new(AtomicBool::new(false));
        let watcher = tokio::spawn(watch(bystander, pid, stop.clone()));
        Siege { broker, baseline_rss, stop, watcher }
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

/// The value of the first series of `name` (with `labels`, if given) in a
/// scrape of the admin listener.
async fn metric(admin: SocketAddr, name: &str, labels: &str) -> f64 {
    let text = reqwest::get(format!("http://{admin}/metrics")).await.unwrap().text().await.unwrap();
    let want = format!("{name}{labels}");
    text.lines()
        .find(|l| l.split_once(' ').is_some_and(|(k, _)| k == want || (labels.is_empty() && k.starts_with(&format!("{name}{{")))))
        .and_then(|l| l.rsplit_once(' ')?.1.parse().ok())
        .unwrap_or_else(|| panic!("{want} is not in the scrape"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_sending_huge_frames_wait_for_the_budget_and_small_requests_still_pass() {
    let (siege, _dir) = Siege::start(&["--queued-max-request-bytes", "67108864", "--max-request-bytes", "16777216"]).await;
    // Twenty connections each announce a 16 MiB request and send most of
    // it: four fit the 64 MiB budget, the rest are not read.
    let mut attackers = Vec::new();
    for _ in 0..20 {
        let addr = siege.addr();
        attackers.push(tokio::spawn(async move {
            let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
            let mut b = (16i32 << 20).to_be_bytes().to_vec();
            b.extend_from_slice(&[0u8; 1 << 20]);
            tokio::io::AsyncWriteExt::write_all(&mut s, &b).await.unwrap();
            for _ in 0..14 {
                if tokio::io::AsyncWriteExt::write_all(&mut s, &[0u8; 1 << 20]).await.is_err() {
                    break;
                }
            }
            std::future::pending::<()>().await;
        }));
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    let admin = siege.broker.admin;
    assert!(metric(admin, "canopy_request_budget_waiting_connections", "").await >= 10.0, "connections wait for the budget");
    let used = metric(admin, "canopy_request_budget_bytes", "{state=\"used\"}").await;
    assert!(used <= 64.0 * 1048576.0 && used >= 48.0 * 1048576.0, "the budget is spent, not overspent: {used}");
    // A client asking one small thing at a time is still answered.
    let mut c = Raw::connect(siege.addr()).await;
    create_topic(&mut c, "still.works", 1).await;
    for a in attackers {
        a.abort();
    }
    let broker = siege.finish().await;
    // Once the attackers are gone their bytes come back.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(metric(broker.admin, "canopy_request_budget_bytes", "{state=\"used\"}").await, 0.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pipelined_requests_see_the_effects_of_the_ones_before() {
    let (siege, _dir) = Siege::start(&[]).await;
    let mut c = Raw::connect(siege.addr()).await;
    create_topic(&mut c, "ordered", 1).await;
    use kafka_protocol::messages::offset_commit_request::{OffsetCommitRequestPartition, OffsetCommitRequestTopic};
    use kafka_protocol::messages::offset_fetch_request::OffsetFetchRequestTopic;
    for round in 0..50i64 {
        // A commit and the OffsetFetch after it, in one write: the fetch
        // must see the commit (Kafka handles a connection's requests in
        // order).
        let commit = OffsetCommitRequest::default().with_group_id(GroupId(name("ordered.group"))).with_generation_id_or_member_epoch(-1).with_topics(vec![OffsetCommitRequestTopic::default()
            .with_name(topic("ordered"))
            .with_partitions(vec![OffsetCommitRequestPartition::default().with_partition_index(0).with_committed_offset(round + 1)])]);
        let fetch = OffsetFetchRequest::default().with_group_id(GroupId(name("ordered.group"))).with_topics(Some(vec![OffsetFetchRequestTopic::default().with_name(topic("ordered")).with_partition_indexes(vec![0])]));
        let mut both = Raw::frame(ApiKey::OffsetCommit as i16, 8, 1000, &encode(&commit, 8));
        both.extend(Raw::frame(ApiKey::OffsetFetch as i16, 7, 1001, &encode(&fetch, 7)));
        c.send_bytes(&both).await;
        let mut r = c.read_frame().await.expect("commit answered");
        let _ = (bytes::Buf::get_i32(&mut r), bytes::Buf::get_u8(&mut r));
        assert_eq!(OffsetCommitResponse::decode(&mut r, 8).unwrap().topics[0].partitions[0].error_code, 0);
        let mut r = c.read_frame().await.expect("offset fetch answered");
        let _ = (bytes::Buf::get_i32(&mut r), bytes::Buf::get_u8(&mut r));
        let f = OffsetFetchResponse::decode(&mut r, 7).unwrap();
        assert_eq!(f.topics[0].partitions[0].committed_offset, round + 1, "round {round}: the fetch sees the commit before it");
    }
    // Produced (acks=all), then asked for its end offset, in one write:
    // ListOffsets sees the records.
    {
        use kafka_protocol::messages::list_offsets_request::{ListOffsetsPartition, ListOffsetsTopic};
        use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
        for round in 1..=20i64 {
            let produce = ProduceRequest::default().with_acks(-1).with_timeout_ms(30_000).with_topic_data(vec![TopicProduceData::default()
                .with_name(topic("ordered"))
                .with_partition_data(vec![PartitionProduceData::default().with_index(0).with_records(Some(common::record_batch(&[b"r"])))])]);
            let list = ListOffsetsRequest::default().with_replica_id(BrokerId(-1)).with_topics(vec![ListOffsetsTopic::default()
                .with_name(topic("ordered"))
                .with_partitions(vec![ListOffsetsPartition::default().with_partition_index(0).with_timestamp(-1)])]);
            let mut both = Raw::frame(ApiKey::Produce as i16, 9, 3000, &encode(&produce, 9));
            both.extend(Raw::frame(ApiKey::ListOffsets as i16, 7, 3001, &encode(&list, 7)));
            c.send_bytes(&both).await;
            c.read_frame().await.expect("produce answered");
            let mut r = c.read_frame().await.expect("list offsets answered");
            let _ = (bytes::Buf::get_i32(&mut r), bytes::Buf::get_u8(&mut r));
            let l = ListOffsetsResponse::decode(&mut r, 7).unwrap();
            assert_eq!(l.topics[0].partitions[0].offset, round, "round {round}: the end offset counts the record produced before it");
        }
    }
    // A topic created, then listed, in one write.
    let create = CreateTopicsRequest::default().with_timeout_ms(30_000).with_topics(vec![CreatableTopic::default().with_name(topic("made.then.listed")).with_num_partitions(3).with_replication_factor(1)]);
    let md = MetadataRequest::default().with_topics(Some(vec![MetadataRequestTopic::default().with_name(Some(topic("made.then.listed")))])).with_allow_auto_topic_creation(false);
    let mut both = Raw::frame(ApiKey::CreateTopics as i16, 5, 2000, &encode(&create, 5));
    both.extend(Raw::frame(ApiKey::Metadata as i16, 12, 2001, &encode(&md, 12)));
    c.send_bytes(&both).await;
    c.read_frame().await.expect("create answered");
    let mut r = c.read_frame().await.expect("metadata answered");
    let _ = (bytes::Buf::get_i32(&mut r), bytes::Buf::get_u8(&mut r));
    let m = MetadataResponse::decode(&mut r, 12).unwrap();
    assert_eq!((m.topics[0].error_code, m.topics[0].partitions.len()), (0, 3), "the metadata sees the topic created before it");
    siege.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_connections_are_closed_but_long_polls_are_not_idle() {
    let (siege, _dir) = Siege::start(&["--connections-max-idle-ms", "1000"]).await;
    let mut quiet = Raw::connect(siege.addr()).await;
    // Half a frame, then nothing: idle too.
    let mut half = Raw::connect(siege.addr()).await;
    half.send_bytes(&[0, 0, 0, 100, 0, 18]).await;
    let t = Instant::now();
    assert!(quiet.closed().await, "an idle connection is closed");
    assert!(half.closed().await, "a half-sent frame does not keep a connection");
    assert!(t.elapsed() < Duration::from_secs(10));
    // A long poll of 3 s on a connection that is otherwise quiet is in
    // flight, not idle.
    let mut c = Raw::connect(siege.addr()).await;
    create_topic(&mut c, "idle.poll", 1).await;
    let req = FetchRequest::default()
        .with_replica_id(BrokerId(-1))
        .with_max_wait_ms(3000)
        .with_min_bytes(1)
        .with_max_bytes(1 << 20)
        .with_topics(vec![FetchTopic::default().with_topic(topic("idle.poll")).with_partitions(vec![FetchPartition::default().with_partition(0).with_partition_max_bytes(1 << 20)])]);
    let r: FetchResponse = ask(&mut c, ApiKey::Fetch, 12, &encode(&req, 12)).await.expect("the long poll is answered, not cut off");
    assert_eq!(r.responses[0].partitions[0].error_code, 0);
    let broker = siege.finish().await;
    assert!(metric(broker.admin, "canopy_kafka_connections_closed_total", "{reason=\"idle\"}").await >= 2.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_never_reads_is_cut_off_and_cannot_hold_shutdown() {
    let (siege, _dir) = Siege::start(&["--response-write-timeout-ms", "1000", "--shutdown-timeout-ms", "3000"]).await;
    let mut c = Raw::connect(siege.addr()).await;
    create_topic(&mut c, "wide.topic", 1000).await;
    // Metadata answers of about 40 KiB each, asked for and never read.
    let req = MetadataRequest::default().with_topics(Some(vec![MetadataRequestTopic::default().with_name(Some(topic("wide.topic")))]));
    let frame = Raw::frame(ApiKey::Metadata as i16, 12, 7, &encode(&req, 12));
    let addr = siege.addr();
    let deaf = tokio::spawn(async move {
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        let mut sent = 0;
        // Until the broker stops reading us (TCP backpressure) or closes.
        while sent < 2000 {
            match tokio::time::timeout(Duration::from_secs(5), tokio::io::AsyncWriteExt::write_all(&mut s, &frame)).await {
                Ok(Ok(())) => sent += 1,
                _ => break,
            }
        }
        // Keep the socket open, never reading.
        tokio::time::sleep(Duration::from_secs(60)).await;
        drop(s);
    });
    tokio::time::sleep(Duration::from_secs(8)).await;
    let broker = siege.finish().await;
    assert!(metric(broker.admin, "canopy_kafka_connections_closed_total", "{reason=\"write_timeout\"}").await >= 1.0, "the deaf client was cut off");
    // A second deaf client, stuck as shutdown begins: SIGTERM still ends
    // the broker within the shutdown timeout.
    let frame2 = Raw::frame(ApiKey::Metadata as i16, 12, 8, &encode(&req, 12));
    let mut s = tokio::net::TcpStream::connect(broker.kafka).await.unwrap();
    for _ in 0..200 {
        if tokio::time::timeout(Duration::from_millis(200), tokio::io::AsyncWriteExt::write_all(&mut s, &frame2)).await.is_err() {
            break;
        }
    }
    let t = Instant::now();
    let status = tokio::task::spawn_blocking(move || broker.terminate()).await.unwrap();
    assert!(status.success(), "clean exit: {status:?}");
    assert!(t.elapsed() < Duration::from_secs(15), "shutdown took {:?}", t.elapsed());
    deaf.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_past_the_per_address_limit_are_closed_at_once() {
    let (siege, _dir) = Siege::start(&["--max-connections-per-ip", "4"]).await;
    // The bystander holds one slot.
    let mut held = Vec::new();
    for _ in 0..3 {
        let mut c = Raw::connect(siege.addr()).await;
        assert!(c.call(18, 3, &[1, 1, 0], false).await.is_some());
        held.push(c);
    }
    let mut over = Raw::connect(siege.addr()).await;
    assert!(over.closed().await, "the fifth connection from 127.0.0.1 is closed");
    drop(held.pop());
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut again = Raw::connect(siege.addr()).await;
    assert!(again.call(18, 3, &[1, 1, 0], false).await.is_some(), "a freed slot is usable again");
    let broker = siege.finish().await;
    assert!(metric(broker.admin, "canopy_kafka_connections_closed_total", "{reason=\"per_ip_limit\"}").await >= 1.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_metadata_request_cannot_create_a_million_topics() {
    let (siege, _dir) = Siege::start(&["--max-topics", "2000"]).await;
    let mut c = Raw::connect(siege.addr()).await;
    let wanted: Vec<MetadataRequestTopic> = (0..1_000_000).map(|i| MetadataRequestTopic::default().with_name(Some(topic(&format!("m{i}"))))).collect();
    let req = MetadataRequest::default().with_topics(Some(wanted)).with_allow_auto_topic_creation(true);
    let r: MetadataResponse = ask(&mut c, ApiKey::Metadata, 12, &encode(&req, 12)).await.expect("Metadata answered");
    assert_eq!(r.topics.len(), 1_000_000);
    let created = r.topics.iter().filter(|t| t.error_code == 0).count();
    assert_eq!(created, 100, "max_auto_create_per_request");
    assert!(r.topics.iter().all(|t| t.error_code == 0 || t.error_code == 5), "the rest are LEADER_NOT_AVAILABLE, which clients retry");
    drop(r);
    // The broker-wide rate holds across requests too: a burst of requests
    // gets a second's worth at most, well short of max_topics.
    let mut made = created;
    for round in 0..5 {
        let wanted: Vec<MetadataRequestTopic> = (0..100).map(|i| MetadataRequestTopic::default().with_name(Some(topic(&format!("r{round}.{i}"))))).collect();
        let req = MetadataRequest::default().with_topics(Some(wanted)).with_allow_auto_topic_creation(true);
        let r: MetadataResponse = ask(&mut c, ApiKey::Metadata, 12, &encode(&req, 12)).await.expect("Metadata answered");
        made += r.topics.iter().filter(|t| t.error_code == 0).count();
    }
    assert!(made < 400, "auto-creation is rate limited ({made} topics)");
    let broker = siege.finish().await;
    assert!(metric(broker.admin, "canopy_auto_create_refused_total", "").await >= 999_900.0);
}

/// A gzip batch of one record whose value is `len` zero bytes: tiny on
/// the wire, `len` bytes once inflated.
fn zeros_batch(len: usize) -> Bytes {
    use std::io::Write;
    let mut rec = Vec::new();
    let put_varint = canopy::protocol::batch::put_varint;
    let mut body = vec![0u8]; // attributes
    put_varint(&mut body, 0); // timestamp delta
    put_varint(&mut body, 0); // offset delta
    put_varint(&mut body, -1); // key: null
    put_varint(&mut body, len as i64);
    let head = body.len();
    put_varint(&mut rec, (head + len + 1) as i64);
    rec.extend_from_slice(&body);
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    e.write_all(&rec).unwrap();
    let zeros = vec![0u8; 1 << 20];
    let mut left = len;
    while left > 0 {
        let n = left.min(zeros.len());
        e.write_all(&zeros[..n]).unwrap();
        left -= n;
    }
    e.write_all(&[0]).unwrap(); // no headers
    let packed = e.finish().unwrap();
    let mut b = Vec::new();
    b.extend_from_slice(&0i64.to_be_bytes());
    b.extend_from_slice(&((49 + packed.len()) as i32).to_be_bytes());
    b.extend_from_slice(&(-1i32).to_be_bytes());
    b.push(2);
    b.extend_from_slice(&0u32.to_be_bytes());
    b.extend_from_slice(&1i16.to_be_bytes()); // gzip
    b.extend_from_slice(&0i32.to_be_bytes());
    b.extend_from_slice(&1_700_000_000_000i64.to_be_bytes());
    b.extend_from_slice(&1_700_000_000_000i64.to_be_bytes());
    b.extend_from_slice(&(-1i64).to_be_bytes());
    b.extend_from_slice(&(-1i16).to_be_bytes());
    b.extend_from_slice(&(-1i32).to_be_bytes());
    b.extend_from_slice(&1i32.to_be_bytes());
    b.extend_from_slice(&packed);
    let crc = crc32c::crc32c(&b[21..]);
    b[17..21].copy_from_slice(&crc.to_be_bytes());
    Bytes::from(b)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batches_that_inflate_to_the_cap_do_not_stall_other_clients() {
    let (siege, _dir) = Siege::start(&[]).await;
    let mut c = Raw::connect(siege.addr()).await;
    create_topic(&mut c, "heavy", 200).await;
    // Each partition carries a 16 KiB batch that inflates past the 16 MiB
    // cap: all CPU, nothing stored. Two connections, 200 partitions a
    // request, requests back to back for a few seconds.
    let bomb = zeros_batch(17 << 20);
    assert!(bomb.len() < 64 << 10, "small on the wire ({} bytes)", bomb.len());
    use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
    let req = ProduceRequest::default().with_acks(1).with_timeout_ms(30_000).with_topic_data(vec![TopicProduceData::default()
        .with_name(topic("heavy"))
        .with_partition_data((0..200).map(|p| PartitionProduceData::default().with_index(p).with_records(Some(bomb.clone()))).collect())]);
    let body = encode(&req, 9);
    let until = Instant::now() + Duration::from_secs(6);
    let attack = |body: Vec<u8>| {
        let addr = siege.addr();
        async move {
            let mut c = Raw::connect(addr).await;
            let mut answered = 0;
            while Instant::now() < until {
                let r: ProduceResponse = ask(&mut c, ApiKey::Produce, 9, &body).await.expect("produce answered");
                assert!(r.responses[0].partition_responses.iter().all(|p| p.error_code == 10), "MESSAGE_TOO_LARGE");
                answered += 1;
            }
            answered
        }
    };
    let (a, b) = tokio::join!(attack(body.clone()), attack(body));
    assert!(a + b >= 2, "the attack ran");
    // Nothing was stored.
    let r: ListOffsetsResponse = {
        use kafka_protocol::messages::list_offsets_request::{ListOffsetsPartition, ListOffsetsTopic};
        let req = ListOffsetsRequest::default().with_replica_id(BrokerId(-1)).with_topics(vec![ListOffsetsTopic::default().with_name(topic("heavy")).with_partitions(vec![ListOffsetsPartition::default().with_partition_index(0).with_timestamp(-1)])]);
        ask(&mut c, ApiKey::ListOffsets, 7, &encode(&req, 7)).await.expect("ListOffsets answered")
    };
    assert_eq!(r.topics[0].partitions[0].offset, 0);
    siege.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_topic_cannot_raise_max_message_bytes_past_the_broker() {
    let (siege, _dir) = Siege::start(&["--max-request-bytes", "8388608"]).await;
    let mut c = Raw::connect(siege.addr()).await;
    use kafka_protocol::messages::create_topics_request::CreatableTopicConfig;
    let with = |v: &str| {
        CreateTopicsRequest::default().with_timeout_ms(30_000).with_topics(vec![CreatableTopic::default()
            .with_name(topic(&format!("mmb.{}", v.len())))
            .with_num_partitions(1)
            .with_replication_factor(1)
            .with_configs(vec![CreatableTopicConfig::default().with_name(name("max.message.bytes")).with_value(Some(name(v)))])])
    };
    let r: CreateTopicsResponse = ask(&mut c, ApiKey::CreateTopics, 5, &encode(&with("2147483647"), 5)).await.unwrap();
    assert_eq!(r.topics[0].error_code, 40, "INVALID_CONFIG: {:?}", r.topics[0].error_message);
    let r: CreateTopicsResponse = ask(&mut c, ApiKey::CreateTopics, 5, &encode(&with("8388608"), 5)).await.unwrap();
    assert_eq!(r.topics[0].error_code, 0, "at the ceiling is fine: {:?}", r.topics[0].error_message);
    siege.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn long_polls_on_made_up_partitions_leave_nothing_behind() {
    let (siege, _dir) = Siege::start(&[]).await;
    let mut c = Raw::connect(siege.addr()).await;
    create_topic(&mut c, "real", 4).await;
    // Long polls on a real partition plus thousands that do not exist, on
    // topics that do not exist, and on a subtree stream.
    for round in 0..20 {
        let mut parts: Vec<FetchPartition> = (4..5000).map(|p| FetchPartition::default().with_partition(p).with_partition_max_bytes(1024)).collect();
        parts.push(FetchPartition::default().with_partition(0).with_partition_max_bytes(1024));
        let req = FetchRequest::default().with_replica_id(BrokerId(-1)).with_max_wait_ms(200).with_min_bytes(1).with_max_bytes(1 << 20).with_topics(vec![
            FetchTopic::default().with_topic(topic("real")).with_partitions(parts),
            FetchTopic::default().with_topic(topic(&format!("made.up.{round}"))).with_partitions(vec![FetchPartition::default().with_partition(0)]),
            FetchTopic::default().with_topic(topic("real.__all")).with_partitions(vec![FetchPartition::default().with_partition(0)]),
        ]);
        let r: FetchResponse = ask(&mut c, ApiKey::Fetch, 12, &encode(&req, 12)).await.expect("Fetch answered");
        assert_eq!(r.responses[0].partitions.iter().filter(|p| p.error_code == 3).count(), 4996, "made-up partitions are unknown");
    }
    let broker = siege.finish().await;
    assert_eq!(metric(broker.admin, "canopy_fetch_waiters", "{kind=\"fetches\"}").await, 0.0, "no registration outlives its fetch");
    assert_eq!(metric(broker.admin, "canopy_fetch_waiters", "{kind=\"partitions\"}").await, 0.0);
}

/// What a raw HTTP exchange got back before the server closed (or 10 s).
async fn http_raw(addr: SocketAddr, send: &[u8]) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(send).await.unwrap();
    let mut out = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut out)).await;
    String::from_utf8_lossy(&out).into_owned()
}

/// Whether the server closes a connection that sent `send` within `within`.
async fn closed_within(addr: SocketAddr, send: &[u8], within: Duration) -> bool {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(send).await.unwrap();
    let mut b = [0u8; 1024];
    loop {
        match tokio::time::timeout(within, s.read(&mut b)).await {
            Err(_) => return false,
            Ok(Ok(0)) | Ok(Err(_)) => return true,
            Ok(Ok(_)) => {}
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_and_half_preface_http_connections_are_closed() {
    let (siege, _dir) = Siege::start(&["--rest-idle-timeout-ms", "1000"]).await;
    let rest = siege.broker.rest;
    let admin = siege.broker.admin;
    for (what, addr) in [("REST", rest), ("admin", admin)] {
        assert!(closed_within(addr, b"", Duration::from_secs(15)).await, "{what}: a connection that sends nothing is closed");
        assert!(closed_within(addr, b"PRI * HTTP/2.0\r\n", Duration::from_secs(15)).await, "{what}: half an h2 preface is not held");
        assert!(closed_within(addr, b"GET /met", Duration::from_secs(15)).await, "{what}: half a request line is not held");
    }
    // Well-behaved requests are still answered, h1 and short.
    assert!(http_raw(admin, b"GET /health HTTP/1.0\r\n\r\n").await.starts_with("HTTP/1.0 200"));
    siege.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_listener_has_a_connection_limit() {
    let (siege, _dir) = Siege::start(&["--admin-max-connections", "4"]).await;
    let admin = siege.broker.admin;
    let mut held = Vec::new();
    for _ in 0..4 {
        held.push(tokio::net::TcpStream::connect(admin).await.unwrap());
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let r = http_raw(admin, b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n").await;
    assert!(r.starts_with("HTTP/1.1 503"), "past the limit: {r}");
    drop(held);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(http_raw(admin, b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").await.starts_with("HTTP/1.1 200"));
    siege.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_rest_authentication_is_throttled_per_address() {
    let dir0 = tempfile::tempdir().unwrap();
    let file = dir0.path().join("principals.toml");
    std::fs::write(&file, format!("[[principal]]\nname = \"ci\"\ntoken_sha256 = \"{}\"\nproduce = [\"*\"]\n", canopy::auth::hash_secret(b"right"))).unwrap();
    let (siege, _dir) = Siege::start(&["--principals-file", file.to_str().unwrap()]).await;
    let base = format!("http://{}", siege.broker.rest);
    let http = reqwest::Client::new();
    let post = |token: &'static str| http.post(format!("{base}/ingest/auth.t")).header("content-type", "application/json").bearer_auth(token).body("{}").send();
    assert_eq!(post("right").await.unwrap().status(), 200);
    let mut statuses = Vec::new();
    for _ in 0..30 {
        statuses.push(post("wrong").await.unwrap().status().as_u16());
    }
    assert_eq!(statuses.iter().filter(|s| **s == 401).count(), 10, "a burst of failures is answered 401: {statuses:?}");
    assert!(statuses[10..].iter().all(|s| *s == 429), "then 429 before the credentials are looked at");
    let r = post("right").await.unwrap();
    assert_eq!(r.status(), 429, "the address is throttled whatever it sends");
    assert!(r.headers().contains_key("retry-after"));
    tokio::time::sleep(Duration::from_millis(2100)).await;
    assert_eq!(post("right").await.unwrap().status(), 200, "the allowance refills");
    siege.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rest_event_structures_count_against_the_budget() {
    // A REST budget of 8 MiB.
    let (siege, _dir) = Siege::start(&["--rest-max-in-flight-bytes", "8388608", "--rest-max-body-bytes", "4194304", "--rest-body-timeout-ms", "20000"]).await;
    let rest = siege.broker.rest;
    let base = format!("http://{rest}");
    let http = reqwest::Client::new();
    let post = |topic: &str, body: String| http.post(format!("{base}/ingest/{topic}")).header("content-type", "application/x-ndjson").body(body).send();
    // A 3 MB body of a million tiny events: their structures could never
    // fit the budget, even alone. Refused for good, not held.
    let million: String = std::iter::repeat_n("{}\n", 1_000_000).collect();
    assert_eq!(post("tiny.events", million).await.unwrap().status(), 413);
    // Another request holds 4 MB (its body announced, still arriving):
    // 15,000 tiny events need more than is left for now.
    let mut holder = tokio::net::TcpStream::connect(rest).await.unwrap();
    tokio::io::AsyncWriteExt::write_all(&mut holder, b"POST /ingest/held.topic HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 4000000\r\n\r\n[").await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let some: String = std::iter::repeat_n("{}\n", 15_000).collect();
    let r = post("tiny.events", some.clone()).await.unwrap();
    assert_eq!(r.status(), 503, "the events' structures do not fit beside the held request");
    assert!(r.headers().contains_key("retry-after"));
    // The same bytes as a few large events fit.
    let big: String = (0..4).map(|_| format!("{{\"v\":\"{}\"}}\n", "x".repeat(10_000))).collect();
    assert_eq!(post("big.events", big).await.unwrap().status(), 200);
    // Once the other request is gone, the tiny events go through.
    drop(holder);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(post("tiny.events", some).await.unwrap().status(), 200);
    siege.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rest_v3_streams_are_bounded_and_batches_append_once_per_partition() {
    let (siege, _dir) = Siege::start(&["--rest-body-timeout-ms", "1500", "--rest-max-body-bytes", "1048576"]).await;
    let rest = siege.broker.rest;
    let base = format!("http://{rest}");
    let http = reqwest::Client::new();
    let clusters: serde_json::Value = serde_json::from_str(&http.get(format!("{base}/v3/clusters")).send().await.unwrap().text().await.unwrap()).unwrap();
    let cluster = clusters["data"][0]["cluster_id"].as_str().unwrap().to_owned();
    let mut c = Raw::connect(siege.addr()).await;
    create_topic(&mut c, "v3.stream", 1).await;
    let path = format!("/v3/clusters/{cluster}/topics/v3.stream/records");
    // A streaming request whose second record never finishes: the first
    // is answered, then the stream ends with 408 at the body timeout.
    let head = format!("POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n");
    let rec = r#"{"value":{"type":"JSON","data":1}}"#;
    let chunk = |s: &str| format!("{:x}\r\n{s}\r\n", s.len());
    let mut send = head.clone();
    send.push_str(&chunk(rec));
    send.push_str(&chunk(r#"{"value":{"type":"JS"#));
    let got = http_raw(rest, send.as_bytes()).await;
    assert!(got.contains("\"offset\":0"), "the first record is appended: {got}");
    assert!(got.contains("\"error_code\":408"), "the stalled record times out: {got}");
    // A record larger than the body limit, sent in small chunks: 413.
    let mut send = head.clone();
    send.push_str(&chunk("{\"value\":{\"type\":\"STRING\",\"data\":\""));
    for _ in 0..300 {
        send.push_str(&chunk(&"y".repeat(4096)));
    }
    let got = http_raw(rest, send.as_bytes()).await;
    assert!(got.contains("\"error_code\":413"), "an oversized record is refused: {got}");
    // records:batch with 200 entries: one batch in the log.
    let entries: Vec<serde_json::Value> = (0..200).map(|i| serde_json::json!({"id": format!("e{i}"), "value": {"type": "JSON", "data": i}})).collect();
    let r = http.post(format!("{base}/v3/clusters/{cluster}/topics/v3.batch/records:batch")).header("content-type", "application/json").body(serde_json::json!({"entries": entries}).to_string()).send().await.unwrap();
    assert_eq!(r.status(), 207);
    let body: serde_json::Value = serde_json::from_str(&r.text().await.unwrap()).unwrap();
    assert_eq!(body["successes"].as_array().unwrap().len(), 200);
    let req = FetchRequest::default()
        .with_replica_id(BrokerId(-1))
        .with_max_bytes(1 << 20)
        .with_topics(vec![FetchTopic::default().with_topic(topic("v3.batch")).with_partitions(vec![FetchPartition::default().with_partition(0).with_partition_max_bytes(1 << 20)])]);
    let f: FetchResponse = ask(&mut c, ApiKey::Fetch, 12, &encode(&req, 12)).await.expect("Fetch answered");
    let records = f.responses[0].partitions[0].records.clone().unwrap();
    assert_eq!(batches_in(&records), 1, "200 entries, one partition: one batch");
    siege.finish().await;
}

/// How many record batches lie in `b` (a fetched records field).
fn batches_in(b: &Bytes) -> usize {
    let mut n = 0;
    let mut rest = &b[..];
    while rest.len() >= 12 {
        let len = i32::from_be_bytes(rest[8..12].try_into().unwrap()) as usize;
        rest = &rest[(12 + len).min(rest.len())..];
        n += 1;
    }
    n
}

/// Produces `value` to partition 0 of `t` (acks=all); the partition's error.
async fn produce_one(c: &mut Raw, t: &str, value: &[u8]) -> i16 {
    use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
    let req = ProduceRequest::default().with_acks(-1).with_timeout_ms(30_000).with_topic_data(vec![TopicProduceData::default()
        .with_name(topic(t))
        .with_partition_data(vec![PartitionProduceData::default().with_index(0).with_records(Some(common::record_batch(&[value])))])]);
    let r: ProduceResponse = ask(c, ApiKey::Produce, 9, &encode(&req, 9)).await.expect("Produce answered");
    r.responses[0].partition_responses[0].error_code
}

/// Descriptors `pid` has open.
fn open_fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map(|d| d.count()).unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_branches_hold_few_descriptors_and_running_out_poisons_nothing() {
    // A hard limit of 300 descriptors, 32 of them for segment files.
    let dir = tempfile::tempdir().unwrap();
    let siege = Siege::start_in(&["prlimit", "--nofile=300:300"], dir.path(), &["--max-open-files", "32", "--max-connections", "1000", "--auto-create-topics-per-sec", "0"]).await;
    let pid = siege.broker.child.id();
    let mut c = Raw::connect(siege.addr()).await;
    // 400 branches: more segments than descriptors.
    for i in 0..400 {
        assert_eq!(produce_one(&mut c, &format!("b{i}.t"), format!("v{i}").as_bytes()).await, 0, "branch {i}");
    }
    assert!(open_fds(pid) < 300, "{} descriptors open", open_fds(pid));
    assert!(metric(siege.broker.admin, "canopy_open_files", "{state=\"open\"}").await <= 32.0);
    // Eat the rest of the descriptors with idle connections.
    let mut hogs = Vec::new();
    while open_fds(pid) < 299 {
        let mut h = Raw::connect(siege.addr()).await;
        if tokio::time::timeout(Duration::from_secs(2), h.call(18, 3, &[1, 1, 0], false)).await.ok().flatten().is_none() {
            break;
        }
        hogs.push(h);
    }
    // A new branch needs a file: the produce fails, retriably.
    let code = produce_one(&mut c, "new.branch", b"x").await;
    assert_eq!(code, 56, "KAFKA_STORAGE_ERROR (retriable)");
    // Free descriptors: the same produce goes through; nothing was poisoned.
    hogs.truncate(hogs.len().saturating_sub(50));
    drop(hogs);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(produce_one(&mut c, "new.branch", b"x").await, 0, "storage carries on");
    assert_eq!(produce_one(&mut c, "b7.t", b"again").await, 0);
    // Every branch still reads back (files closed by the cache reopen).
    for i in (0..400).step_by(37) {
        let req = FetchRequest::default()
            .with_replica_id(BrokerId(-1))
            .with_max_bytes(1 << 20)
            .with_topics(vec![FetchTopic::default().with_topic(topic(&format!("b{i}.t"))).with_partitions(vec![FetchPartition::default().with_partition(0).with_partition_max_bytes(1 << 20)])]);
        let f: FetchResponse = ask(&mut c, ApiKey::Fetch, 12, &encode(&req, 12)).await.expect("Fetch answered");
        let p = &f.responses[0].partitions[0];
        assert_eq!(p.error_code, 0);
        assert!(p.records.as_ref().is_some_and(|r| !r.is_empty()), "branch {i} reads back");
    }
    siege.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_fails_produce_retriably_and_poisons_nothing() {
    // A 48 MiB filesystem of our own for the data directory (needs root,
    // as CI has: this test fails rather than skips without it).
    let mnt = tempfile::tempdir().unwrap();
    let status = std::process::Command::new("mount").args(["-t", "tmpfs", "-o", "size=48m", "tmpfs"]).arg(mnt.path()).status().expect("run mount");
    assert!(status.success(), "mounting a tmpfs for the full-disk test needs root");
    struct Unmount(std::path::PathBuf);
    impl Drop for Unmount {
        fn drop(&mut self) {
            let _ = std::process::Command::new("umount").arg("-l").arg(&self.0).status();
        }
    }
    let _unmount = Unmount(mnt.path().to_owned());
    let siege = Siege::start_in(&[], mnt.path(), &["--segment-bytes", "8388608"]).await;
    let mut c = Raw::connect(siege.addr()).await;
    create_topic(&mut c, "filler", 1).await;
    create_topic(&mut c, "other.topic", 1).await;
    let big = vec![b'z'; 900 << 10];
    let mut refused = 0;
    for _ in 0..200 {
        match produce_one(&mut c, "filler", &big).await {
            0 => {}
            56 => {
                refused += 1;
                if refused >= 3 {
                    break;
                }
            }
            other => panic!("a full disk answers KAFKA_STORAGE_ERROR, not {other}"),
        }
    }
    assert!(refused >= 3, "the disk filled up");
    // Space comes back when the filler goes; then appends go on.
    let req = DeleteTopicsRequest::default().with_topic_names(vec![topic("filler")]).with_timeout_ms(30_000);
    let r: DeleteTopicsResponse = ask(&mut c, ApiKey::DeleteTopics, 4, &encode(&req, 4)).await.expect("DeleteTopics answered");
    assert_eq!(r.responses[0].error_code, 0);
    assert_eq!(produce_one(&mut c, "other.topic", b"after the disk was full").await, 0, "storage was not poisoned");
    let broker = siege.finish().await;
    assert!(broker.terminate().success());
}
