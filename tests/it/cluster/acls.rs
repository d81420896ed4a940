//! ACLs, SCRAM users, client quotas and every broker's default configs
//! are the cluster's (etcd's), not each broker's: one created through one
//! broker holds at every broker, a
//! deletion through another removes it everywhere, and a broker that was
//! down when they changed starts with the cluster's. A user set in a
//! node's data directory before it starts (`canopy user`) is handed to the
//! cluster.
//!
//! Clients and brokers use SSL listeners with client certificates required
//! and the authorizer is on; principals are the certificates' subjects.
//! The nodes and `admin` are super users; `writer` may do what the ACLs
//! let it. Its produce is checked at the leader of each partition, one per
//! node. Users log in with SASL PLAIN (checked against the same SCRAM
//! credentials) on a third listener.

use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

use kafka_protocol::messages::create_acls_request::AclCreation;
use kafka_protocol::messages::create_topics_request::{CreatableTopic, CreatableTopicConfig};
use kafka_protocol::messages::delete_acls_request::DeleteAclsFilter;
use kafka_protocol::messages::metadata_request::MetadataRequestTopic;
use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
use kafka_protocol::messages::*;
use kafka_protocol::protocol::{Decodable, Encodable, StrBytes};

use super::inter_broker::tls;
use super::poll;
use crate::cluster_support::{pki, spawn_node_extra, Etcd};
use crate::common::{self, ChildBroker};

const TOPIC: &str = "acl.t";
const WRITER: &str = "User:CN=writer,O=canopy";
/// The writer's principal name, as quotas name users.
const WRITER_NAME: &str = "CN=writer,O=canopy";
/// Kafka's wire numbers: resource TOPIC, patterns LITERAL and PREFIXED,
/// operations WRITE and DESCRIBE, permission ALLOW, and ANY in filters.
const TOPIC_RESOURCE: i8 = 2;
const LITERAL: i8 = 3;
const PREFIXED: i8 = 4;
const WRITE: i8 = 4;
const DESCRIBE: i8 = 8;
const ALLOW: i8 = 3;
const ANY: i8 = 1;

fn args(dir: &Path, id: i32) -> Vec<String> {
    let file = |f: &str| dir.join(f).display().to_string();
    let supers = ["node-1", "node-2", "node-3", "admin"].map(|n| format!("User:CN={n},O=canopy")).join(";");
    [
        "--listeners",
        "CLIENT://127.0.0.1:0,BROKER://127.0.0.1:0,SASL://127.0.0.1:0",
        "--listener-security-protocol-map",
        "CLIENT:SSL,BROKER:SSL,SASL:SASL_PLAINTEXT",
        "--inter-broker-listener-name",
        "BROKER",
        "--ssl-client-auth",
        "required",
        "--authorizer-enabled",
        "true",
    ]
    .into_iter()
    .map(str::to_owned)
    .chain(["--super-users".into(), supers])
    .chain(["--ssl-cert-file".into(), file(&format!("node-{id}.pem")), "--ssl-key-file".into(), file(&format!("node-{id}.key")), "--ssl-ca-file".into(), file("ca.pem")])
    .collect()
}

/// One request over TLS as `who` (a certificate's name under `dir`).
async fn call<Req: Encodable, Resp: Decodable>(dir: &Path, who: &str, addr: SocketAddr, key: i16, version: i16, req: &Req) -> Resp {
    let mut s = tls(&dir.join("ca.pem"), Some(dir.join(who)), addr).await.expect("TLS with a certificate of the cluster's CA");
    common::call(&mut s, key, version, 1, req).await
}

fn s(v: &str) -> StrBytes {
    StrBytes::from_string(v.to_owned())
}

fn writer_acl(pattern: i8, name: &str, operation: i8) -> AclCreation {
    AclCreation::default().with_resource_type(TOPIC_RESOURCE).with_resource_name(s(name)).with_resource_pattern_type(pattern).with_principal(s(WRITER)).with_host(s("*")).with_operation(operation).with_permission_type(ALLOW)
}

/// The ACLs `addr` describes for `writer`: (pattern, name, operation).
async fn writer_acls(dir: &Path, addr: SocketAddr) -> Vec<(i8, String, i8)> {
    let req = DescribeAclsRequest::default().with_resource_type_filter(ANY).with_resource_name_filter(None).with_host_filter(None).with_pattern_type_filter(ANY).with_principal_filter(Some(s(WRITER))).with_operation(ANY).with_permission_type(ANY);
    let r: DescribeAclsResponse = call(dir, "admin", addr, 29, 3, &req).await;
    assert_eq!(r.error_code, 0, "{:?}", r.error_message);
    let mut out: Vec<(i8, String, i8)> = r.resources.iter().flat_map(|res| res.acls.iter().map(|a| (res.pattern_type, res.resource_name.to_string(), a.operation))).collect();
    out.sort();
    out
}

/// Polls `addr` until it describes `want` for `writer`.
async fn wait_acls(dir: &Path, addr: SocketAddr, want: &[(i8, &str, i8)]) {
    let want: Vec<(i8, String, i8)> = want.iter().map(|(p, n, o)| (*p, n.to_string(), *o)).collect();
    poll(addr, "the writer's ACLs", |a| writer_acls(dir, a), |got| *got == want).await;
}

/// Partition leaders of the topic as `addr` sees them (every partition
/// led), by partition.
async fn leaders(dir: &Path, addr: SocketAddr) -> Vec<i32> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let req = MetadataRequest::default().with_topics(Some(vec![MetadataRequestTopic::default().with_name(Some(TopicName(s(TOPIC))))]));
        let r: MetadataResponse = call(dir, "admin", addr, 3, 12, &req).await;
        let mut ps: Vec<(i32, i32)> = r.topics.iter().flat_map(|t| t.partitions.iter().map(|p| (p.partition_index, p.leader_id.0))).collect();
        ps.sort();
        if ps.len() == 3 && ps.iter().all(|(_, l)| *l > 0) {
            return ps.into_iter().map(|(_, l)| l).collect();
        }
        assert!(Instant::now() < deadline, "the topic's partitions have no leaders: {ps:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// `writer`'s acks=all produce to each partition at its leader: the codes,
/// by partition (NOT_LEADER_OR_FOLLOWER retried after a fresh look).
async fn writer_produces(dir: &Path, nodes: &[Option<ChildBroker>]) -> Vec<i16> {
    let mut codes = Vec::new();
    for p in 0..3 {
        let deadline = Instant::now() + Duration::from_secs(60);
        let code = loop {
            let any = nodes.iter().flatten().next().unwrap().kafka;
            let leader = leaders(dir, any).await[p as usize];
            let Some(node) = nodes[leader as usize].as_ref() else {
                assert!(Instant::now() < deadline, "partition {p} stays led by a stopped node");
                tokio::time::sleep(Duration::from_millis(200)).await;
                continue;
            };
            let req = ProduceRequest::default().with_acks(-1).with_timeout_ms(10_000).with_topic_data(vec![TopicProduceData::default()
                .with_name(TopicName(s(TOPIC)))
                .with_partition_data(vec![PartitionProduceData::default().with_index(p).with_records(Some(common::producer_batch(-1, -1, -1, &[b"w"])))])]);
            let r: ProduceResponse = call(dir, "writer", node.kafka, 0, 8, &req).await;
            let code = r.responses[0].partition_responses[0].error_code;
            if code != 6 || Instant::now() > deadline {
                break code;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        };
        codes.push(code);
    }
    codes
}

/// The SASL_PLAINTEXT listener of node `id`, from its registration.
fn sasl_listener(etcd: &Etcd, id: i32) -> SocketAddr {
    let record: serde_json::Value = serde_json::from_str(&etcd.get(&format!("/canopy/it/nodes/{id}"))).unwrap();
    let port = record["endpoints"].as_array().unwrap().iter().find(|e| e["listener"] == "SASL").unwrap_or_else(|| panic!("no SASL endpoint: {record}"))["port"].as_i64().unwrap();
    format!("127.0.0.1:{port}").parse().unwrap()
}

/// SASL PLAIN as `user` at `addr`: the SaslAuthenticate error code.
async fn login(addr: SocketAddr, user: &str, password: &str) -> i16 {
    let mut sock = tokio::net::TcpStream::connect(addr).await.unwrap();
    assert_eq!(crate::security::handshake(&mut sock, "PLAIN", 1).await.error_code, 0);
    crate::security::authenticate(&mut sock, format!("\0{user}\0{password}").as_bytes()).await.error_code
}

/// Polls until `user` logging in at node `id` gets `code`.
async fn wait_login(etcd: &Etcd, id: i32, user: &str, password: &str, code: i16) {
    poll(sasl_listener(etcd, id), &format!("{user} logging in"), |a| login(a, user, password), |got| *got == code).await;
}

/// AlterUserScramCredentials as `admin` at `addr`: upsert `password` for
/// `user` (SCRAM-SHA-256), or delete that credential; the user's code.
async fn alter_user(dir: &Path, addr: SocketAddr, user: &str, password: Option<&[u8]>) -> i16 {
    use alter_user_scram_credentials_request::{ScramCredentialDeletion, ScramCredentialUpsertion};
    use canopy::auth::scram::Mechanism;
    let m = Mechanism::Sha256;
    let req = match password {
        Some(pw) => {
            let salt = b"fedcba9876543210".to_vec();
            let up = ScramCredentialUpsertion::default().with_name(s(user)).with_mechanism(m.kafka_type()).with_iterations(4096).with_salted_password(m.salted_password(pw, &salt, 4096).into()).with_salt(salt.into());
            AlterUserScramCredentialsRequest::default().with_upsertions(vec![up])
        }
        None => AlterUserScramCredentialsRequest::default().with_deletions(vec![ScramCredentialDeletion::default().with_name(s(user)).with_mechanism(m.kafka_type())]),
    };
    let r: AlterUserScramCredentialsResponse = call(dir, "admin", addr, 51, 0, &req).await;
    r.results[0].error_code
}

/// AlterClientQuotas as `admin` at `addr`: `writer`'s producer byte rate
/// set, or removed; the entry's code.
async fn alter_quota(dir: &Path, addr: SocketAddr, rate: Option<f64>) -> i16 {
    use alter_client_quotas_request::{EntityData, EntryData, OpData};
    let op = OpData::default().with_key(s("producer_byte_rate")).with_value(rate.unwrap_or(0.0)).with_remove(rate.is_none());
    let entry = EntryData::default().with_entity(vec![EntityData::default().with_entity_type(s("user")).with_entity_name(Some(s(WRITER_NAME)))]).with_ops(vec![op]);
    let r: AlterClientQuotasResponse = call(dir, "admin", addr, 49, 1, &AlterClientQuotasRequest::default().with_entries(vec![entry])).await;
    r.entries[0].error_code
}

/// `writer`'s producer byte rate as `addr` describes it.
async fn writer_quota(dir: &Path, addr: SocketAddr) -> Option<f64> {
    use describe_client_quotas_request::ComponentData;
    let req = DescribeClientQuotasRequest::default().with_components(vec![ComponentData::default().with_entity_type(s("user")).with_match_type(0).with_match(Some(s(WRITER_NAME)))]).with_strict(true);
    let r: DescribeClientQuotasResponse = call(dir, "admin", addr, 48, 1, &req).await;
    assert_eq!(r.error_code, 0, "{:?}", r.error_message);
    r.entries.into_iter().flatten().flat_map(|e| e.values).find(|v| v.key.as_str() == "producer_byte_rate").map(|v| v.value)
}

/// Polls `addr` until it describes `want` as `writer`'s rate.
async fn wait_quota(dir: &Path, addr: SocketAddr, want: Option<f64>) {
    poll(addr, "the writer's quota", |a| writer_quota(dir, a), |got| *got == want).await;
}

/// IncrementalAlterConfigs as `admin` at `addr`: every broker's default
/// `log.retention.ms` (BROKER ""); the resource's code.
async fn set_default_retention(dir: &Path, addr: SocketAddr, ms: &str) -> i16 {
    use incremental_alter_configs_request::{AlterConfigsResource, AlterableConfig};
    let config = AlterableConfig::default().with_name(s("log.retention.ms")).with_config_operation(0).with_value(Some(s(ms)));
    let req = IncrementalAlterConfigsRequest::default().with_resources(vec![AlterConfigsResource::default().with_resource_type(4).with_resource_name(s("")).with_configs(vec![config])]);
    let r: IncrementalAlterConfigsResponse = call(dir, "admin", addr, 44, 1, &req).await;
    r.responses[0].error_code
}

/// The topic's `retention.ms` as `addr` describes it.
async fn topic_retention(dir: &Path, addr: SocketAddr) -> String {
    use describe_configs_request::DescribeConfigsResource;
    let req = DescribeConfigsRequest::default().with_resources(vec![DescribeConfigsResource::default().with_resource_type(2).with_resource_name(s(TOPIC)).with_configuration_keys(Some(vec![s("retention.ms")]))]);
    let r: DescribeConfigsResponse = call(dir, "admin", addr, 32, 4, &req).await;
    assert_eq!(r.results[0].error_code, 0);
    r.results[0].configs[0].value.as_ref().map(|v| v.to_string()).unwrap_or_default()
}

/// Polls `addr` until it describes the topic's retention as `want`.
async fn wait_retention(dir: &Path, addr: SocketAddr, want: &str) {
    poll(addr, "the topic's retention.ms", |a| topic_retention(dir, a), |got| got == want).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs etcd and a canopy built with --features cluster: see the module docs"]
async fn acls_users_quotas_and_broker_configs_made_at_one_broker_hold_at_every_broker() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path();
    pki(dir, &["node-1", "node-2", "node-3", "admin", "writer"]);
    // A user set in node 1's data directory before it first starts.
    canopy::auth::users::set_password(&dir.join("node1"), "seeded", b"seed-pw", &canopy::auth::scram::Mechanism::ALL, 4096).unwrap();
    let etcd = Etcd::start(dir);
    let mut nodes: Vec<Option<ChildBroker>> = vec![None];
    for id in 1..=3 {
        nodes.push(Some(spawn_node_extra(dir, id, &etcd, &args(dir, id))));
    }
    let addr = |nodes: &[Option<ChildBroker>], id: i32| nodes[id as usize].as_ref().unwrap().kafka;
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let r: DescribeClusterResponse = call(dir, "admin", addr(&nodes, 1), 60, 0, &DescribeClusterRequest::default()).await;
        if r.brokers.len() == 3 && r.controller_id.0 > 0 {
            break;
        }
        assert!(Instant::now() < deadline, "three nodes and a controller: {r:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let topic = CreatableTopic::default().with_name(TopicName(s(TOPIC))).with_num_partitions(3).with_replication_factor(3).with_configs(vec![CreatableTopicConfig::default().with_name(s("min.insync.replicas")).with_value(Some(s("2")))]);
    let r: CreateTopicsResponse = call(dir, "admin", addr(&nodes, 1), 19, 5, &CreateTopicsRequest::default().with_topics(vec![topic]).with_timeout_ms(30_000)).await;
    assert_eq!(r.topics[0].error_code, 0, "{:?}", r.topics[0].error_message);
    let mut led = leaders(dir, addr(&nodes, 1)).await;
    led.sort();
    led.dedup();
    assert_eq!(led.len(), 3, "each node leads a partition");

    // Node 1's user logs in everywhere; a user made through node 1
    // too; a wrong password nowhere.
    for id in 1..=3 {
        wait_login(&etcd, id, "seeded", "seed-pw", 0).await;
    }
    assert_eq!(alter_user(dir, addr(&nodes, 1), "alice", Some(b"alice-pw")).await, 0);
    assert_eq!(login(sasl_listener(&etcd, 1), "alice", "alice-pw").await, 0, "node 1 answered once it had the user");
    for id in [2, 3] {
        wait_login(&etcd, id, "alice", "alice-pw", 0).await;
        assert_eq!(login(sasl_listener(&etcd, id), "alice", "wrong").await, 58, "SASL_AUTHENTICATION_FAILED");
    }

    // A quota set through node 3 is described everywhere.
    assert_eq!(alter_quota(dir, addr(&nodes, 3), Some(1_048_576.0)).await, 0);
    assert_eq!(writer_quota(dir, addr(&nodes, 3)).await, Some(1_048_576.0), "node 3 answered once it had the quota");
    for id in [1, 2] {
        wait_quota(dir, addr(&nodes, id), Some(1_048_576.0)).await;
    }

    // Every broker's default retention, changed through node 2, is the
    // topic's at every broker.
    assert_eq!(topic_retention(dir, addr(&nodes, 1)).await, "604800000");
    assert_eq!(set_default_retention(dir, addr(&nodes, 2), "3600000").await, 0);
    assert_eq!(topic_retention(dir, addr(&nodes, 2)).await, "3600000", "node 2 answered once it had the default");
    for id in [1, 3] {
        wait_retention(dir, addr(&nodes, id), "3600000").await;
    }

    // No ACL: the writer may not write anywhere.
    assert_eq!(writer_produces(dir, &nodes).await, vec![29; 3], "TOPIC_AUTHORIZATION_FAILED before any ACL");

    // Made through node 1, an ACL holds at nodes 2 and 3.
    // (The same ACL twice in one request is one ACL, as in Kafka.)
    let r: CreateAclsResponse = call(dir, "admin", addr(&nodes, 1), 30, 3, &CreateAclsRequest::default().with_creations(vec![writer_acl(PREFIXED, "acl.", WRITE), writer_acl(PREFIXED, "acl.", WRITE)])).await;
    assert_eq!(r.results.iter().map(|r| r.error_code).collect::<Vec<_>>(), vec![0, 0], "{:?}", r.results[0].error_message);
    assert_eq!(writer_acls(dir, addr(&nodes, 1)).await, vec![(PREFIXED, "acl.".to_owned(), WRITE)], "node 1 answered once it had the ACL");
    for id in [2, 3] {
        wait_acls(dir, addr(&nodes, id), &[(PREFIXED, "acl.", WRITE)]).await;
    }
    assert_eq!(writer_produces(dir, &nodes).await, vec![0; 3], "the writer writes at every leader");

    // Node 3 down, the ACL is deleted through node 2 and another made;
    // node 3 comes back with the cluster's ACLs.
    nodes[3].take().unwrap().kill9();
    let filter = DeleteAclsFilter::default().with_resource_type_filter(TOPIC_RESOURCE).with_resource_name_filter(None).with_host_filter(None).with_pattern_type_filter(ANY).with_principal_filter(Some(s(WRITER))).with_operation(WRITE).with_permission_type(ANY);
    let r: DeleteAclsResponse = call(dir, "admin", addr(&nodes, 2), 31, 3, &DeleteAclsRequest::default().with_filters(vec![filter])).await;
    assert_eq!(r.filter_results[0].error_code, 0);
    assert_eq!(r.filter_results[0].matching_acls.len(), 1, "the ACL made through node 1 was deleted through node 2");
    let r: CreateAclsResponse = call(dir, "admin", addr(&nodes, 2), 30, 3, &CreateAclsRequest::default().with_creations(vec![writer_acl(LITERAL, TOPIC, DESCRIBE)])).await;
    assert_eq!(r.results[0].error_code, 0);
    wait_acls(dir, addr(&nodes, 1), &[(LITERAL, TOPIC, DESCRIBE)]).await;
    // So is alice, and bob made.
    assert_eq!(alter_user(dir, addr(&nodes, 2), "alice", None).await, 0);
    assert_eq!(alter_user(dir, addr(&nodes, 2), "alice", None).await, 91, "RESOURCE_NOT_FOUND: already deleted");
    assert_eq!(alter_user(dir, addr(&nodes, 2), "bob", Some(b"bob-pw")).await, 0);
    wait_login(&etcd, 1, "alice", "alice-pw", 58).await;
    // And the quota raised.
    assert_eq!(alter_quota(dir, addr(&nodes, 2), Some(2_097_152.0)).await, 0);
    wait_quota(dir, addr(&nodes, 1), Some(2_097_152.0)).await;
    nodes[3] = Some(spawn_node_extra(dir, 3, &etcd, &args(dir, 3)));
    assert_eq!(writer_acls(dir, addr(&nodes, 3)).await, vec![(LITERAL, TOPIC.to_owned(), DESCRIBE)], "a restarted node serves the cluster's ACLs from its start");
    let at3 = sasl_listener(&etcd, 3);
    assert_eq!([login(at3, "alice", "alice-pw").await, login(at3, "bob", "bob-pw").await, login(at3, "seeded", "seed-pw").await], [58, 0, 0], "and the cluster's users");
    assert_eq!(writer_quota(dir, addr(&nodes, 3)).await, Some(2_097_152.0), "and the cluster's quotas");
    assert_eq!(topic_retention(dir, addr(&nodes, 3)).await, "3600000", "and the cluster's broker configs");
    // A quota removed through node 3 is gone everywhere.
    assert_eq!(alter_quota(dir, addr(&nodes, 3), None).await, 0);
    for id in [1, 2] {
        wait_quota(dir, addr(&nodes, id), None).await;
    }
    assert_eq!(writer_produces(dir, &nodes).await, vec![29; 3], "WRITE is gone at every leader");
}
