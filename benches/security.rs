//! What security costs: produce and consume over PLAINTEXT, SASL_PLAINTEXT
//! with SCRAM-SHA-512 and SASL_SSL with SCRAM-SHA-512, in one run against
//! one broker, and authentications per second.
//!
//! ```text
//! cargo bench --bench security                          # 3 runs of 5M records per listener
//! cargo bench --bench security -- --runs 1 --records 2000000 --auth-secs 5
//! cargo bench --bench security -- --only authorization   # or throughput, authentication, quotas
//! ```
//!
//! **Throughput**: librdkafka's `rdkafka_performance` produces `--records`
//! 100-byte records (acks=1, one partition) through each listener of a
//! release broker child, then reads them back; per arm, records/s, MB/s,
//! the broker's utime+stime per GB of record values, and the client's
//! (`getrusage` of this process's finished children) per GB. The arms
//! alternate within each run, each on its own topic.
//!
//! **Where TLS's time goes**: the cipher alone, measured on this thread
//! with ring: AES-256-GCM sealing 16 KiB records (what TLS 1.3 with
//! rustls's preferred suite does to every byte), in CPU s/GB, beside the
//! broker's extra s/GB over SASL_SSL.
//!
//! **Authorization**: the cost of a check with 0, 1,000 and 100,000 ACLs
//! (in-process: ns per check of a principal granted its branch by a
//! prefixed ACL, among ACLs of other principals and topics), and end to
//! end: a broker with the authorizer off, and one with it on holding 0,
//! then 1,000, then 100,000 ACLs, each produce run through SASL_PLAINTEXT;
//! broker CPU per GB beside the authorizer-off broker's.
//!
//! **Quotas**: what accounting costs when quotas are configured but do not
//! bind: one PLAINTEXT broker, each run once without quotas and once with
//! a default user quota of every kind far above the load (so every
//! request is charged, its handler's polls timed, and nothing throttled),
//! alternating; broker CPU per GB of each, produce and consume.
//!
//! **Authentications per second**: two client threads open connections to
//! each SASL listener and authenticate (SCRAM-SHA-512 and PLAIN) for
//! `--auth-secs`; per arm, authentications/s and the broker's CPU ms per
//! authentication. Both sides run PBKDF2 with 4096 iterations (SCRAM: the
//! client; PLAIN: the broker), so on 2 cores the client's half weighs on
//! the rate: the broker's CPU per authentication is the number to read.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

#[path = "../tests/it/common.rs"]
mod common;
#[path = "support/perf_tool.rs"]
mod perf_tool;

use canopy::auth::scram::{client::ScramClient, Mechanism};
use tokio_rustls::rustls;
use common::ChildBroker as Broker;

fn process_cpu(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("proc stat");
    let after = &stat[stat.rfind(')').unwrap() + 2..];
    let f: Vec<&str> = after.split(' ').collect();
    (f[11].parse::<f64>().unwrap() + f[12].parse::<f64>().unwrap()) / 100.0
}

/// CPU seconds of this process's finished children (the load tool).
fn children_cpu() -> f64 {
    // SAFETY: getrusage writes into the struct it is given.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_CHILDREN, &mut u) };
    let t = |tv: libc::timeval| tv.tv_sec as f64 + tv.tv_usec as f64 / 1e6;
    t(u.ru_utime) + t(u.ru_stime)
}

fn thread_cpu() -> f64 {
    let s = std::fs::read_to_string("/proc/thread-self/schedstat").expect("schedstat");
    s.split_whitespace().next().unwrap().parse::<f64>().unwrap() / 1e9
}

fn free_ports(n: usize) -> Vec<u16> {
    let ls: Vec<std::net::TcpListener> = (0..n).map(|_| std::net::TcpListener::bind("127.0.0.1:0").unwrap()).collect();
    ls.iter().map(|l| l.local_addr().unwrap().port()).collect()
}

struct Arm {
    name: &'static str,
    addr: String,
    props: Vec<String>,
}

/// (records/s, broker s/GB, client s/GB) of one produce or consume.
fn perf_run(perf: &Path, pid: u32, arm: &Arm, topic: &str, records: u64, produce: bool) -> (f64, f64, f64) {
    let mut cmd = Command::new(perf);
    if produce {
        cmd.args(["-P", "-t", topic, "-p", "0", "-s", "100", "-c", &records.to_string(), "-X", "acks=1", "-X", "linger.ms=5"]);
    } else {
        cmd.args(["-C", "-t", topic, "-p", "0", "-o", "beginning", "-c", &records.to_string()]);
    }
    cmd.args(["-b", &arm.addr, "-q"]);
    for p in &arm.props {
        cmd.args(["-X", p]);
    }
    let (c0, k0, t0) = (process_cpu(pid), children_cpu(), Instant::now());
    let st = cmd.stdout(std::process::Stdio::null()).stderr(std::process::Stdio::null()).status().expect("rdkafka_performance");
    assert!(st.success(), "rdkafka_performance failed on {}", arm.name);
    let (c1, k1, secs) = (process_cpu(pid), children_cpu(), t0.elapsed().as_secs_f64());
    let gb = records as f64 * 100.0 / 1e9;
    (records as f64 / secs, (c1 - c0) / gb, (k1 - k0) / gb)
}

/// One authentication on a fresh connection; the TLS client if given.
fn authenticate(addr: SocketAddr, mechanism: &str, tls: Option<&std::sync::Arc<rustls::ClientConfig>>) {
    let sock = TcpStream::connect(addr).unwrap();
    sock.set_nodelay(true).unwrap();
    match tls {
        None => exchange(sock, mechanism),
        Some(cfg) => {
            let name = rustls_pki_types::ServerName::try_from("127.0.0.1").unwrap();
            let conn = rustls::ClientConnection::new(cfg.clone(), name).unwrap();
            exchange(rustls::StreamOwned::new(conn, sock), mechanism)
        }
    }
}

fn call<S: Read + Write, Req: kafka_protocol::protocol::Encodable, Resp: kafka_protocol::protocol::Decodable>(s: &mut S, key: i16, version: i16, req: &Req) -> Resp {
    let mut body = bytes::BytesMut::new();
    req.encode(&mut body, version).unwrap();
    s.write_all(&common::request_frame(key, version, 1, &body)).unwrap();
    let mut len = [0u8; 4];
    s.read_exact(&mut len).unwrap();
    let mut b = vec![0u8; i32::from_be_bytes(len) as usize];
    s.read_exact(&mut b).unwrap();
    let mut b = bytes::Bytes::from(b);
    let hv = kafka_protocol::messages::ApiKey::try_from(key).unwrap().response_header_version(version);
    let _ = <kafka_protocol::messages::ResponseHeader as kafka_protocol::protocol::Decodable>::decode(&mut b, hv).unwrap();
    Resp::decode(&mut b, version).unwrap()
}

fn exchange<S: Read + Write>(mut s: S, mechanism: &str) {
    use kafka_protocol::messages::*;
    let h: SaslHandshakeResponse = call(&mut s, 17, 1, &SaslHandshakeRequest::default().with_mechanism(kafka_protocol::protocol::StrBytes::from_string(mechanism.into())));
    assert_eq!(h.error_code, 0);
    let auth = |s: &mut S, t: Vec<u8>| -> SaslAuthenticateResponse { call(s, 36, 2, &SaslAuthenticateRequest::default().with_auth_bytes(t.into())) };
    if mechanism == "PLAIN" {
        assert_eq!(auth(&mut s, b"\0bench\0bench-password".to_vec()).error_code, 0);
        return;
    }
    let mut c = ScramClient::new(Mechanism::Sha512, "bench", b"bench-password");
    let first = auth(&mut s, c.first());
    assert_eq!(first.error_code, 0);
    let done = auth(&mut s, c.last(&first.auth_bytes).unwrap());
    assert_eq!(done.error_code, 0);
    assert!(c.verify(&done.auth_bytes));
}

/// (authentications/s, broker CPU ms per authentication).
fn auth_rate(pid: u32, addr: SocketAddr, mechanism: &'static str, tls: Option<std::sync::Arc<rustls::ClientConfig>>, secs: f64) -> (f64, f64) {
    let (c0, t0) = (process_cpu(pid), Instant::now());
    let until = t0 + Duration::from_secs_f64(secs);
    let threads: Vec<_> = (0..2)
        .map(|_| {
            let tls = tls.clone();
            std::thread::spawn(move || {
                let mut n = 0u64;
                while Instant::now() < until {
                    authenticate(addr, mechanism, tls.as_ref());
                    n += 1;
                }
                n
            })
        })
        .collect();
    let n: u64 = threads.into_iter().map(|t| t.join().unwrap()).sum();
    let (c1, el) = (process_cpu(pid), t0.elapsed().as_secs_f64());
    (n as f64 / el, (c1 - c0) * 1000.0 / n as f64)
}

/// AES-256-GCM sealing in 16 KiB records, CPU s/GB of this thread.
fn cipher_floor() -> f64 {
    use ring::aead::{Aad, LessSafeKey, Nonce, UnboundKey, AES_256_GCM};
    let key = LessSafeKey::new(UnboundKey::new(&AES_256_GCM, &[7u8; 32]).unwrap());
    let mut rec = vec![0x5au8; 16 << 10];
    let n = (1e9 / rec.len() as f64) as u64;
    let t0 = thread_cpu();
    for i in 0..n {
        let mut nonce = [0u8; 12];
        nonce[4..].copy_from_slice(&i.to_be_bytes());
        let _tag = key.seal_in_place_separate_tag(Nonce::assume_unique_for_key(nonce), Aad::empty(), &mut rec).unwrap();
    }
    thread_cpu() - t0
}

/// `n` ACLs of other principals on other topics and branches (literal and
/// prefixed, allow and deny), plus the one that grants `bench` its branch.
fn acls(n: usize) -> Vec<canopy::auth::acl::Acl> {
    use canopy::auth::acl::{Acl, Operation, PatternType, Permission, ResourceType};
    let mut v: Vec<Acl> = (0..n)
        .map(|i| Acl {
            resource_type: if i % 5 == 0 { ResourceType::Group } else { ResourceType::Topic },
            name: if i % 3 == 0 { format!("team{}.svc{}.", i % 97, i) } else { format!("team{}.svc{}.events", i % 97, i) },
            pattern: if i % 3 == 0 { PatternType::Prefixed } else { PatternType::Literal },
            principal: format!("User:u{i}"),
            host: "*".into(),
            operation: if i % 2 == 0 { Operation::Write } else { Operation::Read },
            permission: if i % 11 == 0 { Permission::Deny } else { Permission::Allow },
        })
        .collect();
    v.push(Acl { resource_type: ResourceType::Topic, name: "bench".into(), pattern: PatternType::Prefixed, principal: "User:bench".into(), host: "*".into(), operation: Operation::All, permission: Permission::Allow });
    v
}

/// ns per check with `n` other ACLs.
fn check_cost(n: usize) -> f64 {
    use canopy::auth::acl::{Authorizer, Operation, Request, ResourceType};
    let a = Authorizer::in_memory(acls(n), vec![], false);
    let who = canopy::auth::KafkaPrincipal::user("bench");
    let names: Vec<String> = (0..64).map(|i| format!("bench-{i}-x")).collect();
    let checks = 1_000_000;
    let t0 = thread_cpu();
    let mut ok = 0;
    for i in 0..checks {
        ok += a.authorize(&Request { principal: &who, host: "127.0.0.1", operation: Operation::Write, resource_type: ResourceType::Topic, name: &names[i % names.len()] }) as usize;
    }
    assert_eq!(ok, checks, "every check passes");
    (thread_cpu() - t0) * 1e9 / checks as f64
}

/// Creates `acls` through CreateAcls as the super user `admin`, in
/// requests of 10,000.
fn create_acls(addr: SocketAddr, acls: &[canopy::auth::acl::Acl]) {
    use kafka_protocol::messages::*;
    let sock = TcpStream::connect(addr).unwrap();
    let mut s = sock;
    let h: SaslHandshakeResponse = call(&mut s, 17, 1, &SaslHandshakeRequest::default().with_mechanism(kafka_protocol::protocol::StrBytes::from_static_str("PLAIN")));
    assert_eq!(h.error_code, 0);
    let a: SaslAuthenticateResponse = call(&mut s, 36, 2, &SaslAuthenticateRequest::default().with_auth_bytes(bytes::Bytes::from_static(b"\0admin\0admin-password")));
    assert_eq!(a.error_code, 0);
    let st = |v: &str| kafka_protocol::protocol::StrBytes::from_string(v.to_owned());
    for chunk in acls.chunks(10_000) {
        let creations = chunk
            .iter()
            .map(|a| {
                create_acls_request::AclCreation::default()
                    .with_resource_type(a.resource_type.code())
                    .with_resource_name(st(&a.name))
                    .with_resource_pattern_type(a.pattern.code())
                    .with_principal(st(&a.principal))
                    .with_host(st(&a.host))
                    .with_operation(a.operation.code())
                    .with_permission_type(a.permission.code())
            })
            .collect();
        let r: CreateAclsResponse = call(&mut s, 30, 3, &CreateAclsRequest::default().with_creations(creations));
        assert!(r.results.iter().all(|r| r.error_code == 0));
    }
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Produce through SASL_PLAINTEXT to a broker with the authorizer off,
/// and to one with it on holding 0, 1,000 and 100,000 ACLs.
/// Sets (or removes) a default user quota of every kind, far above any
/// load, on the broker at `addr` (whose ANONYMOUS is a super user).
fn set_unbinding_quotas(addr: &str, on: bool) {
    use kafka_protocol::messages::alter_client_quotas_request::{EntityData, EntryData, OpData};
    use kafka_protocol::messages::{AlterClientQuotasRequest, AlterClientQuotasResponse};
    let op = |k: &str, v: f64| OpData::default().with_key(kafka_protocol::protocol::StrBytes::from_string(k.into())).with_value(v).with_remove(!on);
    let entry = EntryData::default()
        .with_entity(vec![EntityData::default().with_entity_type(kafka_protocol::protocol::StrBytes::from_static_str("user")).with_entity_name(None)])
        .with_ops(vec![op("producer_byte_rate", 1e12), op("consumer_byte_rate", 1e12), op("request_percentage", 1e6)]);
    let mut s = TcpStream::connect(addr).unwrap();
    let r: AlterClientQuotasResponse = call(&mut s, 49, 1, &AlterClientQuotasRequest::default().with_entries(vec![entry]));
    assert!(r.entries.iter().all(|e| e.error_code == 0), "{r:?}");
}

fn quota_overhead(bin: &Path, perf: &Path, dir: &Path, records: u64, runs: usize) {
    let addr = format!("127.0.0.1:{}", free_ports(1)[0]);
    let broker = Broker::spawn_binary(bin, &[], &dir.join("quota-data"), &["--kafka-listener", &addr, "--flush", "always", "--super-users", "User:ANONYMOUS"]);
    let pid = broker.child.id();
    let arm = Arm { name: "PLAINTEXT", addr: addr.clone(), props: vec![] };
    perf_run(perf, pid, &arm, "quota-warm", records, true);
    // [off, on][produce, consume] -> broker s/GB
    let mut cost = [[Vec::new(), Vec::new()], [Vec::new(), Vec::new()]];
    let mut rate = [[Vec::new(), Vec::new()], [Vec::new(), Vec::new()]];
    for r in 0..runs {
        for (i, on) in [false, true].into_iter().enumerate() {
            set_unbinding_quotas(&addr, on);
            let topic = format!("quota-{r}-{i}");
            for (k, produce) in [true, false].into_iter().enumerate() {
                let (rps, b, _) = perf_run(perf, pid, &arm, &topic, records, produce);
                eprintln!("run {r}: quotas {}: {} {rps:.0} records/s, broker {b:.2} s/GB", if on { "on" } else { "off" }, if produce { "produce" } else { "consume" });
                cost[i][k].push(b);
                rate[i][k].push(rps);
            }
        }
    }
    println!("## Quotas ({runs} runs of {records} records of 100 bytes, medians; on: a default user quota of every kind that never binds)\n");
    println!("| direction | records/s off | records/s on | broker CPU s/GB off | on | on / off |\n| --- | --- | --- | --- | --- | --- |");
    for (k, d) in ["produce", "consume"].into_iter().enumerate() {
        let (r0, r1) = (median(&mut rate[0][k]), median(&mut rate[1][k]));
        let (c0, c1) = (median(&mut cost[0][k]), median(&mut cost[1][k]));
        println!("| {d} | {r0:.0} | {r1:.0} | {c0:.2} | {c1:.2} | {:.2} |", c1 / c0);
    }
    drop(broker);
}

fn authorization_end_to_end(bin: &Path, perf: &Path, dir: &Path, records: u64, runs: usize) {
    let data_off = dir.join("authz-off");
    let data_on = dir.join("authz-on");
    for d in [&data_off, &data_on] {
        for (u, pw) in [("bench", "bench-pw-file"), ("admin", "admin-pw-file")] {
            let st = Command::new(bin).args(["user", "--data-dir"]).arg(d).args(["--name", u, "--iterations", "4096", "--password-file"]).arg(dir.join(pw)).status().unwrap();
            assert!(st.success());
        }
    }
    let start = |data: &Path, authz: bool| {
        let port = free_ports(1)[0];
        let l = format!("SASL_PLAINTEXT://127.0.0.1:{port}");
        let mut extra = vec!["--listeners".to_owned(), l, "--flush".into(), "always".into(), "--kafka-listener".into(), format!("127.0.0.1:{port}"), "--super-users".into(), "User:admin".into()];
        if authz {
            extra.push("--authorizer-enabled".into());
            extra.push("true".into());
        }
        let extra: Vec<&str> = extra.iter().map(String::as_str).collect();
        (Broker::spawn_binary(bin, &[], data, &extra), format!("127.0.0.1:{port}"))
    };
    let arm = |addr: &str| Arm {
        name: "bench",
        addr: addr.to_owned(),
        props: vec!["security.protocol=SASL_PLAINTEXT".into(), "sasl.mechanisms=PLAIN".into(), "sasl.username=bench".into(), "sasl.password=bench-password".into()],
    };
    let (off, off_addr) = start(&data_off, false);
    let (on, on_addr) = start(&data_on, true);
    // bench's own branch: `bench` prefixed, everything.
    create_acls(on_addr.parse().unwrap(), &acls(0)[..]);
    let (a_off, a_on) = (arm(&off_addr), arm(&on_addr));
    // A full-size run on each first: a fresh broker's first run touches
    // its tip and buffers for the first time and costs more.
    perf_run(perf, off.child.id(), &a_off, "bench-warm", records, true);
    perf_run(perf, on.child.id(), &a_on, "bench-warm", records, true);
    let mut rows: Vec<(String, Vec<f64>, Vec<f64>)> = Vec::new();
    let mut added = 0usize;
    for target in [0usize, 1_000, 100_000] {
        let all = acls(target);
        create_acls(on_addr.parse().unwrap(), &all[added..target]);
        added = target;
        let (mut base, mut cost) = (Vec::new(), Vec::new());
        for r in 0..runs {
            base.push(perf_run(perf, off.child.id(), &a_off, &format!("bench-{target}-{r}"), records, true).1);
            cost.push(perf_run(perf, on.child.id(), &a_on, &format!("bench-{target}-{r}"), records, true).1);
        }
        rows.push((format!("{target}"), base, cost));
    }
    println!("\n| ACLs (authorizer on) | broker CPU s/GB, authorizer off | authorizer on | on / off |\n| --- | --- | --- | --- |");
    for (n, mut base, mut cost) in rows {
        let (b, c) = (median(&mut base), median(&mut cost));
        println!("| {n} | {b:.3} | {c:.3} | {:.3} |", c / b);
    }
    println!();
    drop((off, on));
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let opt = |name: &str| args.iter().position(|a| a == name).map(|i| args[i + 1].clone());
    let runs: usize = opt("--runs").map_or(3, |v| v.parse().unwrap());
    let records: u64 = opt("--records").map_or(5_000_000, |v| v.parse().unwrap());
    let auth_secs: f64 = opt("--auth-secs").map_or(10.0, |v| v.parse().unwrap());
    // `--only throughput|authorization|authentication`: one section.
    let only = opt("--only");
    let run_section = |name: &str| only.as_deref().is_none_or(|o| o == name);

    let dir = tempfile::tempdir_in(env!("CARGO_MANIFEST_DIR")).unwrap();
    let data = dir.path().join("data");
    // A CA and a server certificate for 127.0.0.1.
    let ca_key = rcgen::KeyPair::generate().unwrap();
    let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    // Distinct names: a certificate whose issuer is its own subject reads
    // as self-signed.
    ca_params.distinguished_name.push(rcgen::DnType::CommonName, "canopy bench CA");
    let ca = ca_params.self_signed(&ca_key).unwrap();
    let key = rcgen::KeyPair::generate().unwrap();
    let mut server_params = rcgen::CertificateParams::new(vec!["127.0.0.1".to_owned()]).unwrap();
    server_params.distinguished_name.push(rcgen::DnType::CommonName, "canopy bench broker");
    let server = server_params.signed_by(&key, &ca, &ca_key).unwrap();
    let (ca_pem, cert_pem, key_pem) = (dir.path().join("ca.pem"), dir.path().join("server.pem"), dir.path().join("server.key"));
    std::fs::write(&ca_pem, ca.pem()).unwrap();
    std::fs::write(&cert_pem, server.pem()).unwrap();
    std::fs::write(&key_pem, key.serialize_pem()).unwrap();
    let bin = PathBuf::from(env!("CARGO_BIN_EXE_canopy"));
    std::fs::write(dir.path().join("pw"), "bench-password\n").unwrap();
    std::fs::write(dir.path().join("bench-pw-file"), "bench-password\n").unwrap();
    std::fs::write(dir.path().join("admin-pw-file"), "admin-password\n").unwrap();
    let st = Command::new(&bin).args(["user", "--data-dir"]).arg(&data).args(["--name", "bench", "--iterations", "4096", "--password-file"]).arg(dir.path().join("pw")).status().unwrap();
    assert!(st.success());

    let ports = free_ports(3);
    let (plain, sasl, sasl_ssl) = (format!("127.0.0.1:{}", ports[0]), format!("127.0.0.1:{}", ports[1]), format!("127.0.0.1:{}", ports[2]));
    let perf = perf_tool::perf_tool();
    if run_section("quotas") {
        quota_overhead(&bin, &perf, dir.path(), records, runs);
    }
    if run_section("authorization") {
        println!("## Authorization\n\n| ACLs | ns per check (in-process) |\n| --- | --- |");
        for n in [0, 1_000, 100_000] {
            println!("| {n} | {:.0} |", check_cost(n));
        }
        authorization_end_to_end(&bin, &perf, dir.path(), records, runs);
    }
    let listeners = format!("PLAINTEXT://{plain},SASL_PLAINTEXT://{sasl},SASL_SSL://{sasl_ssl}");
    let broker = Broker::spawn_binary(
        &bin,
        &[],
        &data,
        &["--listeners", &listeners, "--ssl-cert-file", cert_pem.to_str().unwrap(), "--ssl-key-file", key_pem.to_str().unwrap(), "--flush", "always", "--kafka-listener", &plain],
    );
    let pid = broker.child.id();
    let scram = |addr: &str, tls: bool| {
        let mut p = vec!["sasl.mechanisms=SCRAM-SHA-512".to_owned(), "sasl.username=bench".to_owned(), "sasl.password=bench-password".to_owned()];
        p.push(format!("security.protocol={}", if tls { "SASL_SSL" } else { "SASL_PLAINTEXT" }));
        if tls {
            p.push(format!("ssl.ca.location={}", ca_pem.display()));
        }
        Arm { name: if tls { "SASL_SSL, SCRAM-SHA-512" } else { "SASL_PLAINTEXT, SCRAM-SHA-512" }, addr: addr.to_owned(), props: p }
    };
    let arms = [Arm { name: "PLAINTEXT", addr: plain.clone(), props: vec![] }, scram(&sasl, false), scram(&sasl_ssl, true)];
    if run_section("throughput") {
        throughput(&perf, pid, &arms, records, runs);
    }
    if run_section("authentication") {
        authentications(pid, &ca_pem, &sasl, &sasl_ssl, auth_secs);
    }
    drop(broker);
}

fn throughput(perf: &Path, pid: u32, arms: &[Arm], records: u64, runs: usize) {
    for arm in arms {
        // Topics are auto-created by a short first run on each listener.
        perf_run(perf, pid, arm, &format!("warm-{}", arm.addr.replace([':', '.'], "-")), 1000, true);
    }
    // [arm][produce, consume] -> (rates, broker s/GB, client s/GB)
    let mut got = vec![[(Vec::new(), Vec::new(), Vec::new()), (Vec::new(), Vec::new(), Vec::new())]; arms.len()];
    for r in 0..runs {
        for (i, arm) in arms.iter().enumerate() {
            let topic = format!("bench-{r}-{i}");
            for (k, produce) in [true, false].into_iter().enumerate() {
                let (rate, broker_cost, client_cost) = perf_run(perf, pid, arm, &topic, records, produce);
                eprintln!("run {r}: {} {}: {rate:.0} records/s, broker {broker_cost:.2} s/GB, client {client_cost:.2} s/GB", arm.name, if produce { "produce" } else { "consume" });
                got[i][k].0.push(rate);
                got[i][k].1.push(broker_cost);
                got[i][k].2.push(client_cost);
            }
        }
    }
    println!("## Throughput ({runs} runs of {records} records of 100 bytes per listener, medians)\n");
    println!("| listener | direction | records/s | MB/s | vs PLAINTEXT | broker CPU s/GB | client CPU s/GB |\n| --- | --- | --- | --- | --- | --- | --- |");
    let base: Vec<f64> = (0..2).map(|k| median(&mut got[0][k].0.clone())).collect();
    for (i, arm) in arms.iter().enumerate() {
        for (k, dir) in ["produce", "consume"].into_iter().enumerate() {
            let (rate, b, c) = (median(&mut got[i][k].0), median(&mut got[i][k].1), median(&mut got[i][k].2));
            println!("| {} | {dir} | {rate:.0} | {:.1} | {:.2} | {b:.2} | {c:.2} |", arm.name, rate * 100.0 / 1e6, rate / base[k]);
        }
    }
    let floor = cipher_floor();
    println!("\nAES-256-GCM alone, 16 KiB records, this thread: {floor:.2} CPU s/GB\n");
}

fn authentications(pid: u32, ca_pem: &Path, sasl: &str, sasl_ssl: &str, auth_secs: f64) {
    let tls_client = {
        use rustls_pki_types::pem::PemObject;
        let mut roots = rustls::RootCertStore::empty();
        roots.add(rustls_pki_types::CertificateDer::from_pem_file(ca_pem).unwrap()).unwrap();
        let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
        std::sync::Arc::new(rustls::ClientConfig::builder_with_provider(provider).with_safe_default_protocol_versions().unwrap().with_root_certificates(roots).with_no_client_auth())
    };
    println!("## Authentications ({auth_secs} s each, two client threads, a new connection each)\n\n| listener | mechanism | authentications/s | broker CPU ms each |\n| --- | --- | --- | --- |");
    for (name, addr, mech, tls) in [
        ("SASL_PLAINTEXT", sasl, "SCRAM-SHA-512", None),
        ("SASL_PLAINTEXT", sasl, "PLAIN", None),
        ("SASL_SSL", sasl_ssl, "SCRAM-SHA-512", Some(tls_client.clone())),
    ] {
        let (rate, ms) = auth_rate(pid, addr.parse().unwrap(), mech, tls, auth_secs);
        println!("| {name} | {mech} | {rate:.0} | {ms:.2} |");
    }
}
