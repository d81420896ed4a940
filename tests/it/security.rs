//! Listeners, TLS and SASL through real clients (librdkafka), and the SASL
//! exchange under hostile input on raw connections.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use canopy::auth::scram::{client::ScramClient, Mechanism};
use kafka_protocol::messages::*;
use kafka_protocol::protocol::StrBytes;
use rdkafka::client::ClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::Message;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::common;

/// Certificates for a test: a CA, a server certificate for 127.0.0.1 and
/// two client certificates, written as PEM files into `dir`.
struct Pki {
    ca: String,
    server_cert: String,
    server_key: String,
}

fn client_cert(dir: &Path, name: &str, ca: &rcgen::Certificate, ca_key: &rcgen::KeyPair) {
    let key = rcgen::KeyPair::generate().unwrap();
    let mut p = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    // Most general first, as X.509 names go: Kafka's name for it is
    // `CN=<name>,O=canopy`.
    p.distinguished_name = rcgen::DistinguishedName::new();
    p.distinguished_name.push(rcgen::DnType::OrganizationName, "canopy");
    p.distinguished_name.push(rcgen::DnType::CommonName, name);
    p.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ClientAuth];
    let cert = p.signed_by(&key, ca, ca_key).unwrap();
    std::fs::write(dir.join(format!("{name}.pem")), cert.pem()).unwrap();
    std::fs::write(dir.join(format!("{name}.key")), key.serialize_pem()).unwrap();
}

fn pki(dir: &Path) -> Pki {
    let ca_key = rcgen::KeyPair::generate().unwrap();
    let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    ca_params.distinguished_name.push(rcgen::DnType::CommonName, "canopy test CA");
    let ca = ca_params.self_signed(&ca_key).unwrap();
    let key = rcgen::KeyPair::generate().unwrap();
    let mut p = rcgen::CertificateParams::new(vec!["127.0.0.1".to_owned(), "localhost".to_owned()]).unwrap();
    p.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth];
    let server = p.signed_by(&key, &ca, &ca_key).unwrap();
    let out = Pki { ca: dir.join("ca.pem").display().to_string(), server_cert: dir.join("server.pem").display().to_string(), server_key: dir.join("server.key").display().to_string() };
    std::fs::write(&out.ca, ca.pem()).unwrap();
    std::fs::write(&out.server_cert, server.pem()).unwrap();
    std::fs::write(&out.server_key, key.serialize_pem()).unwrap();
    client_cert(dir, "writer", &ca, &ca_key);
    client_cert(dir, "admin", &ca, &ca_key);
    out
}

/// Collects the errors librdkafka reports.
#[derive(Clone, Default)]
struct Errors(Arc<Mutex<Vec<String>>>);

impl ClientContext for Errors {
    fn error(&self, error: rdkafka::error::KafkaError, reason: &str) {
        self.0.lock().unwrap().push(format!("{error}: {reason}"));
    }
}
impl ConsumerContext for Errors {}

impl Errors {
    /// Waits until an error containing `what` is reported.
    fn wait_for(&self, consumer: &BaseConsumer<Errors>, what: &str) -> String {
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(e) = self.0.lock().unwrap().iter().find(|e| e.contains(what)) {
                return e.clone();
            }
            assert!(std::time::Instant::now() < deadline, "no error with {what:?}; saw {:?}", self.0.lock().unwrap());
            // Errors reach the context as events, served by poll.
            let _ = consumer.poll(Duration::from_millis(200));
        }
    }
}

pub(super) fn listener(broker: &canopy::server::Running, name: &str) -> SocketAddr {
    broker.kafka_listeners.iter().find(|(n, _)| n == name).unwrap_or_else(|| panic!("listener {name}")).1
}

pub(super) fn sasl(addr: SocketAddr, protocol: &str, mechanism: &str, user: &str, password: &str, ca: &str) -> ClientConfig {
    let mut c = common::client(addr);
    c.set("security.protocol", protocol).set("sasl.mechanisms", mechanism).set("sasl.username", user).set("sasl.password", password);
    if protocol.ends_with("SSL") {
        c.set("ssl.ca.location", ca);
    }
    c
}

/// Produces `n` records to `topic` and reads them back in a consumer
/// group that commits, all with `cfg`'s security settings. Blocking.
fn produce_consume_commit(cfg: &ClientConfig, topic: &str, n: usize) {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let mut p = cfg.clone();
    p.set("acks", "all").set("linger.ms", "5").set("message.timeout.ms", "30000");
    let producer: FutureProducer = p.create().unwrap();
    rt.block_on(async {
        for i in 0..n {
            let v = format!("{topic}-{i}");
            producer.send(FutureRecord::<(), _>::to(topic).payload(&v), Duration::from_secs(30)).await.unwrap_or_else(|(e, _)| panic!("produce to {topic}: {e}"));
        }
    });
    let mut c = cfg.clone();
    c.set("group.id", format!("{topic}-group")).set("enable.auto.commit", "false").set("auto.offset.reset", "earliest").set("fetch.wait.max.ms", "100");
    let consumer: BaseConsumer = c.create().unwrap();
    consumer.subscribe(&[topic]).unwrap();
    let mut got = Vec::new();
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while got.len() < n {
        assert!(std::time::Instant::now() < deadline, "read {} of {n} from {topic}", got.len());
        if let Some(m) = consumer.poll(Duration::from_millis(100)) {
            let m = m.unwrap();
            got.push(String::from_utf8(m.payload().unwrap().to_vec()).unwrap());
        }
    }
    assert_eq!(got, (0..n).map(|i| format!("{topic}-{i}")).collect::<Vec<_>>());
    consumer.commit_consumer_state(rdkafka::consumer::CommitMode::Sync).unwrap();
    let committed = consumer.committed(Duration::from_secs(10)).unwrap();
    assert_eq!(committed.elements()[0].offset(), rdkafka::Offset::Offset(n as i64), "{topic}: committed");
}

pub(super) async fn metrics(broker: &canopy::server::Running) -> String {
    let mut s = TcpStream::connect(broker.admin_addr).await.unwrap();
    s.write_all(b"GET /metrics HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n").await.unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).await.unwrap();
    out
}

pub(super) fn metric(text: &str, name_and_labels: &str) -> f64 {
    text.lines().find(|l| l.starts_with(name_and_labels)).and_then(|l| l.rsplit(' ').next()).and_then(|v| v.parse().ok()).unwrap_or(0.0)
}

fn sasl_args(dir: &Path, pki: &Pki) -> canopy::config::ServeArgs {
    let mut args = common::args(&dir.join("data"));
    args.listeners = Some("PLAINTEXT://127.0.0.1:0,SASL_PLAINTEXT://127.0.0.1:0,SASL_SSL://127.0.0.1:0".into());
    args.ssl_cert_file = Some(pki.server_cert.clone());
    args.ssl_key_file = Some(pki.server_key.clone());
    args.super_users = Some("User:admin".into());
    args.connection_failed_authentication_delay_ms = Some(10);
    args
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn librdkafka_produces_consumes_and_commits_over_sasl_plain_and_scram() {
    let dir = tempfile::tempdir().unwrap();
    let pki = pki(dir.path());
    canopy::auth::users::set_password(&dir.path().join("data"), "alice", b"alice-secret", &Mechanism::ALL, 4096).unwrap();
    let broker = common::start(sasl_args(dir.path(), &pki)).await;
    let (plain, sasl_ssl) = (listener(&broker, "SASL_PLAINTEXT"), listener(&broker, "SASL_SSL"));
    let ca = pki.ca.clone();
    tokio::task::spawn_blocking(move || {
        for (i, (addr, proto, mech)) in [
            (plain, "SASL_PLAINTEXT", "PLAIN"),
            (plain, "SASL_PLAINTEXT", "SCRAM-SHA-256"),
            (plain, "SASL_PLAINTEXT", "SCRAM-SHA-512"),
            (sasl_ssl, "SASL_SSL", "SCRAM-SHA-512"),
            (sasl_ssl, "SASL_SSL", "PLAIN"),
        ]
        .into_iter()
        .enumerate()
        {
            produce_consume_commit(&sasl(addr, proto, mech, "alice", "alice-secret", &ca), &format!("sasl.t{i}"), 20);
        }
    })
    .await
    .unwrap();
    // Each listener advertises itself: a client that came in through a
    // SASL listener is sent back to it, not to the plaintext one.
    let mut s = TcpStream::connect(plain).await.unwrap();
    assert_eq!(handshake(&mut s, "PLAIN", 1).await.error_code, 0);
    assert_eq!(authenticate(&mut s, b"\0alice\0alice-secret").await.error_code, 0);
    assert_eq!(metadata_port(&mut s).await, plain.port() as i32);
    let mut p = TcpStream::connect(listener(&broker, "PLAINTEXT")).await.unwrap();
    assert_eq!(metadata_port(&mut p).await, listener(&broker, "PLAINTEXT").port() as i32);
    let m = metrics(&broker).await;
    assert!(metric(&m, r#"canopy_kafka_authentications_total{listener="SASL_SSL",mechanism="SCRAM-SHA-512",outcome="success"}"#) >= 2.0, "{m}");
    assert!(metric(&m, r#"canopy_kafka_authentications_total{listener="SASL_PLAINTEXT",mechanism="PLAIN",outcome="success"}"#) >= 2.0);
    assert_eq!(metric(&m, r#"canopy_kafka_authentications_total{listener="SASL_PLAINTEXT",mechanism="PLAIN",outcome="failure"}"#), 0.0);
    broker.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_passwords_unknown_users_and_mechanisms_fail_as_librdkafka_expects() {
    let dir = tempfile::tempdir().unwrap();
    let pki = pki(dir.path());
    canopy::auth::users::set_password(&dir.path().join("data"), "alice", b"alice-secret", &Mechanism::ALL, 4096).unwrap();
    let mut args = sasl_args(dir.path(), &pki);
    args.sasl_enabled_mechanisms = Some("SCRAM-SHA-512,PLAIN".into());
    let broker = common::start(args).await;
    let addr = listener(&broker, "SASL_PLAINTEXT");
    let seen = tokio::task::spawn_blocking(move || {
        let mut seen = Vec::new();
        for (mech, user, password, expect) in [
            ("PLAIN", "alice", "wrong", "Invalid username or password"),
            ("PLAIN", "mallory", "alice-secret", "Invalid username or password"),
            ("SCRAM-SHA-512", "alice", "wrong", "invalid credentials with SASL mechanism SCRAM-SHA-512"),
            ("SCRAM-SHA-512", "mallory", "x", "invalid credentials with SASL mechanism SCRAM-SHA-512"),
            // Not offered on this broker: librdkafka lists what is.
            ("SCRAM-SHA-256", "alice", "alice-secret", "SCRAM-SHA-512,PLAIN"),
        ] {
            let errors = Errors::default();
            let consumer: BaseConsumer<Errors> = sasl(addr, "SASL_PLAINTEXT", mech, user, password, "").create_with_context(errors.clone()).unwrap();
            seen.push(errors.wait_for(&consumer, expect));
            // Nothing was served: the client never learned of a topic.
            assert!(consumer.fetch_metadata(None, Duration::from_millis(200)).is_err());
        }
        // The broker still serves a client with the right password.
        produce_consume_commit(&sasl(addr, "SASL_PLAINTEXT", "SCRAM-SHA-512", "alice", "alice-secret", ""), "after.failures", 5);
        seen
    })
    .await
    .unwrap();
    assert!(seen.iter().all(|e| e.contains("Authentication") || e.contains("authentication") || e.contains("mechanism")), "{seen:?}");
    let m = metrics(&broker).await;
    assert!(metric(&m, r#"canopy_kafka_authentications_total{listener="SASL_PLAINTEXT",mechanism="PLAIN",outcome="failure"}"#) >= 2.0, "{m}");
    assert!(metric(&m, r#"canopy_kafka_connections_closed_total{reason="authentication_failed"}"#) >= 4.0);
    // No password reaches the metrics.
    assert!(!m.contains("alice-secret") && !m.contains("wrong"));
    broker.shutdown().await;
}

/// One SSL listener that requires client certificates of the test CA.
fn mtls_args(dir: &Path, pki: &Pki) -> canopy::config::ServeArgs {
    let mut args = common::args(&dir.join("data"));
    args.listeners = Some("SSL://127.0.0.1:0".into());
    args.ssl_cert_file = Some(pki.server_cert.clone());
    args.ssl_key_file = Some(pki.server_key.clone());
    args.ssl_client_auth = Some("required".into());
    args.ssl_ca_file = Some(pki.ca.clone());
    args
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_certificates_name_the_principal_and_are_required_when_configured() {
    let dir = tempfile::tempdir().unwrap();
    let pki = pki(dir.path());
    let mut args = mtls_args(dir.path(), &pki);
    args.super_users = Some("User:CN=admin,O=canopy".into());
    let broker = common::start(args).await;
    let addr = broker.kafka_addr;
    let d = dir.path().to_path_buf();
    let ca = pki.ca.clone();
    tokio::task::spawn_blocking(move || {
        let mut c = common::client(addr);
        c.set("security.protocol", "SSL").set("ssl.ca.location", &ca);
        c.set("ssl.certificate.location", d.join("writer.pem").display().to_string()).set("ssl.key.location", d.join("writer.key").display().to_string());
        produce_consume_commit(&c, "mtls.t", 20);
        // Without a certificate the handshake fails.
        let errors = Errors::default();
        let mut bare = common::client(addr);
        bare.set("security.protocol", "SSL").set("ssl.ca.location", &ca);
        let consumer: BaseConsumer<Errors> = bare.create_with_context(errors.clone()).unwrap();
        errors.wait_for(&consumer, "SSL");
    })
    .await
    .unwrap();
    // The certificate's subject is the principal: the admin certificate is
    // a super user and may describe credentials; the writer's may not.
    for (name, allowed) in [("admin", true), ("writer", false)] {
        let mut tls = tls_client(&pki, Some(dir.path().join(name)), addr).await;
        let r: DescribeUserScramCredentialsResponse = common::call(&mut tls, 50, 0, 1, &DescribeUserScramCredentialsRequest::default()).await;
        assert_eq!(r.error_code == 0, allowed, "{name}: {r:?}");
    }
    assert!(metric(&metrics(&broker).await, r#"canopy_kafka_connections_closed_total{reason="tls_handshake"}"#) >= 1.0);
    broker.shutdown().await;
}

/// `ssl_principal_mapping_rules` turn a certificate's subject into the
/// principal name; a subject no rule maps is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn principal_mapping_rules_name_certificate_principals() {
    let dir = tempfile::tempdir().unwrap();
    let pki = pki(dir.path());
    let mut args = mtls_args(dir.path(), &pki);
    // admin maps to ADMIN (a super user by that name); writer matches no rule.
    args.ssl_principal_mapping_rules = Some(r"RULE:^CN=(admin),O=canopy$/$1/U,RULE:^CN=([^,]*),O=elsewhere$/$1/".into());
    args.super_users = Some("User:ADMIN".into());
    let broker = common::start(args).await;
    let addr = broker.kafka_addr;
    let mut tls = tls_client(&pki, Some(dir.path().join("admin")), addr).await;
    let r: DescribeUserScramCredentialsResponse = common::call(&mut tls, 50, 0, 1, &DescribeUserScramCredentialsRequest::default()).await;
    assert_eq!(r.error_code, 0, "CN=admin,O=canopy is User:ADMIN, a super user: {r:?}");
    // librdkafka with the writer's certificate gets no service.
    let (d, ca) = (dir.path().to_path_buf(), pki.ca.clone());
    tokio::task::spawn_blocking(move || {
        let errors = Errors::default();
        let mut c = common::client(addr);
        c.set("security.protocol", "SSL").set("ssl.ca.location", &ca);
        c.set("ssl.certificate.location", d.join("writer.pem").display().to_string()).set("ssl.key.location", d.join("writer.key").display().to_string());
        let consumer: BaseConsumer<Errors> = c.create_with_context(errors.clone()).unwrap();
        assert!(consumer.fetch_metadata(None, Duration::from_secs(3)).is_err(), "an unmapped subject is not served");
    })
    .await
    .unwrap();
    assert!(metric(&metrics(&broker).await, r#"canopy_kafka_connections_closed_total{reason="authentication_failed"}"#) >= 1.0);
    broker.shutdown().await;
}

/// A TLS connection trusting the test CA, presenting `<cert>.pem` /
/// `<cert>.key` when given.
async fn tls_client(pki: &Pki, cert: Option<std::path::PathBuf>, addr: SocketAddr) -> tokio_rustls::client::TlsStream<TcpStream> {
    try_tls_client(pki, cert, addr).await.unwrap()
}

// ---- the SASL exchange on raw connections ---------------------------------

pub(super) async fn handshake(sock: &mut TcpStream, mechanism: &str, version: i16) -> SaslHandshakeResponse {
    common::call(sock, 17, version, 1, &SaslHandshakeRequest::default().with_mechanism(StrBytes::from_string(mechanism.into()))).await
}

pub(super) async fn authenticate(sock: &mut TcpStream, token: &[u8]) -> SaslAuthenticateResponse {
    common::call(sock, 36, 2, 2, &SaslAuthenticateRequest::default().with_auth_bytes(bytes::Bytes::copy_from_slice(token))).await
}

/// The connection was closed by the broker (after whatever it answered).
async fn closed(sock: &mut TcpStream) -> bool {
    let mut b = [0u8; 64];
    matches!(tokio::time::timeout(Duration::from_secs(10), sock.read(&mut b)).await, Ok(Ok(0)) | Ok(Err(_)))
}

async fn metadata_port(sock: &mut TcpStream) -> i32 {
    let r: MetadataResponse = common::call(sock, 3, 12, 9, &MetadataRequest::default().with_topics(Some(vec![]))).await;
    r.brokers[0].port
}

async fn metadata_works(sock: &mut TcpStream) -> bool {
    let r: MetadataResponse = common::call(sock, 3, 12, 9, &MetadataRequest::default().with_topics(Some(vec![]))).await;
    r.brokers.len() == 1
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sasl_exchange_refuses_hostile_and_out_of_turn_input() {
    let dir = tempfile::tempdir().unwrap();
    let pki = pki(dir.path());
    canopy::auth::users::set_password(&dir.path().join("data"), "alice", b"pw", &Mechanism::ALL, 4096).unwrap();
    let mut args = sasl_args(dir.path(), &pki);
    args.sasl_max_receive_bytes = Some(8192);
    let broker = common::start(args).await;
    let addr = listener(&broker, "SASL_PLAINTEXT");
    let connect = || TcpStream::connect(addr);

    // A request before authentication closes the connection unanswered.
    let mut s = connect().await.unwrap();
    s.write_all(&common::request_frame(3, 12, 1, &common::encode(&MetadataRequest::default().with_topics(Some(vec![])), 12))).await.unwrap();
    assert!(closed(&mut s).await, "metadata before authentication");

    // ApiVersions is served before authentication, and lists the SASL APIs.
    let mut s = connect().await.unwrap();
    let v: ApiVersionsResponse = common::call(&mut s, 18, 3, 1, &ApiVersionsRequest::default().with_client_software_name(StrBytes::from_static_str("t")).with_client_software_version(StrBytes::from_static_str("1"))).await;
    assert!(v.api_keys.iter().any(|k| k.api_key == 36 && k.max_version == 2) && v.api_keys.iter().any(|k| k.api_key == 17));

    // A frame over sasl_max_receive_bytes before authentication closes it.
    let mut big = vec![0u8; 8];
    big[..4].copy_from_slice(&(9000i32).to_be_bytes());
    s.write_all(&big).await.unwrap();
    assert!(closed(&mut s).await, "oversized frame before authentication");

    // An unsupported mechanism: the offered ones, then the connection ends.
    let mut s = connect().await.unwrap();
    let h = handshake(&mut s, "GSSAPI", 1).await;
    assert_eq!(h.error_code, 33);
    assert_eq!(h.mechanisms.iter().map(|m| m.to_string()).collect::<Vec<_>>(), ["SCRAM-SHA-512", "SCRAM-SHA-256", "PLAIN"]);
    assert!(closed(&mut s).await);

    // SaslAuthenticate before any handshake.
    let mut s = connect().await.unwrap();
    let a = authenticate(&mut s, b"\0alice\0pw").await;
    assert_eq!(a.error_code, 34, "ILLEGAL_SASL_STATE");
    assert!(closed(&mut s).await);

    // Malformed and truncated PLAIN tokens.
    for token in [&b""[..], b"alice", b"\0alice", b"\0alice\0", b"\0\0pw"] {
        let mut s = connect().await.unwrap();
        assert_eq!(handshake(&mut s, "PLAIN", 1).await.error_code, 0);
        let a = authenticate(&mut s, token).await;
        assert_eq!(a.error_code, 58, "{token:?}");
        assert!(a.error_message.unwrap().contains("Authentication failed"));
        assert!(closed(&mut s).await);
    }

    // SCRAM: a tampered proof, a tampered nonce, and a replayed final
    // message all fail; the honest exchange passes and proves the server.
    let scram = |tamper: fn(String) -> String| async move {
        let mut s = TcpStream::connect(addr).await.unwrap();
        assert_eq!(handshake(&mut s, "SCRAM-SHA-256", 1).await.error_code, 0);
        let mut c = ScramClient::new(Mechanism::Sha256, "alice", b"pw");
        let first = authenticate(&mut s, &c.first()).await;
        assert_eq!(first.error_code, 0);
        let last = c.last(&first.auth_bytes).unwrap();
        let sent = tamper(String::from_utf8(last).unwrap());
        let done = authenticate(&mut s, sent.as_bytes()).await;
        (s, c, done, sent)
    };
    let (mut s, c, done, honest_final) = scram(|m| m).await;
    assert_eq!(done.error_code, 0);
    assert!(c.verify(&done.auth_bytes), "the server's signature");
    assert!(metadata_works(&mut s).await);
    let (mut s, _, done, _) = scram(|m| {
        let (head, proof) = m.rsplit_once(",p=").unwrap();
        let mut p = proof.as_bytes().to_vec();
        p[0] = if p[0] == b'A' { b'B' } else { b'A' };
        format!("{head},p={}", String::from_utf8(p).unwrap())
    })
    .await;
    assert_eq!(done.error_code, 58);
    assert!(closed(&mut s).await);
    let (mut s, _, done, _) = scram(|m| m.replacen(",r=", ",r=X", 1)).await;
    assert_eq!(done.error_code, 58);
    assert!(closed(&mut s).await);
    // The honest final message replayed on a new exchange.
    let mut s = connect().await.unwrap();
    assert_eq!(handshake(&mut s, "SCRAM-SHA-256", 1).await.error_code, 0);
    let c = ScramClient::new(Mechanism::Sha256, "alice", b"pw");
    assert_eq!(authenticate(&mut s, &c.first()).await.error_code, 0);
    assert_eq!(authenticate(&mut s, honest_final.as_bytes()).await.error_code, 58, "replay");
    assert!(closed(&mut s).await);

    // A token made of garbage and an oversized SCRAM message.
    for token in [vec![0xffu8; 40], format!("n,,n=alice,r={}", "a".repeat(5000)).into_bytes()] {
        let mut s = connect().await.unwrap();
        assert_eq!(handshake(&mut s, "SCRAM-SHA-512", 1).await.error_code, 0);
        assert_eq!(authenticate(&mut s, &token).await.error_code, 58);
        assert!(closed(&mut s).await);
    }

    // A second handshake in one exchange is out of turn.
    let mut s = connect().await.unwrap();
    assert_eq!(handshake(&mut s, "PLAIN", 1).await.error_code, 0);
    assert_eq!(handshake(&mut s, "PLAIN", 1).await.error_code, 34);
    assert!(closed(&mut s).await);

    // Version 0 of the handshake: the token follows raw, without a header,
    // and so does the answer.
    let mut s = connect().await.unwrap();
    assert_eq!(handshake(&mut s, "PLAIN", 0).await.error_code, 0);
    let token = b"\0alice\0pw";
    let mut frame = (token.len() as i32).to_be_bytes().to_vec();
    frame.extend_from_slice(token);
    s.write_all(&frame).await.unwrap();
    let mut len = [0u8; 4];
    s.read_exact(&mut len).await.unwrap();
    assert_eq!(i32::from_be_bytes(len), 0, "PLAIN answers an empty token");
    assert!(metadata_works(&mut s).await);

    // After all that, the plaintext listener and honest SASL clients are served.
    let mut p = TcpStream::connect(listener(&broker, "PLAINTEXT")).await.unwrap();
    assert!(metadata_works(&mut p).await);
    // SASL requests on a plaintext listener are refused, not fatal.
    assert_eq!(handshake(&mut p, "PLAIN", 1).await.error_code, 34);
    assert_eq!(authenticate(&mut p, b"\0alice\0pw").await.error_code, 34);
    assert!(metadata_works(&mut p).await);
    broker.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_expire_and_re_authenticate_as_the_same_principal() {
    let dir = tempfile::tempdir().unwrap();
    let pki = pki(dir.path());
    let data = dir.path().join("data");
    canopy::auth::users::set_password(&data, "alice", b"pw", &Mechanism::ALL, 4096).unwrap();
    canopy::auth::users::set_password(&data, "bob", b"bobpw", &Mechanism::ALL, 4096).unwrap();
    let mut args = sasl_args(dir.path(), &pki);
    args.connections_max_reauth_ms = Some(1500);
    let broker = common::start(args).await;
    let addr = listener(&broker, "SASL_PLAINTEXT");

    let login = |user: &'static str, password: &'static [u8]| async move {
        let mut s = TcpStream::connect(addr).await.unwrap();
        assert_eq!(handshake(&mut s, "PLAIN", 1).await.error_code, 0);
        let mut t = b"\0".to_vec();
        t.extend_from_slice(user.as_bytes());
        t.push(0);
        t.extend_from_slice(password);
        let a = authenticate(&mut s, &t).await;
        assert_eq!((a.error_code, a.session_lifetime_ms), (0, 1500));
        s
    };
    // An expired session may only re-authenticate.
    let mut s = login("alice", b"pw").await;
    assert!(metadata_works(&mut s).await);
    tokio::time::sleep(Duration::from_millis(1700)).await;
    s.write_all(&common::request_frame(3, 12, 1, &common::encode(&MetadataRequest::default().with_topics(Some(vec![])), 12))).await.unwrap();
    assert!(closed(&mut s).await, "a request after the session expired");

    // Re-authenticating in time keeps the connection.
    let mut s = login("alice", b"pw").await;
    tokio::time::sleep(Duration::from_millis(1700)).await;
    assert_eq!(handshake(&mut s, "PLAIN", 1).await.error_code, 0);
    assert_eq!(authenticate(&mut s, b"\0alice\0pw").await.error_code, 0);
    assert!(metadata_works(&mut s).await);
    // With another mechanism, or as another user, it does not.
    assert_eq!(handshake(&mut s, "SCRAM-SHA-512", 1).await.error_code, 34);
    let mut s = login("alice", b"pw").await;
    assert_eq!(handshake(&mut s, "PLAIN", 1).await.error_code, 0);
    let a = authenticate(&mut s, b"\0bob\0bobpw").await;
    assert_eq!(a.error_code, 58);
    assert!(a.error_message.unwrap().contains("Cannot change principals"));
    assert!(closed(&mut s).await);

    // librdkafka re-authenticates on its own (KIP-368) and keeps producing
    // and consuming across several session lifetimes.
    let cfg = sasl(addr, "SASL_PLAINTEXT", "SCRAM-SHA-512", "alice", "pw", "");
    tokio::task::spawn_blocking(move || {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let mut p = cfg.clone();
        p.set("acks", "all").set("linger.ms", "0");
        let producer: FutureProducer = p.create().unwrap();
        rt.block_on(async {
            for i in 0..25 {
                producer.send(FutureRecord::<(), _>::to("reauth.t").payload(&format!("{i}")), Duration::from_secs(30)).await.unwrap_or_else(|(e, _)| panic!("{e}"));
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        });
    })
    .await
    .unwrap();
    let m = metrics(&broker).await;
    assert!(metric(&m, r#"canopy_kafka_authentications_total{listener="SASL_PLAINTEXT",mechanism="SCRAM-SHA-512",outcome="reauthentication"}"#) >= 1.0, "{m}");
    broker.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scram_credentials_are_managed_through_the_admin_api() {
    let dir = tempfile::tempdir().unwrap();
    let pki = pki(dir.path());
    let data = dir.path().join("data");
    canopy::auth::users::set_password(&data, "admin", b"admin-pw", &Mechanism::ALL, 4096).unwrap();
    let broker = common::start(sasl_args(dir.path(), &pki)).await;
    let addr = listener(&broker, "SASL_PLAINTEXT");
    let login = |user: &'static str, password: &'static str| async move {
        let mut s = TcpStream::connect(addr).await.unwrap();
        assert_eq!(handshake(&mut s, "PLAIN", 1).await.error_code, 0);
        let a = authenticate(&mut s, format!("\0{user}\0{password}").as_bytes()).await;
        (s, a.error_code)
    };
    let upsert = |user: &str, mech: Mechanism, password: &[u8], iterations: i32| {
        use alter_user_scram_credentials_request::ScramCredentialUpsertion;
        let salt = b"0123456789abcdef".to_vec();
        let salted = mech.salted_password(password, &salt, iterations.max(1) as u32);
        ScramCredentialUpsertion::default()
            .with_name(StrBytes::from_string(user.into()))
            .with_mechanism(mech.kafka_type())
            .with_iterations(iterations)
            .with_salt(salt.into())
            .with_salted_password(salted.into())
    };
    let (mut admin, code) = login("admin", "admin-pw").await;
    assert_eq!(code, 0);
    let r: AlterUserScramCredentialsResponse = common::call(
        &mut admin,
        51,
        0,
        3,
        &AlterUserScramCredentialsRequest::default().with_upsertions(vec![
            upsert("carol", Mechanism::Sha512, b"c1", 4096),
            upsert("dave", Mechanism::Sha256, b"d1", 100),
            upsert("erin", Mechanism::Sha256, b"e1", 4096),
            upsert("erin", Mechanism::Sha256, b"e2", 4096),
        ]),
    )
    .await;
    let codes: Vec<(String, i16)> = r.results.iter().map(|r| (r.user.to_string(), r.error_code)).collect();
    // dave's iterations are under Kafka's 4096: UNACCEPTABLE_CREDENTIAL;
    // erin twice for one mechanism: DUPLICATE_RESOURCE, and nothing of hers applies.
    assert_eq!(codes, [("carol".to_owned(), 0), ("dave".to_owned(), 93), ("erin".to_owned(), 92)]);
    assert_eq!(login("carol", "c1").await.1, 0);
    assert_eq!(login("dave", "d1").await.1, 58);
    assert_eq!(login("erin", "e1").await.1, 58);
    let d: DescribeUserScramCredentialsResponse = common::call(&mut admin, 50, 0, 4, &DescribeUserScramCredentialsRequest::default()).await;
    let described: Vec<(String, Vec<(i8, i32)>)> = d.results.iter().map(|r| (r.user.to_string(), r.credential_infos.iter().map(|c| (c.mechanism, c.iterations)).collect())).collect();
    assert_eq!(described, [("admin".to_owned(), vec![(1, 4096), (2, 4096)]), ("carol".to_owned(), vec![(2, 4096)])]);
    // Rotation: the old password stops working, the new one works.
    let r: AlterUserScramCredentialsResponse = common::call(&mut admin, 51, 0, 5, &AlterUserScramCredentialsRequest::default().with_upsertions(vec![upsert("carol", Mechanism::Sha512, b"c2", 8192)])).await;
    assert_eq!(r.results[0].error_code, 0);
    assert_eq!(login("carol", "c1").await.1, 58);
    assert_eq!(login("carol", "c2").await.1, 0);
    // A principal that is not a super user changes nothing.
    let (mut carol, _) = login("carol", "c2").await;
    let r: AlterUserScramCredentialsResponse = common::call(&mut carol, 51, 0, 6, &AlterUserScramCredentialsRequest::default().with_upsertions(vec![upsert("admin", Mechanism::Sha512, b"owned", 4096)])).await;
    assert_eq!(r.results[0].error_code, 31, "CLUSTER_AUTHORIZATION_FAILED");
    let d: DescribeUserScramCredentialsResponse = common::call(&mut carol, 50, 0, 7, &DescribeUserScramCredentialsRequest::default()).await;
    assert_eq!(d.error_code, 31);
    assert_eq!(login("admin", "admin-pw").await.1, 0, "the admin password is unchanged");
    // Deleting what does not exist, and describing an unknown user or one twice.
    use alter_user_scram_credentials_request::ScramCredentialDeletion;
    let r: AlterUserScramCredentialsResponse = common::call(
        &mut admin,
        51,
        0,
        8,
        &AlterUserScramCredentialsRequest::default().with_deletions(vec![ScramCredentialDeletion::default().with_name(StrBytes::from_static_str("carol")).with_mechanism(1), ScramCredentialDeletion::default().with_name(StrBytes::from_static_str("zed")).with_mechanism(9)]),
    )
    .await;
    assert_eq!(r.results.iter().map(|r| r.error_code).collect::<Vec<_>>(), [91, 33], "RESOURCE_NOT_FOUND, UNSUPPORTED_SASL_MECHANISM");
    use describe_user_scram_credentials_request::UserName;
    let name = |n: &'static str| UserName::default().with_name(StrBytes::from_static_str(n));
    let d: DescribeUserScramCredentialsResponse = common::call(&mut admin, 50, 0, 9, &DescribeUserScramCredentialsRequest::default().with_users(Some(vec![name("nobody"), name("carol"), name("carol")]))).await;
    assert_eq!(d.results.iter().map(|r| (r.user.to_string(), r.error_code)).collect::<Vec<_>>(), [("nobody".to_owned(), 91), ("carol".to_owned(), 92)]);
    // Credentials survive a restart.
    broker.shutdown().await;
    let broker = common::start(sasl_args(dir.path(), &pki)).await;
    let addr = listener(&broker, "SASL_PLAINTEXT");
    let mut s = TcpStream::connect(addr).await.unwrap();
    assert_eq!(handshake(&mut s, "PLAIN", 1).await.error_code, 0);
    assert_eq!(authenticate(&mut s, b"\0carol\0c2").await.error_code, 0);
    broker.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_user_subcommand_makes_credentials_that_sasl_accepts() {
    let dir = tempfile::tempdir().unwrap();
    let pki = pki(dir.path());
    let data = dir.path().join("data");
    std::fs::write(dir.path().join("pw"), "from-the-cli\n").unwrap();
    let bin = env!("CARGO_BIN_EXE_canopy");
    let run = |extra: &[&str]| {
        std::process::Command::new(bin).args(["user", "--data-dir"]).arg(&data).args(["--name", "ops", "--password-file"]).arg(dir.path().join("pw")).args(extra).output().unwrap()
    };
    let out = run(&["--mechanisms", "SCRAM-SHA-512"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let out = run(&["--iterations", "100"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("between 4096 and 16384"));
    let broker = common::start(sasl_args(dir.path(), &pki)).await;
    // The running broker holds the catalog: the subcommand says so.
    let out = run(&[]);
    assert_eq!(out.status.code(), Some(2), "a running broker's catalog is not written");
    let addr = listener(&broker, "SASL_PLAINTEXT");
    tokio::task::spawn_blocking(move || produce_consume_commit(&sasl(addr, "SASL_PLAINTEXT", "SCRAM-SHA-512", "ops", "from-the-cli", ""), "cli.user", 3)).await.unwrap();
    broker.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replaced_certificate_is_served_to_new_connections_without_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let first = pki(dir.path());
    let mut args = common::args(&dir.path().join("data"));
    args.listeners = Some("SSL://127.0.0.1:0".into());
    args.ssl_cert_file = Some(first.server_cert.clone());
    args.ssl_key_file = Some(first.server_key.clone());
    args.ssl_reload_check_ms = Some(100);
    let broker = common::start(args).await;
    let addr = broker.kafka_addr;
    let mut old = tls_client(&first, None, addr).await;
    // A new CA and certificate, written over the same files (the key
    // first: a moment with a new key and the old certificate must not
    // replace the working configuration).
    let second_dir = dir.path().join("second");
    std::fs::create_dir(&second_dir).unwrap();
    let second = pki(&second_dir);
    std::fs::copy(&second.server_key, &first.server_key).unwrap();
    tokio::time::sleep(Duration::from_millis(400)).await;
    let still = tls_client(&first, None, addr).await;
    drop(still);
    std::fs::copy(&second.server_cert, &first.server_cert).unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let trusted_second = Pki { ca: second.ca.clone(), server_cert: String::new(), server_key: String::new() };
        if let Ok(mut s) = try_tls_client(&trusted_second, None, addr).await {
            assert!(metadata_works_tls(&mut s).await);
            break;
        }
        assert!(std::time::Instant::now() < deadline, "the new certificate was not served");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Clients of the old CA no longer connect; the open connection goes on.
    assert!(try_tls_client(&first, None, addr).await.is_err());
    assert!(metadata_works_tls(&mut old).await);
    broker.shutdown().await;
}

async fn try_tls_client(pki: &Pki, cert: Option<std::path::PathBuf>, addr: SocketAddr) -> std::io::Result<tokio_rustls::client::TlsStream<TcpStream>> {
    use rustls_pki_types::pem::PemObject;
    use tokio_rustls::rustls;
    let mut roots = rustls::RootCertStore::empty();
    for c in rustls_pki_types::CertificateDer::pem_file_iter(&pki.ca).unwrap() {
        roots.add(c.unwrap()).unwrap();
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let b = rustls::ClientConfig::builder_with_provider(provider).with_safe_default_protocol_versions().unwrap().with_root_certificates(roots);
    let cfg = match cert {
        Some(c) => {
            let chain = rustls_pki_types::CertificateDer::pem_file_iter(c.with_extension("pem")).unwrap().map(|c| c.unwrap()).collect();
            let key = rustls_pki_types::PrivateKeyDer::from_pem_file(c.with_extension("key")).unwrap();
            b.with_client_auth_cert(chain, key).unwrap()
        }
        None => b.with_no_client_auth(),
    };
    let sock = TcpStream::connect(addr).await?;
    let name = rustls_pki_types::ServerName::try_from("127.0.0.1").unwrap();
    tokio_rustls::TlsConnector::from(Arc::new(cfg)).connect(name, sock).await
}

async fn metadata_works_tls(sock: &mut tokio_rustls::client::TlsStream<TcpStream>) -> bool {
    let r: MetadataResponse = common::call(sock, 3, 12, 9, &MetadataRequest::default().with_topics(Some(vec![]))).await;
    r.brokers.len() == 1
}

/// HTTP Basic on the REST bridge checks the same SCRAM users as SASL
/// PLAIN: a rotated password stops working at once, with no restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rest_basic_passwords_are_the_scram_users_passwords() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    for (u, p) in [("admin", "admin-pw"), ("alice", "alice-pw")] {
        canopy::auth::users::set_password(&data, u, p.as_bytes(), &Mechanism::ALL, 4096).unwrap();
    }
    let mut args = common::args(&data);
    args.listeners = Some("SASL_PLAINTEXT://127.0.0.1:0".into());
    args.super_users = Some("User:admin".into());
    args.rest_require_authentication = Some(true);
    let broker = common::start(args).await;
    let base = format!("http://{}", broker.rest_addr.unwrap());
    let http = reqwest::Client::new();
    let post = |auth: Option<(&str, &str)>| {
        let mut r = http.post(format!("{base}/ingest/rest.scram")).header("content-type", "application/json").body("{\"v\":1}");
        if let Some((u, p)) = auth {
            r = r.basic_auth(u, Some(p));
        }
        async move { r.send().await.unwrap().status().as_u16() }
    };
    assert_eq!(post(Some(("alice", "alice-pw"))).await, 200);
    assert_eq!(post(Some(("alice", "alice-pw"))).await, 200, "again, from the verified cache");
    assert_eq!(post(Some(("alice", "wrong"))).await, 401);
    assert_eq!(post(Some(("mallory", "alice-pw"))).await, 401);
    assert_eq!(post(None).await, 401);

    // The admin rotates alice's password through the Kafka admin API.
    let addr = listener(&broker, "SASL_PLAINTEXT");
    let mut admin = TcpStream::connect(addr).await.unwrap();
    assert_eq!(handshake(&mut admin, "PLAIN", 1).await.error_code, 0);
    assert_eq!(authenticate(&mut admin, b"\0admin\0admin-pw").await.error_code, 0);
    let salt = b"fedcba9876543210".to_vec();
    let upsertion = alter_user_scram_credentials_request::ScramCredentialUpsertion::default()
        .with_name(StrBytes::from_string("alice".into()))
        .with_mechanism(Mechanism::Sha512.kafka_type())
        .with_iterations(4096)
        .with_salt(salt.clone().into())
        .with_salted_password(Mechanism::Sha512.salted_password(b"rotated", &salt, 4096).into());
    let r: AlterUserScramCredentialsResponse = common::call(&mut admin, 51, 0, 3, &AlterUserScramCredentialsRequest::default().with_upsertions(vec![upsertion])).await;
    assert_eq!(r.results[0].error_code, 0, "{r:?}");
    assert_eq!(post(Some(("alice", "alice-pw"))).await, 401, "the old password stops working at once");
    assert_eq!(post(Some(("alice", "rotated"))).await, 200);
    let tp = broker.engine.topic("rest.scram").unwrap();
    let written: i64 = (0..tp.partitions()).filter_map(|p| broker.engine.offsets(&tp.tp(p)).map(|o| o.1)).sum();
    assert_eq!(written, 3, "only the authenticated requests wrote");
    broker.shutdown().await;
}
