//! n-way merge throughput per heap (criterion):
//!
//! ```text
//! cargo bench --bench merge
//! ```
//!
//! 1,000,000 stream sequence numbers dealt to k = 2 … 1024 sources (each
//! sorted, as branch indexes are), skewed like real traffic: a source's
//! share falls off as 1/rank (a few big branches, a long tail), merged back
//! into one stream by each heap.

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};

use canopy::storage::merge::{merge_runs, merge_sorted, FlatHeap, LoserTree, QuadHeap, StdHeap};

const N: u64 = 1_000_000;

fn sources(k: usize) -> Vec<Vec<u64>> {
    // Zipf-like shares: weight 1/(rank+1); cumulative table, xorshift picks.
    let weights: Vec<f64> = (0..k).map(|r| 1.0 / (r as f64 + 1.0)).collect();
    let total: f64 = weights.iter().sum();
    let mut cum = Vec::with_capacity(k);
    let mut acc = 0.0;
    for w in &weights {
        acc += w / total;
        cum.push(acc);
    }
    let mut out = vec![Vec::new(); k];
    let mut x: u64 = 0x2545_f491_4f6c_dd1d;
    for seq in 0..N {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let u = (x >> 11) as f64 / (1u64 << 53) as f64;
        let i = cum.partition_point(|c| *c < u).min(k - 1);
        out[i].push(seq);
    }
    out
}

fn merge(c: &mut Criterion) {
    let mut g = c.benchmark_group("merge");
    g.sample_size(10);
    g.throughput(Throughput::Elements(N));
    for k in [2usize, 8, 32, 128, 1024] {
        let s = sources(k);
        let refs: Vec<&[u64]> = s.iter().map(|v| v.as_slice()).collect();
        assert_eq!(merge_sorted::<LoserTree>(&refs).len() as u64, N);
        g.bench_with_input(BenchmarkId::new("std BinaryHeap<Reverse>", k), &refs, |b, r| b.iter(|| merge_sorted::<StdHeap>(r).len()));
        g.bench_with_input(BenchmarkId::new("flat binary heap", k), &refs, |b, r| b.iter(|| merge_sorted::<FlatHeap>(r).len()));
        g.bench_with_input(BenchmarkId::new("4-ary heap", k), &refs, |b, r| b.iter(|| merge_sorted::<QuadHeap>(r).len()));
        g.bench_with_input(BenchmarkId::new("loser tree", k), &refs, |b, r| b.iter(|| merge_sorted::<LoserTree>(r).len()));
        g.bench_with_input(BenchmarkId::new("flat binary heap + runs", k), &refs, |b, r| b.iter(|| merge_runs::<FlatHeap>(r).len()));
    }
    g.finish();
}

criterion_group!(benches, merge);
criterion_main!(benches);
