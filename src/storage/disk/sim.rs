//! A file system in memory with seeded faults, for the simulator.
//!
//! # The model
//!
//! Each file (inode) has the bytes readers see and the bytes on "disk"
//! (durable), and the writes and truncations since its last sync, in order.
//! Each directory has the names readers see and the durable names, and the
//! name changes (create, remove, rename) since its last `sync_dir`.
//!
//! At a [`SimDisk::crash`], for every file each pending write independently
//! reaches the disk whole, torn at a random byte, or not at all (the kernel
//! writes back pages in no promised order), and each pending truncation
//! reaches it or not; for every directory a random prefix of its pending
//! name changes reaches it (a journaling file system commits them in
//! order). Files no durable name reaches are gone. Handles opened before
//! the crash fail with EIO afterwards.
//!
//! A failed fsync behaves as Linux does since 4.13: the error is reported
//! once, the pages stay readable, and whatever did not reach the disk is
//! never retried, so a second fsync succeeds and the data is still lost at
//! the next crash.
//!
//! Faults are drawn from the disk's own random sequence with the
//! probabilities of [`Faults`], out of a million operations of each kind.
//! Nothing here reads a clock or the process's randomness: the same seed
//! and the same calls give the same results.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use super::{Disk, DiskFile, FileRef, Mode};

/// A small deterministic generator (SplitMix64): test randomness, not
/// cryptography.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed ^ 0x9e37_79b9_7f4a_7c15)
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    /// Uniform in `0..n` (`n > 0`).
    pub fn below(&mut self, n: u64) -> u64 {
        debug_assert!(n > 0);
        self.next_u64() % n
    }
    /// True with probability `per_million` / 1,000,000.
    pub fn chance(&mut self, per_million: u32) -> bool {
        per_million > 0 && self.below(1_000_000) < per_million as u64
    }
}

/// Fault probabilities, per million operations of each kind.
#[derive(Debug, Clone, Copy, Default)]
pub struct Faults {
    /// A write fails with EIO after writing a random prefix.
    pub write_eio: u32,
    /// A write or a reservation fails with ENOSPC (a write after a random
    /// prefix).
    pub nospc: u32,
    /// `sync_data`, `sync_all` or `sync_dir` fails with EIO.
    pub sync_eio: u32,
    /// Opening a file fails with EMFILE.
    pub emfile: u32,
    /// A read fails with EIO.
    pub read_eio: u32,
}

#[derive(Debug, Clone)]
enum Pending {
    Write { pos: u64, bytes: Vec<u8> },
    SetLen(u64),
}

#[derive(Debug, Default)]
struct Inode {
    data: Vec<u8>,
    durable: Vec<u8>,
    pending: Vec<Pending>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Node {
    Dir,
    File(u64),
}

#[derive(Debug, Clone)]
enum DirOp {
    Put(PathBuf, Node),
    Remove(PathBuf),
}

#[derive(Debug, Default)]
struct State {
    rng: Option<Rng>,
    faults: Faults,
    inodes: HashMap<u64, Inode>,
    next_ino: u64,
    names: BTreeMap<PathBuf, Node>,
    durable: BTreeMap<PathBuf, Node>,
    /// Per directory, its name changes since its last sync.
    dir_ops: BTreeMap<PathBuf, Vec<DirOp>>,
    /// Bumped by each crash: older handles are dead.
    generation: u64,
    stats: SimStats,
}

/// What the disk did, for the simulator's report.
#[derive(Debug, Default, Clone, Copy)]
pub struct SimStats {
    pub faults: u64,
    pub crashes: u64,
    pub torn_writes: u64,
    pub lost_writes: u64,
    pub writes: u64,
    pub syncs: u64,
    /// Page-cache drops asked for over bytes not yet durable: storage may
    /// only drop what a sync made durable (on Linux the kernel would skip
    /// such pages; here it is a broken promise, and the simulator fails).
    pub unsynced_drops: u64,
    /// A digest of every operation in order (its kind, path and position),
    /// so two runs of a seed can be compared: equal digests, same run.
    pub history: u64,
}

impl State {
    fn rng(&mut self) -> &mut Rng {
        self.rng.get_or_insert_with(|| Rng::new(0))
    }
    fn fault(&mut self, per_million: u32) -> bool {
        let hit = self.rng().chance(per_million);
        self.stats.faults += hit as u64;
        hit
    }
    /// Folds an operation into [`SimStats::history`] (FNV-1a).
    fn note(&mut self, op: &str, path: &Path, arg: u64) {
        let mut h = if self.stats.history == 0 { 0xcbf2_9ce4_8422_2325 } else { self.stats.history };
        for b in op.bytes().chain(path.as_os_str().as_encoded_bytes().iter().copied()).chain(arg.to_le_bytes()) {
            h = (h ^ b as u64).wrapping_mul(0x0100_0000_01b3);
        }
        self.stats.history = h;
    }
    fn log(&mut self, path: &Path, op: DirOp) {
        let parent = path.parent().unwrap_or(Path::new("")).to_owned();
        self.dir_ops.entry(parent).or_default().push(op);
    }
}

/// A simulated disk; clones share it.
#[derive(Clone, Default)]
pub struct SimDisk {
    state: Arc<Mutex<State>>,
}

impl fmt::Debug for SimDisk {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("SimDisk")
    }
}

fn errno(e: rustix::io::Errno) -> io::Error {
    io::Error::from_raw_os_error(e.raw_os_error())
}

fn not_found(path: &Path) -> io::Error {
    io::Error::new(io::ErrorKind::NotFound, format!("{}: no such file or directory", path.display()))
}

impl SimDisk {
    pub fn new(seed: u64, faults: Faults) -> SimDisk {
        let d = SimDisk::default();
        {
            let mut s = d.state();
            s.rng = Some(Rng::new(seed));
            s.faults = faults;
            s.names.insert(PathBuf::from("/"), Node::Dir);
            s.durable.insert(PathBuf::from("/"), Node::Dir);
        }
        d
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Changes the fault probabilities (0 for a fault-free recovery).
    pub fn set_faults(&self, faults: Faults) {
        self.state().faults = faults;
    }

    pub fn stats(&self) -> SimStats {
        self.state().stats
    }

    /// The machine loses power: what was not durable is torn, lost or kept
    /// as the seed decides (see the module docs), and every open handle
    /// dies.
    pub fn crash(&self) {
        self.crash_with(false)
    }

    /// The worst crash: nothing that was not durable reaches the disk.
    pub fn crash_losing_everything_unsynced(&self) {
        self.crash_with(true)
    }

    fn crash_with(&self, worst: bool) {
        let mut guard = self.state();
        let s = &mut *guard;
        s.generation += 1;
        s.stats.crashes += 1;
        s.note("crash", Path::new("/"), worst as u64);
        // Names: a prefix of each directory's changes.
        let dir_ops = std::mem::take(&mut s.dir_ops);
        for (_, ops) in dir_ops {
            let keep = if worst { 0 } else { s.rng().below(ops.len() as u64 + 1) as usize };
            for op in ops.into_iter().take(keep) {
                match op {
                    DirOp::Put(p, n) => {
                        s.durable.insert(p, n);
                    }
                    DirOp::Remove(p) => {
                        s.durable.remove(&p);
                    }
                }
            }
        }
        // A name whose directory's own name did not survive is unreachable.
        let orphans: Vec<PathBuf> = s.durable.keys().filter(|p| p.parent().is_some_and(|d| s.durable.get(d) != Some(&Node::Dir))).cloned().collect();
        for o in orphans {
            s.durable.retain(|p, _| !p.starts_with(&o));
        }
        s.names = s.durable.clone();
        // Data: each pending change whole, torn or lost.
        let mut inos: Vec<u64> = s.inodes.keys().copied().collect();
        inos.sort_unstable();
        for ino in inos {
            let mut inode = s.inodes.remove(&ino).expect("inode listed");
            let mut disk = std::mem::take(&mut inode.durable);
            for op in inode.pending.drain(..) {
                let roll = if worst { 2 } else { s.rng().below(3) };
                match op {
                    Pending::Write { pos, bytes } => {
                        let n = match roll {
                            0 => bytes.len(),
                            1 => {
                                s.stats.torn_writes += 1;
                                s.rng().below(bytes.len() as u64 + 1) as usize
                            }
                            _ => {
                                s.stats.lost_writes += 1;
                                0
                            }
                        };
                        if n > 0 {
                            write_into(&mut disk, pos, &bytes[..n]);
                        }
                    }
                    Pending::SetLen(len) => {
                        if roll != 2 {
                            disk.resize(len as usize, 0);
                        }
                    }
                }
            }
            inode.data = disk.clone();
            inode.durable = disk;
            s.inodes.insert(ino, inode);
        }
        let live: std::collections::HashSet<u64> = s.names.values().filter_map(|n| if let Node::File(i) = n { Some(*i) } else { None }).collect();
        s.inodes.retain(|i, _| live.contains(i));
    }

    /// The files under `dir` (recursively), for the simulator's check that
    /// every file on disk is accounted for.
    pub fn files_under(&self, dir: &Path) -> Vec<PathBuf> {
        self.state().names.iter().filter(|(p, n)| matches!(n, Node::File(_)) && p.starts_with(dir)).map(|(p, _)| p.clone()).collect()
    }

    /// A file's bytes as readers see them (tests).
    pub fn read(&self, path: &Path) -> Option<Vec<u8>> {
        let s = self.state();
        match s.names.get(path)? {
            Node::File(ino) => Some(s.inodes[ino].data.clone()),
            Node::Dir => None,
        }
    }

    fn parent_exists(s: &State, path: &Path) -> bool {
        path.parent().is_none_or(|p| p.as_os_str().is_empty() || s.names.get(p) == Some(&Node::Dir))
    }
}

fn write_into(data: &mut Vec<u8>, pos: u64, bytes: &[u8]) {
    let end = pos as usize + bytes.len();
    if data.len() < end {
        data.resize(end, 0);
    }
    data[pos as usize..end].copy_from_slice(bytes);
}

impl Disk for SimDisk {
    fn open(&self, path: &Path, mode: Mode) -> io::Result<FileRef> {
        let mut guard = self.state();
        let s = &mut *guard;
        s.note("open", path, mode as u64);
        let emfile = s.faults.emfile;
        if s.fault(emfile) {
            return Err(errno(rustix::io::Errno::MFILE));
        }
        let ino = match (s.names.get(path).copied(), mode) {
            (Some(Node::File(_)), Mode::CreateNew) => return Err(io::Error::new(io::ErrorKind::AlreadyExists, format!("{} exists", path.display()))),
            (Some(Node::File(ino)), _) => ino,
            (Some(Node::Dir), _) => return Err(io::Error::new(io::ErrorKind::IsADirectory, format!("{} is a directory", path.display()))),
            (None, Mode::CreateNew) => {
                if !SimDisk::parent_exists(s, path) {
                    return Err(not_found(path));
                }
                let nospc = s.faults.nospc;
                if s.fault(nospc) {
                    return Err(errno(rustix::io::Errno::NOSPC));
                }
                s.next_ino += 1;
                let ino = s.next_ino;
                s.inodes.insert(ino, Inode::default());
                s.names.insert(path.to_owned(), Node::File(ino));
                s.log(path, DirOp::Put(path.to_owned(), Node::File(ino)));
                ino
            }
            (None, _) => return Err(not_found(path)),
        };
        Ok(Arc::new(SimFile { disk: self.clone(), ino, generation: s.generation, write: mode != Mode::Read, path: path.to_owned() }))
    }

    fn create_dir_all(&self, dir: &Path) -> io::Result<()> {
        let mut s = self.state();
        s.note("mkdir", dir, 0);
        let mut missing = Vec::new();
        for a in dir.ancestors() {
            if a.as_os_str().is_empty() {
                break;
            }
            match s.names.get(a) {
                Some(Node::Dir) => break,
                Some(Node::File(_)) => return Err(io::Error::new(io::ErrorKind::AlreadyExists, format!("{} is a file", a.display()))),
                None => missing.push(a.to_owned()),
            }
        }
        for a in missing.into_iter().rev() {
            s.names.insert(a.clone(), Node::Dir);
            s.log(&a.clone(), DirOp::Put(a, Node::Dir));
        }
        Ok(())
    }

    fn list(&self, dir: &Path) -> io::Result<Vec<String>> {
        let mut s = self.state();
        s.note("list", dir, 0);
        if s.names.get(dir) != Some(&Node::Dir) {
            return Err(not_found(dir));
        }
        Ok(s.names
            .range(dir.to_owned()..)
            .skip(1)
            .take_while(|(p, _)| p.starts_with(dir))
            .filter(|(p, _)| p.parent() == Some(dir))
            .filter_map(|(p, _)| p.file_name().map(|n| n.to_string_lossy().into_owned()))
            .collect())
    }

    fn exists(&self, path: &Path) -> bool {
        self.state().names.contains_key(path)
    }

    fn file_len(&self, path: &Path) -> io::Result<u64> {
        let mut s = self.state();
        s.note("file_len", path, 0);
        match s.names.get(path) {
            Some(Node::File(ino)) => Ok(s.inodes[ino].data.len() as u64),
            Some(Node::Dir) => Err(io::Error::new(io::ErrorKind::IsADirectory, format!("{} is a directory", path.display()))),
            None => Err(not_found(path)),
        }
    }

    fn remove_file(&self, path: &Path) -> io::Result<()> {
        let mut s = self.state();
        s.note("remove", path, 0);
        match s.names.get(path) {
            Some(Node::File(_)) => {
                s.names.remove(path);
                s.log(path, DirOp::Remove(path.to_owned()));
                Ok(())
            }
            Some(Node::Dir) => Err(io::Error::new(io::ErrorKind::IsADirectory, format!("{} is a directory", path.display()))),
            None => Err(not_found(path)),
        }
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        let mut s = self.state();
        s.note("rename", from, 0);
        s.note("to", to, 0);
        let Some(node @ Node::File(_)) = s.names.get(from).copied() else { return Err(not_found(from)) };
        if !SimDisk::parent_exists(&s, to) {
            return Err(not_found(to));
        }
        if from.parent() != to.parent() {
            // Storage renames within a directory only; across two, the
            // model would need both directories' syncs.
            return Err(io::Error::new(io::ErrorKind::Unsupported, "the simulated disk renames within one directory"));
        }
        s.names.remove(from);
        s.names.insert(to.to_owned(), node);
        s.log(from, DirOp::Remove(from.to_owned()));
        s.log(to, DirOp::Put(to.to_owned(), node));
        Ok(())
    }

    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        let mut guard = self.state();
        let s = &mut *guard;
        if s.names.get(dir) != Some(&Node::Dir) {
            return Err(not_found(dir));
        }
        s.stats.syncs += 1;
        s.note("sync_dir", dir, 0);
        let sync_eio = s.faults.sync_eio;
        if s.fault(sync_eio) {
            return Err(errno(rustix::io::Errno::IO));
        }
        for op in s.dir_ops.remove(dir).unwrap_or_default() {
            match op {
                DirOp::Put(p, n) => {
                    s.durable.insert(p, n);
                }
                DirOp::Remove(p) => {
                    s.durable.remove(&p);
                }
            }
        }
        Ok(())
    }
}

/// A handle on a simulated file.
pub struct SimFile {
    disk: SimDisk,
    ino: u64,
    generation: u64,
    write: bool,
    path: PathBuf,
}

impl fmt::Debug for SimFile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SimFile({})", self.path.display())
    }
}

impl SimFile {
    /// The state, if this handle survived every crash since it was opened.
    fn live(&self) -> io::Result<std::sync::MutexGuard<'_, State>> {
        let s = self.disk.state();
        if s.generation != self.generation || !s.inodes.contains_key(&self.ino) {
            return Err(errno(rustix::io::Errno::IO));
        }
        Ok(s)
    }

    fn writable(&self) -> io::Result<()> {
        if self.write {
            Ok(())
        } else {
            Err(errno(rustix::io::Errno::BADF))
        }
    }

    fn sync(&self) -> io::Result<()> {
        let mut guard = self.live()?;
        let s = &mut *guard;
        s.stats.syncs += 1;
        s.note("sync", &self.path, 0);
        let sync_eio = s.faults.sync_eio;
        let failed = s.fault(sync_eio);
        let inode = s.inodes.get_mut(&self.ino).expect("live inode");
        let pending = std::mem::take(&mut inode.pending);
        // The changes reach the disk, not the bytes readers see: what an
        // earlier failed sync dropped stays dropped (the kernel marked those
        // pages clean).
        let mut disk = std::mem::take(&mut inode.durable);
        let mut rng = s.rng.take().expect("seeded");
        for op in pending {
            // After a failure, some of it reached the disk, the rest never will.
            if !failed || rng.below(2) == 0 {
                match op {
                    Pending::Write { pos, bytes } => write_into(&mut disk, pos, &bytes),
                    Pending::SetLen(len) => disk.resize(len as usize, 0),
                }
            }
        }
        s.rng = Some(rng);
        s.inodes.get_mut(&self.ino).expect("live inode").durable = disk;
        if failed {
            return Err(errno(rustix::io::Errno::IO));
        }
        Ok(())
    }
}

impl DiskFile for SimFile {
    fn read_at(&self, buf: &mut [u8], pos: u64) -> io::Result<usize> {
        let mut s = self.live()?;
        s.note("read", &self.path, pos);
        let read_eio = s.faults.read_eio;
        if s.fault(read_eio) {
            return Err(errno(rustix::io::Errno::IO));
        }
        let data = &s.inodes[&self.ino].data;
        let start = (pos as usize).min(data.len());
        let n = buf.len().min(data.len() - start);
        buf[..n].copy_from_slice(&data[start..start + n]);
        Ok(n)
    }

    fn write_all_at(&self, buf: &[u8], pos: u64) -> io::Result<()> {
        self.writable()?;
        let mut guard = self.live()?;
        let s = &mut *guard;
        s.stats.writes += 1;
        s.note("write", &self.path, pos);
        let (eio, nospc) = (s.faults.write_eio, s.faults.nospc);
        let err = if s.fault(eio) {
            Some(rustix::io::Errno::IO)
        } else if s.fault(nospc) {
            Some(rustix::io::Errno::NOSPC)
        } else {
            None
        };
        let n = match err {
            Some(_) => s.rng().below(buf.len() as u64 + 1) as usize,
            None => buf.len(),
        };
        let inode = s.inodes.get_mut(&self.ino).expect("live inode");
        if n > 0 {
            write_into(&mut inode.data, pos, &buf[..n]);
            inode.pending.push(Pending::Write { pos, bytes: buf[..n].to_vec() });
        }
        match err {
            Some(e) => Err(errno(e)),
            None => Ok(()),
        }
    }

    fn len(&self) -> io::Result<u64> {
        Ok(self.live()?.inodes[&self.ino].data.len() as u64)
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        self.writable()?;
        let mut s = self.live()?;
        s.note("set_len", &self.path, len);
        let inode = s.inodes.get_mut(&self.ino).expect("live inode");
        inode.data.resize(len as usize, 0);
        inode.pending.push(Pending::SetLen(len));
        Ok(())
    }

    fn sync_data(&self) -> io::Result<()> {
        self.sync()
    }

    fn sync_all(&self) -> io::Result<()> {
        self.sync()
    }

    fn reserve(&self, _pos: u64, _len: u64) -> io::Result<bool> {
        self.writable()?;
        let mut s = self.live()?;
        s.note("reserve", &self.path, _pos);
        let nospc = s.faults.nospc;
        if s.fault(nospc) {
            return Err(errno(rustix::io::Errno::NOSPC));
        }
        Ok(true)
    }

    fn release(&self, _pos: u64, _len: u64) {}

    // The simulated disk has no page cache: reads always see the bytes.
    // What is checked is storage's promise to drop only durable bytes.
    fn drop_cache(&self, pos: u64, len: u64) {
        let Ok(mut guard) = self.live() else { return };
        let s = &mut *guard;
        s.note("drop_cache", &self.path, pos);
        let end = pos + len;
        let overlaps = s.inodes[&self.ino].pending.iter().any(|p| match p {
            Pending::Write { pos: at, bytes } => *at < end && pos < at + bytes.len() as u64,
            Pending::SetLen(_) => false,
        });
        if overlaps {
            s.stats.unsynced_drops += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> PathBuf {
        PathBuf::from(s)
    }

    #[test]
    fn synced_data_and_names_survive_a_crash_and_unsynced_ones_may_not() {
        for seed in 0..200 {
            let d = SimDisk::new(seed, Faults::default());
            d.create_dir_all(&p("/a")).unwrap();
            d.sync_dir(&p("/")).unwrap();
            let f = d.open(&p("/a/x"), Mode::CreateNew).unwrap();
            f.write_all_at(b"hello", 0).unwrap();
            f.sync_data().unwrap();
            d.sync_dir(&p("/a")).unwrap();
            f.write_all_at(b" world", 5).unwrap();
            let g = d.open(&p("/a/y"), Mode::CreateNew).unwrap();
            g.write_all_at(b"unsynced name", 0).unwrap();
            g.sync_data().unwrap();
            d.crash();
            assert!(f.len().is_err(), "a handle from before the crash is dead");
            let after = d.read(&p("/a/x")).expect("a synced name survives");
            assert!(after.starts_with(b"hello"), "{seed}: synced bytes survive");
            assert!(b"hello world".starts_with(&after[..after.len().min(11)]) || after.len() == 11, "{seed}: only what was written: {after:?}");
            assert!(d.read(&p("/a/y")).is_none_or(|b| b == b"unsynced name"));
        }
    }

    #[test]
    fn a_crash_sometimes_tears_and_sometimes_loses_unsynced_writes() {
        let (mut torn, mut lost, mut kept) = (0, 0, 0);
        for seed in 0..300 {
            let d = SimDisk::new(seed, Faults::default());
            let f = d.open(&p("/x"), Mode::CreateNew).unwrap();
            d.sync_dir(&p("/")).unwrap();
            f.sync_all().unwrap();
            f.write_all_at(&[7u8; 100], 0).unwrap();
            d.crash();
            match d.read(&p("/x")).unwrap().len() {
                0 => lost += 1,
                100 => kept += 1,
                _ => torn += 1,
            }
        }
        assert!(torn > 0 && lost > 0 && kept > 0, "torn {torn} lost {lost} kept {kept}");
    }

    #[test]
    fn a_failed_fsync_is_reported_once_and_its_loss_is_permanent() {
        let mut lost_after_success = false;
        for seed in 0..100 {
            let d = SimDisk::new(seed, Faults { sync_eio: 1_000_000, ..Faults::default() });
            let f = d.open(&p("/x"), Mode::CreateNew).unwrap();
            f.write_all_at(&[1u8; 64], 0).unwrap();
            assert!(f.sync_data().is_err());
            d.set_faults(Faults::default());
            // The retry "succeeds": nothing is pending any more.
            f.sync_data().unwrap();
            assert_eq!(f.len().unwrap(), 64, "the pages stay readable");
            d.sync_dir(&p("/")).unwrap();
            d.crash();
            lost_after_success |= d.read(&p("/x")).unwrap().is_empty();
        }
        assert!(lost_after_success, "some seed loses the write that a later fsync claimed");
    }

    #[test]
    fn renames_reach_the_disk_in_order_or_not_at_all() {
        for seed in 0..200 {
            let d = SimDisk::new(seed, Faults::default());
            let f = d.open(&p("/t.tmp"), Mode::CreateNew).unwrap();
            f.write_all_at(b"store", 0).unwrap();
            f.sync_all().unwrap();
            d.rename(&p("/t.tmp"), &p("/t")).unwrap();
            assert_eq!(d.list(&p("/")).unwrap(), vec!["t".to_owned()]);
            d.crash();
            let names = d.list(&p("/")).unwrap();
            // Never both, never a file without its bytes.
            assert!(names.len() <= 1, "{names:?}");
            for n in names {
                assert_eq!(d.read(&p("/").join(n)).unwrap(), b"store");
            }
        }
    }

    #[test]
    fn the_same_seed_gives_the_same_disk() {
        let run = |seed| {
            let d = SimDisk::new(seed, Faults { write_eio: 100_000, nospc: 100_000, ..Faults::default() });
            let f = d.open(&p("/x"), Mode::CreateNew).unwrap();
            let mut results = Vec::new();
            for i in 0..50u64 {
                results.push(f.write_all_at(&[i as u8; 37], i * 37).is_ok());
            }
            d.crash();
            (results, d.read(&p("/x")))
        };
        assert_eq!(run(42), run(42));
        assert_ne!(run(42), run(43));
    }
}
