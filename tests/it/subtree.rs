//! Ordered subtree streams with real clients: a librdkafka consumer group
//! on `app.__all` gets the records of `app.a.x`, `app.b.y` and `app.b.z`
//! interleaved in produce order, each tagged with its source tp and offset,
//! commits, and after a broker restart (the tip is empty: served from the
//! branch logs) resumes from its commit. Bad input: a subtree that does not
//! exist, produce to a stream, a partition it does not have, an offset past
//! its end.

use crate::common;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::message::{Headers, Message};
use rdkafka::producer::{FutureProducer, FutureRecord};

const SUBTREE: [&str; 3] = ["app.a.x", "app.b.y", "app.b.z"];

/// One record as the stream delivers it: (source topic, partition, source
/// offset, payload), from the `canopy.*` headers.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Tagged {
    topic: String,
    partition: i32,
    offset: i64,
    payload: String,
}

fn tagged(m: &rdkafka::message::BorrowedMessage<'_>) -> Tagged {
    let headers = m.headers().expect("stream records carry headers");
    let mut h: HashMap<String, String> = HashMap::new();
    for i in 0..headers.count() {
        let hd = headers.get(i);
        h.insert(hd.key.to_owned(), String::from_utf8(hd.value.unwrap().to_vec()).unwrap());
    }
    Tagged {
        topic: h["canopy.topic"].clone(),
        partition: h["canopy.partition"].parse().unwrap(),
        offset: h["canopy.offset"].parse().unwrap(),
        payload: String::from_utf8(m.payload().unwrap().to_vec()).unwrap(),
    }
}

/// Produces `n` records one at a time (each acknowledged before the next
/// is sent, so produce order is arrival order) round-robin over `topics`;
/// every third through an lz4 producer, so the stream re-encodes
/// compressed batches too. Returns them in produce order.
async fn produce(addr: std::net::SocketAddr, topics: &[&str], start: usize, n: usize, next: &mut HashMap<String, i64>) -> Vec<Tagged> {
    let mut plain = common::producer_config(addr, "all");
    plain.set("linger.ms", "0");
    let mut lz4 = plain.clone();
    lz4.set("compression.type", "lz4");
    let plain: FutureProducer = plain.create().unwrap();
    let lz4: FutureProducer = lz4.create().unwrap();
    let mut sent = Vec::new();
    for i in start..start + n {
        let topic = topics[i % topics.len()];
        let payload = format!("{topic}#{i}");
        let headers = rdkafka::message::OwnedHeaders::new().insert(rdkafka::message::Header { key: "own", value: Some("kept") });
        let p = if i % 3 == 0 { &lz4 } else { &plain };
        let rdkafka::producer::future_producer::Delivery { partition, offset, .. } = p
            .send(FutureRecord::<str, str>::to(topic).partition(0).key("k").payload(&payload).headers(headers), Duration::from_secs(30))
            .await
            .map_err(|(e, _)| e)
            .unwrap();
        let expect = next.entry(topic.to_owned()).or_insert(0);
        assert_eq!(offset, *expect);
        *expect += 1;
        sent.push(Tagged { topic: topic.to_owned(), partition, offset, payload });
    }
    sent
}

fn group_consumer(addr: std::net::SocketAddr, group: &str) -> BaseConsumer {
    let mut cfg = common::consumer_config(addr);
    cfg.set("group.id", group).set("auto.offset.reset", "earliest").set("session.timeout.ms", "6000");
    let c: BaseConsumer = cfg.create().unwrap();
    c.subscribe(&["app.__all"]).unwrap();
    c
}

/// Reads `n` records, checking each carries the caller's own header and
/// offsets grow; stores the offset of each for the next commit.
fn read(c: &BaseConsumer, n: usize) -> Vec<Tagged> {
    let mut out = Vec::new();
    let mut last = -1;
    let deadline = Instant::now() + Duration::from_secs(60);
    while out.len() < n {
        assert!(Instant::now() < deadline, "read {} of {n}: {out:?}", out.len());
        let Some(m) = c.poll(Duration::from_millis(100)) else { continue };
        let m = m.unwrap();
        assert_eq!((m.topic(), m.partition()), ("app.__all", 0));
        assert!(m.offset() > last, "stream offsets increase: {} after {last}", m.offset());
        last = m.offset();
        assert_eq!(m.key(), Some(&b"k"[..]));
        let own = m.headers().unwrap().iter().find(|h| h.key == "own").map(|h| h.value.unwrap().to_vec());
        assert_eq!(own.as_deref(), Some(&b"kept"[..]), "the producer's headers are kept");
        c.store_offset(m.topic(), m.partition(), m.offset()).unwrap();
        out.push(tagged(&m));
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn app_all_streams_the_subtree_in_produce_order_across_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let args = common::args(dir.path());
    let broker = common::start(args.clone()).await;
    let addr = broker.kafka_addr;
    let mut next = HashMap::new();
    // `other.q` is produced in between and must not show up.
    let all = produce(addr, &["app.a.x", "app.b.y", "other.q", "app.b.z"], 0, 160, &mut next).await;
    let expected: Vec<Tagged> = all.iter().filter(|t| SUBTREE.contains(&t.topic.as_str())).cloned().collect();
    assert_eq!(expected.len(), 120);

    let first = tokio::task::spawn_blocking(move || {
        let c = group_consumer(addr, "stream-readers");
        let got = read(&c, 60);
        c.commit_consumer_state(CommitMode::Sync).unwrap();
        c.close_queue().ok();
        drop(c);
        got
    })
    .await
    .unwrap();
    assert_eq!(first, expected[..60], "first half in produce order, from the tip");
    assert!(broker.engine.tip_stats().merged > 0, "served by the tip's merge");
    broker.shutdown().await;

    // After a restart the tip is empty: the rest comes from the logs, and
    // new records follow.
    let broker = common::start(args).await;
    let addr = broker.kafka_addr;
    assert_eq!(broker.engine.tip_stats().batches, 0);
    let more = produce(addr, &["app.b.z", "other.q", "app.a.x"], 160, 30, &mut next).await;
    let expected_more: Vec<Tagged> = expected[60..].iter().cloned().chain(more.into_iter().filter(|t| t.topic != "other.q")).collect();
    let n = expected_more.len();
    let rest = tokio::task::spawn_blocking(move || {
        let c = group_consumer(addr, "stream-readers");
        let got = read(&c, n);
        // Nothing else arrives.
        let extra = c.poll(Duration::from_millis(500));
        assert!(extra.is_none(), "nothing past the produced records: {:?}", extra.map(|m| m.map(|m| tagged(&m))));
        got
    })
    .await
    .unwrap();
    assert_eq!(rest, expected_more, "resumed from the commit, then the new records, in order");
    assert!(broker.engine.tip_stats().misses > 0, "the records from before the restart came from the logs");
    broker.shutdown().await;
}

/// The whole stream, from a consumer assigned to `__all` at its earliest
/// offset, to its end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn all_streams_every_topic_and_list_offsets_bound_it() {
    let dir = tempfile::tempdir().unwrap();
    let broker = common::start(common::args(dir.path())).await;
    let addr = broker.kafka_addr;
    let mut next = HashMap::new();
    let sent = produce(addr, &["a", "b.c", "d.e.f"], 0, 30, &mut next).await;
    let got = tokio::task::spawn_blocking(move || {
        let c: BaseConsumer = common::consumer_config(addr).set("enable.partition.eof", "true").create().unwrap();
        let (low, high) = c.fetch_watermarks("__all", 0, Duration::from_secs(10)).unwrap();
        assert!(low <= 0 && high > low, "watermarks {low}..{high}");
        let mut tpl = rdkafka::TopicPartitionList::new();
        tpl.add_partition_offset("__all", 0, rdkafka::Offset::Beginning).unwrap();
        c.assign(&tpl).unwrap();
        let mut out = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(60);
        while out.len() < 30 {
            assert!(Instant::now() < deadline, "read {} of 30", out.len());
            if let Some(m) = c.poll(Duration::from_millis(100)) {
                let m = m.unwrap();
                assert!(m.offset() < high);
                out.push(tagged(&m));
            }
        }
        // The stream's offsets are sparse: the consumer still reaches the
        // end (partition EOF at the high watermark) and nothing more comes.
        let (_, high) = c.fetch_watermarks("__all", 0, Duration::from_secs(10)).unwrap();
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            assert!(Instant::now() < deadline, "no partition EOF");
            match c.poll(Duration::from_millis(100)) {
                Some(Err(rdkafka::error::KafkaError::PartitionEOF(0))) => break,
                Some(r) => panic!("nothing past the produced records: {:?}", r.map(|m| tagged(&m))),
                None => {}
            }
        }
        let pos = c.position().unwrap().find_partition("__all", 0).unwrap().offset();
        assert_eq!(pos, rdkafka::Offset::Offset(high), "the position is the high watermark");
        out
    })
    .await
    .unwrap();
    assert_eq!(got, sent);
    broker.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_refuse_what_they_cannot_do() {
    use kafka_protocol::messages::{fetch_request, metadata_request, FetchRequest, FetchResponse, MetadataRequest, MetadataResponse, TopicName};
    use kafka_protocol::protocol::StrBytes;
    let dir = tempfile::tempdir().unwrap();
    let broker = common::start(common::args(dir.path())).await;
    let addr = broker.kafka_addr;
    let mut next = HashMap::new();
    produce(addr, &["app.a.x"], 0, 3, &mut next).await;

    let mut sock = tokio::net::TcpStream::connect(addr).await.unwrap();
    let name = |n: &str| TopicName(StrBytes::from_string(n.to_owned()));
    // Metadata: a stream exists when its subtree does.
    let req = MetadataRequest::default().with_topics(Some(
        ["app.__all", "app.a.__all", "nosuch.__all", "app.a.x.y.__all", "__all"].iter().map(|n| metadata_request::MetadataRequestTopic::default().with_name(Some(name(n)))).collect(),
    ));
    let resp: MetadataResponse = common::call(&mut sock, 3, 12, 1, &req).await;
    let codes: Vec<(String, i16, usize)> = resp.topics.iter().map(|t| (t.name.as_ref().unwrap().0.to_string(), t.error_code, t.partitions.len())).collect();
    assert_eq!(
        codes,
        vec![("app.__all".into(), 0, 1), ("app.a.__all".into(), 0, 1), ("nosuch.__all".into(), 3, 0), ("app.a.x.y.__all".into(), 3, 0), ("__all".into(), 0, 1)]
    );
    // Asked for every topic: streams are not listed (regex subscriptions
    // never pick them up by accident).
    let resp: MetadataResponse = common::call(&mut sock, 3, 12, 2, &MetadataRequest::default().with_topics(None)).await;
    assert!(resp.topics.iter().all(|t| !t.name.as_ref().unwrap().0.ends_with("__all")));

    // Fetch: partition 1 does not exist, a subtree that does not exist is
    // unknown; partition 0 works beside them in the same request. An offset
    // past the end is out of range (its own request: a partition named
    // twice in one fetch is fetched once, as in Kafka).
    let part = |p: i32, offset: i64| fetch_request::FetchPartition::default().with_partition(p).with_fetch_offset(offset).with_partition_max_bytes(1 << 20);
    let req = FetchRequest::default().with_max_wait_ms(0).with_max_bytes(1 << 20).with_topics(vec![
        fetch_request::FetchTopic::default().with_topic(name("app.__all")).with_partitions(vec![part(0, 0), part(1, 0)]),
        fetch_request::FetchTopic::default().with_topic(name("nosuch.__all")).with_partitions(vec![part(0, 0)]),
    ]);
    let resp: FetchResponse = common::call(&mut sock, 1, 12, 3, &req).await;
    let p = &resp.responses[0].partitions;
    assert_eq!(p[0].error_code, 0);
    assert!(p[0].records.as_ref().is_some_and(|r| !r.is_empty()));
    assert_eq!(p[1].error_code, 3, "UNKNOWN_TOPIC_OR_PARTITION");
    assert_eq!(resp.responses[1].partitions[0].error_code, 3);
    let req = FetchRequest::default().with_max_wait_ms(0).with_max_bytes(1 << 20).with_topics(vec![fetch_request::FetchTopic::default().with_topic(name("app.__all")).with_partitions(vec![part(0, i64::MAX >> 1)])]);
    let resp: FetchResponse = common::call(&mut sock, 1, 12, 33, &req).await;
    assert_eq!(resp.responses[0].partitions[0].error_code, 1, "OFFSET_OUT_OF_RANGE");

    // Produce to a stream is refused, by a real client.
    let producer: FutureProducer = common::producer_config(addr, "all").set("message.timeout.ms", "5000").create().unwrap();
    let r = producer.send(FutureRecord::<str, str>::to("app.__all").partition(0).payload("no"), Duration::from_secs(10)).await;
    let err = r.expect_err("produce to a stream fails").0;
    assert!(
        matches!(err.rdkafka_error_code(), Some(rdkafka::types::RDKafkaErrorCode::InvalidTopic)),
        "{err:?}"
    );
    // Nothing was appended anywhere.
    assert_eq!(broker.engine.topics().len(), 1);
    broker.shutdown().await;
}

/// Values of `app.t.__all` from its start at an isolation level, until `n`
/// arrived; then nothing more may come within half a second.
fn stream_values(addr: std::net::SocketAddr, isolation: &str, n: usize) -> Vec<String> {
    let mut cfg = common::consumer_config(addr);
    cfg.set("isolation.level", isolation);
    let c: BaseConsumer = cfg.create().unwrap();
    let mut tpl = rdkafka::TopicPartitionList::new();
    tpl.add_partition_offset("app.t.__all", 0, rdkafka::Offset::Beginning).unwrap();
    c.assign(&tpl).unwrap();
    let mut out = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    while out.len() < n {
        assert!(Instant::now() < deadline, "{isolation}: read {out:?} of {n}");
        if let Some(m) = c.poll(Duration::from_millis(100)) {
            out.push(String::from_utf8(m.unwrap().payload().unwrap().to_vec()).unwrap());
        }
    }
    let end = Instant::now() + Duration::from_millis(500);
    while Instant::now() < end {
        if let Some(m) = c.poll(Duration::from_millis(100)) {
            panic!("{isolation}: unexpected {:?} after {out:?}", m.map(|m| m.payload().map(|p| p.to_vec())));
        }
    }
    out
}

/// A `read_committed` stream leaves out aborted transactions and stops at
/// an open one (nothing produced after it is served before it ends);
/// `read_uncommitted` sees everything, and control batches never show.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_committed_streams_skip_aborted_and_wait_for_open_transactions() {
    use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer, ThreadedProducer};
    let dir = tempfile::tempdir().unwrap();
    let broker = common::start(common::args(dir.path())).await;
    let addr = broker.kafka_addr;
    let producer: FutureProducer = common::producer_config(addr, "all").set("linger.ms", "0").create().unwrap();
    let plain = |topic: &'static str, v: &'static str| {
        let producer = producer.clone();
        async move {
            producer.send(FutureRecord::<str, str>::to(topic).partition(0).payload(v), Duration::from_secs(30)).await.map_err(|(e, _)| e).unwrap();
        }
    };
    plain("app.t.x", "p0").await;
    plain("app.t.y", "p-y").await;
    let txp = tokio::task::spawn_blocking(move || {
        let mut cfg = common::producer_config(addr, "all");
        cfg.set("transactional.id", "stream-txn").set("linger.ms", "0");
        let p: ThreadedProducer<DefaultProducerContext> = cfg.create().unwrap();
        p.init_transactions(Duration::from_secs(30)).unwrap();
        let send = |topic: &str, v: &str| p.send(BaseRecord::<(), str>::to(topic).partition(0).payload(v)).map_err(|(e, _)| e).unwrap();
        p.begin_transaction().unwrap();
        send("app.t.x", "a1");
        send("app.t.x", "a2");
        p.commit_transaction(Duration::from_secs(30)).unwrap();
        p.begin_transaction().unwrap();
        send("app.t.y", "b1");
        p.flush(Duration::from_secs(30)).unwrap();
        p.abort_transaction(Duration::from_secs(30)).unwrap();
        p
    })
    .await
    .unwrap();
    plain("app.t.y", "p1").await;
    let txp = tokio::task::spawn_blocking(move || {
        txp.begin_transaction().unwrap();
        txp.send(BaseRecord::<(), str>::to("app.t.x").partition(0).payload("c1")).map_err(|(e, _)| e).unwrap();
        txp.flush(Duration::from_secs(30)).unwrap();
        txp
    })
    .await
    .unwrap();
    plain("app.t.y", "p2").await;

    let (committed, uncommitted) = tokio::task::spawn_blocking(move || (stream_values(addr, "read_committed", 5), stream_values(addr, "read_uncommitted", 8)))
        .await
        .unwrap();
    assert_eq!(committed, ["p0", "p-y", "a1", "a2", "p1"], "stops at the open transaction's first batch");
    assert_eq!(uncommitted, ["p0", "p-y", "a1", "a2", "b1", "p1", "c1", "p2"]);
    let committed = tokio::task::spawn_blocking(move || {
        txp.commit_transaction(Duration::from_secs(30)).unwrap();
        stream_values(addr, "read_committed", 7)
    })
    .await
    .unwrap();
    assert_eq!(committed, ["p0", "p-y", "a1", "a2", "p1", "c1", "p2"]);
    broker.shutdown().await;
}
