//! Compaction: sealed branch-log segments become subtree stores.
//!
//! One run (a *window*) takes, in every branch, the oldest sealed segments
//! that were sealed at least `lag_ms` ago and lie below every tp's high
//! watermark (a replica's tail past it may yet be cut; single-node mode's
//! hw is everything durable) (up to `max_bytes` in all), plans
//! the split from the bytes each topic has in them, and copies their frames
//! verbatim, in stream order, into one store per planned region. Then, in
//! this order:
//!
//! 1. the stores are written under temporary names ([`Step::Written`]);
//! 2. each is synced and renamed, the directory synced ([`Step::Synced`]);
//! 3. the catalog records the window: its stores and, per branch, the
//!    sequence number below which segments are replaced ([`Step::Switched`]);
//! 4. readers switch to the stores, and the segments are deleted
//!    ([`Step::Deleted`]).
//!
//! The catalog write is the switch. A crash before it leaves store files
//! the catalog does not list: the next start deletes them, and the
//! segments serve. A crash after it leaves replaced segments: the next start
//! deletes them, and the stores serve. Either way every batch is visible
//! exactly once.

use super::*;
use crate::storage::merge::{self as heap, MergeHeap};
use crate::storage::subtree::split::{self, Plan, Strategy};
use crate::storage::subtree::store::StoreWriter;
use crate::storage::subtree::{Step, StoreRecord, WindowRecord};

/// How compaction runs.
#[derive(Debug, Clone)]
pub struct CompactConfig {
    /// A segment is compacted once it has been sealed this long.
    pub lag_ms: i64,
    pub strategy: Strategy,
    /// Segment bytes one run takes at most (always at least one segment).
    pub max_bytes: u64,
}

impl Default for CompactConfig {
    fn default() -> Self {
        CompactConfig { lag_ms: 3_600_000, strategy: Strategy::Adaptive(Default::default()), max_bytes: 4 << 30 }
    }
}

/// What the compactor needs to know of a live topic: its name (for the
/// plan) and whether it is keyed (`cleanup.policy` has `compact`): a keyed
/// topic gets stores of its own in every window, outside the plan, so
/// cleaning it (`clean`) never reads or rewrites a sibling's bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopicView {
    pub name: String,
    pub keyed: bool,
}

impl From<String> for TopicView {
    fn from(name: String) -> TopicView {
        TopicView { name, keyed: false }
    }
}

/// What one run did.
#[derive(Debug, Clone)]
pub struct Compacted {
    pub window: WindowRecord,
    pub plan: Plan,
    pub segments: usize,
    /// Bytes of the segments replaced.
    pub bytes_in: u64,
    /// Bytes of the stores written.
    pub bytes_out: u64,
}

/// Read chunk of the compactor's and the cleaner's cursors.
pub(super) const COMPACT_CHUNK: usize = 1 << 20;

impl Storage {
    /// Whether every frame of `seg` lies below its tp's high watermark.
    /// Compaction takes nothing else: a follower's divergent tail lies past
    /// its hw, and a truncation may not reach into stores (`log/cuts.rs`).
    /// A segment's summary of a tp was clamped below every later cut
    /// (`clamp_summaries`), so frames a cut killed hold nothing back.
    /// Frames of tps storage no longer has, or below their log start, are
    /// dropped, not copied. Single-node mode's hw is everything durable,
    /// which a sealed, synced and published segment is.
    fn below_hws(&self, seg: &Segment) -> bool {
        if self.cfg.planted == Some(Planted::CompactPastHighWatermark) {
            return true;
        }
        let lasts: Vec<(Tp, i64)> = seg.tps.lock().expect("segment tps lock").iter().map(|(tp, share)| (*tp, share.last_offset)).collect();
        let parts = self.parts.read().expect("parts lock");
        lasts.iter().all(|(tp, last)| {
            parts.get(tp).is_none_or(|p| {
                let st = p.st.read().expect("partition lock");
                *last < st.log_start || *last < st.hw
            })
        })
    }

    /// Runs one compaction window (see the module docs), if any segment is
    /// due. `name_of` names live topics (frames of others are dropped) and
    /// may say which are keyed ([`TopicView`]);
    /// `throttle` is called with the bytes read since its last call, about
    /// every MiB, and may sleep to bound the compactor's I/O, or answer
    /// false to cancel the run (nothing is switched; shutdown); `persist`
    /// must make the window record durable in the catalog. A failed
    /// `persist` poisons storage: the record may reach the catalog later.
    pub fn compact<V: Into<TopicView>>(
        &self,
        now_ms: i64,
        cfg: &CompactConfig,
        name_of: impl Fn(&TopicId) -> Option<V>,
        throttle: &mut dyn FnMut(u64) -> bool,
        persist: impl FnOnce(&WindowRecord) -> Result<(), String>,
        apply: Apply<'_>,
    ) -> Result<Option<Compacted>, StorageError> {
        self.compact_until(now_ms, cfg, name_of, throttle, persist, apply, &mut |_| false)
    }

    /// [`Storage::compact`] that stops (as a crash would) at the first step
    /// `stop_at` says yes to, returning `StorageError::Stopped`.
    #[allow(clippy::too_many_arguments)]
    pub fn compact_until<V: Into<TopicView>>(
        &self,
        now_ms: i64,
        cfg: &CompactConfig,
        name_of: impl Fn(&TopicId) -> Option<V>,
        throttle: &mut dyn FnMut(u64) -> bool,
        persist: impl FnOnce(&WindowRecord) -> Result<(), String>,
        apply: Apply<'_>,
        stop_at: &mut dyn FnMut(Step) -> bool,
    ) -> Result<Option<Compacted>, StorageError> {
        let mut stop = |step: Step| if stop_at(step) { Err(StorageError::Stopped(format!("{step:?}"))) } else { Ok(()) };
        let mut maintenance = self.maintenance.lock().expect("maintenance lock");
        self.check_poison()?;
        let visible = self.visible_seq();

        // 1. Which segments: per branch the oldest sealed ones that are due.
        let branches: Vec<(String, Arc<Branch>)> = {
            let mut v: Vec<(String, Arc<Branch>)> = self.branches.read().expect("branches lock").iter().map(|(n, b)| (n.clone(), b.clone())).collect();
            v.sort_by(|a, b| a.0.cmp(&b.0));
            v
        };
        // (base seq, branch, segment, base seq of the segment after it,
        // when it was sealed)
        let mut due: Vec<(u64, usize, Arc<Segment>, u64, i64)> = Vec::new();
        for (b, (_, branch)) in branches.iter().enumerate() {
            let segs = branch.segs.read().expect("branch lock");
            for pair in segs.windows(2) {
                let (seg, next) = (&pair[0], &pair[1]);
                // Sealed when the next one was created; published whole;
                // committed (below every tp's hw).
                if now_ms - next.created_ms < cfg.lag_ms || seg.end_seq.load(Ordering::Acquire) > visible || seg.file.unsynced() || !self.below_hws(seg) {
                    break;
                }
                due.push((seg.base_seq, b, seg.clone(), next.base_seq, next.created_ms));
            }
        }
        due.sort_by_key(|d| d.0);
        let mut taken = 0u64;
        let mut cut = due.len();
        for (i, d) in due.iter().enumerate() {
            let len = d.2.len.load(Ordering::Acquire);
            if i > 0 && taken + len > cfg.max_bytes {
                cut = i;
                break;
            }
            taken += len;
        }
        // How long the oldest due segment this run leaves has been waiting.
        let waiting = due[cut..].iter().map(|d| now_ms - d.4 - cfg.lag_ms).max().unwrap_or(0);
        self.compaction_stats.lag_ms.store(waiting.max(0) as u64, Ordering::Relaxed);
        due.truncate(cut);
        if due.is_empty() {
            return Ok(None);
        }
        stop(Step::Start)?;

        // 2. The plan, from each live topic's bytes in those segments.
        let parts = self.parts.read().expect("parts lock").clone();
        let log_start = |tp: &Tp| parts.get(tp).map(|p| p.st.read().expect("partition lock").log_start);
        let mut names: HashMap<TopicId, Option<TopicView>> = HashMap::default();
        let mut volume: HashMap<String, u64> = HashMap::default();
        let mut keyed: std::collections::BTreeMap<String, u64> = Default::default();
        for (_, _, seg, _, _) in &due {
            for (tp, share) in seg.tps.lock().expect("segment tps lock").iter() {
                let view = names.entry(tp.topic).or_insert_with(|| name_of(&tp.topic).map(Into::into)).clone();
                if let (Some(view), Some(start)) = (view, log_start(tp)) {
                    if share.last_offset >= start {
                        let sum = if view.keyed { keyed.entry(view.name).or_default() } else { volume.entry(view.name).or_default() };
                        *sum += share.bytes;
                    }
                }
            }
        }
        let volume: Vec<(String, u64)> = volume.into_iter().collect();
        let mut plan = split::plan(&volume, cfg.strategy);
        // Keyed topics: a store each, after the plan's.
        for (name, bytes) in keyed {
            plan.store_of.push(plan.stores.len());
            plan.stores.push(split::StorePlan { root: name.clone(), label: format!("{name} (keyed)"), topics: vec![plan.topics.len()], bytes });
            plan.topics.push((name, bytes));
        }
        let index_of: HashMap<&str, usize> = plan.topics.iter().enumerate().map(|(i, (n, _))| (n.as_str(), i)).collect();
        let store_of = |topic: &TopicId| -> Option<usize> { names.get(topic)?.as_ref().and_then(|v| index_of.get(v.name.as_str())).map(|&t| plan.store_of[t]) };

        // 3. Copy the frames, in stream order, into their stores.
        let window = maintenance.next_window;
        let disk = &*self.cfg.disk;
        disk.create_dir_all(&self.stores_dir).map_err(io_err(&self.stores_dir))?;
        let mut cursors: Vec<Frames<'_>> = (0..branches.len())
            .filter_map(|b| {
                let files: Vec<(Arc<dyn FrameFile>, u64)> = due.iter().filter(|d| d.1 == b).map(|d| (d.2.clone() as Arc<dyn FrameFile>, FILE_HEADER_BYTES)).collect();
                (!files.is_empty()).then(|| Frames::chain(self, files, COMPACT_CHUNK))
            })
            .collect();
        let mut writers: Vec<Option<StoreWriter>> = (0..plan.stores.len()).map(|_| None).collect();
        let tmp_path = |s: usize| self.stores_dir.join(format!("{}.tmp", store::file_name(window, s as u32)));
        let mut scanned = 0u64;
        let mut throttled = 0u64;
        let copy = (|| -> Result<(), StorageError> {
            let io = |e: io::Error| StorageError::Io { path: self.dir.display().to_string(), source: e };
            let mut heads = Vec::with_capacity(cursors.len());
            for c in cursors.iter_mut() {
                heads.push(c.next(&mut scanned).map_err(io)?);
            }
            let keys: Vec<u64> = heads.iter().map(|h| h.as_ref().map_or(u64::MAX, |h| h.0.seq)).collect();
            let mut merge = heap::DefaultHeap::build(&keys);
            while let Some((_, src)) = merge.top() {
                let i = src as usize;
                let Some((fh, buf, range)) = heads[i].take() else { break };
                let tp = Tp { topic: fh.topic_id, partition: fh.partition };
                let keep = log_start(&tp).is_some_and(|start| fh.last_offset() >= start);
                if let Some(s) = store_of(&tp.topic).filter(|_| keep) {
                    let w = match &mut writers[s] {
                        Some(w) => w,
                        slot => slot.insert(StoreWriter::create(disk, &tmp_path(s), window, s as u32, self.cfg.index_interval_bytes)?),
                    };
                    w.push(&fh, &buf[range.start - FRAME_HEADER_BYTES..range.end])?;
                }
                heads[i] = cursors[i].next(&mut scanned).map_err(io)?;
                merge.replace_top(heads[i].as_ref().map_or(u64::MAX, |h| h.0.seq));
                if scanned - throttled >= 1 << 20 {
                    if !throttle(scanned - throttled) {
                        return Err(StorageError::Stopped("compaction cancelled".into()));
                    }
                    throttled = scanned;
                }
            }
            Ok(())
        })();
        drop(cursors);
        let mut written = Vec::new();
        let finished = copy.and_then(|_| {
            for (s, w) in writers.into_iter().enumerate() {
                if let Some(w) = w {
                    let bytes = w.bytes();
                    let (path, file) = w.finish()?;
                    written.push((s, path, file, bytes));
                }
            }
            Ok(())
        });
        if let Err(e) = finished {
            // Nothing is listed: remove what this run wrote.
            for s in 0..plan.stores.len() {
                let _ = disk.remove_file(&tmp_path(s));
            }
            return Err(e);
        }
        stop(Step::Written)?;

        // 4. Durable under the final names (still unlisted).
        for (s, path, file, _) in &mut written {
            let to = self.stores_dir.join(store::file_name(window, *s as u32));
            store::sync_and_rename(disk, file, path, &to)?;
            *path = to;
        }
        sync_dir(disk, &self.stores_dir)?;
        sync_dir(disk, self.dir.parent().unwrap_or(&self.dir))?;
        stop(Step::Synced)?;

        // 5. The switch: the catalog lists the window.
        let mut compacted_to: Vec<(String, u64)> = Vec::new();
        for d in &due {
            let name = &branches[d.1].0;
            match compacted_to.iter_mut().find(|(n, _)| n == name) {
                Some(e) => e.1 = e.1.max(d.3),
                None => compacted_to.push((name.clone(), d.3)),
            }
        }
        let record = WindowRecord {
            window,
            created_ms: now_ms,
            split: match cfg.strategy {
                Strategy::Adaptive(_) => "adaptive".into(),
                Strategy::Prefix3 => "prefix3".into(),
            },
            threshold: plan.threshold,
            compacted_to: compacted_to.clone(),
            cleaned: Vec::new(),
            horizon_ms: None,
            stores: plan
                .stores
                .iter()
                .enumerate()
                .map(|(s, p)| {
                    let w = written.iter().find(|w| w.0 == s);
                    StoreRecord {
                        store: s as u32,
                        label: p.label.clone(),
                        topics: p.topics.iter().map(|&t| plan.topics[t].0.clone()).collect(),
                        bytes: w.map_or(0, |w| w.3),
                        live: w.is_some(),
                    }
                })
                .collect(),
        };
        // Opened (and so checked) before the switch: from the catalog
        // write to the readers' switch nothing may fail, or the segments
        // would stay due and a second window would hold their batches too.
        let mut opened = Vec::with_capacity(written.len());
        for (_, path, _, _) in &written {
            let store = Store::open(disk, path)?;
            opened.push(Arc::new(StoreFile::new(store, &self.files, |tp| parts.get(tp).map(|p| branch_name(&p.branch)))));
        }
        // A window number is never used twice, whatever `persist` did.
        maintenance.next_window = window + 1;
        if let Err(e) = persist(&record) {
            // The record may still have reached the catalog (written, not
            // flushed): then it becomes the switch at some later flush. Stop
            // here rather than compact these segments again.
            return Err(self.poison(StorageError::Catalog(format!("recording compaction window {window}: {e}"))));
        }
        stop(Step::Switched)?;

        // 6. Readers move to the stores (the writer's switch); the
        // segments go. A switch that fails leaves the window listed and
        // its segments in place: storage stops, and recovery takes the
        // catalog's window as the switch.
        let first_live: Vec<(Arc<Branch>, u64)> = compacted_to.iter().filter_map(|(n, s)| branches.iter().find(|(b, _)| b == n).map(|(_, b)| (b.clone(), *s))).collect();
        if let Err(e) = apply(Switch(Change::Compacted { opened, first_live })) {
            return Err(self.poison(StorageError::Poisoned(format!("switching readers to compaction window {window}: {e}"))));
        }
        let bytes_in: u64 = due.iter().map(|d| d.2.len.load(Ordering::Acquire)).sum();
        let bytes_out: u64 = written.iter().map(|w| w.3).sum();
        let mut dirs = Vec::new();
        for (_, b, seg, _, _) in &due {
            seg.file.retire();
            seg.remove_files(disk)?;
            if !dirs.contains(b) {
                dirs.push(*b);
            }
        }
        for b in dirs {
            sync_dir(disk, &branches[b].1.dir)?;
        }
        let stats = &self.compaction_stats;
        stats.windows.fetch_add(1, Ordering::Relaxed);
        stats.bytes_compacted.fetch_add(bytes_in, Ordering::Relaxed);
        stats.bytes_written.fetch_add(bytes_out, Ordering::Relaxed);
        stats.stores_written.fetch_add(written.len() as u64, Ordering::Relaxed);
        tracing::info!(window, segments = due.len(), bytes_in, bytes_out, stores = written.len(), split = %record.split, "compacted sealed segments into subtree stores");
        stop(Step::Deleted)?;
        Ok(Some(Compacted { window: record, plan, segments: due.len(), bytes_in, bytes_out }))
    }

    /// The compaction counters.
    pub fn compaction_stats(&self) -> &CompactionStats {
        &self.compaction_stats
    }

    /// Disk read counters (bytes read from files, bytes returned).
    pub fn read_stats(&self) -> &ReadStats {
        &self.read_stats
    }

    /// Number of subtree stores.
    pub fn store_count(&self) -> usize {
        self.stores.read().expect("stores lock").len()
    }
}

#[cfg(test)]
mod tests {
    use super::super::stream::tests::{expected, fill, open_with, tp, Row, BRANCHES};
    use super::*;
    use crate::storage::subtree::split::{Budget, Strategy};
    use crate::storage::tip::Pick;
    use proptest::prelude::{any, prop, prop_assert, prop_assert_eq, prop_oneof, proptest, Just, ProptestConfig, Strategy as _, TestCaseError};
    use std::cell::RefCell;

    /// Topic names for the plan: two topics per branch, the branches under
    /// `a` (two) and `b`, so plans can group across branches.
    fn name_of(id: &TopicId) -> Option<String> {
        let (b, t) = ((id[0] / 10) as usize, id[0] % 10);
        Some(format!("{}.{t}", ["a.x.p", "a.y.p", "b.z.p"][b]))
    }

    fn cfg(strategy: Strategy) -> CompactConfig {
        CompactConfig { lag_ms: 0, strategy, max_bytes: u64::MAX }
    }

    fn strategies() -> impl proptest::strategy::Strategy<Value = Strategy> {
        prop_oneof![
            // All in one store.
            Just(Strategy::Adaptive(Budget { max_stores: Some(1), min_store_bytes: 0 })),
            // One store per topic.
            Just(Strategy::Adaptive(Budget { max_stores: Some(1000), min_store_bytes: 0 })),
            (1usize..7, 0u64..20_000).prop_map(|(m, b)| Strategy::Adaptive(Budget { max_stores: Some(m), min_store_bytes: b })),
            (0u64..20_000).prop_map(|b| Strategy::Adaptive(Budget { max_stores: None, min_store_bytes: b })),
            Just(Strategy::Prefix3),
        ]
    }

    /// Publishes and syncs everything, so sealed segments are due.
    fn settle(w: &mut LogWriter) {
        let f = w.flush().unwrap();
        w.storage().sync().unwrap();
        w.storage().publish_hw(&f);
    }

    /// Runs one window, recording it in `catalog` as the engine would.
    fn compact(w: &mut LogWriter, strategy: Strategy, catalog: &RefCell<Vec<WindowRecord>>, stop_at: &mut dyn FnMut(Step) -> bool) -> Result<Option<Compacted>, StorageError> {
        let s = w.storage().clone();
        s.compact_until(
            1,
            &cfg(strategy),
            name_of,
            &mut |_| true,
            |record| {
                catalog.borrow_mut().push(record.clone());
                Ok(())
            },
            &mut |sw| w.apply(sw),
            stop_at,
        )
    }

    /// A row without its bytes (a checksum of them instead), so a failure
    /// prints readably.
    fn short(r: &Row) -> (u64, u8, i64, u32) {
        (r.0, r.1.topic[0], r.2, crc32fast::hash(&r.3))
    }

    fn shorts(rows: &[Row]) -> Vec<(u64, u8, i64, u32)> {
        rows.iter().map(short).collect()
    }

    /// Every tp reads back exactly its rows, from the start and from any
    /// offset; every subtree stream read from anywhere equals the reference.
    fn check_reads(s: &Storage, rows: &[Row], max: usize) -> Result<(), TestCaseError> {
        for b in 0..3 {
            for t in 0..2u8 {
                let want: Vec<&Row> = rows.iter().filter(|r| r.1 == tp(b, t)).collect();
                let mut got: Vec<(i64, Vec<u8>)> = Vec::new();
                let mut offset = 0;
                loop {
                    let r = s.read(&tp(b, t), offset, max, true).unwrap();
                    if r.records.is_empty() {
                        break;
                    }
                    for rec in &r.records {
                        got.push((batch::BatchHeader::parse(rec).unwrap().base_offset, rec.to_vec()));
                    }
                    offset = r.next_offset;
                }
                let want_rows: Vec<(i64, u32)> = want.iter().map(|r| (r.2, crc32fast::hash(&r.3))).collect();
                let got: Vec<(i64, u32)> = got.iter().map(|(o, b)| (*o, crc32fast::hash(b))).collect();
                prop_assert_eq!(&got, &want_rows, "tp {:?}", tp(b, t));
                // ListOffsets by time: the first record at or after it.
                for ts in [0, 5, rows.len() as i64 / 2, rows.len() as i64 + 10] {
                    let want_ts = want.iter().find_map(|r| {
                        batch::record_timestamps(&r.3).unwrap().into_iter().find(|&(_, t)| t >= ts).map(|(d, t)| (r.2 + d as i64, t))
                    });
                    prop_assert_eq!(s.offset_for_timestamp(&tp(b, t), ts).unwrap(), want_ts, "tp {:?} time {}", tp(b, t), ts);
                }
                // From the middle of each batch: that batch first.
                for r in &want {
                    let n = batch::BatchHeader::parse(&r.3).unwrap().last_offset_delta as i64;
                    let read = s.read(&tp(b, t), r.2 + n / 2, 1, true).unwrap();
                    prop_assert!(read.records[0].as_ref() == &r.3[..], "tp {:?} at {}", tp(b, t), r.2 + n / 2);
                }
            }
        }
        let subtrees: [&[usize]; 5] = [&[0], &[1], &[2], &[0, 1], &[0, 1, 2]];
        for branches in subtrees {
            let names: Vec<String> = branches.iter().map(|&b| BRANCHES[b].to_owned()).collect();
            for from in [0, rows.len() as u64 / 3, rows.len() as u64 * 2 / 3] {
                let mut got: Vec<Row> = Vec::new();
                let mut at = from;
                let mut reads = 0;
                while at < s.visible_seq() {
                    reads += 1;
                    prop_assert!(reads <= 2 * rows.len() + 2);
                    let mut pick = |_: u64, _: &Tp, _: i64, _: &[u8]| Pick::Take;
                    let r = s.read_stream(&names, at, max, true, &mut pick).unwrap();
                    let next = if r.cut { r.batches.last().map(|m| m.seq + 1).unwrap() } else { r.examined_to };
                    got.extend(r.batches.into_iter().map(|m| (m.seq, m.tp, m.base_offset, m.bytes.to_vec())));
                    at = next;
                }
                prop_assert_eq!(shorts(&got), shorts(&expected(rows, branches, from, None, u64::MAX, usize::MAX)), "subtree {:?} from {}", branches, from);
            }
            prop_assert!(s.stream_start(&names) <= rows.iter().filter(|r| branches.contains(&((r.1.topic[0] / 10) as usize))).map(|r| r.0).min().unwrap_or(u64::MAX));
        }
        Ok(())
    }

    /// The data directory holds exactly the live segments and the stores the
    /// catalog lists: nothing leaked, nothing half-written.
    fn check_files(dir: &Path, s: &Storage, catalog: &[WindowRecord]) -> Result<(), TestCaseError> {
        let mut listed: Vec<String> = catalog.iter().flat_map(|w| w.stores.iter().filter(|st| st.live).map(move |st| store::file_name(w.window, st.store))).collect();
        listed.sort();
        let mut found: Vec<String> = std::fs::read_dir(dir.join("stores")).map(|rd| rd.map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect()).unwrap_or_default();
        found.sort();
        prop_assert_eq!(&found, &listed);
        prop_assert_eq!(s.store_count(), listed.len());
        let mut segs_on_disk = 0;
        for b in BRANCHES {
            let d = dir.join("log").join(format!("{b}.br"));
            let below = catalog.iter().flat_map(|w| w.compacted_to.iter()).filter(|(n, _)| n == b).map(|(_, s)| *s).max().unwrap_or(0);
            for e in std::fs::read_dir(&d).into_iter().flatten() {
                let name = e.unwrap().file_name().to_string_lossy().into_owned();
                if let Some(stem) = name.strip_suffix(".idx") {
                    prop_assert!(d.join(format!("{stem}.seg")).exists(), "index file {} without its segment", name);
                    continue;
                }
                let seq: u64 = name.strip_suffix(".seg").unwrap().parse().unwrap();
                prop_assert!(seq >= below, "{} below {} survived in {}", name, below, b);
                segs_on_disk += 1;
            }
        }
        prop_assert_eq!(segs_on_disk, s.segment_count());
        Ok(())
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 40, ..ProptestConfig::default() })]
        /// Random records on random topics, compacted in up to three windows
        /// under random plans (all in one store, a store per topic, random
        /// budgets, prefix3): every tp reads back its records in order and
        /// every subtree stream equals the reference, before and after a
        /// restart, from the tip or from disk.
        #[test]
        fn compacted_reads_equal_the_reference(
            appends in proptest::collection::vec((0usize..3, 0u8..2, 1usize..4, 0usize..500), 1..160),
            splits in proptest::collection::vec((strategies(), any::<prop::sample::Index>()), 1..4),
            tip in prop_oneof![Just(0usize), Just(1 << 20)],
            max in prop_oneof![Just(1usize), 100usize..5000, Just(1 << 20)],
        ) {
            let dir = tempfile::tempdir().unwrap();
            let catalog = RefCell::new(Vec::new());
            let mut rows = Vec::new();
            {
                let (s, mut w) = open_with(dir.path(), tip, None).unwrap();
                let mut at = 0;
                for (strategy, cut) in &splits {
                    let to = at + cut.index(appends.len() - at + 1);
                    let mut more = fill(&mut w, &appends[at..to], 2);
                    // Sequence numbers continue across fills.
                    rows.append(&mut more);
                    at = to;
                    settle(&mut w);
                    compact(&mut w, *strategy, &catalog, &mut |_| false).unwrap();
                    check_reads(&s, &rows, max)?;
                }
                rows.extend(fill(&mut w, &appends[at..], 2));
                settle(&mut w);
                check_reads(&s, &rows, max)?;
                check_files(dir.path(), &s, &catalog.borrow())?;
            }
            let (s, _w) = open_with(dir.path(), tip, Some(&catalog.borrow())).unwrap();
            check_reads(&s, &rows, max)?;
            check_files(dir.path(), &s, &catalog.borrow())?;
            // Without the catalog, a directory with stores is refused.
            if s.store_count() > 0 {
                drop(s);
                prop_assert!(matches!(open_with(dir.path(), tip, None), Err(StorageError::Catalog(_))));
            }
        }

        /// The compactor killed before or after each step: after a restart
        /// reads are identical, exactly the listed stores and unreplaced
        /// segments are on disk, and a second run finishes the job.
        #[test]
        fn a_compaction_killed_at_any_step_loses_and_leaks_nothing(
            appends in proptest::collection::vec((0usize..3, 0u8..2, 1usize..4, 100usize..500), 40..120),
            strategy in strategies(),
            earlier in any::<bool>(),
        ) {
            for step in Step::ALL {
                let dir = tempfile::tempdir().unwrap();
                let catalog = RefCell::new(Vec::new());
                let rows;
                let crashed;
                {
                    let (_s, mut w) = open_with(dir.path(), 0, None).unwrap();
                    let half = appends.len() / 2;
                    let mut first = fill(&mut w, &appends[..half], 2);
                    settle(&mut w);
                    if earlier {
                        // A window before, so stores exist on both sides of the crash.
                        compact(&mut w, strategy, &catalog, &mut |_| false).unwrap();
                    }
                    first.extend(fill(&mut w, &appends[half..], 2));
                    rows = first;
                    settle(&mut w);
                    let r = compact(&mut w, strategy, &catalog, &mut |at| at == step);
                    // Nothing due (the second half sealed no segment) is a
                    // run without a step to stop at.
                    crashed = matches!(r, Err(StorageError::Stopped(_)));
                    prop_assert!(crashed || matches!(r, Ok(None)), "{:?}: {:?}", step, r.map(|c| c.map(|c| c.segments)));
                }
                let (s, mut w) = open_with(dir.path(), 0, Some(&catalog.borrow())).unwrap();
                check_reads(&s, &rows, 1 << 20)?;
                check_files(dir.path(), &s, &catalog.borrow())?;
                let again = compact(&mut w, strategy, &catalog, &mut |_| false).unwrap();
                // Only a crash before the switch leaves segments due.
                prop_assert_eq!(again.is_some(), crashed && matches!(step, Step::Start | Step::Written | Step::Synced), "{:?}", step);
                check_reads(&s, &rows, 1 << 20)?;
                check_files(dir.path(), &s, &catalog.borrow())?;
            }
        }
    }

    #[test]
    fn a_failed_catalog_write_poisons_and_leaves_the_segments_serving() {
        let dir = tempfile::tempdir().unwrap();
        let rows;
        {
            let (s, mut w) = open_with(dir.path(), 0, None).unwrap();
            let appends: Vec<(usize, u8, usize, usize)> = (0..60).map(|i| (i % 3, (i % 2) as u8, 2, 300)).collect();
            rows = fill(&mut w, &appends, 1);
            settle(&mut w);
            let r = s.compact(1, &cfg(Strategy::Prefix3), name_of, &mut |_| true, |_| Err("disk full".into()), &mut |sw| w.apply(sw));
            assert!(matches!(r, Err(StorageError::Catalog(_))), "{r:?}");
            // Nothing more is acknowledged; reads still work.
            assert!(matches!(w.append(tp(0, 0), &rows[0].3, 0, false), Err(StorageError::Poisoned(_))));
            assert_eq!(s.read(&rows[0].1, rows[0].2, 1, true).unwrap().records[0].as_ref(), &rows[0].3[..]);
        }
        // The catalog never listed the window: its files go, the segments serve.
        let (s, _w) = open_with(dir.path(), 0, Some(&[])).unwrap();
        assert_eq!(s.store_count(), 0);
        assert_eq!(std::fs::read_dir(dir.path().join("stores")).unwrap().count(), 0);
        check_reads(&s, &rows, 1 << 20).unwrap();
    }

    /// Compaction takes no frame at or past its tp's hw, so a follower's
    /// divergent tail can always be cut; frames a cut killed do not hold
    /// it back; once the hw moves, the rest follows.
    #[test]
    fn compaction_stops_at_the_high_watermark() {
        let dir = tempfile::tempdir().unwrap();
        let (s, mut w) = open_with(dir.path(), 0, None).unwrap();
        let (t, sib) = (tp(0, 0), tp(0, 1));
        let catalog = RefCell::new(Vec::new());
        w.begin_epoch(t, 1).unwrap();
        s.limit_hw(&t, 5);
        // One batch per segment (4 KiB): t and its sibling in turn.
        let appends: Vec<(usize, u8, usize, usize)> = (0..20).map(|i| (0, (i % 2) as u8, 1, 3000)).collect();
        fill(&mut w, &appends, 1);
        settle(&mut w);
        assert_eq!(s.offsets(&t), Some((0, 5, 10)));
        compact(&mut w, Strategy::Prefix3, &catalog, &mut |_| false).unwrap().expect("a window");
        assert_eq!((s.stored_to(&t), s.stored_to(&sib)), (Some(4), Some(4)), "stopped at t's offset 5");
        assert!(matches!(w.truncate(t, 4, 0), Err(StorageError::Misplaced(_))), "into the stores");
        // The tail past the hw is cut, and written anew.
        assert_eq!(w.truncate(t, 7, 0).unwrap(), 7);
        fill(&mut w, &[(0, 0, 1, 3000), (0, 0, 1, 3000), (0, 0, 1, 3000), (0, 1, 1, 3000)], 1);
        settle(&mut w);
        s.limit_hw(&t, 8);
        assert_eq!(s.offsets(&t), Some((0, 8, 10)));
        // The dead 8 and 9 are past the hw, but their segments' summaries
        // end below the cut (at 7).
        compact(&mut w, Strategy::Prefix3, &catalog, &mut |_| false).unwrap().expect("a window");
        assert_eq!(s.stored_to(&t), Some(7), "up to the new 7, past the dead frames");
        for (offset, want) in [(6, 6), (7, 7)] {
            let r = s.read(&t, offset, 1, true).unwrap();
            assert_eq!(crate::protocol::batch::BatchHeader::parse(&r.records[0]).unwrap().base_offset, want);
        }
        s.limit_hw(&t, i64::MAX);
        compact(&mut w, Strategy::Prefix3, &catalog, &mut |_| false).unwrap().expect("a window");
        assert_eq!(s.stored_to(&t), Some(9), "everything sealed");
    }

    #[test]
    fn a_cancelled_compaction_switches_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let (s, mut w) = open_with(dir.path(), 0, None).unwrap();
        let appends: Vec<(usize, u8, usize, usize)> = (0..200).map(|i| (i % 3, (i % 2) as u8, 3, 3000)).collect();
        let rows = fill(&mut w, &appends, 1);
        settle(&mut w);
        let catalog = RefCell::new(Vec::new());
        let r = s.compact(
            1,
            &cfg(Strategy::Prefix3),
            name_of,
            &mut |_| false,
            |record| {
                catalog.borrow_mut().push(record.clone());
                Ok(())
            },
            &mut |sw| w.apply(sw),
        );
        assert!(matches!(r, Err(StorageError::Stopped(_))), "{r:?}");
        assert!(catalog.borrow().is_empty());
        assert_eq!(s.store_count(), 0);
        assert_eq!(std::fs::read_dir(dir.path().join("stores")).unwrap().count(), 0, "temporary files removed");
        check_reads(&s, &rows, 1 << 20).unwrap();
        assert!(compact(&mut w, Strategy::Prefix3, &catalog, &mut |_| false).unwrap().is_some());
    }

    #[test]
    fn a_damaged_listed_store_stops_the_start() {
        let dir = tempfile::tempdir().unwrap();
        let catalog = RefCell::new(Vec::new());
        {
            let (_s, mut w) = open_with(dir.path(), 0, None).unwrap();
            let appends: Vec<(usize, u8, usize, usize)> = (0..60).map(|i| (i % 3, (i % 2) as u8, 2, 300)).collect();
            fill(&mut w, &appends, 1);
            settle(&mut w);
            assert!(compact(&mut w, Strategy::Prefix3, &catalog, &mut |_| false).unwrap().is_some());
        }
        let w = catalog.borrow()[0].clone();
        let path = dir.path().join("stores").join(store::file_name(w.window, w.stores.iter().find(|s| s.live).unwrap().store));
        let mut bytes = std::fs::read(&path).unwrap();
        let n = bytes.len();
        bytes[n - 30] ^= 0xff;
        std::fs::write(&path, &bytes).unwrap();
        assert!(matches!(open_with(dir.path(), 0, Some(&catalog.borrow())), Err(StorageError::Store(_))));
        std::fs::remove_file(&path).unwrap();
        assert!(matches!(open_with(dir.path(), 0, Some(&catalog.borrow())), Err(StorageError::Store(_))));
    }

    #[test]
    fn retention_deletes_whole_stores_and_the_catalog_forgets_them_first() {
        let dir = tempfile::tempdir().unwrap();
        let catalog = RefCell::new(Vec::new());
        let (s, mut w) = open_with(dir.path(), 0, None).unwrap();
        let appends: Vec<(usize, u8, usize, usize)> = (0..90).map(|i| (i % 3, (i % 2) as u8, 2, 300)).collect();
        let rows = fill(&mut w, &appends, 1);
        settle(&mut w);
        let done = compact(&mut w, Strategy::Adaptive(Budget { max_stores: Some(1000), min_store_bytes: 0 }), &catalog, &mut |_| false).unwrap().unwrap();
        assert!(done.window.stores.iter().filter(|s| s.live).count() >= 6);
        let stores_before = s.store_count();
        // Expire everything of topic (0, 0): batch timestamps are their append index.
        let victim = tp(0, 0);
        let policy = |t: &Tp| if *t == victim { RetentionPolicy { retention_ms: Some(0), retention_bytes: None } } else { RetentionPolicy::default() };
        let dropped = RefCell::new(Vec::new());
        let (starts, deleted) = s
            .enforce_retention(1_000_000, policy, |_| Ok(()), |gone| {
                // Files are still there when the catalog is told.
                for (w, st) in gone {
                    assert!(dir.path().join("stores").join(store::file_name(*w, *st)).exists());
                }
                dropped.borrow_mut().extend_from_slice(gone);
                Ok(())
            }, &mut |sw| w.apply(sw))
            .unwrap();
        assert!(starts.iter().any(|(t, _)| *t == victim));
        assert_eq!(dropped.borrow().len(), 1, "the victim's own store");
        assert!(deleted >= 1);
        assert_eq!(s.store_count(), stores_before - 1);
        let (w, st) = dropped.borrow()[0];
        assert!(!dir.path().join("stores").join(store::file_name(w, st)).exists());
        // The others read on.
        let others: Vec<Row> = rows.iter().filter(|r| r.1 != victim).cloned().collect();
        for r in &others {
            assert_eq!(s.read(&r.1, r.2, 1, true).unwrap().records[0].as_ref(), &r.3[..]);
        }
        // The victim starts after its store (its newest batches are in the
        // active segment, which retention never touches).
        let (log_start, hw, _) = s.offsets(&victim).unwrap();
        assert!(log_start > 0 && log_start <= hw);
        assert!(matches!(s.read(&victim, 0, 1, true), Err(ReadError::OffsetOutOfRange { .. })));
        for r in rows.iter().filter(|r| r.1 == victim && r.2 >= log_start) {
            assert_eq!(s.read(&victim, r.2, 1, true).unwrap().records[0].as_ref(), &r.3[..]);
        }
    }
}
