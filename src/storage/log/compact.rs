//! Compaction: sealed branch-log segments become subtree stores.
//!
//! One run (a *window*) takes, in every branch, the oldest sealed segments
//! that were sealed at least `lag_ms` ago (up to `max_bytes` in all), plans
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

/// Read chunk of the compactor's cursors.
const COMPACT_CHUNK: usize = 1 << 20;

impl Storage {
    /// Runs one compaction window (see the module docs), if any segment is
    /// due. `name_of` names live topics (frames of others are dropped);
    /// `throttle` is called with the bytes read since its last call, about
    /// every MiB, and may sleep to bound the compactor's I/O; `persist`
    /// must make the window record durable in the catalog.
    pub fn compact(
        &self,
        now_ms: i64,
        cfg: &CompactConfig,
        name_of: impl Fn(&TopicId) -> Option<String>,
        throttle: &mut dyn FnMut(u64),
        persist: impl FnOnce(&WindowRecord) -> Result<(), String>,
    ) -> Result<Option<Compacted>, StorageError> {
        self.compact_until(now_ms, cfg, name_of, throttle, persist, &|_| false)
    }

    /// [`Storage::compact`] that stops (as a crash would) at the first step
    /// `stop_at` says yes to, returning `StorageError::Stopped`.
    pub fn compact_until(
        &self,
        now_ms: i64,
        cfg: &CompactConfig,
        name_of: impl Fn(&TopicId) -> Option<String>,
        throttle: &mut dyn FnMut(u64),
        persist: impl FnOnce(&WindowRecord) -> Result<(), String>,
        stop_at: &dyn Fn(Step) -> bool,
    ) -> Result<Option<Compacted>, StorageError> {
        let stop = |step: Step| if stop_at(step) { Err(StorageError::Stopped(format!("{step:?}"))) } else { Ok(()) };
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
                // Sealed when the next one was created; published whole.
                if now_ms - next.created_ms < cfg.lag_ms || seg.end_seq.load(Ordering::Acquire) > visible || seg.dirty.load(Ordering::Acquire) {
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
        let mut names: HashMap<TopicId, Option<String>> = HashMap::new();
        let mut volume: HashMap<String, u64> = HashMap::new();
        for (_, _, seg, _, _) in &due {
            for (tp, share) in seg.tps.lock().expect("segment tps lock").iter() {
                let name = names.entry(tp.topic).or_insert_with(|| name_of(&tp.topic)).clone();
                if let (Some(name), Some(start)) = (name, log_start(tp)) {
                    if share.last_offset >= start {
                        *volume.entry(name).or_default() += share.bytes;
                    }
                }
            }
        }
        let volume: Vec<(String, u64)> = volume.into_iter().collect();
        let plan = split::plan(&volume, cfg.strategy);
        let index_of: HashMap<&str, usize> = plan.topics.iter().enumerate().map(|(i, (n, _))| (n.as_str(), i)).collect();
        let store_of = |topic: &TopicId| -> Option<usize> { names.get(topic)?.as_deref().and_then(|n| index_of.get(n)).map(|&t| plan.store_of[t]) };

        // 3. Copy the frames, in stream order, into their stores.
        let window = maintenance.next_window;
        fs::create_dir_all(&self.stores_dir).map_err(io_err(&self.stores_dir))?;
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
                        slot => slot.insert(StoreWriter::create(&tmp_path(s), window, s as u32, self.cfg.index_interval_bytes)?),
                    };
                    w.push(&fh, &buf[range.start - FRAME_HEADER_BYTES..range.end])?;
                }
                heads[i] = cursors[i].next(&mut scanned).map_err(io)?;
                merge.replace_top(heads[i].as_ref().map_or(u64::MAX, |h| h.0.seq));
                if scanned - throttled >= 1 << 20 {
                    throttle(scanned - throttled);
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
                let _ = fs::remove_file(tmp_path(s));
            }
            return Err(e);
        }
        stop(Step::Written)?;

        // 4. Durable under the final names (still unlisted).
        for (s, path, file, _) in &mut written {
            let to = self.stores_dir.join(store::file_name(window, *s as u32));
            store::sync_and_rename(file, path, &to)?;
            *path = to;
        }
        sync_dir(&self.stores_dir)?;
        sync_dir(self.dir.parent().unwrap_or(&self.dir))?;
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
        persist(&record).map_err(|e| StorageError::Catalog(format!("recording compaction window {window}: {e}")))?;
        maintenance.next_window = window + 1;
        stop(Step::Switched)?;

        // 6. Readers move to the stores; the segments go.
        let mut opened = Vec::with_capacity(written.len());
        for (_, path, _, _) in &written {
            let store = Store::open(path)?;
            let mut names: Vec<String> = store.tps.keys().filter_map(|tp| parts.get(tp)).map(|p| branch_key(&p.branch)).collect();
            names.sort();
            names.dedup();
            let names = names.into_iter().map(|b| b.strip_suffix(".br").unwrap_or(&b).to_owned()).collect();
            opened.push(Arc::new(StoreFile { store, branches: names }));
        }
        {
            let mut stores = self.stores.write().expect("stores lock");
            let first_live: HashMap<&str, u64> = compacted_to.iter().map(|(n, s)| (n.as_str(), *s)).collect();
            for (name, branch) in &branches {
                let Some(&first_live) = first_live.get(name.as_str()) else { continue };
                // Per tp at once: its new stores in, its entries into the
                // replaced segments out, so a reader sees one or the other.
                for part in parts.values().filter(|p| Arc::ptr_eq(&p.branch, branch)) {
                    let mut st = part.st.write().expect("partition lock");
                    st.stored.extend(opened.iter().filter(|s| s.store.tps.contains_key(&part.tp)).cloned());
                    while st.index.front().is_some_and(|e| e.seg < first_live) {
                        st.index.pop_front();
                    }
                }
                branch.segs.write().expect("branch lock").retain(|s| s.base_seq >= first_live);
            }
            stores.extend(opened.iter().cloned());
        }
        let bytes_in: u64 = due.iter().map(|d| d.2.len.load(Ordering::Acquire)).sum();
        let bytes_out: u64 = written.iter().map(|w| w.3).sum();
        let mut dirs = Vec::new();
        for (_, b, seg, _, _) in &due {
            match fs::remove_file(&seg.path) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(io_err(&seg.path)(e)),
            }
            if !dirs.contains(b) {
                dirs.push(*b);
            }
        }
        for b in dirs {
            sync_dir(&branches[b].1.dir)?;
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
