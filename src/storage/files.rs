//! The descriptor cache: every segment and store file is opened through
//! it, and at most `max_open_files` of them stay open, the least recently
//! used closed first. A million branches need not hold a million
//! descriptors; a read of a file that was closed opens it again.
//!
//! # Who holds what
//!
//! A [`CachedFile`] names a file and owns its slot; [`CachedFile::get`]
//! hands out an `Arc<File>`, which keeps the descriptor open for as long
//! as the caller holds it even if the cache closes its own reference
//! meanwhile. So the descriptors open are the cache's (at most its
//! capacity) plus those in use: reads in progress, deleted files that
//! reads still hold, and the writer's files for the segments written since
//! the last sync (with a flush policy that syncs, the writer holds those
//! from the moment it stages a frame until the fsync, so neither writing
//! nor syncing needs to open a file, and running out of descriptors can
//! only fail an append before anything of it is staged; with `never`, the
//! rare sync at a seal or shutdown opens what it needs).
//!
//! Closing a file with unsynced writes is safe: `fsync` on Linux flushes
//! the file's dirty pages whichever descriptor wrote them.
//!
//! # Failures
//!
//! Running out of descriptors (EMFILE, ENFILE), memory or disk space while
//! opening or creating a file is [`is_exhaustion`]: the request that needed
//! the file fails with a retriable error and storage is not poisoned
//! (nothing was written).

use std::collections::BTreeMap;

use crate::storage::hashing::HashMap;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use super::disk::{Disk, FileRef, Mode};

/// Whether `e` says a resource ran out (descriptors, memory, disk space)
/// rather than that the file or the disk is bad.
pub fn is_exhaustion(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(code) if code == rustix::io::Errno::MFILE.raw_os_error()
        || code == rustix::io::Errno::NFILE.raw_os_error()
        || code == rustix::io::Errno::NOMEM.raw_os_error()
        || code == rustix::io::Errno::NOSPC.raw_os_error()
        || code == rustix::io::Errno::DQUOT.raw_os_error())
}

#[derive(Debug)]
pub struct FileCache {
    capacity: usize,
    disk: Arc<dyn Disk>,
    state: Mutex<State>,
    next_id: AtomicU64,
    /// Files opened again after the cache had closed them.
    pub reopens: AtomicU64,
    /// Files the cache closed to stay within its capacity.
    pub evictions: AtomicU64,
}

#[derive(Debug, Default)]
struct State {
    /// Open files by slot id, with when each was last used.
    open: HashMap<u64, (FileRef, u64)>,
    /// Slot ids by last use, oldest first.
    by_use: BTreeMap<u64, u64>,
    clock: u64,
}

impl FileCache {
    pub fn new(capacity: usize, disk: Arc<dyn Disk>) -> Arc<FileCache> {
        Arc::new(FileCache { capacity: capacity.max(1), disk, state: Mutex::default(), next_id: AtomicU64::new(0), reopens: AtomicU64::new(0), evictions: AtomicU64::new(0) })
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Files the cache holds open now.
    pub fn open_files(&self) -> usize {
        self.state.lock().expect("file cache lock").open.len()
    }

    /// A slot for `path`, not opened until used. `write`: opened for
    /// writing too (a segment).
    pub fn file(self: &Arc<Self>, path: PathBuf, write: bool) -> CachedFile {
        CachedFile { id: self.next_id.fetch_add(1, Ordering::Relaxed), path, write, cache: self.clone(), held: Mutex::default() }
    }

    /// A slot for `path` that starts with `file` already open (the caller
    /// may keep using it too).
    pub fn adopt(self: &Arc<Self>, path: PathBuf, write: bool, file: FileRef) -> CachedFile {
        let f = self.file(path, write);
        self.insert(f.id, file);
        f
    }

    fn insert(&self, id: u64, file: FileRef) -> FileRef {
        let mut s = self.state.lock().expect("file cache lock");
        s.clock += 1;
        let now = s.clock;
        let file = match s.open.get(&id) {
            // Another thread opened it meanwhile: keep one.
            Some((f, at)) => {
                let (f, at) = (f.clone(), *at);
                s.by_use.remove(&at);
                f
            }
            None => file,
        };
        s.open.insert(id, (file.clone(), now));
        s.by_use.insert(now, id);
        while s.open.len() > self.capacity {
            let Some((_, oldest)) = s.by_use.pop_first() else { break };
            s.open.remove(&oldest);
            self.evictions.fetch_add(1, Ordering::Relaxed);
        }
        file
    }

    fn lookup(&self, id: u64) -> Option<FileRef> {
        let mut s = self.state.lock().expect("file cache lock");
        s.clock += 1;
        let now = s.clock;
        let (f, at) = s.open.get_mut(&id)?;
        let (f, before) = (f.clone(), std::mem::replace(at, now));
        s.by_use.remove(&before);
        s.by_use.insert(now, id);
        Some(f)
    }

    /// The file if the cache has it open, leaving its place in the
    /// eviction order as it is.
    fn peek(&self, id: u64) -> Option<FileRef> {
        self.state.lock().expect("file cache lock").open.get(&id).map(|(f, _)| f.clone())
    }

    fn forget(&self, id: u64) {
        let mut s = self.state.lock().expect("file cache lock");
        if let Some((_, at)) = s.open.remove(&id) {
            s.by_use.remove(&at);
        }
    }
}

/// A file storage reads (and, for a segment, writes) through the cache.
#[derive(Debug)]
pub struct CachedFile {
    id: u64,
    path: PathBuf,
    write: bool,
    cache: Arc<FileCache>,
    held: Mutex<Held>,
}

/// What keeps a file open outside the cache, and whether it has writes
/// not yet synced: both change under one lock, so a sync that finds the
/// file unsynced finds it held.
#[derive(Debug, Default)]
struct Held {
    file: Option<FileRef>,
    /// Counts holds: a sync ends only the hold it saw.
    number: u64,
    unsynced: bool,
    /// Deleted: held for good, for readers that still have the slot.
    retired: bool,
}

impl CachedFile {
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The open file: the one held outside the cache, or the cache's,
    /// opening it again if the cache closed it.
    pub fn get(&self) -> io::Result<FileRef> {
        if let Some(f) = self.held.lock().expect("held file lock").file.clone() {
            return Ok(f);
        }
        if let Some(f) = self.cache.lookup(self.id) {
            return Ok(f);
        }
        let file = self.cache.disk.open(&self.path, if self.write { Mode::Write } else { Mode::Read })?;
        self.cache.reopens.fetch_add(1, Ordering::Relaxed);
        Ok(self.cache.insert(self.id, file))
    }

    /// The file if it is open now (held, or in the cache), without opening
    /// it or counting as a use; `None` once retired.
    pub fn if_open(&self) -> Option<FileRef> {
        {
            let h = self.held.lock().expect("held file lock");
            if h.retired {
                return None;
            }
            if let Some(f) = &h.file {
                return Some(f.clone());
            }
        }
        self.cache.peek(self.id)
    }
}

impl CachedFile {
    /// `file` was written: it is unsynced, and with `hold` it stays open
    /// until the sync that covers this write. Returns whether it was clean
    /// before (then the caller lists it for the next sync; a sync marks it
    /// clean before it starts, so a write during a sync lists it again).
    pub fn wrote(&self, file: &FileRef, hold: bool) -> bool {
        let mut h = self.held.lock().expect("held file lock");
        let was_clean = !std::mem::replace(&mut h.unsynced, true);
        if hold && !h.retired {
            h.number += 1;
            h.file = Some(file.clone());
        }
        was_clean
    }

    /// Whether the file was retired (is being deleted).
    pub fn retired(&self) -> bool {
        self.held.lock().expect("held file lock").retired
    }

    /// Whether writes are waiting for a sync.
    pub fn unsynced(&self) -> bool {
        self.held.lock().expect("held file lock").unsynced
    }

    /// For a sync: if there are unsynced writes, marks them synced and
    /// hands out the held file (if any) with its hold's number.
    pub fn to_sync(&self) -> Option<(Option<FileRef>, u64)> {
        let mut h = self.held.lock().expect("held file lock");
        if !std::mem::take(&mut h.unsynced) {
            return None;
        }
        Some((h.file.clone(), h.number))
    }

    /// The sync of hold `number` is done: the hold ends, unless the file
    /// was written again meanwhile (a newer hold) or is retired.
    pub fn synced(&self, number: u64) {
        let mut h = self.held.lock().expect("held file lock");
        if !h.unsynced && !h.retired && h.number == number {
            h.file = None;
        }
    }

    /// Written whole and synced by the writer itself (a sealed segment):
    /// nothing is pending and nothing is held.
    pub fn settled(&self) {
        let mut h = self.held.lock().expect("held file lock");
        h.unsynced = false;
        if !h.retired {
            h.file = None;
        }
    }

    /// The file is about to be deleted: held open for good, so reads that
    /// found it finish (a deleted file cannot be opened again).
    pub fn retire(&self) {
        if let Ok(f) = self.get() {
            let mut h = self.held.lock().expect("held file lock");
            h.retired = true;
            h.file = Some(f);
        }
    }
}

impl Drop for CachedFile {
    fn drop(&mut self) {
        self.cache.forget(self.id);
    }
}

/// Raises the soft limit on open descriptors to the hard limit; returns
/// (soft before, soft now, hard).
pub fn raise_nofile_limit() -> io::Result<(u64, u64, u64)> {
    use rustix::process::{getrlimit, setrlimit, Resource, Rlimit};
    let before = getrlimit(Resource::Nofile);
    let soft = before.current.unwrap_or(u64::MAX);
    let hard = before.maximum.unwrap_or(u64::MAX);
    if soft < hard {
        setrlimit(Resource::Nofile, Rlimit { current: before.maximum, maximum: before.maximum })?;
    }
    let after = getrlimit(Resource::Nofile);
    Ok((soft, after.current.unwrap_or(u64::MAX), hard))
}

/// The soft limit on open descriptors now.
pub fn nofile_limit() -> u64 {
    rustix::process::getrlimit(rustix::process::Resource::Nofile).current.unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::disk::RealDisk;
    use std::fs::File;
    use std::io::Write;

    fn files(dir: &Path, n: usize) -> Vec<PathBuf> {
        (0..n)
            .map(|i| {
                let p = dir.join(format!("f{i}"));
                File::create(&p).unwrap().write_all(format!("file {i}").as_bytes()).unwrap();
                p
            })
            .collect()
    }

    #[test]
    fn at_most_capacity_stay_open_and_closed_ones_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let cache = FileCache::new(3, RealDisk::shared());
        let slots: Vec<CachedFile> = files(dir.path(), 10).into_iter().map(|p| cache.file(p, false)).collect();
        for round in 0..3 {
            for s in &slots {
                let f = s.get().unwrap();
                let mut b = [0u8; 16];
                let n = f.read_at(&mut b, 0).unwrap();
                assert!(std::str::from_utf8(&b[..n]).unwrap().starts_with("file "), "round {round}");
                assert!(cache.open_files() <= 3);
            }
        }
        assert!(cache.reopens.load(Ordering::Relaxed) >= 27, "closed files were opened again");
        assert!(cache.evictions.load(Ordering::Relaxed) >= 27);
        drop(slots);
        assert_eq!(cache.open_files(), 0, "a dropped slot leaves nothing open");
    }

    #[test]
    fn the_least_recently_used_goes_first() {
        let dir = tempfile::tempdir().unwrap();
        let cache = FileCache::new(2, RealDisk::shared());
        let s: Vec<CachedFile> = files(dir.path(), 3).into_iter().map(|p| cache.file(p, false)).collect();
        s[0].get().unwrap();
        s[1].get().unwrap();
        s[0].get().unwrap();
        s[2].get().unwrap();
        let before = cache.reopens.load(Ordering::Relaxed);
        s[0].get().unwrap();
        assert_eq!(cache.reopens.load(Ordering::Relaxed), before, "the recently used one stayed open");
        s[1].get().unwrap();
        assert_eq!(cache.reopens.load(Ordering::Relaxed), before + 1, "the least recently used one was closed");
    }

    #[test]
    fn a_file_in_use_stays_usable_after_eviction() {
        let dir = tempfile::tempdir().unwrap();
        let cache = FileCache::new(1, RealDisk::shared());
        let s: Vec<CachedFile> = files(dir.path(), 2).into_iter().map(|p| cache.file(p, false)).collect();
        let held = s[0].get().unwrap();
        s[1].get().unwrap();
        let mut b = [0u8; 6];
        held.read_exact_at(&mut b, 0).unwrap();
        assert_eq!(&b, b"file 0");
    }

    #[test]
    fn a_hold_ends_with_the_sync_that_saw_it_and_not_before() {
        let dir = tempfile::tempdir().unwrap();
        let cache = FileCache::new(1, RealDisk::shared());
        let s: Vec<CachedFile> = files(dir.path(), 2).into_iter().map(|p| cache.file(p, true)).collect();
        let f = s[0].get().unwrap();
        assert!(s[0].to_sync().is_none(), "nothing written");
        s[0].wrote(&f, true);
        s[1].get().unwrap();
        let before = cache.reopens.load(Ordering::Relaxed);
        s[0].get().unwrap();
        assert_eq!(cache.reopens.load(Ordering::Relaxed), before, "held, so not reopened though evicted");
        let (held, n) = s[0].to_sync().unwrap();
        assert!(held.is_some());
        // Written again while the sync runs: the newer hold stays.
        s[0].wrote(&f, true);
        s[0].synced(n);
        assert!(s[0].unsynced());
        let (_, n2) = s[0].to_sync().unwrap();
        s[0].synced(n2);
        assert!(!s[0].unsynced());
        s[1].get().unwrap();
        s[0].get().unwrap();
        assert_eq!(cache.reopens.load(Ordering::Relaxed), before + 1, "the hold ended");
        // A retired file stays readable after it is deleted.
        s[1].retire();
        std::fs::remove_file(dir.path().join("f1")).unwrap();
        s[0].get().unwrap();
        assert!(s[1].get().is_ok());
    }

    #[test]
    fn exhaustion_is_told_apart_from_damage() {
        assert!(is_exhaustion(&io::Error::from_raw_os_error(rustix::io::Errno::MFILE.raw_os_error())));
        assert!(is_exhaustion(&io::Error::from_raw_os_error(rustix::io::Errno::NOSPC.raw_os_error())));
        assert!(!is_exhaustion(&io::Error::from_raw_os_error(rustix::io::Errno::IO.raw_os_error())));
        assert!(!is_exhaustion(&io::Error::new(io::ErrorKind::Other, "x")));
    }
}
