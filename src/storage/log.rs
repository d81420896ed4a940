//! The branch logs: append, read and roll. Recovery at start-up is in
//! `log/recover.rs`, retention in `log/retention.rs`, compaction into
//! subtree stores in `log/compact.rs`, subtree stream reads in
//! `log/stream.rs`, the writer's switches in `log/switch.rs`.
//!
//! # Ownership
//!
//! [`Storage::open`] returns the shared [`Storage`] and its one
//! [`LogWriter`] (`log/writer.rs`), which the engine's writer thread owns:
//! [`LogWriter::append`] stages frames in a per-branch buffer,
//! [`LogWriter::flush`] writes each branch's buffer with one positioned
//! write and publishes the new log end offsets. What only the writer
//! changes (sequence numbers, next offsets, staged buffers) is behind its
//! `&mut self`, no lock. [`Storage::sync`] (called from the syncer thread)
//! makes the segments written since the last sync durable, and
//! [`Storage::publish_hw`] lets readers see what is durable. Readers on
//! any thread take a short read lock to find where to start, then read
//! files with positioned reads and no lock held. Retention and compaction
//! do their work on the maintenance thread, one at a time, and hand what
//! changes for readers (log starts, segment lists, stores) to the writer
//! as a [`Switch`] (`log/switch.rs`); a topic's deletion is a switch too.
//! So the writer makes every change to the log's structure.
//!
//! # Invariants
//!
//! - Offsets of a tp are assigned here, once (`next_offset`): dense on
//!   a leader; a follower's copy keeps its leader's, gaps included.
//! - `hw <= leo <= next_offset`, none ever decreases, except that a
//!   truncation (`log/cuts.rs`) lowers all three to its cut.
//! - A reader never reads past a segment's published length, so it never sees
//!   a half-written frame.
//! - A segment file is deleted only when every live frame in it is below
//!   its tp's log start offset (or belongs to a deleted topic; a dead frame,
//!   past a truncation, counts as at its cut), and only after the new log
//!   start offsets were handed to the caller to persist.
//!
//! # Indexes
//!
//! Per tp, a sparse in-memory index: an entry for the first batch of the tp
//! in each segment, then one every `index_interval_bytes` of the tp's data,
//! and one whenever the tp's previous entry is more than `MAX_SCAN_GAP` bytes
//! back in the file. A read therefore scans at most about `MAX_SCAN_GAP`
//! bytes of other topics' frames before it reaches its own. Each entry also
//! carries the largest timestamp seen before it, which makes it a time index.
//! Each segment's share of the indexes is kept in an index file beside it
//! (`log/seg_index.rs`), so recovery reads them instead of walking frames.

use std::collections::VecDeque;

use crate::storage::hashing::HashMap;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use bytes::Bytes;

use super::disk::{Disk, DiskFile, FileRef, Mode, RealDisk};
use super::files::{self, CachedFile, FileCache};
use super::segment::{self, FileHeader, FrameHeader, FILE_HEADER_BYTES, FRAME_HEADER_BYTES, MAX_SCAN_GAP};
use super::subtree::store::{self, Entry as StoreEntry, Store, StoreError, StoreTp};
use super::subtree::WindowRecord;
use super::{TopicId, Tp};
use crate::protocol::batch;

mod clean;
mod compact;
pub mod cuts;
pub mod epochs;
pub mod hws;
mod page_cache;
mod recover;
mod retention;
mod seg_index;
mod state;
mod stream;
mod switch;
mod writer;
pub use clean::{CleanConfig, CleanPolicy, Cleaned};
pub use compact::{CompactConfig, Compacted, TopicView};
pub use epochs::{EpochCache, EpochEntry};
pub use recover::CLEAN_MARKER;
pub use seg_index::reencode as reencode_index_file;
pub use stream::StreamRead;
pub use switch::{Apply, Switch};
use switch::Change;
pub use writer::{placeable, LogWriter};
use writer::PartWriter;

/// Bounds on one positioned read on the read path: about the bytes the
/// caller wants, so one fetch is usually one read.
const MIN_READ_CHUNK: usize = 64 * 1024;
const MAX_READ_CHUNK: usize = 64 * 1024 * 1024;
/// A tp's walk reads at least this much at a time (it reads about what
/// its caller still wants, and jumps over other topics' frames).
const WALK_MIN_CHUNK: usize = 4096;
/// Returned batches smaller than this are copied out of their read buffer.
const SMALL_COPY: usize = 64 * 1024;

/// Spacing of a segment's stream index marks (see [`Segment::mark`]).
const STREAM_MARK_BYTES: u64 = 64 * 1024;

#[derive(Debug, Clone)]
pub struct StorageConfig {
    /// Roll the active segment of a branch once it reaches this size.
    pub segment_bytes: u64,
    /// Roll the active segment of a branch once it is this old.
    pub segment_ms: i64,
    pub index_interval_bytes: u64,
    /// An active segment's index file is written again (by the syncer,
    /// once the frames it covers are synced) each time the segment grew
    /// this much: what a crash makes recovery deep-scan is bounded by it
    /// (see `log/seg_index.rs`).
    pub index_checkpoint_bytes: u64,
    pub tip: super::tip::TipConfig,
    /// Segment and store files kept open at most (see `files`).
    pub max_open_files: usize,
    /// Whether the engine syncs after its write rounds (flush policy
    /// `always` or `interval`): then a written segment's file is held open
    /// until that sync, so the sync never opens a file. Without per-round
    /// syncs (`never`) nothing is held.
    pub hold_until_sync: bool,
    /// Synced segment bytes left in the page cache, the newest; older
    /// pages are dropped (`posix_fadvise(DONTNEED)`), and so are pages
    /// read from below that window. Memory the page cache would otherwise
    /// grow into costs more to touch the first time than everything else a
    /// produced byte costs, on a VM whose free memory goes back to its host
    /// (docs/benchmarks.md: 2.4 s/GB written into pages never touched
    /// before, 0.1 s/GB into pages just freed); within the window, new
    /// writes reuse the pages the oldest ones free. `u64::MAX`: keep all,
    /// as Kafka does.
    pub page_cache_bytes: u64,
    /// Every file operation goes through it (see `disk`).
    pub disk: Arc<dyn Disk>,
    /// A bug to plant, for the simulator's proof that it finds each one
    /// (`canopy-sim --plant`); never set otherwise.
    pub planted: Option<Planted>,
}

/// The storage bugs the simulator must find (see `sim`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Planted {
    /// `sync` reports success without syncing.
    SkipFsync,
    /// Recovery keeps a torn tail and appends after it.
    KeepTornTail,
    /// Retention may retire a batch that ends at the high watermark (an
    /// off-by-one: `<=` for `<`).
    RetentionPastHighWatermark,
    /// Compaction takes sealed segments whatever the high watermark.
    CompactPastHighWatermark,
}

impl Default for StorageConfig {
    fn default() -> Self {
        StorageConfig { segment_bytes: 1 << 30, segment_ms: 7 * 24 * 3600 * 1000, index_interval_bytes: 4096, index_checkpoint_bytes: 64 << 20, tip: Default::default(), max_open_files: 4096, hold_until_sync: true, page_cache_bytes: 1 << 30, disk: RealDisk::shared(), planted: None }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum StorageError {
    #[error("unknown partition")]
    UnknownPartition,
    #[error("storage refuses writes after an earlier failure ({0}); restart the broker after checking the disk and the log")]
    Poisoned(String),
    #[error("i/o error on {path}: {source}")]
    Io { path: String, source: io::Error },
    /// Descriptors, memory or disk space ran out opening or creating a
    /// file, before anything was written: the request fails (retriable),
    /// storage carries on.
    #[error("out of resources opening {path}: {source}; retry once descriptors or disk space are free")]
    Exhausted { path: String, source: io::Error },
    #[error(transparent)]
    Segment(#[from] segment::SegmentError),
    #[error("sealed segment {path} is damaged after byte {valid} of {len}; restore it from a copy or move it away to start without it")]
    CorruptSealed { path: String, valid: u64, len: u64 },
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("catalog: {0}")]
    Catalog(String),
    /// A compaction stopped at an injected fault (tests).
    #[error("stopped at {0}")]
    Stopped(String),
    /// A replicated batch that cannot go where it says
    /// ([`LogWriter::append_at`]); nothing was staged.
    #[error("misplaced replicated batch: {0}")]
    Misplaced(String),
    /// A leader epoch below one the tp already has
    /// ([`LogWriter::begin_epoch`]); nothing changed.
    #[error("leader epoch {epoch} is below the partition's latest, {latest}")]
    StaleEpoch { epoch: i32, latest: i32 },
    /// Not now: retry later ([`LogWriter::truncate`]); nothing changed.
    #[error("storage is busy: {0}")]
    Busy(String),
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ReadError {
    #[error("unknown partition")]
    UnknownPartition,
    #[error("offset {offset} is outside [{log_start}, {end}]")]
    OffsetOutOfRange { offset: i64, log_start: i64, end: i64 },
    #[error("i/o error: {0}")]
    Io(String),
}

/// A partition to open at start-up or create later.
#[derive(Debug, Clone)]
pub struct PartitionSpec {
    pub tp: Tp,
    pub branch: String,
    /// The persisted log start offset: offsets below it were deleted by
    /// retention, so the log end can never be below it either.
    pub log_start: i64,
}

/// Result of one append, known before the bytes are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Appended {
    pub base_offset: i64,
    pub last_offset: i64,
    pub seq: u64,
    pub log_start: i64,
}

#[derive(Debug, Clone)]
pub struct ReadResult {
    /// Whole batches, in offset order, starting with the one that holds the
    /// requested offset: slices of the buffers the files were read into,
    /// so the fetch path hands them to the socket without copying.
    pub records: Vec<Bytes>,
    pub high_watermark: i64,
    pub log_start: i64,
    pub log_end: i64,
    /// Bytes read from files, including other topics' frames skipped.
    pub bytes_scanned: u64,
    /// The offset after the last returned batch (the requested offset when
    /// nothing was returned): where the consumer will fetch next.
    pub next_offset: i64,
    /// Served from the tip (memory): reading ahead would gain nothing.
    pub from_tip: bool,
}

/// What one [`Storage::flush`] wrote: the tps whose end moved, with their
/// new end, and the first stream sequence number not yet written. Handed
/// to [`Storage::publish_hw`] once it may be seen.
#[derive(Debug, Clone, Default)]
pub struct Flushed {
    pub moved: Vec<(Tp, i64)>,
    pub seq_end: u64,
}

/// What recovery did, for the log and for the benchmark report.
#[derive(Debug, Clone, Default)]
pub struct RecoveryReport {
    pub segments: usize,
    pub stores: usize,
    pub frames: u64,
    pub bytes: u64,
    /// Segments whose index file was read (the rest were walked).
    pub indexed_segments: usize,
    pub deep_scanned_bytes: u64,
    pub truncated_bytes: u64,
    pub elapsed_ms: u128,
}

/// Retention settings of one tp's topic.
#[derive(Debug, Clone, Copy, Default)]
pub struct RetentionPolicy {
    pub retention_ms: Option<i64>,
    pub retention_bytes: Option<u64>,
}

/// One tp's share of one segment.
#[derive(Debug, Clone, Copy)]
struct SegTp {
    last_offset: i64,
    bytes: u64,
    max_ts: i64,
    /// Bytes of the tp's frames from its last index entry in the segment
    /// on (what spaces its next entry).
    since_entry: u64,
}

struct Segment {
    base_seq: u64,
    created_ms: i64,
    path: PathBuf,
    /// Also says whether writes await a sync, and holds the file open from
    /// a write until that sync (see `files`).
    file: CachedFile,
    /// Bytes of disk reserved for the file (see `Storage::reserve`).
    allocated: AtomicU64,
    /// Bytes readers may read: only whole, written frames lie below it.
    len: AtomicU64,
    tps: Mutex<HashMap<Tp, SegTp>>,
    marks: Mutex<Marks>,
    /// One past the largest sequence number staged into this segment.
    end_seq: AtomicU64,
    /// The covered length of the segment's index file on disk (0: none;
    /// see `log/seg_index.rs`); held while the file is written, so the
    /// writer (at a seal) and the syncer (a checkpoint) never write it at
    /// once, and a shorter one never replaces a longer one.
    indexed: Mutex<u64>,
    /// The covered length of the last checkpoint of its index queued for
    /// the syncer.
    checkpoint_queued: AtomicU64,
    /// The partitions' indexes hold every entry of the frames below this
    /// length (a flush publishes them with its write; frames a roll wrote
    /// wait for the next flush).
    published_len: AtomicU64,
    /// The page-cache window holds the synced pages below this
    /// (see [`StorageConfig::page_cache_bytes`]) ...
    cache_noted: AtomicU64,
    /// ... and the page cache was told it may drop those below this.
    cache_dropped: AtomicU64,
}

/// A segment's stream marks and its last frame.
#[derive(Default)]
struct Marks {
    /// Sparse stream index: (sequence number, position) of a frame every
    /// `STREAM_MARK_BYTES`, so a subtree read finds where a sequence number
    /// starts without walking the segment from its head.
    sparse: Vec<(u64, u64)>,
    /// The last frame staged, for the index file's check of its segment.
    last: Option<seg_index::LastFrame>,
    frames: u64,
}

impl ReadResult {
    /// Total record bytes.
    pub fn len(&self) -> usize {
        self.records.iter().map(Bytes::len).sum()
    }
    pub fn is_empty(&self) -> bool {
        self.records.is_empty()
    }
    /// The records as one buffer (copies; for tests and small reads).
    pub fn concat(&self) -> Bytes {
        let mut v = Vec::with_capacity(self.len());
        for r in &self.records {
            v.extend_from_slice(r);
        }
        Bytes::from(v)
    }
}

impl Segment {
    /// A segment whose frames end at `len` (none yet: the file header's
    /// length); marks and shares are noted as frames are found or staged.
    fn new(header: FileHeader, path: PathBuf, file: CachedFile, len: u64) -> Segment {
        Segment {
            base_seq: header.base_seq,
            created_ms: header.created_ms,
            path,
            file,
            allocated: AtomicU64::new(len),
            len: AtomicU64::new(len),
            tps: Mutex::new(HashMap::default()),
            marks: Mutex::default(),
            end_seq: AtomicU64::new(0),
            indexed: Mutex::new(0),
            checkpoint_queued: AtomicU64::new(0),
            published_len: AtomicU64::new(len),
            // What a segment holds when opened (recovered, or a new file's
            // header) is older than anything the window will hold.
            cache_noted: AtomicU64::new(page_cache::page_floor(len)),
            cache_dropped: AtomicU64::new(page_cache::page_floor(len)),
        }
    }

    /// Records the frame at `pos` in the stream index if the last mark is
    /// far enough back (frames arrive in sequence order).
    fn mark(&self, seq: u64, pos: u64, crc: u32) {
        self.end_seq.fetch_max(seq + 1, Ordering::AcqRel);
        let mut marks = self.marks.lock().expect("segment marks lock");
        if marks.sparse.last().is_none_or(|&(_, p)| pos >= p + STREAM_MARK_BYTES) {
            marks.sparse.push((seq, pos));
        }
        marks.last = Some(seg_index::LastFrame { pos, seq, crc });
        marks.frames += 1;
    }

    /// Where to start walking for the first frame with sequence `seq` or
    /// later: the last mark at or before it, else the first frame.
    fn mark_for(&self, seq: u64) -> u64 {
        let marks = &self.marks.lock().expect("segment marks lock").sparse;
        let i = marks.partition_point(|&(s, _)| s <= seq);
        if i == 0 { FILE_HEADER_BYTES } else { marks[i - 1].1 }
    }

    /// Deletes the segment's index file, then the segment. Neither is
    /// durable until the branch directory is synced; recovery removes an
    /// index file a crash left without its segment.
    fn remove_files(&self, disk: &dyn Disk) -> Result<(), StorageError> {
        let ix = seg_index::index_path(&self.path);
        for path in [&ix, &self.path] {
            match disk.remove_file(path) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(io_err(path)(e)),
            }
        }
        Ok(())
    }

    /// Notes a frame of `tp` (`entry`: it got an index entry).
    fn note(&self, tp: Tp, last_offset: i64, bytes: u64, max_ts: i64, entry: bool) {
        let mut tps = self.tps.lock().expect("segment tps lock");
        let e = tps.entry(tp).or_insert(SegTp { last_offset, bytes: 0, max_ts, since_entry: 0 });
        e.last_offset = e.last_offset.max(last_offset);
        e.bytes += bytes;
        e.max_ts = e.max_ts.max(max_ts);
        e.since_entry = if entry { bytes } else { e.since_entry + bytes };
    }
}

impl Branch {
    /// A branch whose directory is `dir`. A directory already there is
    /// durable: opening storage syncs the log directory first.
    fn new(dir: PathBuf, disk: &dyn Disk) -> Arc<Branch> {
        Arc::new(Branch { dir_synced: AtomicBool::new(disk.exists(&dir)), dir, segs: RwLock::new(Vec::new()) })
    }
}

struct Branch {
    dir: PathBuf,
    /// The branch's directory exists and its entry in the log directory is
    /// durable (set only after that fsync succeeded, so a roll that failed
    /// in between syncs the parent when it is tried again).
    dir_synced: AtomicBool,
    /// Sorted by `base_seq`; the last one is active.
    segs: RwLock<Vec<Arc<Segment>>>,
}

#[derive(Debug, Clone, Copy)]
struct IndexEntry {
    offset: i64,
    /// The stream sequence number of the batch (where a tip read starts).
    seq: u64,
    seg: u64,
    pos: u64,
    /// Largest timestamp of this tp's batches before this entry.
    max_ts_before: i64,
}

struct PartState {
    log_start: i64,
    /// Published end: every offset below it is in a file.
    leo: i64,
    /// What readers may see: `min(durable, hw_limit)`, never lowered but
    /// by a truncation.
    hw: i64,
    /// What flushes made durable (or written, with a flush policy that
    /// does not wait for fsync): [`Storage::publish_hw`].
    durable: i64,
    /// The ceiling replication puts on the hw (cluster mode: what the
    /// in-sync replicas have, [`Storage::limit_hw`]); `i64::MAX` for a tp
    /// nothing replicates.
    hw_limit: i64,
    index: VecDeque<IndexEntry>,
    /// The subtree stores holding the tp's older batches, oldest first;
    /// everything in them lies below the first entry of `index`.
    stored: Vec<Arc<StoreFile>>,
    /// Where each leader epoch starts (`log/epochs.rs`); empty in
    /// single-node mode, which has no epochs but 0.
    epochs: EpochCache,
}

/// A subtree store the log reads from.
struct StoreFile {
    store: Store,
    file: CachedFile,
    /// The branches of its tps (a subtree read picks stores by branch).
    branches: Vec<String>,
    /// Each tp's branch, as an index into `branches`.
    branch_of: HashMap<Tp, usize>,
    /// Written by a cleaning (`clean`), with the earliest delete horizon
    /// of its batches that keep tombstones.
    clean: Option<Option<i64>>,
}

impl StoreFile {
    /// Opens a store's view for the log: which branch each tp is in.
    fn new(store: Store, files: &Arc<FileCache>, branch_of_tp: impl Fn(&Tp) -> Option<String>) -> StoreFile {
        let mut branches: Vec<String> = Vec::new();
        let mut branch_of = HashMap::with_capacity_and_hasher(store.tps.len(), Default::default());
        for tp in store.tps.keys() {
            let Some(name) = branch_of_tp(tp) else { continue };
            let i = match branches.iter().position(|b| *b == name) {
                Some(i) => i,
                None => {
                    branches.push(name);
                    branches.len() - 1
                }
            };
            branch_of.insert(*tp, i);
        }
        let file = files.file(store.path.clone(), false);
        StoreFile { store, file, branches, branch_of, clean: None }
    }
}

/// Where a walk over one tp's frames begins: in stores, each from its
/// position, then in the branch log from an entry; with the tp's index
/// entries from there on, so the walk can jump over other topics' frames.
#[derive(Clone)]
struct Start {
    stores: Vec<(Arc<StoreFile>, u64)>,
    log: Option<IndexEntry>,
    /// (file, position) of the tp's entries ahead: a store by its place in
    /// `stores`, a segment by its base sequence number.
    ahead: Vec<(GuideFile, u64)>,
    /// `ahead` runs to the tp's last entry.
    complete: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum GuideFile {
    Store(usize),
    Seg(u64),
}

/// Entries one read copies at most for its guide.
const GUIDE_ENTRIES: usize = 4096;

impl PartState {
    /// A flush made everything below `end` durable.
    fn made_durable(&mut self, end: i64) {
        self.durable = self.durable.max(end);
        self.raise_hw();
    }

    /// The hw rises to what is durable, as far as replication lets it.
    fn raise_hw(&mut self) {
        self.hw = self.hw.max(self.durable.min(self.hw_limit));
    }

    /// Recovery found everything below `end` on disk (or a truncation cut
    /// the tp there): durable and visible, bar a replication cap.
    pub(super) fn recovered_to(&mut self, end: i64) {
        self.durable = end;
        self.hw = end.min(self.hw_limit);
    }

    /// A truncation at `at`: nothing from it on is durable or visible.
    pub(super) fn cut_at(&mut self, at: i64) {
        self.durable = self.durable.min(at);
        self.hw = self.hw.min(at);
    }

    /// Where to start for a batch that `in_store` says a store share holds
    /// (then `pos_in` picks the entry) or else that `in_log` finds, with up
    /// to `guide` entries ahead (0: only where to start, as the tip lookup
    /// needs).
    fn start(
        &self,
        tp: &Tp,
        guide: usize,
        in_store: impl Fn(&StoreTp) -> bool,
        pos_in: impl Fn(&[StoreEntry]) -> usize,
        in_log: impl Fn(&VecDeque<IndexEntry>) -> Option<usize>,
    ) -> Option<Start> {
        let mut ahead = Vec::new();
        let mut room = guide;
        let mut push = |ahead: &mut Vec<(GuideFile, u64)>, f: GuideFile, pos: u64| {
            if room > 0 {
                ahead.push((f, pos));
                room -= 1;
            }
        };
        let mut stores = Vec::new();
        let mut log_from = None;
        if let Some(k) = self.stored.iter().position(|s| s.store.tps.get(tp).is_some_and(&in_store)) {
            for (j, s) in self.stored[k..].iter().enumerate() {
                let Some(t) = s.store.tps.get(tp) else { continue };
                let first = if j == 0 { pos_in(&t.entries) } else { 0 };
                let n = stores.len();
                stores.push((s.clone(), t.entries[first].pos));
                for e in &t.entries[first..] {
                    push(&mut ahead, GuideFile::Store(n), e.pos);
                }
            }
            log_from = (!self.index.is_empty()).then_some(0);
        } else if let Some(i) = in_log(&self.index) {
            log_from = Some(i);
        }
        let log = log_from.map(|i| self.index[i]);
        if let Some(i) = log_from {
            for e in self.index.iter().skip(i) {
                push(&mut ahead, GuideFile::Seg(e.seg), e.pos);
            }
        }
        if stores.is_empty() && log.is_none() {
            return None;
        }
        Some(Start { stores, log, complete: guide > 0 && room > 0, ahead })
    }

    /// Where the batch holding `offset` (or the first after it) starts.
    fn start_at(&self, tp: &Tp, offset: i64, guide: usize) -> Option<Start> {
        self.start(
            tp,
            guide,
            |t| t.last_offset >= offset,
            |e| e.partition_point(|x| x.offset <= offset).saturating_sub(1),
            |index| (!index.is_empty()).then(|| index.partition_point(|e| e.offset <= offset).saturating_sub(1)),
        )
    }

    /// Where to look for the first batch with a timestamp at or after `ts`.
    fn start_at_time(&self, tp: &Tp, ts: i64) -> Option<Start> {
        self.start(
            tp,
            GUIDE_ENTRIES,
            |t| t.max_ts >= ts,
            |e| e.partition_point(|x| x.max_ts_before < ts).saturating_sub(1),
            |index| (!index.is_empty()).then(|| index.partition_point(|e| e.max_ts_before < ts).saturating_sub(1)),
        )
    }

    /// The tp's shares of stores that hold anything from `log_start` on.
    /// The last offset of `tp` that subtree stores hold, if any.
    fn stored_to(&self, tp: &Tp) -> Option<i64> {
        self.stored.iter().filter_map(|s| s.store.tps.get(tp)).map(|t| t.last_offset).max()
    }

    fn live_stored<'a>(&'a self, tp: &'a Tp) -> impl Iterator<Item = &'a StoreTp> + 'a {
        self.stored.iter().filter_map(move |s| s.store.tps.get(tp)).filter(move |t| t.last_offset >= self.log_start)
    }

    /// Bytes of the tp in stores and the given segments, from `log_start`.
    fn bytes(&self, tp: &Tp, segs: &[Arc<Segment>]) -> u64 {
        self.live_stored(tp).map(|t| t.bytes).sum::<u64>() + part_bytes(segs, tp, self.log_start)
    }
}

impl Partition {
    /// A partition with nothing indexed yet: empty from its log start.
    fn new(spec: &PartitionSpec, branch: Arc<Branch>) -> Arc<Partition> {
        let start = spec.log_start;
        Arc::new(Partition {
            tp: spec.tp,
            branch,
            st: RwLock::new(PartState { log_start: start, leo: start, hw: start, durable: start, hw_limit: i64::MAX, index: VecDeque::new(), stored: Vec::new(), epochs: EpochCache::default() }),
            ahead: Mutex::new(None),
            deleted: AtomicBool::new(false),
        })
    }
}

struct Partition {
    tp: Tp,
    branch: Arc<Branch>,
    st: RwLock<PartState>,
    /// Batches read ahead for the consumer that is streaming this tp.
    /// Boxed: most partitions never have one, and inline it would cost
    /// each of a million idle partitions 48 bytes.
    ahead: Mutex<Option<Box<Ahead>>>,
    /// Its topic was deleted: the writer refuses appends to it.
    deleted: AtomicBool,
}

/// One read done before it was asked for: a consumer catching up on a tp
/// fetches from where its last response ended, so the broker reads that
/// while the previous response is on the wire. It is only ever a prefix of
/// committed data (below the high watermark), which never changes.
struct Ahead {
    offset: i64,
    records: Vec<Bytes>,
    len: usize,
    next_offset: i64,
    budget: Arc<AtomicU64>,
}

impl Drop for Ahead {
    fn drop(&mut self) {
        self.budget.fetch_sub(self.len as u64, Ordering::AcqRel);
    }
}

/// Bytes all read-ahead slots may hold together.
const READ_AHEAD_MAX_BYTES: u64 = 256 * 1024 * 1024;

/// Read buffers are reused: fresh anonymous memory costs a page fault per
/// page on these machines (and zeroing it a pass), while a reused buffer is
/// written at memory speed. A buffer returns here when the last `Bytes`
/// slice of it (held by a fetch response until it is written) is dropped.
#[derive(Default)]
struct ReadPool {
    bufs: Mutex<Vec<Vec<u8>>>,
}

/// Buffers kept for reuse, and the largest one kept.
const READ_POOL_BUFFERS: usize = 16;
const READ_POOL_MAX_BYTES: usize = MAX_READ_CHUNK;

struct PooledBuf {
    buf: Vec<u8>,
    len: usize,
    pool: Arc<ReadPool>,
}

impl AsRef<[u8]> for PooledBuf {
    fn as_ref(&self) -> &[u8] {
        &self.buf[..self.len]
    }
}

impl Drop for PooledBuf {
    fn drop(&mut self) {
        let buf = std::mem::take(&mut self.buf);
        if buf.len() <= READ_POOL_MAX_BYTES {
            let mut bufs = self.pool.bufs.lock().expect("read pool lock");
            if bufs.len() < READ_POOL_BUFFERS {
                bufs.push(buf);
            }
        }
    }
}

impl ReadPool {
    /// A buffer of at least `size` initialized bytes.
    fn take(self: &Arc<Self>, size: usize) -> PooledBuf {
        let reused = {
            let mut bufs = self.bufs.lock().expect("read pool lock");
            // Best fit: the smallest buffer that is big enough, else the largest.
            let i = bufs.iter().enumerate().filter(|(_, b)| b.len() >= size).min_by_key(|(_, b)| b.len()).map(|(i, _)| i);
            match i {
                Some(i) => Some(bufs.swap_remove(i)),
                None => bufs.iter().enumerate().max_by_key(|(_, b)| b.len()).map(|(i, _)| i).map(|i| bufs.swap_remove(i)),
            }
        };
        let mut buf = reused.unwrap_or_default();
        if buf.len() < size {
            buf.resize(size, 0);
        }
        PooledBuf { buf, len: 0, pool: self.clone() }
    }
}

pub struct Storage {
    read_pool: Arc<ReadPool>,
    ahead_bytes: Arc<AtomicU64>,
    /// The log directory (`<data>/log`).
    dir: PathBuf,
    /// The data directory (where the clean-shutdown marker lives).
    data_dir: PathBuf,
    cfg: StorageConfig,
    branches: RwLock<HashMap<String, Arc<Branch>>>,
    parts: RwLock<HashMap<Tp, Arc<Partition>>>,
    /// Every segment and store file is opened through it.
    files: Arc<FileCache>,
    /// The newest batches in memory (see `tip`); the writer adds to it
    /// while it holds `writer`, reads take the read lock only.
    tip: RwLock<super::tip::Tip>,
    /// Set by the first failed write or fsync: from then on nothing is
    /// published, acknowledged or marked clean (a failed fsync may have
    /// dropped pages; a second fsync would wrongly report success).
    poisoned: Mutex<Option<String>>,
    report: RecoveryReport,
    /// Every batch with a smaller stream sequence number is published
    /// (readers may see it): the bound of subtree reads.
    visible_seq: AtomicU64,
    /// Every subtree store, by (window, store). A subtree read takes the
    /// read lock while it collects its files, compaction's switch the
    /// write lock, so a read sees either the segments or the stores.
    stores: RwLock<Vec<Arc<StoreFile>>>,
    stores_dir: PathBuf,
    /// Compaction and retention, one at a time.
    maintenance: Mutex<Maintenance>,
    read_stats: ReadStats,
    compaction_stats: CompactionStats,
    /// Bytes written since the last fsync (what the next one makes durable).
    unsynced: AtomicU64,
    /// The segments written since the last sync began: what it syncs, so
    /// a sync costs the segments written, not the segments that exist.
    dirty: Mutex<Vec<Arc<Segment>>>,
    /// Active segments' index files captured after a flush, for the next
    /// sync to write once their frames are durable.
    checkpoints: Mutex<Vec<(Arc<Segment>, seg_index::SegIndex)>>,
    /// Synced segment pages still in the page cache, oldest first.
    cached: Mutex<page_cache::CacheWindow>,
    /// Bytes the page cache was told to drop, written and read.
    cache_dropped_bytes: AtomicU64,
    /// Every truncation in force (`log/cuts.rs`), replaced whole by the
    /// writer; readers' cursors take the current one when they start.
    cuts: RwLock<Arc<cuts::Cuts>>,
    /// Whether `cuts` holds any: single-node mode never truncates, and
    /// its cursors skip the lock.
    any_cuts: AtomicBool,
    /// What the high-watermark checkpoint on disk holds (`log/hws.rs`).
    hws_on_disk: Mutex<hws::OnDisk>,
}

/// What the maintenance lock guards.
struct Maintenance {
    next_window: u64,
}

/// Disk reads (tip hits excluded): bytes read from files and bytes
/// returned, for read amplification.
#[derive(Debug, Default)]
pub struct ReadStats {
    pub scanned: AtomicU64,
    pub delivered: AtomicU64,
}

impl ReadStats {
    fn note(&self, scanned: u64, delivered: u64) {
        if scanned > 0 {
            self.scanned.fetch_add(scanned, Ordering::Relaxed);
            self.delivered.fetch_add(delivered, Ordering::Relaxed);
        }
    }
}

/// Compaction counters (for metrics).
#[derive(Debug, Default)]
pub struct CompactionStats {
    pub windows: AtomicU64,
    pub bytes_compacted: AtomicU64,
    pub bytes_written: AtomicU64,
    pub stores_written: AtomicU64,
    pub stores_deleted: AtomicU64,
    /// Key compaction: runs, bytes of the stores replaced, bytes written.
    pub cleanings: AtomicU64,
    pub bytes_cleaned: AtomicU64,
    pub bytes_cleaned_out: AtomicU64,
    /// Milliseconds the oldest sealed segment not yet compacted has waited
    /// past its lag, at the last run (0: none waiting).
    pub lag_ms: AtomicU64,
}

/// Opening or creating `path` failed: running out of something is
/// retriable and poisons nothing; anything else is an I/O error.
fn open_err(path: &Path) -> impl FnOnce(io::Error) -> StorageError + '_ {
    move |source| {
        if files::is_exhaustion(&source) {
            StorageError::Exhausted { path: path.display().to_string(), source }
        } else {
            StorageError::Io { path: path.display().to_string(), source }
        }
    }
}

fn io_err(path: &Path) -> impl FnOnce(io::Error) -> StorageError + '_ {
    move |source| StorageError::Io { path: path.display().to_string(), source }
}

fn branch_dir_name(branch: &str) -> String {
    // A suffix keeps names like "." or ".." (branch of "..x") legal paths.
    format!("{branch}.br")
}

fn seg_file_name(base_seq: u64) -> String {
    format!("{base_seq:020}.seg")
}

impl Storage {
    /// The descriptor cache, for metrics.
    pub fn file_cache(&self) -> &FileCache {
        &self.files
    }

    /// The tip's occupancy and hit counters.
    pub fn tip_stats(&self) -> super::tip::TipStats {
        self.tip.read().expect("tip lock").stats()
    }

    pub fn recovery_report(&self) -> &RecoveryReport {
        &self.report
    }

    /// Registers a new partition (topic creation, partition increase).
    pub fn add_partition(&self, spec: PartitionSpec) {
        let branch = {
            let mut branches = self.branches.write().expect("branches lock");
            branches
                .entry(spec.branch.clone())
                .or_insert_with(|| Branch::new(self.dir.join(branch_dir_name(&spec.branch)), &*self.cfg.disk))
                .clone()
        };
        let part = Partition::new(&spec, branch);
        // The writer adopts it at its first append (see `writer`).
        self.parts.write().expect("parts lock").insert(spec.tp, part);
    }

    /// Forgets the partitions `0..partitions` of a topic (the writer's
    /// part of a topic's deletion, [`Switch::remove_topic`]): readers no
    /// longer find them, and an append already holding one is refused.
    /// Their frames stay in shared segments until retention deletes those
    /// files; nothing can read them meanwhile. Returns the tps removed.
    fn remove_topic(&self, topic: &TopicId, partitions: i32) -> Vec<Tp> {
        let mut gone = Vec::new();
        let mut parts = self.parts.write().expect("parts lock");
        for p in 0..partitions {
            let tp = Tp { topic: *topic, partition: p };
            if let Some(part) = parts.remove(&tp) {
                part.deleted.store(true, Ordering::Release);
                gone.push(tp);
            }
        }
        gone
    }

    fn check_poison(&self) -> Result<(), StorageError> {
        match self.poisoned.lock().expect("poison lock").as_ref() {
            Some(p) => Err(StorageError::Poisoned(p.clone())),
            None => Ok(()),
        }
    }

    /// Poisons for anything but running out of resources before a write.
    fn poison_unless_exhausted(&self, e: StorageError) -> StorageError {
        match e {
            StorageError::Exhausted { .. } => e,
            e => self.poison(e),
        }
    }

    /// Poisons storage for a failure outside it (a panic on a thread of
    /// the write path): appends, flushes and syncs are refused from now on.
    pub fn poison_with(&self, reason: String) -> StorageError {
        self.poison(StorageError::Poisoned(reason))
    }

    /// Why storage refuses writes, if it does.
    pub fn poison_reason(&self) -> Option<String> {
        self.poisoned.lock().expect("poison lock").clone()
    }

    fn poison(&self, e: StorageError) -> StorageError {
        let mut slot = self.poisoned.lock().expect("poison lock");
        if slot.is_none() {
            tracing::error!(error = %e, "storage poisoned: no further write is acknowledged");
            *slot = Some(e.to_string());
        }
        e
    }

    /// Makes every written byte durable (fdatasync of each dirty segment).
    /// A failure poisons storage: no later append pretends to be durable.
    /// Returns the bytes written since the previous sync.
    pub fn sync(&self) -> Result<u64, StorageError> {
        self.check_poison()?;
        // Before the dirty list: every checkpoint queued by now describes
        // frames written before this sync began, which it makes durable
        // (their segment is on the list, or a sync since their write
        // already covered them; syncs do not overlap: one syncer).
        let checkpoints = std::mem::take(&mut *self.checkpoints.lock().expect("checkpoints lock"));
        let bytes = self.unsynced.swap(0, Ordering::AcqRel);
        let segs = std::mem::take(&mut *self.dirty.lock().expect("dirty list lock"));
        for seg in segs {
            // The writer held the file it wrote; the hold ends here.
            let Some((held, number)) = seg.file.to_sync() else { continue };
            // What was written before the sync is what it makes durable.
            let written = seg.len.load(Ordering::Acquire);
            let synced = match held {
                _ if self.cfg.planted == Some(Planted::SkipFsync) => Ok(()),
                Some(f) => f.sync_data(),
                None => seg.file.get().and_then(|f| f.sync_data()),
            };
            if let Err(e) = synced {
                return Err(self.poison(StorageError::Poisoned(format!("fdatasync of {} failed: {e}", seg.path.display()))));
            }
            seg.file.synced(number);
            self.note_synced(&seg, written);
        }
        self.trim_cache_window();
        self.write_checkpoints(checkpoints);
        Ok(bytes)
    }

    /// Lets readers see offsets up to each given end (after they are durable,
    /// or right away when the flush policy does not wait for fsync), and the
    /// stream up to the flush's sequence number.
    pub fn publish_hw(&self, flushed: &Flushed) {
        let parts = self.parts.read().expect("parts lock");
        let cuts = self.cuts_in_force();
        for (tp, end) in &flushed.moved {
            if let Some(p) = parts.get(tp) {
                let mut st = p.st.write().expect("partition lock");
                let mut end = (*end).min(st.leo);
                // A flush before a truncation vouches for nothing past the
                // cut: offsets there may be the new tail, not yet durable.
                for c in cuts.as_ref().and_then(|c| c.get(tp)).into_iter().flatten().filter(|c| c.seq >= flushed.seq_end) {
                    end = end.min(c.end);
                }
                st.made_durable(end);
            }
        }
        // After the tps: a subtree read never serves a batch its tp's own
        // fetch could not.
        self.visible_seq.fetch_max(flushed.seq_end, Ordering::AcqRel);
    }

    /// Caps `tp`'s high watermark at `limit` (cluster mode: the offset
    /// every in-sync replica has; on a follower, its leader's hw), and
    /// raises it to what is durable below the cap. The hw never goes down
    /// here: a lower cap only stops it. Returns the hw when it moved.
    pub fn limit_hw(&self, tp: &Tp, limit: i64) -> Option<i64> {
        let part = self.parts.read().expect("parts lock").get(tp).cloned()?;
        let mut st = part.st.write().expect("partition lock");
        st.hw_limit = limit;
        let before = st.hw;
        st.raise_hw();
        (st.hw > before).then_some(st.hw)
    }

    /// What is durable of `tp` (its end as far as flushes reached disk):
    /// a leader's own share of the high watermark.
    pub fn durable_end(&self, tp: &Tp) -> Option<i64> {
        let part = self.parts.read().expect("parts lock").get(tp).cloned()?;
        let st = part.st.read().expect("partition lock");
        Some(st.durable)
    }

    /// Every tp storage holds.
    pub fn tps(&self) -> Vec<Tp> {
        self.parts.read().expect("parts lock").keys().copied().collect()
    }

    /// Every tp's published log end, for the tps that hold anything (log
    /// end past log start), under one read lock; and how many tps there
    /// are. What a producer snapshot covers: a restart replays a tp the
    /// snapshot does not list from its log start, which for a tp empty now
    /// is where anything appended later begins, so a million idle topics
    /// do not make every snapshot a million lines.
    pub fn nonempty_log_ends(&self) -> (Vec<(Tp, i64)>, usize) {
        let parts = self.parts.read().expect("parts lock");
        let ends = parts
            .iter()
            .filter_map(|(tp, p)| {
                let st = p.st.read().expect("partition lock");
                (st.leo > st.log_start).then_some((*tp, st.leo))
            })
            .collect();
        (ends, parts.len())
    }

    /// Calls `f` with every tp's (log start, high watermark, log end),
    /// under one read lock of the registry.
    pub fn visit_offsets(&self, mut f: impl FnMut(&Tp, i64, i64, i64)) {
        for (tp, p) in self.parts.read().expect("parts lock").iter() {
            let st = p.st.read().expect("partition lock");
            f(tp, st.log_start, st.hw, st.leo);
        }
    }

    /// Offsets of a tp: (log start, high watermark, log end).
    pub fn offsets(&self, tp: &Tp) -> Option<(i64, i64, i64)> {
        let part = self.parts.read().expect("parts lock").get(tp).cloned()?;
        let st = part.st.read().expect("partition lock");
        Some((st.log_start, st.hw, st.leo))
    }

    /// The bytes attributable to each of `tps` from its log start: its
    /// frames in segments and its batches in stores (shared files count
    /// only its share), from the summaries; nothing is read. Each branch's
    /// segments are visited once for all its tps asked, so the cost is the
    /// segments' tp maps, not tps × segments (DescribeLogDirs of every
    /// partition). None for a tp storage does not hold.
    pub fn partition_sizes(&self, tps: &[Tp]) -> Vec<Option<u64>> {
        let parts: Vec<Option<Arc<Partition>>> = {
            let map = self.parts.read().expect("parts lock");
            tps.iter().map(|tp| map.get(tp).cloned()).collect()
        };
        let mut out: Vec<Option<u64>> = vec![None; tps.len()];
        // Per branch: (branch, tp → (slot, log start)).
        let mut branches: HashMap<u64, (Arc<Branch>, HashMap<Tp, (usize, i64)>)> = HashMap::default();
        for (i, part) in parts.iter().enumerate() {
            let Some(part) = part else { continue };
            let st = part.st.read().expect("partition lock");
            let stored: u64 = st.live_stored(&part.tp).map(|t| t.bytes).sum();
            out[i] = Some(stored);
            branches.entry(tip_key(&part.branch)).or_insert_with(|| (part.branch.clone(), HashMap::default())).1.insert(part.tp, (i, st.log_start));
        }
        for (branch, wanted) in branches.values() {
            let segs = branch.segs.read().expect("segments lock").clone();
            for seg in &segs {
                let held = seg.tps.lock().expect("segment tps lock");
                let mut add = |tp: &Tp, s: &SegTp| {
                    if let Some(&(i, log_start)) = wanted.get(tp) {
                        if s.last_offset >= log_start {
                            *out[i].as_mut().expect("set above") += s.bytes;
                        }
                    }
                };
                if held.len() <= wanted.len() {
                    for (tp, s) in held.iter() {
                        add(tp, s);
                    }
                } else {
                    for tp in wanted.keys() {
                        if let Some(s) = held.get(tp) {
                            add(tp, s);
                        }
                    }
                }
            }
        }
        out
    }

    /// Reads whole batches of `tp` starting with the one holding `offset`,
    /// up to the high watermark, stopping once `max_bytes` is reached. With
    /// `min_one`, the first batch is returned even if it is larger, so a
    /// consumer always makes progress (Kafka does the same for the first
    /// partition of a fetch response).
    pub fn read(&self, tp: &Tp, offset: i64, max_bytes: usize, min_one: bool) -> Result<ReadResult, ReadError> {
        self.read_within(tp, offset, max_bytes, min_one, false)
    }

    /// [`Storage::read`] for a follower replica (cluster mode): up to the
    /// log end, not the high watermark, since what followers have is what
    /// moves the high watermark. Read-ahead slots are consumers' and are
    /// left alone.
    pub fn read_for_replica(&self, tp: &Tp, offset: i64, max_bytes: usize, min_one: bool) -> Result<ReadResult, ReadError> {
        self.read_within(tp, offset, max_bytes, min_one, true)
    }

    fn read_within(&self, tp: &Tp, offset: i64, max_bytes: usize, min_one: bool, to_end: bool) -> Result<ReadResult, ReadError> {
        let part = self.parts.read().expect("parts lock").get(tp).cloned().ok_or(ReadError::UnknownPartition)?;
        let (start, log_start, hw, leo) = {
            let st = part.st.read().expect("partition lock");
            // Kafka: out of range only past the log end; between the high
            // watermark and the end (not yet durable) the answer is empty.
            if offset < st.log_start || offset > st.leo {
                return Err(ReadError::OffsetOutOfRange { offset, log_start: st.log_start, end: st.leo });
            }
            (st.start_at(tp, offset, 0), st.log_start, st.hw, st.leo)
        };
        let mut result = ReadResult { records: Vec::new(), high_watermark: hw, log_start, log_end: leo, bytes_scanned: 0, next_offset: offset, from_tip: false };
        let Some(start) = start else { return Ok(result) };
        // Where this read stops; `hw` below is that bound.
        let hw = if to_end { leo } else { hw };
        if offset >= hw {
            return Ok(result);
        }
        if !to_end {
            // A read-ahead slot for another offset is stale: the consumer
            // moved on (cleared before the tip answers, so it does not
            // keep its share of the read-ahead budget).
            let mut slot = part.ahead.lock().expect("read-ahead lock");
            if slot.as_ref().is_some_and(|a| a.offset != offset) {
                *slot = None;
            }
        }
        // The tip first: no syscall, and only this branch's entries walked.
        // (Batches in stores are old: the tip has none of them.)
        if let (true, Some(e)) = (start.stores.is_empty(), &start.log) {
            if self.cfg.tip.bytes > 0 && e.offset <= offset {
                let key = tip_key(&part.branch);
                if let Some(t) = self.tip.read().expect("tip lock").read(tp, key, e.seq, offset, hw, max_bytes, min_one) {
                    result.records = t.records;
                    result.next_offset = t.next_offset;
                    result.from_tip = true;
                    return Ok(result);
                }
            }
        }
        if !to_end {
            let mut slot = part.ahead.lock().expect("read-ahead lock");
            if slot.as_ref().is_some_and(|a| a.len <= max_bytes.max(if min_one { usize::MAX } else { 0 })) {
                let mut a = slot.take().expect("checked");
                tracing::trace!(offset, len = a.len, "read-ahead hit");
                result.records = std::mem::take(&mut a.records);
                result.next_offset = a.next_offset;
                return Ok(result);
            }
        }
        let mut taken = 0usize;
        let mut next_offset = offset;
        let want = std::cell::Cell::new(max_bytes);
        let mut out = Vec::new();
        self.walk(&part, |st| st.start_at(tp, offset, GUIDE_ENTRIES), hw, &want, &mut result.bytes_scanned, |fh, buf, range| {
            if fh.last_offset() < offset {
                return Walk::Skip;
            }
            let len = range.len();
            if !((min_one && out.is_empty()) || taken + len <= max_bytes) {
                return Walk::Stop;
            }
            // A small batch is copied out rather than pinning a large
            // read buffer until the response is written.
            out.push(if len < SMALL_COPY && buf.len() > 8 * len { Bytes::copy_from_slice(&buf[range]) } else { buf.slice(range) });
            taken += len;
            want.set(max_bytes.saturating_sub(taken));
            next_offset = fh.last_offset() + 1;
            // Nothing of this tp lies beyond the high watermark: stop here
            // rather than scan the rest of the branch.
            if taken >= max_bytes || next_offset >= hw { Walk::Stop } else { Walk::Skip }
        })
        .map_err(|e| ReadError::Io(e.to_string()))?;
        self.read_stats.note(result.bytes_scanned, taken as u64);
        result.records = out;
        result.next_offset = next_offset;
        Ok(result)
    }

    /// Reads `tp` from `offset` now and keeps the result for the fetch that
    /// will ask for it (see [`Ahead`]). Skipped when the slots are full.
    pub fn read_ahead(&self, tp: &Tp, offset: i64, max_bytes: usize) {
        if self.ahead_bytes.load(Ordering::Acquire) + max_bytes as u64 > READ_AHEAD_MAX_BYTES {
            return;
        }
        let Some(part) = self.parts.read().expect("parts lock").get(tp).cloned() else { return };
        if part.ahead.lock().expect("read-ahead lock").as_ref().is_some_and(|a| a.offset == offset) {
            return;
        }
        let Ok(r) = self.read(tp, offset, max_bytes, true) else { return };
        tracing::trace!(offset, len = r.len(), "read ahead");
        // Nothing read from files (empty, or served by the tip): nothing
        // to keep.
        if r.records.is_empty() || r.from_tip {
            return;
        }
        let len = r.len();
        self.ahead_bytes.fetch_add(len as u64, Ordering::AcqRel);
        let a = Ahead { offset, records: r.records, len, next_offset: r.next_offset, budget: self.ahead_bytes.clone() };
        *part.ahead.lock().expect("read-ahead lock") = Some(Box::new(a));
    }

    /// The first record with the tp's largest timestamp among what readers
    /// may see (ListOffsets -3), with that timestamp; None when the tp has
    /// nothing visible.
    pub fn offset_of_max_timestamp(&self, tp: &Tp) -> Result<Option<(i64, i64)>, ReadError> {
        let Some(max) = self.max_timestamp(tp)? else { return Ok(None) };
        if let Some(found) = self.offset_for_timestamp(tp, max)? {
            return Ok(Some(found));
        }
        // The largest timestamp is in batches not yet published (the
        // summaries count what is staged). The largest visible one is the
        // largest of: the stores', what precedes the last index entry
        // below the high watermark (its `max_ts_before`), and the few
        // batches between that entry and the high watermark, read here.
        let part = self.parts.read().expect("parts lock").get(tp).cloned().ok_or(ReadError::UnknownPartition)?;
        let (log_start, hw, entry, stored) = {
            let st = part.st.read().expect("partition lock");
            let stored = st.live_stored(tp).map(|t| t.max_ts).max();
            (st.log_start, st.hw, st.index.iter().rev().find(|e| e.offset < st.hw).copied(), stored)
        };
        let mut visible = stored.unwrap_or(i64::MIN);
        if let Some(e) = entry {
            visible = visible.max(e.max_ts_before);
            let mut scanned = 0;
            self.walk(&part, |st| st.start_at(tp, e.offset.max(log_start), GUIDE_ENTRIES), hw, &std::cell::Cell::new(MIN_READ_CHUNK), &mut scanned, |fh, _, _| {
                if fh.last_offset() >= log_start {
                    visible = visible.max(fh.max_timestamp);
                }
                if fh.last_offset() + 1 >= hw {
                    Walk::Stop
                } else {
                    Walk::Skip
                }
            })
            .map_err(|e| ReadError::Io(e.to_string()))?;
        }
        if visible == i64::MIN {
            return Ok(None);
        }
        self.offset_for_timestamp(tp, visible)
    }

    /// The largest timestamp among the tp's batches from its log start,
    /// from the summaries stores and segments keep (no data is read), or
    /// None when it has no batch. A segment partly below the log start
    /// counts whole, as Kafka's segment-level maximum does.
    pub fn max_timestamp(&self, tp: &Tp) -> Result<Option<i64>, ReadError> {
        let part = self.parts.read().expect("parts lock").get(tp).cloned().ok_or(ReadError::UnknownPartition)?;
        let segs = part.branch.segs.read().expect("segments lock").clone();
        let st = part.st.read().expect("partition lock");
        let stored = st.live_stored(tp).map(|t| t.max_ts);
        let logged: Vec<i64> = segs.iter().filter_map(|s| s.tps.lock().expect("segment tps lock").get(tp).copied()).filter(|s| s.last_offset >= st.log_start).map(|s| s.max_ts).collect();
        Ok(stored.chain(logged).max())
    }

    /// The earliest offset whose timestamp is at or after `ts`, with that
    /// timestamp (ListOffsets by time). Exact for uncompressed batches; for
    /// compressed ones the batch's base offset and max timestamp.
    pub fn offset_for_timestamp(&self, tp: &Tp, ts: i64) -> Result<Option<(i64, i64)>, ReadError> {
        self.offset_for_timestamp_below(tp, ts, false)
    }

    /// [`Storage::offset_for_timestamp`] over the whole log, past the high
    /// watermark too: what a restart replays producer state from (a
    /// replicated tp's hw may start below batches its producers wrote).
    pub fn offset_for_timestamp_in_log(&self, tp: &Tp, ts: i64) -> Result<Option<(i64, i64)>, ReadError> {
        self.offset_for_timestamp_below(tp, ts, true)
    }

    /// The lookup below the hw, or below the log end with `to_end`.
    fn offset_for_timestamp_below(&self, tp: &Tp, ts: i64, to_end: bool) -> Result<Option<(i64, i64)>, ReadError> {
        let part = self.parts.read().expect("parts lock").get(tp).cloned().ok_or(ReadError::UnknownPartition)?;
        let (log_start, bound) = {
            let st = part.st.read().expect("partition lock");
            (st.log_start, if to_end { st.leo } else { st.hw })
        };
        let mut found = None;
        let mut scanned = 0;
        self.walk(&part, |st| st.start_at_time(tp, ts), bound, &std::cell::Cell::new(MIN_READ_CHUNK), &mut scanned, |fh, buf, range| {
            let batch = &buf[range];
            if fh.last_offset() < log_start || fh.max_timestamp < ts {
                return if fh.last_offset() + 1 >= bound { Walk::Stop } else { Walk::Skip };
            }
            // A LogAppendTime batch gives every record its max timestamp.
            let log_append = batch::BatchHeader::parse(batch).is_ok_and(|h| h.is_log_append_time());
            let exact = if log_append { None } else { batch::record_timestamps(batch) }.and_then(|recs| {
                recs.into_iter()
                    // Offset deltas come from the client: keep them inside the batch.
                    .filter(|&(d, _)| d >= 0 && d <= fh.last_offset_delta)
                    .find(|&(d, t)| t >= ts && fh.base_offset + d as i64 >= log_start)
                    .map(|(d, t)| (fh.base_offset + d as i64, t))
            });
            found = Some(exact.unwrap_or((fh.base_offset.max(log_start), fh.max_timestamp)));
            Walk::Stop
        })
        .map_err(|e| ReadError::Io(e.to_string()))?;
        Ok(found)
    }

    /// Calls `visit` for each frame of `part` from `start`, in order, below
    /// `hw`, across segments, until it answers `Stop`. Files are read in
    /// chunks of about `want` bytes (what the caller still wants: `visit`
    /// lowers it as it takes batches) into buffers that `visit` may keep
    /// slices of; `visit` gets the buffer and the range of the batch.
    fn walk(
        &self,
        part: &Partition,
        start: impl Fn(&PartState) -> Option<Start>,
        hw: i64,
        want: &std::cell::Cell<usize>,
        scanned: &mut u64,
        mut visit: impl FnMut(&FrameHeader, &Bytes, std::ops::Range<usize>) -> Walk,
    ) -> io::Result<()> {
        let mut frames = None;
        // A segment can be compacted or deleted between looking up where to
        // start and opening it; its entries are gone from the index before
        // it leaves the branch, so the second look finds the new place.
        for _ in 0..8 {
            let Some(at) = start(&part.st.read().expect("partition lock")) else { return Ok(()) };
            frames = self.frames_for(part, &at, MIN_READ_CHUNK);
            if frames.is_some() {
                break;
            }
        }
        let mut frames = frames.ok_or_else(|| io::Error::other("the log kept changing under the read"))?;
        loop {
            // Read about what the caller still wants, not a whole chunk
            // more for the last batch.
            frames.chunk = want.get().saturating_add(FRAME_HEADER_BYTES).clamp(WALK_MIN_CHUNK, MAX_READ_CHUNK);
            let Some((fh, buf, range)) = frames.next(scanned)? else { break };
            if fh.topic_id == part.tp.topic && fh.partition == part.tp.partition {
                if fh.base_offset >= hw {
                    return Ok(());
                }
                if let Walk::Stop = visit(&fh, &buf, range) {
                    return Ok(());
                }
            }
        }
        Ok(())
    }

    /// A cursor over `part`'s frames from `start`.
    fn frames_for(&self, part: &Partition, start: &Start, chunk: usize) -> Option<Frames<'_>> {
        let mut chain: Vec<(Arc<dyn FrameFile>, u64)> = start.stores.iter().map(|(s, p)| (s.clone() as Arc<dyn FrameFile>, *p)).collect();
        let mut seg_bases = Vec::new();
        if let Some(e) = &start.log {
            let (files, bases) = Frames::segments(&part.branch, e.seg, e.pos)?;
            chain.extend(files);
            seg_bases = bases;
        }
        let n = start.stores.len();
        let mut ahead = VecDeque::with_capacity(start.ahead.len());
        for &(f, pos) in &start.ahead {
            let file = match f {
                GuideFile::Store(i) => i,
                // A segment the chain does not hold (retention removed
                // it): no guide from here on.
                GuideFile::Seg(base) => match seg_bases.binary_search(&base) {
                    Ok(i) => n + i,
                    Err(_) => break,
                },
            };
            ahead.push_back((file, pos));
        }
        let complete = start.complete && ahead.len() == start.ahead.len();
        let mut frames = Frames::chain(self, chain, chunk);
        frames.guide = Some(Guide { ahead, behind: None, complete });
        Some(frames)
    }

    /// Number of segment files (for metrics and tests).
    pub fn segment_count(&self) -> usize {
        self.branches.read().expect("branches lock").values().map(|b| b.segs.read().expect("branch lock").len()).sum()
    }
}

enum Walk {
    Skip,
    Stop,
}

/// A file of frames: a branch-log segment or a subtree store.
trait FrameFile: Send + Sync {
    /// The file, open (through the descriptor cache).
    fn file(&self) -> io::Result<FileRef>;
    fn path(&self) -> &Path;
    /// Frames lie below this position.
    fn frames_end(&self) -> u64;
    /// Pages below this lie outside the page-cache window: once read,
    /// they need not stay cached.
    fn read_once_below(&self) -> u64;
}

impl FrameFile for Segment {
    fn file(&self) -> io::Result<FileRef> {
        self.file.get()
    }
    fn path(&self) -> &Path {
        &self.path
    }
    fn frames_end(&self) -> u64 {
        self.len.load(Ordering::Acquire)
    }
    fn read_once_below(&self) -> u64 {
        self.cache_dropped.load(Ordering::Acquire)
    }
}

impl FrameFile for StoreFile {
    fn file(&self) -> io::Result<FileRef> {
        self.file.get()
    }
    fn path(&self) -> &Path {
        &self.store.path
    }
    fn frames_end(&self) -> u64 {
        self.store.frames_end
    }
    fn read_once_below(&self) -> u64 {
        // Stores are not windowed: compaction picks segments by age, not
        // by bytes, so a store may hold batches as recent as the window's,
        // and its pages are left to the kernel as Kafka leaves its own.
        0
    }
}

/// A cursor over frames in stream order: a chain of files, each walked from
/// a position to its end (a segment's published end when the cursor reaches
/// it). Files are read in chunks of about `chunk` bytes into pooled
/// buffers; every frame comes back as a slice of one.
struct Frames<'a> {
    storage: &'a Storage,
    files: Vec<(Arc<dyn FrameFile>, u64)>,
    /// The truncations in force when the cursor started: their dead frames
    /// are passed by.
    cuts: Option<Arc<cuts::Cuts>>,
    seg: usize,
    /// File position of `buf[0]` in `files[seg]`.
    buf_pos: u64,
    buf: Bytes,
    at: usize,
    chunk: usize,
    /// For a walk over one tp: where its batches can be.
    guide: Option<Guide>,
}

/// The tp's index entries ahead of a cursor, as (file, position). A batch
/// of the tp without an entry lies within `MAX_SCAN_GAP` bytes after the
/// entry before it in the same file (entries are made so), so a cursor
/// that is past that and needs to read more jumps to the next entry, and
/// past the last one stops: the bytes between are other topics'.
struct Guide {
    ahead: VecDeque<(usize, u64)>,
    behind: Option<(usize, u64)>,
    /// `ahead` runs to the tp's last entry.
    complete: bool,
}

impl<'a> Frames<'a> {
    /// The branch's segments from the one based at `seg` (from `pos`) on,
    /// with their base sequence numbers; None if that one is gone.
    #[allow(clippy::type_complexity)]
    fn segments(branch: &Branch, seg: u64, pos: u64) -> Option<(Vec<(Arc<dyn FrameFile>, u64)>, Vec<u64>)> {
        let segs = branch.segs.read().expect("branch lock");
        let i = segs.partition_point(|s| s.base_seq < seg);
        if segs.get(i).is_none_or(|s| s.base_seq != seg) {
            return None;
        }
        let files = segs[i..].iter().enumerate().map(|(k, s)| (s.clone() as Arc<dyn FrameFile>, if k == 0 { pos } else { FILE_HEADER_BYTES })).collect();
        Some((files, segs[i..].iter().map(|s| s.base_seq).collect()))
    }

    /// Walks `files` in order, each from its position.
    fn chain(storage: &'a Storage, files: Vec<(Arc<dyn FrameFile>, u64)>, chunk: usize) -> Frames<'a> {
        let buf_pos = files.first().map_or(FILE_HEADER_BYTES, |f| f.1);
        Frames { storage, files, cuts: storage.cuts_in_force(), seg: 0, buf_pos, buf: Bytes::new(), at: 0, chunk, guide: None }
    }

    /// The next frame: its header, the buffer holding it and the range of
    /// its batch in that buffer. None past the end.
    fn next(&mut self, scanned: &mut u64) -> io::Result<Option<(FrameHeader, Bytes, std::ops::Range<usize>)>> {
        loop {
            let mut need = FRAME_HEADER_BYTES;
            if self.at + FRAME_HEADER_BYTES <= self.buf.len() {
                let path = || self.files[self.seg].0.path().display().to_string();
                let fh = FrameHeader::decode(&self.buf[self.at..])
                    .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, format!("bad frame in {}", path())))?;
                let flen = fh.frame_len as usize;
                if self.at + flen <= self.buf.len() {
                    let range = self.at + FRAME_HEADER_BYTES..self.at + flen;
                    self.at += flen;
                    if self.cuts.as_ref().is_some_and(|c| cuts::dead(c, &fh)) {
                        continue;
                    }
                    return Ok(Some((fh, self.buf.clone(), range)));
                }
                // Straddles the end of this chunk: read it whole next.
                need = flen;
            }
            let start = self.buf_pos + self.at as u64;
            if let Some(g) = self.guide.as_mut() {
                let here = (self.seg, start);
                while g.ahead.front().is_some_and(|&e| e <= here) {
                    g.behind = g.ahead.pop_front();
                }
                let covered = g.behind.is_some_and(|(f, p)| f == self.seg && start <= p + MAX_SCAN_GAP);
                if !covered {
                    match g.ahead.front() {
                        Some(&(f, p)) => {
                            (self.seg, self.buf_pos, self.at, self.buf) = (f, p, 0, Bytes::new());
                            continue;
                        }
                        None if g.complete => return Ok(None),
                        None => {}
                    }
                }
            }
            let Some((seg, _)) = self.files.get(self.seg) else { return Ok(None) };
            let end = seg.frames_end();
            if start + FRAME_HEADER_BYTES as u64 > end {
                self.seg += 1;
                self.buf_pos = self.files.get(self.seg).map_or(FILE_HEADER_BYTES, |f| f.1);
                self.buf = Bytes::new();
                self.at = 0;
                continue;
            }
            if need as u64 > end - start {
                return Err(io::Error::new(io::ErrorKind::InvalidData, format!("frame at {start} overruns {}", seg.path().display())));
            }
            let mut want = ((end - start) as usize).min(self.chunk);
            if let Some(g) = &self.guide {
                // At a lone entry (the next one is far or in another file):
                // the tp's batches here lie within the gap it covers.
                let at_entry = g.behind == Some((self.seg, start));
                let far = g.ahead.front().is_none_or(|&(f, p)| f != self.seg || p - start > want as u64);
                if at_entry && far {
                    want = want.min(MAX_SCAN_GAP as usize);
                }
            }
            let want = want.max(need).min((end - start) as usize);
            let mut raw = self.storage.read_pool.take(want);
            let file = seg.file()?;
            let got = segment::read_full_at(&*file, &mut raw.buf[..want], start)?;
            self.storage.read_once(&file, start, start + got as u64, seg.read_once_below());
            if got < need {
                return Err(io::Error::new(io::ErrorKind::UnexpectedEof, format!("{} is shorter than its published length", seg.path().display())));
            }
            raw.len = got;
            *scanned += got as u64;
            self.buf = Bytes::from_owner(raw);
            self.buf_pos = start;
            self.at = 0;
        }
    }
}

fn part_bytes(segs: &[Arc<Segment>], tp: &Tp, log_start: i64) -> u64 {
    segs.iter()
        .filter_map(|s| s.tps.lock().expect("segment tps lock").get(tp).copied())
        .filter(|s| s.last_offset >= log_start)
        .map(|s| s.bytes)
        .sum()
}

/// A branch as the tip knows it: its address, stable while the storage
/// lives (branches are never dropped).
fn tip_key(branch: &Arc<Branch>) -> u64 {
    Arc::as_ptr(branch) as u64
}

fn branch_key(branch: &Branch) -> String {
    branch.dir.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default()
}

/// The branch's name (its directory name without the suffix).
fn branch_name(branch: &Branch) -> String {
    let key = branch_key(branch);
    key.strip_suffix(".br").unwrap_or(&key).to_owned()
}


/// Makes `dir`'s names durable. Running out of descriptors to open it is
/// `Exhausted` (retriable, nothing poisoned), as for any file.
fn sync_dir(disk: &dyn Disk, dir: &Path) -> Result<(), StorageError> {
    disk.sync_dir(dir).map_err(open_err(dir))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::batch::tests::make_batch;

    pub(super) fn tp(n: u8, p: i32) -> Tp {
        Tp { topic: [n; 16], partition: p }
    }

    pub(super) fn spec(n: u8, p: i32, branch: &str) -> PartitionSpec {
        PartitionSpec { tp: tp(n, p), branch: branch.into(), log_start: 0 }
    }

    fn append_n(w: &mut LogWriter, t: Tp, n: usize, ts: i64) {
        for i in 0..n {
            let b = make_batch(&[format!("v{i}").as_bytes(), b"x"], ts + i as i64 * 10);
            w.append(t, &b, 0, false).unwrap();
        }
        let moved = w.flush().unwrap();
        w.storage().publish_hw(&moved);
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig { cases: 32, ..Default::default() })]
        /// A sparse topic between dense ones: reads jump from index entry to
        /// index entry over the others' frames, and still return every
        /// batch, from any offset, before and after a restart; a sparse
        /// topic's read scans about a chunk per batch, not the branch.
        #[test]
        fn guided_reads_jump_over_other_topics_and_miss_nothing(
            pattern in proptest::collection::vec((0u8..3, 1usize..40, 50usize..3000), 20..300),
            interval in proptest::prop_oneof![proptest::strategy::Just(4096u64), 1u64..100_000],
            max in proptest::prop_oneof![proptest::strategy::Just(1usize), 1000usize..300_000],
        ) {
            let dir = tempfile::tempdir().unwrap();
            let specs = vec![spec(1, 0, "b"), spec(2, 0, "b"), spec(3, 0, "b")];
            let cfg = StorageConfig { segment_bytes: 8 << 20, index_interval_bytes: interval, tip: crate::storage::tip::TipConfig { bytes: 0, ..Default::default() }, ..StorageConfig::default() };
            let mut want: HashMap<Tp, Vec<(i64, Vec<u8>)>> = HashMap::default();
            {
                let (s, mut w) = Storage::open(dir.path(), cfg.clone(), specs.clone(), true).unwrap();
                for (i, &(t, n, len)) in pattern.iter().enumerate() {
                    // Topic 3 is sparse: one batch in twenty appends, at most.
                    let t = if t == 2 && i % 20 != 0 { 1 } else { t };
                    let vals: Vec<Vec<u8>> = (0..n).map(|k| vec![b'a' + (k % 26) as u8; len]).collect();
                    let refs: Vec<&[u8]> = vals.iter().map(|v| v.as_slice()).collect();
                    let mut b = make_batch(&refs, i as i64);
                    let a = w.append(tp(t + 1, 0), &b, 0, false).unwrap();
                    batch::set_base_offset(&mut b, a.base_offset);
                    want.entry(tp(t + 1, 0)).or_default().push((a.base_offset, b));
                    if i % 7 == 0 {
                        let f = w.flush().unwrap();
                        s.publish_hw(&f);
                    }
                }
                let f = w.flush().unwrap();
                s.publish_hw(&f);
                s.sync().unwrap();
                check_guided(&s, &want, max)?;
            }
            let (s, _w) = Storage::open(dir.path(), cfg, specs, true).unwrap();
            check_guided(&s, &want, max)?;
        }
    }

    fn check_guided(s: &Storage, want: &HashMap<Tp, Vec<(i64, Vec<u8>)>>, max: usize) -> Result<(), proptest::test_runner::TestCaseError> {
        for (t, rows) in want {
            let mut got = Vec::new();
            let mut offset = 0;
            let mut scanned = 0;
            loop {
                let r = s.read(t, offset, max, true).unwrap();
                if r.records.is_empty() {
                    break;
                }
                scanned += r.bytes_scanned;
                got.extend(r.records.iter().map(|b| b.to_vec()));
                offset = r.next_offset;
            }
            let rows_bytes: Vec<Vec<u8>> = rows.iter().map(|r| r.1.clone()).collect();
            proptest::prop_assert!(got == rows_bytes, "tp {:?}: {} batches read, {} written", t, got.len(), rows.len());
            // From inside any batch: that batch first.
            for (base, b) in rows {
                let n = batch::BatchHeader::parse(b).unwrap().last_offset_delta as i64;
                let r = s.read(t, base + n, 1, true).unwrap();
                proptest::prop_assert!(r.records[0].as_ref() == &b[..]);
            }
            if t.topic[0] == 3 {
                // Each batch costs at most two chunks (one more when it
                // straddles a chunk's end), the gap an entry covers, and
                // itself: never the dense topics' bytes in between.
                let chunk = max.saturating_add(FRAME_HEADER_BYTES).clamp(MIN_READ_CHUNK, MAX_READ_CHUNK) as u64;
                let own: u64 = rows.iter().map(|r| r.1.len() as u64).sum();
                let bound = rows.len() as u64 * (2 * chunk + MAX_SCAN_GAP) + own;
                proptest::prop_assert!(scanned <= bound, "{} scanned for {} sparse batches ({} bytes), bound {}", scanned, rows.len(), own, bound);
            }
        }
        Ok(())
    }

    pub(super) fn offsets_of(records: &Bytes) -> Vec<i64> {
        batch::split(records).map(|b| batch::BatchHeader::parse(b.unwrap()).unwrap().base_offset).collect()
    }

    #[test]
    fn append_read_interleaved_topics() {
        let dir = tempfile::tempdir().unwrap();
        let (s, mut w) = Storage::open(dir.path(), StorageConfig::default(), vec![spec(1, 0, "a.b"), spec(2, 0, "a.b")], true).unwrap();
        for _ in 0..50 {
            append_n(&mut w, tp(1, 0), 1, 0);
            append_n(&mut w, tp(2, 0), 2, 0);
        }
        assert_eq!(s.offsets(&tp(1, 0)), Some((0, 100, 100)));
        assert_eq!(s.offsets(&tp(2, 0)), Some((0, 200, 200)));
        let r = s.read(&tp(1, 0), 0, 1 << 20, true).unwrap();
        assert_eq!(offsets_of(&r.concat()), (0..50).map(|i| i * 2).collect::<Vec<_>>());
        // An offset inside a batch returns that batch.
        let r = s.read(&tp(2, 0), 7, 1, true).unwrap();
        assert_eq!(offsets_of(&r.concat()), vec![6]);
        assert!(matches!(s.read(&tp(2, 0), 201, 10, true), Err(ReadError::OffsetOutOfRange { .. })));
        assert!(s.read(&tp(2, 0), 200, 10, true).unwrap().records.is_empty());
    }

    #[test]
    fn unpublished_hw_hides_data() {
        let dir = tempfile::tempdir().unwrap();
        let (s, mut w) = Storage::open(dir.path(), StorageConfig::default(), vec![spec(1, 0, "t")], true).unwrap();
        let b = make_batch(&[b"a"], 0);
        w.append(tp(1, 0), &b, 0, false).unwrap();
        let moved = w.flush().unwrap();
        assert_eq!(s.offsets(&tp(1, 0)), Some((0, 0, 1)));
        assert!(s.read(&tp(1, 0), 0, 100, true).unwrap().records.is_empty());
        s.sync().unwrap();
        s.publish_hw(&moved);
        assert_eq!(s.read(&tp(1, 0), 0, 100, true).unwrap().len(), b.len());
    }

    #[test]
    fn a_replication_cap_holds_the_hw_and_replicas_read_past_it() {
        let dir = tempfile::tempdir().unwrap();
        let (s, mut w) = Storage::open(dir.path(), StorageConfig::default(), vec![spec(1, 0, "t")], true).unwrap();
        let t = tp(1, 0);
        // Capped before anything is durable: the flush is held at the cap.
        assert_eq!(s.limit_hw(&t, 1), None);
        for v in [b"a", b"b", b"c"] {
            w.append(t, &make_batch(&[v], 0), 0, false).unwrap();
        }
        let moved = w.flush().unwrap();
        s.sync().unwrap();
        s.publish_hw(&moved);
        assert_eq!(s.offsets(&t), Some((0, 1, 3)));
        assert_eq!(s.durable_end(&t), Some(3));
        assert_eq!(s.read(&t, 0, 1000, true).unwrap().next_offset, 1);
        assert!(s.read(&t, 1, 1000, true).unwrap().records.is_empty());
        // A follower reads to the log end, and learns the hw beside it.
        let r = s.read_for_replica(&t, 1, 1000, true).unwrap();
        assert_eq!((r.next_offset, r.high_watermark, r.log_end), (3, 1, 3));
        // A higher cap lets the hw up to what is durable, no further; a
        // lower one never takes it back.
        assert_eq!(s.limit_hw(&t, 10), Some(3));
        assert_eq!(s.limit_hw(&t, 2), None);
        assert_eq!(s.offsets(&t), Some((0, 3, 3)));
        // Uncapped again, a tp is what single-node mode makes it.
        assert_eq!(s.limit_hw(&t, i64::MAX), None);
        assert_eq!(s.limit_hw(&tp(9, 0), 1), None, "an unknown tp");
    }

    #[test]
    fn restart_rebuilds_offsets_and_rolls_segments() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = StorageConfig { segment_bytes: 4096, ..Default::default() };
        {
            let (s, mut w) = Storage::open(dir.path(), cfg.clone(), vec![spec(1, 0, "x"), spec(1, 1, "x")], false).unwrap();
            for _ in 0..40 {
                append_n(&mut w, tp(1, 0), 3, 0);
                append_n(&mut w, tp(1, 1), 1, 0);
            }
            s.sync().unwrap();
            assert!(s.segment_count() > 3);
        }
        // Each reopen appends one more 2-record batch to partition 1.
        for (round, clean) in [true, false].into_iter().enumerate() {
            let (s, mut w) = Storage::open(dir.path(), cfg.clone(), vec![spec(1, 0, "x"), spec(1, 1, "x")], clean).unwrap();
            let p1 = 80 + 2 * round as i64;
            assert_eq!(s.offsets(&tp(1, 0)), Some((0, 240, 240)));
            assert_eq!(s.offsets(&tp(1, 1)), Some((0, p1, p1)));
            let r = s.read(&tp(1, 0), 0, usize::MAX, true).unwrap();
            assert_eq!(offsets_of(&r.concat()), (0..120).map(|i| i * 2).collect::<Vec<_>>());
            append_n(&mut w, tp(1, 1), 1, 0);
            s.sync().unwrap();
            assert_eq!(s.offsets(&tp(1, 1)), Some((0, p1 + 2, p1 + 2)));
        }
    }

    /// Found by the simulator (seed 737 before the fix): the log directory's
    /// name, and a branch directory left by an earlier run, were never made
    /// durable, so the worst crash lost every acknowledged batch under them.
    #[test]
    fn every_directory_above_an_acknowledged_batch_is_durable() {
        use crate::storage::disk::sim::{Faults, SimDisk};
        let disk = SimDisk::new(1, Faults::default());
        let data = Path::new("/data");
        disk.create_dir_all(data).and_then(|_| disk.sync_dir(Path::new("/"))).unwrap();
        let cfg = StorageConfig { disk: Arc::new(disk.clone()), ..Default::default() };
        // An earlier run made the branch's directory and stopped before
        // syncing it.
        disk.create_dir_all(&data.join("log").join("x.br")).unwrap();
        let (s, mut w) = Storage::open(data, cfg.clone(), vec![spec(1, 0, "x")], false).unwrap();
        append_n(&mut w, tp(1, 0), 3, 0);
        s.sync().unwrap();
        drop(s);
        disk.crash_losing_everything_unsynced();
        let (s, _w) = Storage::open(data, cfg, vec![spec(1, 0, "x")], false).unwrap();
        assert_eq!(s.offsets(&tp(1, 0)), Some((0, 6, 6)), "the synced batches survive the crash");
    }

    /// A regression: on the first start, the data directory (and any
    /// parent created with it) was made by the engine and its name never
    /// synced, so a crash soon after lost the directory and everything
    /// acknowledged under it. Storage now creates it, durably.
    #[test]
    fn a_data_directory_created_by_the_first_start_survives_a_crash() {
        use crate::storage::disk::sim::{Faults, SimDisk};
        let disk = SimDisk::new(2, Faults::default());
        let data = Path::new("/srv/canopy/data");
        let cfg = StorageConfig { disk: Arc::new(disk.clone()), ..Default::default() };
        let (s, mut w) = Storage::open(data, cfg.clone(), vec![spec(1, 0, "x")], false).unwrap();
        append_n(&mut w, tp(1, 0), 3, 0);
        s.sync().unwrap();
        drop((s, w));
        disk.crash_losing_everything_unsynced();
        let (s, _w) = Storage::open(data, cfg, vec![spec(1, 0, "x")], false).unwrap();
        assert_eq!(s.offsets(&tp(1, 0)), Some((0, 6, 6)), "the synced batches survive the crash");
    }

    /// Ten 2-record batches in branch `t`, synced: the segment and its length.
    fn ten_batches_synced(dir: &Path) -> (PathBuf, u64) {
        let (s, mut w) = Storage::open(dir, StorageConfig::default(), vec![spec(1, 0, "t")], false).unwrap();
        append_n(&mut w, tp(1, 0), 10, 0);
        s.sync().unwrap();
        drop(s);
        let seg = std::fs::read_dir(dir.join("log/t.br")).unwrap().next().unwrap().unwrap().path();
        let len = std::fs::metadata(&seg).unwrap().len();
        (seg, len)
    }

    /// Found by the simulator (seed 454671): a roll that failed after
    /// creating its file (out of space writing its header) leaves the
    /// segment before it active, and a crash can bring the removed file
    /// back. That segment's unsynced tail then sits before an empty one;
    /// it is cut like the active segment's, not refused as sealed damage.
    #[test]
    fn a_torn_tail_before_empty_segments_is_cut_not_refused() {
        let dir = tempfile::tempdir().unwrap();
        let (seg, len) = ten_batches_synced(dir.path());
        std::fs::OpenOptions::new().write(true).open(&seg).unwrap().set_len(len - 3).unwrap();
        let empty = dir.path().join("log/t.br").join(seg_file_name(1_000));
        segment::create(&RealDisk, &empty, &FileHeader { base_seq: 1_000, created_ms: 0 }).unwrap();
        let (s, mut w) = Storage::open(dir.path(), StorageConfig::default(), vec![spec(1, 0, "t")], false).unwrap();
        assert_eq!(s.offsets(&tp(1, 0)), Some((0, 18, 18)));
        assert!(s.recovery_report().truncated_bytes > 0);
        // Appends go on in the empty segment, and survive a restart.
        append_n(&mut w, tp(1, 0), 1, 0);
        s.sync().unwrap();
        drop(s);
        let (s, _w) = Storage::open(dir.path(), StorageConfig::default(), vec![spec(1, 0, "t")], false).unwrap();
        assert_eq!(s.offsets(&tp(1, 0)), Some((0, 20, 20)));
    }

    #[test]
    fn torn_and_corrupt_tails_are_truncated() {
        for damage in ["truncate", "flip"] {
            let dir = tempfile::tempdir().unwrap();
            let (seg, len) = ten_batches_synced(dir.path());
            let f = std::fs::OpenOptions::new().write(true).open(&seg).unwrap();
            if damage == "truncate" {
                f.set_len(len - 3).unwrap();
            } else {
                std::os::unix::fs::FileExt::write_all_at(&f, &[0xff], len - 5).unwrap();
            }
            let (s, _w) = Storage::open(dir.path(), StorageConfig::default(), vec![spec(1, 0, "t")], false).unwrap();
            assert_eq!(s.offsets(&tp(1, 0)), Some((0, 18, 18)), "{damage}");
            assert!(s.recovery_report().truncated_bytes > 0);
            let r = s.read(&tp(1, 0), 0, usize::MAX, true).unwrap();
            assert_eq!(offsets_of(&r.concat()).len(), 9);
        }
    }

    #[test]
    fn time_index_finds_records() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = StorageConfig { index_interval_bytes: 1, ..Default::default() };
        let (s, mut w) = Storage::open(dir.path(), cfg, vec![spec(1, 0, "t")], true).unwrap();
        append_n(&mut w, tp(1, 0), 10, 1000); // batch i: ts 1000+10i, 1001+10i
        assert_eq!(s.offset_for_timestamp(&tp(1, 0), 0).unwrap(), Some((0, 1000)));
        assert_eq!(s.offset_for_timestamp(&tp(1, 0), 1001).unwrap(), Some((1, 1001)));
        assert_eq!(s.offset_for_timestamp(&tp(1, 0), 1015).unwrap(), Some((4, 1020)));
        assert_eq!(s.offset_for_timestamp(&tp(1, 0), 5000).unwrap(), None);
    }

    /// ListOffsets -3: the first record with the largest timestamp among
    /// what readers may see; a larger one written but not yet published
    /// (above the high watermark) does not hide it.
    #[test]
    fn max_timestamp_is_the_first_visible_record_with_the_largest() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = StorageConfig { index_interval_bytes: 1, ..Default::default() };
        let (s, mut w) = Storage::open(dir.path(), cfg, vec![spec(1, 0, "t")], true).unwrap();
        assert_eq!(s.offset_of_max_timestamp(&tp(1, 0)).unwrap(), None, "empty");
        for ts in [5_000, 9_000, 7_000, 9_000, 1_000] {
            w.append(tp(1, 0), &make_batch(&[b"v"], ts), 0, false).unwrap();
        }
        let moved = w.flush().unwrap();
        s.publish_hw(&moved);
        assert_eq!(s.offset_of_max_timestamp(&tp(1, 0)).unwrap(), Some((1, 9_000)));
        // Written, not published: the summaries see it, readers must not.
        w.append(tp(1, 0), &make_batch(&[b"late"], 20_000), 0, false).unwrap();
        let pending = w.flush().unwrap();
        assert_eq!(s.max_timestamp(&tp(1, 0)).unwrap(), Some(20_000));
        assert_eq!(s.offset_of_max_timestamp(&tp(1, 0)).unwrap(), Some((1, 9_000)));
        s.publish_hw(&pending);
        assert_eq!(s.offset_of_max_timestamp(&tp(1, 0)).unwrap(), Some((5, 20_000)));
    }

    #[test]
    fn retention_advances_start_and_deletes_shared_segments() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = StorageConfig { segment_bytes: 2048, ..Default::default() };
        let (s, mut w) = Storage::open(dir.path(), cfg, vec![spec(1, 0, "b"), spec(2, 0, "b")], true).unwrap();
        for _ in 0..30 {
            append_n(&mut w, tp(1, 0), 1, 0);
            append_n(&mut w, tp(2, 0), 1, 0);
        }
        let before = s.segment_count();
        // Only topic 1 has a retention: its start advances, segments stay
        // while topic 2 still needs them.
        let policy = |t: &Tp| if t.topic == [1; 16] { RetentionPolicy { retention_ms: Some(1), retention_bytes: None } } else { RetentionPolicy::default() };
        let mut persisted = Vec::new();
        let (adv, deleted) = s.enforce_retention(1_000_000, policy, |a| { persisted.extend_from_slice(a); Ok(()) }, |_| Ok(()), &mut |sw| w.apply(sw)).unwrap();
        assert_eq!(adv.len(), 1);
        assert_eq!(persisted, adv);
        assert_eq!(deleted, 0);
        let (start, _, end) = s.offsets(&tp(1, 0)).unwrap();
        assert!(start > 0 && start <= end);
        assert!(matches!(s.read(&tp(1, 0), 0, 10, true), Err(ReadError::OffsetOutOfRange { .. })));
        assert!(!s.read(&tp(2, 0), 0, usize::MAX, true).unwrap().is_empty());
        // Once topic 2 is gone, the sealed segments can go.
        w.apply(Switch::remove_topic([2; 16], 1)).unwrap();
        let (_, deleted) = s.enforce_retention(1_000_000, policy, |_| Ok(()), |_| Ok(()), &mut |sw| w.apply(sw)).unwrap();
        assert_eq!(deleted, before - 1);
        assert_eq!(s.segment_count(), 1);
    }

    /// A segment in the middle dies while an older one lives on (a tp
    /// without retention keeps it): the index entries into the dead one go
    /// too, so reads by offset and by time still find their batches.
    #[test]
    fn retention_of_a_middle_segment_trims_its_index_entries() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = StorageConfig { segment_bytes: 2048, ..Default::default() };
        let (s, mut w) = Storage::open(dir.path(), cfg, vec![spec(1, 0, "b"), spec(2, 0, "b")], true).unwrap();
        // Topic 2 (kept forever) only in the first segment; topic 1 old
        // (timestamps 0..) through several segments, then new.
        append_n(&mut w, tp(2, 0), 1, 0);
        append_n(&mut w, tp(1, 0), 40, 0);
        append_n(&mut w, tp(1, 0), 20, 900_000);
        assert!(s.segment_count() >= 4);
        let policy = |t: &Tp| if t.topic == [1; 16] { RetentionPolicy { retention_ms: Some(200_000), retention_bytes: None } } else { RetentionPolicy::default() };
        let (adv, deleted) = s.enforce_retention(1_000_000, policy, |_| Ok(()), |_| Ok(()), &mut |sw| w.apply(sw)).unwrap();
        assert_eq!(adv.len(), 1);
        assert!(deleted >= 1, "the middle segments die");
        let (start, hw, _) = s.offsets(&tp(1, 0)).unwrap();
        assert!(start > 0 && start < hw);
        assert!(!s.read(&tp(1, 0), start, 1, true).unwrap().records.is_empty());
        // Times inside the dead range pick entries that pointed into it.
        for ts in (0..400).step_by(25) {
            let (found, at) = s.offset_for_timestamp(&tp(1, 0), ts).unwrap().expect("a batch at or after the time");
            assert!(found >= start && at >= ts, "time {ts}: {found} at {at}, start {start}");
        }
        assert_eq!(s.read(&tp(2, 0), 0, 100, true).unwrap().records.len(), 1);
    }

    #[test]
    fn retention_bytes_keeps_the_newest_data() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = StorageConfig { segment_bytes: 2048, ..Default::default() };
        let (s, mut w) = Storage::open(dir.path(), cfg, vec![spec(1, 0, "b")], true).unwrap();
        append_n(&mut w, tp(1, 0), 60, 0);
        let segs = s.segment_count();
        let policy = |_: &Tp| RetentionPolicy { retention_ms: None, retention_bytes: Some(4096) };
        let (adv, deleted) = s.enforce_retention(0, policy, |_| Ok(()), |_| Ok(()), &mut |sw| w.apply(sw)).unwrap();
        assert_eq!(adv.len(), 1);
        assert!(deleted > 0 && deleted < segs);
        let (start, hw, end) = s.offsets(&tp(1, 0)).unwrap();
        assert_eq!((hw, end), (120, 120));
        // What remains is at least retention.bytes and starts at a batch.
        let r = s.read(&tp(1, 0), start, usize::MAX, true).unwrap();
        assert!(r.len() >= 4096 - 2048, "kept {} bytes", r.len());
        assert_eq!(offsets_of(&r.concat())[0], start);
        // Running it again changes nothing.
        let (adv, deleted) = s.enforce_retention(0, policy, |_| Ok(()), |_| Ok(()), &mut |sw| w.apply(sw)).unwrap();
        assert!(adv.is_empty() && deleted == 0);
    }

    #[test]
    fn segments_roll_by_age() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = StorageConfig { segment_ms: 1000, ..Default::default() };
        let (s, mut w) = Storage::open(dir.path(), cfg, vec![spec(1, 0, "a")], true).unwrap();
        for (i, now) in [0i64, 500, 999, 1000, 1500, 2100].iter().enumerate() {
            let b = make_batch(&[format!("v{i}").as_bytes()], *now);
            w.append(tp(1, 0), &b, *now, false).unwrap();
            let moved = w.flush().unwrap();
            s.publish_hw(&moved);
        }
        // Segments created at 0, 1000 and 2100.
        assert_eq!(s.segment_count(), 3);
        assert_eq!(offsets_of(&s.read(&tp(1, 0), 0, usize::MAX, true).unwrap().concat()), vec![0, 1, 2, 3, 4, 5]);
    }

    #[test]
    fn log_append_time_rewrites_timestamps_and_keeps_crc_valid() {
        let dir = tempfile::tempdir().unwrap();
        let (s, mut w) = Storage::open(dir.path(), StorageConfig::default(), vec![spec(1, 0, "t")], true).unwrap();
        let b = make_batch(&[b"a", b"b"], 5);
        w.append(tp(1, 0), &b, 777_000, true).unwrap();
        let moved = w.flush().unwrap();
        s.publish_hw(&moved);
        let stored = s.read(&tp(1, 0), 0, usize::MAX, true).unwrap().concat();
        let h = batch::validate(&stored, 1 << 20).unwrap();
        assert!(h.is_log_append_time());
        assert_eq!(h.max_timestamp, 777_000);
        assert_eq!(s.offset_for_timestamp(&tp(1, 0), 700_000).unwrap().map(|(o, _)| o), Some(0));
    }

    #[test]
    fn damage_in_a_sealed_segment_refuses_start_and_names_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = StorageConfig { segment_bytes: 2048, ..Default::default() };
        {
            let (s, mut w) = Storage::open(dir.path(), cfg.clone(), vec![spec(1, 0, "t")], false).unwrap();
            append_n(&mut w, tp(1, 0), 40, 0);
            s.sync().unwrap();
            assert!(s.segment_count() > 2);
        }
        let mut segs: Vec<_> = std::fs::read_dir(dir.path().join("log/t.br")).unwrap().map(|e| e.unwrap().path()).filter(|p| p.extension().is_some_and(|x| x == "seg")).collect();
        segs.sort();
        let first = &segs[0];
        let len = std::fs::metadata(first).unwrap().len();
        std::fs::OpenOptions::new().write(true).open(first).unwrap().set_len(len - 10).unwrap();
        match Storage::open(dir.path(), cfg, vec![spec(1, 0, "t")], false) {
            Err(StorageError::CorruptSealed { path, .. }) => assert!(path.ends_with(&*first.file_name().unwrap().to_string_lossy())),
            Err(e) => panic!("wrong error {e}"),
            Ok(_) => panic!("opened a log with a damaged sealed segment"),
        }
    }

    #[test]
    fn reads_between_high_watermark_and_log_end_are_empty() {
        let dir = tempfile::tempdir().unwrap();
        let (s, mut w) = Storage::open(dir.path(), StorageConfig::default(), vec![spec(1, 0, "t")], true).unwrap();
        let b = make_batch(&[b"a", b"b"], 0);
        w.append(tp(1, 0), &b, 0, false).unwrap();
        w.flush().unwrap(); // written, not yet published as durable
        assert_eq!(s.offsets(&tp(1, 0)), Some((0, 0, 2)));
        assert!(s.read(&tp(1, 0), 1, 100, true).unwrap().is_empty());
        assert!(s.read(&tp(1, 0), 2, 100, true).unwrap().is_empty());
        assert!(matches!(s.read(&tp(1, 0), 3, 100, true), Err(ReadError::OffsetOutOfRange { .. })));
    }
}
