//! The tip: the newest part of the stream, in memory.
//!
//! Every appended batch is also copied into a ring of fixed byte capacity
//! (`bytes`), broker-wide and in stream order, with its stream sequence
//! number, tp and offsets. Readers get zero-copy [`Bytes`] slices; the
//! memory of an evicted batch is released once no response holds its slice
//! any more, so a slow reader never holds up the writer.
//!
//! Per branch (two-segment topic prefix) a tip index lists the sequence
//! numbers of that branch's batches in the ring, in blocks of
//! [`BLOCK_ENTRIES`] entries drawn from one pool shared by all branches, so
//! an index grows and shrinks with its branch's traffic. A block returns to
//! the pool once every entry in it has left the ring. Entries name ring
//! slots by sequence number; a lookup checks the slot still holds that
//! sequence (the generation check of invariant 5), so it can never return
//! another batch's bytes.
//!
//! A read of one tp from offset `o` starts at a sequence number known to be
//! at or before the batch holding `o` (the partition's sparse index gives
//! it), finds it in the branch index by binary search, and walks that
//! branch's entries only: O(log n + entries of the branch scanned), whatever
//! the ring's size and the other branches' traffic. [`Lookup::Scan`] walks
//! every slot of the ring from the same place instead: the linear pass kept
//! as the measured baseline.
//!
//! Synchronous, single-writer; the caller serialises (a lock in `Storage`).

use std::collections::VecDeque;

use crate::storage::hashing::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};

use bytes::{Bytes, BytesMut};

use super::{merge, Tp};

/// Entries per index block.
pub const BLOCK_ENTRIES: usize = 1024;
/// Memory a batch costs the tip beyond its bytes (its slot and index
/// entry), counted against `tip_bytes` so small batches cannot make the
/// tip use several times its limit.
pub const SLOT_OVERHEAD: usize = std::mem::size_of::<Slot>() + std::mem::size_of::<Entry>();
/// The ring copies batches into chunks of this size (a batch larger than
/// it gets a chunk of its own).
const ARENA_CHUNK: usize = 4 << 20;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lookup {
    /// Walk the branch index (the default).
    Index,
    /// Walk every slot of the ring (the baseline).
    Scan,
}

impl std::str::FromStr for Lookup {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "index" => Ok(Lookup::Index),
            "scan" => Ok(Lookup::Scan),
            _ => Err(format!("expected index or scan, got {s:?}")),
        }
    }
}

#[derive(Debug, Clone)]
pub struct TipConfig {
    /// Bytes of batches the ring holds (`tip_bytes`); 0 turns the tip off.
    pub bytes: usize,
    /// Index blocks in the pool (`tip_index_blocks`).
    pub max_blocks: usize,
    pub lookup: Lookup,
}

impl Default for TipConfig {
    fn default() -> Self {
        TipConfig { bytes: 256 << 20, max_blocks: 8192, lookup: Lookup::Index }
    }
}

struct Slot {
    seq: u64,
    tp: Tp,
    branch: u32,
    base_offset: i64,
    last_offset: i64,
    bytes: Bytes,
}

/// One branch index entry: the sequence number of a ring slot, and a tag of
/// its tp so a walk skips other tps' entries without touching their slots.
#[derive(Clone, Copy, Default)]
struct Entry {
    seq: u64,
    tag: u32,
}

fn tag(tp: &Tp) -> u32 {
    let t = u32::from_le_bytes(tp.topic[..4].try_into().expect("4 bytes"));
    t ^ (tp.partition as u32).wrapping_mul(0x9e37_79b9)
}

type BlockId = u32;

/// The shared pool of index blocks.
struct Pool {
    blocks: Vec<Box<[Entry]>>,
    free: Vec<BlockId>,
    max: usize,
    /// Entries per block ([`BLOCK_ENTRIES`]; tests use small blocks).
    size: usize,
}

impl Pool {
    fn alloc(&mut self) -> Option<BlockId> {
        if let Some(id) = self.free.pop() {
            return Some(id);
        }
        if self.blocks.len() >= self.max {
            return None;
        }
        self.blocks.push(vec![Entry::default(); self.size].into_boxed_slice());
        Some((self.blocks.len() - 1) as BlockId)
    }

    fn release(&mut self, id: BlockId) {
        debug_assert!(!self.free.contains(&id), "block {id} released twice");
        self.free.push(id);
    }

    fn in_use(&self) -> usize {
        self.blocks.len() - self.free.len()
    }
}

/// One branch's index: its entries, oldest first, across pool blocks.
#[derive(Default)]
struct BranchIndex {
    blocks: VecDeque<BlockId>,
    /// Position of the oldest live entry in the first block.
    head: usize,
    len: usize,
}

impl BranchIndex {
    fn get<'a>(&self, pool: &'a Pool, i: usize) -> &'a Entry {
        let at = self.head + i;
        &pool.blocks[self.blocks[at / pool.size] as usize][at % pool.size]
    }

    /// The first position whose entry has `seq >= seq`.
    fn lower_bound(&self, pool: &Pool, seq: u64) -> usize {
        let (mut lo, mut hi) = (0, self.len);
        while lo < hi {
            let mid = (lo + hi) / 2;
            if self.get(pool, mid).seq < seq {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        lo
    }
}

/// Counters for the metrics issue.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TipStats {
    pub bytes_used: usize,
    pub batches: usize,
    pub oldest_seq: Option<u64>,
    pub blocks_in_use: usize,
    pub blocks_free: usize,
    pub branches: usize,
    /// Reads served from the tip, and reads that fell through to the logs.
    pub hits: u64,
    pub misses: u64,
    /// Index entries (or, scanning, ring slots) looked at by reads.
    pub visited: u64,
    /// Batches yielded by subtree merges.
    pub merged: u64,
}

/// What a subtree merge does with a batch, as its caller's filter says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pick {
    Take,
    Skip,
    /// End the merge before this batch.
    Stop,
}

/// A subtree merge's filter: given a batch's sequence number, tp, last
/// offset and bytes.
pub type Filter<'a> = dyn FnMut(u64, &Tp, i64, &[u8]) -> Pick + 'a;

/// What a subtree merge returns.
#[derive(Debug, Default)]
pub struct MergeOut {
    pub batches: Vec<Merged>,
    /// Unless `cut`: every batch below this sequence number was looked at
    /// (the merge's bound, or where its budget ran out).
    pub examined_to: u64,
    /// Stopped by `max_bytes` or by the filter, before `examined_to`.
    pub cut: bool,
}

/// One batch of a subtree merge.
#[derive(Debug, Clone)]
pub struct Merged {
    pub seq: u64,
    pub tp: Tp,
    pub base_offset: i64,
    pub last_offset: i64,
    pub bytes: Bytes,
}

/// A tip read: whole batches of one tp in offset order.
#[derive(Debug, Default)]
pub struct TipRead {
    pub records: Vec<Bytes>,
    /// The offset after the last batch returned.
    pub next_offset: i64,
}

pub struct Tip {
    cfg: TipConfig,
    ring: VecDeque<Slot>,
    used: usize,
    pool: Pool,
    branches: Vec<BranchIndex>,
    /// Branches by the caller's key for them.
    branch_ids: HashMap<u64, u32>,
    arena: BytesMut,
    /// Arena chunks filled earlier, with the last sequence number written
    /// to each: once all their batches left the ring and no reader holds a
    /// slice, a chunk's memory is reused (its pages are already mapped;
    /// fresh pages cost a fault each on these machines).
    spent: VecDeque<(u64, BytesMut)>,
    hits: AtomicU64,
    misses: AtomicU64,
    visited: AtomicU64,
    merged: AtomicU64,
}

impl Tip {
    pub fn new(cfg: TipConfig) -> Tip {
        Self::with_block_size(cfg, BLOCK_ENTRIES)
    }

    /// A tip whose index blocks hold `size` entries (tests use small ones
    /// to cross block boundaries often).
    pub fn with_block_size(cfg: TipConfig, size: usize) -> Tip {
        assert!(size > 0, "index blocks hold at least one entry");
        let max = cfg.max_blocks;
        Tip { cfg, ring: VecDeque::new(), used: 0, pool: Pool { blocks: Vec::new(), free: Vec::new(), max, size }, branches: Vec::new(), branch_ids: HashMap::default(), arena: BytesMut::new(), spent: VecDeque::new(), hits: AtomicU64::new(0), misses: AtomicU64::new(0), visited: AtomicU64::new(0), merged: AtomicU64::new(0) }
    }

    /// Switches the lookup (benchmarks compare both on one ring).
    pub fn set_lookup(&mut self, lookup: Lookup) {
        self.cfg.lookup = lookup;
    }

    pub fn enabled(&self) -> bool {
        self.cfg.bytes > 0
    }

    fn branch_id(&mut self, branch: u64) -> u32 {
        if let Some(id) = self.branch_ids.get(&branch) {
            return *id;
        }
        let id = self.branches.len() as u32;
        self.branches.push(BranchIndex::default());
        self.branch_ids.insert(branch, id);
        id
    }

    /// The sequence number of the oldest batch in the ring.
    pub fn first_seq(&self) -> Option<u64> {
        self.ring.front().map(|s| s.seq)
    }

    /// Adds an appended batch (`seq` one more than the last one added).
    /// Evicts the oldest batches to make room; a batch larger than the ring
    /// is not kept (and empties it, so the ring stays gap-free).
    pub fn push(&mut self, seq: u64, tp: Tp, branch: u64, base_offset: i64, last_offset: i64, batch: &[u8]) {
        if !self.enabled() {
            return;
        }
        if let Some(back) = self.ring.back() {
            if back.seq + 1 != seq {
                // A gap (an append that was not added): start over.
                self.clear();
            }
        }
        let cost = batch.len() + SLOT_OVERHEAD;
        if cost > self.cfg.bytes {
            self.clear();
            return;
        }
        while self.used + cost > self.cfg.bytes {
            self.evict();
        }
        let b = self.branch_id(branch);
        let full = {
            let bi = &self.branches[b as usize];
            bi.len == 0 || (bi.head + bi.len).is_multiple_of(self.pool.size)
        };
        if full {
            // The branch needs a new block; free one if the pool is spent.
            let id = loop {
                if let Some(id) = self.pool.alloc() {
                    break id;
                }
                if self.ring.is_empty() {
                    return; // no block at all (max_blocks 0): keep nothing
                }
                self.evict();
            };
            let bi = &mut self.branches[b as usize];
            if bi.len == 0 {
                // Its last block went back with its last entry.
                debug_assert!(bi.blocks.is_empty());
                bi.head = 0;
            }
            bi.blocks.push_back(id);
        }
        let bi = &mut self.branches[b as usize];
        let at = bi.head + bi.len;
        let block = bi.blocks[at / self.pool.size];
        let size = self.pool.size;
        self.pool.blocks[block as usize][at % size] = Entry { seq, tag: tag(&tp) };
        bi.len += 1;
        if self.arena.capacity() < batch.len() {
            self.next_arena(seq, batch.len());
        }
        self.arena.extend_from_slice(batch);
        let bytes = self.arena.split().freeze();
        self.used += cost;
        self.ring.push_back(Slot { seq, tp, branch: b, base_offset, last_offset, bytes });
    }

    /// Retires the current arena chunk (its last batch is `seq - 1`) and
    /// takes one with room for `len`: a retired chunk no one uses any more,
    /// else a new one.
    fn next_arena(&mut self, seq: u64, len: usize) {
        let old = std::mem::take(&mut self.arena);
        if old.capacity() > 0 || seq > 0 {
            self.spent.push_back((seq.saturating_sub(1), old));
        }
        let first = self.first_seq().unwrap_or(seq);
        while let Some((last, _)) = self.spent.front() {
            if *last >= first {
                break; // still holds batches in the ring
            }
            let (_, mut chunk) = self.spent.pop_front().expect("front exists");
            // Reclaims the whole allocation when no slice of it is alive.
            if chunk.try_reclaim(ARENA_CHUNK.max(len)) {
                self.arena = chunk;
                return;
            }
            // A reader still holds part of it: its memory goes when the
            // reader is done.
        }
        self.arena = BytesMut::with_capacity(ARENA_CHUNK.max(len));
    }

    /// Drops the oldest batch, and its index entry.
    fn evict(&mut self) {
        let Some(slot) = self.ring.pop_front() else { return };
        self.used -= slot.bytes.len() + SLOT_OVERHEAD;
        let bi = &mut self.branches[slot.branch as usize];
        debug_assert_eq!(bi.get(&self.pool, 0).seq, slot.seq, "index entries leave in ring order");
        bi.head += 1;
        bi.len -= 1;
        if bi.head == self.pool.size || bi.len == 0 {
            let id = bi.blocks.pop_front().expect("a block holds the entry");
            self.pool.release(id);
            bi.head = 0;
            debug_assert!(bi.len > 0 || bi.blocks.is_empty());
        }
    }

    /// Empties the ring (a truncation: its dead batches cannot be told
    /// from live ones).
    pub fn clear(&mut self) {
        while !self.ring.is_empty() {
            self.evict();
        }
    }

    fn slot(&self, seq: u64) -> Option<&Slot> {
        let first = self.ring.front()?.seq;
        let s = self.ring.get(usize::try_from(seq.checked_sub(first)?).ok()?)?;
        // Generation check: the slot still holds the batch the entry named.
        debug_assert_eq!(s.seq, seq, "ring slots are dense in sequence");
        (s.seq == seq).then_some(s)
    }

    /// Reads `tp` (of `branch`) from `offset`, below `hw`, up to
    /// `max_bytes` (at least one batch if `min_one`), starting the walk at
    /// `from_seq`, a sequence number at or before the batch that holds
    /// `offset`. None when the tip does not reach back that far (the caller
    /// reads the logs).
    #[allow(clippy::too_many_arguments)]
    pub fn read(&self, tp: &Tp, branch: u64, from_seq: u64, offset: i64, hw: i64, max_bytes: usize, min_one: bool) -> Option<TipRead> {
        if self.first_seq().is_none_or(|f| f > from_seq) || from_seq > self.ring.back().map_or(0, |s| s.seq) {
            self.misses.fetch_add(1, Ordering::Relaxed);
            return None;
        }
        let mut out = TipRead { records: Vec::new(), next_offset: offset };
        let mut taken = 0usize;
        let mut visited = 0u64;
        let mut take = |s: &Slot, out: &mut TipRead| -> bool {
            // true: stop.
            if s.base_offset >= hw {
                return true;
            }
            if s.last_offset < offset {
                return false;
            }
            let len = s.bytes.len();
            if !((min_one && out.records.is_empty()) || taken + len <= max_bytes) {
                return true;
            }
            out.records.push(s.bytes.clone());
            taken += len;
            out.next_offset = s.last_offset + 1;
            taken >= max_bytes || out.next_offset >= hw
        };
        match self.cfg.lookup {
            Lookup::Index => {
                let Some(&b) = self.branch_ids.get(&branch) else {
                    self.misses.fetch_add(1, Ordering::Relaxed);
                    return None;
                };
                let bi = &self.branches[b as usize];
                let t = tag(tp);
                let mut i = bi.lower_bound(&self.pool, from_seq);
                while i < bi.len {
                    let e = *bi.get(&self.pool, i);
                    i += 1;
                    visited += 1;
                    if e.tag != t {
                        continue;
                    }
                    let s = self.slot(e.seq).expect("an index entry names a slot in the ring");
                    if s.tp != *tp {
                        continue;
                    }
                    if take(s, &mut out) {
                        break;
                    }
                }
            }
            Lookup::Scan => {
                let start = (from_seq - self.ring.front().expect("non-empty").seq) as usize;
                for s in self.ring.range(start..) {
                    visited += 1;
                    if s.tp != *tp {
                        continue;
                    }
                    if take(s, &mut out) {
                        break;
                    }
                }
            }
        }
        self.hits.fetch_add(1, Ordering::Relaxed);
        self.visited.fetch_add(visited, Ordering::Relaxed);
        Some(out)
    }

    /// The batches of `branches` (a subtree) from sequence `from_seq` on,
    /// in stream order, up to `max_bytes` (at least one if `min_one`): an
    /// n-way merge of their indexes with [`merge::DefaultHeap`]. None when
    /// the tip does not reach back to `from_seq`.
    /// `below_seq` bounds the merge (the caller passes the first sequence
    /// not yet durable/visible, so unpublished batches are never served).
    /// At most `budget` batches are looked at (the merge holds the tip's
    /// read lock, which the writer waits for).
    /// `pick` decides for each batch (a subtree smaller than a branch
    /// filters its topics, a `read_committed` stream stops at an open
    /// transaction).
    pub fn merge(&self, branches: &[u64], from_seq: u64, below_seq: u64, max_bytes: usize, min_one: bool, budget: usize, pick: &mut Filter<'_>) -> Option<MergeOut> {
        if self.first_seq().is_none_or(|f| f > from_seq) {
            self.misses.fetch_add(1, Ordering::Relaxed);
            return None;
        }
        self.hits.fetch_add(1, Ordering::Relaxed);
        let mut ids: Vec<u32> = branches.iter().filter_map(|b| self.branch_ids.get(b).copied()).collect();
        // A branch named twice would yield its batches twice.
        ids.sort_unstable();
        ids.dedup();
        let idx: Vec<&BranchIndex> = ids.iter().map(|&b| &self.branches[b as usize]).collect();
        let mut pos: Vec<usize> = idx.iter().map(|bi| bi.lower_bound(&self.pool, from_seq)).collect();
        let key = |i: usize, p: usize| if p < idx[i].len { idx[i].get(&self.pool, p).seq } else { u64::MAX };
        let heads: Vec<u64> = (0..idx.len()).map(|i| key(i, pos[i])).collect();
        let mut heap = <merge::DefaultHeap as merge::MergeHeap>::build(&heads);
        let mut out = Vec::new();
        let mut taken = 0usize;
        let (mut cut, mut examined_to, mut examined) = (false, below_seq, 0usize);
        while let Some((seq, src)) = merge::MergeHeap::top(&heap) {
            if seq >= below_seq {
                break;
            }
            if examined == budget {
                examined_to = seq;
                break;
            }
            examined += 1;
            let s = self.slot(seq).expect("an index entry names a slot in the ring");
            let i = src as usize;
            match pick(seq, &s.tp, s.last_offset, &s.bytes) {
                Pick::Stop => {
                    cut = true;
                    break;
                }
                Pick::Skip => {}
                Pick::Take => {
                    if !((min_one && out.is_empty()) || taken + s.bytes.len() <= max_bytes) {
                        cut = true;
                        break;
                    }
                    taken += s.bytes.len();
                    out.push(Merged { seq, tp: s.tp, base_offset: s.base_offset, last_offset: s.last_offset, bytes: s.bytes.clone() });
                }
            }
            pos[i] += 1;
            merge::MergeHeap::replace_top(&mut heap, key(i, pos[i]));
        }
        self.merged.fetch_add(out.len() as u64, Ordering::Relaxed);
        Some(MergeOut { batches: out, examined_to, cut })
    }

    pub fn stats(&self) -> TipStats {
        TipStats {
            bytes_used: self.used,
            batches: self.ring.len(),
            oldest_seq: self.first_seq(),
            blocks_in_use: self.pool.in_use(),
            blocks_free: self.pool.free.len() + (self.pool.max - self.pool.blocks.len()),
            branches: self.branches.iter().filter(|b| b.len > 0).count(),
            hits: self.hits.load(Ordering::Relaxed),
            misses: self.misses.load(Ordering::Relaxed),
            visited: self.visited.load(Ordering::Relaxed),
            merged: self.merged.load(Ordering::Relaxed),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn tp(t: u8, p: i32) -> Tp {
        Tp { topic: [t; 16], partition: p }
    }

    fn batch(seq: u64, len: usize) -> Vec<u8> {
        let mut v = vec![(seq % 251) as u8; len.max(8)];
        v[..8].copy_from_slice(&seq.to_be_bytes());
        v
    }

    #[test]
    fn reads_walk_only_their_branch_and_eviction_recycles_blocks() {
        let tip = &mut Tip::new(TipConfig { bytes: (64 + SLOT_OVERHEAD) * 100, max_blocks: 4, lookup: Lookup::Index });
        // Two branches; branch a gets tp(1,0), branch b gets tp(2,0) ten
        // times as often.
        let (mut next_a, mut next_b) = (0i64, 0i64);
        for seq in 0..100u64 {
            if seq % 11 == 0 {
                tip.push(seq, tp(1, 0), 1, next_a, next_a + 1, &batch(seq, 64));
                next_a += 2;
            } else {
                tip.push(seq, tp(2, 0), 2, next_b, next_b, &batch(seq, 64));
                next_b += 1;
            }
        }
        let r = tip.read(&tp(1, 0), 1, 0, 0, i64::MAX, 1 << 20, true).unwrap();
        assert_eq!(r.records.len(), 10);
        assert_eq!(r.next_offset, 20);
        assert_eq!(tip.stats().visited, 10, "only branch a's entries were looked at");
        // Reading from the middle: offset 7 is in the batch 6..=7.
        let r = tip.read(&tp(1, 0), 1, 0, 7, i64::MAX, 1 << 20, true).unwrap();
        assert_eq!(u64::from_be_bytes(r.records[0][..8].try_into().unwrap()), 33);
        // Fill far past the ring: the pool never grows beyond its limit and
        // old reads fall through.
        for seq in 100..5000u64 {
            tip.push(seq, tp(2, 0), 2, next_b, next_b, &batch(seq, 64));
            next_b += 1;
            assert!(tip.stats().blocks_in_use <= 4);
        }
        assert!(tip.read(&tp(1, 0), 1, 0, 0, i64::MAX, 1 << 20, true).is_none());
        assert_eq!(tip.stats().branches, 1, "branch a's block went back to the pool");
        assert_eq!(tip.stats().bytes_used, (64 + SLOT_OVERHEAD) * 100);
    }

    #[test]
    fn a_spent_pool_evicts_rather_than_grows() {
        let mut tip = Tip::new(TipConfig { bytes: 1 << 20, max_blocks: 2, lookup: Lookup::Index });
        for seq in 0..10u64 {
            // Ten branches, one block each, but only two blocks.
            tip.push(seq, tp(seq as u8, 0), 100 + seq, 0, 0, &batch(seq, 16));
        }
        let s = tip.stats();
        assert_eq!((s.blocks_in_use, s.batches, s.branches), (2, 2, 2));
        assert!(tip.read(&tp(9, 0), 109, 9, 0, 1, 100, true).is_some());
        assert!(tip.read(&tp(0, 0), 100, 0, 0, 1, 100, true).is_none());
    }

    /// A reference model: every batch ever pushed, for checking reads.
    #[derive(Debug, Clone)]
    struct Pushed {
        seq: u64,
        tp: Tp,
        base: i64,
        last: i64,
        len: usize,
    }

    proptest! {
        #[test]
        fn tip_reads_equal_the_reference(
            appends in proptest::collection::vec((0u8..6, 0i32..2, 1i64..4, 8usize..200), 1..600),
            ring in 1024usize..16384,
            blocks in 1usize..40,
            block in 1usize..9,
            scan in any::<bool>(),
        ) {
            let lookup = if scan { Lookup::Scan } else { Lookup::Index };
            // Blocks of 1 to 8 entries: the walk crosses block boundaries.
            let mut tip = Tip::with_block_size(TipConfig { bytes: ring, max_blocks: blocks, lookup }, block);
            let mut next: HashMap<Tp, i64> = HashMap::default();
            let mut all: Vec<Pushed> = Vec::new();
            for (seq, (t, p, n, len)) in appends.into_iter().enumerate() {
                let tp = tp(t, p);
                let base = *next.get(&tp).unwrap_or(&0);
                next.insert(tp, base + n);
                // Branches: topics 0-2 share one, 3-5 another.
                let branch = if t < 3 { 1 } else { 2 };
                tip.push(seq as u64, tp, branch, base, base + n - 1, &batch(seq as u64, len));
                all.push(Pushed { seq: seq as u64, tp, base, last: base + n - 1, len: len.max(8) });
                prop_assert!(tip.stats().blocks_in_use <= blocks);
                prop_assert!(tip.stats().bytes_used <= ring);
                // Merging only what is below a bound stops there.
                if seq % 17 == 0 {
                    if let Some(MergeOut { batches: m, .. }) = tip.merge(&[1, 2, 1], tip.first_seq().unwrap_or(0), seq as u64, usize::MAX, true, usize::MAX, &mut |_, _, _, _| Pick::Take) {
                        prop_assert!(m.iter().all(|b| b.seq < seq as u64));
                        prop_assert!(m.windows(2).all(|w| w[0].seq < w[1].seq), "no batch twice");
                    }
                }
            }
            let first = tip.first_seq();
            // Subtree merges: each branch alone and both, from every
            // sequence still in the ring, equal the reference stream
            // filtered to the subtree.
            if let Some(f) = first {
                for subtree in [&[1u64][..], &[2], &[1, 2]] {
                    for from in (f..all.len() as u64).step_by(7) {
                        let got: Vec<u64> = tip.merge(subtree, from, u64::MAX, usize::MAX, true, usize::MAX, &mut |_, _, _, _| Pick::Take).unwrap().batches.iter().map(|m| m.seq).collect();
                        let want: Vec<u64> = all.iter().filter(|b| b.seq >= from && subtree.contains(&(if b.tp.topic[0] < 3 { 1 } else { 2 }))).map(|b| b.seq).collect();
                        prop_assert_eq!(got, want);
                    }
                }
                prop_assert!(tip.merge(&[1, 2], f.saturating_sub(1), u64::MAX, usize::MAX, true, usize::MAX, &mut |_, _, _, _| Pick::Take).is_none() || f == 0);
            }
            for (tp, end) in &next {
                let branch = if tp.topic[0] < 3 { 1 } else { 2 };
                for offset in 0..*end {
                    // The batch holding the offset, as the sparse index would
                    // name it (here exactly).
                    let holder = all.iter().find(|b| b.tp == *tp && b.base <= offset && offset <= b.last).unwrap();
                    let got = tip.read(tp, branch, holder.seq, offset, *end, 300, true);
                    match first {
                        Some(f) if f <= holder.seq => {
                            let got = got.expect("in the tip");
                            // Reference: this tp's batches from the holder on, up to 300 bytes (at least one).
                            let mut want = Vec::new();
                            let mut taken = 0;
                            for b in all.iter().filter(|b| b.tp == *tp && b.last >= offset) {
                                if !want.is_empty() && taken + b.len > 300 { break; }
                                want.push(b.seq);
                                taken += b.len;
                                if taken >= 300 { break; }
                            }
                            let seqs: Vec<u64> = got.records.iter().map(|r| u64::from_be_bytes(r[..8].try_into().unwrap())).collect();
                            prop_assert_eq!(seqs, want);
                        }
                        _ => prop_assert!(got.is_none()),
                    }
                }
            }
        }
    }
}
