//! Starting what cluster mode needs on loopback: a three-member etcd
//! cluster (Debian's `etcd-server`) and Canopy nodes built with the
//! `cluster` feature. Shared by the cluster tests and `benches/cluster.rs`.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::ChildBroker;

/// The etcd server binary: Debian's `etcd-server` package.
pub fn etcd_binary() -> PathBuf {
    let found = ["/usr/bin/etcd", "/usr/local/bin/etcd"].into_iter().map(PathBuf::from).find(|p| p.exists());
    found.expect("etcd is not installed: cluster tests need Debian's etcd-server (apt-get install etcd-server; .ci/run installs it)")
}

/// The Canopy binary the nodes run: `CANOPY_CLUSTER_BIN`, or this build's
/// own when it has the `cluster` feature (see tests/it/cluster.rs).
pub fn canopy_binary() -> PathBuf {
    match std::env::var_os("CANOPY_CLUSTER_BIN") {
        Some(p) => PathBuf::from(p),
        None if cfg!(feature = "cluster") => PathBuf::from(env!("CARGO_BIN_EXE_canopy")),
        None => panic!("set CANOPY_CLUSTER_BIN to a canopy built with --features cluster (cargo build --release --features cluster)"),
    }
}

pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// A three-member etcd cluster on loopback, killed when dropped. A member
/// can be killed and started again on its data directory (the nemesis).
pub struct Etcd {
    pub members: Vec<Child>,
    endpoints: Vec<String>,
    /// Per member, the arguments that start it.
    args: Vec<Vec<std::ffi::OsString>>,
    dir: PathBuf,
}

impl Etcd {
    pub fn start(dir: &Path) -> Etcd {
        Etcd::start_on(dir, std::net::Ipv4Addr::LOCALHOST)
    }

    /// Members whose client port listens on `client_ip` (their peer ports
    /// stay on loopback).
    pub fn start_on(dir: &Path, client_ip: std::net::Ipv4Addr) -> Etcd {
        // A member can still lose its port to another process between the
        // check and its bind; then it exits, and the cluster is made again
        // from empty data directories on other ports.
        for attempt in 1.. {
            let mut etcd = Etcd::spawn(dir, client_ip);
            match etcd.wait_healthy_or_dead() {
                Ok(()) => return etcd,
                Err(why) if attempt < 3 => {
                    eprintln!("etcd attempt {attempt} failed ({why}); starting again on other ports");
                    drop(etcd);
                    for i in 0..3 {
                        let _ = std::fs::remove_dir_all(dir.join(format!("etcd{i}")));
                    }
                }
                Err(why) => panic!("{why}"),
            }
        }
        unreachable!()
    }

    fn spawn(dir: &Path, client_ip: std::net::Ipv4Addr) -> Etcd {
        let (lo, client_ips) = (std::net::Ipv4Addr::LOCALHOST, [std::net::Ipv4Addr::LOCALHOST, client_ip]);
        let ports: Vec<(u16, u16)> = (0..3).map(|_| (crate::common::stable_port(&client_ips), crate::common::stable_port(&[lo]))).collect();
        let initial: Vec<String> = ports.iter().enumerate().map(|(i, (_, peer))| format!("e{i}=http://127.0.0.1:{peer}")).collect();
        let initial = initial.join(",");
        let args: Vec<Vec<std::ffi::OsString>> = ports
            .iter()
            .enumerate()
            .map(|(i, (client, peer))| {
                let mut a: Vec<std::ffi::OsString> = vec!["--name".into(), format!("e{i}").into(), "--data-dir".into(), dir.join(format!("etcd{i}")).into()];
                let (client, peer) = (format!("http://{client_ip}:{client}"), format!("http://127.0.0.1:{peer}"));
                for (flag, url) in [("--listen-client-urls", &client), ("--advertise-client-urls", &client), ("--listen-peer-urls", &peer), ("--initial-advertise-peer-urls", &peer)] {
                    a.push(flag.into());
                    a.push(url.into());
                }
                // A restarted member finds its data directory and ignores
                // the initial-cluster flags.
                a.extend(["--initial-cluster", &initial, "--initial-cluster-state", "new", "--initial-cluster-token", "canopy-test"].map(Into::into));
                a
            })
            .collect();
        let endpoints: Vec<String> = ports.iter().map(|(c, _)| format!("http://{client_ip}:{c}")).collect();
        let mut etcd = Etcd { members: Vec::new(), endpoints, args, dir: dir.to_owned() };
        for i in 0..3 {
            let m = etcd.spawn_member(i);
            etcd.members.push(m);
        }
        etcd
    }

    fn spawn_member(&self, i: usize) -> Child {
        let log = std::fs::OpenOptions::new().create(true).append(true).open(self.dir.join(format!("etcd{i}.log"))).unwrap();
        Command::new(etcd_binary()).args(&self.args[i]).stdout(Stdio::null()).stderr(log).spawn().expect("start etcd")
    }

    /// Kills member `i` with SIGKILL (its peers keep a quorum).
    pub fn kill_member(&mut self, i: usize) {
        let _ = self.members[i].kill();
        let _ = self.members[i].wait();
    }

    /// Starts member `i` again on its data directory.
    pub fn restart_member(&mut self, i: usize) {
        self.members[i] = self.spawn_member(i);
    }

    /// Until every member answers a quorum read (etcdctl, from Debian's
    /// etcd-client package, which etcd-server depends on).
    pub fn wait_healthy(&mut self) {
        if let Err(why) = self.wait_healthy_or_dead() {
            panic!("{why}");
        }
    }

    /// As `wait_healthy`, but a member that exits, or 60 s without health,
    /// is an error that carries the end of the member's log.
    fn wait_healthy_or_dead(&mut self) -> Result<(), String> {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let ok = Command::new("etcdctl").env("ETCDCTL_API", "3").args(["--endpoints", &self.endpoints.join(","), "endpoint", "health"]).output().is_ok_and(|o| o.status.success());
            if ok {
                return Ok(());
            }
            let exited = (0..self.members.len()).find(|&i| matches!(self.members[i].try_wait(), Ok(Some(_))));
            if let Some(i) = exited.or_else(|| (Instant::now() >= deadline).then_some(0)) {
                let log = std::fs::read_to_string(self.dir.join(format!("etcd{i}.log"))).unwrap_or_default();
                let tail: Vec<&str> = log.lines().rev().take(8).collect::<Vec<_>>().into_iter().rev().collect();
                let what = if exited.is_some() { "exited" } else { "is not healthy after 60 s" };
                return Err(format!("etcd member {i} {what}; the end of its log:\n{}", tail.join("\n")));
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    pub fn endpoints(&self) -> String {
        self.endpoints.join(",")
    }

    /// The value of `key` (empty if absent), by etcdctl.
    pub fn get(&self, key: &str) -> String {
        let out = Command::new("etcdctl").env("ETCDCTL_API", "3").args(["--endpoints", &self.endpoints(), "get", "--print-value-only", key]).output().expect("etcdctl");
        assert!(out.status.success(), "etcdctl get: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        for m in &mut self.members {
            let _ = m.kill();
            let _ = m.wait();
        }
    }
}

pub fn node_args(id: i32, etcd: &Etcd, session_timeout_ms: u32) -> Vec<String> {
    node_args_at(id, &etcd.endpoints(), session_timeout_ms)
}

fn node_args_at(id: i32, endpoints: &str, session_timeout_ms: u32) -> Vec<String> {
    let (id, timeout) = (id.to_string(), session_timeout_ms.to_string());
    ["--node-id", &id, "--etcd-endpoints", endpoints, "--cluster-name", "it", "--broker-session-timeout-ms", &timeout, "--broker-heartbeat-interval-ms", "500"].iter().map(|s| s.to_string()).collect()
}

pub fn spawn_node(root: &Path, id: i32, etcd: &Etcd) -> ChildBroker {
    spawn_node_with(root, id, etcd, 3000)
}

pub fn spawn_node_with(root: &Path, id: i32, etcd: &Etcd, session_timeout_ms: u32) -> ChildBroker {
    spawn_node_args(root, id, &[], node_args(id, etcd, session_timeout_ms))
}

/// A node whose Kafka listener is `kafka` (a restart keeps its address, as
/// a real broker's does).
/// `endpoints` is the etcd cluster's ([`Etcd::endpoints`]).
/// Run by `wrapper` (a [`Net`] namespace's, say), with `extra` arguments.
pub fn spawn_node_on(root: &Path, id: i32, endpoints: &str, kafka: std::net::SocketAddr, wrapper: &[&str], extra: &[&str]) -> ChildBroker {
    let mut args = node_args_at(id, endpoints, 3000);
    args.extend(["--kafka-listener".to_owned(), kafka.to_string()]);
    args.extend(extra.iter().map(|s| s.to_string()));
    spawn_node_args(root, id, wrapper, args)
}

/// A node started with `extra` arguments besides the usual ones.
pub fn spawn_node_extra(root: &Path, id: i32, etcd: &Etcd, extra: &[String]) -> ChildBroker {
    let mut args = node_args(id, etcd, 3000);
    args.extend(extra.iter().cloned());
    spawn_node_args(root, id, &[], args)
}

fn spawn_node_args(root: &Path, id: i32, wrapper: &[&str], args: Vec<String>) -> ChildBroker {
    let dir = root.join(format!("node{id}"));
    std::fs::create_dir_all(&dir).unwrap();
    ChildBroker::spawn_binary(&canopy_binary(), wrapper, &dir, &args.iter().map(String::as_str).collect::<Vec<_>>())
}

/// Canopy nodes in network namespaces of their own (`ip netns`, from
/// Debian's iproute2; needs root), joined by a bridge in this namespace,
/// so that the links between them, and between each and etcd, can be cut:
/// a cut is a blackhole route on both sides (packets vanish, as in a real
/// partition; nothing is refused). This namespace holds the bridge's
/// addresses: `.1` for the test's clients, `.2` for etcd's client port.
/// Everything is removed when dropped.
pub struct Net {
    bridge: String,
    prefix: String,
    namespaces: Vec<String>,
}

impl Net {
    /// A bridge and `nodes` namespaces (node ids 1..=nodes), on a /24 of
    /// 10.213.0.0/16 chosen by this process's id.
    pub fn create(nodes: i32) -> Net {
        // The first free tag from this process's: another run's bridge (or
        // one a killed run left) is never touched.
        let start = std::process::id() % 250;
        let tag = (0..250)
            .map(|i| (start + i) % 250)
            .find(|tag| Command::new("ip").args(["link", "add", &format!("cnm{tag}"), "type", "bridge"]).stderr(Stdio::null()).status().is_ok_and(|s| s.success()))
            .expect("a free bridge name cnm0..cnm249 (ip link add needs root)");
        let net = Net { bridge: format!("cnm{tag}"), prefix: format!("10.213.{tag}"), namespaces: (1..=nodes).map(|id| format!("cnm{tag}-n{id}")).collect() };
        for ns in &net.namespaces {
            // A killed run's namespace of that name (its bridge was free).
            let _ = Command::new("ip").args(["netns", "del", ns]).stderr(Stdio::null()).status();
        }
        ip(&["addr", "add", &format!("{}.1/24", net.prefix), "dev", &net.bridge]);
        ip(&["addr", "add", &format!("{}.2/24", net.prefix), "dev", &net.bridge]);
        ip(&["link", "set", &net.bridge, "up"]);
        for (i, ns) in net.namespaces.iter().enumerate() {
            let id = i as i32 + 1;
            let veth = format!("{}-v{id}", net.bridge);
            ip(&["netns", "add", ns]);
            ip(&["link", "add", &veth, "type", "veth", "peer", "name", "eth0", "netns", ns]);
            ip(&["link", "set", &veth, "master", &net.bridge, "up"]);
            ip(&["-n", ns, "addr", "add", &format!("{}/24", net.node(id)), "dev", "eth0"]);
            ip(&["-n", ns, "link", "set", "eth0", "up"]);
            ip(&["-n", ns, "link", "set", "lo", "up"]);
        }
        net
    }

    /// Node `id`'s address.
    pub fn node(&self, id: i32) -> std::net::Ipv4Addr {
        format!("{}.{}", self.prefix, 10 + id).parse().unwrap()
    }

    /// The address etcd's client port listens on.
    pub fn etcd(&self) -> std::net::Ipv4Addr {
        format!("{}.2", self.prefix).parse().unwrap()
    }

    /// The command prefix that runs a program in node `id`'s namespace.
    pub fn exec(&self, id: i32) -> [&str; 4] {
        ["ip", "netns", "exec", &self.namespaces[id as usize - 1]]
    }

    fn blackhole(&self, id: i32, to: std::net::Ipv4Addr, add: bool) {
        ip(&["-n", &self.namespaces[id as usize - 1], "route", if add { "add" } else { "del" }, "blackhole", &format!("{to}/32")]);
    }

    /// Cuts (or, with `cut` false, heals) the link between nodes `a` and `b`.
    pub fn link(&self, a: i32, b: i32, cut: bool) {
        self.blackhole(a, self.node(b), cut);
        self.blackhole(b, self.node(a), cut);
    }

    /// Cuts (or heals) node `id`'s link to etcd; its clients still reach it.
    pub fn etcd_link(&self, id: i32, cut: bool) {
        self.blackhole(id, self.etcd(), cut);
    }
}

fn ip(args: &[&str]) {
    let out = Command::new("ip").args(args).output().expect("ip (Debian's iproute2)");
    assert!(out.status.success(), "ip {}: {} (network namespaces need root)", args.join(" "), String::from_utf8_lossy(&out.stderr));
}

impl Drop for Net {
    fn drop(&mut self) {
        for ns in &self.namespaces {
            let _ = Command::new("ip").args(["netns", "del", ns]).status();
        }
        let _ = Command::new("ip").args(["link", "del", &self.bridge]).status();
    }
}

/// A CA and, signed by it, one certificate per name (`<name>.pem` and
/// `.key`: `CN=<name>,O=canopy`, for 127.0.0.1, usable by servers and
/// clients); and a second CA's certificate with a node's name
/// (`rogue.pem`, `.key`), which the cluster must not take. Returns the
/// CA's file.
pub fn pki(dir: &Path, names: &[&str]) -> PathBuf {
    let ca_of = |name: &str| {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut p = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        p.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        p.distinguished_name.push(rcgen::DnType::CommonName, name);
        (p.self_signed(&key).unwrap(), key)
    };
    let node_cert = |file: &str, name: &str, ca: &rcgen::Certificate, ca_key: &rcgen::KeyPair| {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut p = rcgen::CertificateParams::new(vec!["127.0.0.1".to_owned()]).unwrap();
        p.distinguished_name = rcgen::DistinguishedName::new();
        p.distinguished_name.push(rcgen::DnType::OrganizationName, "canopy");
        p.distinguished_name.push(rcgen::DnType::CommonName, name);
        p.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth, rcgen::ExtendedKeyUsagePurpose::ClientAuth];
        let cert = p.signed_by(&key, ca, ca_key).unwrap();
        std::fs::write(dir.join(format!("{file}.pem")), cert.pem()).unwrap();
        std::fs::write(dir.join(format!("{file}.key")), key.serialize_pem()).unwrap();
    };
    let (ca, ca_key) = ca_of("canopy cluster CA");
    for name in names {
        node_cert(name, name, &ca, &ca_key);
    }
    let (rogue_ca, rogue_key) = ca_of("another CA");
    node_cert("rogue", "node-1", &rogue_ca, &rogue_key);
    let path = dir.join("ca.pem");
    std::fs::write(&path, ca.pem()).unwrap();
    path
}

/// A node's settings for replication over mutual TLS (with [`pki`]'s
/// files in `dir`): clients on CLIENT (PLAINTEXT, first, so the harness
/// finds it), brokers on BROKER (SSL, client certificates required).
pub fn mtls_args(dir: &Path, id: i32) -> Vec<String> {
    let file = |f: String| dir.join(f).display().to_string();
    [
        "--listeners",
        "CLIENT://127.0.0.1:0,BROKER://127.0.0.1:0",
        "--listener-security-protocol-map",
        "CLIENT:PLAINTEXT,BROKER:SSL",
        "--inter-broker-listener-name",
        "BROKER",
        "--listener-ssl-client-auth",
        "BROKER:required",
    ]
    .into_iter()
    .map(str::to_owned)
    .chain(["--ssl-cert-file".into(), file(format!("node-{id}.pem")), "--ssl-key-file".into(), file(format!("node-{id}.key")), "--ssl-ca-file".into(), file("ca.pem".into())])
    .collect()
}
