//! The REST bridge with a real HTTP client (reqwest) and a real Kafka
//! consumer (librdkafka): REST Proxy v2 JSON and binary produce, keys,
//! headers, explicit partitions, key hashing equal to librdkafka's
//! `murmur2_random` partitioner, compressed bodies, and bad input (each
//! refused with REST Proxy's status and error code, nothing written).

use crate::common;

use std::io::Write;
use std::time::Duration;

use rdkafka::message::{Headers, Message};
use rdkafka::producer::{FutureProducer, FutureRecord};
use serde_json::{json, Value};

const JSON: &str = "application/vnd.kafka.json.v2+json";
const BINARY: &str = "application/vnd.kafka.binary.v2+json";

struct Rest {
    base: String,
    http: reqwest::Client,
}

impl Rest {
    async fn post(&self, path: &str, content_type: &str, encoding: Option<&str>, body: Vec<u8>) -> (u16, Value) {
        let mut req = self.http.post(format!("{}{path}", self.base)).header("content-type", content_type).body(body);
        if let Some(e) = encoding {
            req = req.header("content-encoding", e);
        }
        let resp = req.send().await.unwrap();
        let status = resp.status().as_u16();
        let text = resp.text().await.unwrap();
        (status, serde_json::from_str(&text).unwrap_or_else(|_| panic!("not JSON: {text}")))
    }
    async fn get(&self, path: &str) -> (u16, Value) {
        let resp = self.http.get(format!("{}{path}", self.base)).send().await.unwrap();
        let status = resp.status().as_u16();
        (status, serde_json::from_str(&resp.text().await.unwrap()).unwrap())
    }
}

async fn start(dir: &std::path::Path, auto_create: bool) -> (canopy::server::Running, Rest) {
    let mut args = common::args(dir);
    args.auto_create_topics = Some(auto_create);
    args.rest_max_body_bytes = Some(1 << 20);
    let broker = common::start(args).await;
    let base = format!("http://{}", broker.rest_addr.expect("the REST listener is on"));
    (broker, Rest { base, http: reqwest::Client::new() })
}

fn b64(b: &[u8]) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(b)
}

fn create(broker: &canopy::server::Running, name: &str, partitions: i32) {
    broker.engine.create_topic(name, partitions, Default::default(), false).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn v2_json_and_binary_records_reach_a_kafka_consumer() {
    let dir = tempfile::tempdir().unwrap();
    let (broker, rest) = start(dir.path(), false).await;
    create(&broker, "app.events", 3);
    let (status, topics) = rest.get("/topics").await;
    assert_eq!((status, topics), (200, json!(["app.events"])));
    let (status, t) = rest.get("/topics/app.events").await;
    assert_eq!(status, 200);
    assert_eq!(t["partitions"].as_array().unwrap().len(), 3);

    // JSON: values are stored as their JSON text; explicit partitions.
    let body = json!({"records": [
        {"value": {"n": 1, "s": "x"}, "partition": 1},
        {"key": "k", "value": [1, 2, 3], "partition": 1},
        {"value": "plain", "partition": 1},
    ]});
    let (status, resp) = rest.post("/topics/app.events", JSON, None, body.to_string().into_bytes()).await;
    assert_eq!(status, 200, "{resp}");
    let offsets: Vec<(i64, i64)> = resp["offsets"].as_array().unwrap().iter().map(|o| (o["partition"].as_i64().unwrap(), o["offset"].as_i64().unwrap())).collect();
    assert_eq!(offsets, vec![(1, 0), (1, 1), (1, 2)]);
    assert!(resp["offsets"][0]["error_code"].is_null() && resp["key_schema_id"].is_null());

    // Binary with headers, through the partition route.
    let body = json!({"records": [
        {"key": b64(b"\x00\x01key"), "value": b64(b"\xffbinary\x00"), "headers": [{"name": "h1", "value": b64(b"v1")}, {"name": "h2", "value": null}]},
        {"value": null},
    ]});
    let (status, resp) = rest.post("/topics/app.events/partitions/2", BINARY, None, body.to_string().into_bytes()).await;
    assert_eq!(status, 200, "{resp}");
    assert_eq!(resp["offsets"][1]["offset"], 1);

    let addr = broker.kafka_addr;
    let p1 = tokio::task::spawn_blocking(move || common::read_exactly(addr, "app.events", &[1], 3)).await.unwrap();
    let values: Vec<String> = p1.iter().map(|m| String::from_utf8(m.payload().unwrap().to_vec()).unwrap()).collect();
    assert_eq!(values, [r#"{"n":1,"s":"x"}"#, "[1,2,3]", r#""plain""#]);
    assert_eq!(p1[1].key(), Some(&br#""k""#[..]));
    assert!(p1.iter().all(|m| m.timestamp().to_millis().is_some_and(|t| t > 0)));
    let p2 = tokio::task::spawn_blocking(move || common::read_exactly(addr, "app.events", &[2], 2)).await.unwrap();
    assert_eq!(p2[0].key(), Some(&b"\x00\x01key"[..]));
    assert_eq!(p2[0].payload(), Some(&b"\xffbinary\x00"[..]));
    let h = p2[0].headers().unwrap();
    assert_eq!((h.get(0).key, h.get(0).value), ("h1", Some(&b"v1"[..])));
    assert_eq!((h.get(1).key, h.get(1).value), ("h2", None));
    assert_eq!(p2[1].payload(), None, "a null value stays null");
    broker.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keyed_records_land_where_librdkafka_murmur2_puts_them() {
    let dir = tempfile::tempdir().unwrap();
    let (broker, rest) = start(dir.path(), false).await;
    create(&broker, "keys.kafka", 7);
    create(&broker, "keys.rest", 7);
    let keys: Vec<String> = (0..1000).map(|i| format!("user-{i}-{}", i * 7919 % 1000)).collect();
    let mut cfg = common::producer_config(broker.kafka_addr, "all");
    cfg.set("partitioner", "murmur2_random");
    let producer: FutureProducer = cfg.create().unwrap();
    let mut kafka_partition = Vec::new();
    for k in &keys {
        let d = producer.send(FutureRecord::<str, str>::to("keys.kafka").key(k).payload("v"), Duration::from_secs(30)).await.map_err(|(e, _)| e).unwrap();
        kafka_partition.push(d.partition);
    }
    // The same keys over REST (binary: the key bytes as they are).
    let body = json!({"records": keys.iter().map(|k| json!({"key": b64(k.as_bytes()), "value": b64(b"v")})).collect::<Vec<_>>()});
    let (status, resp) = rest.post("/topics/keys.rest", BINARY, None, body.to_string().into_bytes()).await;
    assert_eq!(status, 200);
    let rest_partition: Vec<i32> = resp["offsets"].as_array().unwrap().iter().map(|o| o["partition"].as_i64().unwrap() as i32).collect();
    assert_eq!(rest_partition, kafka_partition);
    for (k, p) in keys.iter().zip(&kafka_partition) {
        assert_eq!(canopy::rest::partition::for_key(k.as_bytes(), 7), *p, "{k}");
    }
    assert!(kafka_partition.iter().collect::<std::collections::HashSet<_>>().len() == 7, "all partitions used");
    broker.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compressed_bodies_and_bad_input() {
    let dir = tempfile::tempdir().unwrap();
    let (broker, rest) = start(dir.path(), false).await;
    create(&broker, "t.z", 1);
    let body = |n: usize| json!({"records": (0..n).map(|i| json!({"value": {"i": i}})).collect::<Vec<_>>()}).to_string().into_bytes();
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    gz.write_all(&body(10)).unwrap();
    let mut zl = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::fast());
    zl.write_all(&body(10)).unwrap();
    for (enc, b) in [("gzip", gz.finish().unwrap()), ("deflate", zl.finish().unwrap()), ("zstd", zstd::encode_all(&body(10)[..], 3).unwrap())] {
        let (status, resp) = rest.post("/topics/t.z", JSON, Some(enc), b).await;
        assert_eq!(status, 200, "{enc}: {resp}");
    }
    // Bad input: status, REST Proxy error code, and nothing written.
    let mut bomb = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    let mut zeros = b"{\"records\":[{\"value\":\"".to_vec();
    zeros.resize(64 << 20, b'0');
    bomb.write_all(&zeros).unwrap();
    let bomb = bomb.finish().unwrap();
    assert!(bomb.len() < 200_000);
    // (what, content type, content encoding, body, status, error code)
    type Case<'a> = (&'a str, &'a str, Option<&'a str>, Vec<u8>, u16, u64);
    let cases: Vec<Case> = vec![
        ("malformed JSON", JSON, None, b"{\"records\": [".to_vec(), 400, 400),
        ("no records array", JSON, None, b"{\"recs\": []}".to_vec(), 422, 42206),
        ("wrong content type", "text/plain", None, body(1), 415, 415),
        ("avro", "application/vnd.kafka.avro.v2+json", None, body(1), 415, 415),
        ("bad base64", BINARY, None, json!({"records": [{"value": b64(b"ok")}, {"value": "!!!"}]}).to_string().into_bytes(), 422, 42206),
        ("binary value not a string", BINARY, None, json!({"records": [{"value": 5}]}).to_string().into_bytes(), 422, 42206),
        ("oversized body", JSON, None, vec![b' '; (1 << 20) + 1], 413, 413),
        // More than the socket buffers hold: read by the client only if the
        // broker drains what it refuses instead of resetting the connection.
        ("far oversized body", JSON, None, vec![b' '; 12 << 20], 413, 413),
        ("gzip bomb", JSON, Some("gzip"), bomb, 413, 413),
        ("corrupt gzip", JSON, Some("gzip"), b"not gzip at all".to_vec(), 400, 400),
        ("unknown encoding", JSON, Some("br"), body(1), 415, 415),
        ("partition not an integer", JSON, None, json!({"records": [{"value": 1, "partition": "x"}]}).to_string().into_bytes(), 422, 42206),
    ];
    for (what, ct, enc, b, status, code) in cases {
        let (s, resp) = rest.post("/topics/t.z", ct, enc, b).await;
        assert_eq!((s, resp["error_code"].as_u64()), (status, Some(code)), "{what}: {resp}");
        assert!(resp["message"].as_str().is_some_and(|m| !m.is_empty()), "{what}");
    }
    // The bad base64 is named by its record.
    let (_, resp) = rest.post("/topics/t.z", BINARY, None, json!({"records": [{"value": b64(b"ok")}, {"value": "!!!"}]}).to_string().into_bytes()).await;
    assert!(resp["message"].as_str().unwrap().contains("record 1"), "{resp}");
    // Unknown topic (auto-creation off), partition out of range, a stream.
    let (s, resp) = rest.post("/topics/nope", JSON, None, body(1)).await;
    assert_eq!((s, resp["error_code"].as_u64()), (404, Some(40401)));
    assert!(broker.engine.topic("nope").is_none());
    let (s, resp) = rest.post("/topics/t.z/partitions/5", JSON, None, body(1)).await;
    assert_eq!((s, resp["error_code"].as_u64()), (404, Some(40402)));
    let (s, _) = rest.post("/topics/t.__all", JSON, None, body(1)).await;
    assert_eq!(s, 422);
    // A record for a missing partition fails alone; the others are written.
    let (s, resp) = rest.post("/topics/t.z", JSON, None, json!({"records": [{"value": 1}, {"value": 2, "partition": 9}]}).to_string().into_bytes()).await;
    assert_eq!(s, 200);
    assert_eq!(resp["offsets"][1]["error_code"], 40402);
    assert_eq!(resp["offsets"][0]["offset"], 30);
    let (s, resp) = rest.get("/topics/nope").await;
    assert_eq!((s, resp["error_code"].as_u64()), (404, Some(40401)));
    // Exactly the 3 x 10 good records and the one above: nothing else.
    assert_eq!(broker.engine.offsets(&broker.engine.topic("t.z").unwrap().tp(0)).map(|o| o.1), Some(31));
    broker.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ingest_takes_one_event_an_array_or_ndjson() {
    let dir = tempfile::tempdir().unwrap();
    let (broker, rest) = start(dir.path(), true).await;
    let post = |path: String, ct: &'static str, body: Vec<u8>| {
        let req = rest.http.post(format!("{}{path}", rest.base)).header("content-type", ct).body(body);
        async move {
            let r = req.send().await.unwrap();
            (r.status().as_u16(), serde_json::from_str::<Value>(&r.text().await.unwrap()).unwrap())
        }
    };
    // One event, by path segments; the topic is auto-created.
    let (s, r) = post("/ingest/app/codestore/commits".into(), "application/json", br#"{"sha":"a1","n":1}"#.to_vec()).await;
    assert_eq!(s, 200, "{r}");
    assert_eq!((r["topic"].as_str(), r["count"].as_u64()), (Some("app.codestore.commits"), Some(1)));
    // An array keyed by a JSON pointer (acks=1), then NDJSON (acks=all).
    // Sent as text: stored byte for byte, key order and spacing included.
    let arr = r#"[{"user":{"id":"u1"},"n":2}, {"user":{"id":"u2"},"n":3},
        {"user":{"id":"u1"},"n":4}]"#.to_string();
    let (s, r) = post("/ingest/app.codestore.commits?acks=1&key=/user/id".into(), "application/json", arr.into_bytes()).await;
    assert_eq!((s, r["count"].as_u64()), (200, Some(3)), "{r}");
    let nd = b"{\"n\":5}\n\n{\"n\":6}\n{\"n\":7}\n".to_vec();
    let (s, r) = post("/ingest/app.codestore.commits".into(), "application/x-ndjson", nd).await;
    assert_eq!((s, r["count"].as_u64()), (200, Some(3)), "{r}");
    let ranges = r["partitions"].as_array().unwrap();
    assert_eq!(ranges.iter().map(|p| p["count"].as_u64().unwrap()).sum::<u64>(), 3);
    // acks=0: 202 at once; the event still arrives.
    let (s, _) = post("/ingest/app.codestore.commits?acks=0".into(), "application/json", br#"{"n":8}"#.to_vec()).await;
    assert_eq!(s, 202);
    // Bad input: the event is named; nothing is written.
    let (s, r) = post("/ingest/app.codestore.commits".into(), "application/x-ndjson", b"{\"n\":1}\n{oops\n".to_vec()).await;
    assert_eq!((s, r["error_code"].as_u64()), (400, Some(400)));
    assert!(r["message"].as_str().unwrap().contains("line 2"), "{r}");
    let (s, _) = post("/ingest/app.codestore.commits".into(), "application/json", b"[1, 2".to_vec()).await;
    assert_eq!(s, 400);
    let (s, _) = post("/ingest/app.codestore.commits?acks=2".into(), "application/json", b"{}".to_vec()).await;
    assert_eq!(s, 400);
    let (s, _) = post("/ingest/app.codestore.commits".into(), "text/csv", b"a,b".to_vec()).await;
    assert_eq!(s, 415);
    let (s, _) = post("/ingest/app.__all".into(), "application/json", b"{}".to_vec()).await;
    assert_eq!(s, 422);

    // A Kafka consumer sees the 8 events, each byte for byte as sent.
    let addr = broker.kafka_addr;
    let msgs = tokio::task::spawn_blocking(move || common::read_exactly(addr, "app.codestore.commits", &[0], 8)).await.unwrap();
    let mut values: Vec<String> = msgs.iter().map(|m| String::from_utf8(m.payload().unwrap().to_vec()).unwrap()).collect();
    values.sort();
    let mut want: Vec<String> = [r#"{"sha":"a1","n":1}"#, r#"{"user":{"id":"u1"},"n":2}"#, r#"{"user":{"id":"u2"},"n":3}"#, r#"{"user":{"id":"u1"},"n":4}"#, r#"{"n":5}"#, r#"{"n":6}"#, r#"{"n":7}"#, r#"{"n":8}"#].iter().map(|s| s.to_string()).collect();
    want.sort();
    assert_eq!(values, want);
    let keyed: Vec<Option<&[u8]>> = msgs.iter().filter(|m| m.payload().is_some_and(|p| p.starts_with(b"{\"user\""))).map(|m| m.key()).collect();
    assert_eq!(keyed.len(), 3);
    assert!(keyed.iter().all(|k| k.is_some_and(|k| k == b"u1" || k == b"u2")));
    broker.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn credentials_and_topic_patterns_gate_every_write() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("principals.toml");
    std::fs::write(
        &file,
        format!(
            "[[principal]]\nname = \"ci\"\ntoken_sha256 = \"{}\"\nproduce = [\"app.codestore.*\"]\n\n[[principal]]\nname = \"alice\"\nproduce = [\"*\"]\n",
            canopy::auth::hash_secret(b"tok-123"),
        ),
    )
    .unwrap();
    // alice's password is her SCRAM credential (HTTP Basic checks those);
    // bob is a SCRAM user the file does not name.
    canopy::auth::users::set_password(dir.path(), "alice", b"wonderland", &canopy::auth::scram::Mechanism::ALL, 4096).unwrap();
    canopy::auth::users::set_password(dir.path(), "bob", b"builder", &canopy::auth::scram::Mechanism::ALL, 4096).unwrap();
    let mut args = common::args(dir.path());
    args.principals_file = Some(file.display().to_string());
    let broker = common::start(args).await;
    let base = format!("http://{}", broker.rest_addr.unwrap());
    let http = reqwest::Client::new();
    let body = json!({"records": [{"value": {"ok": true}}]}).to_string();
    let send = |path: &str, auth: Option<(&str, String)>| {
        let mut req = http.post(format!("{base}{path}")).header("content-type", JSON).body(body.clone());
        if let Some((h, v)) = auth {
            req = req.header(h, v);
        }
        async move {
            let r = req.send().await.unwrap();
            let challenge = r.headers().get("www-authenticate").is_some();
            let status = r.status().as_u16();
            let v: Value = serde_json::from_str(&r.text().await.unwrap()).unwrap();
            (status, v["error_code"].as_u64(), challenge)
        }
    };
    let basic = |u: &str, p: &str| ("authorization", format!("Basic {}", b64(format!("{u}:{p}").as_bytes())));
    assert_eq!(send("/topics/app.codestore.a", None).await, (401, Some(40101), true));
    assert_eq!(send("/topics/app.codestore.a", Some(("authorization", "Bearer tok-124".into()))).await, (401, Some(40101), true));
    assert_eq!(send("/topics/app.codestore.a", Some(("authorization", "Token tok-123".into()))).await, (401, Some(40101), true));
    assert_eq!(send("/topics/app.codestore.a", Some(basic("alice", "wonder"))).await, (401, Some(40101), true));
    assert_eq!(send("/topics/app.codestore.a", Some(basic("mallory", "wonderland"))).await, (401, Some(40101), true));
    assert_eq!(send("/topics/app.codestore.a", Some(("authorization", "Basic !!!".into()))).await, (401, Some(40101), true));
    assert_eq!(send("/topics/app.billing.x", Some(("authorization", "Bearer tok-123".into()))).await, (403, Some(40301), false));
    // With a principals file and no authorizer, the file says who produces.
    assert_eq!(send("/topics/app.codestore.a", Some(basic("bob", "builder"))).await, (403, Some(40301), false));
    assert_eq!(send("/ingest/app/billing/x", Some(("x-api-key", "tok-123".into()))).await.0, 403);
    assert_eq!(send("/ingest/app/billing/x", None).await.0, 401);
    // Nothing was written or created by any of those.
    assert!(broker.engine.topic("app.codestore.a").is_none() && broker.engine.topic("app.billing.x").is_none());
    // The right credentials write.
    assert_eq!(send("/topics/app.codestore.a", Some(("authorization", "Bearer tok-123".into()))).await.0, 200);
    assert_eq!(send("/topics/app.codestore.a", Some(("x-api-key", "tok-123".into()))).await.0, 200);
    assert_eq!(send("/topics/app.billing.x", Some(basic("alice", "wonderland"))).await.0, 200);
    assert_eq!(send("/ingest/app/codestore/a", Some(("authorization", "bearer tok-123".into()))).await.0, 200);
    let tp = broker.engine.topic("app.codestore.a").unwrap().tp(0);
    assert_eq!(broker.engine.offsets(&tp).map(|o| o.1), Some(3));
    // Listing topics needs credentials too.
    assert_eq!(http.get(format!("{base}/topics")).send().await.unwrap().status().as_u16(), 401);
    assert_eq!(http.get(format!("{base}/topics")).header("x-api-key", "tok-123").send().await.unwrap().status().as_u16(), 200);
    broker.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn v3_single_batch_and_streaming_records() {
    let dir = tempfile::tempdir().unwrap();
    let (broker, rest) = start(dir.path(), false).await;
    create(&broker, "v3.t", 2);
    let cluster = broker.engine.cluster_id().to_owned();
    let (s, c) = rest.get("/v3/clusters").await;
    assert_eq!((s, c["data"][0]["cluster_id"].as_str()), (200, Some(cluster.as_str())));
    let (s, t) = rest.get(&format!("/v3/clusters/{cluster}/topics")).await;
    assert_eq!((s, t["data"][0]["topic_name"].as_str(), t["data"][0]["partitions_count"].as_i64()), (200, Some("v3.t"), Some(2)));
    let path = format!("/v3/clusters/{cluster}/topics/v3.t/records");
    // One record: JSON value, STRING key, a header, a partition.
    let one = json!({"partition_id": 1, "key": {"type": "STRING", "data": "k1"}, "value": {"type": "JSON", "data": {"a": 1}}, "headers": [{"name": "h", "value": b64(b"hv")}]});
    let (s, r) = rest.post(&path, "application/json", None, one.to_string().into_bytes()).await;
    assert_eq!((s, r["partition_id"].as_i64(), r["offset"].as_i64(), r["error_code"].as_i64()), (200, Some(1), Some(0), Some(200)), "{r}");
    // Batch: 207 with successes and failures by id.
    let batch = json!({"entries": [
        {"id": "a", "partition_id": 1, "value": {"type": "BINARY", "data": b64(b"bin")}},
        {"id": "b", "partition_id": 7, "value": {"type": "STRING", "data": "x"}},
        {"id": "c", "partition_id": 1, "value": {"type": "AVRO", "data": "x"}},
    ]});
    let (s, r) = rest.post(&format!("{path}:batch"), "application/json", None, batch.to_string().into_bytes()).await;
    assert_eq!(s, 207, "{r}");
    assert_eq!(r["successes"].as_array().unwrap().len(), 1);
    assert_eq!(r["successes"][0]["id"], "a");
    let failures: Vec<(String, i64)> = r["failures"].as_array().unwrap().iter().map(|f| (f["id"].as_str().unwrap().to_owned(), f["error_code"].as_i64().unwrap())).collect();
    assert_eq!(failures, vec![("b".into(), 40402), ("c".into(), 400)]);
    // Streaming: each report arrives before the next record is sent.
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Vec<u8>, std::io::Error>>(4);
    let body = reqwest::Body::wrap_stream(futures_util::stream::poll_fn({
        let mut rx = rx;
        move |cx| rx.poll_recv(cx)
    }));
    let req = rest.http.post(format!("{}{path}", rest.base)).header("content-type", "application/json").body(body).send();
    tx.send(Ok(json!({"partition_id": 1, "value": {"type": "STRING", "data": "s0"}}).to_string().into_bytes())).await.unwrap();
    let mut resp = req.await.unwrap();
    assert_eq!(resp.status().as_u16(), 200);
    let mut reports: Vec<Value> = Vec::new();
    let mut pending = Vec::new();
    for i in 1..=3 {
        // Wait for the previous record's report.
        while reports.len() < i {
            let chunk = resp.chunk().await.unwrap().expect("a report");
            pending.extend_from_slice(&chunk);
            while let Some(nl) = pending.iter().position(|&c| c == b'\n') {
                reports.push(serde_json::from_slice(&pending[..nl]).unwrap());
                pending.drain(..=nl);
            }
        }
        if i < 3 {
            // Two records in one chunk, split across the next.
            let rec = json!({"partition_id": 1, "value": {"type": "STRING", "data": format!("s{i}")}}).to_string().into_bytes();
            let (a, b) = rec.split_at(rec.len() / 2);
            tx.send(Ok(a.to_vec())).await.unwrap();
            tx.send(Ok(b.to_vec())).await.unwrap();
        }
    }
    drop(tx);
    assert!(resp.chunk().await.unwrap().is_none());
    let offsets: Vec<i64> = reports.iter().map(|r| r["offset"].as_i64().unwrap()).collect();
    assert_eq!(offsets, vec![2, 3, 4]);
    // What Kafka sees on partition 1.
    let addr = broker.kafka_addr;
    let msgs = tokio::task::spawn_blocking(move || common::read_exactly(addr, "v3.t", &[1], 5)).await.unwrap();
    let values: Vec<Vec<u8>> = msgs.iter().map(|m| m.payload().unwrap().to_vec()).collect();
    assert_eq!(values, vec![br#"{"a":1}"#.to_vec(), b"bin".to_vec(), b"s0".to_vec(), b"s1".to_vec(), b"s2".to_vec()]);
    assert_eq!(msgs[0].key(), Some(&b"k1"[..]));
    assert_eq!(msgs[0].headers().unwrap().get(0).value, Some(&b"hv"[..]));
    // Wrong cluster id: 404.
    let (s, _) = rest.post("/v3/clusters/nope/topics/v3.t/records", "application/json", None, one.to_string().into_bytes()).await;
    assert_eq!(s, 404);
    broker.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_the_rate_limit_is_429_with_retry_after_and_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let mut args = common::args(dir.path());
    args.rest_rate_limit_per_sec = Some(3);
    let broker = common::start(args).await;
    create(&broker, "rl.t", 1);
    let base = format!("http://{}", broker.rest_addr.unwrap());
    let http = reqwest::Client::new();
    let (mut ok, mut limited) = (0, 0);
    for i in 0..10 {
        let r = http.post(format!("{base}/ingest/rl.t")).header("content-type", "application/json").body(format!("{{\"i\":{i}}}")).send().await.unwrap();
        match r.status().as_u16() {
            200 => ok += 1,
            429 => {
                limited += 1;
                let wait: u64 = r.headers()["retry-after"].to_str().unwrap().parse().unwrap();
                assert!(wait >= 1);
                let v: Value = serde_json::from_str(&r.text().await.unwrap()).unwrap();
                assert_eq!(v["error_code"], 42901);
            }
            s => panic!("status {s}"),
        }
    }
    // A burst of one second's worth passes (a little more if the loop is slow).
    assert!((3..=5).contains(&ok) && ok + limited == 10, "{ok} ok, {limited} limited");
    let tp = broker.engine.topic("rl.t").unwrap().tp(0);
    assert_eq!(broker.engine.offsets(&tp).map(|o| o.1), Some(ok as i64), "only admitted requests wrote");
    broker.shutdown().await;
}

/// kill -9 during a load of acks=all POSTs: every request answered 200 is
/// readable after the restart, at the offsets it was given.
#[test]
fn every_acked_post_survives_kill_9() {
    let dir = tempfile::tempdir().unwrap();
    let broker = common::ChildBroker::spawn(dir.path(), &[]);
    let rest = broker.rest;
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let acked: Vec<(String, i64)> = rt.block_on(async move {
        let http = reqwest::Client::new();
        // The topic first, so every request below is a plain append.
        let r = http.post(format!("http://{rest}/ingest/crash.t")).header("content-type", "application/json").body("{\"id\":\"first\"}").send().await.unwrap();
        assert_eq!(r.status().as_u16(), 200);
        let mut tasks = Vec::new();
        for c in 0..8 {
            let http = http.clone();
            tasks.push(tokio::spawn(async move {
                let mut acked = Vec::new();
                for i in 0.. {
                    let id = format!("c{c}-{i}");
                    let r = http.post(format!("http://{rest}/ingest/crash.t")).header("content-type", "application/json").body(format!("{{\"id\":\"{id}\"}}")).send().await;
                    let Ok(r) = r else { break };
                    if r.status().as_u16() != 200 {
                        break;
                    }
                    let Ok(v) = r.json_text().await else { break };
                    acked.push((id, v["partitions"][0]["first_offset"].as_i64().unwrap()));
                }
                acked
            }));
        }
        tokio::time::sleep(Duration::from_millis(1500)).await;
        broker.kill9();
        let mut all = Vec::new();
        for t in tasks {
            all.extend(t.await.unwrap());
        }
        all
    });
    assert!(acked.len() > 50, "only {} requests acked before the kill", acked.len());
    let broker = common::ChildBroker::spawn(dir.path(), &[]);
    let addr = broker.kafka;
    let hw = {
        use rdkafka::consumer::{BaseConsumer, Consumer};
        let c: BaseConsumer = common::consumer_config(addr).create().unwrap();
        c.fetch_watermarks("crash.t", 0, Duration::from_secs(10)).unwrap().1
    };
    let msgs = common::read_exactly(addr, "crash.t", &[0], hw as usize);
    let at: std::collections::HashMap<i64, String> = msgs
        .iter()
        .map(|m| (m.offset(), serde_json::from_slice::<Value>(m.payload().unwrap()).unwrap()["id"].as_str().unwrap().to_owned()))
        .collect();
    for (id, offset) in &acked {
        assert_eq!(at.get(offset), Some(id), "acked {id} at {offset}");
    }
}

trait JsonText {
    async fn json_text(self) -> Result<Value, ()>;
}

impl JsonText for reqwest::Response {
    async fn json_text(self) -> Result<Value, ()> {
        let t = self.text().await.map_err(|_| ())?;
        serde_json::from_str(&t).map_err(|_| ())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_too_big_for_one_partition_writes_nothing_anywhere() {
    let dir = tempfile::tempdir().unwrap();
    let (broker, rest) = start(dir.path(), false).await;
    let mut configs = std::collections::BTreeMap::new();
    configs.insert("max.message.bytes".to_string(), "2000".to_string());
    broker.engine.create_topic("big.t", 2, configs, false).unwrap();
    // Two keys that hash to different partitions of two.
    let pa = canopy::rest::partition::for_key(b"a", 2);
    let other = ["b", "c", "d", "e", "f", "g"].into_iter().find(|k| canopy::rest::partition::for_key(k.as_bytes(), 2) != pa).unwrap();
    let big = "x".repeat(3000);
    let body = format!("{{\"k\":\"a\",\"v\":1}}\n{{\"k\":\"{other}\",\"v\":\"{big}\"}}\n");
    for acks in ["all", "0"] {
        let (s, r) = rest.post(&format!("/ingest/big.t?key=/k&acks={acks}"), "application/x-ndjson", None, body.clone().into_bytes()).await;
        assert_eq!((s, r["error_code"].as_u64()), (413, Some(413)), "acks={acks}: {r}");
    }
    let t = broker.engine.topic("big.t").unwrap();
    for p in 0..2 {
        assert_eq!(broker.engine.offsets(&t.tp(p)).map(|o| o.1), Some(0), "partition {p} untouched");
    }
    // A pretty-printed single event is one event.
    let (s, r) = rest.post("/ingest/big.t", "application/json", None, b"{\n  \"k\": \"a\",\n  \"v\": 2\n}\n".to_vec()).await;
    assert_eq!((s, r["count"].as_u64()), (200, Some(1)), "{r}");
    broker.shutdown().await;
}
