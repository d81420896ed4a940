//! REST bridge load, against a ceiling, in one run:
//!
//! ```text
//! cargo build --release && cargo bench --bench rest            # 10 s per case
//! cargo bench --bench rest -- --seconds 20 --connections 64
//! cargo bench --bench rest -- --metrics-cost   # one event, acks=1: metrics on vs off
//! ```
//!
//! The ceiling is this program started again as `--ceiling-server`: a
//! minimal hyper server (through axum's router, one route) that reads the
//! body and answers 200. Canopy is `target/release/canopy`, also a child
//! process, so its CPU is read from /proc. The load generator here keeps
//! `--connections` HTTP/1.1 keep-alive connections busy, each sending one
//! request after the other, and records every latency.

use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

struct Args {
    seconds: u64,
    connections: usize,
    metrics_cost: bool,
}

fn args() -> (Args, bool) {
    let mut a = Args { seconds: 10, connections: 64, metrics_cost: false };
    let mut ceiling = false;
    let mut it = std::env::args().skip(1);
    while let Some(k) = it.next() {
        match k.as_str() {
            "--seconds" => a.seconds = it.next().unwrap().parse().unwrap(),
            "--connections" => a.connections = it.next().unwrap().parse().unwrap(),
            "--ceiling-server" => ceiling = true,
            "--metrics-cost" => a.metrics_cost = true,
            "--bench" => {}
            _ => panic!("unknown argument {k}"),
        }
    }
    (a, ceiling)
}

fn ceiling_server() {
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        println!("{}", l.local_addr().unwrap());
        std::io::stdout().flush().unwrap();
        let app = axum::Router::new().fallback(|body: axum::body::Bytes| async move { format!("{{\"len\":{}}}", body.len()) });
        axum::serve(l, app).await.unwrap();
    });
}

/// CPU seconds (user + system) of a process so far.
fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let after = &stat[stat.rfind(')').unwrap() + 2..];
    let f: Vec<&str> = after.split(' ').collect();
    let ticks: f64 = f[11].parse::<f64>().unwrap() + f[12].parse::<f64>().unwrap();
    ticks / 100.0
}

struct Result {
    requests: u64,
    errors: u64,
    latencies: Vec<u32>,
    seconds: f64,
    cpu: f64,
}

/// Reads one HTTP/1.1 response (Content-Length or chunked-free bodies).
async fn read_response(s: &mut TcpStream, buf: &mut Vec<u8>) -> Option<u16> {
    buf.clear();
    let mut tmp = [0u8; 8192];
    loop {
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = std::str::from_utf8(&buf[..end]).ok()?;
            let status: u16 = head.get(9..12)?.parse().ok()?;
            let len: usize = head.lines().find_map(|l| l.to_ascii_lowercase().strip_prefix("content-length:").map(|v| v.trim().parse().unwrap_or(0))).unwrap_or(0);
            while buf.len() < end + 4 + len {
                let n = s.read(&mut tmp).await.ok()?;
                if n == 0 {
                    return None;
                }
                buf.extend_from_slice(&tmp[..n]);
            }
            return Some(status);
        }
        let n = s.read(&mut tmp).await.ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&tmp[..n]);
    }
}

async fn load(addr: SocketAddr, request: Vec<u8>, a: &Args, pid: u32) -> Result {
    let deadline = Instant::now() + Duration::from_secs(a.seconds);
    let cpu0 = cpu_seconds(pid);
    let started = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..a.connections {
        let request = request.clone();
        tasks.push(tokio::spawn(async move {
            let mut s = TcpStream::connect(addr).await.unwrap();
            s.set_nodelay(true).unwrap();
            let mut buf = Vec::with_capacity(16384);
            let (mut n, mut errors, mut lat) = (0u64, 0u64, Vec::new());
            while Instant::now() < deadline {
                let t = Instant::now();
                if s.write_all(&request).await.is_err() {
                    break;
                }
                match read_response(&mut s, &mut buf).await {
                    Some(200..=202) => n += 1,
                    Some(_) => errors += 1,
                    None => break,
                }
                lat.push(t.elapsed().as_micros() as u32);
            }
            (n, errors, lat)
        }));
    }
    let mut r = Result { requests: 0, errors: 0, latencies: Vec::new(), seconds: 0.0, cpu: 0.0 };
    for t in tasks {
        let (n, e, l) = t.await.unwrap();
        r.requests += n;
        r.errors += e;
        r.latencies.extend(l);
    }
    r.seconds = started.elapsed().as_secs_f64();
    r.cpu = cpu_seconds(pid) - cpu0;
    r.latencies.sort_unstable();
    r
}

fn request(path: &str, headers: &[(&str, &str)], body: &[u8]) -> Vec<u8> {
    let mut r = format!("POST {path} HTTP/1.1\r\nHost: bench\r\nContent-Length: {}\r\n", body.len()).into_bytes();
    for (k, v) in headers {
        r.extend_from_slice(format!("{k}: {v}\r\n").as_bytes());
    }
    r.extend_from_slice(b"\r\n");
    r.extend_from_slice(body);
    r
}

/// The child, and the address it serves on (the REST address, with the
/// admin address, for Canopy).
fn spawn_reading_addr(mut cmd: Command, from_log: bool) -> (Child, SocketAddr, Option<SocketAddr>) {
    use std::io::BufRead;
    let mut child = if from_log { cmd.stderr(Stdio::piped()).stdout(Stdio::null()) } else { cmd.stdout(Stdio::piped()) }.spawn().unwrap();
    let lines: Box<dyn std::io::Read + Send> = if from_log { Box::new(child.stderr.take().unwrap()) } else { Box::new(child.stdout.take().unwrap()) };
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut sent = false;
        for line in std::io::BufReader::new(lines).lines().map_while(|l| l.ok()) {
            if sent {
                continue;
            }
            if !from_log {
                let _ = tx.send((line.trim().parse::<SocketAddr>().unwrap(), None));
                sent = true;
            } else if line.contains("canopy is serving") {
                let v: serde_json::Value = serde_json::from_str(&line).unwrap();
                let rest = v["fields"]["rest_addr"].as_str().unwrap();
                let admin: SocketAddr = v["fields"]["admin_addr"].as_str().unwrap().parse().unwrap();
                let _ = tx.send((rest.trim_start_matches("Some(").trim_end_matches(')').parse().unwrap(), Some(admin)));
                sent = true;
            }
        }
    });
    let (addr, admin) = rx.recv_timeout(Duration::from_secs(120)).expect("child reported its address");
    (child, addr, admin)
}

fn main() {
    let (a, ceiling) = args();
    if ceiling {
        return ceiling_server();
    }
    let canopy = PathBuf::from("target/release/canopy");
    assert!(canopy.exists(), "build the broker first: cargo build --release");
    let dir = tempfile::tempdir().unwrap();
    let principals = dir.path().join("principals.toml");
    std::fs::write(&principals, format!("[[principal]]\nname = \"bench\"\ntoken_sha256 = \"{}\"\nproduce = [\"bench.*\"]\n", canopy::auth::hash_secret(b"bench-token"))).unwrap();
    let event = br#"{"repo":"app/codestore","sha":"8f3c2a91d0e4b7c6","author":"someone@example.com","branch":"main","files":12,"additions":340,"deletions":17,"ts":"2026-12-03T16:00:00Z","msg":"Tighten the compactor's window bound"}"#;
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    gz.write_all(event).unwrap();
    let gz = gz.finish().unwrap();
    let ndjson: Vec<u8> = (0..1000).flat_map(|_| event.iter().copied().chain([b'\n'])).collect();
    let v2 = format!("{{\"records\":[{{\"value\":{}}}]}}", std::str::from_utf8(event).unwrap()).into_bytes();

    if a.metrics_cost {
        return metrics_cost(&a, &canopy, dir.path(), &principals, event);
    }
    let me = std::env::current_exe().unwrap();
    let mut cmd = Command::new(me);
    cmd.arg("--ceiling-server");
    let (mut ceiling_child, ceiling_addr, _) = spawn_reading_addr(cmd, false);
    let mut cmd = Command::new(&canopy);
    cmd.args(["serve", "--data-dir"]).arg(dir.path().join("data")).args(["--kafka-listener", "127.0.0.1:0", "--admin-listener", "127.0.0.1:0", "--rest-listener", "127.0.0.1:0", "--log-format", "json", "--principals-file"]).arg(&principals).env("RUST_LOG", "info");
    let (mut canopy_child, rest_addr, _) = spawn_reading_addr(cmd, true);
    let auth = [("Content-Type", "application/json"), ("Authorization", "Bearer bench-token")];
    let cases: Vec<(&str, bool, Vec<u8>, u64)> = vec![
        ("ceiling (minimal hyper server), one event", true, request("/ingest/bench.e", &[("Content-Type", "application/json")], event), 1),
        ("/ingest one event, acks=1", false, request("/ingest/bench.e?acks=1", &auth, event), 1),
        ("/ingest one event, acks=all", false, request("/ingest/bench.e", &auth, event), 1),
        ("/ingest one event, gzip + Bearer, acks=1", false, request("/ingest/bench.e?acks=1", &[auth[0], auth[1], ("Content-Encoding", "gzip")], &gz), 1),
        ("v2 /topics one record (json), acks=all", false, request("/topics/bench.v2", &[("Content-Type", "application/vnd.kafka.json.v2+json"), auth[1]], &v2), 1),
        ("/ingest NDJSON 1,000 events, acks=1", false, request("/ingest/bench.bulk?acks=1", &[("Content-Type", "application/x-ndjson"), auth[1]], &ndjson), 1000),
        ("/ingest NDJSON 1,000 events, acks=all", false, request("/ingest/bench.bulk", &[("Content-Type", "application/x-ndjson"), auth[1]], &ndjson), 1000),
    ];
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    println!("## REST bridge: {} connections, {} s per case, event {} bytes\n", a.connections, a.seconds, event.len());
    println!("| case | req/s | events/s | p50 ms | p99 ms | server CPU s/s | non-2xx |");
    println!("|---|---:|---:|---:|---:|---:|---:|");
    let mut ceiling_rps = 0.0;
    for (name, to_ceiling, req, events) in cases {
        let (addr, pid) = if to_ceiling { (ceiling_addr, ceiling_child.id()) } else { (rest_addr, canopy_child.id()) };
        let r = rt.block_on(load(addr, req, &a, pid));
        let rps = r.requests as f64 / r.seconds;
        if to_ceiling {
            ceiling_rps = rps;
        }
        let pct = |q: f64| r.latencies.get(((r.latencies.len() as f64 * q) as usize).min(r.latencies.len().saturating_sub(1))).map_or(0.0, |&us| us as f64 / 1000.0);
        let vs = if to_ceiling || events > 1 { String::new() } else { format!(" ({:.0}% of ceiling)", 100.0 * rps / ceiling_rps.max(1.0)) };
        println!("| {name} | {rps:.0}{vs} | {:.0} | {:.2} | {:.2} | {:.2} | {} |", rps * events as f64, pct(0.5), pct(0.99), r.cpu / r.seconds, r.errors);
    }
    let _ = ceiling_child.kill();
    let _ = canopy_child.kill();
    let _ = ceiling_child.wait();
    let _ = canopy_child.wait();
}

/// What metrics cost per request (issue 8): single-event acks=1 posts
/// with a Bearer token against a broker with metrics on (scraped every
/// second) and one with `--metrics-enabled false`, alternating three
/// times; the best run of each and broker CPU per request.
fn metrics_cost(a: &Args, canopy: &std::path::Path, dir: &std::path::Path, principals: &std::path::Path, event: &[u8]) {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let req = request("/ingest/bench.e?acks=1", &[("Content-Type", "application/json"), ("Authorization", "Bearer bench-token")], event);
    println!("## REST metrics cost: {} connections, {} s per run\n", a.connections, a.seconds);
    println!("| run | req/s | p99 ms | server CPU s/s | CPU µs per request |");
    println!("|---|---:|---:|---:|---:|");
    let (mut on, mut off) = (Vec::new(), Vec::new());
    for run in 0..3 {
        for enabled in [false, true] {
            let mut cmd = Command::new(canopy);
            cmd.args(["serve", "--data-dir"]).arg(dir.join(format!("m{run}{enabled}"))).args(["--kafka-listener", "127.0.0.1:0", "--admin-listener", "127.0.0.1:0", "--rest-listener", "127.0.0.1:0", "--log-format", "json", "--metrics-enabled", if enabled { "true" } else { "false" }, "--principals-file"]).arg(principals).env("RUST_LOG", "info");
            let (mut child, addr, admin) = spawn_reading_addr(cmd, true);
            let admin = admin.expect("canopy reports its admin address");
            let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
            let scraper = enabled.then(|| {
                let stop = stop.clone();
                std::thread::spawn(move || {
                    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                        use std::io::Read;
                        let mut s = std::net::TcpStream::connect(admin).unwrap();
                        s.write_all(b"GET /metrics HTTP/1.0\r\n\r\n").unwrap();
                        let mut body = Vec::new();
                        s.read_to_end(&mut body).unwrap();
                        std::thread::sleep(Duration::from_secs(1));
                    }
                })
            });
            let r = rt.block_on(load(addr, req.clone(), a, child.id()));
            stop.store(true, std::sync::atomic::Ordering::Relaxed);
            if let Some(s) = scraper {
                s.join().unwrap();
            }
            let rps = r.requests as f64 / r.seconds;
            let p99 = r.latencies.get(((r.latencies.len() as f64 * 0.99) as usize).min(r.latencies.len().saturating_sub(1))).map_or(0.0, |&us| us as f64 / 1000.0);
            let cpu_us = r.cpu / r.requests.max(1) as f64 * 1e6;
            println!("| {} {run} | {rps:.0} | {p99:.2} | {:.2} | {cpu_us:.2} |", if enabled { "metrics on" } else { "metrics off" }, r.cpu / r.seconds);
            if enabled { on.push((rps, cpu_us)) } else { off.push((rps, cpu_us)) }
            let _ = child.kill();
            let _ = child.wait();
        }
    }
    let best = |v: &[(f64, f64)]| v.iter().map(|x| x.0).fold(0.0, f64::max);
    let least = |v: &[(f64, f64)]| v.iter().map(|x| x.1).fold(f64::MAX, f64::min);
    println!(
        "\nbest of 3: metrics on {:.0} req/s vs off {:.0} ({:+.1}%); least CPU per request {:.2} µs on vs {:.2} µs off ({:+.1}%)",
        best(&on),
        best(&off),
        100.0 * (best(&on) / best(&off) - 1.0),
        least(&on),
        least(&off),
        100.0 * (least(&on) / least(&off) - 1.0)
    );
}
