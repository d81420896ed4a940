//! Client quotas through real clients: a librdkafka producer or consumer
//! over its byte rate is held to it and told so (throttle_time_ms, which
//! librdkafka reports in its statistics), another principal is not
//! touched; quotas are managed with DescribeClientQuotas and
//! AlterClientQuotas, refused as Kafka refuses them, and survive a
//! restart; the REST bridge charges the same quota.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use canopy::auth::scram::Mechanism;
use kafka_protocol::messages::*;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::producer::{BaseRecord, Producer, ThreadedProducer};
use rdkafka::statistics::Statistics;
use rdkafka::{ClientContext, Message};
use tokio::net::TcpStream;

use super::acls::{login, s};
use super::common;
use super::security::{listener, metric, metrics, sasl};

const INVALID_REQUEST: i16 = 42;
const CLUSTER_AUTHORIZATION_FAILED: i16 = 31;

fn args(dir: &std::path::Path) -> canopy::config::ServeArgs {
    for u in ["admin", "alice", "bob"] {
        canopy::auth::users::set_password(&dir.join("data"), u, format!("{u}-pw").as_bytes(), &Mechanism::ALL, 4096).unwrap();
    }
    let mut a = common::args(&dir.join("data"));
    a.listeners = Some("SASL_PLAINTEXT://127.0.0.1:0".into());
    a.super_users = Some("User:admin".into());
    a
}

/// An AlterClientQuotas entry: `entity` as (type, name or default), `ops`
/// as (key, value or remove).
fn entry(entity: &[(&str, Option<&str>)], ops: &[(&str, Option<f64>)]) -> alter_client_quotas_request::EntryData {
    alter_client_quotas_request::EntryData::default()
        .with_entity(entity.iter().map(|(t, n)| alter_client_quotas_request::EntityData::default().with_entity_type(s(t)).with_entity_name(n.map(s))).collect())
        .with_ops(ops.iter().map(|(k, v)| alter_client_quotas_request::OpData::default().with_key(s(k)).with_value(v.unwrap_or(0.0)).with_remove(v.is_none())).collect())
}

async fn alter(sock: &mut TcpStream, entries: Vec<alter_client_quotas_request::EntryData>, validate_only: bool) -> Vec<i16> {
    let r: AlterClientQuotasResponse = common::call(sock, 49, 1, 3, &AlterClientQuotasRequest::default().with_entries(entries).with_validate_only(validate_only)).await;
    r.entries.iter().map(|e| e.error_code).collect()
}

/// (entity, values) DescribeClientQuotas finds for user `user`, strictly.
async fn describe_user(sock: &mut TcpStream, user: &str) -> Vec<(Vec<(String, Option<String>)>, Vec<(String, f64)>)> {
    let filter = describe_client_quotas_request::ComponentData::default().with_entity_type(s("user")).with_match_type(0).with_match(Some(s(user)));
    let r: DescribeClientQuotasResponse = common::call(sock, 48, 1, 4, &DescribeClientQuotasRequest::default().with_components(vec![filter]).with_strict(true)).await;
    assert_eq!(r.error_code, 0, "{r:?}");
    r.entries
        .unwrap()
        .into_iter()
        .map(|e| {
            (
                e.entity.into_iter().map(|d| (d.entity_type.to_string(), d.entity_name.map(|n| n.to_string()))).collect(),
                e.values.into_iter().map(|v| (v.key.to_string(), v.value)).collect(),
            )
        })
        .collect()
}

/// Keeps the largest throttle librdkafka reported in its statistics.
#[derive(Clone, Default)]
struct Throttle(Arc<AtomicI64>);

impl ClientContext for Throttle {
    fn stats(&self, stats: Statistics) {
        for b in stats.brokers.values() {
            if let Some(w) = &b.throttle {
                self.0.fetch_max(w.max, Ordering::Relaxed);
            }
        }
    }
}

impl rdkafka::producer::ProducerContext for Throttle {
    type DeliveryOpaque = ();
    fn delivery(&self, _: &rdkafka::message::DeliveryResult<'_>, _: ()) {}
}

impl rdkafka::consumer::ConsumerContext for Throttle {}

/// Produces `payload`-sized records as `user` for `run`, as fast as
/// librdkafka will take them; returns (delivered bytes per second after
/// the first `warm` of the run, the largest throttle reported).
fn produce_flat_out(addr: SocketAddr, user: &str, topic: &str, payload: usize, warm: Duration, run: Duration) -> (f64, i64) {
    let throttle = Throttle::default();
    let mut cfg: ClientConfig = sasl(addr, "SASL_PLAINTEXT", "PLAIN", user, &format!("{user}-pw"), "");
    cfg.set("acks", "1").set("linger.ms", "5").set("batch.size", "16384").set("statistics.interval.ms", "200").set("queue.buffering.max.kbytes", "1024");
    let producer: ThreadedProducer<Throttle> = cfg.create_with_context(throttle.clone()).unwrap();
    let value = vec![b'q'; payload];
    let start = Instant::now();
    // Bytes handed over before the window opens and when it closes: what
    // is acknowledged follows within the queue's bound (1 MiB), which
    // the window's length makes small against what it measures.
    let mut sent_at_warm = None;
    let mut sent = 0usize;
    while start.elapsed() < run {
        if sent_at_warm.is_none() && start.elapsed() >= warm {
            producer.flush(Duration::from_secs(30)).unwrap();
            sent_at_warm = Some((sent, Instant::now()));
        }
        match producer.send(BaseRecord::<(), _>::to(topic).payload(&value)) {
            Ok(()) => sent += payload,
            Err((e, _)) if e.rdkafka_error_code() == Some(rdkafka::types::RDKafkaErrorCode::QueueFull) => std::thread::sleep(Duration::from_millis(2)),
            Err((e, _)) => panic!("{user}: {e}"),
        }
    }
    producer.flush(Duration::from_secs(60)).unwrap();
    let (at_warm, t0) = sent_at_warm.expect("the run is longer than the warm-up");
    let rate = (sent - at_warm) as f64 / t0.elapsed().as_secs_f64();
    // One more statistics interval, for the last throttle.
    std::thread::sleep(Duration::from_millis(300));
    (rate, throttle.0.load(Ordering::Relaxed))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_producer_over_its_byte_rate_is_held_to_it_and_another_is_not() {
    let dir = tempfile::tempdir().unwrap();
    let args = args(dir.path());
    let broker = common::start(args.clone()).await;
    let addr = listener(&broker, "SASL_PLAINTEXT");
    let mut admin = login(addr, "admin").await;

    // Refused as Kafka refuses them, each entry on its own.
    let codes = alter(
        &mut admin,
        vec![
            entry(&[("user", Some("alice"))], &[("producer_byte_rate", Some(200_000.0))]),
            entry(&[("user", Some("x"))], &[("no_such_key", Some(1.0))]),
            entry(&[("user", Some("x"))], &[("producer_byte_rate", Some(1.5))]),
            entry(&[("user", Some("x"))], &[("request_percentage", Some(-1.0))]),
            entry(&[("user", Some("x")), ("user", Some("y"))], &[("producer_byte_rate", Some(1.0))]),
            entry(&[("ip", Some("127.0.0.1"))], &[("connection_creation_rate", Some(1.0))]),
            entry(&[("group", Some("g"))], &[("producer_byte_rate", Some(1.0))]),
            entry(&[], &[("producer_byte_rate", Some(1.0))]),
        ],
        false,
    )
    .await;
    assert_eq!(codes, [0, INVALID_REQUEST, INVALID_REQUEST, INVALID_REQUEST, INVALID_REQUEST, INVALID_REQUEST, INVALID_REQUEST, INVALID_REQUEST]);
    assert!(describe_user(&mut admin, "x").await.is_empty(), "nothing refused was stored");
    // validate_only stores nothing; a principal not administering the
    // broker may not change quotas (its own least of all).
    assert_eq!(alter(&mut admin, vec![entry(&[("user", Some("bob"))], &[("producer_byte_rate", Some(1.0))])], true).await, [0]);
    let mut alice_sock = login(addr, "alice").await;
    assert_eq!(alter(&mut alice_sock, vec![entry(&[("user", Some("alice"))], &[("producer_byte_rate", None)])], false).await, [CLUSTER_AUTHORIZATION_FAILED]);
    assert!(describe_user(&mut admin, "bob").await.is_empty());
    assert_eq!(describe_user(&mut admin, "alice").await, [(vec![("user".to_owned(), Some("alice".to_owned()))], vec![("producer_byte_rate".to_owned(), 200_000.0)])]);

    // alice and bob produce flat out at once: alice gets her rate, bob
    // never hears of a throttle.
    let (a, b) = tokio::join!(
        tokio::task::spawn_blocking(move || produce_flat_out(addr, "alice", "quota.alice", 4000, Duration::from_secs(2), Duration::from_secs(8))),
        tokio::task::spawn_blocking(move || produce_flat_out(addr, "bob", "quota.bob", 4000, Duration::from_secs(2), Duration::from_secs(8))),
    );
    let ((alice_rate, alice_throttle), (bob_rate, bob_throttle)) = (a.unwrap(), b.unwrap());
    eprintln!("alice {alice_rate:.0} B/s (throttle up to {alice_throttle} ms), bob {bob_rate:.0} B/s (throttle {bob_throttle} ms)");
    // Payload bytes: the quota also counts the batches' framing (under 1%
    // at 4000-byte records).
    assert!((alice_rate - 200_000.0).abs() <= 20_000.0, "alice at {alice_rate:.0} B/s, quota 200000");
    assert!(alice_throttle > 0, "librdkafka saw throttle_time_ms");
    assert_eq!(bob_throttle, 0, "bob has no quota");
    assert!(bob_rate > alice_rate, "bob {bob_rate:.0} B/s is not held to alice's quota");
    let m = metrics(&broker).await;
    assert!(metric(&m, "canopy_kafka_throttles_total{quota=\"producer_byte_rate\"}") > 0.0);

    // Removed, the quota no longer applies; and it is durable.
    assert_eq!(alter(&mut admin, vec![entry(&[("user", Some("alice"))], &[("producer_byte_rate", None), ("consumer_byte_rate", Some(1000.0))])], false).await, [0]);
    drop((admin, alice_sock));
    broker.shutdown().await;
    let broker = common::start(args).await;
    let mut admin = login(listener(&broker, "SASL_PLAINTEXT"), "admin").await;
    assert_eq!(describe_user(&mut admin, "alice").await, [(vec![("user".to_owned(), Some("alice".to_owned()))], vec![("consumer_byte_rate".to_owned(), 1000.0)])]);
    broker.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consumer_over_its_byte_rate_is_throttled_and_request_time_is_charged() {
    let dir = tempfile::tempdir().unwrap();
    let broker = common::start(args(dir.path())).await;
    let addr = listener(&broker, "SASL_PLAINTEXT");
    let mut admin = login(addr, "admin").await;
    // 1 MB for alice to read back at 250 kB/s.
    let payload = vec![b'c'; 1000];
    // Small batches, so that fetches of 64 kB can follow the rate closely.
    let producer: rdkafka::producer::FutureProducer = sasl(addr, "SASL_PLAINTEXT", "PLAIN", "admin", "admin-pw", "").set("batch.size", "16384").create().unwrap();
    for _ in 0..1000 {
        producer.send_result(rdkafka::producer::FutureRecord::<(), _>::to("quota.read").payload(&payload)).unwrap();
    }
    producer.flush(Duration::from_secs(30)).unwrap();
    // The default for every user, overridden for bob (more specific wins).
    let codes = alter(
        &mut admin,
        vec![entry(&[("user", None)], &[("consumer_byte_rate", Some(250_000.0))]), entry(&[("user", Some("bob"))], &[("consumer_byte_rate", Some(1e9))])],
        false,
    )
    .await;
    assert_eq!(codes, [0, 0]);

    let read_all = move |user: &'static str| {
        let throttle = Throttle::default();
        let mut cfg = sasl(addr, "SASL_PLAINTEXT", "PLAIN", user, &format!("{user}-pw"), "");
        cfg.set("group.id", format!("quota-{user}")).set("auto.offset.reset", "earliest").set("statistics.interval.ms", "200").set("fetch.max.bytes", "65536").set("message.max.bytes", "65536").set("max.partition.fetch.bytes", "65536");
        let consumer: BaseConsumer<Throttle> = cfg.create_with_context(throttle.clone()).unwrap();
        consumer.subscribe(&["quota.read"]).unwrap();
        let (mut n, mut first, deadline) = (0, None, Instant::now() + Duration::from_secs(60));
        while n < 1000 {
            assert!(Instant::now() < deadline, "{user} read {n} of 1000");
            if let Some(m) = consumer.poll(Duration::from_millis(100)) {
                assert_eq!(m.unwrap().payload().unwrap().len(), 1000);
                first.get_or_insert_with(Instant::now);
                n += 1;
            }
        }
        let took = first.unwrap().elapsed();
        std::thread::sleep(Duration::from_millis(300));
        (took, throttle.0.load(Ordering::Relaxed))
    };
    let (alice_took, alice_throttle) = tokio::task::spawn_blocking(move || read_all("alice")).await.unwrap();
    let (_, bob_throttle) = tokio::task::spawn_blocking(move || read_all("bob")).await.unwrap();
    eprintln!("alice read 1 MB in {alice_took:?} (throttle up to {alice_throttle} ms)");
    // A second's burst (250 kB), then 250 kB/s: the other 750 kB take 3 s
    // (the first fetch's time is not measured; 2.5 s would be 20% fast).
    assert!(alice_took >= Duration::from_millis(2500), "alice read 1 MB in {alice_took:?} at 250 kB/s");
    assert!(alice_throttle > 0, "librdkafka saw throttle_time_ms");
    assert_eq!(bob_throttle, 0, "bob's own quota is far above what he reads");

    // request_percentage: a principal whose requests keep the handlers
    // busier than its share is told to wait, in the responses themselves.
    assert_eq!(alter(&mut admin, vec![entry(&[("user", Some("bob"))], &[("request_percentage", Some(0.01))])], false).await, [0]);
    let mut bob = login(addr, "bob").await;
    let mut throttled = None;
    for i in 0..100 {
        let r: MetadataResponse = common::call(&mut bob, 3, 12, 10 + i, &MetadataRequest::default().with_topics(None)).await;
        if r.throttle_time_ms > 0 {
            throttled = Some(i);
            break;
        }
    }
    assert!(throttled.is_some(), "100 µs of handler time a second: a Metadata request is throttled");
    let m = metrics(&broker).await;
    assert!(metric(&m, "canopy_kafka_throttles_total{quota=\"consumer_byte_rate\"}") > 0.0);
    assert!(metric(&m, "canopy_kafka_throttles_total{quota=\"request_percentage\"}") > 0.0);
    broker.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_rest_bridge_charges_the_principals_producer_quota() {
    let dir = tempfile::tempdir().unwrap();
    let broker = common::start(args(dir.path())).await;
    let mut admin = login(listener(&broker, "SASL_PLAINTEXT"), "admin").await;
    broker.engine.create_topic("quota.rest", 1, Default::default(), false).unwrap();
    // Without REST principals, REST clients are User:ANONYMOUS.
    assert_eq!(alter(&mut admin, vec![entry(&[("user", Some("ANONYMOUS"))], &[("producer_byte_rate", Some(1000.0))])], false).await, [0]);
    let base = format!("http://{}", broker.rest_addr.unwrap());
    let http = reqwest::Client::new();
    let body = format!("{{\"v\":\"{}\"}}", "x".repeat(1500));
    let post = || http.post(format!("{base}/ingest/quota.rest")).header("content-type", "application/json").body(body.clone()).send();
    // The first fits the burst and leaves a debt; the next is refused
    // until it is repaid, and writes nothing.
    assert_eq!(post().await.unwrap().status(), 200);
    let r = post().await.unwrap();
    assert_eq!(r.status(), 429);
    assert_eq!(r.headers()["retry-after"].to_str().unwrap(), "1");
    let v: serde_json::Value = serde_json::from_str(&r.text().await.unwrap()).unwrap();
    assert_eq!(v["error_code"], 42903);
    let tp = broker.engine.topic("quota.rest").unwrap().tp(0);
    assert_eq!(broker.engine.offsets(&tp).map(|o| o.1), Some(1), "the refused request wrote nothing");
    tokio::time::sleep(Duration::from_millis(1100)).await;
    assert_eq!(post().await.unwrap().status(), 200, "admitted again once the debt is repaid");
    broker.shutdown().await;
}
