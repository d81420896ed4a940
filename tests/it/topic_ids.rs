//! Topic ids (KIP-516) and the newest request versions: librdkafka fetches
//! by topic id (Fetch v13+) once Metadata gives ids; on the wire, Fetch
//! v13-18 finds topics and subtree streams by id and answers an id nothing
//! has with UNKNOWN_TOPIC_ID; a fetch session keeps to the kind of names it
//! was made with (FETCH_SESSION_TOPIC_ID_ERROR); ListOffsets v9-10 answers
//! the special timestamps as Kafka does without tiered storage.

use crate::common;

use std::time::Duration;

use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
use kafka_protocol::messages::list_offsets_request::{ListOffsetsPartition, ListOffsetsTopic};
use kafka_protocol::messages::metadata_request::MetadataRequestTopic;
use kafka_protocol::messages::{FetchRequest, FetchResponse, ListOffsetsRequest, ListOffsetsResponse, MetadataRequest, MetadataResponse, TopicName};
use kafka_protocol::protocol::StrBytes;
use rdkafka::producer::{FutureProducer, FutureRecord};
use tokio::net::TcpStream;

fn name(s: &str) -> TopicName {
    TopicName(StrBytes::from_string(s.to_owned()))
}

/// Metadata v13 for `names`: (name, id, error) of each.
async fn ids(sock: &mut TcpStream, names: &[&str]) -> Vec<(String, uuid::Uuid, i16)> {
    let req = MetadataRequest::default().with_topics(Some(names.iter().map(|n| MetadataRequestTopic::default().with_name(Some(name(n)))).collect())).with_allow_auto_topic_creation(false);
    let r: MetadataResponse = common::call(sock, 3, 13, 1, &req).await;
    assert_eq!(r.error_code, 0);
    r.topics.iter().map(|t| (t.name.as_ref().map(|n| n.to_string()).unwrap_or_default(), t.topic_id, t.error_code)).collect()
}

fn fetch_by_id(id: uuid::Uuid, partition: i32, session: (i32, i32)) -> FetchRequest {
    FetchRequest::default()
        .with_max_wait_ms(0)
        .with_max_bytes(1 << 20)
        .with_session_id(session.0)
        .with_session_epoch(session.1)
        .with_topics(vec![FetchTopic::default().with_topic_id(id).with_partitions(vec![FetchPartition::default().with_partition(partition).with_fetch_offset(0).with_partition_max_bytes(1 << 20)])])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fetches_by_topic_id_from_librdkafka_and_on_the_wire() {
    let dir = tempfile::tempdir().unwrap();
    let broker = common::start(common::args(dir.path())).await;
    let addr = broker.kafka_addr;
    common::create_topic(addr, "ids.app.events", 2).await;
    let producer: FutureProducer = common::producer_config(addr, "all").create().unwrap();
    for p in 0..2 {
        producer.send(FutureRecord::to("ids.app.events").partition(p).key("k").payload("v"), Duration::from_secs(10)).await.unwrap();
    }

    // librdkafka reads by topic id (it uses Fetch v13+ once Metadata gives
    // every topic an id): the records come back, and the broker counted
    // those versions.
    let got = tokio::task::spawn_blocking(move || common::read_exactly(addr, "ids.app.events", &[0, 1], 2)).await.unwrap();
    assert_eq!(got.len(), 2);
    let metrics = reqwest::get(format!("http://{}/metrics", broker.admin_addr)).await.unwrap().text().await.unwrap();
    let by_id: f64 = metrics
        .lines()
        .filter(|l| l.starts_with("canopy_kafka_requests_total{api=\"Fetch\""))
        .filter(|l| l.split("version=\"").nth(1).and_then(|v| v.split('"').next()).and_then(|v| v.parse::<i16>().ok()).is_some_and(|v| v >= 13))
        .filter_map(|l| l.rsplit(' ').next().and_then(|n| n.parse::<f64>().ok()))
        .sum();
    assert!(by_id > 0.0, "librdkafka fetched by topic id:\n{}", metrics.lines().filter(|l| l.contains("api=\"Fetch\"")).collect::<Vec<_>>().join("\n"));

    let mut sock = TcpStream::connect(addr).await.unwrap();
    let found = ids(&mut sock, &["ids.app.events", "ids.app.__all"]).await;
    let (topic_id, stream_id) = (found[0].1, found[1].1);
    assert!(!topic_id.is_nil() && !stream_id.is_nil() && topic_id != stream_id);
    for v in 13..=18 {
        let r: FetchResponse = common::call(&mut sock, 1, v, 10 + v as i32, &fetch_by_id(topic_id, 1, (0, -1))).await;
        let t = &r.responses[0];
        assert_eq!((t.topic_id, t.partitions[0].error_code), (topic_id, 0), "v{v}");
        assert!(t.partitions[0].records.as_ref().is_some_and(|b| !b.is_empty()), "v{v}: the record");
        // The subtree stream by the id Metadata gave it.
        let r: FetchResponse = common::call(&mut sock, 1, v, 20 + v as i32, &fetch_by_id(stream_id, 0, (0, -1))).await;
        assert_eq!((r.responses[0].topic_id, r.responses[0].partitions[0].error_code), (stream_id, 0), "v{v} stream");
        // An id nothing has.
        let nobody = uuid::Uuid::from_u128(0x1234);
        let r: FetchResponse = common::call(&mut sock, 1, v, 30 + v as i32, &fetch_by_id(nobody, 0, (0, -1))).await;
        assert_eq!((r.responses[0].topic_id, r.responses[0].partitions[0].error_code), (nobody, 100), "v{v}: UNKNOWN_TOPIC_ID");
    }
    // Metadata by id finds both, and not an unknown one.
    let req = MetadataRequest::default().with_topics(Some(vec![MetadataRequestTopic::default().with_name(None).with_topic_id(topic_id), MetadataRequestTopic::default().with_name(None).with_topic_id(stream_id), MetadataRequestTopic::default().with_name(None).with_topic_id(uuid::Uuid::from_u128(7))]));
    let r: MetadataResponse = common::call(&mut sock, 3, 12, 40, &req).await;
    let names: Vec<(Option<String>, i16)> = r.topics.iter().map(|t| (t.name.as_ref().map(|n| n.to_string()), t.error_code)).collect();
    assert_eq!(names, vec![(Some("ids.app.events".into()), 0), (Some("ids.app.__all".into()), 0), (None, 100)]);

    // A session made by topic id refuses a request by name, and the
    // reverse (FETCH_SESSION_TOPIC_ID_ERROR), leaving it usable.
    let r: FetchResponse = common::call(&mut sock, 1, 16, 50, &fetch_by_id(topic_id, 0, (0, 0))).await;
    let sid = r.session_id;
    assert!(sid > 0);
    let by_name = FetchRequest::default().with_max_wait_ms(0).with_max_bytes(1 << 20).with_session_id(sid).with_session_epoch(1);
    let r: FetchResponse = common::call(&mut sock, 1, 12, 51, &by_name).await;
    assert_eq!(r.error_code, 106);
    let r: FetchResponse = common::call(&mut sock, 1, 16, 52, &by_name).await;
    assert_eq!((r.error_code, r.session_id), (0, sid), "the id session goes on");
    let r: FetchResponse = common::call(&mut sock, 1, 12, 53, &by_name.clone().with_session_id(0).with_session_epoch(0).with_topics(vec![FetchTopic::default().with_topic(name("ids.app.events")).with_partitions(vec![FetchPartition::default().with_partition(0).with_partition_max_bytes(1024)])])).await;
    let named = r.session_id;
    let r: FetchResponse = common::call(&mut sock, 1, 13, 54, &by_name.with_session_id(named).with_session_epoch(1)).await;
    assert_eq!(r.error_code, 106);
    drop(sock);
    broker.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_offsets_answers_special_timestamps_as_kafka_does() {
    let dir = tempfile::tempdir().unwrap();
    let broker = common::start(common::args(dir.path())).await;
    let addr = broker.kafka_addr;
    common::create_topic(addr, "ids.offsets", 1).await;
    let producer: FutureProducer = common::producer_config(addr, "all").create().unwrap();
    for _ in 0..3 {
        producer.send(FutureRecord::to("ids.offsets").partition(0).key("k").payload("v"), Duration::from_secs(10)).await.unwrap();
    }
    let mut sock = TcpStream::connect(addr).await.unwrap();
    let ask = |ts: i64| ListOffsetsRequest::default().with_replica_id((-1).into()).with_topics(vec![ListOffsetsTopic::default().with_name(name("ids.offsets")).with_partitions(vec![ListOffsetsPartition::default().with_partition_index(0).with_timestamp(ts)])]);
    // (version, timestamp) -> (error, offset)
    let cases: &[(i16, i64, i16, i64)] = &[
        (10, -1, 0, 3),
        (10, -2, 0, 0),
        (10, -4, 0, 0),  // earliest local: the log start, nothing is tiered
        (10, -5, 0, -1), // latest tiered: nothing is
        (9, -5, 0, -1),
        (8, -5, 35, -1), // needs v9: UNSUPPORTED_VERSION
        (7, -4, 35, -1),
        (6, -3, 35, -1),
        (10, -6, 35, -1), // unknown
        (10, -1000, 35, -1),
    ];
    for (n, (v, ts, err, offset)) in cases.iter().enumerate() {
        let r: ListOffsetsResponse = common::call(&mut sock, 2, *v, n as i32, &ask(*ts)).await;
        let p = &r.topics[0].partitions[0];
        assert_eq!((p.error_code, p.offset), (*err, *offset), "v{v} timestamp {ts}");
        if *ts == -5 && *err == 0 {
            assert_eq!(p.leader_epoch, -1);
        }
    }
    drop(sock);
    broker.shutdown().await;
}
