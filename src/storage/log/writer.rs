//! The log writer: the one owner of the write side of the branch logs.
//!
//! [`Storage::open`] hands back the shared [`Storage`] (what readers, the
//! syncer, retention and compaction use) and a [`LogWriter`], which the
//! engine's writer thread owns. Everything only the writer changes lives
//! here, behind `&mut self` and no lock: the stream sequence counter, each
//! tp's next offset and index spacing, the per-branch staged buffers with
//! their segment handles, and the choice to preallocate.
//!
//! ```text
//!  append ──► staged (per branch) ──flush──► one positioned write per branch
//!                                              ├─ segment length, tp index, log end published
//!                                              └─ segment onto the dirty list ──► Storage::sync (syncer)
//! ```
//!
//! Registry changes made elsewhere reach the writer without a lock on its
//! path: a partition added by [`Storage::add_partition`] is adopted the
//! first time it is appended to. A topic's deletion, like retention's
//! and compaction's changes, is a switch the writer applies itself
//! (`log/switch.rs`).

use super::*;

/// Writer-side bookkeeping of one tp.
pub(super) struct PartWriter {
    pub(super) part: Arc<Partition>,
    pub(super) next_offset: i64,
    pub(super) max_ts: i64,
    pub(super) last_entry: Option<(u64, u64)>,
    pub(super) bytes_since_entry: u64,
}

impl PartWriter {
    /// A partition nothing has been written to in this run.
    pub(super) fn new(part: Arc<Partition>, next_offset: i64) -> PartWriter {
        PartWriter { part, next_offset, max_ts: i64::MIN, last_entry: None, bytes_since_entry: 0 }
    }

    /// The state walking a segment's frames of this tp would leave, from
    /// the segment's index file instead.
    pub(super) fn restore(&mut self, seg: u64, t: &seg_index::TpIndex) {
        if let Some(last) = t.entries.last() {
            self.last_entry = Some((seg, last.pos));
            self.bytes_since_entry = t.since_entry;
        }
        let before = t.entries.iter().map(|e| e.max_ts_before).max().unwrap_or(i64::MIN);
        self.max_ts = self.max_ts.max(t.max_ts).max(before);
        self.next_offset = self.next_offset.max(t.last_offset + 1);
    }

    /// Decides whether the batch at `pos` gets an index entry.
    pub(super) fn index_entry(&mut self, seg: &Segment, pos: u64, fh: &FrameHeader, cfg: &StorageConfig) -> Option<IndexEntry> {
        let new_segment = self.last_entry.is_none_or(|(s, _)| s != seg.base_seq);
        let far = self.last_entry.is_some_and(|(_, p)| pos.saturating_sub(p) > MAX_SCAN_GAP);
        let entry = if new_segment || far || self.bytes_since_entry >= cfg.index_interval_bytes {
            self.last_entry = Some((seg.base_seq, pos));
            self.bytes_since_entry = 0;
            Some(IndexEntry { offset: fh.base_offset, seq: fh.seq, seg: seg.base_seq, pos, max_ts_before: self.max_ts })
        } else {
            None
        };
        self.bytes_since_entry += fh.frame_len as u64;
        self.max_ts = self.max_ts.max(fh.max_timestamp);
        entry
    }
}

/// Whether a batch at `base` spanning `delta` + 1 offsets can be placed at
/// all: offsets from 0, at least one, the last one (and the next after it)
/// within `i64`.
pub fn placeable(base: i64, delta: i32) -> Result<(), StorageError> {
    if base < 0 || delta < 0 || base.checked_add(i64::from(delta) + 1).is_none() {
        return Err(StorageError::Misplaced(format!("a batch at offset {base} with last offset delta {delta} has no place in a log")));
    }
    Ok(())
}

/// One branch's frames staged since the last flush.
struct Staged {
    seg: Arc<Segment>,
    /// The segment's file, held open from staging to the write.
    file: FileRef,
    start: u64,
    buf: Vec<u8>,
    /// Per appended batch: its partition, the log end after it, and its
    /// index entry if it gets one; published by the flush.
    published: Published,
}

pub struct LogWriter {
    log: Arc<Storage>,
    next_seq: u64,
    parts: HashMap<Tp, PartWriter>,
    /// By branch (its address, as the tip keys it: branches live as long
    /// as storage).
    staged: HashMap<u64, Staged>,
    /// Staging buffers of earlier rounds, emptied, for the next ones: a
    /// buffer grown afresh each round is memory touched afresh each round
    /// (page faults, and on a VM the host's) and copied as it doubles.
    spare: Spare,
    /// Whether the filesystem reserves space ahead of writes (fallocate).
    preallocate: bool,
    /// A tp's leader epochs changed since the checkpoint was written
    /// (`log/epochs.rs`): the next flush writes it before its frames.
    pub(super) epochs_dirty: bool,
}

/// Emptied staging buffers, bounded in count and in bytes.
#[derive(Default)]
struct Spare {
    bufs: Vec<(Vec<u8>, Published)>,
    bytes: usize,
}

type Published = Vec<(Arc<Partition>, i64, Option<IndexEntry>)>;

impl Spare {
    const MAX_BUFFERS: usize = 64;
    const MAX_BYTES: usize = 256 << 20;

    fn take(&mut self) -> (Vec<u8>, Published) {
        match self.bufs.pop() {
            Some((buf, published)) => {
                self.bytes -= buf.capacity();
                (buf, published)
            }
            None => Default::default(),
        }
    }

    fn give(&mut self, mut buf: Vec<u8>, mut published: Published) {
        if self.bufs.len() < Self::MAX_BUFFERS && self.bytes + buf.capacity() <= Self::MAX_BYTES {
            buf.clear();
            published.clear();
            self.bytes += buf.capacity();
            self.bufs.push((buf, published));
        }
    }
}

impl LogWriter {
    pub(super) fn new(log: Arc<Storage>, next_seq: u64, parts: HashMap<Tp, PartWriter>) -> LogWriter {
        LogWriter { log, next_seq, parts, staged: HashMap::default(), spare: Spare::default(), preallocate: true, epochs_dirty: false }
    }

    /// The storage this writer writes to.
    pub fn storage(&self) -> &Arc<Storage> {
        &self.log
    }

    /// Stages one validated batch for `tp`: assigns its offsets, patches
    /// `baseOffset` (the timestamps for LogAppendTime, and the tp's latest
    /// leader epoch if it has one) and frames it. Nothing is visible to
    /// readers until [`LogWriter::flush`].
    pub fn append(&mut self, tp: Tp, batch: &[u8], now_ms: i64, log_append_time: bool) -> Result<Appended, StorageError> {
        self.stage(tp, batch, now_ms, log_append_time, None)
    }

    /// Stages a batch another replica already placed (a follower's copy of
    /// its leader's batch): at the batch's own `baseOffset`, which must not
    /// be below this tp's next offset (above it is a gap the leader's
    /// cleaning left); its bytes, timestamps included, are kept as they
    /// are. A batch whose offsets cannot be (a negative base or delta, a
    /// last offset past `i64::MAX`) is refused too; nothing of a refused
    /// batch is staged. A batch whose `partitionLeaderEpoch` is new to the
    /// tp starts that epoch at its base offset; one whose epoch is below
    /// the tp's latest is refused as misplaced (a follower's log is cut
    /// back to where it agrees with its leader before it copies more).
    /// Nothing is visible to readers until [`LogWriter::flush`].
    pub fn append_at(&mut self, tp: Tp, batch: &[u8], now_ms: i64) -> Result<Appended, StorageError> {
        let h = crate::protocol::batch::BatchHeader::parse(batch).map_err(|e| StorageError::Misplaced(format!("the batch does not parse: {e:?}")))?;
        placeable(h.base_offset, h.last_offset_delta)?;
        self.stage(tp, batch, now_ms, false, Some((h.base_offset, h.partition_leader_epoch)))
    }

    /// This node leads `tp` from now on, in leader `epoch`: the epoch
    /// starts at the tp's next offset, written or not (Kafka's
    /// `maybeAssignEpochStartOffset`; a cache built only from batches would
    /// answer OffsetForLeaderEpoch wrongly for epochs that wrote nothing),
    /// and later appends are stamped with it. The same epoch again changes
    /// nothing; one below the tp's latest is refused. Durable with the next
    /// flush.
    pub fn begin_epoch(&mut self, tp: Tp, epoch: i32) -> Result<(), StorageError> {
        self.log.check_poison()?;
        let pw = part(&mut self.parts, &self.log, tp)?;
        let mut st = pw.part.st.write().expect("partition lock");
        match st.epochs.latest() {
            _ if epoch < 0 => Err(StorageError::StaleEpoch { epoch, latest: -1 }),
            Some(l) if epoch < l.epoch => Err(StorageError::StaleEpoch { epoch, latest: l.epoch }),
            _ => {
                self.epochs_dirty |= st.epochs.assign(epoch, pw.next_offset);
                Ok(())
            }
        }
    }

    /// `at`: a follower's copy, placed at its base offset, with its epoch.
    fn stage(&mut self, tp: Tp, batch: &[u8], now_ms: i64, log_append_time: bool, at: Option<(i64, i32)>) -> Result<Appended, StorageError> {
        let LogWriter { log, next_seq, parts, staged: all_staged, spare, preallocate, epochs_dirty } = self;
        let log = &**log;
        log.check_poison()?;
        let pw = part(parts, log, tp)?;
        let (log_start, latest_epoch) = {
            let st = pw.part.st.read().expect("partition lock");
            (st.log_start, st.epochs.latest())
        };
        // Checked before anything is staged: a misplaced batch changes nothing.
        if let Some((at, epoch)) = at {
            if at < pw.next_offset {
                return Err(StorageError::Misplaced(format!("a batch at offset {at} is below the next offset {}", pw.next_offset)));
            }
            if let Some(l) = latest_epoch.filter(|l| epoch < l.epoch) {
                return Err(StorageError::Misplaced(format!("a batch of leader epoch {epoch} at offset {at} follows epoch {} (from offset {})", l.epoch, l.start)));
            }
        }
        let branch_name = tip_key(&pw.part.branch);
        let frame_len = (FRAME_HEADER_BYTES + batch.len()) as u64;

        // Out of descriptors or disk space here, nothing of this batch is
        // staged: the append fails, storage carries on.
        let mut staged = take_staged(log, all_staged, spare, &pw.part.branch, *next_seq, now_ms)?;
        // Roll first if this frame would overfill the active segment.
        let seg_len = staged.start + staged.buf.len() as u64;
        let too_big = seg_len > FILE_HEADER_BYTES && seg_len + frame_len > log.cfg.segment_bytes;
        let too_old = seg_len > FILE_HEADER_BYTES && now_ms - staged.seg.created_ms >= log.cfg.segment_ms;
        if too_big || too_old {
            if let Err(e) = seal_and_roll(log, &mut staged, &pw.part.branch, *next_seq, now_ms, epochs_dirty) {
                // A roll that ran out of resources is tried again by the
                // next append.
                all_staged.insert(branch_name, staged);
                return Err(log.poison_unless_exhausted(e));
            }
        }
        // Disk space for the frame is reserved before it is given offsets:
        // a full disk fails this append, not a write whose ack is pending.
        let pos = staged.start + staged.buf.len() as u64;
        if let Err(e) = reserve(log, preallocate, &staged, pos + frame_len) {
            all_staged.insert(branch_name, staged);
            return Err(e);
        }

        let seq = *next_seq;
        *next_seq += 1;
        let base_offset = at.map_or(pw.next_offset, |(at, _)| at);
        // A leader's append carries its epoch; a copy keeps its leader's.
        let stamp = if at.is_none() { latest_epoch.map(|l| l.epoch) } else { None };
        let fh = segment::encode_frame(&mut staged.buf, seq, &tp.topic, tp.partition, base_offset, segment::Patch { log_append_time: log_append_time.then_some(now_ms), leader_epoch: stamp }, batch);
        let entry = pw.index_entry(&staged.seg, pos, &fh, &log.cfg);
        if log.cfg.tip.bytes > 0 {
            let at = (pos - staged.start) as usize + FRAME_HEADER_BYTES;
            log.tip.write().expect("tip lock").push(seq, tp, branch_name, base_offset, fh.last_offset(), &staged.buf[at..]);
        }
        staged.seg.note(tp, fh.last_offset(), frame_len, fh.max_timestamp, entry.is_some());
        staged.seg.mark(seq, pos, fh.crc);
        pw.next_offset = fh.last_offset() + 1;
        staged.published.push((pw.part.clone(), pw.next_offset, entry));
        if let Some((at, epoch)) = at.filter(|&(at, e)| e >= 0 && latest_epoch.is_none_or(|l| l.epoch != e || at < l.start)) {
            *epochs_dirty |= pw.part.st.write().expect("partition lock").epochs.assign(epoch, at);
        }
        all_staged.insert(branch_name, staged);
        Ok(Appended { base_offset, last_offset: fh.last_offset(), seq, log_start })
    }

    /// Cuts `tp`'s log back to `end`, a follower's divergent tail (see
    /// `log/cuts.rs`): the batch holding `end` and every later one go, so
    /// the log end becomes that batch's base offset, which is returned
    /// (`end` itself at a batch boundary; the log end, unchanged, when
    /// `end` is at or past it, when only epochs starting there go).
    /// Durable when it returns; the tp's leader epochs past the cut go
    /// with the next checkpoint. Refused, changing nothing: below the log
    /// start or through the batch holding it, or into what subtree stores
    /// hold (`Misplaced`); while batches of the tp are staged (flush first) or
    /// compaction or retention runs (`Busy`, retriable); when the hw
    /// checkpoint, which must not keep a hw past the cut, cannot be
    /// rewritten (`log/hws.rs`).
    pub fn truncate(&mut self, tp: Tp, end: i64, now_ms: i64) -> Result<i64, StorageError> {
        let log = self.log.clone();
        let LogWriter { next_seq, parts, staged: all_staged, spare, epochs_dirty, .. } = self;
        log.check_poison()?;
        let pw = part(parts, &log, tp)?;
        if end >= pw.next_offset {
            // Nothing to cut, but an epoch begun at the end and never
            // written goes (Kafka's `truncateTo` does the same): a node
            // that led briefly must take its new leader's older epoch.
            *epochs_dirty |= pw.part.st.write().expect("partition lock").epochs.truncate_from_end(end);
            return Ok(pw.next_offset);
        }
        // Compaction must not copy frames this cut kills, from a cursor
        // that started before it; retention's plan must not miss it.
        let Ok(_maintenance) = log.maintenance.try_lock() else { return Err(StorageError::Busy("compaction or retention is running".into())) };
        let log_start = {
            let st = pw.part.st.read().expect("partition lock");
            if end < st.log_start {
                return Err(StorageError::Misplaced(format!("a truncation to {end} is below the log start {}", st.log_start)));
            }
            if st.leo != pw.next_offset {
                return Err(StorageError::Busy("batches of the partition are staged: flush first".into()));
            }
            if let Some(l) = st.stored_to(&tp).filter(|&l| l >= end) {
                return Err(StorageError::Misplaced(format!("a truncation to {end} reaches into what subtree stores hold (to offset {l})")));
            }
            st.log_start
        };
        // The cut starts at the batch holding `end`.
        let mut at = end;
        let mut scanned = 0;
        log.walk(&pw.part, |st| st.start_at(&tp, end, 0), i64::MAX, &std::cell::Cell::new(MIN_READ_CHUNK), &mut scanned, |fh, _, _| {
            if fh.last_offset() < end {
                return Walk::Skip;
            }
            at = fh.base_offset.min(end);
            Walk::Stop
        })
        .map_err(|e| StorageError::Io { path: pw.part.branch.dir.display().to_string(), source: e })?;
        // A log start inside that batch (DeleteRecords): cutting it whole
        // would end the log below its start.
        if at < log_start {
            return Err(StorageError::Misplaced(format!("a truncation to {end} cuts the batch from {at}, which holds the log start {log_start}")));
        }
        // The hw checkpoint must not vouch for what the cut gives away;
        // none is written until the tp's hw is cut too (the guard).
        let _hws = log.lower_checkpointed_hw(&tp, at)?;
        // Every frame before the cut into segments based below it, every
        // later one into segments based at or above it: the branch rolls
        // (its active segment written, synced and sealed), unless the
        // active one is empty and based where the next frame goes.
        let branch = pw.part.branch.clone();
        let key = tip_key(&branch);
        let mut staged = take_staged(&log, all_staged, spare, &branch, *next_seq, now_ms)?;
        let empty = staged.start + staged.buf.len() as u64 <= FILE_HEADER_BYTES;
        if !(empty && staged.seg.base_seq == *next_seq) {
            if let Err(e) = seal_and_roll(&log, &mut staged, &branch, *next_seq, now_ms, epochs_dirty) {
                all_staged.insert(key, staged);
                return Err(log.poison_unless_exhausted(e));
            }
        }
        let cut = cuts::Cut { seq: staged.seg.base_seq, end: at };
        debug_assert_eq!(cut.seq, *next_seq);
        all_staged.insert(key, staged);
        // Durable before anything changes for readers.
        let mut all: cuts::Cuts = log.cuts.read().expect("cuts lock").as_ref().clone();
        let cs = all.entry(tp).or_default();
        match cs.last_mut() {
            // Cut again before anything was written: one cut, the lower.
            Some(l) if l.seq == cut.seq => l.end = l.end.min(cut.end),
            _ => cs.push(cut),
        }
        if let Err(e) = log.put_state(cuts::CHECKPOINT, &cuts::encode(&all)) {
            return Err(log.poison(e));
        }
        *log.cuts.write().expect("cuts lock") = Arc::new(all);
        log.any_cuts.store(true, Ordering::Release);
        pw.next_offset = at;
        // The next batch gets an index entry whatever the spacing.
        pw.last_entry = None;
        pw.bytes_since_entry = 0;
        {
            let mut st = pw.part.st.write().expect("partition lock");
            st.leo = at;
            st.cut_at(at);
            while st.index.back().is_some_and(|e| e.offset >= at) {
                st.index.pop_back();
            }
            *epochs_dirty |= st.epochs.truncate_from_end(at);
        }
        clamp_summaries(&branch.segs.read().expect("branch lock"), &tp, cut);
        // The tip cannot tell dead batches from live ones: it starts over.
        log.tip.write().expect("tip lock").clear();
        *pw.part.ahead.lock().expect("read-ahead lock") = None;
        Ok(at)
    }

    /// Writes every staged frame (one positioned write per branch) and
    /// publishes the new log end offsets. Returns what moved, for
    /// [`Storage::publish_hw`].
    pub fn flush(&mut self) -> Result<Flushed, StorageError> {
        let mut moved = Vec::new();
        let seq_end = self.next_seq;
        if let Err(e) = self.log.check_poison() {
            self.staged.clear();
            return Err(e);
        }
        // Epochs first: the checkpoint never misses an epoch whose batches
        // a crash could leave in the log.
        if let Err(e) = write_epochs(&self.log, &mut self.epochs_dirty) {
            self.staged.clear();
            return Err(self.log.poison(e));
        }
        let log = &*self.log;
        // In segment order (base sequence, then path: two branches' active
        // segments can start at the same one), not the map's: it is keyed
        // by address, and the order of writes must not depend on where the
        // allocator put a branch (the simulator replays a seed's faults by
        // write order).
        let mut round: Vec<Staged> = self.staged.drain().map(|(_, s)| s).collect();
        round.sort_unstable_by(|a, b| (a.seg.base_seq, &a.seg.path).cmp(&(b.seg.base_seq, &b.seg.path)));
        for mut staged in round {
            if let Err(e) = write_staged(log, &mut staged) {
                return Err(log.poison(e));
            }
            for (part, leo, entry) in staged.published.drain(..) {
                if part.deleted.load(Ordering::Acquire) {
                    continue;
                }
                let mut st = part.st.write().expect("partition lock");
                if let Some(e) = entry {
                    st.index.push_back(e);
                }
                debug_assert!(leo >= st.leo);
                st.leo = leo;
                moved.push((part.tp, leo));
            }
            staged.seg.published_len.store(staged.start, Ordering::Release);
            log.checkpoint(&staged.seg);
            self.spare.give(staged.buf, staged.published);
        }
        Ok(Flushed { moved, seq_end })
    }

    /// Drops the writer's state of deleted partitions (their frames stay
    /// in the segments until retention deletes those).
    pub(super) fn forget(&mut self, tps: &[Tp]) {
        for tp in tps {
            self.parts.remove(tp);
        }
    }

    /// The offset the next append to `tp` gets: past every batch appended,
    /// flushed or not (the published log end lags until the flush).
    pub fn next_offset(&self, tp: &Tp) -> Option<i64> {
        match self.parts.get(tp) {
            Some(pw) if !pw.part.deleted.load(Ordering::Acquire) => Some(pw.next_offset),
            Some(_) => None,
            None => self.log.offsets(tp).map(|(_, _, leo)| leo),
        }
    }
}

/// The writer's side of `tp`: adopted from the registry the first time (a
/// partition added since the open), refused once deleted. One hash lookup
/// on the hot path.
fn part<'p>(parts: &'p mut HashMap<Tp, PartWriter>, log: &Storage, tp: Tp) -> Result<&'p mut PartWriter, StorageError> {
    use std::collections::hash_map::Entry;
    match parts.entry(tp) {
        Entry::Occupied(e) if e.get().part.deleted.load(Ordering::Acquire) => {
            e.remove();
            Err(StorageError::UnknownPartition)
        }
        Entry::Occupied(e) => Ok(e.into_mut()),
        Entry::Vacant(v) => {
            let part = log.parts.read().expect("parts lock").get(&tp).cloned().ok_or(StorageError::UnknownPartition)?;
            // Nothing was appended to it yet: its end is where it starts.
            let leo = part.st.read().expect("partition lock").leo;
            Ok(v.insert(PartWriter::new(part, leo)))
        }
    }
}

/// The branch's staged frames, taken out of `all_staged` (the caller puts
/// them back); with none, an empty buffer over the branch's active segment
/// (created if the branch has none).
fn take_staged(log: &Storage, all_staged: &mut HashMap<u64, Staged>, spare: &mut Spare, branch: &Arc<Branch>, next_seq: u64, now_ms: i64) -> Result<Staged, StorageError> {
    if let Some(s) = all_staged.remove(&tip_key(branch)) {
        return Ok(s);
    }
    let (seg, file) = active_segment(log, branch, next_seq, now_ms).map_err(|e| log.poison_unless_exhausted(e))?;
    let start = seg.len.load(Ordering::Acquire);
    let (buf, published) = spare.take();
    Ok(Staged { seg, file, start, buf, published })
}

/// Seals the staged segment (leader epochs first, then its frames written
/// and synced, then its index file) and rolls the branch to a new one
/// based at `next_seq`. Frames written here are published with the next
/// flush. On failure the staged frames stay staged.
fn seal_and_roll(log: &Storage, staged: &mut Staged, branch: &Arc<Branch>, next_seq: u64, now_ms: i64, epochs_dirty: &mut bool) -> Result<(), StorageError> {
    write_epochs(log, epochs_dirty)?;
    write_staged(log, staged)?;
    staged.file.sync_data().map_err(io_err(&staged.seg.path))?;
    log.note_synced(&staged.seg, staged.start);
    sealed(log, staged);
    let (seg, file) = roll(log, branch, next_seq, now_ms)?;
    // The sealed segment's buffer is written and empty.
    let published = std::mem::take(&mut staged.published);
    *staged = Staged { start: seg.len.load(Ordering::Acquire), seg, file, buf: std::mem::take(&mut staged.buf), published };
    Ok(())
}

/// After `cut`, the segments before it hold nothing of `tp` that is live
/// past its end: their summaries say so, so that retention never raises
/// the tp's log start past the cut for a segment of dead frames (the live
/// offsets there are in later segments).
pub(super) fn clamp_summaries(segs: &[Arc<Segment>], tp: &Tp, cut: cuts::Cut) {
    for seg in segs.iter().filter(|s| s.base_seq < cut.seq) {
        if let Some(s) = seg.tps.lock().expect("segment tps lock").get_mut(tp) {
            s.last_offset = s.last_offset.min(cut.end - 1);
        }
    }
}

/// Replaces the leader-epoch checkpoint with every tp's epochs, if any
/// changed since it was written. Before any frame is written: the
/// checkpoint never misses an epoch whose batches a crash could leave in
/// the log.
fn write_epochs(log: &Storage, dirty: &mut bool) -> Result<(), StorageError> {
    if !*dirty {
        return Ok(());
    }
    let parts: Vec<Arc<Partition>> = log.parts.read().expect("parts lock").values().cloned().collect();
    let caches: Vec<(Tp, EpochCache)> = parts
        .iter()
        .map(|p| (p.tp, p.st.read().expect("partition lock").epochs.clone()))
        .filter(|(_, c)| !c.entries().is_empty())
        .collect();
    log.put_state(epochs::CHECKPOINT, &epochs::encode(caches.iter().map(|(tp, c)| (*tp, c))))?;
    *dirty = false;
    Ok(())
}

fn write_staged(log: &Storage, staged: &mut Staged) -> Result<(), StorageError> {
    if staged.buf.is_empty() {
        return Ok(());
    }
    staged.file.write_all_at(&staged.buf, staged.start).map_err(io_err(&staged.seg.path))?;
    staged.start += staged.buf.len() as u64;
    log.unsynced.fetch_add(staged.buf.len() as u64, Ordering::Relaxed);
    staged.buf.clear();
    if staged.seg.file.wrote(&staged.file, log.cfg.hold_until_sync) {
        log.dirty.lock().expect("dirty list lock").push(staged.seg.clone());
    }
    staged.seg.len.store(staged.start, Ordering::Release);
    Ok(())
}

/// A segment just sealed (written whole and synced): nothing holds its
/// file any more, the disk reserved past its end is given back, and its
/// index file is written. All before the next segment exists: until then
/// retention and compaction do not take it (they take sealed segments
/// only), so none deletes it while its index is being written.
fn sealed(log: &Storage, staged: &Staged) {
    let seg = &staged.seg;
    let end = staged.start;
    seg.file.settled();
    let reserved = seg.allocated.load(Ordering::Acquire);
    if reserved > end {
        staged.file.release(end, reserved - end);
        seg.allocated.store(end, Ordering::Release);
    }
    log.write_seg_index(seg, &staged.published);
}

/// Reserves disk space for the segment up to `end` (fallocate, keeping
/// the file's size), ahead in steps that grow with the segment, so a full
/// disk shows here rather than in a write. Filesystems without it are
/// written as before (`preallocate` turns false for good).
fn reserve(log: &Storage, preallocate: &mut bool, staged: &Staged, end: u64) -> Result<(), StorageError> {
    let seg = &staged.seg;
    if end <= seg.allocated.load(Ordering::Acquire) || !*preallocate {
        return Ok(());
    }
    // Ahead by about what the segment holds (4 KiB to 16 MiB): a small
    // segment reserves little, a busy one is not reserved per batch.
    let step = (end - FILE_HEADER_BYTES).clamp(4 << 10, 16 << 20);
    let to = (end + step).min(log.cfg.segment_bytes.max(end));
    let from = seg.allocated.load(Ordering::Acquire);
    match staged.file.reserve(from, to - from) {
        Ok(true) => {
            seg.allocated.store(to, Ordering::Release);
            Ok(())
        }
        Ok(false) => {
            tracing::info!(path = %seg.path.display(), "the filesystem cannot reserve space ahead (fallocate); a full disk will show at write time");
            *preallocate = false;
            Ok(())
        }
        Err(e) => Err(open_err(&seg.path)(e)),
    }
}

/// The branch's active segment and its file, open.
fn active_segment(log: &Storage, branch: &Arc<Branch>, next_seq: u64, now_ms: i64) -> Result<(Arc<Segment>, FileRef), StorageError> {
    let last = branch.segs.read().expect("branch lock").last().cloned();
    match last {
        Some(seg) => {
            let file = seg.file.get().map_err(open_err(&seg.path))?;
            Ok((seg, file))
        }
        None => roll(log, branch, next_seq, now_ms),
    }
}

/// Creates the branch's next segment. Running out of descriptors or disk
/// space here fails with `Exhausted` and leaves nothing behind.
fn roll(log: &Storage, branch: &Arc<Branch>, base_seq: u64, now_ms: i64) -> Result<(Arc<Segment>, FileRef), StorageError> {
    let disk = &*log.cfg.disk;
    if !branch.dir_synced.load(Ordering::Acquire) {
        disk.create_dir_all(&branch.dir).map_err(open_err(&branch.dir))?;
        sync_dir(disk, &log.dir)?;
        branch.dir_synced.store(true, Ordering::Release);
    }
    let path = branch.dir.join(seg_file_name(base_seq));
    let file = match segment::create(disk, &path, &FileHeader { base_seq, created_ms: now_ms }) {
        Ok(f) => f,
        Err(segment::SegmentError::Io { source, .. }) => return Err(open_err(&path)(source)),
        Err(e) => return Err(e.into()),
    };
    if let Err(e) = sync_dir(disk, &branch.dir) {
        drop(file);
        let _ = disk.remove_file(&path);
        return Err(e);
    }
    let cached = log.files.adopt(path.clone(), true, file.clone());
    let seg = Arc::new(Segment::new(FileHeader { base_seq, created_ms: now_ms }, path, cached, FILE_HEADER_BYTES));
    branch.segs.write().expect("branch lock").push(seg.clone());
    Ok((seg, file))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::batch::tests::make_batch;

    fn tp(n: u8, p: i32) -> Tp {
        Tp { topic: [n; 16], partition: p }
    }

    #[test]
    fn partitions_added_after_the_open_are_adopted_at_their_first_append() {
        let dir = tempfile::tempdir().unwrap();
        let (s, mut w) = Storage::open(dir.path(), StorageConfig::default(), vec![], true).unwrap();
        assert!(matches!(w.append(tp(1, 0), &make_batch(&[b"a"], 0), 0, false), Err(StorageError::UnknownPartition)));
        s.add_partition(PartitionSpec { tp: tp(1, 0), branch: "a.b".into(), log_start: 7 });
        assert_eq!(w.next_offset(&tp(1, 0)), Some(7));
        let a = w.append(tp(1, 0), &make_batch(&[b"a", b"b"], 0), 0, false).unwrap();
        assert_eq!((a.base_offset, a.last_offset, a.log_start), (7, 8, 7));
        assert_eq!(w.next_offset(&tp(1, 0)), Some(9));
        let f = w.flush().unwrap();
        assert_eq!(f.moved, vec![(tp(1, 0), 9)]);
        s.publish_hw(&f);
        assert_eq!(s.offsets(&tp(1, 0)), Some((7, 9, 9)));
    }

    #[test]
    fn a_topic_deleted_between_append_and_flush_is_neither_published_nor_appended_to() {
        let dir = tempfile::tempdir().unwrap();
        let specs = vec![
            PartitionSpec { tp: tp(1, 0), branch: "a".into(), log_start: 0 },
            PartitionSpec { tp: tp(1, 1), branch: "a".into(), log_start: 0 },
            PartitionSpec { tp: tp(2, 0), branch: "a".into(), log_start: 0 },
        ];
        let (s, mut w) = Storage::open(dir.path(), StorageConfig::default(), specs, true).unwrap();
        for t in [tp(1, 0), tp(1, 1), tp(2, 0)] {
            w.append(t, &make_batch(&[b"x"], 0), 0, false).unwrap();
        }
        w.apply(Switch::remove_topic([1; 16], 2)).unwrap();
        // Refused at once, before the writer's next flush.
        assert!(matches!(w.append(tp(1, 1), &make_batch(&[b"y"], 0), 0, false), Err(StorageError::UnknownPartition)));
        assert_eq!(w.next_offset(&tp(1, 0)), None);
        let f = w.flush().unwrap();
        assert_eq!(f.moved, vec![(tp(2, 0), 1)]);
        assert!(!w.parts.contains_key(&tp(1, 0)) && !w.parts.contains_key(&tp(1, 1)), "the writer forgot the deleted partitions");
        assert!(s.offsets(&tp(1, 0)).is_none());
        // The survivor goes on from where it was.
        assert_eq!(w.append(tp(2, 0), &make_batch(&[b"z"], 0), 0, false).unwrap().base_offset, 1);
    }

    /// Every batch of a tp, read from the start, one per element.
    fn batches(s: &Storage, t: Tp) -> Vec<Vec<u8>> {
        let mut out = Vec::new();
        let mut offset = s.offsets(&t).unwrap().0;
        loop {
            let r = s.read(&t, offset, 1 << 20, true).unwrap();
            if r.records.is_empty() {
                return out;
            }
            out.extend(r.records.iter().flat_map(|part| crate::protocol::batch::split(part).map(|b| b.unwrap().to_vec()).collect::<Vec<_>>()));
            offset = r.next_offset;
        }
    }

    /// A follower's copy (`append_at`): the leader's batches at the
    /// leader's offsets, byte for byte (LogAppendTime stamps included),
    /// whatever order its tps arrive in; a gap the leader's cleaning left is
    /// kept; a batch below the next offset is refused and changes nothing;
    /// all of it survives a restart.
    #[test]
    fn a_followers_copy_reads_as_the_leaders_batches() {
        let (ld, fd) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let specs = || vec![PartitionSpec { tp: tp(1, 0), branch: "a".into(), log_start: 0 }, PartitionSpec { tp: tp(2, 0), branch: "a".into(), log_start: 0 }];
        let (leader, mut lw) = Storage::open(ld.path(), StorageConfig::default(), specs(), true).unwrap();
        for i in 0..20i64 {
            let t = tp(1 + (i % 2) as u8, 0);
            lw.append(t, &make_batch(&[format!("v{i}").as_bytes(), b"x"], 1_000 + i), 5_000 + i, i % 3 == 0).unwrap();
        }
        let f = lw.flush().unwrap();
        leader.publish_hw(&f);
        let (one, two) = (batches(&leader, tp(1, 0)), batches(&leader, tp(2, 0)));
        assert_eq!((one.len(), two.len()), (10, 10));
        let copy = |w: &mut LogWriter, t: Tp, b: &[u8]| w.append_at(t, b, 0).unwrap();
        let (follower, mut fw) = Storage::open(fd.path(), StorageConfig::default(), specs(), true).unwrap();
        // Another interleaving than the leader's.
        for b in two.iter().chain(&one[..5]) {
            let t = if two.contains(b) { tp(2, 0) } else { tp(1, 0) };
            copy(&mut fw, t, b);
        }
        // Below the next offset: refused, nothing staged.
        let next = fw.next_offset(&tp(1, 0)).unwrap();
        assert!(matches!(fw.append_at(tp(1, 0), &one[2], 0), Err(StorageError::Misplaced(_))));
        // Offsets no log can hold: a negative delta (the end before the
        // start), a last offset past i64::MAX.
        let mut backwards = make_batch(&[b"n"], 0);
        crate::protocol::batch::set_base_offset(&mut backwards, next);
        backwards[23..27].copy_from_slice(&(-5i32).to_be_bytes());
        let mut huge = make_batch(&[b"h"], 0);
        crate::protocol::batch::set_base_offset(&mut huge, i64::MAX);
        for b in [&backwards, &huge] {
            assert!(matches!(fw.append_at(tp(1, 0), b, 0), Err(StorageError::Misplaced(_))));
        }
        assert_eq!(fw.next_offset(&tp(1, 0)), Some(next));
        for b in &one[5..] {
            copy(&mut fw, tp(1, 0), b);
        }
        // A gap: the leader cleaned offsets away.
        let mut gap = make_batch(&[b"after the gap"], 9_999);
        crate::protocol::batch::set_base_offset(&mut gap, 100);
        assert_eq!(copy(&mut fw, tp(1, 0), &gap).base_offset, 100);
        assert_eq!(fw.next_offset(&tp(1, 0)), Some(101));
        let f = fw.flush().unwrap();
        follower.publish_hw(&f);
        let with_gap: Vec<Vec<u8>> = one.iter().cloned().chain([gap.clone()]).collect();
        assert_eq!(batches(&follower, tp(1, 0)), with_gap);
        assert_eq!(batches(&follower, tp(2, 0)), two);
        follower.sync().unwrap();
        drop((follower, fw));
        let (follower, mut fw) = Storage::open(fd.path(), StorageConfig::default(), specs(), true).unwrap();
        assert_eq!(batches(&follower, tp(1, 0)), with_gap);
        assert_eq!(batches(&follower, tp(2, 0)), two);
        assert_eq!(fw.next_offset(&tp(1, 0)), Some(101));
        assert_eq!(fw.append(tp(1, 0), &make_batch(&[b"own"], 0), 0, false).unwrap().base_offset, 101, "a follower turned leader goes on from there");
    }

    /// Leader epochs: a leader's appends carry its epoch, which starts at
    /// the log end when it begins (written or not); a follower's copy takes
    /// its leader's epochs from the batches and refuses one that goes back;
    /// the checkpoint brings them back after a restart, cut to what a crash
    /// left of the log and to a raised log start.
    #[test]
    fn leader_epochs_are_stamped_copied_and_survive_restarts_cut_to_the_log() {
        use crate::storage::disk::sim::{Faults, SimDisk};
        let disk = SimDisk::new(7, Faults::default());
        let cfg = || StorageConfig { disk: Arc::new(disk.clone()), ..StorageConfig::default() };
        let spec = |dir: &str| PartitionSpec { tp: tp(1, 0), branch: dir.into(), log_start: 0 };
        let open = |dir: &str| Storage::open(Path::new(dir), cfg(), vec![spec("a")], true).unwrap();
        let entries = |s: &Storage| s.epochs(&tp(1, 0)).unwrap().iter().map(|e| (e.epoch, e.start)).collect::<Vec<_>>();
        let epoch_of = |b: &[u8]| crate::protocol::batch::BatchHeader::parse(b).unwrap().partition_leader_epoch;
        let t = tp(1, 0);

        let (leader, mut lw) = open("/leader");
        // No epoch begun (single-node mode): the producer's -1 is kept.
        lw.append(t, &make_batch(&[b"a"], 0), 0, false).unwrap();
        lw.begin_epoch(t, 2).unwrap();
        lw.append(t, &make_batch(&[b"b", b"c"], 0), 0, false).unwrap();
        // Epoch 3 wrote nothing here; epoch 5 starts at the same offset.
        lw.begin_epoch(t, 3).unwrap();
        lw.begin_epoch(t, 5).unwrap();
        assert!(matches!(lw.begin_epoch(t, 4), Err(StorageError::StaleEpoch { epoch: 4, latest: 5 })));
        lw.begin_epoch(t, 5).unwrap();
        lw.append(t, &make_batch(&[b"d"], 0), 0, false).unwrap();
        let f = lw.flush().unwrap();
        leader.publish_hw(&f);
        leader.sync().unwrap();
        assert_eq!(entries(&leader), [(2, 1), (5, 3)]);
        let written = batches(&leader, t);
        assert_eq!(written.iter().map(|b| epoch_of(b)).collect::<Vec<_>>(), [-1, 2, 5]);
        // Where each epoch ends, as OffsetForLeaderEpoch answers.
        assert_eq!(leader.end_offset_for(&t, 2), Some((2, 3)));
        assert_eq!(leader.end_offset_for(&t, 3), Some((2, 3)));
        assert_eq!(leader.end_offset_for(&t, 5), Some((5, 4)));
        assert_eq!(leader.end_offset_for(&t, 1), Some((1, 1)));
        assert_eq!(leader.end_offset_for(&t, 6), Some(epochs::UNDEFINED));

        // The follower's copy: epochs from the batches, none for epochs
        // that wrote nothing.
        let (follower, mut fw) = open("/follower");
        for b in &written {
            fw.append_at(t, b, 0).unwrap();
        }
        assert_eq!(entries(&follower), [(2, 1), (5, 3)]);
        let mut old = make_batch(&[b"late"], 0);
        crate::protocol::batch::set_base_offset(&mut old, 4);
        crate::protocol::batch::set_partition_leader_epoch(&mut old, 2);
        assert!(matches!(fw.append_at(t, &old, 0), Err(StorageError::Misplaced(_))));
        assert_eq!(fw.next_offset(&t), Some(4));
        fw.flush().unwrap();
        follower.sync().unwrap();

        // A new epoch flushed but never synced: its batch is lost in the
        // crash, and so is its entry, though the checkpoint kept it.
        lw.begin_epoch(t, 7).unwrap();
        lw.append(t, &make_batch(&[b"e"], 0), 0, false).unwrap();
        lw.flush().unwrap();
        assert_eq!(entries(&leader), [(2, 1), (5, 3), (7, 4)]);
        drop((leader, lw, follower, fw));
        disk.crash();
        let (leader, mut lw) = open("/leader");
        assert_eq!(entries(&leader), [(2, 1), (5, 3)]);
        assert_eq!(leader.end_offset_for(&t, 5), Some((5, 4)));
        let (follower, _fw) = open("/follower");
        assert_eq!(entries(&follower), [(2, 1), (5, 3)]);
        // A raised log start cuts the epochs below it, and stays cut.
        lw.apply(Switch::log_starts(vec![(t, 2)])).unwrap();
        assert_eq!(entries(&leader), [(2, 2), (5, 3)]);
        lw.flush().unwrap();
        drop((leader, lw));
        let (leader, _lw) = Storage::open(Path::new("/leader"), cfg(), vec![PartitionSpec { log_start: 2, ..spec("a") }], true).unwrap();
        assert_eq!(entries(&leader), [(2, 2), (5, 3)]);
    }

    #[test]
    fn a_damaged_epoch_checkpoint_refuses_the_start() {
        let dir = tempfile::tempdir().unwrap();
        let specs = || vec![PartitionSpec { tp: tp(1, 0), branch: "a".into(), log_start: 0 }];
        let (s, mut w) = Storage::open(dir.path(), StorageConfig::default(), specs(), true).unwrap();
        w.begin_epoch(tp(1, 0), 1).unwrap();
        w.flush().unwrap();
        drop((s, w));
        let path = dir.path().join(epochs::CHECKPOINT);
        let mut bytes = std::fs::read(&path).unwrap();
        bytes[20] ^= 1;
        std::fs::write(&path, bytes).unwrap();
        let err = Storage::open(dir.path(), StorageConfig::default(), specs(), true).err().expect("refused");
        assert!(err.to_string().contains("leader-epochs") && err.to_string().contains("checksum"), "{err}");
    }

    /// A follower's divergent tail, cut inside a shared branch: the cut
    /// starts at the batch holding the offset asked for; the sibling and
    /// the tp's earlier batches stay; new batches take the cut offsets;
    /// tp reads and the subtree stream skip the dead frames, across clean
    /// and unclean restarts; what cannot be cut is refused.
    #[test]
    fn a_truncation_cuts_one_tp_of_a_shared_log_and_holds_across_restarts() {
        let dir = tempfile::tempdir().unwrap();
        let specs = || vec![PartitionSpec { tp: tp(1, 0), branch: "a".into(), log_start: 0 }, PartitionSpec { tp: tp(2, 0), branch: "a".into(), log_start: 0 }];
        let (t, sib) = (tp(1, 0), tp(2, 0));
        let open = || Storage::open(dir.path(), StorageConfig::default(), specs(), true).unwrap();
        let (s, mut w) = open();
        let flush = |s: &Storage, w: &mut LogWriter| {
            let f = w.flush().unwrap();
            s.sync().unwrap();
            s.publish_hw(&f);
        };
        // t: [0,1] [2] [3,4] [5]; the sibling's batches in between.
        for (i, n) in [2, 1, 2, 1].into_iter().enumerate() {
            let values: Vec<Vec<u8>> = (0..n).map(|k| format!("old{i}.{k}").into_bytes()).collect();
            w.append(t, &make_batch(&values.iter().map(|v| &v[..]).collect::<Vec<_>>(), 0), 0, false).unwrap();
            w.append(sib, &make_batch(&[format!("sib{i}").as_bytes()], 0), 0, false).unwrap();
        }
        flush(&s, &mut w);
        w.begin_epoch(t, 3).unwrap();
        // Staged batches of the tp: flush first.
        w.append(t, &make_batch(&[b"staged"], 0), 0, false).unwrap();
        assert!(matches!(w.truncate(t, 4, 0), Err(StorageError::Busy(_))));
        flush(&s, &mut w);
        assert_eq!(s.offsets(&t), Some((0, 7, 7)));
        // Past the end: nothing to cut.
        assert_eq!(w.truncate(t, 9, 0).unwrap(), 7);
        // Inside the batch [3,4]: the cut starts at 3.
        assert_eq!(w.truncate(t, 4, 0).unwrap(), 3);
        assert_eq!(s.offsets(&t), Some((0, 3, 3)));
        assert_eq!(s.epochs(&t).unwrap(), [], "epoch 3 began at 6, past the cut");
        assert_eq!(w.next_offset(&t), Some(3));
        let new = w.append(t, &make_batch(&[b"new3", b"new4"], 0), 0, false).unwrap();
        assert_eq!(new.base_offset, 3);
        w.append(sib, &make_batch(&[b"sib4"], 0), 0, false).unwrap();
        flush(&s, &mut w);
        let expect_t = |s: &Storage| {
            let got = batches(s, t);
            let spans: Vec<(i64, i64)> = got.iter().map(|b| crate::protocol::batch::BatchHeader::parse(b).map(|h| (h.base_offset, h.last_offset())).unwrap()).collect();
            assert_eq!(spans, [(0, 1), (2, 2), (3, 4)]);
            let holds = |b: &[u8], v: &[u8]| b.windows(v.len()).any(|w| w == v);
            assert!(holds(&got[2], b"new3") && !got.iter().any(|b| holds(b, b"old2")), "the new batch, not the cut one");
            assert_eq!(batches(s, sib).len(), 5);
            // The stream: every live batch once, in order; no dead one.
            let mut pick = |_: u64, _: &Tp, _: i64, _: &[u8]| crate::storage::tip::Pick::Take;
            let r = s.read_stream(&["a".to_owned()], 0, 1 << 20, true, &mut pick).unwrap();
            let of_t: Vec<(i64, i64)> = r.batches.iter().filter(|m| m.tp == t).map(|m| (m.base_offset, m.last_offset)).collect();
            assert_eq!(of_t, [(0, 1), (2, 2), (3, 4)]);
            assert_eq!(r.batches.len(), 8);
        };
        expect_t(&s);
        // Below the log start: refused.
        w.apply(Switch::log_starts(vec![(t, 2)])).unwrap();
        assert!(matches!(w.truncate(t, 1, 0), Err(StorageError::Misplaced(_))));
        s.mark_clean().unwrap();
        drop((s, w));
        let specs2 = || vec![PartitionSpec { tp: t, branch: "a".into(), log_start: 2 }, PartitionSpec { tp: sib, branch: "a".into(), log_start: 0 }];
        let (s, w) = Storage::open(dir.path(), StorageConfig::default(), specs2(), true).unwrap();
        assert_eq!(s.offsets(&t), Some((2, 5, 5)));
        assert_eq!(s.cuts_of(&t).len(), 1);
        drop((s, w));
        // Unclean: the active segment is scanned, the cut applied again.
        let (s, mut w) = Storage::open(dir.path(), StorageConfig::default(), specs2(), false).unwrap();
        assert_eq!(s.offsets(&t), Some((2, 5, 5)));
        assert_eq!(w.append(t, &make_batch(&[b"next"], 0), 0, false).unwrap().base_offset, 5);
    }

    /// Kafka's `truncateTo` at or past the log end cuts no batch but drops
    /// an epoch begun there (a node that led briefly and wrote nothing
    /// then takes its new leader's older epoch); a log start inside the
    /// batch a cut would take refuses the cut.
    #[test]
    fn a_cut_at_the_end_drops_an_unwritten_epoch_and_none_goes_through_the_log_start() {
        let dir = tempfile::tempdir().unwrap();
        let t = tp(1, 0);
        let (s, mut w) = Storage::open(dir.path(), StorageConfig::default(), vec![PartitionSpec { tp: t, branch: "a".into(), log_start: 0 }], true).unwrap();
        w.begin_epoch(t, 4).unwrap();
        w.append(t, &make_batch(&[b"a", b"b", b"c"], 0), 0, false).unwrap();
        w.begin_epoch(t, 5).unwrap();
        w.flush().unwrap();
        assert_eq!(s.epochs(&t).unwrap().iter().map(|e| (e.epoch, e.start)).collect::<Vec<_>>(), [(4, 0), (5, 3)]);
        assert_eq!(w.truncate(t, 3, 0).unwrap(), 3);
        assert_eq!(s.epochs(&t).unwrap().iter().map(|e| (e.epoch, e.start)).collect::<Vec<_>>(), [(4, 0)]);
        // An epoch-4 copy is taken again.
        let mut copy = make_batch(&[b"d"], 0);
        crate::protocol::batch::set_base_offset(&mut copy, 3);
        crate::protocol::batch::set_partition_leader_epoch(&mut copy, 4);
        w.append_at(t, &copy, 0).unwrap();
        w.flush().unwrap();
        // DeleteRecords put the log start inside the batch [0, 2].
        w.apply(Switch::log_starts(vec![(t, 1)])).unwrap();
        assert!(matches!(w.truncate(t, 2, 0), Err(StorageError::Misplaced(_))));
        assert_eq!(w.next_offset(&t), Some(4));
    }
}
