//! The REST bridge at scale and over TLS: 10,000 open connections served
//! at once (and the next one refused), a gzip bomb's cost to the broker's
//! resident memory, HTTPS with HTTP/1.1 and HTTP/2 negotiated by ALPN, and
//! per-route defaults for `/ingest`. The broker runs as a child process
//! where its own memory or file descriptors are measured.

use crate::common;

use std::io::Write;
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// One keep-alive exchange on `s`: the status and the body.
async fn exchange(s: &mut TcpStream, request: &[u8]) -> (u16, String) {
    s.write_all(request).await.unwrap();
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    let head_end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        let n = s.read(&mut chunk).await.unwrap();
        assert!(n > 0, "closed before a response head: {}", String::from_utf8_lossy(&buf));
        buf.extend_from_slice(&chunk[..n]);
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
    let status: u16 = head[9..12].parse().unwrap();
    let len: usize = head
        .lines()
        .find_map(|l| l.to_ascii_lowercase().strip_prefix("content-length:").map(|v| v.trim().parse().unwrap()))
        .expect("a content-length");
    while buf.len() < head_end + len {
        let n = s.read(&mut chunk).await.unwrap();
        assert!(n > 0, "closed inside a response body");
        buf.extend_from_slice(&chunk[..n]);
    }
    (status, String::from_utf8_lossy(&buf[head_end..head_end + len]).into_owned())
}

fn post(topic: &str, body: &str) -> Vec<u8> {
    format!("POST /ingest/{topic}?acks=1 HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}", body.len()).into_bytes()
}

#[test]
fn ten_thousand_connections_are_served_at_once_and_the_next_is_refused() {
    const N: usize = 10_000;
    let dir = tempfile::tempdir().unwrap();
    let broker = common::ChildBroker::spawn(dir.path(), &["--rest-max-connections", "10000", "--rest-idle-timeout-ms", "600000"]);
    let rest = broker.rest;
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let mut held: Vec<TcpStream> = rt.block_on(async move {
        let mut first = TcpStream::connect(rest).await.unwrap();
        assert_eq!(exchange(&mut first, &post("scale.c", r#"{"i":-1}"#)).await.0, 200, "the topic exists before the crowd");
        let mut held = vec![first];
        // In waves, so the accept backlog never overflows into SYN retries.
        while held.len() < N {
            let wave = (N - held.len()).min(500);
            let base = held.len();
            let tasks: Vec<_> = (0..wave)
                .map(|j| {
                    tokio::spawn(async move {
                        let mut s = TcpStream::connect(rest).await.unwrap();
                        let (status, body) = exchange(&mut s, &post("scale.c", &format!("{{\"i\":{}}}", base + j))).await;
                        assert_eq!(status, 200, "{body}");
                        s
                    })
                })
                .collect();
            for t in tasks {
                held.push(t.await.unwrap());
            }
        }
        held
    });
    assert_eq!(held.len(), N);
    rt.block_on(async {
        // Every connection is still open and served on keep-alive ...
        let (status, _) = exchange(&mut held[0], &post("scale.c", r#"{"i":"again"}"#)).await;
        assert_eq!(status, 200);
        // ... and one more is told 503 and closed.
        let mut extra = TcpStream::connect(rest).await.unwrap();
        let mut out = Vec::new();
        extra.write_all(&post("scale.c", r#"{"i":"extra"}"#)).await.unwrap();
        let _ = tokio::time::timeout(Duration::from_secs(30), extra.read_to_end(&mut out)).await;
        let out = String::from_utf8_lossy(&out);
        assert!(out.starts_with("HTTP/1.1 503") && out.contains("50302"), "over the limit: {out}");
    });
    // A Kafka client is not affected, and reads every acked event once.
    let got = common::read_exactly(broker.kafka, "scale.c", &[0], N + 1);
    let mut seen: Vec<String> = got.iter().map(|m| String::from_utf8_lossy(rdkafka::Message::payload(m).unwrap()).into_owned()).collect();
    seen.sort();
    seen.dedup();
    assert_eq!(seen.len(), N + 1, "10,001 distinct events");
    // Closing some connections lets new clients in again.
    held.truncate(N - 10);
    rt.block_on(async {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let mut s = TcpStream::connect(rest).await.unwrap();
            s.write_all(&post("scale.c", r#"{"i":"after"}"#)).await.unwrap();
            let mut head = [0u8; 12];
            if s.read_exact(&mut head).await.is_ok() && &head == b"HTTP/1.1 200" {
                break;
            }
            assert!(Instant::now() < deadline, "no connection slot came free after closing 10");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    });
    drop(held);
}

/// A field of /proc/<pid>/status, in bytes.

#[test]
fn a_gzip_bomb_gets_413_and_the_broker_stays_small() {
    let dir = tempfile::tempdir().unwrap();
    let broker = common::ChildBroker::spawn(dir.path(), &[]);
    let pid = broker.child.id();
    let rest = broker.rest;
    // 1 GiB of zeros as gzip members of 1 MiB each (a gzip stream may hold
    // many; DEFLATE's 1032:1 ratio is the densest a single member gets).
    let member = {
        let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
        e.write_all(&vec![0u8; 1 << 20]).unwrap();
        e.finish().unwrap()
    };
    let bomb: Vec<u8> = member.repeat(1024);
    assert!(bomb.len() < 2 << 20, "{} bytes on the wire", bomb.len());
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    rt.block_on(async move {
        let http = reqwest::Client::new();
        let ok = http.post(format!("http://{rest}/ingest/bomb.t")).header("content-type", "application/json").body(r#"{"warm":1}"#).send().await.unwrap();
        assert_eq!(ok.status(), 200);
        let before = common::proc_status_bytes(pid, "VmRSS:");
        // One at a time: the issue's case. (Concurrent bombs each hold
        // their worst case against rest_max_in_flight_bytes meanwhile.)
        for _ in 0..3 {
            let r = http.post(format!("http://{rest}/ingest/bomb.t")).header("content-type", "application/json").header("content-encoding", "gzip").body(bomb.clone()).send().await.unwrap();
            let status = r.status().as_u16();
            let body = r.text().await.unwrap();
            assert_eq!(status, 413, "{body}");
        }
        let peak = common::proc_status_bytes(pid, "VmHWM:");
        let grew = peak.saturating_sub(before);
        eprintln!("broker RSS before {} MiB, peak after three 1 GiB bombs {} MiB", before >> 20, peak >> 20);
        assert!(grew < 64 << 20, "the broker's peak RSS grew by {} MiB", grew >> 20);
        let again = http.post(format!("http://{rest}/ingest/bomb.t")).header("content-type", "application/json").body(r#"{"after":1}"#).send().await.unwrap();
        assert_eq!(again.status(), 200, "still serving");
    });
    let got = common::read_exactly(broker.kafka, "bomb.t", &[0], 2);
    assert_eq!(got.len(), 2, "nothing of the bombs was written");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_serves_http1_and_h2_by_alpn() {
    let dir = tempfile::tempdir().unwrap();
    let cert = rcgen::generate_simple_self_signed(vec!["canopy.test".to_owned()]).unwrap();
    let (cert_pem, key_pem) = (cert.cert.pem(), cert.key_pair.serialize_pem());
    std::fs::write(dir.path().join("cert.pem"), &cert_pem).unwrap();
    std::fs::write(dir.path().join("key.pem"), &key_pem).unwrap();
    let mut args = common::args(&dir.path().join("data"));
    args.rest_tls_cert_file = Some(dir.path().join("cert.pem").display().to_string());
    args.rest_tls_key_file = Some(dir.path().join("key.pem").display().to_string());
    let broker = common::start(args).await;
    let addr = broker.rest_addr.unwrap();
    let root = reqwest::Certificate::from_pem(cert_pem.as_bytes()).unwrap();
    for (client, version) in [
        (reqwest::Client::builder().http1_only(), reqwest::Version::HTTP_11),
        (reqwest::Client::builder(), reqwest::Version::HTTP_2),
    ] {
        let http = client.use_rustls_tls().tls_built_in_root_certs(false).add_root_certificate(root.clone()).resolve("canopy.test", addr).build().unwrap();
        let r = http.post(format!("https://canopy.test:{}/ingest/tls.t", addr.port())).header("content-type", "application/json").body(r#"{"tls":true}"#).send().await.unwrap();
        assert_eq!((r.status().as_u16(), r.version()), (200, version));
    }
    // Cleartext to a TLS port is not served.
    let plain = reqwest::Client::new().post(format!("http://{addr}/ingest/tls.t")).body("{}").send().await;
    assert!(plain.is_err() || plain.unwrap().status() != 200, "cleartext on the TLS port");
    let got = tokio::task::spawn_blocking({
        let addr = broker.kafka_addr;
        move || common::read_exactly(addr, "tls.t", &[0], 2)
    })
    .await
    .unwrap();
    assert!(got.iter().all(|m| rdkafka::Message::payload(m).unwrap() == br#"{"tls":true}"#));
    broker.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn routes_give_ingest_its_acks_and_key_unless_the_request_says() {
    let dir = tempfile::tempdir().unwrap();
    let routes = dir.path().join("routes.toml");
    std::fs::write(&routes, "[[route]]\ntopics = \"route.keyed\"\nkey = \"/user\"\n\n[[route]]\ntopics = \"route.fire*\"\nacks = \"0\"\n").unwrap();
    let mut args = common::args(&dir.path().join("data"));
    args.rest_routes_file = Some(routes.display().to_string());
    let broker = common::start(args).await;
    broker.engine.create_topic("route.keyed", 8, Default::default(), false).unwrap();
    let base = format!("http://{}", broker.rest_addr.unwrap());
    let http = reqwest::Client::new();
    let send = |topic: &str, query: &str, body: String| {
        http.post(format!("{base}/ingest/{topic}{query}")).header("content-type", "application/json").body(body).send()
    };
    // The route's pointer keys each event, as murmur2 places the key.
    for user in ["ann", "bob", "cy", "dee"] {
        let r = send("route.keyed", "", format!("{{\"user\":\"{user}\"}}")).await.unwrap();
        assert_eq!(r.status(), 200);
        let v: serde_json::Value = serde_json::from_str(&r.text().await.unwrap()).unwrap();
        assert_eq!(v["partitions"][0]["partition"], canopy::rest::partition::for_key(user.as_bytes(), 8), "{user}");
    }
    // The request's own pointer wins.
    let r = send("route.keyed", "?key=/other", r#"{"user":"ann","other":"zed"}"#.into()).await.unwrap();
    let v: serde_json::Value = serde_json::from_str(&r.text().await.unwrap()).unwrap();
    assert_eq!(v["partitions"][0]["partition"], canopy::rest::partition::for_key(b"zed", 8));
    // The route's acks=0 answers 202; the request's acks=1 answers 200.
    assert_eq!(send("route.fire", "", "{}".into()).await.unwrap().status(), 202);
    assert_eq!(send("route.fire", "?acks=1", "{}".into()).await.unwrap().status(), 200);
    assert_eq!(send("route.other", "", "{}".into()).await.unwrap().status(), 200);
    broker.shutdown().await;
}

#[test]
fn a_bad_routes_file_stops_start_up_and_names_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let routes = dir.path().join("routes.toml");
    std::fs::write(&routes, "[[route]]\ntopics = \"x\"\nacks = \"2\"\n").unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_canopy"))
        .args(["serve", "--data-dir"])
        .arg(dir.path().join("data"))
        .args(["--kafka-listener", "127.0.0.1:0", "--admin-listener", "127.0.0.1:0", "--rest-listener", "127.0.0.1:0", "--rest-routes-file"])
        .arg(&routes)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("rest_routes_file") && err.contains("acks"), "{err}");
}
