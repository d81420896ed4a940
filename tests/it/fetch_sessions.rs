//! Fetch sessions (KIP-227) on the wire: a full fetch of 1,000 partitions
//! opens a session; incremental fetches name only what changed and are
//! answered only with partitions that have news; forgotten partitions stay
//! out; a long poll wakes for a session partition; ids never issued,
//! epochs out of order and another principal's session get Kafka's errors
//! and change nothing; the cache is bounded. (librdkafka fetches without
//! sessions; kafka-python's sessions are checked in the compat suite.)

use crate::common;

use std::time::Duration;

use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic, ForgottenTopic};
use kafka_protocol::messages::{FetchRequest, FetchResponse, TopicName};
use kafka_protocol::protocol::StrBytes;
use rdkafka::producer::{FutureProducer, FutureRecord};
use tokio::net::TcpStream;

const FETCH: i16 = 1;
const V: i16 = 12;
const NOT_FOUND: i16 = 70;
const BAD_EPOCH: i16 = 71;

fn name(s: &str) -> TopicName {
    TopicName(StrBytes::from_string(s.to_owned()))
}

fn request(session_id: i32, epoch: i32, topic: &str, parts: &[(i32, i64)], forget: &[i32], wait_ms: i32) -> FetchRequest {
    let topics = if parts.is_empty() {
        vec![]
    } else {
        vec![FetchTopic::default()
            .with_topic(name(topic))
            .with_partitions(parts.iter().map(|(p, o)| FetchPartition::default().with_partition(*p).with_fetch_offset(*o).with_partition_max_bytes(1 << 20)).collect())]
    };
    let forgotten = if forget.is_empty() { vec![] } else { vec![ForgottenTopic::default().with_topic(name(topic)).with_partitions(forget.to_vec())] };
    FetchRequest::default()
        .with_replica_id(kafka_protocol::messages::BrokerId(-1))
        .with_max_wait_ms(wait_ms)
        .with_min_bytes(1)
        .with_max_bytes(50 << 20)
        .with_session_id(session_id)
        .with_session_epoch(epoch)
        .with_topics(topics)
        .with_forgotten_topics_data(forgotten)
}

/// (partition, bytes of records) of each partition answered, in order.
fn answered(r: &FetchResponse) -> Vec<(i32, usize)> {
    r.responses.iter().flat_map(|t| t.partitions.iter().map(|p| (p.partition_index, p.records.as_ref().map(|b| b.len()).unwrap_or(0)))).collect()
}

async fn produce(producer: &FutureProducer, topic: &str, partition: i32) {
    producer.send(FutureRecord::to(topic).partition(partition).key("k").payload("v"), Duration::from_secs(10)).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_of_a_thousand_partitions_answers_only_what_changed() {
    let dir = tempfile::tempdir().unwrap();
    let broker = common::start(common::args(dir.path())).await;
    let addr = broker.kafka_addr;
    const T: &str = "sessions.many";
    common::create_topic(addr, T, 1000).await;
    let producer: FutureProducer = common::producer_config(addr, "all").create().unwrap();
    let mut sock = TcpStream::connect(addr).await.unwrap();
    let all: Vec<(i32, i64)> = (0..1000).map(|p| (p, 0)).collect();

    // The full fetch opens a session and answers every partition.
    let r: FetchResponse = common::call(&mut sock, FETCH, V, 1, &request(0, 0, T, &all, &[], 0)).await;
    assert_eq!(r.error_code, 0);
    let id = r.session_id;
    assert!(id > 0, "a session was opened");
    assert_eq!(answered(&r).len(), 1000);

    // Nothing changed: an incremental fetch naming nothing gets nothing.
    let r: FetchResponse = common::call(&mut sock, FETCH, V, 2, &request(id, 1, T, &[], &[], 0)).await;
    assert_eq!((r.error_code, r.session_id), (0, id));
    assert!(answered(&r).is_empty(), "{:?}", answered(&r));

    // Records in three partitions: only those three are answered.
    for p in [7, 500, 999] {
        produce(&producer, T, p).await;
    }
    let r: FetchResponse = common::call(&mut sock, FETCH, V, 3, &request(id, 2, T, &[], &[], 0)).await;
    let got = answered(&r);
    assert_eq!(got.iter().map(|(p, _)| *p).collect::<Vec<_>>(), vec![7, 500, 999]);
    assert!(got.iter().all(|(_, b)| *b > 0), "with their records");

    // The client moves past them (naming only those three): nothing new.
    let moved = [(7, 1), (500, 1), (999, 1)];
    let r: FetchResponse = common::call(&mut sock, FETCH, V, 4, &request(id, 3, T, &moved, &[], 0)).await;
    assert!(answered(&r).is_empty(), "{:?}", answered(&r));

    // A forgotten partition is no longer read.
    let r: FetchResponse = common::call(&mut sock, FETCH, V, 5, &request(id, 4, T, &[], &[7], 0)).await;
    assert!(answered(&r).is_empty());
    produce(&producer, T, 7).await;
    produce(&producer, T, 8).await;
    let r: FetchResponse = common::call(&mut sock, FETCH, V, 6, &request(id, 5, T, &[], &[], 0)).await;
    assert_eq!(answered(&r).iter().map(|(p, _)| *p).collect::<Vec<_>>(), vec![8], "7 was forgotten");

    // A long poll wakes for a record in a session partition it was not
    // told about in this request.
    let p2 = producer.clone();
    let later = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(300)).await;
        produce(&p2, T, 42).await;
    });
    let r: FetchResponse = common::call(&mut sock, FETCH, V, 7, &request(id, 6, T, &[(8, 1)], &[], 20_000)).await;
    later.await.unwrap();
    assert_eq!(answered(&r).iter().map(|(p, _)| *p).collect::<Vec<_>>(), vec![42]);

    // Another connection may go on with the session (clients reconnect).
    let mut other = TcpStream::connect(addr).await.unwrap();
    let r: FetchResponse = common::call(&mut other, FETCH, V, 8, &request(id, 7, T, &[(42, 1)], &[], 0)).await;
    assert_eq!((r.error_code, r.session_id), (0, id));
    drop((sock, other));
    broker.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_session_requests_get_kafkas_errors_and_change_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let broker = common::start(common::args(dir.path())).await;
    let addr = broker.kafka_addr;
    const T: &str = "sessions.bad";
    common::create_topic(addr, T, 4).await;
    let mut sock = TcpStream::connect(addr).await.unwrap();
    let all: Vec<(i32, i64)> = (0..4).map(|p| (p, 0)).collect();
    let r: FetchResponse = common::call(&mut sock, FETCH, V, 1, &request(0, 0, T, &all, &[], 0)).await;
    let id = r.session_id;
    assert!(id > 0);
    let cases: &[(i32, i32, i16)] = &[
        (id.wrapping_add(1).max(1), 1, NOT_FOUND), // never issued
        (0, 1, NOT_FOUND),                         // an epoch without a session
        (-3, 1, NOT_FOUND),
        (id, 2, BAD_EPOCH),                        // ahead
        (id, i32::MAX, BAD_EPOCH),
        (id, -7, BAD_EPOCH),
    ];
    for (n, (sid, epoch, want)) in cases.iter().enumerate() {
        let r: FetchResponse = common::call(&mut sock, FETCH, V, 10 + n as i32, &request(*sid, *epoch, T, &[(0, 5)], &[0], 0)).await;
        assert_eq!((r.error_code, r.session_id, r.responses.len()), (*want, 0, 0), "session {sid} epoch {epoch}");
    }
    // Nothing moved: epoch 1 is still the one expected, with every
    // partition (the refused requests' offsets and forgets were not taken).
    let r: FetchResponse = common::call(&mut sock, FETCH, V, 20, &request(id, 1, T, &[], &[], 0)).await;
    assert_eq!((r.error_code, r.session_id), (0, id));
    // A repeated epoch (a retried request) is refused.
    let r: FetchResponse = common::call(&mut sock, FETCH, V, 21, &request(id, 1, T, &[], &[], 0)).await;
    assert_eq!(r.error_code, BAD_EPOCH);
    // Epoch -1 closes it and is answered in full without a session.
    let r: FetchResponse = common::call(&mut sock, FETCH, V, 22, &request(id, -1, T, &all, &[], 0)).await;
    assert_eq!((r.error_code, r.session_id, answered(&r).len()), (0, 0, 4));
    let r: FetchResponse = common::call(&mut sock, FETCH, V, 23, &request(id, 2, T, &[], &[], 0)).await;
    assert_eq!(r.error_code, NOT_FOUND, "closed");
    // A full fetch naming a session closes it and opens a new one.
    let r: FetchResponse = common::call(&mut sock, FETCH, V, 24, &request(0, 0, T, &all, &[], 0)).await;
    let a = r.session_id;
    let r: FetchResponse = common::call(&mut sock, FETCH, V, 25, &request(a, 0, T, &all, &[], 0)).await;
    let b = r.session_id;
    assert!(b > 0 && b != a);
    let r: FetchResponse = common::call(&mut sock, FETCH, V, 26, &request(a, 1, T, &[], &[], 0)).await;
    assert_eq!(r.error_code, NOT_FOUND, "the full fetch closed the session it named");
    // Older versions have no sessions: answered in full, session id 0.
    let r: FetchResponse = common::call(&mut sock, FETCH, 6, 27, &request(0, 0, T, &all, &[], 0)).await;
    assert_eq!(answered(&r).len(), 4);
    drop(sock);
    broker.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_session_cache_is_bounded() {
    let dir = tempfile::tempdir().unwrap();
    let mut args = common::args(dir.path());
    args.max_incremental_fetch_session_cache_slots = Some(2);
    let broker = common::start(args).await;
    let addr = broker.kafka_addr;
    const T: &str = "sessions.bounded";
    common::create_topic(addr, T, 2).await;
    let mut sock = TcpStream::connect(addr).await.unwrap();
    let all = [(0, 0), (1, 0)];
    let mut ids = Vec::new();
    for i in 0..3 {
        let r: FetchResponse = common::call(&mut sock, FETCH, V, i, &request(0, 0, T, &all, &[], 0)).await;
        assert_eq!((r.error_code, answered(&r).len()), (0, 2), "answered in full either way");
        ids.push(r.session_id);
    }
    assert!(ids[0] > 0 && ids[1] > 0);
    assert_eq!(ids[2], 0, "no room: no session (nothing to evict within two minutes)");
    for (n, id) in ids[..2].iter().enumerate() {
        let r: FetchResponse = common::call(&mut sock, FETCH, V, 10 + n as i32, &request(*id, 1, T, &[], &[], 0)).await;
        assert_eq!(r.error_code, 0, "the first two still work");
    }
    let metrics = reqwest::get(format!("http://{}/metrics", broker.admin_addr)).await.unwrap().text().await.unwrap();
    assert!(metrics.contains("canopy_fetch_sessions{state=\"used\"} 2"), "{}", metrics.lines().filter(|l| l.contains("fetch_session")).collect::<Vec<_>>().join("\n"));
    assert!(metrics.contains("canopy_fetch_incremental_total 2"));
    drop(sock);
    broker.shutdown().await;
}
