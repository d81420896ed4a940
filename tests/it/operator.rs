//! Kafka's operator APIs on the wire: DescribeProducers (after an
//! idempotent librdkafka producer and a transactional one), and
//! DescribeTopicPartitions' cursor paging, authorization-free listing,
//! unknown topics and bad cursors. (The Java AdminClient drives them in
//! the compatibility suite.)

use crate::common;

use std::time::Duration;

use kafka_protocol::messages::describe_producers_request::TopicRequest as ProducersTopic;
use kafka_protocol::messages::describe_topic_partitions_request::{Cursor, TopicRequest};
use kafka_protocol::messages::{DescribeProducersRequest, DescribeProducersResponse, DescribeTopicPartitionsRequest, DescribeTopicPartitionsResponse, TopicName};
use kafka_protocol::protocol::StrBytes;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::producer::{FutureProducer, FutureRecord, Producer};

fn tn(s: &str) -> TopicName {
    TopicName(StrBytes::from_string(s.to_owned()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn describe_producers_shows_idempotent_and_open_transactional_producers() {
    let dir = tempfile::tempdir().unwrap();
    let broker = common::start(common::args(dir.path())).await;
    let addr = broker.kafka_addr;
    let admin: AdminClient<DefaultClientContext> = common::client(addr).create().unwrap();
    admin.create_topics([&NewTopic::new("ops.prod", 2, TopicReplication::Fixed(1))], &AdminOptions::new()).await.unwrap()[0].as_ref().unwrap();

    let mut cfg = common::producer_config(addr, "all");
    cfg.set("enable.idempotence", "true");
    let idem: FutureProducer = cfg.create().unwrap();
    for i in 0..3i64 {
        idem.send(FutureRecord::to("ops.prod").partition(0).key("k").payload("v").timestamp(1_000 + i), Duration::from_secs(10)).await.unwrap();
    }
    // A transaction left open on partition 1.
    let mut cfg = common::producer_config(addr, "all");
    cfg.set("transactional.id", "ops-open-txn");
    let txn: FutureProducer = cfg.create().unwrap();
    let t = txn.clone();
    tokio::task::spawn_blocking(move || {
        t.init_transactions(Duration::from_secs(10)).unwrap();
        t.begin_transaction().unwrap();
    })
    .await
    .unwrap();
    let open_at = txn.send(FutureRecord::to("ops.prod").partition(1).key("k").payload("in txn"), Duration::from_secs(10)).await.unwrap();

    let mut sock = tokio::net::TcpStream::connect(addr).await.unwrap();
    let req = DescribeProducersRequest::default().with_topics(vec![
        ProducersTopic::default().with_name(tn("ops.prod")).with_partition_indexes(vec![0, 1, 1, 7]),
        ProducersTopic::default().with_name(tn("ops.none")).with_partition_indexes(vec![0]),
    ]);
    let resp: DescribeProducersResponse = common::call(&mut sock, 61, 0, 1, &req).await;
    let parts = &resp.topics[0].partitions;
    assert_eq!(parts.iter().map(|p| (p.partition_index, p.error_code)).collect::<Vec<_>>(), [(0, 0), (1, 0), (7, 3)], "a repeat is answered once");
    let p0 = &parts[0].active_producers;
    assert_eq!(p0.len(), 1);
    assert_eq!((p0[0].last_sequence, p0[0].last_timestamp, p0[0].current_txn_start_offset), (2, 1_002, -1));
    let p1 = &parts[1].active_producers;
    assert_eq!(p1.len(), 1);
    assert_eq!(p1[0].current_txn_start_offset, open_at.offset, "the open transaction starts where its first record is");
    assert_eq!(resp.topics[1].partitions[0].error_code, 3, "UNKNOWN_TOPIC_OR_PARTITION");

    // Committed: no transaction open any more.
    let t = txn.clone();
    tokio::task::spawn_blocking(move || t.commit_transaction(Duration::from_secs(10)).unwrap()).await.unwrap();
    let resp: DescribeProducersResponse = common::call(&mut sock, 61, 0, 2, &req).await;
    assert_eq!(resp.topics[0].partitions[1].active_producers[0].current_txn_start_offset, -1);
    drop((idem, txn, admin));
    broker.shutdown().await;
}

async fn page(sock: &mut tokio::net::TcpStream, topics: &[&str], limit: i32, cursor: Option<(&str, i32)>) -> DescribeTopicPartitionsResponse {
    let req = DescribeTopicPartitionsRequest::default()
        .with_topics(topics.iter().map(|t| TopicRequest::default().with_name(tn(t))).collect())
        .with_response_partition_limit(limit)
        .with_cursor(cursor.map(|(t, p)| Cursor::default().with_topic_name(tn(t)).with_partition_index(p)));
    common::call(sock, 75, 0, 1, &req).await
}

fn shape(r: &DescribeTopicPartitionsResponse) -> (Vec<(String, i16, Vec<i32>)>, Option<(String, i32)>) {
    let topics = r.topics.iter().map(|t| (t.name.as_ref().map(|n| n.0.to_string()).unwrap_or_default(), t.error_code, t.partitions.iter().map(|p| p.partition_index).collect())).collect();
    (topics, r.next_cursor.as_ref().map(|c| (c.topic_name.0.to_string(), c.partition_index)))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn describe_topic_partitions_pages_by_cursor() {
    let dir = tempfile::tempdir().unwrap();
    let broker = common::start(common::args(dir.path())).await;
    let admin: AdminClient<DefaultClientContext> = common::client(broker.kafka_addr).create().unwrap();
    for (name, n) in [("pg.b", 3), ("pg.a", 2), ("pg.c", 1)] {
        admin.create_topics([&NewTopic::new(name, n, TopicReplication::Fixed(1))], &AdminOptions::new()).await.unwrap()[0].as_ref().unwrap();
    }
    let mut sock = tokio::net::TcpStream::connect(broker.kafka_addr).await.unwrap();
    let s = |t: &str, e: i16, p: &[i32]| (t.to_owned(), e, p.to_vec());

    // Named topics come back in name order, paged three partitions at a time.
    let r = page(&mut sock, &["pg.c", "pg.b", "pg.a"], 3, None).await;
    assert_eq!(shape(&r), (vec![s("pg.a", 0, &[0, 1]), s("pg.b", 0, &[0])], Some(("pg.b".into(), 1))));
    assert!(r.topics[0].topic_id != uuid::Uuid::nil());
    assert_eq!(r.topics[0].partitions[0].isr_nodes.len(), 1);
    let r = page(&mut sock, &["pg.c", "pg.b", "pg.a"], 3, Some(("pg.b", 1))).await;
    assert_eq!(shape(&r), (vec![s("pg.b", 0, &[1, 2]), s("pg.c", 0, &[0])], None));
    // A page that ends with a topic points at the next one.
    let r = page(&mut sock, &["pg.a", "pg.b"], 2, None).await;
    assert_eq!(shape(&r), (vec![s("pg.a", 0, &[0, 1])], Some(("pg.b".into(), 0))));

    // No names: every topic; an unknown name is answered with its error.
    let r = page(&mut sock, &[], 100, None).await;
    assert_eq!(shape(&r).0.iter().map(|t| t.0.as_str()).collect::<Vec<_>>(), ["pg.a", "pg.b", "pg.c"]);
    let r = page(&mut sock, &["pg.a", "pg.zz"], 100, None).await;
    assert_eq!(shape(&r), (vec![s("pg.a", 0, &[0, 1]), s("pg.zz", 3, &[])], None));

    // A cursor outside the names asked, or a negative partition: refused.
    for cursor in [("pg.c", 0), ("pg.a", -1)] {
        let r = page(&mut sock, &["pg.a", "pg.b"], 100, Some(cursor)).await;
        assert!(r.topics.iter().all(|t| t.error_code == 42 && t.partitions.is_empty()), "{cursor:?}: {:?}", shape(&r));
    }
    // A limit of zero or less still makes progress (one partition).
    let r = page(&mut sock, &["pg.a"], 0, None).await;
    assert_eq!(shape(&r), (vec![s("pg.a", 0, &[0])], Some(("pg.a".into(), 1))));
    drop(admin);
    broker.shutdown().await;
}

/// DeleteRecords through librdkafka: log starts rise (also for records
/// already compacted into subtree stores and in segments shared with a
/// sibling), consumers from the beginning start there, bad offsets and
/// compacted topics get Kafka's errors, and the starts survive a restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delete_records_raises_log_starts_durably() {
    use rdkafka::consumer::{BaseConsumer, Consumer};
    use rdkafka::error::RDKafkaErrorCode;
    use rdkafka::message::Message;
    use rdkafka::{Offset, TopicPartitionList};
    let dir = tempfile::tempdir().unwrap();
    let mut args = common::args(dir.path());
    args.segment_bytes = Some(64 * 1024);
    args.message_max_bytes = Some(16 * 1024);
    args.compaction_lag_ms = Some(0);
    args.compaction_interval_ms = Some(3_600_000);
    let broker = common::start(args.clone()).await;
    let addr = broker.kafka_addr;
    let admin: AdminClient<DefaultClientContext> = common::client(addr).create().unwrap();
    let opts = AdminOptions::new().operation_timeout(Some(Duration::from_secs(10)));
    for t in [NewTopic::new("del.app.big", 2, TopicReplication::Fixed(1)), NewTopic::new("del.app.kept", 1, TopicReplication::Fixed(1)).set("cleanup.policy", "compact")] {
        admin.create_topics([&t], &opts).await.unwrap()[0].as_ref().unwrap();
    }
    let producer: FutureProducer = common::producer_config(addr, "all").create().unwrap();
    let payload = vec![b'p'; 1000];
    for i in 0..200 {
        producer.send(FutureRecord::to("del.app.big").partition(0).key("k").payload(&payload), Duration::from_secs(10)).await.unwrap();
        if i % 20 == 0 {
            producer.send(FutureRecord::to("del.app.kept").partition(0).key("k").payload("v"), Duration::from_secs(10)).await.unwrap();
            producer.send(FutureRecord::to("del.app.big").partition(1).key("k").payload("v"), Duration::from_secs(10)).await.unwrap();
        }
    }
    // Sealed segments into stores, so the deletion lands inside a store.
    loop {
        let e = broker.engine.clone();
        if tokio::task::spawn_blocking(move || e.compact()).await.unwrap().unwrap().is_none() {
            break;
        }
    }
    assert!(broker.engine.storage().store_count() >= 1);

    let delete = |parts: &[(&str, i32, i64)]| {
        let mut tpl = TopicPartitionList::new();
        for (t, p, o) in parts {
            tpl.add_partition_offset(t, *p, Offset::Offset(*o)).unwrap();
        }
        tpl
    };
    let done = admin.delete_records(&delete(&[("del.app.big", 0, 150)]), &opts).await.unwrap();
    assert_eq!(done.find_partition("del.app.big", 0).unwrap().offset(), Offset::Offset(150));
    // -1: up to the high watermark (librdkafka spells it End).
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset("del.app.big", 1, Offset::End).unwrap();
    let done = admin.delete_records(&tpl, &opts).await.unwrap();
    assert_eq!(done.find_partition("del.app.big", 1).unwrap().offset(), Offset::Offset(10));
    // Lower than the start already: nothing changes.
    let done = admin.delete_records(&delete(&[("del.app.big", 0, 20)]), &opts).await.unwrap();
    assert_eq!(done.find_partition("del.app.big", 0).unwrap().offset(), Offset::Offset(150));
    // Past the high watermark, and on a compacted topic: Kafka's errors.
    for (parts, code) in [([("del.app.big", 0, 201)], RDKafkaErrorCode::OffsetOutOfRange), ([("del.app.kept", 0, 1)], RDKafkaErrorCode::PolicyViolation)] {
        let done = admin.delete_records(&delete(&parts), &opts).await.unwrap();
        let p = done.find_partition(parts[0].0, parts[0].1).unwrap();
        assert_eq!(p.error().err().map(|e| e.rdkafka_error_code()), Some(Some(code)), "{parts:?}");
    }

    let check = move || {
        let consumer: BaseConsumer = common::consumer_config(addr).create().unwrap();
        assert_eq!(consumer.fetch_watermarks("del.app.big", 0, Duration::from_secs(10)).unwrap(), (150, 200));
        assert_eq!(consumer.fetch_watermarks("del.app.big", 1, Duration::from_secs(10)).unwrap(), (10, 10));
        assert_eq!(consumer.fetch_watermarks("del.app.kept", 0, Duration::from_secs(10)).unwrap(), (0, 10), "the sibling keeps its records");
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition_offset("del.app.big", 0, Offset::Beginning).unwrap();
        consumer.assign(&tpl).unwrap();
        let m = consumer.poll(Duration::from_secs(10)).expect("a record").expect("no error");
        assert_eq!(m.offset(), 150, "a reader from the beginning starts at the new log start");
    };
    tokio::task::spawn_blocking(check).await.unwrap();
    drop((producer, admin));
    broker.shutdown().await;
    let broker = common::start(args).await;
    let addr = broker.kafka_addr;
    let check = move || {
        let consumer: BaseConsumer = common::consumer_config(addr).create().unwrap();
        assert_eq!(consumer.fetch_watermarks("del.app.big", 0, Duration::from_secs(10)).unwrap(), (150, 200), "durable");
    };
    tokio::task::spawn_blocking(check).await.unwrap();
    broker.shutdown().await;
}

/// DescribeLogDirs on the wire: each partition's share of the shared
/// files, from its log start (DeleteRecords shrinks it), the directory's
/// size and free space, and only what was asked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn describe_log_dirs_gives_each_partitions_share() {
    use kafka_protocol::messages::describe_log_dirs_request::DescribableLogDirTopic;
    use kafka_protocol::messages::{DescribeLogDirsRequest, DescribeLogDirsResponse};
    let dir = tempfile::tempdir().unwrap();
    let broker = common::start(common::args(dir.path())).await;
    let addr = broker.kafka_addr;
    let admin: AdminClient<DefaultClientContext> = common::client(addr).create().unwrap();
    for (name, n) in [("ld.app.big", 2), ("ld.app.small", 1)] {
        admin.create_topics([&NewTopic::new(name, n, TopicReplication::Fixed(1))], &AdminOptions::new()).await.unwrap()[0].as_ref().unwrap();
    }
    let producer: FutureProducer = common::producer_config(addr, "all").create().unwrap();
    let big = vec![b'b'; 10_000];
    for _ in 0..20 {
        producer.send(FutureRecord::to("ld.app.big").partition(0).key("k").payload(&big), Duration::from_secs(10)).await.unwrap();
    }
    producer.send(FutureRecord::to("ld.app.small").partition(0).key("k").payload("s"), Duration::from_secs(10)).await.unwrap();
    let mut sock = tokio::net::TcpStream::connect(addr).await.unwrap();
    let sizes = |r: &DescribeLogDirsResponse| -> Vec<(String, i32, i64)> {
        r.results[0].topics.iter().flat_map(|t| t.partitions.iter().map(move |p| (t.name.0.to_string(), p.partition_index, p.partition_size))).collect()
    };
    let all: DescribeLogDirsResponse = common::call(&mut sock, 35, 4, 1, &DescribeLogDirsRequest::default().with_topics(None)).await;
    assert_eq!(all.error_code, 0);
    let r = &all.results[0];
    assert!(r.total_bytes > 0 && r.usable_bytes > 0 && r.usable_bytes <= r.total_bytes);
    assert!(std::path::Path::new(r.log_dir.as_str()).is_absolute());
    let s = sizes(&all);
    assert_eq!(s.iter().map(|(t, p, _)| (t.as_str(), *p)).collect::<Vec<_>>(), [("ld.app.big", 0), ("ld.app.big", 1), ("ld.app.small", 0)]);
    assert!(s[0].2 > 200_000 && s[0].2 < 210_000, "the big partition's own bytes: {s:?}");
    assert_eq!(s[1].2, 0, "an empty partition");
    assert!(s[2].2 > 0 && s[2].2 < 1_000, "the small topic's share of the shared segment, not the segment: {s:?}");

    // Only what is asked: repeats once, unknown topics and partitions left out.
    let req = DescribeLogDirsRequest::default().with_topics(Some(vec![
        DescribableLogDirTopic::default().with_topic(tn("ld.app.big")).with_partitions(vec![0, 0, 9]),
        DescribableLogDirTopic::default().with_topic(tn("ld.nowhere")).with_partitions(vec![0]),
    ]));
    let some: DescribeLogDirsResponse = common::call(&mut sock, 35, 1, 2, &req).await;
    assert_eq!(sizes(&some).iter().map(|(t, p, _)| (t.as_str(), *p)).collect::<Vec<_>>(), [("ld.app.big", 0)]);

    // DeleteRecords shrinks what the partition accounts for (whole
    // batches below the new start).
    let mut tpl = rdkafka::TopicPartitionList::new();
    tpl.add_partition_offset("ld.app.big", 0, rdkafka::Offset::Offset(20)).unwrap();
    admin.delete_records(&tpl, &AdminOptions::new()).await.unwrap();
    let after: DescribeLogDirsResponse = common::call(&mut sock, 35, 4, 3, &DescribeLogDirsRequest::default().with_topics(None)).await;
    assert!(sizes(&after)[0].2 < s[0].2, "{:?} then {:?}", s[0], sizes(&after)[0]);
    drop((producer, admin));
    broker.shutdown().await;
}
