//! Tip lookup, index vs scan (criterion):
//!
//! ```text
//! cargo bench --bench tip
//! ```
//!
//! A ring of 1 KiB batches (64 MiB to 1 GiB) holds the traffic of many
//! branches; one tp, alone in its branch, has 0.1% of the batches. Each
//! iteration reads all of that tp's batches in the tip from its first
//! offset, as a consumer catching up from inside the tip does, with the
//! per-branch index and with the linear scan (the baseline), on the same
//! ring.

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};

use canopy::storage::tip::{Lookup, Tip, TipConfig};
use canopy::storage::Tp;

const BATCH: usize = 1024;

fn tp(n: u32) -> Tp {
    let mut topic = [0u8; 16];
    topic[..4].copy_from_slice(&n.to_le_bytes());
    Tp { topic, partition: 0 }
}

/// Fills a ring of `ring` bytes: every 1000th batch is the target's (branch
/// 0), the others go round-robin to `branches - 1` other branches (ten tps
/// each). Returns the tip and the target's first sequence number.
fn fill(ring: usize, branches: u64) -> (Tip, u64) {
    let n = (ring / (BATCH + canopy::storage::tip::SLOT_OVERHEAD)) as u64;
    let mut tip = Tip::new(TipConfig { bytes: ring, max_blocks: (branches as usize + (n as usize) / 1024 + 16) * 2, lookup: Lookup::Index });
    let batch = vec![7u8; BATCH];
    let mut next = std::collections::HashMap::new();
    let mut first = None;
    for seq in 0..n {
        let (tp, branch) = if seq % 1000 == 0 {
            first.get_or_insert(seq);
            (tp(0), 0)
        } else {
            let b = 1 + seq % (branches - 1);
            (tp((b * 10 + seq % 10) as u32 + 1), b)
        };
        let o = next.entry(tp).or_insert(0i64);
        tip.push(seq, tp, branch, *o, *o, &batch);
        *o += 1;
    }
    (tip, first.expect("the target has batches"))
}

fn lookup(c: &mut Criterion) {
    let mut g = c.benchmark_group("tip_lookup");
    g.sample_size(20);
    let cases: &[(usize, u64)] = &[(64 << 20, 1_000), (256 << 20, 1_000), (1 << 30, 1_000), (64 << 20, 10), (64 << 20, 10_000), (64 << 20, 100_000)];
    for &(ring, branches) in cases {
        let (mut tip, first) = fill(ring, branches);
        let label = format!("{}MiB/{}br", ring >> 20, branches);
        let expect = (ring / (BATCH + canopy::storage::tip::SLOT_OVERHEAD)).div_ceil(1000);
        g.throughput(Throughput::Elements(expect as u64));
        for mode in [Lookup::Index, Lookup::Scan] {
            tip.set_lookup(mode);
            let r = tip.read(&tp(0), 0, first, 0, i64::MAX, usize::MAX, true).expect("in the tip");
            assert_eq!(r.records.len(), expect, "{label} {mode:?}");
            g.bench_with_input(BenchmarkId::new(format!("{mode:?}"), &label), &tip, |b, tip| {
                b.iter(|| tip.read(&tp(0), 0, first, 0, i64::MAX, usize::MAX, true).expect("in the tip").records.len())
            });
        }
    }
    g.finish();
}

/// Index memory per batch with the smallest batches (a one-record batch
/// is about 70 bytes), and pool occupancy as the ring wraps.
fn memory(c: &mut Criterion) {
    let _ = c;
    for branches in [10u64, 1_000] {
        let ring = 64usize << 20;
        let mut tip = Tip::new(TipConfig { bytes: ring, max_blocks: 1 << 20, lookup: Lookup::Index });
        let batch = vec![7u8; 70];
        let mut occupancy = Vec::new();
        let total = 3 * (ring / 70) as u64;
        for seq in 0..total {
            let b = seq % branches;
            tip.push(seq, tp(b as u32), b, seq as i64, seq as i64, &batch);
            if seq % (total / 6) == 0 {
                occupancy.push(tip.stats().blocks_in_use);
            }
        }
        let s = tip.stats();
        let index = s.blocks_in_use * canopy::storage::tip::BLOCK_ENTRIES * 16;
        println!(
            "tip {} MiB of 70-byte batches over {branches} branches: {} batches, {} blocks in use ({} KiB of index, {:.1} bytes per batch); blocks in use at each sixth of 3 ring wraps: {occupancy:?}",
            ring >> 20,
            s.batches,
            s.blocks_in_use,
            index / 1024,
            index as f64 / s.batches as f64
        );
    }
}

criterion_group!(benches, lookup, memory);
criterion_main!(benches);
