//! Key compaction (cleaning) of a keyed topic, and what it costs a busy
//! unkeyed sibling in the same branch, in one run:
//!
//! ```text
//! cargo bench --bench cleaning                        # 1 GiB over 10,000 keys
//! cargo bench --bench cleaning -- --bytes 256m --keys 1000 --rate 0
//! ```
//!
//! 1. `--bytes` of updates (16 records of 1 KiB per batch, keys uniform
//!    over `--keys`) go through `Storage` into 64 MiB branch segments, and
//!    the window compactor makes them the keyed topic's own stores.
//! 2. Read amplification before: bytes a consumer reads from offset 0 to
//!    the end, over the bytes of the latest record of each key.
//! 3. The sibling alone: appends 16 KiB batches, 64 at a time made
//!    durable (fsync) and read back (produce and fetch through the tip),
//!    for `--seconds`: MB/s.
//! 4. The cleaning, with the sibling's load running beside it the whole
//!    time (the writer shared as the engine's writer thread would be):
//!    cleaning MB/s of input and CPU seconds per GB; the sibling's MB/s
//!    over the same time, as a ratio of step 3's.
//! 5. Read amplification after, and the sibling alone once more.
//!
//! `--rate` is the maintenance throttle in bytes per second (the broker's
//! `compaction_bytes_per_sec`, 100 MiB/s by default; 0: none).

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use canopy::protocol::batch::{self, NewRecord};
use canopy::storage::subtree::split::{Budget, Strategy};
use canopy::storage::{CleanConfig, CleanPolicy, CompactConfig, LogWriter, PartitionSpec, Storage, StorageConfig, TopicView, Tp};

const KEYED: Tp = Tp { topic: [1; 16], partition: 0 };
const SIBLING: Tp = Tp { topic: [2; 16], partition: 0 };

struct Args {
    bytes: u64,
    keys: u64,
    seconds: f64,
    rate: u64,
    dir: PathBuf,
}

fn size(s: &str) -> u64 {
    let (n, m) = match s.chars().last() {
        Some('k') => (&s[..s.len() - 1], 1 << 10),
        Some('m') => (&s[..s.len() - 1], 1 << 20),
        Some('g') => (&s[..s.len() - 1], 1 << 30),
        _ => (s, 1),
    };
    n.parse::<u64>().expect("a size") * m
}

fn args() -> Args {
    let mut a = Args { bytes: 1 << 30, keys: 10_000, seconds: 5.0, rate: 100 << 20, dir: PathBuf::from("target/bench-cleaning") };
    let v: Vec<String> = std::env::args().skip(1).filter(|x| x != "--bench").collect();
    let mut i = 0;
    while i + 1 < v.len() {
        match v[i].as_str() {
            "--bytes" => a.bytes = size(&v[i + 1]),
            "--keys" => a.keys = v[i + 1].parse().unwrap(),
            "--seconds" => a.seconds = v[i + 1].parse().unwrap(),
            "--rate" => a.rate = size(&v[i + 1]),
            "--dir" => a.dir = PathBuf::from(&v[i + 1]),
            other => panic!("unknown argument {other}"),
        }
        i += 2;
    }
    a
}

fn cpu_seconds() -> f64 {
    let mut u = std::mem::MaybeUninit::<libc::rusage>::uninit();
    // SAFETY: getrusage fills the struct it is given.
    let u = unsafe {
        libc::getrusage(libc::RUSAGE_SELF, u.as_mut_ptr());
        u.assume_init()
    };
    let t = |v: libc::timeval| v.tv_sec as f64 + v.tv_usec as f64 / 1e6;
    t(u.ru_utime) + t(u.ru_stime)
}

/// Bytes read from offset 0 to the end of the keyed topic.
fn read_all(s: &Storage) -> u64 {
    let mut offset = 0;
    let mut bytes = 0;
    loop {
        let r = s.read(&KEYED, offset, 1 << 20, true).unwrap();
        if r.records.is_empty() {
            return bytes;
        }
        bytes += r.records.iter().map(|b| b.len() as u64).sum::<u64>();
        offset = r.next_offset;
    }
}

/// The sibling's load until `stop` (or `seconds`): append 16 KiB batches,
/// read each 64 back. Returns MB/s of produce plus fetch.
fn sibling_load(s: &Storage, w: &Mutex<LogWriter>, seconds: f64, stop: Option<&AtomicBool>) -> f64 {
    let value = vec![b's'; 1024];
    let records: Vec<NewRecord<'_>> = (0..16).map(|_| NewRecord { key: None, value: Some(&value), headers: Vec::new() }).collect();
    let b = batch::build(&records, 1);
    let start = Instant::now();
    let mut moved = 0u64;
    let mut from = s.offsets(&SIBLING).unwrap().1;
    loop {
        if stop.map_or(start.elapsed().as_secs_f64() >= seconds, |s| s.load(Ordering::Acquire)) {
            break;
        }
        {
            let mut w = w.lock().unwrap();
            for _ in 0..64 {
                w.append(SIBLING, &b, 1, false).unwrap();
            }
            // Durable before it is visible, as the broker acknowledges.
            let f = w.flush().unwrap();
            s.sync().unwrap();
            s.publish_hw(&f);
        }
        moved += 64 * b.len() as u64;
        loop {
            let r = s.read(&SIBLING, from, 1 << 20, true).unwrap();
            if r.records.is_empty() {
                break;
            }
            moved += r.records.iter().map(|x| x.len() as u64).sum::<u64>();
            from = r.next_offset;
        }
    }
    moved as f64 / 1e6 / start.elapsed().as_secs_f64()
}

fn main() {
    let a = args();
    let _ = std::fs::remove_dir_all(&a.dir);
    let specs = vec![
        PartitionSpec { tp: KEYED, branch: "kv.app".into(), log_start: 0 },
        PartitionSpec { tp: SIBLING, branch: "kv.app".into(), log_start: 0 },
    ];
    let cfg = StorageConfig { segment_bytes: 64 << 20, segment_ms: 3_600_000, tip: canopy::storage::tip::TipConfig { bytes: 64 << 20, ..Default::default() }, ..StorageConfig::default() };
    let (s, mut w) = Storage::open_with(&a.dir, cfg, specs, true, Some(&[][..])).unwrap();

    // 1. The updates.
    let mut rng = 0x2545F4914F6CDD1Du64;
    let value = vec![b'v'; 1000];
    let started = Instant::now();
    let mut written = 0u64;
    let mut n = 0u64;
    while written < a.bytes {
        let keys: Vec<Vec<u8>> = (0..16)
            .map(|_| {
                rng ^= rng << 13;
                rng ^= rng >> 7;
                rng ^= rng << 17;
                format!("key-{:08}", rng % a.keys).into_bytes()
            })
            .collect();
        let records: Vec<NewRecord<'_>> = keys.iter().map(|k| NewRecord { key: Some(k), value: Some(&value), headers: Vec::new() }).collect();
        let b = batch::build(&records, n as i64);
        w.append(KEYED, &b, 1, false).unwrap();
        written += b.len() as u64;
        n += 1;
        if n.is_multiple_of(256) {
            let f = w.flush().unwrap();
            s.publish_hw(&f);
        }
    }
    let f = w.flush().unwrap();
    s.sync().unwrap();
    s.publish_hw(&f);
    // Roll the last keyed segment: the sibling fills the branch.
    let filler = batch::build(&[NewRecord { key: None, value: Some(&vec![b'f'; 60_000]), headers: Vec::new() }], 1);
    for _ in 0..(64 << 20) / filler.len() + 2 {
        w.append(SIBLING, &filler, 1, false).unwrap();
    }
    let f = w.flush().unwrap();
    s.sync().unwrap();
    s.publish_hw(&f);
    let view = |id: &[u8; 16]| Some(TopicView { name: if id[0] == 1 { "kv.app.state".into() } else { "kv.app.events".into() }, keyed: id[0] == 1 });
    let ccfg = CompactConfig { lag_ms: 0, strategy: Strategy::Adaptive(Budget { max_stores: None, min_store_bytes: 64 << 20 }), max_bytes: u64::MAX };
    while s.compact(i64::MAX / 2, &ccfg, view, &mut |_| true, |_| Ok(()), &mut |sw| w.apply(sw)).unwrap().is_some() {}
    println!("wrote {:.0} MB of updates over {} keys in {:.1} s; {} stores", written as f64 / 1e6, a.keys, started.elapsed().as_secs_f64(), s.store_count());

    // 2. Read amplification before.
    let latest_bytes = |s: &Storage| -> u64 {
        // One record of a key: its share of a 16-record batch.
        let _ = s;
        a.keys.min(n * 16) * (written / (n * 16))
    };
    let before = read_all(&s);
    println!("read amplification before: {:.1}x ({:.0} MB read for {:.1} MB of latest values)", before as f64 / latest_bytes(&s) as f64, before as f64 / 1e6, latest_bytes(&s) as f64 / 1e6);

    // 3. The sibling alone.
    let w = Mutex::new(w);
    let alone = sibling_load(&s, &w, a.seconds, None);
    println!("sibling alone: {alone:.0} MB/s (produce + fetch)");

    // 4. The cleaning beside the sibling's load.
    let policy = |id: &[u8; 16]| (id[0] == 1).then_some(CleanPolicy { min_cleanable_dirty_ratio: 0.0, ..CleanPolicy::default() });
    let stop = Arc::new(AtomicBool::new(false));
    let rate = a.rate;
    let (cleaned, beside) = std::thread::scope(|scope| {
        let load = scope.spawn(|| sibling_load(&s, &w, 0.0, Some(&stop)));
        let cpu0 = cpu_seconds();
        let t0 = Instant::now();
        let mut read = 0u64;
        let mut throttle = |bytes: u64| {
            read += bytes;
            if rate > 0 {
                let due = Duration::from_secs_f64(read as f64 / rate as f64);
                if let Some(wait) = due.checked_sub(t0.elapsed()) {
                    std::thread::sleep(wait);
                }
            }
            true
        };
        let done = s.clean(i64::MAX / 2, &CleanConfig::default(), policy, &mut throttle, |_| Ok(()), &mut |sw| w.lock().unwrap().apply(sw)).unwrap().expect("the keyed topic is due");
        let secs = t0.elapsed().as_secs_f64();
        // CPU of both threads: the sibling's share is measured alone below.
        let cpu = cpu_seconds() - cpu0;
        stop.store(true, Ordering::Release);
        (( done, secs, cpu), load.join().unwrap())
    });
    let (done, secs, cpu) = cleaned;
    println!(
        "cleaning: {:.0} MB in, {:.1} MB out, {} → {} records in {:.1} s: {:.0} MB/s of input; process CPU {:.1} s ({:.2} s per GB of input, the sibling's load included)",
        done.bytes_in as f64 / 1e6,
        done.bytes_out as f64 / 1e6,
        done.records_in,
        done.records_out,
        secs,
        done.bytes_in as f64 / 1e6 / secs,
        cpu,
        cpu / (done.bytes_in as f64 / 1e9),
    );
    println!("sibling beside the cleaning: {beside:.0} MB/s = {:.1}% of alone", 100.0 * beside / alone);

    // 5. After.
    let after = read_all(&s);
    println!("read amplification after: {:.2}x ({:.1} MB read)", after as f64 / latest_bytes(&s) as f64, after as f64 / 1e6);
    let again = sibling_load(&s, &w, a.seconds, None);
    println!("sibling alone again: {again:.0} MB/s; beside the cleaning = {:.1}% of the mean alone", 100.0 * beside / ((alone + again) / 2.0));
    let _ = std::fs::remove_dir_all(&a.dir);
}
