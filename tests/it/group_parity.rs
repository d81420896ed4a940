//! The classic group coordinator against librdkafka, in the situations
//! where its answers used to differ from Kafka's (librdkafka's own tests
//! 0102 and 0113 expect these outcomes from a Kafka broker):
//! - a consumer that commits from its revoke callback, after the
//!   generation moved on, gets no error other than ILLEGAL_GENERATION and
//!   never loses its assignment (0113 `v_commit_during_rebalance`);
//! - a static cooperative-sticky member restarting costs the other member
//!   no rebalance (0102, KIP-345) although its subscription metadata (the
//!   partitions it owns) changed;
//! - a cooperative-sticky member that unsubscribes costs the other member
//!   exactly one assignment round (0113 `l_unsubscribe`);
//! - an asynchronous commit followed by a committed-offsets query returns
//!   the new offset.

use crate::common;

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer as Base, CommitMode, Consumer, Rebalance};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::{Offset, TopicPartitionList};

/// Counts a consumer's rebalance callbacks, as librdkafka's tests do.
#[derive(Default)]
struct Counts {
    name: &'static str,
    assigns: AtomicUsize,
    revokes: AtomicUsize,
    /// Revokes whose assignment was lost (librdkafka's sign that the
    /// coordinator answered something it should not have).
    lost: AtomicUsize,
    /// In the revoke callback: wait this long, then commit synchronously.
    commit_on_revoke: Option<Duration>,
    /// Every commit error seen, from callbacks and from commit calls.
    commit_errors: Mutex<Vec<String>>,
    closing: AtomicBool,
}

impl rdkafka::ClientContext for Counts {
    fn log(&self, _level: rdkafka::config::RDKafkaLogLevel, fac: &str, msg: &str) {
        if std::env::var_os("GROUPS_DEBUG").is_some() {
            eprintln!("rdkafka[{}] {fac}: {msg}", self.name);
        }
    }
}

impl rdkafka::consumer::ConsumerContext for Counts {
    fn pre_rebalance(&self, consumer: &Base<Self>, r: &Rebalance<'_>) {
        if let Rebalance::Revoke(_) = r {
            self.revokes.fetch_add(1, Ordering::SeqCst);
            if consumer.assignment_lost() {
                self.lost.fetch_add(1, Ordering::SeqCst);
            }
            if let Some(wait) = self.commit_on_revoke {
                // Long enough for the others to have moved the group on.
                std::thread::sleep(wait);
                if let Err(e) = consumer.commit_consumer_state(CommitMode::Sync) {
                    self.note_commit_error(&e);
                }
            }
        }
    }

    fn post_rebalance(&self, _: &Base<Self>, r: &Rebalance<'_>) {
        if let Rebalance::Assign(_) = r {
            self.assigns.fetch_add(1, Ordering::SeqCst);
        }
    }

    fn commit_callback(&self, result: rdkafka::error::KafkaResult<()>, _: &TopicPartitionList) {
        if let Err(e) = result {
            self.note_commit_error(&e);
        }
    }
}

impl Counts {
    fn note_commit_error(&self, e: &rdkafka::error::KafkaError) {
        // What librdkafka's tests let through: nothing to commit, a closing
        // consumer, or a generation the group has replaced.
        let allowed = matches!(e.rdkafka_error_code(), Some(RDKafkaErrorCode::NoOffset) | Some(RDKafkaErrorCode::IllegalGeneration))
            || (self.closing.load(Ordering::SeqCst) && e.rdkafka_error_code() == Some(RDKafkaErrorCode::BrokerDestroy));
        if !allowed {
            self.commit_errors.lock().unwrap().push(e.to_string());
        }
    }

    fn counts(&self) -> (usize, usize) {
        (self.assigns.load(Ordering::SeqCst), self.revokes.load(Ordering::SeqCst))
    }
}

type Consumer_ = Base<Counts>;

fn config(addr: std::net::SocketAddr, group: &str) -> rdkafka::ClientConfig {
    let mut c = common::client(addr);
    c.set("group.id", group)
        .set("enable.auto.commit", "false")
        .set("auto.offset.reset", "earliest")
        .set("session.timeout.ms", "6000")
        .set("heartbeat.interval.ms", "300")
        .set("fetch.wait.max.ms", "100")
        .set("partition.assignment.strategy", "cooperative-sticky");
    if std::env::var_os("GROUPS_DEBUG").is_some() {
        c.set("debug", "cgrp").set_log_level(rdkafka::config::RDKafkaLogLevel::Debug);
    }
    c
}

fn consumer(c: &rdkafka::ClientConfig, counts: Counts, topics: &[&str]) -> Arc<Consumer_> {
    let consumer: Consumer_ = c.create_with_context(counts).unwrap();
    consumer.subscribe(topics).unwrap();
    Arc::new(consumer)
}

fn owned(c: &Consumer_) -> usize {
    c.assignment().map(|a| a.count()).unwrap_or(0)
}

fn poll_until(consumers: &[Arc<Consumer_>], what: &str, done: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}; assignments {:?}", consumers.iter().map(|c| owned(c)).collect::<Vec<_>>());
        for c in consumers {
            let _ = c.poll(Duration::from_millis(20));
        }
    }
}

fn keep_polling(consumers: &[Arc<Consumer_>], d: Duration) {
    let until = Instant::now() + d;
    poll_until(consumers, "nothing", || Instant::now() >= until);
}

/// Unsubscribes and serves the revocation through poll (the close that
/// dropping the last reference does would wait for it).
fn close(c: &Arc<Consumer_>) {
    c.context().closing.store(true, Ordering::SeqCst);
    let had = owned(c);
    let revokes = c.context().revokes.load(Ordering::SeqCst);
    c.unsubscribe();
    poll_until(std::slice::from_ref(c), "the revocation on close", || had == 0 || c.context().revokes.load(Ordering::SeqCst) > revokes);
}

/// 0113 `l_unsubscribe`: two members of a new group (both within the
/// initial delay) get two partitions each in one round; when one
/// unsubscribes, the other gets the rest in exactly one more round, and
/// revokes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unsubscribing_cooperative_member_costs_the_other_one_round() {
    let dir = tempfile::tempdir().unwrap();
    // Kafka's default initial delay (3 s), as librdkafka's test assumes.
    let broker = common::start(common::args(dir.path())).await;
    let addr = broker.kafka_addr;
    common::create_topics(addr, &[("parity.unsub.a", 2), ("parity.unsub.b", 2)]).await;
    let cfg = config(addr, "parity-unsubscribe");
    let topics = ["parity.unsub.a", "parity.unsub.b"];
    let c1 = consumer(&cfg, Counts { name: "c1", ..Default::default() }, &topics);
    let c2 = consumer(&cfg, Counts { name: "c2", ..Default::default() }, &topics);
    let (a, b) = (c1.clone(), c2.clone());
    tokio::task::spawn_blocking(move || {
        let all = [a.clone(), b.clone()];
        poll_until(&all, "2 + 2", || owned(&a) == 2 && owned(&b) == 2);
        assert_eq!(a.context().counts(), (1, 0), "c1: one assign round");
        assert_eq!(b.context().counts(), (1, 0), "c2: one assign round");
        a.unsubscribe();
        poll_until(&all, "0 + 4", || owned(&a) == 0 && owned(&b) == 4);
        // Let any extra round happen before counting.
        keep_polling(&all, Duration::from_secs(3));
        assert_eq!(owned(&b), 4);
        assert_eq!(a.context().counts(), (1, 1), "c1: its partitions revoked once, nothing new");
        assert_eq!(b.context().counts(), (2, 0), "c2: exactly one more assign round, nothing revoked");
    })
    .await
    .unwrap();
    for c in [&c1, &c2] {
        assert_eq!(c.context().lost.load(Ordering::SeqCst), 0, "{}: an assignment was lost", c.context().name);
    }
    tokio::task::spawn_blocking(move || {
        close(&c1);
        close(&c2);
    })
    .await
    .unwrap();
    broker.shutdown().await;
}

/// KIP-345 with cooperative-sticky: a static member that restarts comes
/// back with different subscription metadata (it owns nothing now), which
/// does not change the group's protocol, so Kafka hands it its assignment
/// back without a rebalance; the other member sees no callback at all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_static_cooperative_member_costs_the_other_no_rebalance() {
    let dir = tempfile::tempdir().unwrap();
    let mut args = common::args(dir.path());
    args.group_initial_rebalance_delay_ms = Some(0);
    let broker = common::start(args).await;
    let addr = broker.kafka_addr;
    common::create_topic(addr, "parity.static", 6).await;
    let cfg = |i: usize| {
        let mut c = config(addr, "parity-static");
        c.set("group.instance.id", format!("static-{i}")).set("session.timeout.ms", "10000").set("max.poll.interval.ms", "10000");
        c
    };
    let a = consumer(&cfg(0), Counts { name: "a", ..Default::default() }, &["parity.static"]);
    let b = consumer(&cfg(1), Counts { name: "b", ..Default::default() }, &["parity.static"]);
    let (a2, b2) = (a.clone(), b.clone());
    tokio::task::spawn_blocking(move || {
        poll_until(&[a2.clone(), b2.clone()], "3 + 3", || owned(&a2) == 3 && owned(&b2) == 3);
        keep_polling(&[a2, b2], Duration::from_secs(1));
    })
    .await
    .unwrap();
    let a_had: BTreeSet<i32> = a.assignment().unwrap().elements().iter().map(|e| e.partition()).collect();
    let b_counts = b.context().counts();
    // A static member's close sends no LeaveGroup: the group keeps its
    // slot until the session timeout.
    tokio::task::spawn_blocking(move || drop(Arc::into_inner(a).expect("sole owner"))).await.unwrap();
    let a = consumer(&cfg(0), Counts { name: "a2", ..Default::default() }, &["parity.static"]);
    let (a2, b2) = (a.clone(), b.clone());
    tokio::task::spawn_blocking(move || {
        poll_until(&[a2.clone(), b2.clone()], "the restarted member's partitions", || owned(&a2) == 3);
        keep_polling(&[a2, b2], Duration::from_secs(3));
    })
    .await
    .unwrap();
    let a_has: BTreeSet<i32> = a.assignment().unwrap().elements().iter().map(|e| e.partition()).collect();
    assert_eq!(a_has, a_had, "the restarted member got its own partitions back");
    assert_eq!(owned(&b), 3);
    assert_eq!(b.context().counts(), b_counts, "the other member saw no rebalance callback");
    tokio::task::spawn_blocking(move || {
        close(&a);
        close(&b);
    })
    .await
    .unwrap();
    broker.shutdown().await;
}

/// 0113 `v_commit_during_rebalance` (with rebalance callbacks, manual
/// commits): the revoke callback waits 2 s, long enough for the rejoin to
/// bump the generation, then commits. Every commit either succeeds or gets
/// ILLEGAL_GENERATION (never UNKNOWN_MEMBER_ID or REBALANCE_IN_PROGRESS),
/// and no revoke is an assignment loss — up to and including the close.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commits_from_revoke_callbacks_get_only_kafkas_answers() {
    let dir = tempfile::tempdir().unwrap();
    let broker = common::start(common::args(dir.path())).await;
    let addr = broker.kafka_addr;
    const TOPIC: &str = "parity.commit";
    const PARTITIONS: i32 = 6;
    common::create_topic(addr, TOPIC, PARTITIONS).await;
    let producer: FutureProducer = common::producer_config(addr, "all").create().unwrap();
    for p in 0..PARTITIONS {
        for i in 0..100 {
            producer.send_result(FutureRecord::to(TOPIC).partition(p).key("k").payload(&format!("{p}-{i}"))).map_err(|(e, _)| e).unwrap().await.unwrap().unwrap();
        }
    }
    let cfg = config(addr, "parity-commit");
    let counts = |name| Counts { name, commit_on_revoke: Some(Duration::from_secs(2)), ..Default::default() };
    let c1 = consumer(&cfg, counts("c1"), &[TOPIC]);
    let c2_cfg = cfg.clone();
    let (a, seen) = (c1.clone(), Arc::new(AtomicUsize::new(0)));
    let s = seen.clone();
    tokio::task::spawn_blocking(move || {
        // Consume some so there is something to commit.
        poll_until(&[], "c1's first records", || {
            if let Some(Ok(_)) = a.poll(Duration::from_millis(50)) {
                s.fetch_add(1, Ordering::SeqCst);
            }
            s.load(Ordering::SeqCst) >= 50
        });
    })
    .await
    .unwrap();
    let c2 = consumer(&c2_cfg, counts("c2"), &[TOPIC]);
    let (a, b) = (c1.clone(), c2.clone());
    tokio::task::spawn_blocking(move || {
        let until = Instant::now() + Duration::from_secs(12);
        while Instant::now() < until {
            if let Some(Ok(_)) = a.poll(Duration::from_millis(100)) {
                if let Err(e) = a.commit_consumer_state(CommitMode::Sync) {
                    a.context().note_commit_error(&e);
                }
            }
            let _ = b.poll(Duration::from_millis(100));
        }
        assert!(owned(&a) + owned(&b) == PARTITIONS as usize, "the group settled: {} + {}", owned(&a), owned(&b));
    })
    .await
    .unwrap();
    let outcome = tokio::task::spawn_blocking(move || {
        let mut outcome = Vec::new();
        for c in [c1, c2] {
            close(&c);
            let name = c.context().name;
            let errors = c.context().commit_errors.lock().unwrap().clone();
            outcome.push((name, errors, c.context().lost.load(Ordering::SeqCst), c.context().revokes.load(Ordering::SeqCst)));
        }
        outcome
    })
    .await
    .unwrap();
    for (name, errors, lost, revokes) in outcome {
        assert!(errors.is_empty(), "{name}: commit errors Kafka would not give: {errors:?}");
        assert_eq!(lost, 0, "{name}: an assignment was lost");
        assert!(revokes > 0, "{name}: the scenario had no revocation");
    }
    broker.shutdown().await;
}

/// An asynchronous commit and then a committed-offsets query from the same
/// consumer: the query sees the commit, every time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_committed_query_after_an_async_commit_sees_it() {
    let dir = tempfile::tempdir().unwrap();
    let broker = common::start(common::args(dir.path())).await;
    let addr = broker.kafka_addr;
    common::create_topic(addr, "parity.async", 1).await;
    let c: Consumer_ = config(addr, "parity-async").create_with_context(Counts { name: "async", ..Default::default() }).unwrap();
    let c = Arc::new(c);
    let c2 = c.clone();
    tokio::task::spawn_blocking(move || {
        // librdkafka defers a commit made before it knows the coordinator
        // and may send a later query first: find the coordinator once.
        let mut first = TopicPartitionList::new();
        first.add_partition_offset("parity.async", 0, Offset::Offset(0)).unwrap();
        c2.commit(&first, CommitMode::Sync).unwrap();
        for offset in 1..=200i64 {
            let mut tpl = TopicPartitionList::new();
            tpl.add_partition_offset("parity.async", 0, Offset::Offset(offset)).unwrap();
            c2.commit(&tpl, CommitMode::Async).unwrap();
            let mut ask = TopicPartitionList::new();
            ask.add_partition("parity.async", 0);
            let got = c2.committed_offsets(ask, Duration::from_secs(10)).unwrap();
            assert_eq!(got.elements()[0].offset(), Offset::Offset(offset), "round {offset}");
        }
        let _ = c2.poll(Duration::from_millis(100));
        assert!(c2.context().commit_errors.lock().unwrap().is_empty(), "{:?}", c2.context().commit_errors.lock().unwrap());
    })
    .await
    .unwrap();
    drop(c);
    broker.shutdown().await;
}
