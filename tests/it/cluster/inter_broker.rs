//! Brokers authenticate each other: the inter-broker listener
//! (`inter_broker_listener_name`) is SSL and requires client certificates,
//! so a follower shows its node certificate to its leader and checks the
//! leader's, both against the cluster's CA; clients use a PLAINTEXT
//! listener beside it.
//!
//! Shown: every follower of a topic with replication factor 3 fetches over
//! TLS (every node joins every ISR, and librdkafka's acks=all records,
//! produced through one node, are read back through another); a replica
//! fetch on the clients' listener is refused (CLUSTER_AUTHORIZATION_FAILED)
//! while the same fetch over the inter-broker listener with a node's
//! certificate is answered; that listener takes no connection without a
//! certificate, nor one whose certificate another CA signed.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
use kafka_protocol::messages::{ApiVersionsRequest, BrokerId, FetchRequest, FetchResponse};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_rustls::rustls;

use super::{create_replicated, produce_acked, read_all, wait_until};
use crate::cluster_support::{mtls_args as args, pki, spawn_node_extra, Etcd};
use crate::common::{self, ChildBroker};

const TOPIC: &str = "mtls.t";

/// A TLS connection to `addr` trusting `ca`, presenting `<cert>.pem` /
/// `.key` when given; None when the handshake fails.
pub(super) async fn tls(ca: &Path, cert: Option<PathBuf>, addr: std::net::SocketAddr) -> Option<tokio_rustls::client::TlsStream<TcpStream>> {
    use rustls_pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    for c in rustls_pki_types::CertificateDer::pem_file_iter(ca).unwrap() {
        roots.add(c.unwrap()).unwrap();
    }
    let b = rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider())).with_safe_default_protocol_versions().unwrap().with_root_certificates(roots);
    let cfg = match cert {
        Some(c) => {
            let chain = rustls_pki_types::CertificateDer::pem_file_iter(c.with_extension("pem")).unwrap().map(|c| c.unwrap()).collect();
            b.with_client_auth_cert(chain, rustls_pki_types::PrivateKeyDer::from_pem_file(c.with_extension("key")).unwrap()).unwrap()
        }
        None => b.with_no_client_auth(),
    };
    let sock = TcpStream::connect(addr).await.unwrap();
    tokio_rustls::TlsConnector::from(Arc::new(cfg)).connect(rustls_pki_types::ServerName::try_from("127.0.0.1").unwrap(), sock).await.ok()
}

/// Whether the broker answers an ApiVersions on `sock` (with TLS 1.3 a
/// server refusing the client's certificate says so after the client's
/// side of the handshake is done: at the first read).
async fn answers<S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin>(sock: &mut S) -> bool {
    let mut body = bytes::BytesMut::new();
    kafka_protocol::protocol::Encodable::encode(&ApiVersionsRequest::default(), &mut body, 0).unwrap();
    if sock.write_all(&common::request_frame(18, 0, 1, &body)).await.is_err() || sock.flush().await.is_err() {
        return false;
    }
    let mut len = [0u8; 4];
    matches!(tokio::time::timeout(Duration::from_secs(10), sock.read_exact(&mut len)).await.expect("answered or closed"), Ok(_))
}

/// A Fetch v14 naming replica `replica`, for partition 0 of the topic
/// with id `id` from offset 0.
fn replica_fetch(replica: i32, id: uuid::Uuid) -> FetchRequest {
    FetchRequest::default().with_replica_id(BrokerId(replica)).with_max_wait_ms(0).with_max_bytes(1 << 20).with_topics(vec![FetchTopic::default()
        .with_topic_id(id)
        .with_partitions(vec![FetchPartition::default().with_partition(0).with_fetch_offset(0).with_current_leader_epoch(-1).with_last_fetched_epoch(-1).with_partition_max_bytes(1 << 20)])])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs etcd and a canopy built with --features cluster: see the module docs"]
async fn brokers_replicate_over_tls_and_take_replica_fetches_only_from_brokers() {
    let root = tempfile::tempdir().unwrap();
    let ca = pki(root.path(), &["node-1", "node-2", "node-3"]);
    let etcd = Etcd::start(root.path());
    let mut nodes: Vec<Option<ChildBroker>> = vec![None];
    for id in 1..=3 {
        nodes.push(Some(spawn_node_extra(root.path(), id, &etcd, &args(root.path(), id))));
    }
    let client = |id: i32| nodes[id as usize].as_ref().unwrap().kafka;
    wait_until(client(1), "three nodes", |s| s.0.len() == 3 && s.1 > 0).await;

    // Every follower fetches over TLS: every node joins every ISR, and
    // acks=all records are acknowledged and read back elsewhere.
    let layout = create_replicated(client(1), TOPIC, 3).await;
    produce_acked(client(2), TOPIC, "m", 300, 3).await;
    let expected: Vec<Vec<String>> = (0..3).map(|p| (0..300).filter(|i| i % 3 == p).map(|i| format!("m{i}")).collect()).collect();
    assert_eq!(read_all(client(3), TOPIC, 3, 300).await, expected);

    // Partition 0's leader, on both listeners: a replica fetch from a
    // client's listener is refused; over the inter-broker listener, with
    // a node's certificate, it is answered with the records.
    let leader = layout[0].0;
    let record: serde_json::Value = serde_json::from_str(&etcd.get(&format!("/canopy/it/nodes/{leader}"))).unwrap();
    let broker_port = record["endpoints"].as_array().unwrap().iter().find(|e| e["listener"] == "BROKER").unwrap_or_else(|| panic!("no BROKER endpoint: {record}"))["port"].as_i64().unwrap();
    let broker_addr: std::net::SocketAddr = format!("127.0.0.1:{broker_port}").parse().unwrap();
    let id = super::layout(client(1), TOPIC).await.expect("the topic").0;
    let follower = (1..=3).find(|n| *n != leader).unwrap();
    let mut plain = TcpStream::connect(client(leader)).await.unwrap();
    let r: FetchResponse = common::call(&mut plain, 1, 14, 1, &replica_fetch(follower, id)).await;
    assert_eq!(r.error_code, 31, "CLUSTER_AUTHORIZATION_FAILED on the clients' listener");
    let mut peer = tls(&ca, Some(root.path().join(format!("node-{follower}"))), broker_addr).await.expect("a node's certificate is taken");
    let r: FetchResponse = common::call(&mut peer, 1, 14, 1, &replica_fetch(follower, id)).await;
    assert_eq!(r.error_code, 0);
    let p = &r.responses[0].partitions[0];
    assert_eq!(p.error_code, 0);
    assert!(p.records.as_ref().is_some_and(|b| !b.is_empty()), "the follower gets the records over TLS");

    // No certificate, or one another CA signed (naming a node): refused.
    for (what, cert) in [("no certificate", None), ("another CA's certificate", Some(root.path().join("rogue")))] {
        let refused = match tls(&ca, cert, broker_addr).await {
            None => true,
            Some(mut s) => !answers(&mut s).await,
        };
        assert!(refused, "the inter-broker listener served a client with {what}");
    }
    // The clients' listener is plaintext, as configured.
    assert!(answers(&mut TcpStream::connect(client(1)).await.unwrap()).await);
}
