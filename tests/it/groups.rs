//! Consumer groups through librdkafka: three consumers share a 12-partition
//! topic, consume 120,000 records exactly once with manual commits; one
//! leaves and the others resume from its commits; a member that dies
//! without LeaveGroup is expired after its session timeout; cooperative-
//! sticky moves only what a joiner needs; a static member restarts without
//! a rebalance; a regex subscription picks up a topic created later;
//! offsets of empty groups expire after the retention; deleted groups and
//! offsets stay deleted.

use crate::common;

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{CommitMode, Consumer};
use rdkafka::message::Message;
use rdkafka::producer::{FutureProducer, FutureRecord};

const TOPIC: &str = "groups.shared.events";
const PARTITIONS: i32 = 12;

/// Records the rebalances a consumer saw; prints librdkafka's own log when
/// GROUPS_DEBUG is set.
#[derive(Default)]
struct Ctx {
    n: usize,
    /// (assigned?, the partitions of that event), in order.
    events: Mutex<Vec<(bool, Vec<(String, i32)>)>>,
}
impl Ctx {
    fn revokes(&self) -> usize {
        self.events.lock().unwrap().iter().filter(|(assign, _)| !assign).count()
    }
}
impl rdkafka::ClientContext for Ctx {
    fn log(&self, _level: rdkafka::config::RDKafkaLogLevel, fac: &str, msg: &str) {
        if std::env::var_os("GROUPS_DEBUG").is_some() {
            eprintln!("rdkafka[{}] {fac}: {msg}", self.n);
        }
    }
}
impl rdkafka::consumer::ConsumerContext for Ctx {
    fn post_rebalance(&self, _: &rdkafka::consumer::BaseConsumer<Self>, r: &rdkafka::consumer::Rebalance<'_>) {
        let list = |l: &rdkafka::TopicPartitionList| l.elements().iter().map(|e| (e.topic().to_owned(), e.partition())).collect();
        let event = match r {
            rdkafka::consumer::Rebalance::Assign(l) => (true, list(l)),
            rdkafka::consumer::Rebalance::Revoke(l) => (false, list(l)),
            rdkafka::consumer::Rebalance::Error(_) => return,
        };
        self.events.lock().unwrap().push(event);
    }
}
type BaseConsumer = rdkafka::consumer::BaseConsumer<Ctx>;

/// A manual-commit group member's configuration, range assignment.
fn member_config(addr: std::net::SocketAddr, group: &str) -> rdkafka::ClientConfig {
    let mut c = common::client(addr);
    c.set("group.id", group)
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        .set("auto.offset.reset", "earliest")
        .set("session.timeout.ms", "6000")
        .set("heartbeat.interval.ms", "300")
        .set("fetch.wait.max.ms", "100")
        .set("partition.assignment.strategy", "range");
    if std::env::var_os("GROUPS_DEBUG").is_some() {
        c.set("debug", "cgrp").set_log_level(rdkafka::config::RDKafkaLogLevel::Debug);
    }
    c
}

fn subscribe(c: &rdkafka::ClientConfig, n: usize, topics: &[&str]) -> BaseConsumer {
    let consumer: BaseConsumer = c.create_with_context(Ctx { n, ..Default::default() }).unwrap();
    consumer.subscribe(topics).unwrap();
    consumer
}

fn group_consumer(addr: std::net::SocketAddr, group: &str, n: usize) -> BaseConsumer {
    subscribe(&member_config(addr, group), n, &[TOPIC])
}

/// A broker whose groups rebalance without the initial delay.
fn group_args(dir: &std::path::Path) -> canopy::config::ServeArgs {
    let mut args = common::args(dir);
    args.group_initial_rebalance_delay_ms = Some(0);
    args
}

async fn create_shared_topic(addr: std::net::SocketAddr) {
    let admin: AdminClient<DefaultClientContext> = common::client(addr).create().unwrap();
    admin.create_topics([&NewTopic::new(TOPIC, PARTITIONS, TopicReplication::Fixed(1))], &AdminOptions::new()).await.unwrap()[0].as_ref().unwrap();
}

async fn produce(addr: std::net::SocketAddr, from: usize, to: usize) {
    let producer: FutureProducer = common::producer_config(addr, "all").create().unwrap();
    let mut futs = Vec::new();
    for i in from..to {
        let key = format!("k{i}");
        let rec = FutureRecord::to(TOPIC).partition((i % PARTITIONS as usize) as i32).key(&key).payload("v");
        futs.push(producer.send_result(rec).map_err(|(e, _)| e).unwrap());
    }
    for f in futs {
        f.await.unwrap().unwrap();
    }
}

type Seen = Arc<Mutex<HashMap<(i32, i64), usize>>>;

/// Polls `consumers` (each on its own thread) until `done` says stop,
/// recording every record seen by which consumer, committing as it goes.
fn poll_all(consumers: Vec<Arc<BaseConsumer>>, seen: Seen, until: impl Fn(&HashMap<(i32, i64), usize>) -> bool + Send + Sync + 'static) {
    let until = Arc::new(until);
    let threads: Vec<_> = consumers
        .into_iter()
        .enumerate()
        .map(|(who, c)| {
            let seen = seen.clone();
            let until = until.clone();
            std::thread::spawn(move || {
                let deadline = Instant::now() + Duration::from_secs(120);
                let mut since_commit = 0;
                loop {
                    if until(&seen.lock().unwrap()) {
                        break;
                    }
                    assert!(Instant::now() < deadline, "consumers stalled");
                    match c.poll(Duration::from_millis(100)) {
                        Some(Ok(m)) => {
                            seen.lock().unwrap().entry((m.partition(), m.offset())).and_modify(|n| *n += 1000).or_insert(who);
                            c.store_offset_from_message(&m).unwrap();
                            since_commit += 1;
                            if since_commit >= 500 {
                                if std::env::var_os("GROUPS_DEBUG").is_some() { eprintln!("consumer {who} commits at {}", seen.lock().unwrap().len()); }
                                c.commit_consumer_state(CommitMode::Sync).unwrap();
                                since_commit = 0;
                            }
                        }
                        Some(Err(e)) => panic!("consumer {who}: {e}"),
                        None => {
                            if since_commit > 0 {
                                c.commit_consumer_state(CommitMode::Sync).unwrap();
                                since_commit = 0;
                            }
                        }
                    }
                }
                if since_commit > 0 {
                    c.commit_consumer_state(CommitMode::Sync).unwrap();
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
}

/// Leaves the group with every consumer at once, polling them so the
/// revocations the departures cause are served, then closes them.
fn close_all(consumers: Vec<Arc<BaseConsumer>>) {
    let revokes = |c: &BaseConsumer| c.context().revokes();
    let before: Vec<usize> = consumers.iter().map(|c| revokes(c)).collect();
    for c in &consumers {
        c.unsubscribe();
    }
    // The revocation is delivered through poll; close would wait for it.
    let deadline = Instant::now() + Duration::from_secs(30);
    while consumers.iter().zip(&before).any(|(c, b)| revokes(c) == *b) {
        assert!(Instant::now() < deadline, "revocation never delivered");
        for c in &consumers {
            let _ = c.poll(Duration::from_millis(20));
        }
    }
    let threads: Vec<_> = consumers
        .into_iter()
        .map(|c| {
            let c = Arc::into_inner(c).expect("close_all holds the last reference");
            std::thread::spawn(move || drop(c))
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
}

fn assignment_sizes(consumers: &[Arc<BaseConsumer>]) -> Vec<usize> {
    consumers.iter().map(|c| c.assignment().map(|a| a.count()).unwrap_or(0)).collect()
}

/// Polls until every consumer holds `want` partitions (no records exist yet).
fn wait_for_assignment(consumers: &[Arc<BaseConsumer>], want: &[usize]) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        for c in consumers {
            let _ = c.poll(Duration::from_millis(50));
        }
        if assignment_sizes(consumers) == want {
            return;
        }
        if std::env::var_os("GROUPS_DEBUG").is_some() {
            eprintln!("assignment {:?}", assignment_sizes(consumers));
        }
        assert!(Instant::now() < deadline, "assignment stuck at {:?}, want {want:?}", assignment_sizes(consumers));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_consumers_share_partitions_and_take_over() {
    let dir = tempfile::tempdir().unwrap();
    let args = group_args(dir.path());
    let broker = common::start(args).await;
    let addr = broker.kafka_addr;
    create_shared_topic(addr).await;

    let consumers: Vec<Arc<BaseConsumer>> = (0..3).map(|n| Arc::new(group_consumer(addr, "sharers", n))).collect();
    let c2 = consumers.clone();
    tokio::task::spawn_blocking(move || wait_for_assignment(&c2, &[4, 4, 4])).await.unwrap();
    // The three assignments are disjoint and cover the topic.
    let mut all = HashSet::new();
    for c in &consumers {
        for e in c.assignment().unwrap().elements() {
            assert!(all.insert(e.partition()), "partition {} assigned twice", e.partition());
        }
    }
    assert_eq!(all.len(), PARTITIONS as usize);

    eprintln!("phase 1: stable with 4/4/4");
    produce(addr, 0, 120_000).await;
    eprintln!("phase 1: produced");
    let seen: Seen = Arc::default();
    let c2 = consumers.clone();
    let s2 = seen.clone();
    tokio::task::spawn_blocking(move || poll_all(c2, s2, |s| s.len() >= 120_000)).await.unwrap();
    {
        let seen = seen.lock().unwrap();
        assert_eq!(seen.len(), 120_000);
        assert!(seen.values().all(|who| *who < 1000), "a record was consumed twice");
        let per: HashSet<usize> = seen.values().copied().collect();
        assert_eq!(per.len(), 3, "all three consumers did work");
    }

    eprintln!("phase 1: consumed");
    // Consumer 0 leaves (close sends LeaveGroup): the other two take its
    // partitions and resume from its commits — nothing is read twice.
    let leaving = consumers[0].clone();
    let survivors = vec![consumers[1].clone(), consumers[2].clone()];
    drop(consumers);
    tokio::task::spawn_blocking(move || close_all(vec![leaving])).await.unwrap();
    let s2 = survivors.clone();
    tokio::task::spawn_blocking(move || wait_for_assignment(&s2, &[6, 6])).await.unwrap();
    eprintln!("phase 2: stable with 6/6");
    produce(addr, 120_000, 132_000).await;
    let s2 = survivors.clone();
    let seen2 = seen.clone();
    tokio::task::spawn_blocking(move || poll_all(s2, seen2, |s| s.len() >= 132_000)).await.unwrap();
    {
        let seen = seen.lock().unwrap();
        assert_eq!(seen.len(), 132_000);
        assert!(seen.values().all(|who| *who < 1000), "a record was consumed twice after the leave");
    }

    eprintln!("phase 2: consumed");
    // Committed offsets match what was consumed, through OffsetFetch. (Not
    // through librdkafka's `committed()`: after it, librdkafka's destroy
    // waits forever on a partition reference, so the consumers could not
    // be closed.)
    {
        use kafka_protocol::messages::offset_fetch_request::OffsetFetchRequestTopic;
        use kafka_protocol::messages::{GroupId, OffsetFetchRequest, OffsetFetchResponse, TopicName};
        use kafka_protocol::protocol::StrBytes;
        let mut sock = tokio::net::TcpStream::connect(addr).await.unwrap();
        let req = OffsetFetchRequest::default().with_group_id(GroupId(StrBytes::from_static_str("sharers"))).with_topics(Some(vec![
            OffsetFetchRequestTopic::default().with_name(TopicName(StrBytes::from_static_str(TOPIC))).with_partition_indexes((0..PARTITIONS).collect()),
        ]));
        let r: OffsetFetchResponse = common::call(&mut sock, 9, 1, 1, &req).await;
        let parts = &r.topics[0].partitions;
        assert_eq!(parts.len(), PARTITIONS as usize);
        for p in parts {
            assert_eq!((p.error_code, p.committed_offset), (0, 11_000), "partition {}", p.partition_index);
        }
    }
    eprintln!("phase 2: committed offsets checked");
    tokio::task::spawn_blocking(move || close_all(survivors)).await.unwrap();
    eprintln!("consumers closed");
    broker.shutdown().await;
}

/// Committed offsets survive a broker restart, and a consumer of the same
/// group started afterwards resumes from them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn committed_offsets_survive_restart() {
    let dir = tempfile::tempdir().unwrap();
    let args = group_args(dir.path());
    let broker = common::start(args.clone()).await;
    let addr = broker.kafka_addr;
    create_shared_topic(addr).await;
    produce(addr, 0, 1_200).await;

    // Read half of every partition and commit there.
    let c = Arc::new(group_consumer(addr, "resumers", 0));
    let c2 = c.clone();
    let committed = tokio::task::spawn_blocking(move || {
        let mut per: HashMap<i32, i64> = HashMap::new();
        let deadline = Instant::now() + Duration::from_secs(60);
        while per.len() < PARTITIONS as usize || per.values().any(|&o| o < 49) {
            assert!(Instant::now() < deadline, "reading stalled: {per:?}");
            if let Some(m) = c2.poll(Duration::from_millis(100)) {
                let m = m.unwrap();
                if m.offset() < 50 {
                    // librdkafka commits the stored offset + 1.
                    c2.store_offset(m.topic(), m.partition(), m.offset()).unwrap();
                    per.insert(m.partition(), m.offset());
                }
            }
        }
        c2.commit_consumer_state(CommitMode::Sync).unwrap();
        per
    })
    .await
    .unwrap();
    assert!(committed.values().all(|&o| o == 49));
    tokio::task::spawn_blocking(move || close_all(vec![c])).await.unwrap();
    broker.shutdown().await;

    let broker = common::start(args).await;
    let c = Arc::new(group_consumer(broker.kafka_addr, "resumers", 1));
    let c2 = c.clone();
    let first = tokio::task::spawn_blocking(move || {
        let mut first: HashMap<i32, i64> = HashMap::new();
        let deadline = Instant::now() + Duration::from_secs(60);
        while first.len() < PARTITIONS as usize {
            assert!(Instant::now() < deadline, "resumed only {first:?}");
            if let Some(m) = c2.poll(Duration::from_millis(100)) {
                let m = m.unwrap();
                first.entry(m.partition()).or_insert(m.offset());
            }
        }
        first
    })
    .await
    .unwrap();
    assert!(first.values().all(|&o| o == 50), "resumed at {first:?}, committed 50 everywhere");
    tokio::task::spawn_blocking(move || close_all(vec![c])).await.unwrap();
    broker.shutdown().await;
}

/// A member that dies without LeaveGroup (a raw client that joins, syncs
/// and then goes silent) is expired after its session timeout, and its
/// partitions go back to the live member.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_member_expires_after_its_session_timeout() {
    use bytes::BytesMut;
    use kafka_protocol::messages::consumer_protocol_subscription::ConsumerProtocolSubscription;
    use kafka_protocol::messages::join_group_request::JoinGroupRequestProtocol;
    use kafka_protocol::messages::{GroupId, JoinGroupRequest, JoinGroupResponse, SyncGroupRequest, SyncGroupResponse};
    use kafka_protocol::protocol::{Encodable, StrBytes};

    let dir = tempfile::tempdir().unwrap();
    let args = group_args(dir.path());
    let broker = common::start(args).await;
    let addr = broker.kafka_addr;
    create_shared_topic(addr).await;

    // The live member, polled on its own thread for the whole test.
    let live = Arc::new(group_consumer(addr, "expiry", 0));
    let sizes: Arc<Mutex<Vec<usize>>> = Arc::default();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let poller = {
        let (live, sizes, stop) = (live.clone(), sizes.clone(), stop.clone());
        std::thread::spawn(move || {
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let _ = live.poll(Duration::from_millis(50));
                let n = live.assignment().map(|a| a.count()).unwrap_or(0);
                let mut s = sizes.lock().unwrap();
                if s.last() != Some(&n) {
                    s.push(n);
                }
            }
        })
    };
    let wait_for = |want: usize| {
        let sizes = sizes.clone();
        async move {
            let deadline = Instant::now() + Duration::from_secs(60);
            while sizes.lock().unwrap().last() != Some(&want) {
                assert!(Instant::now() < deadline, "live member never held {want}: {:?}", sizes.lock().unwrap());
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    };
    wait_for(12).await;

    // The raw member: JoinGroup v5 (member id round trip), SyncGroup, silence.
    let mut sock = tokio::net::TcpStream::connect(addr).await.unwrap();
    let mut meta = BytesMut::new();
    meta.extend_from_slice(&0i16.to_be_bytes());
    ConsumerProtocolSubscription::default().with_topics(vec![StrBytes::from_static_str(TOPIC)]).encode(&mut meta, 0).unwrap();
    let join = |member: StrBytes| {
        JoinGroupRequest::default()
            .with_group_id(GroupId(StrBytes::from_static_str("expiry")))
            .with_session_timeout_ms(6000)
            .with_rebalance_timeout_ms(30_000)
            .with_member_id(member)
            .with_protocol_type(StrBytes::from_static_str("consumer"))
            .with_protocols(vec![JoinGroupRequestProtocol::default().with_name(StrBytes::from_static_str("range")).with_metadata(meta.clone().freeze())])
    };
    let first: JoinGroupResponse = common::call(&mut sock, 11, 5, 1, &join(StrBytes::new())).await;
    assert_eq!(first.error_code, 79, "MEMBER_ID_REQUIRED");
    let joined: JoinGroupResponse = common::call(&mut sock, 11, 5, 2, &join(first.member_id.clone())).await;
    assert_eq!(joined.error_code, 0);
    assert_ne!(joined.leader, joined.member_id, "the librdkafka member stays leader");
    let synced: SyncGroupResponse = common::call(
        &mut sock,
        14,
        3,
        3,
        &SyncGroupRequest::default().with_group_id(GroupId(StrBytes::from_static_str("expiry"))).with_generation_id(joined.generation_id).with_member_id(joined.member_id.clone()),
    )
    .await;
    assert_eq!(synced.error_code, 0);
    assert!(!synced.assignment.is_empty(), "the raw member got partitions");
    wait_for(6).await;

    // Killed: the socket goes away without a LeaveGroup. After the session
    // timeout the coordinator expires it and the live member gets all 12.
    drop(sock);
    wait_for(12).await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    poller.join().unwrap();
    let sizes = sizes.lock().unwrap().clone();
    assert!(sizes.windows(2).any(|w| w == [6, 0] || w == [6, 12]), "partitions moved back after expiry: {sizes:?}");
    tokio::task::spawn_blocking(move || close_all(vec![live])).await.unwrap();
    broker.shutdown().await;
}


/// Bad group requests get Kafka's error codes, and another group carries on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_group_requests_get_kafka_error_codes() {
    use kafka_protocol::messages::join_group_request::JoinGroupRequestProtocol;
    use kafka_protocol::messages::offset_commit_request::{OffsetCommitRequestPartition, OffsetCommitRequestTopic};
    use kafka_protocol::messages::sync_group_request::SyncGroupRequestAssignment;
    use kafka_protocol::messages::{GroupId, JoinGroupRequest, JoinGroupResponse, OffsetCommitRequest, OffsetCommitResponse, SyncGroupRequest, SyncGroupResponse, TopicName};
    use kafka_protocol::protocol::StrBytes;

    let dir = tempfile::tempdir().unwrap();
    let args = group_args(dir.path());
    let broker = common::start(args).await;
    let mut sock = tokio::net::TcpStream::connect(broker.kafka_addr).await.unwrap();
    let s = |v: &str| StrBytes::from_string(v.to_owned());
    let join = |group: &str, member: &str, ptype: &str, protocols: Vec<JoinGroupRequestProtocol>| {
        JoinGroupRequest::default()
            .with_group_id(GroupId(s(group)))
            .with_session_timeout_ms(10_000)
            .with_rebalance_timeout_ms(10_000)
            .with_member_id(s(member))
            .with_protocol_type(s(ptype))
            .with_protocols(protocols)
    };
    let range = || vec![JoinGroupRequestProtocol::default().with_name(s("range")).with_metadata(bytes::Bytes::from_static(b"m"))];

    let r: JoinGroupResponse = common::call(&mut sock, 11, 5, 1, &join("g1", "", "", range())).await;
    assert_eq!(r.error_code, 23, "empty protocol type: INCONSISTENT_GROUP_PROTOCOL");
    let r: JoinGroupResponse = common::call(&mut sock, 11, 5, 2, &join("g1", "", "consumer", vec![])).await;
    assert_eq!(r.error_code, 23, "no protocols: INCONSISTENT_GROUP_PROTOCOL");
    let r: JoinGroupResponse = common::call(&mut sock, 11, 5, 3, &join("g1", "nobody", "consumer", range())).await;
    assert_eq!(r.error_code, 25, "unknown member: UNKNOWN_MEMBER_ID");
    let r: JoinGroupResponse = common::call(&mut sock, 11, 5, 4, &join(&"g".repeat(300), "", "consumer", range())).await;
    assert_eq!(r.error_code, 24, "group id over the length limit: INVALID_GROUP_ID");

    // A real one-member group in g2; a member of another group is unknown there.
    let first: JoinGroupResponse = common::call(&mut sock, 11, 5, 5, &join("g2", "", "consumer", range())).await;
    assert_eq!(first.error_code, 79);
    let joined: JoinGroupResponse = common::call(&mut sock, 11, 5, 6, &join("g2", &first.member_id, "consumer", range())).await;
    assert_eq!((joined.error_code, joined.generation_id), (0, 1));
    // The leader's assignment names a non-member: ignored, as Kafka does.
    let sync = SyncGroupRequest::default().with_group_id(GroupId(s("g2"))).with_generation_id(1).with_member_id(joined.member_id.clone()).with_assignments(vec![
        SyncGroupRequestAssignment::default().with_member_id(joined.member_id.clone()).with_assignment(bytes::Bytes::from_static(b"a")),
        SyncGroupRequestAssignment::default().with_member_id(s("stranger")).with_assignment(bytes::Bytes::from_static(b"b")),
    ]);
    let r: SyncGroupResponse = common::call(&mut sock, 14, 3, 7, &sync).await;
    assert_eq!((r.error_code, &r.assignment[..]), (0, &b"a"[..]));
    let stale = SyncGroupRequest::default().with_group_id(GroupId(s("g2"))).with_generation_id(7).with_member_id(joined.member_id.clone());
    let r: SyncGroupResponse = common::call(&mut sock, 14, 3, 8, &stale).await;
    assert_eq!(r.error_code, 22, "stale generation: ILLEGAL_GENERATION");
    let other = SyncGroupRequest::default().with_group_id(GroupId(s("g2"))).with_generation_id(1).with_member_id(s("stranger"));
    let r: SyncGroupResponse = common::call(&mut sock, 14, 3, 9, &other).await;
    assert_eq!(r.error_code, 25, "SyncGroup from a non-member: UNKNOWN_MEMBER_ID");

    // OffsetCommit: unknown topic per partition; stale generation and
    // unknown member for the whole request.
    let commit = |gen: i32, member: &str, topic: &str| {
        OffsetCommitRequest::default().with_group_id(GroupId(s("g2"))).with_generation_id_or_member_epoch(gen).with_member_id(s(member)).with_topics(vec![
            OffsetCommitRequestTopic::default().with_name(TopicName(s(topic))).with_partitions(vec![OffsetCommitRequestPartition::default().with_partition_index(0).with_committed_offset(5)]),
        ])
    };
    let code = |r: &OffsetCommitResponse| r.topics[0].partitions[0].error_code;
    let r: OffsetCommitResponse = common::call(&mut sock, 8, 2, 10, &commit(1, &joined.member_id, "no.such.topic")).await;
    assert_eq!(code(&r), 3, "UNKNOWN_TOPIC_OR_PARTITION");
    let r: OffsetCommitResponse = common::call(&mut sock, 8, 2, 11, &commit(0, &joined.member_id, "no.such.topic")).await;
    assert_eq!(code(&r), 22, "ILLEGAL_GENERATION");
    let r: OffsetCommitResponse = common::call(&mut sock, 8, 2, 12, &commit(1, "stranger", "no.such.topic")).await;
    assert_eq!(code(&r), 25, "UNKNOWN_MEMBER_ID");
    drop(sock);
    broker.shutdown().await;
}

fn owned(c: &BaseConsumer) -> BTreeSet<(String, i32)> {
    c.assignment().unwrap().elements().iter().map(|e| (e.topic().to_owned(), e.partition())).collect()
}

/// Polls every consumer for `d`, so heartbeats and any rebalance they would
/// start get their chance.
fn keep_polling(consumers: &[Arc<BaseConsumer>], d: Duration) {
    let until = Instant::now() + d;
    while Instant::now() < until {
        for c in consumers {
            let _ = c.poll(Duration::from_millis(20));
        }
    }
}

/// Incremental cooperative rebalancing (cooperative-sticky): when a third
/// member joins, the first two give up only the partitions it gets and keep
/// the rest throughout — nothing else is revoked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cooperative_sticky_join_moves_only_the_partitions_it_needs() {
    let dir = tempfile::tempdir().unwrap();
    let broker = common::start(group_args(dir.path())).await;
    let addr = broker.kafka_addr;
    create_shared_topic(addr).await;
    let mut cfg = member_config(addr, "cooperative");
    cfg.set("partition.assignment.strategy", "cooperative-sticky");

    let first: Vec<Arc<BaseConsumer>> = (0..2).map(|n| Arc::new(subscribe(&cfg, n, &[TOPIC]))).collect();
    let f2 = first.clone();
    tokio::task::spawn_blocking(move || wait_for_assignment(&f2, &[6, 6])).await.unwrap();
    let before: Vec<BTreeSet<(String, i32)>> = first.iter().map(|c| owned(c)).collect();
    let seen_before: Vec<usize> = first.iter().map(|c| c.context().events.lock().unwrap().len()).collect();

    let third = Arc::new(subscribe(&cfg, 2, &[TOPIC]));
    let mut all = first.clone();
    all.push(third.clone());
    let a2 = all.clone();
    tokio::task::spawn_blocking(move || wait_for_assignment(&a2, &[4, 4, 4])).await.unwrap();

    let mut moved = BTreeSet::new();
    for (i, c) in first.iter().enumerate() {
        let after = owned(c);
        assert!(after.is_subset(&before[i]), "member {i} kept only its own partitions: {before:?} -> {after:?}");
        let gave_up: BTreeSet<_> = before[i].difference(&after).cloned().collect();
        assert_eq!(gave_up.len(), 2, "member {i} gave up exactly what the newcomer needs");
        for (assigned, parts) in &c.context().events.lock().unwrap()[seen_before[i]..] {
            let parts: BTreeSet<_> = parts.iter().cloned().collect();
            if *assigned {
                assert!(parts.is_empty(), "member {i} was given nothing new: {parts:?}");
            } else {
                assert!(parts.is_subset(&gave_up), "member {i} had only the moved partitions revoked, not {parts:?}");
            }
        }
        moved.extend(gave_up);
    }
    assert_eq!(owned(&third), moved, "the newcomer got exactly the moved partitions");
    drop((first, third));
    tokio::task::spawn_blocking(move || close_all(all)).await.unwrap();
    broker.shutdown().await;
}

/// Static membership: a member with `group.instance.id` that restarts
/// within its session timeout gets its partitions back, and the other
/// member sees no rebalance.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn static_member_restart_gets_its_partitions_back_without_a_rebalance() {
    let dir = tempfile::tempdir().unwrap();
    let broker = common::start(group_args(dir.path())).await;
    let addr = broker.kafka_addr;
    create_shared_topic(addr).await;
    let cfg = |i: usize| {
        let mut c = member_config(addr, "statics");
        c.set("group.instance.id", format!("static-{i}"));
        c
    };
    let a = Arc::new(subscribe(&cfg(0), 0, &[TOPIC]));
    let b = Arc::new(subscribe(&cfg(1), 1, &[TOPIC]));
    let (a2, b2) = (a.clone(), b.clone());
    tokio::task::spawn_blocking(move || wait_for_assignment(&[a2, b2], &[6, 6])).await.unwrap();
    let a_had = owned(&a);
    let b_had = owned(&b);
    let b_events = b.context().events.lock().unwrap().len();

    // Restart `a`: a static member's close sends no LeaveGroup, so the
    // group keeps its slot until the session timeout.
    tokio::task::spawn_blocking(move || drop(Arc::into_inner(a).expect("sole owner"))).await.unwrap();
    let a = Arc::new(subscribe(&cfg(0), 2, &[TOPIC]));
    let (a2, b2) = (a.clone(), b.clone());
    tokio::task::spawn_blocking(move || {
        wait_for_assignment(&[a2.clone(), b2.clone()], &[6, 6]);
        keep_polling(&[a2, b2], Duration::from_secs(2));
    })
    .await
    .unwrap();
    assert_eq!(owned(&a), a_had, "the restarted member got its own partitions back");
    assert_eq!(owned(&b), b_had);
    assert_eq!(b.context().events.lock().unwrap().len(), b_events, "the other member saw no rebalance: {:?}", b.context().events.lock().unwrap());
    tokio::task::spawn_blocking(move || close_all(vec![a, b])).await.unwrap();
    broker.shutdown().await;
}

/// A regex subscription picks up a matching topic created after it
/// subscribed (and ignores one that does not match).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn regex_subscription_picks_up_a_topic_created_later() {
    let dir = tempfile::tempdir().unwrap();
    let broker = common::start(group_args(dir.path())).await;
    let addr = broker.kafka_addr;
    let admin: AdminClient<DefaultClientContext> = common::client(addr).create().unwrap();
    let create = |name: &'static str, partitions: i32| {
        let admin = &admin;
        async move { admin.create_topics([&NewTopic::new(name, partitions, TopicReplication::Fixed(1))], &AdminOptions::new()).await.unwrap()[0].as_ref().unwrap().clone() }
    };
    create("app.codestore.commits", 2).await;
    create("app.search.queries", 1).await;

    let mut cfg = member_config(addr, "regex");
    cfg.set("topic.metadata.refresh.interval.ms", "500");
    let c = Arc::new(subscribe(&cfg, 0, &["^app\\.codestore\\..*"]));
    let c2 = c.clone();
    tokio::task::spawn_blocking(move || wait_for_assignment(&[c2], &[2])).await.unwrap();

    create("app.codestore.reviews", 3).await;
    let c2 = c.clone();
    tokio::task::spawn_blocking(move || wait_for_assignment(&[c2], &[5])).await.unwrap();
    let topics: BTreeSet<String> = owned(&c).into_iter().map(|(t, _)| t).collect();
    assert_eq!(topics, BTreeSet::from(["app.codestore.commits".to_owned(), "app.codestore.reviews".to_owned()]));

    // And it reads from the new topic.
    let producer: FutureProducer = common::producer_config(addr, "all").create().unwrap();
    producer.send(FutureRecord::to("app.codestore.reviews").partition(2).key("k").payload("review"), Duration::from_secs(10)).await.unwrap();
    let c2 = c.clone();
    let got = tokio::task::spawn_blocking(move || {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            assert!(Instant::now() < deadline, "the new topic's record never arrived");
            if let Some(m) = c2.poll(Duration::from_millis(100)) {
                let m = m.unwrap();
                return (m.topic().to_owned(), m.partition(), m.payload().unwrap().to_vec());
            }
        }
    })
    .await
    .unwrap();
    assert_eq!(got, ("app.codestore.reviews".to_owned(), 2, b"review".to_vec()));
    tokio::task::spawn_blocking(move || close_all(vec![c])).await.unwrap();
    broker.shutdown().await;
}

/// 10,000 JoinGroup attempts that never come back: one group holds at most
/// `group_max_size` handed-out member ids (the rest get
/// GROUP_MAX_SIZE_REACHED), those ids expire after the session timeout they
/// asked with, and 10,000 groups created that way are forgotten by the
/// cleanup pass — state stays bounded, and a real group carries on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_join_attempts_leave_bounded_state() {
    use kafka_protocol::messages::join_group_request::JoinGroupRequestProtocol;
    use kafka_protocol::messages::{GroupId, JoinGroupRequest, JoinGroupResponse, ListGroupsRequest, ListGroupsResponse};
    use kafka_protocol::protocol::StrBytes;

    let dir = tempfile::tempdir().unwrap();
    let mut args = group_args(dir.path());
    args.group_min_session_timeout_ms = Some(1000);
    args.group_max_size = Some(100);
    // The cleanup pass runs every tenth of the retention (at least 1 s): 6 s.
    args.offsets_retention_minutes = Some(1);
    let broker = common::start(args).await;
    let addr = broker.kafka_addr;
    let mut sock = tokio::net::TcpStream::connect(addr).await.unwrap();
    let s = |v: &str| StrBytes::from_string(v.to_owned());
    let join_for = |group: &str, member: &str, session_ms: i32| {
        JoinGroupRequest::default()
            .with_group_id(GroupId(s(group)))
            .with_session_timeout_ms(session_ms)
            .with_rebalance_timeout_ms(session_ms)
            .with_member_id(s(member))
            .with_protocol_type(s("consumer"))
            .with_protocols(vec![JoinGroupRequestProtocol::default().with_name(s("range")).with_metadata(bytes::Bytes::from_static(b"m"))])
    };
    let join = |group: &str, member: &str| join_for(group, member, 10_000);
    let mut id = 0;
    let mut codes: HashMap<i16, usize> = HashMap::new();
    for _ in 0..10_000 {
        id += 1;
        let r: JoinGroupResponse = common::call(&mut sock, 11, 5, id, &join("crowded", "")).await;
        *codes.entry(r.error_code).or_default() += 1;
    }
    assert_eq!(codes, HashMap::from([(79, 100), (81, 9_900)]), "MEMBER_ID_REQUIRED up to the group size, then GROUP_MAX_SIZE_REACHED");

    // Handed-out ids expire after the session timeout they asked with.
    for _ in 0..100 {
        id += 1;
        let r: JoinGroupResponse = common::call(&mut sock, 11, 5, id, &join_for("brief", "", 1000)).await;
        assert_eq!(r.error_code, 79);
    }
    id += 1;
    let r: JoinGroupResponse = common::call(&mut sock, 11, 5, id, &join_for("brief", "", 1000)).await;
    assert_eq!(r.error_code, 81, "full");
    tokio::time::sleep(Duration::from_millis(1200)).await;
    id += 1;
    let r: JoinGroupResponse = common::call(&mut sock, 11, 5, id, &join_for("brief", "", 1000)).await;
    assert_eq!(r.error_code, 79, "room again once the ids expired");

    // Another group is unaffected.
    let mut other = tokio::net::TcpStream::connect(addr).await.unwrap();
    let first: JoinGroupResponse = common::call(&mut other, 11, 5, 1, &join("calm", "")).await;
    assert_eq!(first.error_code, 79);
    let joined: JoinGroupResponse = common::call(&mut other, 11, 5, 2, &join("calm", &first.member_id)).await;
    assert_eq!((joined.error_code, joined.generation_id), (0, 1));

    // 10,000 groups, one abandoned join attempt each.
    for g in 0..10_000 {
        id += 1;
        let r: JoinGroupResponse = common::call(&mut sock, 11, 5, id, &join(&format!("drive-by-{g}"), "")).await;
        assert_eq!(r.error_code, 79);
    }
    async fn list(sock: &mut tokio::net::TcpStream, id: i32) -> BTreeSet<String> {
        let r: ListGroupsResponse = common::call(sock, 16, 2, id, &ListGroupsRequest::default()).await;
        r.groups.into_iter().map(|g| g.group_id.0.to_string()).collect()
    }
    id += 1;
    assert_eq!(list(&mut sock, id).await.iter().filter(|g| g.starts_with("drive-by-")).count(), 10_000);

    // Once their ids expire, the cleanup pass forgets every group with
    // neither members nor offsets.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        id += 1;
        let groups = list(&mut sock, id).await;
        if groups.is_empty() {
            break;
        }
        assert!(Instant::now() < deadline, "{} groups still known", groups.len());
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    drop((sock, other));
    broker.shutdown().await;
}

/// Committed offsets of a group without members expire once the group has
/// been empty, and its newest commit is, older than
/// `offsets.retention.minutes` (the broker's clock is moved on, the
/// cleanup pass runs on its own); a group that committed since keeps its
/// offsets.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn offsets_of_empty_groups_expire_after_the_retention() {
    use kafka_protocol::messages::offset_commit_request::{OffsetCommitRequestPartition, OffsetCommitRequestTopic};
    use kafka_protocol::messages::offset_fetch_request::OffsetFetchRequestTopic;
    use kafka_protocol::messages::{GroupId, ListGroupsRequest, ListGroupsResponse, OffsetCommitRequest, OffsetCommitResponse, OffsetFetchRequest, OffsetFetchResponse, TopicName};
    use kafka_protocol::protocol::StrBytes;
    use std::sync::atomic::{AtomicI64, Ordering};

    let dir = tempfile::tempdir().unwrap();
    let mut args = group_args(dir.path());
    // One minute; the cleanup pass runs every tenth of it (6 s).
    args.offsets_retention_minutes = Some(1);
    let t = Arc::new(AtomicI64::new(std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as i64));
    let clock: canopy::engine::Clock = {
        let t = t.clone();
        Arc::new(move || t.load(Ordering::SeqCst))
    };
    let broker = canopy::server::start_with_clock(canopy::config::Config::load(&args).unwrap(), clock).await.unwrap();
    let addr = broker.kafka_addr;
    create_shared_topic(addr).await;
    let mut sock = tokio::net::TcpStream::connect(addr).await.unwrap();
    let s = |v: &str| StrBytes::from_string(v.to_owned());
    let commit = |group: &str| {
        OffsetCommitRequest::default().with_group_id(GroupId(s(group))).with_generation_id_or_member_epoch(-1).with_topics(vec![OffsetCommitRequestTopic::default()
            .with_name(TopicName(s(TOPIC)))
            .with_partitions(vec![OffsetCommitRequestPartition::default().with_partition_index(0).with_committed_offset(42)])])
    };
    let fetch = |group: &str| {
        OffsetFetchRequest::default().with_group_id(GroupId(s(group))).with_topics(Some(vec![OffsetFetchRequestTopic::default().with_name(TopicName(s(TOPIC))).with_partition_indexes(vec![0])]))
    };
    let mut id = 0;
    let mut next = || {
        id += 1;
        id
    };
    let r: OffsetCommitResponse = common::call(&mut sock, 8, 2, next(), &commit("old")).await;
    assert_eq!(r.topics[0].partitions[0].error_code, 0);
    let r: OffsetFetchResponse = common::call(&mut sock, 9, 1, next(), &fetch("old")).await;
    assert_eq!(r.topics[0].partitions[0].committed_offset, 42);

    // Two minutes on: "old" is past the retention; "fresh" commits now.
    t.fetch_add(120_000, Ordering::SeqCst);
    let r: OffsetCommitResponse = common::call(&mut sock, 8, 2, next(), &commit("fresh")).await;
    assert_eq!(r.topics[0].partitions[0].error_code, 0);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let r: OffsetFetchResponse = common::call(&mut sock, 9, 1, next(), &fetch("old")).await;
        if r.topics[0].partitions[0].committed_offset == -1 {
            break;
        }
        assert!(Instant::now() < deadline, "the old group's offsets never expired");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let r: OffsetFetchResponse = common::call(&mut sock, 9, 1, next(), &fetch("fresh")).await;
    assert_eq!(r.topics[0].partitions[0].committed_offset, 42, "a recent commit is kept");
    let groups: ListGroupsResponse = common::call(&mut sock, 16, 2, next(), &ListGroupsRequest::default()).await;
    let names: Vec<String> = groups.groups.iter().map(|g| g.group_id.0.to_string()).collect();
    assert!(!names.contains(&"old".to_string()) && names.contains(&"fresh".to_string()), "{names:?}");
    drop(sock);
    broker.shutdown().await;
}

/// Deleting through the coordinator: librdkafka's DeleteGroups removes an
/// empty group and its offsets, refuses a group with a member, and
/// OffsetDelete removes one partition's offset and keeps the other; the
/// removals are durable (a restart brings nothing back).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleted_groups_and_offsets_stay_deleted_across_a_restart() {
    use kafka_protocol::messages::offset_commit_request::{OffsetCommitRequestPartition, OffsetCommitRequestTopic};
    use kafka_protocol::messages::offset_delete_request::{OffsetDeleteRequestPartition, OffsetDeleteRequestTopic};
    use kafka_protocol::messages::offset_fetch_request::OffsetFetchRequestTopic;
    use kafka_protocol::messages::{GroupId, OffsetCommitRequest, OffsetCommitResponse, OffsetDeleteRequest, OffsetDeleteResponse, OffsetFetchRequest, OffsetFetchResponse, TopicName};
    use kafka_protocol::protocol::StrBytes;

    let dir = tempfile::tempdir().unwrap();
    let s = |v: &str| StrBytes::from_string(v.to_owned());
    let commit = |group: &str| {
        OffsetCommitRequest::default().with_group_id(GroupId(s(group))).with_generation_id_or_member_epoch(-1).with_topics(vec![OffsetCommitRequestTopic::default()
            .with_name(TopicName(s(TOPIC)))
            .with_partitions((0..2).map(|p| OffsetCommitRequestPartition::default().with_partition_index(p).with_committed_offset(40 + p as i64)).collect())])
    };
    let fetch = |group: &str| {
        OffsetFetchRequest::default().with_group_id(GroupId(s(group))).with_topics(Some(vec![OffsetFetchRequestTopic::default().with_name(TopicName(s(TOPIC))).with_partition_indexes(vec![0, 1])]))
    };
    let committed = |r: &OffsetFetchResponse| r.topics[0].partitions.iter().map(|p| p.committed_offset).collect::<Vec<_>>();
    {
        let broker = common::start(group_args(dir.path())).await;
        let addr = broker.kafka_addr;
        create_shared_topic(addr).await;
        let mut sock = tokio::net::TcpStream::connect(addr).await.unwrap();
        for (i, g) in ["gone", "kept"].into_iter().enumerate() {
            let r: OffsetCommitResponse = common::call(&mut sock, 8, 2, i as i32, &commit(g)).await;
            assert!(r.topics[0].partitions.iter().all(|p| p.error_code == 0));
        }
        // A group with a live member is refused, and keeps its offsets.
        let member = Arc::new(group_consumer(addr, "busy", 0));
        tokio::task::block_in_place(|| wait_for_assignment(&[member.clone()], &[PARTITIONS as usize]));
        let admin: AdminClient<DefaultClientContext> = common::client(addr).create().unwrap();
        let results = admin.delete_groups(&["gone", "busy"], &AdminOptions::new()).await.unwrap();
        assert!(results[0].is_ok(), "{:?}", results[0]);
        assert!(matches!(&results[1], Err((g, rdkafka::types::RDKafkaErrorCode::NonEmptyGroup)) if g == "busy"), "{:?}", results[1]);
        drop(member);

        let req = OffsetDeleteRequest::default().with_group_id(GroupId(s("kept"))).with_topics(vec![OffsetDeleteRequestTopic::default()
            .with_name(TopicName(s(TOPIC)))
            .with_partitions(vec![OffsetDeleteRequestPartition::default().with_partition_index(1)])]);
        let r: OffsetDeleteResponse = common::call(&mut sock, 47, 0, 10, &req).await;
        assert_eq!((r.error_code, r.topics[0].partitions[0].error_code), (0, 0));
        let r: OffsetFetchResponse = common::call(&mut sock, 9, 1, 11, &fetch("gone")).await;
        assert_eq!(committed(&r), vec![-1, -1]);
        let r: OffsetFetchResponse = common::call(&mut sock, 9, 1, 12, &fetch("kept")).await;
        assert_eq!(committed(&r), vec![40, -1]);
        drop(sock);
        broker.shutdown().await;
    }
    let broker = common::start(group_args(dir.path())).await;
    let mut sock = tokio::net::TcpStream::connect(broker.kafka_addr).await.unwrap();
    let r: OffsetFetchResponse = common::call(&mut sock, 9, 1, 1, &fetch("gone")).await;
    assert_eq!(committed(&r), vec![-1, -1], "a deleted group's offsets came back");
    let r: OffsetFetchResponse = common::call(&mut sock, 9, 1, 2, &fetch("kept")).await;
    assert_eq!(committed(&r), vec![40, -1], "a deleted offset came back");
    drop(sock);
    broker.shutdown().await;
}
