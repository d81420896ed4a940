//! Group-commit rounds per second with many idle branches present: what one
//! round (append one small batch, flush, sync, publish) costs in CPU when
//! the broker also holds `--idle` branches that are not written.
//!
//! ```text
//! cargo bench --bench rounds                      # 10 and 100,000 idle branches
//! cargo bench --bench rounds -- --idle 100000 --secs 5
//! ```
//!
//! The data directory is on tmpfs (`/dev/shm`) when there is one, so fsync
//! is nearly free and what is measured is the broker's own work per round,
//! the part that grows with the branch count if anything on the round's
//! path is linear in it. Each idle branch holds one segment with one batch,
//! synced before the measurement starts.

use std::time::{Duration, Instant};

use canopy::protocol::batch::{self, NewRecord};
use canopy::storage::{PartitionSpec, Storage, StorageConfig, Tp};

fn tp(n: u64) -> Tp {
    let mut topic = [0u8; 16];
    topic[8..].copy_from_slice(&n.to_be_bytes());
    Tp { topic, partition: 0 }
}

fn rounds(idle: u64, secs: f64) -> (f64, Duration) {
    let dir = match std::path::Path::new("/dev/shm").is_dir() {
        true => tempfile::tempdir_in("/dev/shm").expect("a directory on tmpfs"),
        false => tempfile::tempdir().expect("a temporary directory"),
    };
    let mut specs: Vec<PartitionSpec> = (0..idle).map(|i| PartitionSpec { tp: tp(i + 1), branch: format!("idle{i}.b"), log_start: 0 }).collect();
    specs.push(PartitionSpec { tp: tp(0), branch: "hot.b".into(), log_start: 0 });
    let cfg = StorageConfig { max_open_files: 1024, ..StorageConfig::default() };
    let (s, mut w) = Storage::open(dir.path(), cfg, specs, false).expect("open storage");
    let value = [7u8; 100];
    let one = batch::build(&[NewRecord { value: Some(&value), ..Default::default() }], 0);
    let setup = Instant::now();
    for i in 0..idle {
        w.append(tp(i + 1), &one, 0, false).expect("append");
        if i % 1000 == 999 {
            let f = w.flush().expect("flush");
            s.sync().expect("sync");
            s.publish_hw(&f);
        }
    }
    let f = w.flush().expect("flush");
    s.sync().expect("sync");
    s.publish_hw(&f);
    let setup = setup.elapsed();
    let start = Instant::now();
    let mut n = 0u64;
    while start.elapsed().as_secs_f64() < secs {
        for _ in 0..100 {
            w.append(tp(0), &one, 0, false).expect("append");
            let f = w.flush().expect("flush");
            s.sync().expect("sync");
            s.publish_hw(&f);
        }
        n += 100;
    }
    (n as f64 / start.elapsed().as_secs_f64(), setup)
}

fn main() {
    let mut args = std::env::args().skip(1);
    let (mut idle, mut secs): (Option<u64>, f64) = (None, 3.0);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--idle" => idle = Some(args.next().and_then(|v| v.parse().ok()).expect("--idle N")),
            "--secs" => secs = args.next().and_then(|v| v.parse().ok()).expect("--secs S"),
            // cargo bench passes --bench.
            _ => {}
        }
    }
    let counts = match idle {
        Some(n) => vec![n],
        None => vec![10, 100_000],
    };
    let mut first = None;
    for n in counts {
        let (rate, setup) = rounds(n, secs);
        let base = *first.get_or_insert(rate);
        println!("{n:>7} idle branches: {rate:>9.0} rounds/s ({:.2} of the first), setup {:.1} s", rate / base, setup.as_secs_f64());
    }
}
