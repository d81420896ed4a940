//! What a produced byte costs the broker, in CPU seconds per GB, against
//! the floor of what it must cost.
//!
//! ```text
//! cargo bench --bench produce_cost                      # 5 runs of 20M records each way
//! cargo bench --bench produce_cost -- --runs 3 --records 5000000
//! cargo bench --bench produce_cost -- --baseline BIN    # also another build's release canopy
//! ```
//!
//! **The floor**, measured first on this process's own thread (its CPU
//! time from `/proc/thread-self/schedstat`, in nanoseconds), per GB of
//! produced batches: reading them from a loopback socket, CRC-32C over
//! them (the batch checksum a broker must verify), one copy (into the
//! tip), and writing them into the page cache of a segment file with an
//! fdatasync every 16 MiB, each synced range dropped at once (the broker
//! keeps a window of them, so this is the cheapest its writes can be), and
//! every page kept, as Kafka keeps them.
//!
//! **The broker**: librdkafka's own `rdkafka_performance` (built here from
//! the librdkafka sources the `rdkafka-sys` crate vendors, against the
//! static library it built) produces `--records` 100-byte records, acks=1,
//! to one partition of a release broker child (`--flush always`); the
//! broker's utime+stime around the run, per GB of record values: a first
//! run on a fresh broker, whose tip and buffers are touched for the first
//! time, and a second right after (the steady state); then a consumer
//! reads both from the beginning. The arms alternate: this build with its
//! default page-cache window (1 GiB of synced segment bytes) and with
//! `--page-cache-bytes=-1` (every page kept, as Kafka keeps them), and the
//! baseline build if given, each on a fresh data directory.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

#[path = "../tests/it/common.rs"]
mod common;
#[path = "support/perf_tool.rs"]
mod perf_tool;

use perf_tool::perf_tool;

use common::ChildBroker as Broker;

/// This thread's CPU time, in seconds (schedstat: nanoseconds on CPU).
fn thread_cpu() -> f64 {
    let s = std::fs::read_to_string("/proc/thread-self/schedstat").expect("schedstat");
    s.split_whitespace().next().unwrap().parse::<f64>().unwrap() / 1e9
}

/// CPU seconds (user + system) of a process, from /proc (clock ticks).
fn process_cpu(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("proc stat");
    let after = &stat[stat.rfind(')').unwrap() + 2..];
    let f: Vec<&str> = after.split(' ').collect();
    (f[11].parse::<f64>().unwrap() + f[12].parse::<f64>().unwrap()) / 100.0
}

const CHUNK: usize = 1 << 20;

/// Seconds per GB of `f` run over `gb` GB in 1 MiB chunks.
fn per_gb(gb: f64, mut f: impl FnMut(usize)) -> f64 {
    let chunks = (gb * 1e9 / CHUNK as f64) as usize;
    let t0 = thread_cpu();
    for i in 0..chunks {
        f(i);
    }
    (thread_cpu() - t0) / (chunks as f64 * CHUNK as f64 / 1e9)
}

fn floor(dir: &Path) -> Vec<(&'static str, f64)> {
    use std::io::{Read, Write};
    use std::os::unix::fs::FileExt;
    let gb = 2.0;
    let data: Vec<u8> = (0..CHUNK).map(|i| (i * 31 % 251) as u8).collect();
    let mut out = Vec::new();

    // The socket read: a writer thread sends, this thread receives.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let total = (gb * 1e9) as usize;
    let sender = std::thread::spawn(move || {
        let mut s = std::net::TcpStream::connect(addr).unwrap();
        let chunk = vec![7u8; CHUNK];
        let mut sent = 0;
        while sent < total {
            s.write_all(&chunk).unwrap();
            sent += CHUNK;
        }
    });
    let (mut conn, _) = listener.accept().unwrap();
    let mut buf = vec![0u8; CHUNK];
    let t0 = thread_cpu();
    let mut got = 0usize;
    while got < total {
        match conn.read(&mut buf).unwrap() {
            0 => break,
            n => got += n,
        }
    }
    out.push(("socket read", (thread_cpu() - t0) / (got as f64 / 1e9)));
    sender.join().unwrap();

    let mut sum = 0u32;
    out.push(("CRC-32C", per_gb(gb, |_| sum = sum.wrapping_add(crc32c::crc32c(&data)))));
    std::hint::black_box(sum);

    // One copy into memory that stays resident (a ring as large as the tip).
    let mut ring = vec![0u8; 256 << 20];
    let slots = ring.len() / CHUNK;
    out.push(("copy into the tip", per_gb(gb, |i| ring[(i % slots) * CHUNK..][..CHUNK].copy_from_slice(&data))));
    std::hint::black_box(&ring);

    for (name, drop) in [("page cache write, synced pages dropped", true), ("page cache write, pages kept", false)] {
        let path = dir.join(format!("floor-{drop}.seg"));
        let f = std::fs::File::create(&path).unwrap();
        let per_sync = 16;
        let mut dropped = 0u64;
        let cost = per_gb(gb, |i| {
            f.write_all_at(&data, (i * CHUNK) as u64).unwrap();
            if (i + 1) % per_sync == 0 {
                f.sync_data().unwrap();
                if drop {
                    let end = ((i + 1) * CHUNK) as u64;
                    let _ = rustix::fs::fadvise(&f, dropped, std::num::NonZeroU64::new(end - dropped), rustix::fs::Advice::DontNeed);
                    dropped = end;
                }
            }
        });
        out.push((name, cost));
        drop_file(&path);
    }
    out
}

fn drop_file(path: &Path) {
    let _ = std::fs::remove_file(path);
}

/// One broker: (broker CPU s/GB of values, records/s) of a first run on
/// a fresh broker (its tip and buffers are touched for the first time), of
/// a second run right after it (steady state), and of a consumer reading
/// both from the beginning (the tip holds only the last 256 MiB: the rest
/// comes from the segments, through the page cache or from the disk).
fn run(bin: &Path, extra: &[&str], perf: &Path, records: u64) -> [(f64, f64); 3] {
    let dir = tempfile::tempdir_in(env!("CARGO_MANIFEST_DIR")).unwrap();
    let broker = Broker::spawn_binary(bin, &[], dir.path(), &[&["--flush", "always"][..], extra].concat());
    let addr = broker.kafka.to_string();
    let produce = |n: u64| {
        let st = Command::new(perf)
            .args(["-P", "-t", "perf", "-p", "0", "-s", "100", "-c", &n.to_string(), "-b", &addr, "-X", "acks=1", "-X", "linger.ms=5", "-q"])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status()
            .expect("rdkafka_performance");
        assert!(st.success(), "rdkafka_performance failed");
    };
    // The topic is auto-created by a short first run.
    produce(1000);
    let pid = broker.child.id();
    let mut out = [(0.0, 0.0); 3];
    for o in &mut out[..2] {
        let (c0, t0) = (process_cpu(pid), Instant::now());
        produce(records);
        let (c1, secs) = (process_cpu(pid), t0.elapsed().as_secs_f64());
        *o = ((c1 - c0) / (records as f64 * 100.0 / 1e9), records as f64 / secs);
    }
    let all = 2 * records;
    let (c0, t0) = (process_cpu(pid), Instant::now());
    let st = Command::new(perf)
        .args(["-C", "-t", "perf", "-p", "0", "-o", "beginning", "-c", &all.to_string(), "-b", &addr, "-q"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .expect("rdkafka_performance");
    assert!(st.success(), "rdkafka_performance -C failed");
    let (c1, secs) = (process_cpu(pid), t0.elapsed().as_secs_f64());
    out[2] = ((c1 - c0) / (all as f64 * 100.0 / 1e9), all as f64 / secs);
    out
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let opt = |name: &str| args.iter().position(|a| a == name).map(|i| args[i + 1].clone());
    let runs: usize = opt("--runs").map_or(5, |v| v.parse().unwrap());
    let records: u64 = opt("--records").map_or(20_000_000, |v| v.parse().unwrap());
    let baseline = opt("--baseline").map(PathBuf::from);

    let scratch = tempfile::tempdir_in(env!("CARGO_MANIFEST_DIR")).unwrap();
    println!("## The floor (this thread's CPU per GB)\n\n| step | s/GB |\n| --- | --- |");
    let fl = floor(scratch.path());
    for (name, cost) in &fl {
        println!("| {name} | {cost:.3} |");
    }
    let floor_dropped: f64 = fl.iter().filter(|(n, _)| !n.ends_with("kept")).map(|(_, c)| c).sum();
    println!("| **the floor: sum, synced pages dropped** | **{floor_dropped:.3}** |\n");

    let perf = perf_tool();
    let this = PathBuf::from(env!("CARGO_BIN_EXE_canopy"));
    let mut arms: Vec<(String, PathBuf, Vec<&str>)> =
        vec![("this build (page cache window 1 GiB)".into(), this.clone(), vec![]), ("this build, every page kept (as Kafka)".into(), this, vec!["--page-cache-bytes=-1"])];
    if let Some(b) = baseline {
        arms.push((format!("baseline {}", b.display()), b, vec![]));
    }
    // Per arm: [first run, second run, consume] x (costs, rates).
    const RUNS: [&str; 3] = ["produce, fresh broker", "produce, second run", "consume both from the beginning"];
    let mut results = vec![[(Vec::new(), Vec::new()), (Vec::new(), Vec::new()), (Vec::new(), Vec::new())]; arms.len()];
    for r in 0..runs {
        for (i, (name, bin, extra)) in arms.iter().enumerate() {
            let got = run(bin, extra, &perf, records);
            for (k, (cost, rate)) in got.into_iter().enumerate() {
                eprintln!("run {r}: {name}, {}: {cost:.2} s/GB, {rate:.0} records/s", RUNS[k]);
                results[i][k].0.push(cost);
                results[i][k].1.push(rate);
            }
        }
    }
    println!("## The broker: rdkafka_performance, {records} x 100 B, acks=1, one partition, {runs} brokers per arm\n");
    println!("| arm | run | broker CPU s/GB, each | median | median / floor | records/s, median |\n| --- | --- | --- | --- | --- | --- |");
    for ((name, _, _), per_run) in arms.iter().zip(results.iter_mut()) {
        for (k, (costs, rates)) in per_run.iter_mut().enumerate() {
            let each = costs.iter().map(|c| format!("{c:.2}")).collect::<Vec<_>>().join(", ");
            let m = median(costs);
            let ratio = if k < 2 { format!("{:.1}x", m / floor_dropped) } else { "—".into() };
            println!("| {name} | {} | {each} | {m:.2} | {ratio} | {:.0} |", RUNS[k], median(rates));
        }
    }
}
