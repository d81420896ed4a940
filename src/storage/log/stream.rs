//! Ordered subtree streams: the batches of a set of branches in stream
//! order, from the tip when it reaches back far enough, else by merging the
//! branches' logs on disk.
//!
//! Each branch log holds its frames in sequence order, so the disk path is
//! the same n-way merge as the tip's: one cursor per branch (started at the
//! segment's stream mark for the wanted sequence number), a min-heap over
//! their head sequence numbers. A read never passes the published sequence
//! number, so it serves nothing a tp's own fetch could not.

use super::*;
use crate::storage::merge::{self, MergeHeap};
use crate::storage::tip::{Filter, MergeOut, Merged, Pick};

/// One subtree read.
#[derive(Debug, Default)]
pub struct StreamRead {
    /// Batches in stream order.
    pub batches: Vec<Merged>,
    /// The first sequence number not yet published when the read began.
    pub visible_seq: u64,
    /// Served by the tip (memory).
    pub from_tip: bool,
    /// Bytes read from files, other topics' frames included.
    pub bytes_scanned: u64,
    /// Unless `cut`: every batch below this sequence number was looked at
    /// (`visible_seq`, or where the read's budget ran out).
    pub examined_to: u64,
    /// Stopped by `max_bytes` or by `pick`, before `examined_to`.
    pub cut: bool,
}

/// Batches one read looks at in the tip at most (it holds the tip's read
/// lock meanwhile, ~10 ms at most).
const TIP_BUDGET: usize = 256 * 1024;
/// Bytes one read scans in the branch logs at most (or 8x what it may
/// return, if more).
const DISK_BUDGET: u64 = 64 << 20;

/// A frame a cursor stopped at.
struct Head {
    fh: FrameHeader,
    buf: Bytes,
    range: std::ops::Range<usize>,
    /// Read but not looked at: the scan budget ran out. The read ends here
    /// if this becomes the smallest head.
    unexamined: bool,
}

impl Storage {
    /// Every batch below this stream sequence number is published.
    pub fn visible_seq(&self) -> u64 {
        self.visible_seq.load(Ordering::Acquire)
    }

    /// Names of the branches `pick` selects.
    pub fn branches_where(&self, pick: impl Fn(&str) -> bool) -> Vec<String> {
        self.branches.read().expect("branches lock").keys().filter(|b| pick(b)).cloned().collect()
    }

    /// The smallest sequence number the named branches' logs may still
    /// hold (the published end when they hold nothing).
    pub fn stream_start(&self, branches: &[String]) -> u64 {
        let visible = self.visible_seq();
        let stores = self.stores.read().expect("stores lock");
        let in_stores = stores.iter().filter(|s| s.branches.iter().any(|b| branches.contains(b))).map(|s| s.store.first_seq).min();
        let map = self.branches.read().expect("branches lock");
        branches
            .iter()
            .filter_map(|b| map.get(b))
            .filter_map(|b| b.segs.read().expect("branch lock").first().map(|s| s.base_seq))
            .chain(in_stores)
            .min()
            .unwrap_or(visible)
            .min(visible)
    }

    /// The batches of `branches` from sequence number `from_seq` on that
    /// `pick` takes, in stream order, up to `max_bytes` (at least one with
    /// `min_one`) or until `pick` says stop.
    pub fn read_stream(
        &self,
        branches: &[String],
        from_seq: u64,
        max_bytes: usize,
        min_one: bool,
        pick: &mut Filter<'_>,
    ) -> Result<StreamRead, ReadError> {
        self.read_stream_within(branches, from_seq, max_bytes, min_one, (TIP_BUDGET, DISK_BUDGET.max(8 * max_bytes as u64)), pick)
    }

    /// [`Storage::read_stream`] with its budgets (tip batches, disk bytes).
    fn read_stream_within(
        &self,
        branches: &[String],
        from_seq: u64,
        max_bytes: usize,
        min_one: bool,
        (tip_budget, disk_budget): (usize, u64),
        pick: &mut Filter<'_>,
    ) -> Result<StreamRead, ReadError> {
        // First the bound, then the segments: every batch below it is in a
        // segment the branch already lists.
        let visible = self.visible_seq();
        let mut out = StreamRead { visible_seq: visible, ..StreamRead::default() };
        out.examined_to = visible;
        if from_seq >= visible {
            return Ok(out);
        }
        let picked: Vec<Arc<Branch>> = {
            let map = self.branches.read().expect("branches lock");
            let mut v: Vec<Arc<Branch>> = branches.iter().filter_map(|b| map.get(b).cloned()).collect();
            // In name order, not by address: the merge opens its cursors in
            // this order, and a simulated disk that draws a fault per
            // operation replays a seed only if that order is the same in
            // every process (found by the simulator: seed 20 did not replay).
            v.sort_by(|a, b| a.dir.cmp(&b.dir));
            v.dedup_by(|a, b| Arc::ptr_eq(a, b));
            v
        };
        if self.cfg.tip.bytes > 0 {
            let keys: Vec<u64> = picked.iter().map(tip_key).collect();
            if let Some(MergeOut { batches, examined_to, cut }) = self.tip.read().expect("tip lock").merge(&keys, from_seq, visible, max_bytes, min_one, tip_budget, pick) {
                (out.batches, out.examined_to, out.cut) = (batches, examined_to, cut);
                out.from_tip = true;
                return Ok(out);
            }
        }
        self.merge_logs(&picked, from_seq, visible, max_bytes, min_one, disk_budget, pick, &mut out).map_err(|e| ReadError::Io(e.to_string()))?;
        Ok(out)
    }

    #[allow(clippy::too_many_arguments)]
    fn merge_logs(
        &self,
        branches: &[Arc<Branch>],
        from_seq: u64,
        below: u64,
        max_bytes: usize,
        min_one: bool,
        budget: u64,
        pick: &mut Filter<'_>,
        out: &mut StreamRead,
    ) -> io::Result<()> {
        // One cursor per branch log, one per store of these branches that
        // reaches `from_seq`. Both are collected under the stores lock, so
        // a compaction switch is seen whole or not at all.
        let mut cursors: Vec<Frames<'_>> = Vec::new();
        // Store cursors are opened when the merge reaches them: a subtree
        // read from long ago would otherwise read a chunk of every store.
        let mut opens_at: Vec<Option<u64>> = Vec::new();
        // For a store cursor: which of its branches are wanted (a store may
        // hold topics of other branches too).
        let mut wanted: Vec<Option<(Arc<StoreFile>, Vec<bool>)>> = Vec::new();
        {
            let stores = self.stores.read().expect("stores lock");
            let names: Vec<String> = branches.iter().map(|b| branch_name(b)).collect();
            for s in stores.iter().filter(|s| s.store.end_seq > from_seq && s.store.first_seq < below && s.branches.iter().any(|b| names.contains(b))) {
                let pos = s.store.mark_for(from_seq);
                cursors.push(Frames::chain(self, vec![(s.clone() as Arc<dyn FrameFile>, pos)], 0));
                opens_at.push(Some(s.store.first_seq.max(from_seq)));
                wanted.push(Some((s.clone(), s.branches.iter().map(|b| names.contains(b)).collect())));
            }
            for b in branches {
                // Under one look at the segments: retention may delete one
                // meanwhile (it does not take the stores lock), and a cursor
                // built from a second look could miss the branch.
                let segs = b.segs.read().expect("branch lock");
                // The newest sequence number staged here (an active segment
                // holding only its header says nothing: look further back).
                let end = segs.iter().rev().map(|s| s.end_seq.load(Ordering::Acquire)).find(|&e| e > 0).unwrap_or(0);
                if segs.is_empty() || end <= from_seq {
                    // Nothing at or after `from_seq` here.
                    continue;
                }
                let i = segs.partition_point(|s| s.base_seq <= from_seq).saturating_sub(1);
                let pos = if segs[i].base_seq <= from_seq { segs[i].mark_for(from_seq) } else { FILE_HEADER_BYTES };
                let files = segs[i..].iter().enumerate().map(|(k, s)| (s.clone() as Arc<dyn FrameFile>, if k == 0 { pos } else { FILE_HEADER_BYTES })).collect();
                cursors.push(Frames::chain(self, files, 0));
                opens_at.push(None);
                wanted.push(None);
            }
        }
        // Each cursor holds one read buffer: share the response's size.
        let chunk = (max_bytes / cursors.len().max(1)).clamp(MIN_READ_CHUNK, MAX_READ_CHUNK);
        // The first sequence number `pick` stopped at: nothing from there on
        // is served, from any branch.
        let mut stop = u64::MAX;
        let mut heads: Vec<Option<Head>> = Vec::with_capacity(cursors.len());
        // Each cursor's first candidate is looked at whatever the budget, so
        // where a read runs out is always past `from_seq`: the next read
        // makes progress.
        let mut first = vec![true; cursors.len()];
        let mut keys = Vec::with_capacity(cursors.len());
        for (i, c) in cursors.iter_mut().enumerate() {
            c.chunk = chunk;
            match opens_at[i] {
                // A lower bound of its first frame's sequence number.
                Some(seq) => {
                    heads.push(None);
                    keys.push(seq);
                }
                None => {
                    let h = next_kept(c, wanted[i].as_ref(), from_seq, below, pick, &mut stop, &mut out.bytes_scanned, budget, &mut first[i])?;
                    keys.push(h.as_ref().map_or(u64::MAX, |h| h.fh.seq));
                    heads.push(h);
                }
            }
        }
        let mut heap = merge::DefaultHeap::build(&keys);
        let mut taken = 0usize;
        while let Some((seq, src)) = heap.top() {
            if seq >= stop {
                break;
            }
            let i = src as usize;
            if opens_at[i].take().is_some() {
                heads[i] = next_kept(&mut cursors[i], wanted[i].as_ref(), from_seq, below, pick, &mut stop, &mut out.bytes_scanned, budget, &mut first[i])?;
                heap.replace_top(heads[i].as_ref().map_or(u64::MAX, |h| h.fh.seq));
                continue;
            }
            let Some(h) = heads[i].take() else { break };
            if h.unexamined {
                // Everything below it was looked at.
                out.examined_to = seq;
                break;
            }
            let len = h.range.len();
            if !((min_one && out.batches.is_empty()) || taken + len <= max_bytes) {
                out.cut = true;
                break;
            }
            taken += len;
            // A small batch is copied rather than pin a large read buffer.
            let bytes = if len < SMALL_COPY && h.buf.len() > 8 * len { Bytes::copy_from_slice(&h.buf[h.range.clone()]) } else { h.buf.slice(h.range.clone()) };
            let tp = Tp { topic: h.fh.topic_id, partition: h.fh.partition };
            out.batches.push(Merged { seq: h.fh.seq, tp, base_offset: h.fh.base_offset, last_offset: h.fh.last_offset(), bytes });
            heads[i] = next_kept(&mut cursors[i], wanted[i].as_ref(), from_seq, below, pick, &mut stop, &mut out.bytes_scanned, budget, &mut first[i])?;
            heap.replace_top(heads[i].as_ref().map_or(u64::MAX, |h| h.fh.seq));
        }
        out.cut |= stop != u64::MAX;
        self.read_stats.note(out.bytes_scanned, taken as u64);
        Ok(())
    }
}

/// The cursor's next frame in `[from_seq, below)` that `pick` takes. A
/// frame it says to stop at ends the cursor and lowers `stop`: nothing at
/// or after it is served, from any branch, so the stream stays in order.
/// Once `scanned` passes `budget`, the next frame comes back unexamined
/// (unless it is the cursor's `first`).
#[allow(clippy::too_many_arguments)]
fn next_kept(
    c: &mut Frames<'_>,
    wanted: Option<&(Arc<StoreFile>, Vec<bool>)>,
    from_seq: u64,
    below: u64,
    pick: &mut Filter<'_>,
    stop: &mut u64,
    scanned: &mut u64,
    budget: u64,
    first: &mut bool,
) -> io::Result<Option<Head>> {
    while let Some((fh, buf, range)) = c.next(scanned)? {
        if fh.seq < from_seq {
            continue;
        }
        if let Some((store, want)) = wanted {
            let tp = Tp { topic: fh.topic_id, partition: fh.partition };
            if !store.branch_of.get(&tp).is_some_and(|&b| want[b]) {
                continue;
            }
        }
        if fh.seq >= below {
            return Ok(None);
        }
        if *scanned > budget && !*first {
            return Ok(Some(Head { fh, buf, range, unexamined: true }));
        }
        *first = false;
        match pick(fh.seq, &Tp { topic: fh.topic_id, partition: fh.partition }, fh.last_offset(), &buf[range.clone()]) {
            Pick::Take => return Ok(Some(Head { fh, buf, range, unexamined: false })),
            Pick::Skip => {}
            Pick::Stop => {
                *stop = (*stop).min(fh.seq);
                return Ok(None);
            }
        }
    }
    Ok(None)
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::protocol::batch::tests::make_batch;
    use crate::storage::tip::{Lookup, TipConfig};
    use proptest::prelude::*;

    pub(crate) const BRANCHES: [&str; 3] = ["b0", "b1", "b2"];

    pub(crate) fn tp(branch: usize, topic: u8) -> Tp {
        Tp { topic: [branch as u8 * 10 + topic; 16], partition: 0 }
    }

    fn open(dir: &Path, tip: usize) -> (Arc<Storage>, LogWriter) {
        open_with(dir, tip, None).unwrap()
    }

    /// Three branches of two topics each, 4 KiB segments.
    pub(crate) fn open_with(dir: &Path, tip: usize, windows: Option<&[WindowRecord]>) -> Result<(Arc<Storage>, LogWriter), StorageError> {
        let specs = (0..3).flat_map(|b| (0..2).map(move |t| PartitionSpec { tp: tp(b, t), branch: BRANCHES[b].into(), log_start: 0 })).collect();
        let cfg = StorageConfig { segment_bytes: 4096, tip: TipConfig { bytes: tip, max_blocks: 64, lookup: Lookup::Index }, ..StorageConfig::default() };
        Storage::open_with(dir, cfg, specs, true, windows)
    }

    /// (seq, tp, base offset, batch) as stored.
    pub(crate) type Row = (u64, Tp, i64, Vec<u8>);

    /// Appends a batch of `n` records of `len` bytes to (branch, topic) for
    /// each of `appends`, publishing after every `publish_every`-th.
    pub(crate) fn fill(w: &mut LogWriter, appends: &[(usize, u8, usize, usize)], publish_every: usize) -> Vec<Row> {
        let mut rows = Vec::new();
        for (i, &(b, t, n, len)) in appends.iter().enumerate() {
            let vals: Vec<Vec<u8>> = (0..n).map(|k| vec![b'a' + (k as u8); len]).collect();
            let refs: Vec<&[u8]> = vals.iter().map(|v| v.as_slice()).collect();
            let mut batch = make_batch(&refs, i as i64);
            let a = w.append(tp(b, t), &batch, 0, false).unwrap();
            batch::set_base_offset(&mut batch, a.base_offset);
            rows.push((a.seq, tp(b, t), a.base_offset, batch));
            if i % publish_every == 0 {
                let f = w.flush().unwrap();
                w.storage().publish_hw(&f);
            }
        }
        rows
    }

    /// What a read must return: the reference rows from `from` on in the
    /// chosen branches that `keep` takes, up to `stop`, as `max` allows.
    pub(crate) fn expected(rows: &[Row], branches: &[usize], from: u64, keep_topic: Option<u8>, stop: u64, max: usize) -> Vec<Row> {
        let mut out: Vec<Row> = Vec::new();
        let mut taken = 0;
        for r in rows.iter().filter(|r| r.0 >= from && r.0 < stop) {
            let b = (r.1.topic[0] / 10) as usize;
            if !branches.contains(&b) || keep_topic.is_some_and(|t| r.1.topic[0] % 10 != t) {
                continue;
            }
            if !out.is_empty() && taken + r.3.len() > max {
                break;
            }
            taken += r.3.len();
            out.push(r.clone());
        }
        out
    }

    /// Where a read that stops at `stop_tp`'s first batch from `stop` on
    /// ends (as a `read_committed` stream stops at an open transaction).
    fn stop_point(rows: &[Row], branches: &[usize], from: u64, stop: u64, stop_tp: Tp, end: u64) -> u64 {
        rows.iter()
            .filter(|r| r.0 >= from.max(stop) && r.0 < end && r.1 == stop_tp && branches.contains(&((r.1.topic[0] / 10) as usize)))
            .map(|r| r.0)
            .next()
            .unwrap_or(end)
    }

    fn read(s: &Storage, branches: &[usize], from: u64, keep_topic: Option<u8>, stop: u64, stop_tp: Tp, max: usize) -> (Vec<Row>, bool) {
        let names: Vec<String> = branches.iter().map(|&b| BRANCHES[b].to_owned()).collect();
        let mut pick = |seq: u64, tp: &Tp, _last: i64, _b: &[u8]| {
            if seq >= stop && *tp == stop_tp {
                Pick::Stop
            } else if keep_topic.is_some_and(|t| tp.topic[0] % 10 != t) {
                Pick::Skip
            } else {
                Pick::Take
            }
        };
        let r = s.read_stream(&names, from, max, true, &mut pick).unwrap();
        (r.batches.into_iter().map(|m| (m.seq, m.tp, m.base_offset, m.bytes.to_vec())).collect(), r.from_tip)
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]
        /// Subtree reads equal the reference stream filtered to the subtree,
        /// in order, whether the tip (of random size, so often evicted) or
        /// the segments (many: 4 KiB rolls) serve them, before and after a
        /// restart; and nothing at or past a stop is served.
        #[test]
        fn stream_reads_equal_the_reference(
            appends in proptest::collection::vec((0usize..3, 0u8..2, 1usize..4, 0usize..400), 1..150),
            tip in prop_oneof![Just(0usize), 1024usize..16384, Just(1 << 20)],
            queries in proptest::collection::vec((proptest::sample::subsequence(vec![0usize, 1, 2], 1..=3), any::<prop::sample::Index>(), proptest::option::of(0u8..2), any::<prop::sample::Index>(), (0usize..3, 0u8..2), 1usize..6000), 1..12),
        ) {
            let dir = tempfile::tempdir().unwrap();
            let rows;
            {
                let (s, mut w) = open(dir.path(), tip);
                rows = fill(&mut w, &appends, 3);
                // Unpublished appends are never served.
                let end = s.visible_seq();
                for (branches, from, keep, stop, (sb, st), max) in &queries {
                    let from = from.index(rows.len() + 1) as u64;
                    let stop = stop.index(rows.len() + 1) as u64 + from;
                    let (got, _) = read(&s, branches, from, *keep, stop, tp(*sb, *st), *max);
                    let cut = stop_point(&rows, branches, from, stop, tp(*sb, *st), end);
                    prop_assert_eq!(got, expected(&rows, branches, from, *keep, cut, *max));
                }
                let f = w.flush().unwrap();
                s.publish_hw(&f);
                s.sync().unwrap();
            }
            let (s, _w) = open(dir.path(), tip);
            prop_assert_eq!(s.visible_seq(), rows.len() as u64);
            for (branches, from, keep, stop, (sb, st), max) in &queries {
                let from = from.index(rows.len() + 1) as u64;
                let stop = stop.index(rows.len() + 1) as u64 + from;
                let (got, from_tip) = read(&s, branches, from, *keep, stop, tp(*sb, *st), *max);
                prop_assert!(!from_tip || got.is_empty());
                let cut = stop_point(&rows, branches, from, stop, tp(*sb, *st), rows.len() as u64);
                prop_assert_eq!(got, expected(&rows, branches, from, *keep, cut, *max));
            }
        }
    
        /// With tiny scan budgets a read stops early, but a consumer that
        /// moves on to where each read says it looked (past its last batch
        /// when cut by size) still gets exactly the subtree, in order, and
        /// every read makes progress.
        #[test]
        fn budgeted_reads_make_progress_and_miss_nothing(
            appends in proptest::collection::vec((0usize..3, 0u8..2, 1usize..3, 0usize..300), 1..120),
            tip in prop_oneof![Just(0usize), Just(1 << 20)],
            branches in proptest::sample::subsequence(vec![0usize, 1, 2], 1..=3),
            keep in proptest::option::of(0u8..2),
            tip_budget in 1usize..6,
            disk_budget in 1u64..3000,
            max in 1usize..3000,
        ) {
            let dir = tempfile::tempdir().unwrap();
            let (s, mut w) = open(dir.path(), tip);
            let rows = fill(&mut w, &appends, usize::MAX);
            let f = w.flush().unwrap();
            s.publish_hw(&f);
            let names: Vec<String> = branches.iter().map(|&b| BRANCHES[b].to_owned()).collect();
            let mut got: Vec<Row> = Vec::new();
            let mut from = 0u64;
            let mut reads = 0;
            while from < s.visible_seq() {
                reads += 1;
                prop_assert!(reads <= 2 * rows.len() + 2, "no progress from {}", from);
                let mut pick = |_: u64, tp: &Tp, _: i64, _: &[u8]| if keep.is_some_and(|t| tp.topic[0] % 10 != t) { Pick::Skip } else { Pick::Take };
                let r = s.read_stream_within(&names, from, max, true, (tip_budget, disk_budget), &mut pick).unwrap();
                let next = if r.cut { r.batches.last().map(|m| m.seq + 1).unwrap() } else { r.examined_to };
                prop_assert!(next > from);
                got.extend(r.batches.into_iter().map(|m| (m.seq, m.tp, m.base_offset, m.bytes.to_vec())));
                from = next;
            }
            prop_assert_eq!(got, expected(&rows, &branches, 0, keep, u64::MAX, usize::MAX));
        }
    }
}
