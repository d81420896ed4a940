//! The next-generation consumer group protocol (KIP-848) through
//! librdkafka (`group.protocol=consumer`): three members share twelve
//! partitions, a fourth joins and one leaves while a producer writes;
//! every record is consumed exactly once with commits, and a member never
//! has a partition it keeps revoked along the way (the broker revokes only
//! what moves). Also: ListGroups and DescribeGroups show the group as a
//! consumer group, ConsumerGroupDescribe gives its epochs and members, and
//! a classic member cannot join it while it has members.

use crate::common;

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer as Base, CommitMode, Consumer, Rebalance};
use rdkafka::message::Message;
use rdkafka::producer::{FutureProducer, FutureRecord};

const TOPIC: &str = "kip848.events";
const PARTITIONS: i32 = 12;

/// Rebalance events in order: (assigned?, partitions), and the records seen.
#[derive(Default)]
struct Ctx {
    name: String,
    events: Mutex<Vec<(bool, BTreeSet<i32>)>>,
}

impl rdkafka::ClientContext for Ctx {
    fn log(&self, _level: rdkafka::config::RDKafkaLogLevel, fac: &str, msg: &str) {
        if std::env::var_os("GROUPS_DEBUG").is_some() {
            eprintln!("rdkafka[{}] {fac}: {msg}", self.name);
        }
    }
}

impl rdkafka::consumer::ConsumerContext for Ctx {
    fn pre_rebalance(&self, consumer: &Base<Self>, r: &Rebalance<'_>) {
        if let Rebalance::Revoke(l) = r {
            // Commit what was processed before the partitions move.
            let _ = consumer.commit_consumer_state(CommitMode::Sync);
            self.events.lock().unwrap().push((false, l.elements().iter().map(|e| e.partition()).collect()));
        }
    }
    fn post_rebalance(&self, _: &Base<Self>, r: &Rebalance<'_>) {
        if let Rebalance::Assign(l) = r {
            self.events.lock().unwrap().push((true, l.elements().iter().map(|e| e.partition()).collect()));
        }
    }
}

type Consumer_ = Base<Ctx>;

fn config(addr: std::net::SocketAddr, group: &str) -> rdkafka::ClientConfig {
    let mut c = common::client(addr);
    c.set("group.id", group)
        .set("group.protocol", "consumer")
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        .set("auto.offset.reset", "earliest")
        .set("fetch.wait.max.ms", "100");
    if std::env::var_os("GROUPS_DEBUG").is_some() {
        c.set("debug", "cgrp").set_log_level(rdkafka::config::RDKafkaLogLevel::Debug);
    }
    c
}

fn args(dir: &std::path::Path) -> canopy::config::ServeArgs {
    let mut a = common::args(dir);
    a.group_consumer_heartbeat_interval_ms = Some(300);
    a.group_consumer_session_timeout_ms = Some(6000);
    a
}

fn owned(c: &Consumer_) -> BTreeSet<i32> {
    c.assignment().map(|a| a.elements().iter().map(|e| e.partition()).collect()).unwrap_or_default()
}

/// A member on its own thread: polls, records each record it sees,
/// commits every 100 records (and on revoke), until `stop`; then leaves.
struct Member {
    consumer: Arc<Consumer_>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

type Seen = Arc<Mutex<HashMap<(i32, i64), Vec<String>>>>;

impl Member {
    fn start(addr: std::net::SocketAddr, name: &str, seen: Seen) -> Member {
        let consumer: Consumer_ = config(addr, "kip848").create_with_context(Ctx { name: name.into(), ..Default::default() }).unwrap();
        consumer.subscribe(&[TOPIC]).unwrap();
        let consumer = Arc::new(consumer);
        let stop = Arc::new(AtomicBool::new(false));
        let (c, s, n) = (consumer.clone(), stop.clone(), name.to_owned());
        let thread = std::thread::spawn(move || {
            let mut since = 0;
            while !s.load(Ordering::SeqCst) {
                match c.poll(Duration::from_millis(50)) {
                    Some(Ok(m)) => {
                        seen.lock().unwrap().entry((m.partition(), m.offset())).or_default().push(n.clone());
                        c.store_offset_from_message(&m).unwrap();
                        since += 1;
                        if since >= 100 {
                            let _ = c.commit_consumer_state(CommitMode::Sync);
                            since = 0;
                        }
                    }
                    Some(Err(e)) => eprintln!("{n}: {e}"),
                    None => {
                        if since > 0 {
                            let _ = c.commit_consumer_state(CommitMode::Sync);
                            since = 0;
                        }
                    }
                }
            }
            let _ = c.commit_consumer_state(CommitMode::Sync);
            // Leave: unsubscribe, serve the revocation, then close.
            c.unsubscribe();
            let until = Instant::now() + Duration::from_secs(10);
            while !owned(&c).is_empty() && Instant::now() < until {
                let _ = c.poll(Duration::from_millis(50));
            }
        });
        Member { consumer, stop, thread: Some(thread) }
    }

    fn leave(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        self.thread.take().unwrap().join().unwrap();
    }

    fn events(&self) -> Vec<(bool, BTreeSet<i32>)> {
        self.consumer.context().events.lock().unwrap().clone()
    }
}

fn wait_for(members: &[&Member], want: &[usize], what: &str) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let sizes: Vec<usize> = members.iter().map(|m| owned(&m.consumer).len()).collect();
        let all: BTreeSet<i32> = members.iter().flat_map(|m| owned(&m.consumer)).collect();
        let mut sorted = sizes.clone();
        sorted.sort();
        if sorted == want && all.len() == PARTITIONS as usize {
            return;
        }
        assert!(Instant::now() < deadline, "{what}: stuck at {sizes:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Partitions a member had revoked among `events[from..]`.
fn revoked_since(events: &[(bool, BTreeSet<i32>)], from: usize) -> BTreeSet<i32> {
    events[from..].iter().filter(|(a, _)| !a).flat_map(|(_, p)| p.iter().copied()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn members_join_and_leave_and_every_record_is_consumed_once() {
    let dir = tempfile::tempdir().unwrap();
    let broker = common::start(args(dir.path())).await;
    let addr = broker.kafka_addr;
    common::create_topic(addr, TOPIC, PARTITIONS).await;

    // A producer writes throughout.
    const RECORDS: usize = 30_000;
    let producer: FutureProducer = common::producer_config(addr, "all").create().unwrap();
    let writing = tokio::spawn(async move {
        // 1,000 at a time, 0.3 s apart: about the span of the membership
        // changes.
        for chunk in 0..RECORDS / 1000 {
            let mut acks = Vec::with_capacity(1000);
            for i in chunk * 1000..(chunk + 1) * 1000 {
                let key = format!("k{i}");
                acks.push(producer.send_result(FutureRecord::to(TOPIC).partition((i % PARTITIONS as usize) as i32).key(&key).payload("v")).map_err(|(e, _)| e).unwrap());
            }
            for a in acks {
                a.await.unwrap().unwrap();
            }
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    });

    let seen: Seen = Arc::default();
    let s = seen.clone();
    let outcome = tokio::task::spawn_blocking(move || {
        let mut members: Vec<Member> = (0..3).map(|i| Member::start(addr, &format!("m{i}"), s.clone())).collect();
        wait_for(&members.iter().collect::<Vec<_>>(), &[4, 4, 4], "three members");
        let before: Vec<BTreeSet<i32>> = members.iter().map(|m| owned(&m.consumer)).collect();
        let marks: Vec<usize> = members.iter().map(|m| m.events().len()).collect();

        // A fourth joins: each of the others gives up one partition and
        // keeps fetching the rest.
        members.push(Member::start(addr, "m3", s.clone()));
        wait_for(&members.iter().collect::<Vec<_>>(), &[3, 3, 3, 3], "a fourth joins");
        for i in 0..3 {
            let after = owned(&members[i].consumer);
            let kept: BTreeSet<i32> = before[i].intersection(&after).copied().collect();
            let revoked = revoked_since(&members[i].events(), marks[i]);
            assert!(revoked.is_disjoint(&kept), "m{i} had kept partitions revoked: {revoked:?} of {kept:?}");
            assert_eq!(kept.len(), 3, "m{i} kept three of its four");
        }

        // m1 leaves: the others take its partitions, keeping their own.
        let before: Vec<BTreeSet<i32>> = members.iter().map(|m| owned(&m.consumer)).collect();
        let marks: Vec<usize> = members.iter().map(|m| m.events().len()).collect();
        members[1].leave();
        let stay = [0usize, 2, 3];
        wait_for(&stay.iter().map(|&i| &members[i]).collect::<Vec<_>>(), &[4, 4, 4], "one leaves");
        for &i in &stay {
            let revoked = revoked_since(&members[i].events(), marks[i]);
            assert!(revoked.is_empty(), "m{i} lost {revoked:?} when another left");
            assert!(before[i].is_subset(&owned(&members[i].consumer)));
        }
        (members, stay)
    })
    .await
    .unwrap();
    writing.await.unwrap();

    // Read until everything produced was seen, then check exactly once.
    let (mut members, stay) = outcome;
    let s = seen.clone();
    tokio::task::spawn_blocking(move || {
        let deadline = Instant::now() + Duration::from_secs(120);
        while s.lock().unwrap().len() < RECORDS {
            assert!(Instant::now() < deadline, "consumed {} of {RECORDS}", s.lock().unwrap().len());
            std::thread::sleep(Duration::from_millis(100));
        }
        std::thread::sleep(Duration::from_secs(1));
        for &i in &stay {
            members[i].leave();
        }
    })
    .await
    .unwrap();
    let seen = seen.lock().unwrap();
    assert_eq!(seen.len(), RECORDS);
    let twice: Vec<_> = seen.iter().filter(|(_, who)| who.len() > 1).take(5).collect();
    assert!(twice.is_empty(), "records consumed more than once: {twice:?}");

    // The group as the admin APIs see it: a consumer group, now empty.
    let mut sock = tokio::net::TcpStream::connect(addr).await.unwrap();
    use kafka_protocol::messages::{ConsumerGroupDescribeRequest, ConsumerGroupDescribeResponse, GroupId, ListGroupsRequest, ListGroupsResponse};
    use kafka_protocol::protocol::StrBytes;
    let r: ListGroupsResponse = common::call(&mut sock, 16, 5, 1, &ListGroupsRequest::default().with_types_filter(vec![StrBytes::from_static_str("consumer")])).await;
    let g = r.groups.iter().find(|g| g.group_id.0.as_str() == "kip848").expect("listed as a consumer group");
    assert_eq!((g.group_type.as_str(), g.protocol_type.as_str(), g.group_state.as_str()), ("consumer", "consumer", "Empty"));
    let r: ConsumerGroupDescribeResponse = common::call(&mut sock, 69, 1, 2, &ConsumerGroupDescribeRequest::default().with_group_ids(vec![GroupId(StrBytes::from_static_str("kip848")), GroupId(StrBytes::from_static_str("nope"))])).await;
    assert_eq!((r.groups[0].error_code, r.groups[0].group_state.as_str()), (0, "Empty"));
    assert!(r.groups[0].group_epoch >= 5, "epochs moved with each change: {}", r.groups[0].group_epoch);
    assert_eq!(r.groups[1].error_code, 69, "GROUP_ID_NOT_FOUND");
    drop(sock);
    broker.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn classic_and_consumer_groups_take_over_each_others_empty_groups_only() {
    let dir = tempfile::tempdir().unwrap();
    let broker = common::start(args(dir.path())).await;
    let addr = broker.kafka_addr;
    common::create_topic(addr, TOPIC, 2).await;
    let new_member = move |protocol: &str| {
        let mut c = config(addr, "shared-name");
        c.set("group.protocol", protocol);
        if protocol == "classic" {
            c.set("session.timeout.ms", "6000").set("heartbeat.interval.ms", "300");
        }
        let m: Consumer_ = c.create_with_context(Ctx::default()).unwrap();
        m.subscribe(&[TOPIC]).unwrap();
        Arc::new(m)
    };
    tokio::task::spawn_blocking(move || {
        // A consumer-protocol member makes it a consumer group.
        let a = new_member("consumer");
        let until = Instant::now() + Duration::from_secs(30);
        while owned(&a).len() < 2 {
            assert!(Instant::now() < until, "the consumer member got nothing");
            let _ = a.poll(Duration::from_millis(50));
        }
        // A classic member cannot join while it has members.
        let b = new_member("classic");
        let until = Instant::now() + Duration::from_secs(3);
        while Instant::now() < until {
            let _ = a.poll(Duration::from_millis(20));
            let _ = b.poll(Duration::from_millis(20));
        }
        assert!(owned(&b).is_empty(), "a classic member joined a consumer group");
        // Once the consumer member leaves, the classic one takes it over.
        a.unsubscribe();
        let until = Instant::now() + Duration::from_secs(10);
        while !owned(&a).is_empty() && Instant::now() < until {
            let _ = a.poll(Duration::from_millis(20));
        }
        drop(a);
        let until = Instant::now() + Duration::from_secs(60);
        while owned(&b).len() < 2 {
            assert!(Instant::now() < until, "the classic member never took over the empty group");
            let _ = b.poll(Duration::from_millis(50));
        }
        b.unsubscribe();
        let until = Instant::now() + Duration::from_secs(10);
        while !owned(&b).is_empty() && Instant::now() < until {
            let _ = b.poll(Duration::from_millis(20));
        }
    })
    .await
    .unwrap();
    broker.shutdown().await;
}
