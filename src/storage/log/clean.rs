//! Key compaction ("cleaning"): a keyed topic (`cleanup.policy` with
//! `compact`) keeps the latest record per key.
//!
//! The window compactor gives a keyed topic stores of its own
//! ([`super::compact::TopicView`]), so a cleaning reads and rewrites that
//! topic's bytes only. One run cleans one topic: the *run* of its newest
//! own stores (a store written before the topic became keyed, shared with
//! siblings, ends the run and is left as it is). The first store of the
//! run may be the last cleaning's output (clean); the others are dirty.
//! Segments are never read: their batches are cleaned once a window has
//! made them a store, so the active segment is never touched.
//!
//! # When
//!
//! A topic is due when its dirty stores old enough for
//! `min.compaction.lag.ms` (by their newest timestamp) are more than
//! `min.cleanable.dirty.ratio` of the run's bytes, or the oldest of them is
//! older than `max.compaction.lag.ms`, or the clean store holds tombstones
//! whose delete horizon has passed. The dirtiest topic goes first.
//!
//! # How
//!
//! 1. **The offset map**: the latest offset of every key, per partition,
//!    over the dirty stores, oldest first (from clean stores only while a
//!    transaction is open in the partition); at least one dirty store is
//!    taken, and a store more once the map is over `map_bytes` is left for
//!    the next run (so every run progresses, and memory is the budget and
//!    one store's keys). Transactions are followed by their markers:
//!    records of a committed transaction enter the map at its commit,
//!    batches of an aborted one are noted, and batches of one with no
//!    marker in the taken stores are kept whole and stay out of the map
//!    (and the partition's tombstones stay meanwhile).
//! 2. **The rewrite**, into one store (`compact`) or one per taken store
//!    (`compact,delete`, so retention by time still finds old stores): a
//!    record is kept when its key's latest offset is its own (or it has no
//!    key). A kept tombstone goes once its batch's delete horizon (KIP-534)
//!    has passed; a batch that keeps tombstones and has no horizon gets
//!    one, `delete.retention.ms` from now, its records' timestamps
//!    unchanged. Batches of aborted transactions go. A commit marker whose
//!    transaction has no data left gets a horizon the same way, and goes
//!    after it; abort markers stay. A batch keeps its base offset and last
//!    offset delta, so offsets are preserved, with gaps, as in Kafka; a
//!    changed batch is re-encoded with its codec. A tp's last batch, and
//!    each producer's last data batch, stay (empty if nothing of them
//!    survives), and shares keep the offset range of what they replace,
//!    so neither the log end nor the log start moves.
//! 3. **The switch**, as compaction's: the store is written and synced
//!    under a temporary name and renamed ([`Step::Written`],
//!    [`Step::Synced`]); the catalog records a window listing it and the
//!    stores it replaces ([`Step::Switched`]); the writer switches readers;
//!    the replaced files go ([`Step::Deleted`]). A crash before the catalog
//!    write leaves an unlisted store the next start deletes; after it, the
//!    replaced stores are no longer live, and the next start deletes them.

use super::*;
use crate::protocol::batch::{self as kb, BatchHeader, Marker, RecordView};
use crate::storage::hashing::HashSet;
use crate::storage::subtree::store::StoreWriter;
use crate::storage::subtree::{Step, StoreRecord, WindowRecord};

/// A keyed topic's cleaning settings (its topic configs).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CleanPolicy {
    pub delete_retention_ms: i64,
    pub min_compaction_lag_ms: i64,
    pub max_compaction_lag_ms: i64,
    pub min_cleanable_dirty_ratio: f64,
    /// The policy also has `delete`: retention deletes whole stores by
    /// their newest timestamp, so each store is rewritten into one of its
    /// own (keeping its time range) rather than all into one.
    pub delete: bool,
}

impl Default for CleanPolicy {
    /// Kafka's defaults.
    fn default() -> Self {
        CleanPolicy { delete_retention_ms: 86_400_000, min_compaction_lag_ms: 0, max_compaction_lag_ms: i64::MAX, min_cleanable_dirty_ratio: 0.5, delete: false }
    }
}

/// How cleaning runs.
#[derive(Debug, Clone)]
pub struct CleanConfig {
    /// Budget of the offset map (keys and their offsets), in bytes.
    pub map_bytes: u64,
}

impl Default for CleanConfig {
    fn default() -> Self {
        CleanConfig { map_bytes: 128 << 20 }
    }
}

/// What one run did.
#[derive(Debug, Clone)]
pub struct Cleaned {
    pub window: WindowRecord,
    pub topic: TopicId,
    /// Stores replaced.
    pub stores_in: usize,
    pub bytes_in: u64,
    pub bytes_out: u64,
    pub records_in: u64,
    pub records_out: u64,
}

/// Map accounting per key, beyond its bytes.
const MAP_ENTRY_BYTES: u64 = 48;
/// Inflated records of one batch, at most (batches were checked against
/// the topic's limit when produced).
const INFLATE_LIMIT: usize = 256 << 20;

/// A topic due for cleaning, and the stores to take.
struct Due {
    topic: TopicId,
    policy: CleanPolicy,
    stores: Vec<Arc<StoreFile>>,
    /// How many of `stores`, from the first, are clean (a cleaning's).
    clean: usize,
    ratio: f64,
}

/// An open transaction: its batches' base offsets, its records' keys and
/// offsets.
type OpenTxn = (Vec<i64>, Vec<(Box<[u8]>, i64)>);

/// What pass 1 learns.
#[derive(Default)]
struct OffsetMap {
    /// Per partition: key → latest offset.
    latest: HashMap<i32, HashMap<Box<[u8]>, i64>>,
    bytes: u64,
    /// Per (partition, producer): the open transaction's batches and keys.
    open: HashMap<(i32, i64), OpenTxn>,
    /// (partition, base offset) of batches of aborted transactions.
    aborted: HashSet<(i32, i64)>,
    /// Of transactions with no marker in the taken stores.
    undecided: HashSet<(i32, i64)>,
    /// Per partition: the base offset of its last batch.
    last: HashMap<i32, i64>,
    /// Partitions with an undecided transaction: their tombstones stay (a
    /// later commit could make an older value of the key the latest, as
    /// Kafka never cleans past the first unstable offset).
    unstable: HashSet<i32>,
    /// Per (partition, producer): the base offset of its last data batch,
    /// kept (empty if need be) so replaying the log rebuilds the
    /// producer's sequence, as Kafka keeps it.
    producer_last: HashMap<(i32, i64), i64>,
}

impl OffsetMap {
    fn note(&mut self, partition: i32, key: &[u8], offset: i64) {
        let keys = self.latest.entry(partition).or_default();
        match keys.get_mut(key) {
            Some(o) => *o = (*o).max(offset),
            None => {
                self.bytes += key.len() as u64 + MAP_ENTRY_BYTES;
                keys.insert(key.into(), offset);
            }
        }
    }

    /// Whether a transaction is open in `partition`.
    fn open_in(&self, partition: i32) -> bool {
        self.open.keys().any(|&(p, _)| p == partition)
    }

    /// Takes in one batch of the topic. With `keys` (a dirty store) every
    /// record enters the map; from a clean store only while a transaction
    /// is open in the partition (what supersedes the rest is dirty, but an
    /// open transaction may commit later with older records of a key).
    fn add(&mut self, partition: i32, batch: &[u8], keys: bool) -> Result<(), String> {
        let h = BatchHeader::parse(batch).map_err(|e| e.to_string())?;
        self.last.insert(partition, h.base_offset);
        if !h.is_control() && h.producer_id >= 0 {
            self.producer_last.insert((partition, h.producer_id), h.base_offset);
        }
        if h.is_control() {
            if let Some((batches, txn_keys)) = self.open.remove(&(partition, h.producer_id)) {
                match kb::marker_of(batch, &h) {
                    // Committed in a clean store with nothing else open:
                    // the cleaning that made the store applied it.
                    Some(Marker::Commit) if !keys && !self.open_in(partition) => {
                        self.bytes -= txn_keys.iter().map(|(k, _)| k.len() as u64 + MAP_ENTRY_BYTES).sum::<u64>();
                    }
                    Some(Marker::Commit) => {
                        for (k, o) in txn_keys {
                            self.bytes -= k.len() as u64 + MAP_ENTRY_BYTES;
                            self.note(partition, &k, o);
                        }
                    }
                    Some(Marker::Abort) => self.aborted.extend(batches.into_iter().map(|b| (partition, b))),
                    // Not a marker we know: keep the batches whole.
                    None => self.undecided.extend(batches.into_iter().map(|b| (partition, b))),
                }
            }
            return Ok(());
        }
        if h.is_transactional() {
            let open = self.open.entry((partition, h.producer_id)).or_default();
            open.0.push(h.base_offset);
            // Kept even from a clean store: a transaction undecided when
            // that store was cleaned may commit in a dirty one.
            let records = kb::records_of(batch, &h, INFLATE_LIMIT).map_err(|e| e.to_string())?;
            for r in kb::records_view(&records, h.records_count) {
                let r = r.map_err(|e| e.to_string())?;
                if let Some(k) = r.key {
                    self.bytes += k.len() as u64 + MAP_ENTRY_BYTES;
                    open.1.push((k.into(), h.base_offset + r.offset_delta));
                }
            }
            return Ok(());
        }
        if !keys && !self.open_in(partition) {
            return Ok(());
        }
        let records = kb::records_of(batch, &h, INFLATE_LIMIT).map_err(|e| e.to_string())?;
        for r in kb::records_view(&records, h.records_count) {
            let r = r.map_err(|e| e.to_string())?;
            if let Some(k) = r.key {
                self.note(partition, k, h.base_offset + r.offset_delta);
            }
        }
        Ok(())
    }

    /// After the last batch: transactions still open are undecided.
    fn finish(&mut self) {
        for ((partition, _), (batches, _)) in self.open.drain() {
            self.unstable.insert(partition);
            self.undecided.extend(batches.into_iter().map(|b| (partition, b)));
        }
        self.unstable.extend(self.undecided.iter().map(|&(p, _)| p));
    }
}

/// What becomes of one batch.
enum Fate {
    Keep,
    Drop,
    Rewrite(Vec<u8>),
}

impl Storage {
    /// Cleans one keyed topic (see the module docs), if one is due.
    /// `policy` gives the settings of keyed topics (None: not keyed, or
    /// gone); `throttle` and `persist` are as for [`Storage::compact`].
    pub fn clean(
        &self,
        now_ms: i64,
        cfg: &CleanConfig,
        policy: impl Fn(&TopicId) -> Option<CleanPolicy>,
        throttle: &mut dyn FnMut(u64) -> bool,
        persist: impl FnOnce(&WindowRecord) -> Result<(), String>,
        apply: Apply<'_>,
    ) -> Result<Option<Cleaned>, StorageError> {
        self.clean_until(now_ms, cfg, policy, throttle, persist, apply, &mut |_| false)
    }

    /// [`Storage::clean`] that stops (as a crash would) at the first step
    /// `stop_at` says yes to, returning `StorageError::Stopped`.
    #[allow(clippy::too_many_arguments)]
    pub fn clean_until(
        &self,
        now_ms: i64,
        cfg: &CleanConfig,
        policy: impl Fn(&TopicId) -> Option<CleanPolicy>,
        throttle: &mut dyn FnMut(u64) -> bool,
        persist: impl FnOnce(&WindowRecord) -> Result<(), String>,
        apply: Apply<'_>,
        stop_at: &mut dyn FnMut(Step) -> bool,
    ) -> Result<Option<Cleaned>, StorageError> {
        let mut stop = |step: Step| if stop_at(step) { Err(StorageError::Stopped(format!("{step:?}"))) } else { Ok(()) };
        let mut maintenance = self.maintenance.lock().expect("maintenance lock");
        self.check_poison()?;
        let Some(due) = self.due_for_cleaning(now_ms, &policy).into_iter().next() else { return Ok(None) };
        stop(Step::Start)?;
        let topic = due.topic;
        // The cleaned topic's partitions (not a copy of the whole registry).
        let parts: HashMap<Tp, Arc<Partition>> = self.parts.read().expect("parts lock").iter().filter(|(tp, _)| tp.topic == topic).map(|(tp, p)| (*tp, p.clone())).collect();
        let log_start = |p: i32| parts.get(&Tp { topic, partition: p }).map_or(i64::MAX, |p| p.st.read().expect("partition lock").log_start);
        let disk = &*self.cfg.disk;
        let io = |e: io::Error| StorageError::Io { path: self.stores_dir.display().to_string(), source: e };
        let bad = |path: &Path, why: String| StorageError::Store(StoreError::Corrupt { path: path.display().to_string(), why });
        let mut scanned = 0u64;
        let mut throttled = 0u64;
        let mut charge = |scanned: u64| -> Result<(), StorageError> {
            if scanned - throttled >= 1 << 20 {
                if !throttle(scanned - throttled) {
                    return Err(StorageError::Stopped("cleaning cancelled".into()));
                }
                throttled = scanned;
            }
            Ok(())
        };

        // 1. The offset map over the dirty stores, store by store, while
        // it has room (at least one is always taken); the clean ones give
        // only their transactions and last batches.
        let mut map = OffsetMap::default();
        let mut taken = 0;
        for (i, s) in due.stores.iter().enumerate() {
            if i > due.clean && map.bytes >= cfg.map_bytes {
                break;
            }
            let mut frames = self.store_frames(s);
            while let Some((fh, buf, range)) = frames.next(&mut scanned).map_err(io)? {
                if fh.topic_id == topic && fh.last_offset() >= log_start(fh.partition) {
                    map.add(fh.partition, &buf[range], i >= due.clean).map_err(|why| bad(&s.store.path, why))?;
                } else if fh.topic_id == topic {
                    map.last.insert(fh.partition, fh.base_offset);
                }
                charge(scanned)?;
            }
            taken = i + 1;
        }
        map.finish();
        let inputs = &due.stores[..taken];

        // 2. The rewrite: into one store, or one per input store when
        // retention also deletes by time.
        let window = maintenance.next_window;
        disk.create_dir_all(&self.stores_dir).map_err(io_err(&self.stores_dir))?;
        let tmp = |n: usize| self.stores_dir.join(format!("{}.tmp", store::file_name(window, n as u32)));
        let out_of = |i: usize| if due.policy.delete { i } else { 0 };
        let mut records_in = 0u64;
        let mut records_out = 0u64;
        let mut horizon: Option<i64> = None;
        let mut writers: Vec<Option<StoreWriter>> = (0..inputs.len()).map(|_| None).collect();
        let written = (|| -> Result<Vec<(usize, PathBuf, FileRef, u64)>, StorageError> {
            let mut frame = Vec::new();
            // Offset ranges of shares not yet covered by an output (an
            // input whose batches all went hands its range on).
            let mut pending: HashMap<Tp, (i64, i64)> = HashMap::default();
            // Per (partition, producer): whether a batch of its current
            // transaction was kept (absent: none seen in this pass).
            let mut txn_kept: HashMap<(i32, i64), bool> = HashMap::default();
            for (i, s) in inputs.iter().enumerate() {
                let n = out_of(i);
                let mut frames = self.store_frames(s);
                while let Some((fh, buf, range)) = frames.next(&mut scanned).map_err(io)? {
                    charge(scanned)?;
                    if fh.topic_id != topic {
                        continue;
                    }
                    let batch = &buf[range.clone()];
                    let h = BatchHeader::parse(batch).map_err(|e| bad(&s.store.path, e.to_string()))?;
                    records_in += h.records_count.max(0) as u64;
                    let last = map.last.get(&fh.partition) == Some(&fh.base_offset)
                        || (!h.is_control() && map.producer_last.get(&(fh.partition, h.producer_id)) == Some(&fh.base_offset));
                    let fate = if fh.last_offset() < log_start(fh.partition) {
                        Fate::Drop
                    } else if h.is_control() {
                        let emptied = txn_kept.remove(&(fh.partition, h.producer_id)) == Some(false);
                        marker_fate(batch, &h, emptied, last, now_ms, due.policy.delete_retention_ms, &mut horizon).map_err(|why| bad(&s.store.path, why))?
                    } else {
                        fate(&map, fh.partition, batch, &h, now_ms, due.policy.delete_retention_ms, &mut horizon).map_err(|why| bad(&s.store.path, why))?
                    };
                    if h.is_transactional() && !h.is_control() {
                        *txn_kept.entry((fh.partition, h.producer_id)).or_insert(false) |= !matches!(fate, Fate::Drop) || last;
                    }
                    let fate = match fate {
                        // A tp's (or a producer's) last batch stays, empty:
                        // the log end is where it was, and a replay finds
                        // the producer's last sequence.
                        Fate::Drop if last => Fate::Rewrite(kb::rebuilt(batch, &[], kb::Compression::None, None)),
                        f => f,
                    };
                    let w = match (&fate, &mut writers[n]) {
                        (Fate::Drop, _) => continue,
                        (_, Some(w)) => w,
                        (_, slot) => slot.insert(StoreWriter::create(disk, &tmp(n), window, n as u32, self.cfg.index_interval_bytes)?),
                    };
                    match fate {
                        Fate::Keep => {
                            records_out += h.records_count.max(0) as u64;
                            w.push(&fh, &buf[range.start - FRAME_HEADER_BYTES..range.end])?;
                        }
                        Fate::Drop => {}
                        Fate::Rewrite(new) => {
                            records_out += BatchHeader::parse(&new).map_or(0, |n| n.records_count.max(0) as u64);
                            frame.clear();
                            let nfh = segment::encode_frame(&mut frame, fh.seq, &fh.topic_id, fh.partition, fh.base_offset, segment::Patch::default(), &new);
                            w.push(&nfh, &frame)?;
                        }
                    }
                }
                // Each tp's share keeps the offset range of what it replaces.
                for (tp, share) in &s.store.tps {
                    let e = pending.entry(*tp).or_insert((share.first_offset, share.last_offset));
                    *e = (e.0.min(share.first_offset), e.1.max(share.last_offset));
                }
                if let Some(w) = writers[n].as_mut() {
                    pending.retain(|tp, (first, last)| !w.cover(tp, *first, *last));
                }
            }
            debug_assert!(pending.is_empty(), "every tp's last batch has an output");
            let mut out = Vec::new();
            for (n, w) in writers.into_iter().enumerate() {
                if let Some(w) = w {
                    let bytes = w.bytes();
                    let (path, file) = w.finish()?;
                    out.push((n, path, file, bytes));
                }
            }
            Ok(out)
        })();
        let written = match written {
            Ok(w) => w,
            Err(e) => {
                for n in 0..inputs.len() {
                    let _ = disk.remove_file(&tmp(n));
                }
                return Err(e);
            }
        };
        stop(Step::Written)?;

        // 3. Durable under their final names (still unlisted), then the
        // switch.
        let mut finals = Vec::with_capacity(written.len());
        for (n, path, file, bytes) in &written {
            let to = self.stores_dir.join(store::file_name(window, *n as u32));
            store::sync_and_rename(disk, file, path, &to)?;
            finals.push((*n, to, *bytes));
        }
        sync_dir(disk, &self.stores_dir)?;
        stop(Step::Synced)?;
        let hex: String = topic.iter().map(|b| format!("{b:02x}")).collect();
        let record = WindowRecord {
            window,
            created_ms: now_ms,
            split: "clean".into(),
            threshold: 0,
            compacted_to: Vec::new(),
            stores: finals.iter().map(|(n, _, bytes)| StoreRecord { store: *n as u32, label: format!("cleaned {hex}"), topics: Vec::new(), bytes: *bytes, live: true }).collect(),
            cleaned: inputs.iter().map(|s| (s.store.window, s.store.store)).collect(),
            horizon_ms: horizon,
        };
        let mut opened = Vec::with_capacity(finals.len());
        for (_, to, _) in &finals {
            let mut file = StoreFile::new(Store::open(disk, to)?, &self.files, |tp| parts.get(tp).map(|p| branch_name(&p.branch)));
            file.clean = Some(horizon);
            opened.push(Arc::new(file));
        }
        let bytes_out: u64 = finals.iter().map(|f| f.2).sum();
        maintenance.next_window = window + 1;
        if let Err(e) = persist(&record) {
            return Err(self.poison(StorageError::Catalog(format!("recording cleaning window {window}: {e}"))));
        }
        stop(Step::Switched)?;
        let replaced: Vec<Arc<StoreFile>> = inputs.to_vec();
        if let Err(e) = apply(Switch(Change::Cleaned { opened, replaced: replaced.clone() })) {
            return Err(self.poison(StorageError::Poisoned(format!("switching readers to cleaning window {window}: {e}"))));
        }
        let bytes_in: u64 = replaced.iter().map(|s| s.store.file_len).sum();
        for s in &replaced {
            s.file.retire();
            disk.remove_file(&s.store.path).map_err(io_err(&s.store.path))?;
        }
        sync_dir(disk, &self.stores_dir)?;
        let stats = &self.compaction_stats;
        stats.cleanings.fetch_add(1, Ordering::Relaxed);
        stats.bytes_cleaned.fetch_add(bytes_in, Ordering::Relaxed);
        stats.bytes_cleaned_out.fetch_add(bytes_out, Ordering::Relaxed);
        tracing::info!(window, stores = replaced.len(), bytes_in, bytes_out, records_in, records_out, ratio = due.ratio, "cleaned a keyed topic");
        stop(Step::Deleted)?;
        Ok(Some(Cleaned { window: record, topic, stores_in: replaced.len(), bytes_in, bytes_out, records_in, records_out }))
    }

    /// A cursor over every frame of one store.
    fn store_frames(&self, s: &Arc<StoreFile>) -> Frames<'_> {
        Frames::chain(self, vec![(s.clone() as Arc<dyn FrameFile>, FILE_HEADER_BYTES)], super::compact::COMPACT_CHUNK)
    }

    /// The keyed topics due for cleaning, dirtiest first.
    fn due_for_cleaning(&self, now_ms: i64, policy: &impl Fn(&TopicId) -> Option<CleanPolicy>) -> Vec<Due> {
        let stores: Vec<Arc<StoreFile>> = self.stores.read().expect("stores lock").clone();
        // Each keyed topic's stores, with where its frames start in the
        // stream: its frames are in one branch, so that is offset order.
        type Stores = Vec<(u64, Arc<StoreFile>)>;
        let mut by_topic: std::collections::BTreeMap<TopicId, (CleanPolicy, Stores)> = Default::default();
        let mut unkeyed: HashSet<TopicId> = HashSet::default();
        for s in &stores {
            for (tp, share) in &s.store.tps {
                if unkeyed.contains(&tp.topic) {
                    continue;
                }
                let e = match by_topic.entry(tp.topic) {
                    std::collections::btree_map::Entry::Occupied(e) => e.into_mut(),
                    std::collections::btree_map::Entry::Vacant(v) => match policy(&tp.topic) {
                        Some(p) => v.insert((p, Vec::new())),
                        None => {
                            unkeyed.insert(tp.topic);
                            continue;
                        }
                    },
                };
                let seq = share.entries[0].seq;
                match e.1.iter_mut().find(|(_, x)| Arc::ptr_eq(x, s)) {
                    Some(x) => x.0 = x.0.min(seq),
                    None => e.1.push((seq, s.clone())),
                }
            }
        }
        let mut due = Vec::new();
        for (topic, (policy, mut list)) in by_topic {
            list.sort_by_key(|x| x.0);
            let own = |s: &StoreFile| s.store.tps.keys().all(|tp| tp.topic == topic);
            let from = list.iter().rposition(|(_, s)| !own(s)).map_or(0, |i| i + 1);
            let run: Vec<Arc<StoreFile>> = list[from..].iter().map(|(_, s)| s.clone()).collect();
            if run.is_empty() {
                continue;
            }
            let bytes = |s: &StoreFile| s.store.tps.values().map(|t| t.bytes).sum::<u64>();
            let newest = |s: &StoreFile| s.store.tps.values().map(|t| t.max_ts).max().unwrap_or(i64::MIN);
            let dirty_from = run.iter().take_while(|s| s.clean.is_some()).count();
            let ripe = run[dirty_from..].iter().take_while(|s| newest(s) <= now_ms.saturating_sub(policy.min_compaction_lag_ms)).count();
            let take = &run[..dirty_from + ripe];
            let dirty: u64 = take[dirty_from..].iter().map(|s| bytes(s)).sum();
            let total: u64 = take.iter().map(|s| bytes(s)).sum();
            let ratio = if total == 0 { 0.0 } else { dirty as f64 / total as f64 };
            let overdue = ripe > 0 && now_ms.saturating_sub(newest(&take[dirty_from])) > policy.max_compaction_lag_ms;
            let tombstones_due = run[..dirty_from].iter().any(|s| s.clean.flatten().is_some_and(|h| h <= now_ms));
            if (ripe > 0 && (ratio > policy.min_cleanable_dirty_ratio || overdue)) || tombstones_due {
                due.push(Due { topic, policy, stores: take.to_vec(), clean: dirty_from, ratio });
            }
        }
        due.sort_by(|a, b| b.ratio.total_cmp(&a.ratio));
        due
    }
}

/// What cleaning does with a transaction marker, as Kafka's cleaner: once
/// no data of its committed transaction is left (`emptied`: its batches
/// were seen in this pass and none kept) it gets a delete horizon, and the
/// first cleaning after the horizon removes it; a partition's last batch
/// stays, and so do abort markers.
fn marker_fate(batch: &[u8], h: &BatchHeader, emptied: bool, last: bool, now_ms: i64, delete_retention_ms: i64, horizon: &mut Option<i64>) -> Result<Fate, String> {
    let mut note = |at: i64| *horizon = Some(horizon.map_or(at, |h| h.min(at)));
    Ok(match h.delete_horizon() {
        Some(at) if now_ms >= at && !last => Fate::Drop,
        // Kept as the partition's last batch: nothing to wait for.
        Some(at) if now_ms >= at => Fate::Keep,
        Some(at) => {
            note(at);
            Fate::Keep
        }
        // Abort markers stay: the aborted-transaction list still names
        // their transactions, and a read_committed consumer waits for the
        // marker to end one.
        None if emptied && kb::marker_of(batch, h) == Some(Marker::Commit) => {
            let at = now_ms.saturating_add(delete_retention_ms);
            note(at);
            let records = kb::records_of(batch, h, INFLATE_LIMIT).map_err(|e| e.to_string())?;
            let views = kb::records_view(&records, h.records_count).collect::<Result<Vec<_>, _>>().map_err(|e| e.to_string())?;
            Fate::Rewrite(kb::rebuilt(batch, &views, h.compression(), Some(at)))
        }
        None => Fate::Keep,
    })
}

/// What cleaning does with one batch of a partition; `horizon` collects
/// the earliest delete horizon of batches that keep tombstones.
#[allow(clippy::too_many_arguments)]
fn fate(map: &OffsetMap, partition: i32, batch: &[u8], h: &BatchHeader, now_ms: i64, delete_retention_ms: i64, horizon: &mut Option<i64>) -> Result<Fate, String> {
    let key = (partition, h.base_offset);
    if map.undecided.contains(&key) {
        return Ok(Fate::Keep);
    }
    if h.is_transactional() && map.aborted.contains(&key) {
        return Ok(Fate::Drop);
    }
    let records = kb::records_of(batch, h, INFLATE_LIMIT).map_err(|e| e.to_string())?;
    let latest = map.latest.get(&partition);
    let passed = h.delete_horizon().is_some_and(|at| now_ms >= at) && !map.unstable.contains(&partition);
    let mut kept: Vec<RecordView<'_>> = Vec::with_capacity(h.records_count.max(0) as usize);
    let mut tombstones = false;
    for r in kb::records_view(&records, h.records_count) {
        let r = r.map_err(|e| e.to_string())?;
        let offset = h.base_offset + r.offset_delta;
        let latest_here = r.key.is_none_or(|k| latest.and_then(|l| l.get(k)).is_none_or(|&o| o == offset));
        if !latest_here || (r.tombstone && passed) {
            continue;
        }
        tombstones |= r.tombstone;
        kept.push(r);
    }
    let new_horizon = (tombstones && h.delete_horizon().is_none()).then(|| now_ms.saturating_add(delete_retention_ms));
    if let Some(at) = new_horizon.or(h.delete_horizon().filter(|_| tombstones)) {
        // A horizon passed in an unstable partition waits for the
        // transaction's marker, which is dirty data of its own.
        if at > now_ms || !map.unstable.contains(&partition) {
            *horizon = Some(horizon.map_or(at, |h| h.min(at)));
        }
    }
    Ok(if kept.is_empty() {
        Fate::Drop
    } else if kept.len() == h.records_count as usize && new_horizon.is_none() {
        Fate::Keep
    } else {
        Fate::Rewrite(kb::rebuilt(batch, &kept, h.compression(), new_horizon))
    })
}

#[cfg(test)]
mod tests {
    use super::super::compact::TopicView;
    use super::super::stream::tests::{open_with, tp};
    use super::*;
    use crate::protocol::batch::NewRecord;
    use crate::protocol::compression::{self, Compression};
    use crate::storage::subtree::split::{Budget, Strategy};
    use proptest::prelude::{prop_assert, prop_assert_eq, prop_oneof, proptest, Just, ProptestConfig, Strategy as _, TestCaseError};
    use std::cell::RefCell;
    use std::collections::BTreeMap;

    /// Keyed: the first topic of branch 0 and the second of branch 1.
    fn keyed(id: &TopicId) -> bool {
        id[0] == 0 || id[0] == 11
    }

    fn view(id: &TopicId) -> Option<TopicView> {
        Some(TopicView { name: format!("{}.{}", ["a.x.p", "a.y.p", "b.z.p"][(id[0] / 10) as usize], id[0] % 10), keyed: keyed(id) })
    }

    const TOPICS: [(usize, u8); 6] = [(0, 0), (0, 1), (1, 0), (1, 1), (2, 0), (2, 1)];

    #[derive(Debug, Clone)]
    enum Op {
        /// Records (key, tombstone) to a topic, with a codec (0 none, 1
        /// gzip, 2 zstd) and a transaction (0 none, 1 committed, 2 aborted,
        /// 3 left open, 4 committed and 5 aborted with the marker after the
        /// next append to the topic).
        Append { topic: usize, records: Vec<(u8, bool)>, codec: u8, txn: u8 },
        Compact(Strategy),
        Clean { map_bytes: u64, advance: i64 },
        Restart,
        /// A cleaning stopped at `Step::ALL[step]`, then a restart.
        Crash { step: usize },
    }

    fn op() -> impl proptest::strategy::Strategy<Value = Op> {
        prop_oneof![
            8 => (0usize..6, proptest::collection::vec((0u8..12, proptest::bool::weighted(0.15)), 1..6), 0u8..3, prop_oneof![6 => Just(0u8), 1 => Just(1u8), 1 => Just(2u8), 1 => Just(3u8), 1 => Just(4u8), 1 => Just(5u8)])
                .prop_map(|(topic, records, codec, txn)| Op::Append { topic, records, codec, txn }),
            2 => prop_oneof![
                Just(Strategy::Adaptive(Budget { max_stores: Some(1), min_store_bytes: 0 })),
                Just(Strategy::Adaptive(Budget { max_stores: Some(1000), min_store_bytes: 0 })),
                Just(Strategy::Prefix3),
            ].prop_map(Op::Compact),
            3 => (prop_oneof![Just(0u64), Just(200u64), Just(u64::MAX)], 0i64..40).prop_map(|(map_bytes, advance)| Op::Clean { map_bytes, advance }),
            1 => Just(Op::Restart),
            1 => (0usize..Step::ALL.len()).prop_map(|step| Op::Crash { step }),
        ]
    }

    /// One record as appended.
    #[derive(Debug, Clone)]
    struct Rec {
        key: u8,
        tombstone: bool,
        /// 0 none, 1 committed, 2 aborted, 3 open.
        txn: u8,
        /// Offset of the transaction's marker.
        marker: Option<i64>,
    }

    struct World {
        dir: tempfile::TempDir,
        log: Option<(Arc<Storage>, LogWriter)>,
        catalog: RefCell<Vec<WindowRecord>>,
        /// Keyed tps: offset → record.
        model: BTreeMap<Tp, BTreeMap<i64, Rec>>,
        /// Other tps: (base offset, batch) as appended.
        rows: BTreeMap<Tp, Vec<(i64, Vec<u8>)>>,
        /// Keyed tps: each decided transaction's marker and data offsets.
        markers: BTreeMap<Tp, Vec<(i64, std::ops::Range<i64>)>>,
        /// Per topic: a transaction whose marker comes after the next
        /// append (producer, commit, data offsets).
        deferred: BTreeMap<usize, (i64, bool, std::ops::Range<i64>)>,
        now: i64,
        next_pid: i64,
        delete_retention_ms: i64,
        /// `compact,delete`: a store per input store.
        delete: bool,
    }

    impl World {
        fn storage(&self) -> &Arc<Storage> {
            &self.log.as_ref().unwrap().0
        }

        fn restart(&mut self) {
            self.log = None;
            self.log = Some(open_with(self.dir.path(), 0, Some(&self.catalog.borrow())).unwrap());
        }

        fn append(&mut self, topic: usize, records: &[(u8, bool)], codec: u8, txn: u8, at: usize) {
            let (b, t) = TOPICS[topic];
            let tp = tp(b, t);
            let values: Vec<Vec<u8>> = (0..records.len()).map(|i| format!("v{at}-{i}-{:>900}", "").into_bytes()).collect();
            let keys: Vec<[u8; 1]> = records.iter().map(|r| [r.0]).collect();
            let new: Vec<NewRecord<'_>> = records
                .iter()
                .enumerate()
                .map(|(i, r)| NewRecord { key: Some(&keys[i][..]), value: (!r.1).then_some(&values[i][..]), headers: Vec::new() })
                .collect();
            let mut batch = kb::build(&new, self.now);
            let codec = [Compression::None, Compression::Gzip, Compression::Zstd][codec as usize];
            if codec != Compression::None {
                batch = kb::with_records(&batch, &compression::compress(codec, &batch[kb::HEADER_BYTES..]), codec);
            }
            // Decided transactions share one producer per topic (so a
            // transaction's data can be left with none of it, and its
            // marker go); a transaction left open has a producer of its own.
            let late = matches!(txn, 4 | 5);
            let pid = if txn == 3 || late { self.next_pid } else { 1000 + topic as i64 };
            if txn != 0 {
                self.next_pid += 1;
                kb::set_transactional(&mut batch, pid, 0, 0);
            }
            let now = self.now;
            let w = &mut self.log.as_mut().unwrap().1;
            let a = w.append(tp, &batch, now, false).unwrap();
            let marker = match txn {
                1 | 2 => {
                    let mut m = kb::control_batch(if txn == 1 { Marker::Commit } else { Marker::Abort }, pid, 0, 0, now);
                    let at = w.append(tp, &m, now, false).unwrap().base_offset;
                    kb::set_base_offset(&mut m, at);
                    Some((at, m))
                }
                _ => None,
            };
            // An earlier transaction's marker, after this batch.
            let earlier = self.deferred.remove(&topic).map(|(pid, commit, data)| {
                let mut m = kb::control_batch(if commit { Marker::Commit } else { Marker::Abort }, pid, 0, 0, now);
                let at = w.append(tp, &m, now, false).unwrap().base_offset;
                kb::set_base_offset(&mut m, at);
                (at, m, data)
            });
            let f = w.flush().unwrap();
            w.storage().sync().unwrap();
            w.storage().publish_hw(&f);
            if late {
                self.deferred.insert(topic, (pid, txn == 4, a.base_offset..a.base_offset + records.len() as i64));
            }
            let txn = match txn {
                4 => 1,
                5 => 2,
                t => t,
            };
            if keyed(&tp.topic) {
                if let Some((at, _, data)) = &earlier {
                    self.markers.entry(tp).or_default().push((*at, data.clone()));
                    for o in data.clone() {
                        self.model.get_mut(&tp).unwrap().get_mut(&o).unwrap().marker = Some(*at);
                    }
                }
                if let Some((at, _)) = &marker {
                    self.markers.entry(tp).or_default().push((*at, a.base_offset..a.base_offset + records.len() as i64));
                }
                let m = self.model.entry(tp).or_default();
                for (i, r) in records.iter().enumerate() {
                    m.insert(a.base_offset + i as i64, Rec { key: r.0, tombstone: r.1, txn, marker: marker.as_ref().map(|m| m.0) });
                }
            } else {
                kb::set_base_offset(&mut batch, a.base_offset);
                let rows = self.rows.entry(tp).or_default();
                rows.push((a.base_offset, batch));
                rows.extend(marker);
                rows.extend(earlier.map(|(at, m, _)| (at, m)));
            }
        }

        fn compact(&mut self, strategy: Strategy) {
            let (s, w) = self.log.as_mut().unwrap();
            let s = s.clone();
            let cfg = CompactConfig { lag_ms: 0, strategy, max_bytes: u64::MAX };
            let catalog = &self.catalog;
            s.compact(self.now + 1, &cfg, view, &mut |_| true, |r| {
                catalog.borrow_mut().push(r.clone());
                Ok(())
            }, &mut |sw| w.apply(sw)).unwrap();
        }

        fn clean(&mut self, map_bytes: u64, stop_at: Option<Step>) -> Result<Option<Cleaned>, StorageError> {
            let (s, w) = self.log.as_mut().unwrap();
            let s = s.clone();
            let dr = self.delete_retention_ms;
            let delete = self.delete;
            let policy = |id: &TopicId| keyed(id).then_some(CleanPolicy { delete_retention_ms: dr, min_compaction_lag_ms: 0, max_compaction_lag_ms: i64::MAX, min_cleanable_dirty_ratio: 0.0, delete });
            let catalog = &self.catalog;
            s.clean_until(self.now, &CleanConfig { map_bytes }, policy, &mut |_| true, |r| {
                catalog.borrow_mut().push(r.clone());
                Ok(())
            }, &mut |sw| w.apply(sw), &mut |step| Some(step) == stop_at)
        }

        /// Reads a keyed tp from its start: (offset, key, tombstone).
        #[allow(clippy::type_complexity)]
        fn read_keyed(&self, tp: &Tp) -> Result<Vec<(i64, Option<Vec<u8>>, bool)>, TestCaseError> {
            let mut out = Vec::new();
            let mut offset = 0;
            loop {
                let r = self.storage().read(tp, offset, 1000, true).unwrap();
                if r.records.is_empty() {
                    break;
                }
                for b in &r.records {
                    let h = BatchHeader::parse(b).unwrap();
                    prop_assert_eq!(h.size, b.len());
                    prop_assert_eq!(u32::from_be_bytes(b[17..21].try_into().unwrap()), crc32c::crc32c(&b[21..]), "batch CRC at {}", h.base_offset);
                    if h.is_control() {
                        continue;
                    }
                    let records = kb::records_of(b, &h, 1 << 20).unwrap();
                    let mut prev = -1;
                    for rec in kb::records_view(&records, h.records_count) {
                        let rec = rec.unwrap();
                        prop_assert!(rec.offset_delta > prev && rec.offset_delta <= h.last_offset_delta as i64);
                        prev = rec.offset_delta;
                        out.push((h.base_offset + rec.offset_delta, rec.key.map(|k| k.to_vec()), rec.tombstone));
                    }
                }
                offset = r.next_offset;
            }
            Ok(out)
        }

        /// Base offsets of `tp`'s control batches.
        fn control_offsets(&self, tp: &Tp) -> std::collections::BTreeSet<i64> {
            let mut out = std::collections::BTreeSet::new();
            let mut offset = 0;
            loop {
                let r = self.storage().read(tp, offset, 1 << 20, true).unwrap();
                if r.records.is_empty() {
                    return out;
                }
                for b in &r.records {
                    let h = BatchHeader::parse(b).unwrap();
                    if h.is_control() {
                        out.insert(h.base_offset);
                    }
                }
                offset = r.next_offset;
            }
        }

        /// Offsets of `tp` below which batches are in stores.
        fn stored_end(&self, tp: &Tp) -> i64 {
            let part = self.storage().parts.read().unwrap().get(tp).cloned().unwrap();
            let st = part.st.read().unwrap();
            st.stored.iter().filter_map(|s| s.store.tps.get(tp)).map(|t| t.last_offset + 1).max().unwrap_or(0)
        }

        /// What holds at any time; with `clean`, every store is cleaned
        /// and every delete horizon passed: the stores hold exactly the
        /// latest record of each key.
        fn check(&self, clean: bool) -> Result<(), TestCaseError> {
            for (tp, rows) in &self.rows {
                let mut got = Vec::new();
                let mut offset = 0;
                loop {
                    let r = self.storage().read(tp, offset, 1 << 20, true).unwrap();
                    if r.records.is_empty() {
                        break;
                    }
                    got.extend(r.records.iter().map(|b| (BatchHeader::parse(b).unwrap().base_offset, b.to_vec())));
                    offset = r.next_offset;
                }
                prop_assert!(&got == rows, "unkeyed tp {:?} changed", tp);
            }
            for (tp, model) in &self.model {
                let got = self.read_keyed(tp)?;
                let end = model.keys().next_back().map_or(0, |o| o + 1);
                let (start, hw, _) = self.storage().offsets(tp).unwrap();
                prop_assert_eq!(start, 0, "log start of {:?}", tp);
                prop_assert!(hw >= end, "high watermark of {:?}", tp);
                // Nothing invented, offsets kept, in order.
                let mut last = -1;
                for (o, key, tombstone) in &got {
                    prop_assert!(*o > last);
                    last = *o;
                    let m = model.get(o);
                    prop_assert!(m.is_some_and(|m| Some(vec![m.key]) == *key && m.tombstone == *tombstone), "{:?} at {}: {:?} {}", tp, o, key, tombstone);
                }
                // The latest decided record of every key is there (a value
                // always; a tombstone until its horizon).
                let present: std::collections::BTreeSet<i64> = got.iter().map(|g| g.0).collect();
                let stored_end = self.stored_end(tp);
                let decided = |r: &Rec, below: i64| r.txn == 0 || (r.marker.is_some_and(|m| m < below));
                let mut latest: BTreeMap<u8, (i64, &Rec)> = BTreeMap::new();
                for (o, r) in model {
                    if decided(r, i64::MAX) && r.txn != 2 {
                        latest.insert(r.key, (*o, r));
                    }
                }
                for (o, r) in latest.values() {
                    prop_assert!(r.tombstone || present.contains(o), "{:?}: latest of key {} at {} missing", tp, r.key, o);
                }
                if clean {
                    // In stores: exactly the latest decided value per key
                    // (among what is stored), and what is undecided there.
                    let mut want = std::collections::BTreeSet::new();
                    let mut latest_in: BTreeMap<u8, (i64, &Rec)> = BTreeMap::new();
                    // Tombstones stay while a transaction there is undecided.
                    let unstable = model.range(..stored_end).any(|(_, r)| !decided(r, stored_end));
                    for (o, r) in model.range(..stored_end) {
                        if !decided(r, stored_end) {
                            want.insert(*o);
                        } else if r.txn != 2 {
                            latest_in.insert(r.key, (*o, r));
                        }
                    }
                    want.extend(latest_in.values().filter(|(_, r)| !r.tombstone).map(|(o, _)| *o));
                    // A tombstone removed before the partition had an
                    // undecided transaction stays removed; one that was
                    // kept meanwhile may still be there.
                    let tombstones: std::collections::BTreeSet<i64> = latest_in.values().filter(|(_, r)| unstable && r.tombstone).map(|(o, _)| *o).collect();
                    let mut have: std::collections::BTreeSet<i64> = present.range(..stored_end).copied().collect();
                    have.retain(|o| !tombstones.contains(o));
                    // A transaction with data left keeps its marker.
                    let controls = self.control_offsets(tp);
                    for (m, data) in self.markers.get(tp).into_iter().flatten() {
                        if *m < stored_end && data.clone().any(|o| want.contains(&o)) {
                            prop_assert!(controls.contains(m), "{:?}: the marker at {} of a transaction with data left is gone", tp, m);
                        }
                    }
                    prop_assert_eq!(have, want, "{:?} stored below {}", tp, stored_end);
                }
            }
            // Files: exactly the live stores.
            let listed: std::collections::BTreeSet<String> = WindowRecord::live_stores(&self.catalog.borrow()).into_iter().map(|(w, s)| store::file_name(w, s)).collect();
            let found: std::collections::BTreeSet<String> = std::fs::read_dir(self.dir.path().join("stores")).map(|rd| rd.map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect()).unwrap_or_default();
            prop_assert_eq!(found, listed);
            prop_assert_eq!(self.storage().store_count(), WindowRecord::live_stores(&self.catalog.borrow()).len());
            Ok(())
        }
    }

    /// A transaction whose data a later record supersedes loses its marker
    /// once the marker's delete horizon has passed; the producer's next
    /// transaction (whose batch is the producer's last) keeps its own.
    #[test]
    fn a_marker_goes_once_its_transaction_has_no_data_left() {
        let dir = tempfile::tempdir().unwrap();
        let log = Some(open_with(dir.path(), 0, Some(&[])).unwrap());
        let mut world = World { dir, log, catalog: RefCell::new(Vec::new()), model: BTreeMap::new(), rows: BTreeMap::new(), markers: BTreeMap::new(), deferred: BTreeMap::new(), now: 0, next_pid: 1, delete_retention_ms: 10, delete: false };
        world.append(0, &[(1, false)], 0, 1, 0);
        world.append(0, &[(1, false)], 0, 0, 1);
        world.append(0, &[(2, false)], 0, 1, 2);
        // The unkeyed sibling rolls the branch's segments.
        for i in 0..12 {
            world.append(1, &[(0, false), (0, false)], 0, 0, 3 + i);
        }
        world.compact(Strategy::Prefix3);
        let keyed = tp(0, 0);
        let markers: Vec<i64> = world.markers[&keyed].iter().map(|m| m.0).collect();
        assert_eq!(world.control_offsets(&keyed).into_iter().collect::<Vec<_>>(), markers);
        world.now += 1;
        assert!(world.clean(u64::MAX, None).unwrap().is_some());
        // The horizon is set, not yet passed: both markers stay.
        assert_eq!(world.control_offsets(&keyed).into_iter().collect::<Vec<_>>(), markers);
        world.now += 11;
        assert!(world.clean(u64::MAX, None).unwrap().is_some(), "due: a marker's horizon passed");
        assert_eq!(world.control_offsets(&keyed).into_iter().collect::<Vec<_>>(), markers[1..]);
        world.check(true).unwrap();
        world.restart();
        assert_eq!(world.control_offsets(&keyed).into_iter().collect::<Vec<_>>(), markers[1..]);
        assert!(world.clean(u64::MAX, None).unwrap().is_none());
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 64, max_shrink_iters: 200, ..ProptestConfig::default() })]
        /// Random keyed and unkeyed appends (tombstones, codecs, committed,
        /// aborted and open transactions), windows under random plans,
        /// cleanings with random map budgets, restarts and cleanings
        /// killed at every step, against a reference model: offsets are
        /// kept, nothing is invented, the latest record of each key
        /// survives, unkeyed topics are untouched, no file leaks; and once
        /// everything is cleaned past every horizon, the stores hold
        /// exactly the latest value of each key.
        #[test]
        fn cleaning_keeps_the_latest_record_per_key(ops in proptest::collection::vec(op(), 1..80), delete_retention_ms in 0i64..30, delete in proptest::bool::ANY) {
            let dir = tempfile::tempdir().unwrap();
            let log = Some(open_with(dir.path(), 0, Some(&[])).unwrap());
            let mut world = World { dir, log, catalog: RefCell::new(Vec::new()), model: BTreeMap::new(), rows: BTreeMap::new(), markers: BTreeMap::new(), deferred: BTreeMap::new(), now: 0, next_pid: 1, delete_retention_ms, delete };
            for (i, op) in ops.iter().enumerate() {
                world.now += 1;
                match op {
                    Op::Append { topic, records, codec, txn } => world.append(*topic, records, *codec, *txn, i),
                    Op::Compact(strategy) => world.compact(*strategy),
                    Op::Clean { map_bytes, advance } => {
                        world.now += advance;
                        // Until nothing is due: each run makes progress,
                        // whatever the map's budget.
                        let mut runs = 0;
                        while world.clean(*map_bytes, None).unwrap().is_some() {
                            runs += 1;
                            prop_assert!(runs < 100, "cleaning makes no progress");
                            world.check(false)?;
                        }
                    }
                    Op::Restart => world.restart(),
                    Op::Crash { step } => {
                        let r = world.clean(u64::MAX, Some(Step::ALL[*step]));
                        prop_assert!(matches!(r, Ok(None) | Err(StorageError::Stopped(_))), "{:?}", r.map(|c| c.map(|c| c.window.window)));
                        world.restart();
                    }
                }
                world.check(false)?;
            }
            // Everything into stores, cleaned until nothing is due, past
            // every horizon.
            world.compact(Strategy::Prefix3);
            for _ in 0..4 {
                world.now += delete_retention_ms + 1;
                let mut runs = 0;
                while world.clean(u64::MAX, None).unwrap().is_some() {
                    runs += 1;
                    prop_assert!(runs < 10, "a topic stays due for cleaning");
                }
            }
            world.check(true)?;
            world.restart();
            world.check(true)?;

        }
    }
}
