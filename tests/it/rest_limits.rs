//! The REST listener's load protection, with raw sockets and reqwest:
//! head and URI limits, the connection limit, slow-loris heads and bodies,
//! h2c, and concurrent single-event requests sharing batches while every
//! one gets its own offset. Each case checks the broker still serves a
//! well-behaved client afterwards.

use crate::common;

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

async fn raw(addr: std::net::SocketAddr, bytes: &[u8]) -> String {
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(bytes).await.unwrap();
    let mut out = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut out)).await;
    String::from_utf8_lossy(&out).into_owned()
}

async fn healthy(base: &str) {
    let r = reqwest::Client::new().post(format!("{base}/ingest/limits.ok")).header("content-type", "application/json").body(r#"{"ok":true}"#).send().await.unwrap();
    assert_eq!(r.status(), 200, "a well-behaved client is still served");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_heads_slow_clients_and_too_many_connections_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let mut args = common::args(dir.path());
    args.rest_max_connections = Some(8);
    args.rest_idle_timeout_ms = Some(500);
    args.rest_body_timeout_ms = Some(500);
    let broker = common::start(args).await;
    let addr = broker.rest_addr.unwrap();
    let base = format!("http://{addr}");
    healthy(&base).await;

    let big_header = format!("POST /ingest/limits.h HTTP/1.1\r\nHost: x\r\nX-Pad: {}\r\nContent-Length: 2\r\n\r\n{{}}", "a".repeat(64 << 10));
    assert!(raw(addr, big_header.as_bytes()).await.starts_with("HTTP/1.1 431"), "head over the limit");
    let long_uri = format!("POST /ingest/limits.u?x={} HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{{}}", "b".repeat(9000));
    let r = raw(addr, long_uri.as_bytes()).await;
    assert!(r.starts_with("HTTP/1.1 414") || r.starts_with("HTTP/1.1 431"), "URI over the limit: {r}");

    // Slow loris: half a head, then silence. The connection is closed.
    let mut loris = TcpStream::connect(addr).await.unwrap();
    loris.write_all(b"POST /ingest/limits.s HTTP/1.1\r\nHost: x\r\n").await.unwrap();
    let mut buf = [0u8; 256];
    let n = tokio::time::timeout(Duration::from_secs(5), loris.read(&mut buf)).await.expect("closed by the head timeout");
    assert!(matches!(n, Ok(_) | Err(_)));
    // A slow body: the head arrives, the body never does: 408.
    let r = raw(addr, b"POST /ingest/limits.b HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"a\"").await;
    assert!(r.starts_with("HTTP/1.1 408"), "slow body: {r}");

    // The connection limit: 8 open, the ninth is told 503 and closed.
    let mut held = Vec::new();
    for _ in 0..8 {
        let mut s = TcpStream::connect(addr).await.unwrap();
        s.write_all(b"GET /topics HTTP/1.1\r\nHost: x\r\n\r\n").await.unwrap();
        let mut b = [0u8; 12];
        s.read_exact(&mut b).await.unwrap();
        held.push(s);
    }
    let r = raw(addr, b"GET /topics HTTP/1.1\r\nHost: x\r\n\r\n").await;
    assert!(r.starts_with("HTTP/1.1 503") && r.contains("50302"), "over the connection limit: {r}");
    drop(held);
    tokio::time::sleep(Duration::from_millis(200)).await;
    healthy(&base).await;
    broker.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn h2c_and_concurrent_single_events_each_get_their_own_offset() {
    let dir = tempfile::tempdir().unwrap();
    let broker = common::start(common::args(dir.path())).await;
    let base = format!("http://{}", broker.rest_addr.unwrap());
    let h2 = reqwest::Client::builder().http2_prior_knowledge().build().unwrap();
    let r = h2.post(format!("{base}/ingest/limits.h2")).header("content-type", "application/json").body(r#"{"v":1}"#).send().await.unwrap();
    assert_eq!(r.version(), reqwest::Version::HTTP_2);
    assert_eq!(r.status(), 200);

    let http = reqwest::Client::new();
    let posts = (0..200).map(|i| {
        let http = http.clone();
        let url = format!("{base}/ingest/limits.c?acks=1");
        tokio::spawn(async move {
            let r = http.post(url).header("content-type", "application/json").body(format!("{{\"i\":{i}}}")).send().await.unwrap();
            assert_eq!(r.status(), 200);
            let v: serde_json::Value = serde_json::from_str(&r.text().await.unwrap()).unwrap();
            v["partitions"][0]["first_offset"].as_i64().unwrap()
        })
    });
    let mut offsets: Vec<i64> = futures_util::future::join_all(posts).await.into_iter().map(Result::unwrap).collect();
    offsets.sort();
    assert_eq!(offsets, (0..200).collect::<Vec<_>>(), "every request its own offset, none lost or shared");
    let got = tokio::task::spawn_blocking({
        let addr = broker.kafka_addr;
        move || common::read_exactly(addr, "limits.c", &[0], 200)
    })
    .await
    .unwrap();
    let mut seen: Vec<i64> = got.iter().map(|m| serde_json::from_slice::<serde_json::Value>(rdkafka::Message::payload(m).unwrap()).unwrap()["i"].as_i64().unwrap()).collect();
    seen.sort();
    assert_eq!(seen, (0..200).collect::<Vec<_>>(), "a Kafka consumer reads each event once");
    broker.shutdown().await;
}
