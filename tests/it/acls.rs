//! The authorizer through real clients and raw requests: what each
//! principal may do is what its ACLs say, a refused request changes
//! nothing, and ACLs survive a restart.

use std::net::SocketAddr;
use std::time::Duration;

use canopy::auth::scram::Mechanism;
use kafka_protocol::messages::*;
use kafka_protocol::protocol::StrBytes;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::Message;
use tokio::net::TcpStream;

use super::common;
use super::security::{authenticate, handshake, listener, metric, metrics, sasl};

const TOPIC_AUTHORIZATION_FAILED: i16 = 29;
const GROUP_AUTHORIZATION_FAILED: i16 = 30;
const CLUSTER_AUTHORIZATION_FAILED: i16 = 31;
const TRANSACTIONAL_ID_AUTHORIZATION_FAILED: i16 = 53;

pub(super) fn s(v: &str) -> StrBytes {
    StrBytes::from_string(v.to_owned())
}

/// A raw connection logged in as `user` (password `<user>-pw`) with PLAIN.
pub(super) async fn login(addr: SocketAddr, user: &str) -> TcpStream {
    let mut sock = TcpStream::connect(addr).await.unwrap();
    assert_eq!(handshake(&mut sock, "PLAIN", 1).await.error_code, 0);
    let a = authenticate(&mut sock, format!("\0{user}\0{user}-pw").as_bytes()).await;
    assert_eq!(a.error_code, 0, "{user} logs in");
    sock
}

/// A filter as clients send one: null strings match any.
fn describe_filter() -> DescribeAclsRequest {
    DescribeAclsRequest::default().with_resource_name_filter(None).with_principal_filter(None).with_host_filter(None).with_resource_type_filter(1).with_pattern_type_filter(1).with_operation(1).with_permission_type(1)
}

fn creation(rt: i8, name: &str, pattern: i8, principal: &str, op: i8, perm: i8) -> create_acls_request::AclCreation {
    create_acls_request::AclCreation::default().with_resource_type(rt).with_resource_name(s(name)).with_resource_pattern_type(pattern).with_principal(s(principal)).with_host(s("*")).with_operation(op).with_permission_type(perm)
}

// Kafka's numbers: resource TOPIC 2, GROUP 3, CLUSTER 4, TRANSACTIONAL_ID 5;
// pattern LITERAL 3, PREFIXED 4; operation ALL 2, READ 3, WRITE 4;
// permission DENY 2, ALLOW 3.
const TOPIC: i8 = 2;
const GROUP: i8 = 3;
const TXN: i8 = 5;
const LITERAL: i8 = 3;
const PREFIXED: i8 = 4;

fn args(dir: &std::path::Path) -> canopy::config::ServeArgs {
    let mut a = common::args(&dir.join("data"));
    a.listeners = Some("SASL_PLAINTEXT://127.0.0.1:0".into());
    a.authorizer_enabled = Some(true);
    a.super_users = Some("User:admin".into());
    a.connection_failed_authentication_delay_ms = Some(10);
    a
}

async fn committed(admin: &mut TcpStream, group: &str, topic: &str) -> i64 {
    let req = OffsetFetchRequest::default().with_group_id(GroupId(s(group))).with_topics(Some(vec![offset_fetch_request::OffsetFetchRequestTopic::default().with_name(TopicName(s(topic))).with_partition_indexes(vec![0])]));
    let r: OffsetFetchResponse = common::call(admin, 9, 5, 7, &req).await;
    r.topics[0].partitions[0].committed_offset
}

async fn commit(sock: &mut TcpStream, group: &str, topic: &str, offset: i64) -> i16 {
    let req = OffsetCommitRequest::default().with_group_id(GroupId(s(group))).with_generation_id_or_member_epoch(-1).with_topics(vec![offset_commit_request::OffsetCommitRequestTopic::default()
        .with_name(TopicName(s(topic)))
        .with_partitions(vec![offset_commit_request::OffsetCommitRequestPartition::default().with_partition_index(0).with_committed_offset(offset)])]);
    let r: OffsetCommitResponse = common::call(sock, 8, 8, 8, &req).await;
    r.topics[0].partitions[0].error_code
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acls_decide_what_each_principal_may_do_and_a_refusal_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    for u in ["admin", "alice", "bob"] {
        canopy::auth::users::set_password(&dir.path().join("data"), u, format!("{u}-pw").as_bytes(), &Mechanism::ALL, 4096).unwrap();
    }
    let broker = common::start(args(dir.path())).await;
    let addr = listener(&broker, "SASL_PLAINTEXT");
    let mut admin = login(addr, "admin").await;

    // The super user creates the topics (librdkafka's AdminClient).
    let admin_cfg = sasl(addr, "SASL_PLAINTEXT", "SCRAM-SHA-512", "admin", "admin-pw", "");
    let a: AdminClient<DefaultClientContext> = admin_cfg.create().unwrap();
    let topics: Vec<NewTopic> = ["app.codestore.commits", "app.codestore.secret", "app.billing.invoices"].iter().map(|t| NewTopic::new(t, 1, TopicReplication::Fixed(1))).collect();
    for r in a.create_topics(&topics, &AdminOptions::new()).await.unwrap() {
        r.unwrap();
    }

    // ACLs: alice gets the codestore branch (but not to read its secret),
    // groups starting with alice-, and her transactional id; bob one topic.
    let acls = CreateAclsRequest::default().with_creations(vec![
        creation(TOPIC, "app.codestore.", PREFIXED, "User:alice", 4, 3),
        creation(TOPIC, "app.codestore.", PREFIXED, "User:alice", 3, 3),
        creation(TOPIC, "app.codestore.secret", LITERAL, "User:alice", 3, 2),
        creation(GROUP, "alice-", PREFIXED, "User:alice", 3, 3),
        creation(TXN, "alice-tx", LITERAL, "User:alice", 4, 3),
        creation(TOPIC, "app.billing.invoices", LITERAL, "User:bob", 2, 3),
        creation(9, "x", LITERAL, "User:bob", 2, 3),
        creation(TOPIC, "x", LITERAL, "bob", 2, 3),
    ]);
    let r: CreateAclsResponse = common::call(&mut admin, 30, 3, 1, &acls).await;
    assert_eq!(r.results.iter().map(|r| r.error_code).collect::<Vec<_>>(), [0, 0, 0, 0, 0, 0, 42, 42], "two invalid creations: INVALID_REQUEST");
    // Only the cluster's ALTER (the super user) may manage ACLs.
    let mut alice = login(addr, "alice").await;
    let r: CreateAclsResponse = common::call(&mut alice, 30, 3, 2, &CreateAclsRequest::default().with_creations(vec![creation(TOPIC, "app.", PREFIXED, "User:alice", 2, 3)])).await;
    assert_eq!(r.results[0].error_code, CLUSTER_AUTHORIZATION_FAILED);
    let r: DescribeAclsResponse = common::call(&mut alice, 29, 3, 3, &describe_filter()).await;
    assert_eq!(r.error_code, CLUSTER_AUTHORIZATION_FAILED);
    let r: DescribeAclsResponse = common::call(&mut admin, 29, 3, 4, &describe_filter().with_resource_type_filter(TOPIC).with_pattern_type_filter(2).with_resource_name_filter(Some(s("app.codestore.secret")))).await;
    assert_eq!(r.error_code, 0, "{r:?}");
    let named: Vec<(String, i8, usize)> = r.resources.iter().map(|r| (r.resource_name.to_string(), r.pattern_type, r.acls.len())).collect();
    assert_eq!(named, [("app.codestore.".to_owned(), PREFIXED, 2), ("app.codestore.secret".to_owned(), LITERAL, 1)], "MATCH finds the literal and the prefixed ACLs");

    // alice through librdkafka: the branch is hers to write; billing is not.
    let alice_cfg = sasl(addr, "SASL_PLAINTEXT", "SCRAM-SHA-512", "alice", "alice-pw", "");
    let mut pc = alice_cfg.clone();
    pc.set("acks", "all").set("message.timeout.ms", "10000");
    let producer: FutureProducer = pc.create().unwrap();
    for t in ["app.codestore.commits", "app.codestore.secret"] {
        for i in 0..3 {
            producer.send(FutureRecord::<(), _>::to(t).payload(&format!("{t}-{i}")), Duration::from_secs(10)).await.unwrap_or_else(|(e, _)| panic!("{t}: {e}"));
        }
    }
    let refused = producer.send(FutureRecord::<(), _>::to("app.billing.invoices").payload("x"), Duration::from_secs(10)).await;
    assert!(matches!(refused, Err((rdkafka::error::KafkaError::MessageProduction(rdkafka::types::RDKafkaErrorCode::TopicAuthorizationFailed), _))), "{refused:?}");
    // Metadata lists only what alice may describe.
    let listed: Vec<String> = {
        let c: BaseConsumer = alice_cfg.create().unwrap();
        let md = tokio::task::spawn_blocking(move || c.fetch_metadata(None, Duration::from_secs(10)).unwrap()).await.unwrap();
        let mut v: Vec<String> = md.topics().iter().map(|t| t.name().to_owned()).collect();
        v.sort();
        v
    };
    assert_eq!(listed, ["app.codestore.commits", "app.codestore.secret"]);

    // The subtree stream of the branch carries commits but not the secret
    // alice may not read (filtered inside the merge).
    let mut cc = alice_cfg.clone();
    cc.set("group.id", "alice-stream").set("enable.auto.commit", "false").set("auto.offset.reset", "earliest");
    let got = tokio::task::spawn_blocking(move || {
        let c: BaseConsumer = cc.create().unwrap();
        let mut tpl = rdkafka::TopicPartitionList::new();
        tpl.add_partition_offset("app.codestore.__all", 0, rdkafka::Offset::Beginning).unwrap();
        c.assign(&tpl).unwrap();
        let mut got = Vec::new();
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        while std::time::Instant::now() < deadline && got.len() < 6 {
            if let Some(Ok(m)) = c.poll(Duration::from_millis(200)) {
                got.push(String::from_utf8(m.payload().unwrap_or_default().to_vec()).unwrap());
            }
        }
        got
    })
    .await
    .unwrap();
    assert_eq!(got, ["app.codestore.commits-0", "app.codestore.commits-1", "app.codestore.commits-2"], "only what alice may read");
    // Reading the secret directly: TOPIC_AUTHORIZATION_FAILED.
    let f: FetchResponse = common::call(
        &mut alice,
        1,
        12,
        5,
        &FetchRequest::default().with_max_wait_ms(0).with_max_bytes(1 << 20).with_topics(vec![fetch_request::FetchTopic::default()
            .with_topic(TopicName(s("app.codestore.secret")))
            .with_partitions(vec![fetch_request::FetchPartition::default().with_partition(0).with_partition_max_bytes(1 << 20)])]),
    )
    .await;
    assert_eq!(f.responses[0].partitions[0].error_code, TOPIC_AUTHORIZATION_FAILED);
    assert!(f.responses[0].partitions[0].records.as_ref().is_none_or(|r| r.is_empty()));

    // alice commits in her group.
    assert_eq!(commit(&mut alice, "alice-g", "app.codestore.commits", 3).await, 0);
    assert_eq!(commit(&mut alice, "other-g", "app.codestore.commits", 3).await, GROUP_AUTHORIZATION_FAILED);

    // bob may do none of alice's things, and nothing changes.
    let mut bob = login(addr, "bob").await;
    let d: DeleteTopicsResponse = common::call(&mut bob, 20, 6, 9, &DeleteTopicsRequest::default().with_topics(vec![delete_topics_request::DeleteTopicState::default().with_name(Some(TopicName(s("app.codestore.commits"))))])).await;
    assert_eq!(d.responses[0].error_code, TOPIC_AUTHORIZATION_FAILED);
    assert!(broker.engine.topic("app.codestore.commits").is_some(), "not deleted");
    assert_eq!(commit(&mut bob, "alice-g", "app.codestore.commits", 0).await, GROUP_AUTHORIZATION_FAILED);
    assert_eq!(committed(&mut admin, "alice-g", "app.codestore.commits").await, 3, "alice's offset did not move");
    let j: JoinGroupResponse = common::call(
        &mut bob,
        11,
        7,
        10,
        &JoinGroupRequest::default().with_group_id(GroupId(s("alice-g"))).with_session_timeout_ms(10000).with_rebalance_timeout_ms(10000).with_protocol_type(s("consumer")).with_protocols(vec![join_group_request::JoinGroupRequestProtocol::default().with_name(s("range"))]),
    )
    .await;
    assert_eq!(j.error_code, GROUP_AUTHORIZATION_FAILED);
    let i: InitProducerIdResponse = common::call(&mut bob, 22, 4, 11, &InitProducerIdRequest::default().with_transactional_id(Some(TransactionalId(s("alice-tx")))).with_transaction_timeout_ms(10000)).await;
    assert_eq!(i.error_code, TRANSACTIONAL_ID_AUTHORIZATION_FAILED);
    let i: InitProducerIdResponse = common::call(&mut alice, 22, 4, 12, &InitProducerIdRequest::default().with_transactional_id(Some(TransactionalId(s("alice-tx")))).with_transaction_timeout_ms(10000)).await;
    assert_eq!(i.error_code, 0, "alice's own transactional id");
    let c: CreateTopicsResponse = common::call(&mut bob, 19, 7, 13, &CreateTopicsRequest::default().with_topics(vec![create_topics_request::CreatableTopic::default().with_name(TopicName(s("app.codestore.new"))).with_num_partitions(1).with_replication_factor(1)])).await;
    assert_eq!(c.topics[0].error_code, TOPIC_AUTHORIZATION_FAILED);
    assert!(broker.engine.topic("app.codestore.new").is_none(), "not created");
    // A transactional batch without a transactional id (writing into
    // someone's transaction by its producer id) is refused even on a topic
    // bob may write; so is reading a topic that does not exist, without
    // saying whether it does; and a topic named by id is not named.
    let txn_batch = {
        use kafka_protocol::records::{Record, RecordBatchEncoder, RecordEncodeOptions, TimestampType};
        let r = Record { transactional: true, control: false, delete_horizon: false, partition_leader_epoch: -1, producer_id: 7, producer_epoch: 0, timestamp_type: TimestampType::Creation, offset: 0, sequence: 0, timestamp: 1_700_000_000_000, key: None, value: Some(bytes::Bytes::from_static(b"sneaky")), headers: Default::default() };
        let mut b = bytes::BytesMut::new();
        RecordBatchEncoder::encode(&mut b, &[r], &RecordEncodeOptions { version: 2, compression: kafka_protocol::records::Compression::None }).unwrap();
        b.freeze()
    };
    let p: ProduceResponse = common::call(
        &mut bob,
        0,
        9,
        20,
        &ProduceRequest::default().with_acks(-1).with_timeout_ms(5000).with_topic_data(vec![produce_request::TopicProduceData::default()
            .with_name(TopicName(s("app.billing.invoices")))
            .with_partition_data(vec![produce_request::PartitionProduceData::default().with_index(0).with_records(Some(txn_batch))])]),
    )
    .await;
    assert_eq!(p.responses[0].partition_responses[0].error_code, TRANSACTIONAL_ID_AUTHORIZATION_FAILED);
    assert_eq!(broker.engine.offsets(&broker.engine.topic("app.billing.invoices").unwrap().tp(0)).unwrap().1, 0, "nothing written");
    let f: FetchResponse = common::call(
        &mut bob,
        1,
        12,
        21,
        &FetchRequest::default().with_max_wait_ms(0).with_max_bytes(1 << 20).with_topics(vec![fetch_request::FetchTopic::default()
            .with_topic(TopicName(s("no.such.topic")))
            .with_partitions(vec![fetch_request::FetchPartition::default().with_partition(0).with_partition_max_bytes(1 << 20)])]),
    )
    .await;
    assert_eq!(f.responses[0].partitions[0].error_code, TOPIC_AUTHORIZATION_FAILED, "existence is not revealed");
    let id = uuid::Uuid::from_bytes(broker.engine.topic("app.codestore.commits").unwrap().id());
    let d: DeleteTopicsResponse = common::call(&mut bob, 20, 6, 22, &DeleteTopicsRequest::default().with_topics(vec![delete_topics_request::DeleteTopicState::default().with_name(None).with_topic_id(id)])).await;
    assert_eq!((d.responses[0].error_code, d.responses[0].name.is_none()), (TOPIC_AUTHORIZATION_FAILED, true), "no name for a topic bob may not describe");
    // alice's consumer asks Metadata with auto-creation on (the Java
    // client's default): her stream and topics are answered, no CREATE asked.
    let m: MetadataResponse = common::call(
        &mut alice,
        3,
        12,
        23,
        &MetadataRequest::default().with_allow_auto_topic_creation(true).with_topics(Some(vec![
            metadata_request::MetadataRequestTopic::default().with_name(Some(TopicName(s("app.codestore.__all")))),
            metadata_request::MetadataRequestTopic::default().with_name(Some(TopicName(s("app.codestore.commits")))),
        ])),
    )
    .await;
    assert_eq!(m.topics.iter().map(|t| t.error_code).collect::<Vec<_>>(), [0, 0]);

    // Bob's metadata request for a topic it may not describe, with
    // auto-creation on: refused, and nothing is created.
    let m: MetadataResponse = common::call(&mut bob, 3, 12, 14, &MetadataRequest::default().with_allow_auto_topic_creation(true).with_topics(Some(vec![metadata_request::MetadataRequestTopic::default().with_name(Some(TopicName(s("app.codestore.auto"))))]))).await;
    assert_eq!(m.topics[0].error_code, TOPIC_AUTHORIZATION_FAILED);
    assert!(broker.engine.topic("app.codestore.auto").is_none());

    // The cluster's operations need their cluster ACLs: moving partitions
    // (ALTER), listing moves (DESCRIBE), writing transaction markers
    // (CLUSTER_ACTION, as brokers do): bob has none; nothing is written.
    let before = broker.engine.offsets(&broker.engine.topic("app.billing.invoices").unwrap().tp(0)).unwrap();
    let move_it = AlterPartitionReassignmentsRequest::default().with_topics(vec![alter_partition_reassignments_request::ReassignableTopic::default()
        .with_name(TopicName(s("app.billing.invoices")))
        .with_partitions(vec![alter_partition_reassignments_request::ReassignablePartition::default().with_partition_index(0).with_replicas(None)])]);
    let r: AlterPartitionReassignmentsResponse = common::call(&mut bob, 45, 0, 16, &move_it).await;
    assert_eq!((r.error_code, r.responses[0].partitions[0].error_code), (CLUSTER_AUTHORIZATION_FAILED, CLUSTER_AUTHORIZATION_FAILED));
    let r: ListPartitionReassignmentsResponse = common::call(&mut bob, 46, 0, 17, &ListPartitionReassignmentsRequest::default()).await;
    assert_eq!(r.error_code, CLUSTER_AUTHORIZATION_FAILED);
    let r: ListPartitionReassignmentsResponse = common::call(&mut admin, 46, 0, 18, &ListPartitionReassignmentsRequest::default()).await;
    assert_eq!((r.error_code, r.topics.len()), (0, 0), "the super user may list");
    let markers = WriteTxnMarkersRequest::default().with_markers(vec![write_txn_markers_request::WritableTxnMarker::default()
        .with_producer_id(ProducerId(1))
        .with_producer_epoch(0)
        .with_transaction_result(false)
        .with_topics(vec![write_txn_markers_request::WritableTxnMarkerTopic::default().with_name(TopicName(s("app.billing.invoices"))).with_partition_indexes(vec![0])])]);
    let r: WriteTxnMarkersResponse = common::call(&mut bob, 27, 1, 19, &markers).await;
    assert_eq!(r.markers[0].topics[0].partitions[0].error_code, CLUSTER_AUTHORIZATION_FAILED);
    assert_eq!(broker.engine.offsets(&broker.engine.topic("app.billing.invoices").unwrap().tp(0)).unwrap(), before, "no marker written");
    // The brokers' form of AddPartitionsToTxn (v4+) is a cluster action too.
    let ask = AddPartitionsToTxnRequest::default().with_transactions(vec![add_partitions_to_txn_request::AddPartitionsToTxnTransaction::default()
        .with_transactional_id(TransactionalId(s("alice-tx")))
        .with_producer_id(ProducerId(1))
        .with_producer_epoch(0)
        .with_verify_only(true)
        .with_topics(vec![add_partitions_to_txn_request::AddPartitionsToTxnTopic::default().with_name(TopicName(s("app.codestore.commits"))).with_partitions(vec![0])])]);
    let r: AddPartitionsToTxnResponse = common::call(&mut alice, 24, 5, 20, &ask).await;
    assert_eq!((r.error_code, r.results_by_transaction[0].topic_results[0].results_by_partition[0].partition_error_code), (CLUSTER_AUTHORIZATION_FAILED, CLUSTER_AUTHORIZATION_FAILED), "alice may write her transactional id, but is no broker");

    // Deleting alice's group ACL takes her group away.
    let del: DeleteAclsResponse = common::call(
        &mut admin,
        31,
        3,
        15,
        &DeleteAclsRequest::default().with_filters(vec![delete_acls_request::DeleteAclsFilter::default().with_resource_name_filter(None).with_host_filter(None).with_resource_type_filter(GROUP).with_pattern_type_filter(1).with_principal_filter(Some(s("User:alice"))).with_operation(1).with_permission_type(1)]),
    )
    .await;
    assert_eq!(del.filter_results[0].matching_acls.len(), 1);
    assert_eq!(commit(&mut alice, "alice-g", "app.codestore.commits", 2).await, GROUP_AUTHORIZATION_FAILED);
    let m = metrics(&broker).await;
    assert!(metric(&m, r#"canopy_kafka_authorization_denied_total{resource_type="topic"}"#) >= 4.0, "{m}");
    assert!(metric(&m, r#"canopy_kafka_authorization_denied_total{resource_type="group"}"#) >= 3.0);
    drop((admin, alice, bob, producer, a));
    broker.shutdown().await;

    // ACLs are durable: after a restart bob is still refused, alice still
    // writes her branch.
    let broker = common::start(args(dir.path())).await;
    let addr = listener(&broker, "SASL_PLAINTEXT");
    let mut bob = login(addr, "bob").await;
    let d: DeleteTopicsResponse = common::call(&mut bob, 20, 6, 1, &DeleteTopicsRequest::default().with_topics(vec![delete_topics_request::DeleteTopicState::default().with_name(Some(TopicName(s("app.codestore.commits"))))])).await;
    assert_eq!(d.responses[0].error_code, TOPIC_AUTHORIZATION_FAILED);
    let mut alice = login(addr, "alice").await;
    assert_eq!(commit(&mut alice, "alice-g", "app.codestore.commits", 2).await, GROUP_AUTHORIZATION_FAILED, "the deleted ACL stays deleted");
    broker.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_authorizer_acl_apis_say_security_disabled_and_everything_is_allowed() {
    let dir = tempfile::tempdir().unwrap();
    let broker = common::start(common::args(&dir.path().join("data"))).await;
    let mut sock = TcpStream::connect(broker.kafka_addr).await.unwrap();
    let r: CreateAclsResponse = common::call(&mut sock, 30, 3, 1, &CreateAclsRequest::default().with_creations(vec![creation(TOPIC, "t", LITERAL, "User:x", 3, 3)])).await;
    assert_eq!(r.results[0].error_code, 54, "SECURITY_DISABLED");
    let r: DescribeAclsResponse = common::call(&mut sock, 29, 3, 2, &describe_filter()).await;
    assert_eq!(r.error_code, 54);
    let c: CreateTopicsResponse = common::call(&mut sock, 19, 7, 3, &CreateTopicsRequest::default().with_topics(vec![create_topics_request::CreatableTopic::default().with_name(TopicName(s("open.t"))).with_num_partitions(1).with_replication_factor(1)])).await;
    assert_eq!(c.topics[0].error_code, 0);
    broker.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_rest_bridge_asks_the_same_authorizer() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    canopy::auth::users::set_password(&data, "admin", b"admin-pw", &Mechanism::ALL, 4096).unwrap();
    let principals = dir.path().join("principals.toml");
    std::fs::write(&principals, format!("[[principal]]\nname = \"alice\"\ntoken_sha256 = \"{}\"\nproduce = [\"*\"]\n", canopy::auth::hash_secret(b"alice-token"))).unwrap();
    let mut a = args(dir.path());
    a.principals_file = Some(principals.display().to_string());
    let broker = common::start(a).await;
    let addr = listener(&broker, "SASL_PLAINTEXT");
    broker.engine.create_topic("rest.hidden", 1, Default::default(), false).unwrap();
    let mut admin = login(addr, "admin").await;
    let r: CreateAclsResponse = common::call(
        &mut admin,
        30,
        3,
        1,
        &CreateAclsRequest::default().with_creations(vec![creation(TOPIC, "rest.ok", LITERAL, "User:alice", 4, 3), creation(TOPIC, "rest.ok", LITERAL, "User:alice", 5, 3), creation(TOPIC, "rest.w.", PREFIXED, "User:alice", 4, 3)]),
    )
    .await;
    assert!(r.results.iter().all(|r| r.error_code == 0));
    let base = format!("http://{}", broker.rest_addr.unwrap());
    let http = reqwest::Client::new();
    let post = |topic: &str| http.post(format!("{base}/ingest/{topic}")).bearer_auth("alice-token").header("content-type", "application/json").body(r#"{"a":1}"#).send();
    assert_eq!(post("rest.ok").await.unwrap().status(), 200);
    let refused = post("rest.hidden").await.unwrap();
    assert_eq!(refused.status(), 403, "WRITE is not granted on rest.hidden");
    assert_eq!(broker.engine.offsets(&broker.engine.topic("rest.hidden").unwrap().tp(0)).unwrap().1, 0, "nothing written");
    // WRITE without CREATE does not create a topic on the way.
    let refused = post("rest.w.new").await.unwrap();
    assert_eq!(refused.status(), 403);
    assert!(broker.engine.topic("rest.w.new").is_none(), "not created");
    // Listing shows only what alice may describe (WRITE implies DESCRIBE).
    let listed: Vec<String> = serde_json::from_str(&http.get(format!("{base}/topics")).bearer_auth("alice-token").send().await.unwrap().text().await.unwrap()).unwrap();
    assert_eq!(listed, ["rest.ok"]);
    let hidden = http.get(format!("{base}/topics/rest.hidden")).bearer_auth("alice-token").send().await.unwrap();
    assert_eq!(hidden.status(), 404, "a topic alice may not describe is not found");
    broker.shutdown().await;
}
