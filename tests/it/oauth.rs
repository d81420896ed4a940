//! SASL OAUTHBEARER with librdkafka: tokens signed with a key of the
//! broker's JWKS authenticate as their subject and produce and consume;
//! expired, forged and mis-addressed tokens fail as librdkafka expects and
//! the broker keeps serving; the session ends no later than its token.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::Engine as _;
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use kafka_protocol::messages::*;
use rdkafka::client::OAuthToken;
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext};
use rdkafka::producer::{BaseRecord, Producer, ProducerContext, ThreadedProducer};
use rdkafka::{ClientContext, Message};
use tokio::net::TcpStream;

use super::common;
use super::security::{authenticate, handshake, listener, metric, metrics};

fn now() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs()
}

/// A P-256 signing key and its public half as a JWK named `kid`.
fn es256_key(kid: &str) -> (EncodingKey, serde_json::Value) {
    let kp = rcgen::KeyPair::generate().unwrap();
    let raw = kp.public_key_raw();
    let b64 = |b: &[u8]| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(b);
    let jwk = serde_json::json!({"kty": "EC", "crv": "P-256", "x": b64(&raw[1..33]), "y": b64(&raw[33..65]), "kid": kid, "alg": "ES256"});
    (EncodingKey::from_ec_der(&kp.serialize_der()), jwk)
}

fn token(key: &EncodingKey, kid: &str, sub: &str, aud: &str, exp: u64) -> String {
    let mut h = Header::new(Algorithm::ES256);
    h.kid = Some(kid.into());
    jsonwebtoken::encode(&h, &serde_json::json!({"sub": sub, "aud": aud, "iss": "https://idp.test", "iat": now(), "exp": exp}), key).unwrap()
}

/// Hands librdkafka a fixed token and collects the errors it reports.
#[derive(Clone)]
struct Bearer {
    token: String,
    errors: Arc<Mutex<Vec<String>>>,
}

impl ClientContext for Bearer {
    const ENABLE_REFRESH_OAUTH_TOKEN: bool = true;

    fn generate_oauth_token(&self, _config: Option<&str>) -> Result<OAuthToken, Box<dyn std::error::Error>> {
        Ok(OAuthToken { token: self.token.clone(), principal_name: "ignored-by-the-broker".into(), lifetime_ms: (now() as i64 + 3600) * 1000 })
    }

    fn error(&self, error: rdkafka::error::KafkaError, reason: &str) {
        self.errors.lock().unwrap().push(format!("{error}: {reason}"));
    }
}
impl ConsumerContext for Bearer {}
impl ProducerContext for Bearer {
    type DeliveryOpaque = ();
    fn delivery(&self, _: &rdkafka::message::DeliveryResult<'_>, _: ()) {}
}

fn config(addr: SocketAddr) -> rdkafka::ClientConfig {
    let mut c = common::client(addr);
    c.set("security.protocol", "SASL_PLAINTEXT").set("sasl.mechanisms", "OAUTHBEARER");
    c
}

/// Produces and reads back `n` records as the token's principal. Blocking.
fn produce_and_consume(addr: SocketAddr, token: String, topic: &str, n: usize) {
    let ctx = Bearer { token, errors: Default::default() };
    let mut pc = config(addr);
    pc.set("acks", "all").set("message.timeout.ms", "30000");
    let producer: ThreadedProducer<Bearer> = pc.create_with_context(ctx.clone()).unwrap();
    for i in 0..n {
        producer.send(BaseRecord::<(), _>::to(topic).payload(&format!("{i}"))).unwrap();
    }
    producer.flush(Duration::from_secs(30)).unwrap();
    assert_eq!(producer.in_flight_count(), 0);
    let mut cc = config(addr);
    cc.set("group.id", format!("{topic}.g")).set("auto.offset.reset", "earliest");
    let consumer: BaseConsumer<Bearer> = cc.create_with_context(ctx.clone()).unwrap();
    consumer.subscribe(&[topic]).unwrap();
    let (mut got, deadline) = (0, std::time::Instant::now() + Duration::from_secs(60));
    while got < n {
        assert!(std::time::Instant::now() < deadline, "read {got} of {n}; errors {:?}", ctx.errors.lock().unwrap());
        if let Some(m) = consumer.poll(Duration::from_millis(100)) {
            assert_eq!(m.unwrap().payload().unwrap(), format!("{got}").as_bytes());
            got += 1;
        }
    }
}

/// The error librdkafka reports for `token`. Blocking.
fn refused(addr: SocketAddr, token: String) -> String {
    let ctx = Bearer { token, errors: Default::default() };
    let consumer: BaseConsumer<Bearer> = config(addr).create_with_context(ctx.clone()).unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(e) = ctx.errors.lock().unwrap().iter().find(|e| e.contains("uthentication")) {
            assert!(consumer.fetch_metadata(None, Duration::from_millis(200)).is_err(), "nothing is served");
            return e.clone();
        }
        assert!(std::time::Instant::now() < deadline, "no authentication error; saw {:?}", ctx.errors.lock().unwrap());
        let _ = consumer.poll(Duration::from_millis(200));
    }
}

/// A SASL_PLAINTEXT listener offering OAUTHBEARER, its JWKS holding `jwk`.
fn oauth_args(dir: &std::path::Path, jwk: &serde_json::Value) -> canopy::config::ServeArgs {
    let jwks = dir.join("jwks.json");
    std::fs::write(&jwks, serde_json::json!({ "keys": [jwk] }).to_string()).unwrap();
    let mut args = common::args(&dir.join("data"));
    args.listeners = Some("SASL_PLAINTEXT://127.0.0.1:0".into());
    args.sasl_enabled_mechanisms = Some("OAUTHBEARER".into());
    args.sasl_oauthbearer_jwks_file = Some(jwks.display().to_string());
    args
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn librdkafka_authenticates_with_tokens_the_jwks_signs_and_no_others() {
    let dir = tempfile::tempdir().unwrap();
    let (key, jwk) = es256_key("idp-1");
    let (forger, _) = es256_key("idp-1");
    let mut args = oauth_args(dir.path(), &jwk);
    args.sasl_enabled_mechanisms = Some("OAUTHBEARER,PLAIN".into());
    args.sasl_oauthbearer_expected_audience = Some("canopy".into());
    args.sasl_oauthbearer_expected_issuer = Some("https://idp.test".into());
    args.connections_max_reauth_ms = Some(600_000);
    args.connection_failed_authentication_delay_ms = Some(10);
    let broker = common::start(args).await;
    let addr = listener(&broker, "SASL_PLAINTEXT");

    let good = token(&key, "idp-1", "alice", "canopy", now() + 3600);
    let bad = [
        ("expired", token(&key, "idp-1", "alice", "canopy", now() - 3600)),
        ("forged", token(&forger, "idp-1", "alice", "canopy", now() + 3600)),
        ("for another audience", token(&key, "idp-1", "alice", "elsewhere", now() + 3600)),
    ];
    let seen = tokio::task::spawn_blocking(move || {
        let seen: Vec<(&str, String)> = bad.into_iter().map(|(what, t)| (what, refused(addr, t))).collect();
        // The broker still serves a client with a good token.
        produce_and_consume(addr, good, "oauth.t", 5);
        seen
    })
    .await
    .unwrap();
    eprintln!("{seen:?}");
    for (what, e) in &seen {
        assert!(e.contains("SASL authentication error") && e.contains("invalid_token"), "{what}: {e}");
    }

    // On the wire: the session lasts no longer than its token, and a bad
    // token gets RFC 7628's error document, then the failure.
    let initial = |t: &str| format!("n,,\u{1}auth=Bearer {t}\u{1}\u{1}").into_bytes();
    let mut sock = TcpStream::connect(addr).await.unwrap();
    assert_eq!(handshake(&mut sock, "OAUTHBEARER", 1).await.error_code, 0);
    let r = authenticate(&mut sock, &initial(&token(&key, "idp-1", "bob", "canopy", now() + 20))).await;
    assert_eq!(r.error_code, 0);
    assert!((10_000..=20_000).contains(&r.session_lifetime_ms), "bounded by the token's 20 s, not the 600 s re-authentication: {}", r.session_lifetime_ms);
    let md: MetadataResponse = common::call(&mut sock, 3, 12, 9, &MetadataRequest::default().with_topics(None)).await;
    assert_eq!(md.brokers.len(), 1, "bob is served");

    let mut sock = TcpStream::connect(addr).await.unwrap();
    assert_eq!(handshake(&mut sock, "OAUTHBEARER", 1).await.error_code, 0);
    let r = authenticate(&mut sock, &initial(&token(&forger, "idp-1", "admin", "canopy", now() + 60))).await;
    assert_eq!((r.error_code, &r.auth_bytes[..]), (0, &br#"{"status":"invalid_token"}"#[..]), "the error document first");
    let r = authenticate(&mut sock, b"\x01").await;
    assert_eq!(r.error_code, 58, "then SASL_AUTHENTICATION_FAILED");

    // Malformed first messages fail the same way.
    for bad in [&b"n,,auth=Bearer x"[..], b"", b"n,,\x01auth=Bearer \x01\x01", &[0xff; 100]] {
        let mut sock = TcpStream::connect(addr).await.unwrap();
        assert_eq!(handshake(&mut sock, "OAUTHBEARER", 1).await.error_code, 0);
        let r = authenticate(&mut sock, bad).await;
        assert_eq!(&r.auth_bytes[..], br#"{"status":"invalid_token"}"#, "{bad:?}");
        assert_eq!(authenticate(&mut sock, b"\x01").await.error_code, 58);
    }
    let m = metrics(&broker).await;
    assert!(metric(&m, r#"canopy_kafka_authentications_total{listener="SASL_PLAINTEXT",mechanism="OAUTHBEARER",outcome="failure"}"#) >= 5.0, "{m}");
    assert!(metric(&m, r#"canopy_kafka_authentications_total{listener="SASL_PLAINTEXT",mechanism="OAUTHBEARER",outcome="success"}"#) >= 2.0);
    broker.shutdown().await;
}

/// With re-authentication off (the default), a session still ends with its
/// token, as in Kafka; before that, the client may re-authenticate with a
/// fresh token; after it, anything but re-authentication closes the
/// connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_ends_with_its_token_even_without_reauthentication() {
    let dir = tempfile::tempdir().unwrap();
    let (key, jwk) = es256_key("idp-1");
    let broker = common::start(oauth_args(dir.path(), &jwk)).await;
    let addr = listener(&broker, "SASL_PLAINTEXT");
    let initial = |exp: u64| format!("n,,\u{1}auth=Bearer {}\u{1}\u{1}", token(&key, "idp-1", "carol", "any", exp)).into_bytes();
    let metadata = MetadataRequest::default().with_topics(None);

    let mut sock = TcpStream::connect(addr).await.unwrap();
    assert_eq!(handshake(&mut sock, "OAUTHBEARER", 1).await.error_code, 0);
    let r = authenticate(&mut sock, &initial(now() + 3)).await;
    assert_eq!(r.error_code, 0);
    assert!((1..=3_000).contains(&r.session_lifetime_ms), "the token's 3 s, though re-authentication is off: {}", r.session_lifetime_ms);
    // A fresh token before the end: the session goes on.
    assert_eq!(handshake(&mut sock, "OAUTHBEARER", 1).await.error_code, 0);
    let r = authenticate(&mut sock, &initial(now() + 3600)).await;
    assert_eq!(r.error_code, 0);
    assert!(r.session_lifetime_ms > 3_000_000, "{}", r.session_lifetime_ms);
    let md: MetadataResponse = common::call(&mut sock, 3, 12, 7, &metadata).await;
    assert_eq!(md.brokers.len(), 1);

    // Another connection keeps its short token: after it, it is closed.
    let mut short = TcpStream::connect(addr).await.unwrap();
    assert_eq!(handshake(&mut short, "OAUTHBEARER", 1).await.error_code, 0);
    assert_eq!(authenticate(&mut short, &initial(now() + 2)).await.error_code, 0);
    tokio::time::sleep(Duration::from_millis(3200)).await;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut body = bytes::BytesMut::new();
    kafka_protocol::protocol::Encodable::encode(&metadata, &mut body, 12).unwrap();
    short.write_all(&common::request_frame(3, 12, 8, &body)).await.unwrap();
    let mut buf = [0u8; 64];
    let n = tokio::time::timeout(Duration::from_secs(10), short.read(&mut buf)).await.unwrap().unwrap_or(0);
    assert_eq!(n, 0, "an expired session is closed, unanswered");
    assert!(metric(&metrics(&broker).await, r#"canopy_kafka_connections_closed_total{reason="session_expired"}"#) >= 1.0);
    broker.shutdown().await;
}
