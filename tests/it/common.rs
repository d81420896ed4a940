//! Shared helpers for the black-box tests: a broker on 127.0.0.1:0, either
//! in this process or as a child process, and rdkafka client configs.
#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use bytes::{Buf, Bytes};
use canopy::config::{Config, ServeArgs};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use canopy::server::{self, Running};
use rdkafka::config::ClientConfig;

/// Serve args for a test broker in `dir` on ephemeral ports.
pub fn args(dir: &Path) -> ServeArgs {
    ServeArgs {
        data_dir: Some(dir.to_path_buf()),
        kafka_listener: Some("127.0.0.1:0".parse().unwrap()),
        admin_listener: Some("127.0.0.1:0".parse().unwrap()),
        rest_listener: Some("127.0.0.1:0".into()),
        ..ServeArgs::default()
    }
}

pub async fn start(args: ServeArgs) -> Running {
    // Broker logs for debugging a test: RUST_LOG=canopy=debug cargo test …
    if std::env::var_os("RUST_LOG").is_some() {
        let _ = tracing_subscriber::fmt().with_env_filter(tracing_subscriber::EnvFilter::from_default_env()).with_test_writer().try_init();
    }
    server::start(Config::load(&args).expect("test config")).await.expect("broker starts")
}

/// A port a test server keeps across restarts, below the kernel's
/// ephemeral range (32768 and up on Linux): an outgoing connection, or a
/// server bound to port 0, can never take it between a kill and a restart.
/// Ports are handed out in turn from a start that differs per process, and
/// one is returned only after binding it on every address in `ips` (a port
/// another process holds is skipped).
pub fn stable_port(ips: &[std::net::Ipv4Addr]) -> u16 {
    use std::sync::atomic::{AtomicU32, Ordering};
    const LOW: u32 = 10_000;
    const SPAN: u32 = 22_000;
    static NEXT: AtomicU32 = AtomicU32::new(u32::MAX);
    let _ = NEXT.compare_exchange(u32::MAX, std::process::id().wrapping_mul(7919) % SPAN, Ordering::Relaxed, Ordering::Relaxed);
    for _ in 0..SPAN {
        let port = (LOW + NEXT.fetch_add(1, Ordering::Relaxed) % SPAN) as u16;
        if ips.iter().all(|ip| std::net::TcpListener::bind((*ip, port)).is_ok()) {
            return port;
        }
    }
    panic!("no free port between {LOW} and {}", LOW + SPAN);
}

pub fn client(addr: SocketAddr) -> ClientConfig {
    let mut c = ClientConfig::new();
    c.set("bootstrap.servers", addr.to_string()).set("broker.address.family", "v4");
    c
}

pub fn producer_config(addr: SocketAddr, acks: &str) -> ClientConfig {
    let mut c = client(addr);
    c.set("acks", acks)
        .set("linger.ms", "5")
        .set("queue.buffering.max.messages", "1000000")
        .set("message.timeout.ms", "30000");
    c
}

pub fn consumer_config(addr: SocketAddr) -> ClientConfig {
    let mut c = client(addr);
    c.set("group.id", "canopy-test-reader").set("enable.auto.commit", "false").set("enable.auto.offset.store", "false").set("fetch.wait.max.ms", "100");
    c
}

/// A broker running as a child process (for kill -9 tests).
pub struct ChildBroker {
    pub child: Child,
    pub kafka: SocketAddr,
    /// The REST bridge's address.
    pub rest: SocketAddr,
    /// The admin listener's address (/health, /ready, /metrics).
    pub admin: SocketAddr,
    /// The child's log lines (JSON), from the start.
    pub log: std::sync::mpsc::Receiver<String>,
}

impl ChildBroker {
    pub fn spawn(dir: &Path, extra: &[&str]) -> ChildBroker {
        ChildBroker::spawn_under(&[], dir, extra)
    }

    /// [`ChildBroker::spawn`] run by `wrapper` (`prlimit --nofile=…`, say).
    pub fn spawn_under(wrapper: &[&str], dir: &Path, extra: &[&str]) -> ChildBroker {
        ChildBroker::spawn_binary(Path::new(env!("CARGO_BIN_EXE_canopy")), wrapper, dir, extra)
    }

    /// A broker from another build of Canopy (benchmarks compare builds).
    pub fn spawn_binary(bin: &Path, wrapper: &[&str], dir: &Path, extra: &[&str]) -> ChildBroker {
        let mut cmd = match wrapper.split_first() {
            Some((first, rest)) => {
                let mut c = Command::new(first);
                c.args(rest).arg(&bin);
                c
            }
            None => Command::new(&bin),
        };
        let mut child = cmd
            .arg("serve")
            .arg("--data-dir")
            .arg(dir)
            .args(if extra.contains(&"--kafka-listener") { &[][..] } else { &["--kafka-listener", "127.0.0.1:0"][..] })
            .args(["--admin-listener", "127.0.0.1:0", "--rest-listener", "127.0.0.1:0", "--log-format", "json"])
            .args(extra)
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn canopy");
        let stderr = child.stderr.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        let (log_tx, log) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut sent = false;
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if !sent && line.contains("canopy is serving") {
                    let v: serde_json::Value = serde_json::from_str(&line).expect("json log line");
                    let addr: SocketAddr = v["fields"]["kafka_addr"].as_str().expect("kafka_addr field").parse().unwrap();
                    // Logged as `Some(host:port)`.
                    let rest = v["fields"]["rest_addr"].as_str().expect("rest_addr field");
                    let rest: SocketAddr = rest.trim_start_matches("Some(").trim_end_matches(')').parse().expect("a REST address");
                    let admin: SocketAddr = v["fields"]["admin_addr"].as_str().expect("admin_addr field").parse().unwrap();
                    let _ = tx.send((addr, rest, admin));
                    sent = true;
                }
                let _ = log_tx.send(line);
            }
        });
        let (kafka, rest, admin) = rx.recv_timeout(Duration::from_secs(600)).expect("broker child reported its address");
        ChildBroker { child, kafka, rest, admin, log }
    }

    pub fn kill9(mut self) {
        self.child.kill().expect("SIGKILL");
        self.child.wait().expect("reap");
    }

    /// SIGTERM, then at most `within` for the process to exit; past that it
    /// is killed with -9 and `None` returned.
    pub fn terminate_within(mut self, within: Duration) -> Option<std::process::ExitStatus> {
        Command::new("kill").arg("-TERM").arg(self.child.id().to_string()).status().expect("kill -TERM");
        let deadline = std::time::Instant::now() + within;
        while std::time::Instant::now() < deadline {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                return Some(status);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    }

    pub fn terminate(mut self) -> std::process::ExitStatus {
        let pid = self.child.id() as i32;
        // SAFETY-free: kill(2) through the `kill` binary keeps this test std-only.
        Command::new("kill").arg("-TERM").arg(pid.to_string()).status().expect("kill -TERM");
        self.child.wait().expect("reap")
    }
}

impl Drop for ChildBroker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A field of `/proc/<pid>/status` in bytes (`VmRSS:`, `VmHWM:`): memory
/// of a broker child, which no other test in this process shares.
pub fn proc_status_bytes(pid: u32, field: &str) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = s.lines().find(|l| l.starts_with(field)).unwrap_or_else(|| panic!("{field} in /proc/{pid}/status"));
    line.split_whitespace().nth(1).unwrap().parse::<u64>().unwrap() * 1024
}

/// Sends `rec` through `p`, waiting while librdkafka's queue is full;
/// any other refusal is returned.
pub fn send_waiting<'a, K, P, C>(p: &rdkafka::producer::ThreadedProducer<C>, mut rec: rdkafka::producer::BaseRecord<'a, K, P, C::DeliveryOpaque>) -> Result<(), rdkafka::error::KafkaError>
where
    K: rdkafka::message::ToBytes + ?Sized,
    P: rdkafka::message::ToBytes + ?Sized,
    C: rdkafka::producer::ProducerContext,
{
    use rdkafka::error::KafkaError;
    use rdkafka::types::RDKafkaErrorCode;
    loop {
        match p.send(rec) {
            Ok(()) => return Ok(()),
            Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), back)) => {
                rec = back;
                std::thread::sleep(Duration::from_micros(200));
            }
            Err((e, _)) => return Err(e),
        }
    }
}

/// A v2 record batch of `values` (null keys), encoded by kafka-protocol's
/// own encoder, for tests that speak the wire protocol directly.
pub fn record_batch(values: &[&[u8]]) -> bytes::Bytes {
    producer_batch(-1, -1, -1, values)
}

/// A gzip-compressed batch of `values`.
pub fn gzip_record_batch(values: &[&[u8]]) -> bytes::Bytes {
    encode_batch(-1, -1, -1, values, kafka_protocol::records::Compression::Gzip)
}

/// A batch from an idempotent producer: `producer_id`, `epoch`, and the
/// first record's sequence number.
pub fn producer_batch(producer_id: i64, epoch: i16, first_sequence: i32, values: &[&[u8]]) -> bytes::Bytes {
    encode_batch(producer_id, epoch, first_sequence, values, kafka_protocol::records::Compression::None)
}

fn encode_batch(producer_id: i64, epoch: i16, first_sequence: i32, values: &[&[u8]], compression: kafka_protocol::records::Compression) -> bytes::Bytes {
    use kafka_protocol::records::{Record, RecordBatchEncoder, RecordEncodeOptions, TimestampType};
    let records: Vec<Record> = values
        .iter()
        .enumerate()
        .map(|(i, v)| Record {
            transactional: false,
            control: false,
            delete_horizon: false,
            partition_leader_epoch: -1,
            producer_id,
            producer_epoch: epoch,
            timestamp_type: TimestampType::Creation,
            offset: i as i64,
            sequence: if first_sequence < 0 { -1 } else { first_sequence + i as i32 },
            timestamp: 1_700_000_000_000,
            key: None,
            value: Some(bytes::Bytes::copy_from_slice(v)),
            headers: Default::default(),
        })
        .collect();
    let mut b = bytes::BytesMut::new();
    RecordBatchEncoder::encode(&mut b, &records, &RecordEncodeOptions { version: 2, compression }).unwrap();
    b.freeze()
}

/// A framed request: length, header (the version the API uses), body.
pub fn request_frame(key: i16, version: i16, id: i32, body: &[u8]) -> Vec<u8> {
    use bytes::BufMut;
    use kafka_protocol::protocol::{Encodable, StrBytes};
    let mut h = bytes::BytesMut::new();
    let hv = kafka_protocol::messages::ApiKey::try_from(key).map(|k| k.request_header_version(version)).unwrap_or(1);
    kafka_protocol::messages::RequestHeader::default()
        .with_request_api_key(key)
        .with_request_api_version(version)
        .with_correlation_id(id)
        .with_client_id(Some(StrBytes::from_static_str("canopy-test")))
        .encode(&mut h, hv)
        .unwrap();
    let mut out = Vec::new();
    out.put_i32((h.len() + body.len()) as i32);
    out.extend_from_slice(&h);
    out.extend_from_slice(body);
    out
}

/// One request on a raw connection and its decoded response (the response
/// header in the version the API uses).
pub async fn call<S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin, Req: kafka_protocol::protocol::Encodable, Resp: kafka_protocol::protocol::Decodable>(sock: &mut S, key: i16, version: i16, id: i32, req: &Req) -> Resp {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut body = bytes::BytesMut::new();
    req.encode(&mut body, version).unwrap();
    sock.write_all(&request_frame(key, version, id, &body)).await.unwrap();
    let mut len = [0u8; 4];
    tokio::time::timeout(Duration::from_secs(60), sock.read_exact(&mut len)).await.expect("answered").unwrap();
    let mut b = vec![0u8; i32::from_be_bytes(len) as usize];
    sock.read_exact(&mut b).await.unwrap();
    let mut b = bytes::Bytes::from(b);
    let hv = kafka_protocol::messages::ApiKey::try_from(key).expect("known api key").response_header_version(version);
    let header = <kafka_protocol::messages::ResponseHeader as kafka_protocol::protocol::Decodable>::decode(&mut b, hv).unwrap();
    assert_eq!(header.correlation_id, id, "correlation id");
    Resp::decode(&mut b, version).unwrap()
}

/// Reads exactly `n` records of `topic` from the start of `partitions`, by
/// assignment (no group), and checks that nothing more arrives after them.
/// Blocking: call it from `spawn_blocking` in async tests.
pub fn read_exactly(addr: SocketAddr, topic: &str, partitions: &[i32], n: usize) -> Vec<rdkafka::message::OwnedMessage> {
    use rdkafka::consumer::{BaseConsumer, Consumer};
    let consumer: BaseConsumer = consumer_config(addr).create().unwrap();
    let mut tpl = rdkafka::TopicPartitionList::new();
    for p in partitions {
        tpl.add_partition_offset(topic, *p, rdkafka::Offset::Beginning).unwrap();
    }
    consumer.assign(&tpl).unwrap();
    let mut out = Vec::with_capacity(n);
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    while out.len() < n {
        assert!(std::time::Instant::now() < deadline, "read {} of {n} records of {topic}", out.len());
        if let Some(m) = consumer.poll(Duration::from_millis(100)) {
            out.push(m.expect("a record").detach());
        }
    }
    assert!(consumer.poll(Duration::from_millis(300)).is_none(), "more than {n} records in {topic}");
    out
}

/// A raw Kafka connection for tests that send what no client would.
pub struct Raw {
    pub sock: tokio::net::TcpStream,
    pub next_id: i32,
}

impl Raw {
    pub async fn connect(addr: SocketAddr) -> Raw {
        Raw { sock: tokio::net::TcpStream::connect(addr).await.unwrap(), next_id: 1 }
    }

    pub async fn send_bytes(&mut self, b: &[u8]) {
        // The broker may already have closed: ignore write errors.
        let _ = self.sock.write_all(b).await;
    }

    pub fn frame(key: i16, version: i16, id: i32, body: &[u8]) -> Vec<u8> {
        request_frame(key, version, id, body)
    }

    /// Sends one request, returns the response body after the correlation id
    /// (and the response header's tagged fields when `flexible_header`).
    pub async fn call(&mut self, key: i16, version: i16, body: &[u8], flexible_header: bool) -> Option<Bytes> {
        let id = self.next_id;
        self.next_id += 1;
        self.send_bytes(&Raw::frame(key, version, id, body)).await;
        let mut resp = self.read_frame().await?;
        assert_eq!(resp.get_i32(), id, "correlation id");
        if flexible_header {
            assert_eq!(resp.get_u8(), 0, "no header tags");
        }
        Some(resp)
    }

    pub async fn read_frame(&mut self) -> Option<Bytes> {
        let mut len = [0u8; 4];
        match tokio::time::timeout(Duration::from_secs(30), self.sock.read_exact(&mut len)).await.expect("broker answers or closes") {
            Ok(_) => {}
            Err(_) => return None,
        }
        let mut b = vec![0u8; i32::from_be_bytes(len) as usize];
        self.sock.read_exact(&mut b).await.ok()?;
        Some(Bytes::from(b))
    }

    /// True once the broker has closed this connection.
    pub async fn closed(&mut self) -> bool {
        let mut b = [0u8; 1];
        matches!(tokio::time::timeout(Duration::from_secs(30), self.sock.read(&mut b)).await.expect("closed in time"), Ok(0) | Err(_))
    }
}

/// A message encoded at `version`, as a request body.
pub fn encode<T: kafka_protocol::protocol::Encodable>(m: &T, version: i16) -> Vec<u8> {
    let mut b = bytes::BytesMut::new();
    m.encode(&mut b, version).unwrap();
    b.to_vec()
}

/// Sends `req` on one connection, keeping `window` in flight, until
/// `deadline`; then waits for what is outstanding. Every response must
/// carry error code 0 (ProduceRequest v9 frames). Returns the requests
/// answered. For the load tools under `benches/`.
pub fn pipeline(addr: SocketAddr, req: &[u8], window: usize, deadline: std::time::Instant) -> u64 {
    use kafka_protocol::messages::{ProduceResponse, ResponseHeader};
    use kafka_protocol::protocol::Decodable;
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_nodelay(true).unwrap();
    let burst = req.repeat(window);
    s.write_all(&burst).unwrap();
    let (mut sent, mut done) = (window as u64, 0u64);
    let mut buf = vec![0u8; 1 << 20];
    let mut have = 0;
    while done < sent {
        let n = s.read(&mut buf[have..]).unwrap();
        assert!(n > 0, "the broker closed the connection");
        have += n;
        let (mut pos, mut answered) = (0, 0);
        while have - pos >= 4 {
            let len = i32::from_be_bytes(buf[pos..pos + 4].try_into().unwrap()) as usize;
            if have - pos - 4 < len {
                break;
            }
            let mut frame = bytes::Bytes::copy_from_slice(&buf[pos + 4..pos + 4 + len]);
            ResponseHeader::decode(&mut frame, 1).unwrap();
            let r = ProduceResponse::decode(&mut frame, 9).unwrap();
            let code = r.responses[0].partition_responses[0].error_code;
            assert_eq!(code, 0, "produce answered error {code}");
            pos += 4 + len;
            answered += 1;
        }
        buf.copy_within(pos..have, 0);
        have -= pos;
        done += answered;
        if answered > 0 && std::time::Instant::now() < deadline {
            s.write_all(&burst[..answered as usize * req.len()]).unwrap();
            sent += answered;
        }
    }
    done
}

/// Creates topics (name, partitions) through the AdminClient and waits for
/// each to be answered without an error.
pub async fn create_topics(addr: SocketAddr, topics: &[(&str, i32)]) {
    use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
    let admin: AdminClient<rdkafka::client::DefaultClientContext> = client(addr).create().unwrap();
    let new: Vec<NewTopic> = topics.iter().map(|(t, p)| NewTopic::new(t, *p, TopicReplication::Fixed(1))).collect();
    for r in admin.create_topics(&new, &AdminOptions::new()).await.unwrap() {
        r.unwrap();
    }
}

/// [`create_topics`] for one topic.
pub async fn create_topic(addr: SocketAddr, topic: &str, partitions: i32) {
    create_topics(addr, &[(topic, partitions)]).await
}
