//! Shared helpers for the black-box tests: a broker on 127.0.0.1:0, either
//! in this process or as a child process, and rdkafka client configs.
#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use canopy::config::{Config, ServeArgs};
use canopy::server::{self, Running};
use rdkafka::config::ClientConfig;

/// Serve args for a test broker in `dir` on ephemeral ports.
pub fn args(dir: &Path) -> ServeArgs {
    ServeArgs {
        data_dir: Some(dir.to_path_buf()),
        kafka_listener: Some("127.0.0.1:0".parse().unwrap()),
        admin_listener: Some("127.0.0.1:0".parse().unwrap()),
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
    /// The child's log lines (JSON), from the start.
    pub log: std::sync::mpsc::Receiver<String>,
}

impl ChildBroker {
    pub fn spawn(dir: &Path, extra: &[&str]) -> ChildBroker {
        let bin = PathBuf::from(env!("CARGO_BIN_EXE_canopy"));
        let mut child = Command::new(bin)
            .arg("serve")
            .arg("--data-dir")
            .arg(dir)
            .args(["--kafka-listener", "127.0.0.1:0", "--admin-listener", "127.0.0.1:0", "--log-format", "json"])
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
                    let _ = tx.send(addr);
                    sent = true;
                }
                let _ = log_tx.send(line);
            }
        });
        let kafka = rx.recv_timeout(Duration::from_secs(600)).expect("broker child reported its address");
        ChildBroker { child, kafka, log }
    }

    pub fn kill9(mut self) {
        self.child.kill().expect("SIGKILL");
        self.child.wait().expect("reap");
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
