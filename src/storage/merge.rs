//! n-way merge: k sources, each sorted by key (stream sequence numbers of
//! one branch's batches), merged into one sorted stream (the subtree in
//! arrival order).
//!
//! The merge's inner loop is "take the smallest head, advance that source",
//! so every heap here is driven through [`MergeHeap::replace_top`] (one
//! sift instead of a pop and a push). Four implementations, benchmarked
//! against each other in `benches/merge.rs` (results in
//! docs/benchmarks.md); [`DefaultHeap`] says which one the tip uses and why.
//!
//! Keys are unique across sources (a sequence number belongs to one batch),
//! so no heap needs a tie-break for correctness.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

/// A source that is exhausted sorts after every real key.
const DONE: u64 = u64::MAX;

/// A min-heap of (key, source) for merging.
pub trait MergeHeap {
    /// Builds the heap from each source's first key (`DONE`: empty source).
    fn build(heads: &[u64]) -> Self;
    /// The smallest (key, source), None when every source is exhausted.
    fn top(&self) -> Option<(u64, u32)>;
    /// Replaces the top's key with its source's next key (`DONE` when the
    /// source is exhausted).
    fn replace_top(&mut self, key: u64);
    /// The smallest key after the top's (`DONE` if none): while the top's
    /// source has keys below it, they can be taken without touching the
    /// heap. Heaps that cannot tell cheaply answer the top's own key.
    fn runner_up(&self) -> u64 {
        self.top().map_or(DONE, |t| t.0)
    }
}

/// `std::collections::BinaryHeap<Reverse<_>>`: the baseline.
pub struct StdHeap(BinaryHeap<Reverse<(u64, u32)>>);

impl MergeHeap for StdHeap {
    fn build(heads: &[u64]) -> Self {
        StdHeap(heads.iter().enumerate().filter(|(_, k)| **k != DONE).map(|(i, k)| Reverse((*k, i as u32))).collect())
    }
    fn top(&self) -> Option<(u64, u32)> {
        self.0.peek().map(|r| r.0)
    }
    fn replace_top(&mut self, key: u64) {
        let mut top = self.0.peek_mut().expect("replace_top on an empty heap");
        if key == DONE {
            std::collections::binary_heap::PeekMut::pop(top);
        } else {
            top.0 .0 = key;
        }
    }
}

/// A D-ary min-heap of (key, source) pairs in a flat array, sifting with a
/// hole (one move per level instead of a swap). D = 2 is the classic binary
/// heap; D = 4 has half the levels, and a node's children share a cache
/// line.
pub struct DaryHeap<const D: usize> {
    v: Vec<(u64, u32)>,
}

/// The flat binary heap.
pub type FlatHeap = DaryHeap<2>;
/// The 4-ary heap.
pub type QuadHeap = DaryHeap<4>;

impl<const D: usize> MergeHeap for DaryHeap<D> {
    fn build(heads: &[u64]) -> Self {
        let mut h = DaryHeap { v: heads.iter().enumerate().filter(|(_, k)| **k != DONE).map(|(i, k)| (*k, i as u32)).collect() };
        if h.v.len() > 1 {
            for i in (0..=(h.v.len() - 2) / D).rev() {
                h.sift_down(i);
            }
        }
        h
    }
    fn top(&self) -> Option<(u64, u32)> {
        self.v.first().copied()
    }
    fn replace_top(&mut self, key: u64) {
        if key == DONE {
            let last = self.v.pop().expect("replace_top on an empty heap");
            if self.v.is_empty() {
                return;
            }
            self.v[0] = last;
        } else {
            self.v[0].0 = key;
        }
        self.sift_down(0);
    }
    fn runner_up(&self) -> u64 {
        self.v.iter().skip(1).take(D).map(|e| e.0).min().unwrap_or(DONE)
    }
}

impl<const D: usize> DaryHeap<D> {
    fn sift_down(&mut self, mut i: usize) {
        let n = self.v.len();
        let item = self.v[i];
        loop {
            let first = D * i + 1;
            if first >= n {
                break;
            }
            let mut c = first;
            for j in first + 1..(first + D).min(n) {
                if self.v[j].0 < self.v[c].0 {
                    c = j;
                }
            }
            if self.v[c].0 >= item.0 {
                break;
            }
            self.v[i] = self.v[c];
            i = c;
        }
        self.v[i] = item;
    }
}

/// A loser tree (tournament tree): each inner node keeps the loser of its
/// match, the winner goes up; replacing the winner replays only its path to
/// the root, one comparison per level and no choice between children.
pub struct LoserTree {
    /// Current key of each source (padded to a power of two with DONE).
    keys: Vec<u64>,
    /// `tree[0]` the overall winner; `tree[1..]` the losers of inner nodes.
    tree: Vec<u32>,
}

impl MergeHeap for LoserTree {
    fn build(heads: &[u64]) -> Self {
        let k = heads.len().max(1).next_power_of_two();
        let mut keys = heads.to_vec();
        keys.resize(k, DONE);
        let mut t = LoserTree { keys, tree: vec![0; k] };
        // Play the tournament bottom-up: winners[i] for inner node i.
        let mut winners = vec![0u32; 2 * k];
        for i in 0..k {
            winners[k + i] = i as u32;
        }
        for i in (1..k).rev() {
            let (a, b) = (winners[2 * i], winners[2 * i + 1]);
            let (w, l) = if t.keys[a as usize] <= t.keys[b as usize] { (a, b) } else { (b, a) };
            winners[i] = w;
            t.tree[i] = l;
        }
        t.tree[0] = if k == 1 { 0 } else { winners[1] };
        t
    }
    fn top(&self) -> Option<(u64, u32)> {
        let w = self.tree[0];
        let k = self.keys[w as usize];
        (k != DONE).then_some((k, w))
    }
    fn replace_top(&mut self, key: u64) {
        let k = self.keys.len();
        let mut winner = self.tree[0];
        self.keys[winner as usize] = key;
        let mut node = (k + winner as usize) / 2;
        while node > 0 {
            let l = self.tree[node];
            if self.keys[l as usize] < self.keys[winner as usize] {
                self.tree[node] = winner;
                winner = l;
            }
            node /= 2;
        }
        self.tree[0] = winner;
    }
}

/// The heap the tip's merge uses. In `benches/merge.rs` (k = 2 … 1024,
/// 1M keys) no variant is reliably faster than the standard library's
/// heap, which already sifts with a hole: the geometric means over k are
/// within 6% of each other, the winner changes with k, and the spread is
/// about the run-to-run noise (docs/benchmarks.md). So the simplest one.
pub type DefaultHeap = StdHeap;

/// [`merge_sorted`], taking runs: after the top's key, its source's next
/// keys that are still below the runner-up are taken straight from the
/// source, and the heap is touched once per run instead of once per key.
/// It pays where a source's keys come in runs (a busy branch's batches
/// following each other); on independently interleaved keys it gained 4%.
pub fn merge_runs<H: MergeHeap>(sources: &[&[u64]]) -> Vec<u64> {
    merge_with::<H>(sources, true)
}

/// Merges sorted `sources` into one sorted vector with heap `H`, one heap
/// operation per key (for tests and benchmarks).
pub fn merge_sorted<H: MergeHeap>(sources: &[&[u64]]) -> Vec<u64> {
    merge_with::<H>(sources, false)
}

fn merge_with<H: MergeHeap>(sources: &[&[u64]], runs: bool) -> Vec<u64> {
    let mut pos = vec![0usize; sources.len()];
    let heads: Vec<u64> = sources.iter().map(|s| s.first().copied().unwrap_or(DONE)).collect();
    let mut h = H::build(&heads);
    let mut out = Vec::with_capacity(sources.iter().map(|s| s.len()).sum());
    while let Some((key, src)) = h.top() {
        out.push(key);
        let s = src as usize;
        // Without runs the bound is the key itself: nothing below it is left.
        let bound = if runs { h.runner_up() } else { key };
        let source = sources[s];
        let mut p = pos[s] + 1;
        while p < source.len() && source[p] < bound {
            out.push(source[p]);
            p += 1;
        }
        pos[s] = p;
        h.replace_top(source.get(p).copied().unwrap_or(DONE));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn check<H: MergeHeap>(sources: &[Vec<u64>]) -> Vec<u64> {
        let refs: Vec<&[u64]> = sources.iter().map(|s| s.as_slice()).collect();
        merge_sorted::<H>(&refs)
    }

    #[test]
    fn edge_cases() {
        for sources in [vec![], vec![vec![]], vec![vec![], vec![3], vec![]], vec![vec![1, 4], vec![2, 3, 9]]] {
            let mut want: Vec<u64> = sources.iter().flatten().copied().collect();
            want.sort();
            assert_eq!(check::<StdHeap>(&sources), want);
            assert_eq!(check::<FlatHeap>(&sources), want);
            assert_eq!(check::<QuadHeap>(&sources), want);
            assert_eq!(check::<LoserTree>(&sources), want);
        }
    }

    proptest! {
        #[test]
        fn every_heap_merges_like_a_sort(keys in proptest::collection::vec(0u64..1_000_000, 0..2000), k in 1usize..70) {
            let mut keys = keys;
            keys.sort();
            keys.dedup();
            // Deal the keys to k sources (by a hash, so sources interleave).
            let mut sources = vec![Vec::new(); k];
            for key in &keys {
                sources[(key.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 40) as usize % k].push(*key);
            }
            prop_assert_eq!(&check::<StdHeap>(&sources), &keys);
            prop_assert_eq!(&check::<FlatHeap>(&sources), &keys);
            prop_assert_eq!(&check::<QuadHeap>(&sources), &keys);
            prop_assert_eq!(&check::<LoserTree>(&sources), &keys);
            let refs: Vec<&[u64]> = sources.iter().map(|s| s.as_slice()).collect();
            prop_assert_eq!(&merge_runs::<FlatHeap>(&refs), &keys);
            prop_assert_eq!(&merge_runs::<LoserTree>(&refs), &keys);
        }
    }
}
