//! Admin and offsets through librdkafka: CreateTopics, CreatePartitions,
//! DescribeConfigs, DeleteTopics, and ListOffsets earliest / latest / by
//! timestamp / max timestamp.

use crate::common;

use std::time::Duration;

use rdkafka::admin::{AdminClient, AdminOptions, NewPartitions, NewTopic, ResourceSpecifier, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::{Offset, TopicPartitionList};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn topics_configs_and_offsets() {
    let dir = tempfile::tempdir().unwrap();
    let mut args = common::args(dir.path());
    args.auto_create_topics = Some(false);
    let broker = common::start(args).await;
    let addr = broker.kafka_addr;
    let admin: AdminClient<DefaultClientContext> = common::client(addr).create().unwrap();
    let opts = AdminOptions::new().operation_timeout(Some(Duration::from_secs(10)));

    // Create, with a config; creating again is TOPIC_ALREADY_EXISTS; bad
    // names and replication factors are refused with Kafka's codes.
    let t = NewTopic::new("ops.audit.log", 2, TopicReplication::Fixed(1)).set("retention.ms", "3600000");
    assert!(admin.create_topics([&t], &opts).await.unwrap()[0].is_ok());
    let again = admin.create_topics([&t], &opts).await.unwrap();
    assert_eq!(again[0].as_ref().unwrap_err().1, RDKafkaErrorCode::TopicAlreadyExists);
    let bad = NewTopic::new("bad name!", 1, TopicReplication::Fixed(1));
    assert_eq!(admin.create_topics([&bad], &opts).await.unwrap()[0].as_ref().unwrap_err().1, RDKafkaErrorCode::InvalidTopic);
    // Segments starting with `__` are reserved for virtual topics.
    let reserved = NewTopic::new("ops.__all", 1, TopicReplication::Fixed(1));
    assert_eq!(admin.create_topics([&reserved], &opts).await.unwrap()[0].as_ref().unwrap_err().1, RDKafkaErrorCode::InvalidTopic);
    let rf = NewTopic::new("rf.three", 1, TopicReplication::Fixed(3));
    assert_eq!(admin.create_topics([&rf], &opts).await.unwrap()[0].as_ref().unwrap_err().1, RDKafkaErrorCode::InvalidReplicationFactor);
    let unknown_cfg = NewTopic::new("cfg.bad", 1, TopicReplication::Fixed(1)).set("retention.ms", "soon");
    assert_eq!(admin.create_topics([&unknown_cfg], &opts).await.unwrap()[0].as_ref().unwrap_err().1, RDKafkaErrorCode::InvalidConfig);

    // DescribeConfigs shows the set value and the defaults.
    let described = admin.describe_configs([&ResourceSpecifier::Topic("ops.audit.log")], &opts).await.unwrap();
    let res = described[0].as_ref().unwrap();
    let get = |k: &str| res.get(k).and_then(|e| e.value.clone());
    assert_eq!(get("retention.ms").as_deref(), Some("3600000"));
    assert!(!res.get("retention.ms").unwrap().is_default);
    assert_eq!(get("message.timestamp.type").as_deref(), Some("CreateTime"));
    assert!(res.get("message.timestamp.type").unwrap().is_default);

    // CreatePartitions 2 → 4; shrinking is refused.
    let grow = NewPartitions::new("ops.audit.log", 4);
    assert!(admin.create_partitions([&grow], &opts).await.unwrap()[0].is_ok());
    let shrink = NewPartitions::new("ops.audit.log", 3);
    assert_eq!(admin.create_partitions([&shrink], &opts).await.unwrap()[0].as_ref().unwrap_err().1, RDKafkaErrorCode::InvalidPartitions);

    // Produce to the new partition 3 with explicit timestamps.
    let producer: FutureProducer = common::producer_config(addr, "all").create().unwrap();
    for i in 0..10i64 {
        let key = format!("k{i}");
        producer
            .send(FutureRecord::to("ops.audit.log").partition(3).key(&key).payload("v").timestamp(1_000_000 + i * 1000), Duration::from_secs(30))
            .await
            .expect("acked");
    }
    let consumer: BaseConsumer = common::consumer_config(addr).create().unwrap();
    let md = consumer.fetch_metadata(Some("ops.audit.log"), Duration::from_secs(10)).unwrap();
    assert_eq!(md.topics()[0].partitions().len(), 4);
    assert_eq!(consumer.fetch_watermarks("ops.audit.log", 3, Duration::from_secs(10)).unwrap(), (0, 10));
    assert_eq!(consumer.fetch_watermarks("ops.audit.log", 0, Duration::from_secs(10)).unwrap(), (0, 0));

    // By timestamp: exact, between records, and past the end (-1 → end).
    let lookup = |ts: i64| {
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition_offset("ops.audit.log", 3, Offset::Offset(ts)).unwrap();
        let r = consumer.offsets_for_times(tpl, Duration::from_secs(10)).unwrap();
        r.find_partition("ops.audit.log", 3).unwrap().offset()
    };
    assert_eq!(lookup(1_000_000), Offset::Offset(0));
    assert_eq!(lookup(1_004_000), Offset::Offset(4));
    assert_eq!(lookup(1_004_500), Offset::Offset(5));
    assert_eq!(lookup(0), Offset::Offset(0));
    assert_eq!(lookup(9_000_000), Offset::End);

    // Max timestamp (-3): the first record with the largest timestamp,
    // not the last record.
    for (i, ts) in [5_000i64, 9_000, 7_000, 9_000, 1_000].into_iter().enumerate() {
        let key = format!("m{i}");
        producer.send(FutureRecord::to("ops.audit.log").partition(2).key(&key).payload("v").timestamp(ts), Duration::from_secs(30)).await.expect("acked");
    }
    // (The rdkafka crate does not take -3; the Java AdminClient's
    // OffsetSpec.maxTimestamp() sends this request.)
    {
        use kafka_protocol::messages::list_offsets_request::{ListOffsetsPartition, ListOffsetsTopic};
        use kafka_protocol::messages::{ListOffsetsRequest, ListOffsetsResponse, TopicName};
        let req = ListOffsetsRequest::default().with_replica_id((-1).into()).with_topics(vec![ListOffsetsTopic::default()
            .with_name(TopicName(kafka_protocol::protocol::StrBytes::from_static_str("ops.audit.log")))
            .with_partitions(vec![ListOffsetsPartition::default().with_partition_index(2).with_timestamp(-3)])]);
        let mut sock = tokio::net::TcpStream::connect(addr).await.unwrap();
        let resp: ListOffsetsResponse = common::call(&mut sock, 2, 8, 1, &req).await;
        let p = &resp.topics[0].partitions[0];
        assert_eq!((p.error_code, p.offset, p.timestamp), (0, 1, 9_000));
    }

    // Delete; then it is gone from metadata and producing fails.
    let deleted = admin.delete_topics(&["ops.audit.log"], &opts).await.unwrap();
    assert!(deleted[0].is_ok());
    let gone = admin.delete_topics(&["ops.audit.log"], &opts).await.unwrap();
    assert_eq!(gone[0].as_ref().unwrap_err().1, RDKafkaErrorCode::UnknownTopicOrPartition);
    let md = consumer.fetch_metadata(None, Duration::from_secs(10)).unwrap();
    assert!(md.topics().iter().all(|t| t.name() != "ops.audit.log"));

    // Re-created under the same name it starts empty: old frames stay
    // invisible because they carry the old topic id.
    let t = NewTopic::new("ops.audit.log", 4, TopicReplication::Fixed(1));
    assert!(admin.create_topics([&t], &opts).await.unwrap()[0].is_ok());
    assert_eq!(consumer.fetch_watermarks("ops.audit.log", 3, Duration::from_secs(10)).unwrap(), (0, 0));
    drop(consumer);
    drop(producer);
    drop(admin);
    broker.shutdown().await;
}

/// A LogAppendTime topic: the broker's clock replaces the producer's
/// timestamps, and consumers see the timestamp type.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn log_append_time_topics_stamp_records() {
    use rdkafka::message::{Message, Timestamp};
    let dir = tempfile::tempdir().unwrap();
    let broker = common::start(common::args(dir.path())).await;
    let addr = broker.kafka_addr;
    let admin: AdminClient<DefaultClientContext> = common::client(addr).create().unwrap();
    let t = NewTopic::new("lat.topic", 1, TopicReplication::Fixed(1)).set("message.timestamp.type", "LogAppendTime");
    assert!(admin.create_topics([&t], &AdminOptions::new()).await.unwrap()[0].is_ok());
    let before = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as i64;
    let producer: FutureProducer = common::producer_config(addr, "all").create().unwrap();
    producer.send(FutureRecord::to("lat.topic").partition(0).key("k").payload("v").timestamp(1_000), Duration::from_secs(30)).await.unwrap();
    let after = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as i64;
    let consumer: BaseConsumer = common::consumer_config(addr).create().unwrap();
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset("lat.topic", 0, Offset::Beginning).unwrap();
    consumer.assign(&tpl).unwrap();
    let m = tokio::task::spawn_blocking(move || loop {
        if let Some(m) = consumer.poll(Duration::from_millis(500)) {
            break m.unwrap().detach();
        }
    })
    .await
    .unwrap();
    match m.timestamp() {
        Timestamp::LogAppendTime(ts) => assert!(ts >= before && ts <= after, "{ts} not in [{before}, {after}]"),
        other => panic!("expected LogAppendTime, got {other:?}"),
    }
    drop(producer);
    drop(admin);
    broker.shutdown().await;
}

/// ElectLeaders in single-node mode: this broker leads everything, so every
/// partition asked (each once, however often asked) is ELECTION_NOT_NEEDED;
/// a partition or topic that does not exist is UNKNOWN_TOPIC_OR_PARTITION;
/// an UNCLEAN election is not needed either, an unknown election type is
/// INVALID_REQUEST; null asks every topic, and
/// lists only partitions an election was tried for: none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn elect_leaders_finds_nothing_to_elect_on_one_node() {
    use kafka_protocol::messages::elect_leaders_request::TopicPartitions;
    use kafka_protocol::messages::{ElectLeadersRequest, ElectLeadersResponse, TopicName};
    use kafka_protocol::protocol::StrBytes;
    let dir = tempfile::tempdir().unwrap();
    let broker = common::start(common::args(dir.path())).await;
    let admin: AdminClient<DefaultClientContext> = common::client(broker.kafka_addr).create().unwrap();
    assert!(admin.create_topics([&NewTopic::new("el.t", 2, TopicReplication::Fixed(1))], &AdminOptions::new()).await.unwrap()[0].is_ok());
    let ask = |topic: &'static str, ps: Vec<i32>| TopicPartitions::default().with_topic(TopicName(StrBytes::from_static_str(topic))).with_partitions(ps);
    let call = |election: i8, tps: Option<Vec<TopicPartitions>>| async move {
        let mut sock = tokio::net::TcpStream::connect(broker.kafka_addr).await.unwrap();
        let r: ElectLeadersResponse = common::call(&mut sock, 43, 2, 1, &ElectLeadersRequest::default().with_election_type(election).with_topic_partitions(tps).with_timeout_ms(5_000)).await;
        let mut out: Vec<(String, i32, i16)> = r.replica_election_results.iter().flat_map(|t| t.partition_result.iter().map(|p| (t.topic.to_string(), p.partition_id, p.error_code))).collect();
        out.sort();
        (r.error_code, out)
    };
    let t = |topic: &str, p: i32, code: i16| (topic.to_owned(), p, code);
    let (code, got) = call(0, Some(vec![ask("el.t", vec![1, 0, 1, 5, -1]), ask("el.t", vec![0]), ask("no.such", vec![0])])).await;
    assert_eq!(code, 0);
    assert_eq!(got, vec![t("el.t", -1, 3), t("el.t", 0, 84), t("el.t", 1, 84), t("el.t", 5, 3), t("no.such", 0, 3)]);
    assert_eq!(call(1, Some(vec![ask("el.t", vec![0])])).await.1, vec![t("el.t", 0, 84)], "UNCLEAN: ELECTION_NOT_NEEDED");
    assert_eq!(call(2, Some(vec![ask("el.t", vec![0])])).await.1, vec![t("el.t", 0, 42)], "an unknown type: INVALID_REQUEST");
    assert_eq!(call(0, None).await.1, vec![], "for all partitions, those needing no election are not listed (as Kafka answers)");
    drop(admin);
    broker.shutdown().await;
}

/// AlterPartitionReassignments and ListPartitionReassignments in
/// single-node mode: every partition's one replica is this broker, so the
/// only target that can be asked is that one (nothing to do); another
/// broker is not registered (INVALID_REPLICA_ASSIGNMENT), an empty or
/// repeated target is invalid, a cancel finds nothing (NO_REASSIGNMENT_IN_PROGRESS), a partition that
/// does not exist is UNKNOWN_TOPIC_OR_PARTITION, and nothing is listed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reassignments_on_one_node_can_only_name_it() {
    use kafka_protocol::messages::alter_partition_reassignments_request::{ReassignablePartition, ReassignableTopic};
    use kafka_protocol::messages::list_partition_reassignments_request::ListPartitionReassignmentsTopics;
    use kafka_protocol::messages::{AlterPartitionReassignmentsRequest, AlterPartitionReassignmentsResponse, BrokerId, ListPartitionReassignmentsRequest, ListPartitionReassignmentsResponse, TopicName};
    use kafka_protocol::protocol::StrBytes;
    let dir = tempfile::tempdir().unwrap();
    let broker = common::start(common::args(dir.path())).await;
    let admin: AdminClient<DefaultClientContext> = common::client(broker.kafka_addr).create().unwrap();
    assert!(admin.create_topics([&NewTopic::new("ra.b.t", 2, TopicReplication::Fixed(1))], &AdminOptions::new()).await.unwrap()[0].is_ok());
    let me = 0; // node_id's default
    let name = |t: &'static str| TopicName(StrBytes::from_static_str(t));
    let move_to = |p: i32, to: Option<Vec<i32>>| ReassignablePartition::default().with_partition_index(p).with_replicas(to.map(|v| v.into_iter().map(BrokerId).collect()));
    let mut sock = tokio::net::TcpStream::connect(broker.kafka_addr).await.unwrap();
    let req = AlterPartitionReassignmentsRequest::default().with_timeout_ms(5_000).with_topics(vec![
        ReassignableTopic::default().with_name(name("ra.b.t")).with_partitions(vec![
            move_to(0, Some(vec![me])),
            move_to(1, Some(vec![me + 1])),
        ]),
        ReassignableTopic::default().with_name(name("no.such")).with_partitions(vec![move_to(0, Some(vec![me]))]),
    ]);
    let r: AlterPartitionReassignmentsResponse = common::call(&mut sock, 45, 0, 1, &req).await;
    let codes = |r: &AlterPartitionReassignmentsResponse| -> Vec<(String, i32, i16)> { r.responses.iter().flat_map(|t| t.partitions.iter().map(|p| (t.name.to_string(), p.partition_index, p.error_code))).collect() };
    let t = |topic: &str, p: i32, code: i16| (topic.to_owned(), p, code);
    assert_eq!(r.error_code, 0);
    assert_eq!(codes(&r), vec![t("ra.b.t", 0, 0), t("ra.b.t", 1, 39), t("no.such", 0, 3)]);
    let req = AlterPartitionReassignmentsRequest::default().with_timeout_ms(5_000).with_topics(vec![ReassignableTopic::default().with_name(name("ra.b.t")).with_partitions(vec![
        move_to(0, Some(vec![])),
        move_to(1, Some(vec![me, me])),
        move_to(5, Some(vec![me])),
    ])]);
    let r: AlterPartitionReassignmentsResponse = common::call(&mut sock, 45, 1, 2, &req).await;
    assert_eq!(codes(&r), vec![t("ra.b.t", 0, 39), t("ra.b.t", 1, 39), t("ra.b.t", 5, 3)], "empty, repeated, no such partition");
    // Two partitions of one unit (partition 0 of the branch "ra.b") given
    // different targets: both refused, as INVALID_REPLICA_ASSIGNMENT.
    admin.create_topics([&NewTopic::new("ra.b.u", 1, TopicReplication::Fixed(1))], &AdminOptions::new()).await.unwrap();
    let req = AlterPartitionReassignmentsRequest::default().with_timeout_ms(5_000).with_topics(vec![
        ReassignableTopic::default().with_name(name("ra.b.t")).with_partitions(vec![move_to(0, Some(vec![me])), move_to(1, None)]),
        ReassignableTopic::default().with_name(name("ra.b.u")).with_partitions(vec![move_to(0, None)]),
    ]);
    let r: AlterPartitionReassignmentsResponse = common::call(&mut sock, 45, 1, 3, &req).await;
    assert_eq!(codes(&r), vec![t("ra.b.t", 0, 39), t("ra.b.t", 1, 85), t("ra.b.u", 0, 39)], "conflicting targets; a cancel with nothing to cancel");
    let l: ListPartitionReassignmentsResponse = common::call(&mut sock, 46, 0, 5, &ListPartitionReassignmentsRequest::default().with_timeout_ms(5_000).with_topics(None)).await;
    assert_eq!((l.error_code, l.topics.len()), (0, 0));
    let l: ListPartitionReassignmentsResponse = common::call(&mut sock, 46, 0, 6, &ListPartitionReassignmentsRequest::default().with_timeout_ms(5_000).with_topics(Some(vec![
        ListPartitionReassignmentsTopics::default().with_name(name("ra.b.t")).with_partition_indexes(vec![0, 1, 7]),
    ]))).await;
    assert_eq!((l.error_code, l.topics.len()), (0, 0));
    drop(admin);
    broker.shutdown().await;
}
