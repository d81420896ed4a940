//! The page-cache window: how much of what the segments hold stays in the
//! kernel's page cache (see
//! [`crate::storage::StorageConfig::page_cache_bytes`] for why).
//!
//! Once a segment's pages are synced (so clean) they join the window,
//! oldest first: the syncer after its fsyncs, the writer when it seals a
//! segment. Past the window's size the syncer tells the kernel it may drop
//! the oldest (`posix_fadvise(DONTNEED)` through
//! [`crate::storage::disk::DiskFile::drop_cache`]),
//! outside any lock, on files already open (nothing is opened for a hint).
//! A reader that reads pages from below the window drops them after the
//! read. The window holds segments weakly: one retention or compaction
//! deletes is not kept open by it. A segment opened at a start counts as
//! older than anything the window holds.

use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};

use super::{Segment, Storage};
use crate::storage::disk::FileRef;

/// The page size the page cache drops whole.
pub(super) const PAGE_BYTES: u64 = 4096;

/// `pos` rounded down to a page.
pub(super) fn page_floor(pos: u64) -> u64 {
    pos & !(PAGE_BYTES - 1)
}

/// Synced page ranges `(segment, from, to)` left in the page cache, oldest
/// first, and their total. Weak: a segment retention or compaction
/// deletes is not kept alive (its file open, its disk space taken) by the
/// window; its ranges count until they come out.
#[derive(Default)]
pub(super) struct CacheWindow {
    ranges: VecDeque<(Weak<Segment>, u64, u64)>,
    bytes: u64,
}

impl Storage {
    fn windowed(&self) -> bool {
        self.cfg.page_cache_bytes != u64::MAX
    }

    /// `seg`'s whole pages below `synced` are durable (so clean): they
    /// join the window, to be dropped when it passes them
    /// ([`Storage::trim_cache_window`]). The partial last page stays out:
    /// it will be written again.
    pub(super) fn note_synced(&self, seg: &Arc<Segment>, synced: u64) {
        if !self.windowed() {
            return;
        }
        let to = page_floor(synced);
        // The writer (at a seal) and the syncer may both get here: under
        // the lock, so one segment's ranges enter in order.
        let mut w = self.cached.lock().expect("page cache window lock");
        let from = seg.cache_noted.fetch_max(to, Ordering::AcqRel);
        if to > from {
            w.ranges.push_back((Arc::downgrade(seg), from, to));
            w.bytes += to - from;
        }
    }

    /// The page-cache window: synced bytes it holds now, and bytes the
    /// page cache was told it may drop so far (written and read).
    pub fn page_cache_window(&self) -> (u64, u64) {
        (self.cached.lock().expect("page cache window lock").bytes, self.cache_dropped_bytes.load(Ordering::Relaxed))
    }

    /// Drops the oldest synced pages beyond the window's size (the
    /// syncer's work: an fadvise per range, none under the lock). A
    /// segment deleted since, or whose file the descriptor cache closed,
    /// is skipped: its pages went with it, or are left to the kernel
    /// (it is a hint; nothing is opened for it).
    pub(super) fn trim_cache_window(&self) {
        if !self.windowed() {
            return;
        }
        let mut out = Vec::new();
        {
            let mut w = self.cached.lock().expect("page cache window lock");
            while w.bytes > self.cfg.page_cache_bytes {
                let Some(r) = w.ranges.pop_front() else { break };
                w.bytes -= r.2 - r.1;
                out.push(r);
            }
        }
        for (seg, from, to) in out {
            let Some(seg) = seg.upgrade() else { continue };
            seg.cache_dropped.fetch_max(to, Ordering::AcqRel);
            if let Some(f) = seg.file.if_open() {
                self.drop_pages(&f, from, to);
            }
        }
    }

    /// `[start, end)` of `file` was just read into a buffer of ours: its
    /// whole pages below `read_once_below` (older than the window) need not
    /// stay cached.
    pub(super) fn read_once(&self, file: &FileRef, start: u64, end: u64, read_once_below: u64) {
        if !self.windowed() {
            return;
        }
        let from = page_floor(start + PAGE_BYTES - 1);
        let to = page_floor(end.min(read_once_below));
        if to > from {
            self.drop_pages(file, from, to);
        }
    }

    fn drop_pages(&self, file: &FileRef, from: u64, to: u64) {
        file.drop_cache(from, to - from);
        self.cache_dropped_bytes.fetch_add(to - from, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{offsets_of, spec, tp};
    use super::*;
    use crate::protocol::batch::tests::make_batch;
    use crate::storage::segment::{FILE_HEADER_BYTES, FRAME_HEADER_BYTES};
    use crate::storage::{RetentionPolicy, StorageConfig, Tp};

    /// Synced pages beyond the window are dropped, oldest first, once
    /// each; so are pages read from below it; a window of `u64::MAX`
    /// drops nothing; and the data reads back whole either way.
    #[test]
    fn the_page_cache_window_drops_the_oldest_synced_pages() {
        for window in [16 << 10, u64::MAX] {
            let dir = tempfile::tempdir().unwrap();
            let cfg = StorageConfig { page_cache_bytes: window, tip: crate::storage::tip::TipConfig { bytes: 0, ..Default::default() }, ..StorageConfig::default() };
            let (s, mut w) = Storage::open(dir.path(), cfg, vec![spec(1, 0, "t")], true).unwrap();
            let value = vec![7u8; 1000];
            let mut written = 0;
            for round in 0..64 {
                let b = make_batch(&[&value], 0);
                w.append(tp(1, 0), &b, round, false).unwrap();
                written += (FRAME_HEADER_BYTES + b.len()) as u64;
                let moved = w.flush().unwrap();
                s.sync().unwrap();
                s.publish_hw(&moved);
            }
            let dropped = s.page_cache_window().1;
            if window == u64::MAX {
                assert_eq!(dropped, 0);
            } else {
                // All but the window and the partial last page, in pages.
                let synced = (FILE_HEADER_BYTES + written) & !(PAGE_BYTES - 1);
                let cached = synced - dropped;
                assert!(cached <= window && cached + PAGE_BYTES > window, "{cached} bytes left cached of {synced}");
                assert_eq!(dropped % PAGE_BYTES, 0);
            }
            // Reading it all back: pages below the window are read once.
            let r = s.read(&tp(1, 0), 0, 1 << 20, true).unwrap();
            assert_eq!(offsets_of(&r.concat()), (0..64).collect::<Vec<_>>());
            let after = s.page_cache_window().1;
            if window == u64::MAX {
                assert_eq!(after, 0);
            } else {
                assert!(after > dropped, "pages read from below the window are dropped too");
            }
        }
    }

    /// A segment retention deletes while the page-cache window still lists
    /// its pages is not kept alive by the window: its file is closed and
    /// its disk space given back.
    #[test]
    fn the_page_cache_window_keeps_no_deleted_segment_open() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = StorageConfig { segment_bytes: 8192, page_cache_bytes: 1 << 30, ..StorageConfig::default() };
        let (s, mut w) = Storage::open(dir.path(), cfg, vec![spec(1, 0, "t")], true).unwrap();
        let value = vec![7u8; 1000];
        for round in 0..40 {
            w.append(tp(1, 0), &make_batch(&[&value], 0), round, false).unwrap();
            let moved = w.flush().unwrap();
            s.sync().unwrap();
            s.publish_hw(&moved);
        }
        assert!(s.page_cache_window().0 > 8192, "the window lists the sealed segments' pages");
        let policy = |_: &Tp| RetentionPolicy { retention_ms: Some(1), retention_bytes: None };
        let (_, deleted) = s.enforce_retention(1_000_000, policy, |_| Ok(()), |_| Ok(()), &mut |sw| w.apply(sw)).unwrap();
        assert!(deleted > 2, "{deleted} segments deleted");
        let open_deleted = std::fs::read_dir("/proc/self/fd")
            .unwrap()
            .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
            .filter(|t| t.starts_with(dir.path()) && t.to_string_lossy().ends_with(" (deleted)"))
            .count();
        assert_eq!(open_deleted, 0, "deleted segment files still open");
    }
}
