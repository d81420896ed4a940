//! The I/O seam: every file operation of `storage` goes through [`Disk`]
//! and [`DiskFile`].
//!
//! Two implementations: [`RealDisk`], the operating system's file system,
//! and [`sim::SimDisk`], a file system in memory whose faults (torn and
//! lost writes at a crash, EIO, ENOSPC, EMFILE, renames and creations not
//! yet durable) are drawn from a seed, so that the simulator can crash
//! storage at any step and replay exactly what it did.
//!
//! The trait is the set of operations storage needs and no more: positioned
//! reads and writes (storage never uses a file cursor), length, truncation,
//! the two syncs, space reservation, and the directory operations that
//! recovery, rolling, compaction and retention perform. Durability follows
//! POSIX as Linux implements it, and the simulated disk models exactly
//! that: file data is durable after `sync_data`/`sync_all`; a created,
//! removed or renamed name is durable after `sync_dir` of its directory.
//!
//! Rejected: making `Storage` generic over the disk. Every type that holds a
//! file would carry the parameter up into the engine, for nothing: a
//! virtual call costs nanoseconds beside a system call.

use std::fmt;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::Arc;

pub mod sim;

/// An open file, shared by its readers and its writer.
pub type FileRef = Arc<dyn DiskFile>;

/// How to open a file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Read only; the file must exist.
    Read,
    /// Read and write; the file must exist.
    Write,
    /// Read and write a new, empty file; fails if the name exists.
    CreateNew,
}

pub trait Disk: Send + Sync + fmt::Debug {
    fn open(&self, path: &Path, mode: Mode) -> io::Result<FileRef>;
    /// Creates `dir` and its missing parents (not durable until
    /// [`Disk::sync_dir`] of each parent).
    fn create_dir_all(&self, dir: &Path) -> io::Result<()>;
    /// The names in `dir`, in no particular order.
    fn list(&self, dir: &Path) -> io::Result<Vec<String>>;
    fn exists(&self, path: &Path) -> bool;
    /// A file's length, without opening it.
    fn file_len(&self, path: &Path) -> io::Result<u64>;
    fn remove_file(&self, path: &Path) -> io::Result<()>;
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()>;
    /// Makes the names in `dir` (creations, removals, renames) durable.
    fn sync_dir(&self, dir: &Path) -> io::Result<()>;
}

#[allow(clippy::len_without_is_empty)]
pub trait DiskFile: Send + Sync + fmt::Debug {
    /// Reads at `pos`; fewer bytes than asked only at the end of the file.
    fn read_at(&self, buf: &mut [u8], pos: u64) -> io::Result<usize>;
    fn write_all_at(&self, buf: &[u8], pos: u64) -> io::Result<()>;
    fn len(&self) -> io::Result<u64>;
    fn set_len(&self, len: u64) -> io::Result<()>;
    /// Makes the file's data durable.
    fn sync_data(&self) -> io::Result<()>;
    /// Makes the file's data and metadata durable.
    fn sync_all(&self) -> io::Result<()>;
    /// Reserves disk space for `[pos, pos + len)` without changing the
    /// length, so that a full disk shows here rather than in a later write.
    /// `Ok(false)`: the file system cannot reserve ahead.
    fn reserve(&self, pos: u64, len: u64) -> io::Result<bool>;
    /// Gives back space reserved past the length (`[pos, pos + len)`).
    fn release(&self, pos: u64, len: u64);
    /// `[pos, pos + len)` is written and synced and need not stay in
    /// memory: the page cache may drop it (a reader reads it from the disk
    /// again). A hint: nothing is lost whatever it does.
    fn drop_cache(&self, pos: u64, len: u64);

    /// Fills `buf` from `pos`, or fails with `UnexpectedEof`.
    fn read_exact_at(&self, buf: &mut [u8], pos: u64) -> io::Result<()> {
        let n = read_full_at(self, buf, pos)?;
        if n < buf.len() {
            return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "file ends before the bytes asked for"));
        }
        Ok(())
    }
}

/// Positioned read that fills `buf` unless the file ends first; returns the
/// bytes read.
pub fn read_full_at(file: &(impl DiskFile + ?Sized), buf: &mut [u8], pos: u64) -> io::Result<usize> {
    let mut got = 0;
    while got < buf.len() {
        match file.read_at(&mut buf[got..], pos + got as u64) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(got)
}

/// Writes sequentially into a file from a position (a store being built).
pub struct Appender {
    file: FileRef,
    pos: u64,
}

impl Appender {
    pub fn new(file: FileRef, pos: u64) -> Appender {
        Appender { file, pos }
    }
    pub fn into_file(self) -> FileRef {
        self.file
    }
}

impl io::Write for Appender {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.file.write_all_at(buf, self.pos)?;
        self.pos += buf.len() as u64;
        Ok(buf.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// Reads sequentially from a file from a position (a deep scan).
pub struct Reader<'a> {
    file: &'a dyn DiskFile,
    pos: u64,
}

impl<'a> Reader<'a> {
    pub fn new(file: &'a dyn DiskFile, pos: u64) -> Reader<'a> {
        Reader { file, pos }
    }
}

impl io::Read for Reader<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.file.read_at(buf, self.pos)?;
        self.pos += n as u64;
        Ok(n)
    }
}

/// The operating system's file system.
#[derive(Debug, Default, Clone, Copy)]
pub struct RealDisk;

impl RealDisk {
    pub fn shared() -> Arc<dyn Disk> {
        Arc::new(RealDisk)
    }
}

impl Disk for RealDisk {
    fn open(&self, path: &Path, mode: Mode) -> io::Result<FileRef> {
        let mut o = OpenOptions::new();
        o.read(true);
        match mode {
            Mode::Read => {}
            Mode::Write => {
                o.write(true);
            }
            Mode::CreateNew => {
                o.write(true).create_new(true);
            }
        }
        Ok(Arc::new(o.open(path)?))
    }
    fn create_dir_all(&self, dir: &Path) -> io::Result<()> {
        std::fs::create_dir_all(dir)
    }
    fn list(&self, dir: &Path) -> io::Result<Vec<String>> {
        std::fs::read_dir(dir)?.map(|e| e.map(|e| e.file_name().to_string_lossy().into_owned())).collect()
    }
    fn exists(&self, path: &Path) -> bool {
        path.exists()
    }
    fn file_len(&self, path: &Path) -> io::Result<u64> {
        Ok(std::fs::metadata(path)?.len())
    }
    fn remove_file(&self, path: &Path) -> io::Result<()> {
        std::fs::remove_file(path)
    }
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        std::fs::rename(from, to)
    }
    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        File::open(dir)?.sync_all()
    }
}

impl DiskFile for File {
    fn read_at(&self, buf: &mut [u8], pos: u64) -> io::Result<usize> {
        FileExt::read_at(self, buf, pos)
    }
    fn write_all_at(&self, buf: &[u8], pos: u64) -> io::Result<()> {
        FileExt::write_all_at(self, buf, pos)
    }
    fn len(&self) -> io::Result<u64> {
        Ok(self.metadata()?.len())
    }
    fn set_len(&self, len: u64) -> io::Result<()> {
        File::set_len(self, len)
    }
    fn sync_data(&self) -> io::Result<()> {
        File::sync_data(self)
    }
    fn sync_all(&self) -> io::Result<()> {
        File::sync_all(self)
    }
    fn reserve(&self, pos: u64, len: u64) -> io::Result<bool> {
        match rustix::fs::fallocate(self, rustix::fs::FallocateFlags::KEEP_SIZE, pos, len) {
            Ok(()) => Ok(true),
            Err(e) if e == rustix::io::Errno::OPNOTSUPP || e == rustix::io::Errno::NOSYS => Ok(false),
            Err(e) => Err(e.into()),
        }
    }
    fn release(&self, pos: u64, len: u64) {
        let flags = rustix::fs::FallocateFlags::PUNCH_HOLE | rustix::fs::FallocateFlags::KEEP_SIZE;
        let _ = rustix::fs::fallocate(self, flags, pos, len);
    }
    fn drop_cache(&self, pos: u64, len: u64) {
        // Only clean pages go; a hint the kernel may ignore.
        let _ = rustix::fs::fadvise(self, pos, std::num::NonZeroU64::new(len), rustix::fs::Advice::DontNeed);
    }
}
