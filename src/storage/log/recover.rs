//! Recovery: opening the branch logs and the subtree stores at start-up,
//! and the clean-shutdown marker that lets a clean restart trust each
//! branch's active segment instead of deep-scanning it. Each segment's
//! index file (`seg_index.rs`) says what it holds; only frames past what
//! it covers are walked.
//!
//! The stores come first (they hold each tp's oldest batches), then every
//! branch's segments in order. A torn or corrupt tail of an active segment
//! (the last one holding frames) is cut; damage anywhere else refuses the
//! start, naming the file.

use super::*;

/// The clean-shutdown marker in the data directory (see
/// [`Storage::mark_clean`]).
pub const CLEAN_MARKER: &str = "CLEAN_SHUTDOWN";

impl Storage {
    /// Opens the branch logs under `dir`, recovering each one.
    ///
    /// `clean` says the previous run shut down cleanly (every segment was
    /// synced): then only frame headers are walked. Otherwise the active
    /// segment of each branch is deep-scanned and a torn or corrupt tail is
    /// truncated at the last valid frame. Frames of topics not in `specs`
    /// (deleted topics) are skipped.
    ///
    /// Returns the shared storage and its one writer (see `writer`).
    pub fn open(dir: &Path, cfg: StorageConfig, specs: Vec<PartitionSpec>, clean: bool) -> Result<(Arc<Storage>, LogWriter), StorageError> {
        Storage::open_with(dir, cfg, specs, clean, None)
    }

    /// [`Storage::open`] with the compaction windows the catalog records.
    /// With `None` (no catalog), a data directory holding stores is refused
    /// rather than guessed at.
    pub fn open_with(dir: &Path, cfg: StorageConfig, specs: Vec<PartitionSpec>, clean: bool, windows: Option<&[WindowRecord]>) -> Result<(Arc<Storage>, LogWriter), StorageError> {
        let started = Instant::now();
        let log_dir = dir.join("log");
        let disk = cfg.disk.clone();
        Storage::create_data_dir(dir, &cfg)?;
        disk.create_dir_all(&log_dir).map_err(io_err(&log_dir))?;
        // The log directory's name, and the names of the branch directories
        // in it, durable before anything is written under them: a run that
        // stopped (or failed) between creating one and syncing it left it
        // there, not durable, and segments must not go into it so.
        sync_dir(&*disk, dir)?;
        sync_dir(&*disk, &log_dir)?;
        let stores_dir = dir.join("stores");
        let mut report = RecoveryReport::default();
        let mut branches: HashMap<String, Arc<Branch>> = HashMap::default();
        let mut parts: HashMap<Tp, Arc<Partition>> = HashMap::default();
        let mut writers: HashMap<Tp, PartWriter> = HashMap::default();
        let mut next_seq = 0u64;
        let cache = FileCache::new(cfg.max_open_files, disk.clone());
        let mut unindexed: Vec<(Arc<Segment>, bool)> = Vec::new();

        let storage_branch = |branches: &mut HashMap<String, Arc<Branch>>, name: &str| -> Arc<Branch> {
            branches
                .entry(name.to_owned())
                .or_insert_with(|| Branch::new(log_dir.join(branch_dir_name(name)), &*disk))
                .clone()
        };
        // Truncations in force (`log/cuts.rs`), applied below as each
        // branch's segments pass them; the persisted log starts bound
        // what a cut may lower.
        let loaded_cuts = state::load_state(&*disk, dir, cuts::CHECKPOINT, cuts::decode)?.unwrap_or_default();
        let mut kept_cuts = cuts::Cuts::default();
        let spec_starts: HashMap<Tp, i64> = specs.iter().map(|s| (s.tp, s.log_start)).collect();
        for spec in &specs {
            let branch = storage_branch(&mut branches, &spec.branch);
            let part = Partition::new(spec, branch);
            writers.insert(spec.tp, PartWriter::new(part.clone(), spec.log_start));
            parts.insert(spec.tp, part);
        }

        // The stores first: they hold each tp's oldest batches.
        let (stores, compacted_to, next_window) = open_stores(&*disk, &stores_dir, windows, &mut writers, &mut report, &cache)?;
        for st in &stores {
            next_seq = next_seq.max(st.store.end_seq);
        }

        let mut entries = disk.list(&log_dir).map_err(io_err(&log_dir))?;
        entries.sort();
        let total_branches = entries.len();
        let mut last_progress = Instant::now();
        for (done, entry) in entries.into_iter().enumerate() {
            // Progress for operators watching a long recovery.
            if last_progress.elapsed() >= Duration::from_secs(2) {
                last_progress = Instant::now();
                tracing::info!(branches_done = done, branches = total_branches, segments = report.segments, bytes = report.bytes, elapsed_ms = started.elapsed().as_millis() as u64, "recovering branch logs");
            }
            let Some(branch_name) = entry.strip_suffix(".br") else { continue };
            let branch = storage_branch(&mut branches, branch_name);
            let mut files: Vec<(u64, PathBuf)> = Vec::new();
            let mut index_files: Vec<(u64, PathBuf)> = Vec::new();
            for fname in disk.list(&branch.dir).map_err(io_err(&branch.dir))? {
                if let Some(seq) = fname.strip_suffix(".seg").and_then(|s| s.parse::<u64>().ok()) {
                    files.push((seq, branch.dir.join(fname)));
                } else if let Some(seq) = fname.strip_suffix(".idx").and_then(|s| s.parse::<u64>().ok()) {
                    index_files.push((seq, branch.dir.join(fname)));
                }
            }
            files.sort();
            // Replaced by stores (the catalog says so) but not yet deleted
            // when the broker stopped.
            let replaced_below = compacted_to.get(branch_name).copied().unwrap_or(0);
            let before = files.len();
            for (_, path) in files.iter().filter(|(seq, _)| *seq < replaced_below) {
                tracing::info!(path = %path.display(), "deleting segment replaced by subtree stores");
                disk.remove_file(path).map_err(io_err(path))?;
            }
            files.retain(|(seq, _)| *seq >= replaced_below);
            if files.len() < before {
                sync_dir(&*disk, &branch.dir)?;
            }
            // This branch's cuts, in sequence order; one with no segment
            // based below it any more killed frames that are gone.
            let first_base = files.first().map_or(u64::MAX, |(seq, _)| *seq);
            let mut pending: VecDeque<(Tp, cuts::Cut)> = {
                let mut v: Vec<(Tp, cuts::Cut)> = loaded_cuts
                    .iter()
                    .filter(|(tp, _)| writers.get(tp).is_some_and(|w| Arc::ptr_eq(&w.part.branch, &branch)))
                    .flat_map(|(tp, cs)| cs.iter().filter(|c| c.seq > first_base).map(move |c| (*tp, *c)))
                    .collect();
                v.sort_by_key(|(tp, c)| (c.seq, *tp));
                v.into()
            };
            for (tp, c) in &pending {
                kept_cuts.entry(*tp).or_default().push(*c);
            }
            let count = files.len();
            let mut lens = Vec::with_capacity(count);
            for (_, path) in &files {
                lens.push(disk.file_len(path).map_err(io_err(path))?);
            }
            // The active segment is the last one holding frames: segments
            // after it hold none (a roll whose first frame never came, or a
            // roll that failed after creating its file, which a crash can
            // bring back). Only a roll that synced the segment before it
            // creates the next one, so a segment followed by frames is
            // whole, and one followed by empty segments alone may end in
            // unsynced writes, as the active one may.
            let active = lens.iter().rposition(|&l| l > FILE_HEADER_BYTES).unwrap_or(count.saturating_sub(1));
            let mut segs = Vec::with_capacity(count);
            for (i, (file_base, path)) in files.into_iter().enumerate() {
                // The segments before a cut are all read: it applies now.
                while pending.front().is_some_and(|(_, c)| c.seq <= file_base) {
                    let (tp, c) = pending.pop_front().expect("checked");
                    apply_cut(writers.get_mut(&tp).expect("a kept cut's tp"), c, &segs, spec_starts[&tp]);
                }
                let is_active = i >= active;
                let len = lens[i];
                if len < FILE_HEADER_BYTES && is_active {
                    // Crashed between creating the file and syncing its header.
                    tracing::warn!(path = %path.display(), "removing segment with torn header");
                    disk.remove_file(&path).map_err(io_err(&path))?;
                    continue;
                }
                let deep = !clean && is_active;
                let (header, file, file_len) = segment::open(&*disk, &path)?;
                // What the segment's index file describes is taken from it;
                // only what lies past it is walked (deep-scanned after a
                // crash, if the segment is the active one).
                let index = seg_index::load(&*disk, &path, &header, &*file, file_len);
                let from = index.as_ref().map_or(FILE_HEADER_BYTES, |ix| ix.covered_len);
                let last_seq = index.as_ref().and_then(|ix| ix.last).map(|l| l.seq);
                let scan = segment::scan_from(&path, header, file, file_len, deep, from, last_seq)?;
                report.segments += 1;
                report.indexed_segments += index.is_some() as usize;
                if deep {
                    report.deep_scanned_bytes += scan.valid_len - from;
                }
                if scan.valid_len < scan.file_len && !is_active {
                    // Sealed segments were fsynced whole when they rolled:
                    // damage there is a disk problem, and cutting it would
                    // silently drop acked offsets in the middle of a log.
                    return Err(StorageError::CorruptSealed { path: path.display().to_string(), valid: scan.valid_len, len: scan.file_len });
                }
                let mut scan = scan;
                if scan.valid_len < scan.file_len && cfg.planted == Some(Planted::KeepTornTail) {
                    scan.valid_len = scan.file_len;
                }
                if scan.valid_len < scan.file_len {
                    tracing::warn!(path = %path.display(), valid = scan.valid_len, found = scan.file_len,
                        "truncating torn or corrupt segment tail");
                    report.truncated_bytes += scan.file_len - scan.valid_len;
                    scan.file.set_len(scan.valid_len).map_err(io_err(&path))?;
                    scan.file.sync_all().map_err(io_err(&path))?;
                }
                let seg = Arc::new(Segment::new(scan.header, path.clone(), cache.adopt(path.clone(), true, scan.file), scan.valid_len));
                next_seq = next_seq.max(seg.base_seq);
                if let Some(ix) = &index {
                    next_seq = next_seq.max(ix.end_seq);
                    apply_index(&seg, ix, &mut writers, &mut report);
                }
                for (pos, fh) in &scan.frames {
                    next_seq = next_seq.max(fh.seq + 1);
                    seg.mark(fh.seq, *pos, fh.crc);
                    report.frames += 1;
                    report.bytes += fh.frame_len as u64;
                    let tp = Tp { topic: fh.topic_id, partition: fh.partition };
                    let Some(w) = writers.get_mut(&tp) else {
                        // A deleted topic's frame: counted, not indexed.
                        seg.note(tp, fh.last_offset(), fh.frame_len as u64, fh.max_timestamp, false);
                        continue;
                    };
                    let entry = w.index_entry(&seg, *pos, fh, &cfg);
                    seg.note(tp, fh.last_offset(), fh.frame_len as u64, fh.max_timestamp, entry.is_some());
                    let mut st = w.part.st.write().expect("partition lock");
                    if let Some(e) = entry {
                        st.index.push_back(e);
                    }
                    w.next_offset = w.next_offset.max(fh.last_offset() + 1);
                    st.leo = w.next_offset;
                    st.recovered_to(w.next_offset);
                    // Frames below a persisted log start stay indexed;
                    // the log start itself may only rise to the first
                    // surviving batch.
                    if st.index.len() == 1 && entry.is_some() && st.stored.is_empty() {
                        st.log_start = st.log_start.max(fh.base_offset);
                    }
                }
                if index.is_none_or(|ix| ix.covered_len < scan.valid_len) {
                    unindexed.push((seg.clone(), is_active));
                } else {
                    *seg.indexed.lock().expect("segment index lock") = scan.valid_len;
                }
                segs.push(seg);
            }
            for (tp, c) in pending {
                apply_cut(writers.get_mut(&tp).expect("a kept cut's tp"), c, &segs, spec_starts[&tp]);
            }
            // Index files whose segment is gone (deleted by retention or
            // compaction, or just now) go too.
            for (seq, path) in &index_files {
                // `segs` is in base sequence order.
                if segs.binary_search_by_key(seq, |s: &Arc<Segment>| s.base_seq).is_err() {
                    disk.remove_file(path).map_err(io_err(path))?;
                }
            }
            *branch.segs.write().expect("branch lock") = segs;
        }
        report.elapsed_ms = started.elapsed().as_millis();
        let storage = Arc::new(Storage {
            read_pool: Arc::default(),
            ahead_bytes: Arc::default(),
            dir: log_dir,
            data_dir: dir.to_owned(),
            branches: RwLock::new(branches),
            parts: RwLock::new(parts),
            files: cache,
            tip: RwLock::new(crate::storage::tip::Tip::new(cfg.tip.clone())),
            cfg,
            poisoned: Mutex::new(None),
            report,
            visible_seq: AtomicU64::new(next_seq),
            stores: RwLock::new(stores),
            stores_dir,
            maintenance: Mutex::new(Maintenance { next_window }),
            read_stats: ReadStats::default(),
            compaction_stats: CompactionStats::default(),
            unsynced: AtomicU64::new(0),
            dirty: Mutex::default(),
            checkpoints: Mutex::default(),
            cached: Mutex::default(),
            cache_dropped_bytes: AtomicU64::new(0),
            any_cuts: AtomicBool::new(!kept_cuts.is_empty()),
            hws_on_disk: Mutex::default(),
            cuts: RwLock::new(Arc::new(kept_cuts)),
        });
        // Cuts dropped above (their dead frames are gone, or their topic)
        // leave the file.
        let kept = storage.cuts.read().expect("cuts lock").clone();
        if *kept != loaded_cuts {
            storage.put_state(cuts::CHECKPOINT, &cuts::encode(&kept))?;
        }
        // Sealed segments walked for want of an index file get one now,
        // so the next start reads it (active ones get theirs at a clean
        // stop).
        for (seg, active) in unindexed {
            if !active {
                storage.write_seg_index(&seg, &[]);
            }
        }
        let cut = storage.load_epochs(&writers)?;
        storage.load_hws(&writers)?;
        let mut writer = LogWriter::new(storage.clone(), next_seq, writers);
        // What the cut dropped must not come back at the next start, when
        // the log may have grown past it again: the next flush writes the
        // checkpoint anew, before its frames.
        writer.epochs_dirty = cut;
        Ok((storage, writer))
    }

    /// Each tp's leader epochs from the checkpoint, cut to the log end
    /// and log start recovery found (`log/epochs.rs`). A checkpoint that
    /// does not verify refuses the start: without it, a replica could
    /// answer where its log diverges wrongly. Returns whether anything
    /// was cut.
    fn load_epochs(&self, writers: &HashMap<Tp, PartWriter>) -> Result<bool, StorageError> {
        let Some(caches) = state::load_state(&*self.cfg.disk, &self.data_dir, epochs::CHECKPOINT, epochs::decode)? else { return Ok(false) };
        let mut cut = false;
        for (tp, mut cache) in caches {
            // Tps of deleted topics are left out of the next checkpoint.
            let Some(w) = writers.get(&tp) else {
                cut = true;
                continue;
            };
            let mut st = w.part.st.write().expect("partition lock");
            // Start first: an empty log (start = end) keeps no epoch,
            // whichever cut the last checkpoint saw.
            cut |= cache.truncate_from_start(st.log_start);
            cut |= cache.truncate_from_end(w.next_offset);
            st.epochs = cache;
        }
        Ok(cut)
    }

    /// Creates the data directory if it is not there (the first start),
    /// with any missing parents, and makes their names durable: a crash
    /// right after must not take the directory, and every acknowledged
    /// batch under it, away. Nothing to do when it exists.
    pub fn create_data_dir(dir: &Path, cfg: &StorageConfig) -> Result<(), StorageError> {
        let disk = &*cfg.disk;
        let mut missing = Vec::new();
        let mut at = dir;
        while !disk.exists(at) {
            missing.push(at);
            match at.parent() {
                Some(p) if !p.as_os_str().is_empty() => at = p,
                _ => break,
            }
        }
        if missing.is_empty() {
            return Ok(());
        }
        disk.create_dir_all(dir).map_err(open_err(dir))?;
        // Outermost first: each name is durable in a parent that is.
        for d in missing.into_iter().rev() {
            if let Some(parent) = d.parent().filter(|p| !p.as_os_str().is_empty()) {
                sync_dir(disk, parent)?;
            }
        }
        Ok(())
    }

    /// Whether the previous run over `dir` stopped cleanly: its
    /// [`Storage::mark_clean`] is there, so every segment was synced and an
    /// open need only walk frame headers.
    pub fn stopped_cleanly(dir: &Path, cfg: &StorageConfig) -> bool {
        cfg.disk.exists(&dir.join(CLEAN_MARKER))
    }

    /// After an open that trusted the marker: removed (durably), so a crash
    /// of this run is never taken for a clean stop.
    pub fn clear_clean_marker(&self) -> Result<(), StorageError> {
        let marker = self.data_dir.join(CLEAN_MARKER);
        if !self.cfg.disk.exists(&marker) {
            return Ok(());
        }
        self.cfg.disk.remove_file(&marker).map_err(io_err(&marker))?;
        sync_dir(&*self.cfg.disk, &self.data_dir)
    }

    /// The last step of a clean stop, after the last sync: the marker that
    /// lets the next open skip the deep scan. Refused when poisoned.
    pub fn mark_clean(&self) -> Result<(), StorageError> {
        self.check_poison()?;
        self.write_seg_indexes();
        let marker = self.data_dir.join(CLEAN_MARKER);
        let disk = &*self.cfg.disk;
        if !disk.exists(&marker) {
            let f = disk.open(&marker, Mode::CreateNew).map_err(open_err(&marker))?;
            f.write_all_at(b"clean\n", 0).and_then(|_| f.sync_all()).map_err(io_err(&marker))?;
        }
        sync_dir(disk, &self.data_dir)
    }
}

/// Takes what a segment's index file says: the segment's shares, marks
/// and last frame, and per tp its entries, log end and writer state, as
/// walking the frames it covers would have found them.
fn apply_index(seg: &Segment, ix: &seg_index::SegIndex, writers: &mut HashMap<Tp, PartWriter>, report: &mut RecoveryReport) {
    seg.end_seq.fetch_max(ix.end_seq, Ordering::AcqRel);
    {
        let mut m = seg.marks.lock().expect("segment marks lock");
        m.sparse.clone_from(&ix.marks);
        m.last = ix.last;
        m.frames = ix.frames;
    }
    report.frames += ix.frames;
    let mut shares = seg.tps.lock().expect("segment tps lock");
    for t in &ix.tps {
        shares.insert(t.tp, SegTp { last_offset: t.last_offset, bytes: t.bytes, max_ts: t.max_ts, since_entry: t.since_entry });
        report.bytes += t.bytes;
        let Some(w) = writers.get_mut(&t.tp) else { continue };
        let part = w.part.clone();
        let mut st = part.st.write().expect("partition lock");
        if let Some(first) = t.entries.first() {
            // As in the walk: the log start may only rise to the first
            // surviving batch.
            if st.index.is_empty() && st.stored.is_empty() {
                st.log_start = st.log_start.max(first.offset);
            }
        }
        st.index.extend(t.entries.iter().copied());
        w.restore(seg.base_seq, t);
        st.leo = w.next_offset;
        st.recovered_to(w.next_offset);
    }
}

/// A truncation met in recovery: what the segments before it (and the
/// stores) left of the tp is cut at `cut.end`, as [`LogWriter::truncate`]
/// cut it at run time. The log start may only have risen to the first
/// surviving batch, which may be a dead one: it comes back to the cut or
/// to the persisted start, whichever is later.
fn apply_cut(w: &mut PartWriter, cut: cuts::Cut, segs: &[Arc<Segment>], persisted_start: i64) {
    let mut st = w.part.st.write().expect("partition lock");
    st.log_start = st.log_start.min(cut.end.max(persisted_start));
    w.next_offset = w.next_offset.min(cut.end).max(st.log_start);
    st.leo = w.next_offset;
    st.recovered_to(w.next_offset);
    while st.index.back().is_some_and(|e| e.offset >= cut.end) {
        st.index.pop_back();
    }
    w.last_entry = None;
    w.bytes_since_entry = 0;
    super::writer::clamp_summaries(segs, &w.part.tp, cut);
}

/// Opens the stores the catalog lists (`windows`), deletes every other file
/// in `dir` (stores of a compaction that never switched, or that retention
/// dropped), and hands each tp its stores. Returns the stores, per branch
/// the sequence number below which its segments are replaced, and the next
/// window number.
#[allow(clippy::type_complexity)]
fn open_stores(
    disk: &dyn Disk,
    dir: &Path,
    windows: Option<&[WindowRecord]>,
    writers: &mut HashMap<Tp, PartWriter>,
    report: &mut RecoveryReport,
    files: &Arc<FileCache>,
) -> Result<(Vec<Arc<StoreFile>>, HashMap<String, u64>, u64), StorageError> {
    let mut found: Vec<(String, PathBuf)> = match disk.list(dir) {
        Ok(names) => names.into_iter().map(|n| (n.clone(), dir.join(n))).collect(),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Vec::new(),
        Err(e) => return Err(io_err(dir)(e)),
    };
    found.sort();
    let Some(windows) = windows else {
        if found.is_empty() {
            return Ok((Vec::new(), HashMap::default(), 0));
        }
        return Err(StorageError::Catalog(format!("{} holds subtree stores but no catalog of them was given", dir.display())));
    };
    let live = WindowRecord::live_stores(windows);
    let mut compacted_to: HashMap<String, u64> = HashMap::default();
    let mut next_window = 0;
    for w in windows {
        next_window = next_window.max(w.window + 1);
        for (branch, seq) in &w.compacted_to {
            let e = compacted_to.entry(branch.clone()).or_default();
            *e = (*e).max(*seq);
        }
    }
    let cleanings: HashMap<u64, Option<i64>> = windows.iter().filter(|w| !w.cleaned.is_empty()).map(|w| (w.window, w.horizon_ms)).collect();
    let mut removed = false;
    for (name, path) in &found {
        if !store::parse_file_name(name).is_some_and(|k| live.contains(&k)) {
            tracing::info!(path = %path.display(), "deleting store file the catalog does not list (an unfinished compaction or a dropped store)");
            disk.remove_file(path).map_err(io_err(path))?;
            removed = true;
        }
    }
    if removed {
        sync_dir(disk, dir)?;
    }
    let mut stores = Vec::with_capacity(live.len());
    // The tps that have stores: only they are ordered below.
    let mut stored: crate::storage::hashing::HashSet<Tp> = Default::default();
    for (window, n) in live {
        // A listed store that is missing or damaged is lost data: refuse to
        // start rather than serve a log with a hole.
        let store = Store::open(disk, &dir.join(store::file_name(window, n))).map_err(StorageError::Store)?;
        let mut file = StoreFile::new(store, files, |tp| writers.get(tp).map(|w| branch_name(&w.part.branch)));
        if let Some(horizon) = cleanings.get(&window) {
            file.clean = Some(*horizon);
        }
        let file = Arc::new(file);
        for (tp, share) in &file.store.tps {
            let Some(w) = writers.get_mut(tp) else { continue };
            stored.insert(*tp);
            let mut st = w.part.st.write().expect("partition lock");
            st.stored.push(file.clone());
            w.next_offset = w.next_offset.max(share.last_offset + 1);
            st.leo = w.next_offset;
            st.recovered_to(w.next_offset);
        }
        report.stores += 1;
        report.bytes += file.store.file_len;
        stores.push(file);
    }
    for w in stored.iter().filter_map(|tp| writers.get(tp)) {
        let mut st = w.part.st.write().expect("partition lock");
        // A tp's stores in offset order: a cleaning's store has a newer
        // window than stores it did not take, and holds older offsets.
        st.stored.sort_by_key(|s| s.store.tps[&w.part.tp].first_offset);
        if let Some(first) = st.stored.first() {
            // The log start may only rise to the first surviving batch.
            st.log_start = st.log_start.max(first.store.tps[&w.part.tp].first_offset);
        }
    }
    Ok((stores, compacted_to, next_window))
}
