//! Adaptive subtree compaction vs prefix3 vs uncompacted branch logs, on one
//! generated workload, in the same run:
//!
//! ```text
//! cargo bench --bench compaction                       # 20,000 topics, 2 GiB
//! cargo bench --bench compaction -- --topics 100000 --bytes 4g
//! ```
//!
//! The generator (deterministic for a `--seed`) makes a four-to-five level
//! topic tree (`o3.a7.s2.t11[.u4]`) and gives topics Zipf-skewed volumes (a
//! few of hundreds of MB next to siblings of KB), written as 16 KiB batches
//! in random interleaving, like a broker-wide stream. The data goes through
//! `Storage` into 64 MiB branch-log segments; the directory is copied twice
//! and one copy compacted with prefix3, the other with the adaptive split
//! given prefix3's store count as its budget.
//!
//! For each layout: the four numbers of its plan (for the branch logs, the
//! "plan" is one store per branch), then measured initial recoveries: (a)
//! a small topic beside a huge sibling (among the ten biggest topics, the
//! sibling closest to 1/200 of its size), read from offset 0 with the page
//! cache dropped for the data files (posix_fadvise DONTNEED), and (b) every
//! topic in turn, warm: bytes read from files and time.

use std::collections::HashMap;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::time::Instant;

use canopy::protocol::batch::{self, NewRecord};
use canopy::storage::subtree::report::Report;
use canopy::storage::subtree::split::{self, Budget, Plan, Strategy};
use canopy::storage::{branch_of, CompactConfig, PartitionSpec, Storage, StorageConfig, Tp};

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        // splitmix64
        self.0 = self.0.wrapping_add(0x9E3779B97F4A7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58476D1CE4E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D049BB133111EB);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

struct Args {
    topics: usize,
    bytes: u64,
    seed: u64,
    zipf: f64,
    dir: PathBuf,
    html: Option<PathBuf>,
}

fn args() -> Args {
    let mut a = Args { topics: 20_000, bytes: 2 << 30, seed: 42, zipf: 1.1, dir: PathBuf::from("target/bench-compaction"), html: None };
    let mut it = std::env::args().skip(1);
    while let Some(k) = it.next() {
        let mut v = || it.next().unwrap_or_else(|| panic!("{k} needs a value"));
        match k.as_str() {
            "--topics" => a.topics = v().parse().unwrap(),
            "--bytes" => {
                let s = v().to_lowercase();
                a.bytes = match s.strip_suffix('g') {
                    Some(g) => (g.parse::<f64>().unwrap() * (1u64 << 30) as f64) as u64,
                    None => s.strip_suffix('m').map_or_else(|| s.parse().unwrap(), |m| m.parse::<u64>().unwrap() << 20),
                }
            }
            "--seed" => a.seed = v().parse().unwrap(),
            "--zipf" => a.zipf = v().parse().unwrap(),
            "--dir" => a.dir = v().into(),
            "--html" => a.html = Some(v().into()),
            "--bench" => {}
            _ => panic!("unknown argument {k}"),
        }
    }
    a
}

/// The topic tree: orgs, apps, services, topics, and for some topics a
/// level of sub-topics.
fn topic_names(n: usize, rng: &mut Rng) -> Vec<String> {
    let mut out = Vec::with_capacity(n);
    'outer: for o in 0.. {
        for a in 0..3 + rng.below(8) {
            for s in 0..2 + rng.below(7) {
                for t in 0..2 + rng.below(25) {
                    let name = format!("o{o}.a{a}.s{s}.t{t}");
                    if rng.below(10) < 3 {
                        for u in 0..2 + rng.below(5) {
                            out.push(format!("{name}.u{u}"));
                        }
                    } else {
                        out.push(name);
                    }
                    if out.len() >= n {
                        break 'outer;
                    }
                }
            }
        }
    }
    out.truncate(n);
    out
}

/// A v2 batch of `count` records of `len` value bytes each.
fn make_batch(count: usize, len: usize) -> Vec<u8> {
    let value = vec![b'v'; len];
    let records: Vec<NewRecord<'_>> = (0..count).map(|_| NewRecord { key: None, value: Some(&value), headers: Vec::new() }).collect();
    batch::build(&records, 1)
}

fn tp_of(i: usize) -> Tp {
    let mut topic = [0u8; 16];
    topic[..8].copy_from_slice(&(i as u64 + 1).to_le_bytes());
    Tp { topic, partition: 0 }
}

fn specs(names: &[String]) -> Vec<PartitionSpec> {
    names.iter().enumerate().map(|(i, n)| PartitionSpec { tp: tp_of(i), branch: branch_of(n).to_owned(), log_start: 0 }).collect()
}

fn storage_cfg() -> StorageConfig {
    StorageConfig { segment_bytes: 64 << 20, segment_ms: 3_600_000, tip: canopy::storage::tip::TipConfig { bytes: 0, ..Default::default() }, ..StorageConfig::default() }
}

const BATCH_RECORDS: usize = 16;
const RECORD: usize = 1000;

/// Writes the workload; returns each topic's bytes (as frames on disk).
fn generate(dir: &Path, names: &[String], a: &Args, rng: &mut Rng) -> Vec<u64> {
    // Zipf volumes over a random ranking.
    let mut rank: Vec<usize> = (0..names.len()).collect();
    for i in (1..rank.len()).rev() {
        rank.swap(i, rng.below(i as u64 + 1) as usize);
    }
    let weights: Vec<f64> = rank.iter().map(|&r| 1.0 / ((r + 1) as f64).powf(a.zipf)).collect();
    let sum: f64 = weights.iter().sum();
    let full = make_batch(BATCH_RECORDS, RECORD);
    let mut small: HashMap<usize, Vec<u8>> = HashMap::new();
    // Every batch of every topic, in a random interleaving.
    let mut plan: Vec<(u64, u32, u32)> = Vec::new();
    for (t, w) in weights.iter().enumerate() {
        let want = (a.bytes as f64 * w / sum) as u64;
        let batches = want / full.len() as u64;
        for _ in 0..batches {
            plan.push((rng.next(), t as u32, 0));
        }
        let rest = (want % full.len() as u64).max(if batches == 0 { 100 } else { 0 });
        if rest >= 100 {
            plan.push((rng.next(), t as u32, rest as u32));
        }
    }
    plan.sort_unstable();
    let (s, mut w) = Storage::open(dir, storage_cfg(), specs(names), true).unwrap();
    let mut bytes = vec![0u64; names.len()];
    for (i, &(_, t, rest)) in plan.iter().enumerate() {
        let b: &[u8] = if rest == 0 {
            &full
        } else {
            let n = (rest as usize / RECORD).clamp(1, BATCH_RECORDS);
            small.entry(rest as usize).or_insert_with(|| make_batch(n, (rest as usize / n).saturating_sub(12).max(1)))
        };
        w.append(tp_of(t as usize), b, 0, false).unwrap();
        bytes[t as usize] += (b.len() + canopy::storage::segment::FRAME_HEADER_BYTES) as u64;
        if i % 2048 == 0 {
            let f = w.flush().unwrap();
            s.publish_hw(&f);
        }
    }
    // Seal every branch's segment: one more small batch per branch, later.
    let tiny = make_batch(1, 10);
    let mut sealed = std::collections::HashSet::new();
    for (t, n) in names.iter().enumerate() {
        if sealed.insert(branch_of(n).to_owned()) {
            w.append(tp_of(t), &tiny, 7_200_000, false).unwrap();
            bytes[t] += (tiny.len() + canopy::storage::segment::FRAME_HEADER_BYTES) as u64;
        }
    }
    let f = w.flush().unwrap();
    s.sync().unwrap();
    s.publish_hw(&f);
    bytes
}

/// Drops the page cache of every file under `dir`.
fn drop_cache(dir: &Path) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            drop_cache(&p);
        } else if let Ok(f) = std::fs::File::open(&p) {
            unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
        }
    }
}

/// Reads a tp from offset 0 to its end in 1 MiB fetches: (bytes read from
/// files, bytes returned, seconds).
fn recover(s: &Storage, tp: &Tp) -> (u64, u64, f64) {
    let started = Instant::now();
    let (mut scanned, mut useful, mut offset) = (0, 0, 0);
    loop {
        let r = s.read(tp, offset, 1 << 20, true).unwrap();
        if r.records.is_empty() {
            break;
        }
        scanned += r.bytes_scanned;
        useful += r.len() as u64;
        offset = r.next_offset;
    }
    (scanned, useful, started.elapsed().as_secs_f64())
}

struct Measured {
    plan: Plan,
    compact_s: f64,
    small: (u64, u64, f64),
    all: (u64, u64, f64),
    /// Per topic: (bytes read, useful bytes).
    per_topic: Vec<(u64, u64)>,
}

fn measure(name: &'static str, dir: &Path, s: &Storage, plan: Plan, compact_s: f64, names: &[String], small: usize) -> Measured {
    drop_cache(dir);
    let small_read = recover(s, &tp_of(small));
    let started = Instant::now();
    let mut per_topic = Vec::with_capacity(names.len());
    let (mut scanned, mut useful) = (0, 0);
    for t in 0..names.len() {
        let (sc, us, _) = recover(s, &tp_of(t));
        scanned += sc;
        useful += us;
        per_topic.push((sc, us));
    }
    let all = (scanned, useful, started.elapsed().as_secs_f64());
    eprintln!("{name}: small topic {} bytes read for {} in {:.3} s; all topics {} read for {} in {:.1} s", small_read.0, small_read.1, small_read.2, all.0, all.1, all.2);
    Measured { plan, compact_s, small: small_read, all, per_topic }
}

fn copy_dir(from: &Path, to: &Path) {
    let _ = std::fs::remove_dir_all(to);
    let st = std::process::Command::new("cp").arg("-a").arg(from).arg(to).status().unwrap();
    assert!(st.success());
}

fn mib(b: u64) -> String {
    format!("{:.1}", b as f64 / (1u64 << 20) as f64)
}

fn main() {
    let a = args();
    let mut rng = Rng(a.seed);
    let names = topic_names(a.topics, &mut rng);
    let base = a.dir.join("branch-logs");
    let _ = std::fs::remove_dir_all(&a.dir);
    std::fs::create_dir_all(&base).unwrap();
    let started = Instant::now();
    let bytes = generate(&base, &names, &a, &mut rng);
    let total: u64 = bytes.iter().sum();
    eprintln!("generated {} topics, {} MiB in {:.1} s", names.len(), mib(total), started.elapsed().as_secs_f64());
    let topics: Vec<(String, u64)> = names.iter().cloned().zip(bytes.iter().copied()).collect();

    // The small topic beside the huge one, as in the field (10 MB next to
    // 2.72 GB): among the ten biggest topics, the one with the sibling
    // closest to 1/200 of its size (at least 64 KiB: a few batches).
    let parent = |n: &str| n.rsplit_once('.').map_or(String::new(), |(p, _)| p.to_owned());
    let mut by_size: Vec<usize> = (0..names.len()).collect();
    by_size.sort_by_key(|&t| std::cmp::Reverse(bytes[t]));
    let mut children: HashMap<String, Vec<usize>> = HashMap::new();
    for (t, n) in names.iter().enumerate() {
        children.entry(parent(n)).or_default().push(t);
    }
    let (huge, small) = by_size
        .iter()
        .take(10)
        .flat_map(|&h| children[&parent(&names[h])].iter().filter(move |&&t| t != h).map(move |&s| (h, s)))
        .filter(|&(_, s)| bytes[s] >= 64 << 10)
        .min_by(|a, b| {
            let score = |(h, s): (usize, usize)| ((bytes[h] as f64 / bytes[s] as f64).ln() - 200f64.ln()).abs();
            score(*a).total_cmp(&score(*b))
        })
        .expect("a big topic with a sibling of at least 64 KiB");
    eprintln!("huge {} ({} MiB), its small sibling {} ({} KiB)", names[huge], mib(bytes[huge]), names[small], bytes[small] / 1024);

    let prefix3_plan = split::plan(&topics, Strategy::Prefix3);
    let budget = Budget { max_stores: Some(prefix3_plan.stores.len()), min_store_bytes: 0 };
    let name_of = |id: &[u8; 16]| {
        let i = u64::from_le_bytes(id[..8].try_into().unwrap()) as usize;
        names.get(i.wrapping_sub(1)).cloned()
    };
    let mut results = Vec::new();
    {
        let (s, _w) = Storage::open(&base, storage_cfg(), specs(&names), true).unwrap();
        results.push(measure("branch logs", &base, &s, split::by_key(&topics, |n| branch_of(n).to_owned()), 0.0, &names, small));
    }
    for (label, strategy) in [("prefix3", Strategy::Prefix3), ("adaptive", Strategy::Adaptive(budget))] {
        let dir = a.dir.join(label);
        copy_dir(&base, &dir);
        let (s, mut w) = Storage::open_with(&dir, storage_cfg(), specs(&names), true, Some(&[][..])).unwrap();
        let started = Instant::now();
        let cfg = CompactConfig { lag_ms: 0, strategy, max_bytes: u64::MAX };
        let done = s.compact(10_800_000, &cfg, name_of, &mut |_| true, |_| Ok(()), &mut |sw| w.apply(sw)).unwrap().expect("segments due");
        let compact_s = started.elapsed().as_secs_f64();
        eprintln!("{label}: compacted {} segments, {} MiB into {} stores in {compact_s:.1} s", done.segments, mib(done.bytes_in), s.store_count());
        results.push(measure(label, &dir, &s, done.plan, compact_s, &names, small));
    }

    // The report.
    let adaptive = &results[2];
    let t = adaptive.plan.threshold;
    println!("## Compaction: {} topics, {} MiB, seed {}, Zipf {}\n", names.len(), mib(total), a.seed, a.zipf);
    println!("Big topic: `{}` ({} MiB); its small sibling: `{}` ({} KiB). Adaptive budget: {} stores (prefix3's count); its threshold (the minimum store size) is {} MiB.\n", names[huge], mib(bytes[huge]), names[small], bytes[small] / 1024, budget.max_stores.unwrap(), mib(t));
    println!("| | branch logs | prefix3 | adaptive |");
    println!("|---|---:|---:|---:|");
    let row = |label: &str, f: &dyn Fn(&Measured) -> String| {
        println!("| {label} | {} | {} | {} |", f(&results[0]), f(&results[1]), f(&results[2]));
    };
    let nums: Vec<split::Numbers> = results.iter().map(|m| split::numbers(&m.plan)).collect();
    let n = |m: &Measured| &nums[results.iter().position(|x| std::ptr::eq(x, m)).unwrap()];
    row("stores (files)", &|m| n(m).stores.to_string());
    row("planned: wasted MiB, all topics", &|m| mib(n(m).total_wasted));
    row("planned: most wasted by one topic, MiB", &|m| n(m).worst_waste.map_or("-".into(), |(_, w)| mib(w)));
    row("planned: worst read/useful ratio", &|m| n(m).worst_ratio.map_or("-".into(), |(_, r)| format!("{r:.0}")));
    row("compaction time, s", &|m| if m.compact_s > 0.0 { format!("{:.1}", m.compact_s) } else { "-".into() });
    row("(a) small sibling, cold: MiB read", &|m| mib(m.small.0));
    row("(a) small sibling, cold: read/useful", &|m| format!("{:.1}", m.small.0 as f64 / m.small.1.max(1) as f64));
    row("(a) small sibling, cold: ms", &|m| format!("{:.1}", m.small.2 * 1000.0));
    row("(b) every topic, warm: MiB read", &|m| mib(m.all.0));
    row("(b) every topic, warm: read/useful", &|m| format!("{:.2}", m.all.0 as f64 / m.all.1.max(1) as f64));
    row("(b) every topic, warm: s", &|m| format!("{:.1}", m.all.2));
    row("measured: wasted MiB, all topics", &|m| mib(m.per_topic.iter().map(|(s, u)| s.saturating_sub(*u)).sum()));
    row("measured: most wasted by one topic, MiB", &|m| mib(m.per_topic.iter().map(|(s, u)| s.saturating_sub(*u)).max().unwrap_or(0)));
    let big_amp = |m: &Measured| {
        m.per_topic.iter().enumerate().filter(|(i, _)| bytes[*i] >= t.max(1)).map(|(_, (s, u))| *s as f64 / (*u).max(1) as f64).fold(0.0, f64::max)
    };
    row(&format!("measured: worst read/useful of topics ≥ {} MiB", mib(t)), &|m| format!("{:.3}", big_amp(m)));
    let small_waste = |m: &Measured| m.per_topic.iter().enumerate().filter(|(i, _)| bytes[*i] < t.max(1)).map(|(_, (s, u))| s.saturating_sub(*u)).max().unwrap_or(0);
    row(&format!("measured: most wasted by a topic < {} MiB, MiB", mib(t)), &|m| mib(small_waste(m)));

    let (p3, ad) = (&results[1], &results[2]);
    let waste = |m: &Measured| m.per_topic.iter().map(|(s, u)| s.saturating_sub(*u)).sum::<u64>().max(1);
    println!("\nTargets (adaptive, budget = prefix3's store count):\n");
    println!("- topics ≥ the minimum store size read with amplification ≤ 1.1: worst {:.3}", big_amp(ad));
    println!("- no topic's read wastes more than 2× the minimum store size ({} MiB): planned worst {} MiB, measured worst {} MiB (topics below the threshold: {} MiB)", mib(2 * t), mib(nums[2].worst_waste.map_or(0, |w| w.1)), mib(ad.per_topic.iter().map(|(s, u)| s.saturating_sub(*u)).max().unwrap_or(0)), mib(small_waste(ad)));
    println!("- wasted bytes over all topics ≥ 10× lower than prefix3: planned {:.1}×, measured {:.1}×", nums[1].total_wasted as f64 / nums[2].total_wasted.max(1) as f64, waste(p3) as f64 / waste(ad) as f64);
    println!("- the small sibling's cold recovery ≥ 10× faster than prefix3: {:.1}× ({:.1} ms vs {:.1} ms; vs branch logs {:.1}×)", p3.small.2 / ad.small.2, ad.small.2 * 1000.0, p3.small.2 * 1000.0, results[0].small.2 / ad.small.2);

    // How the budget trades files against waste (plans only).
    println!("\nThe adaptive budget traded against waste (planned; prefix3: {} stores, {} MiB wasted):\n", nums[1].stores, mib(nums[1].total_wasted));
    println!("| max stores | stores | threshold MiB | wasted MiB, all topics | vs prefix3 | most wasted by one topic, MiB |");
    println!("|---:|---:|---:|---:|---:|---:|");
    let k = prefix3_plan.stores.len();
    for max in [k / 4, k / 2, k, 2 * k, 4 * k, 8 * k, 16 * k] {
        let p = split::plan(&topics, Strategy::Adaptive(Budget { max_stores: Some(max.max(1)), min_store_bytes: 0 }));
        let n = split::numbers(&p);
        println!("| {} | {} | {} | {} | {:.1}× | {} |", max.max(1), n.stores, mib(p.threshold), mib(n.total_wasted), nums[1].total_wasted as f64 / n.total_wasted.max(1) as f64, mib(n.worst_waste.map_or(0, |w| w.1)));
    }

    if let Some(html) = &a.html {
        let r = Report::new(&topics, budget.max_stores, 0);
        std::fs::write(html, r.html(&format!("Split plans: {} topics, {} MiB, seed {}", names.len(), mib(total), a.seed))).unwrap();
        eprintln!("wrote {}", html.display());
    }
    let _ = std::fs::remove_dir_all(&a.dir);
}
