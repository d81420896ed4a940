//! Subtree store files: what compaction writes, and reading one back.
//!
//! A store holds, for one compaction window, the frames of the topics its
//! split plan gave it, copied verbatim from the branch-log segments (same
//! frame format, so the same cursor reads both) in stream order, then a
//! sparse index per tp, a sparse stream index, and a checksummed footer.
//!
//! # Format, version 1 (all integers big-endian)
//!
//! ```text
//! file header, 32 bytes
//!   0  magic            8 bytes  b"CNPYSTR\0"
//!   8  format version   u16      1
//!  10  reserved         u16      0
//!  12  window           u64      the compaction window the store belongs to
//!  20  store            u32      its number in the window's plan
//!  24  reserved         u32      0
//!  28  header crc       u32      crc32 (IEEE) of bytes 0..28
//!
//! frames, from byte 32 to the index: branch-log frames (see `segment`),
//!   strictly increasing stream sequence numbers
//!
//! index
//!   tp count            u32
//!   per tp, 52 bytes + entries:
//!     topic id 16 bytes, partition i32, first offset i64, last offset i64,
//!     bytes u64 (its frames, headers included), max timestamp i64,
//!     entry count u32 (at least 1), then per entry 32 bytes:
//!       offset i64 (a batch's base offset), stream seq u64, position u64,
//!       largest timestamp of the tp's batches before it i64
//!   mark count          u32
//!   per mark, 16 bytes: stream seq u64, position u64 (one every 64 KiB)
//!
//! footer, 56 bytes, the last of the file
//!   0  index position   u64      = end of the frames
//!   8  index length     u64
//!  16  first seq        u64      of the first frame
//!  24  end seq          u64      one past the last frame's
//!  32  frame count      u64
//!  40  index crc        u32      crc32 (IEEE) of the index
//!  44  footer crc       u32      crc32 (IEEE) of footer bytes 0..44
//!  48  magic            8 bytes  b"CNPYSTRF"
//! ```
//!
//! A store is written under a temporary name, synced, and renamed; it
//! becomes part of the log only when the catalog lists it. Opening checks
//! both checksums and every count against the bytes present.

use crate::storage::hashing::HashMap;
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use crate::storage::disk::{Appender, Disk, FileRef, Mode};
use crate::storage::segment::{self, FrameHeader, FILE_HEADER_BYTES, FRAME_HEADER_BYTES, MAX_SCAN_GAP};
use crate::storage::Tp;

pub const FORMAT_VERSION: u16 = 1;
pub const MAGIC: &[u8; 8] = b"CNPYSTR\0";
pub const FOOTER_MAGIC: &[u8; 8] = b"CNPYSTRF";
pub const FOOTER_BYTES: u64 = 56;
const TP_BYTES: usize = 16 + 4 + 8 + 8 + 8 + 8 + 4;
const ENTRY_BYTES: usize = 32;
const MARK_BYTES: usize = 16;
/// Spacing of stream marks.
const MARK_SPACING: u64 = 64 * 1024;

/// One index entry: where a batch of the tp starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Entry {
    pub offset: i64,
    pub seq: u64,
    pub pos: u64,
    pub max_ts_before: i64,
}

/// A tp's share of a store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoreTp {
    pub first_offset: i64,
    pub last_offset: i64,
    pub bytes: u64,
    pub max_ts: i64,
    pub entries: Vec<Entry>,
}

/// The name of store `store` of window `window`.
pub fn file_name(window: u64, store: u32) -> String {
    format!("{window:020}-{store:06}.store")
}

/// Parses a name made by [`file_name`].
pub fn parse_file_name(name: &str) -> Option<(u64, u32)> {
    let stem = name.strip_suffix(".store")?;
    let (w, s) = stem.split_once('-')?;
    if w.len() != 20 || s.len() != 6 {
        return None;
    }
    Some((w.parse().ok()?, s.parse().ok()?))
}

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("store {path}: {source}")]
    Io { path: String, source: io::Error },
    #[error("store {path} is damaged ({why}); restore it from a copy: the catalog lists it, so its records exist nowhere else")]
    Corrupt { path: String, why: String },
}

/// Writes one store: frames go in through [`StoreWriter::push`] in stream
/// order; [`StoreWriter::finish`] appends index and footer and syncs.
pub struct StoreWriter {
    path: PathBuf,
    file: io::BufWriter<Appender>,
    pos: u64,
    tps: HashMap<Tp, StoreTp>,
    /// Per tp: bytes of its frames since its last entry.
    since_entry: HashMap<Tp, u64>,
    marks: Vec<(u64, u64)>,
    first_seq: Option<u64>,
    end_seq: u64,
    frames: u64,
    index_interval: u64,
}

impl StoreWriter {
    /// Creates `path` (which must not exist).
    pub fn create(disk: &dyn Disk, path: &Path, window: u64, store: u32, index_interval: u64) -> Result<StoreWriter, StoreError> {
        let io = |source| StoreError::Io { path: path.display().to_string(), source };
        let file = Appender::new(disk.open(path, Mode::CreateNew).map_err(io)?, 0);
        let mut w = StoreWriter {
            path: path.to_owned(),
            file: io::BufWriter::with_capacity(64 * 1024, file),
            pos: FILE_HEADER_BYTES,
            tps: HashMap::default(),
            since_entry: HashMap::default(),
            marks: Vec::new(),
            first_seq: None,
            end_seq: 0,
            frames: 0,
            index_interval,
        };
        let mut h = [0u8; FILE_HEADER_BYTES as usize];
        h[0..8].copy_from_slice(MAGIC);
        h[8..10].copy_from_slice(&FORMAT_VERSION.to_be_bytes());
        h[12..20].copy_from_slice(&window.to_be_bytes());
        h[20..24].copy_from_slice(&store.to_be_bytes());
        let crc = crc32fast::hash(&h[0..28]);
        h[28..32].copy_from_slice(&crc.to_be_bytes());
        w.file.write_all(&h).map_err(io)?;
        Ok(w)
    }

    /// Appends one whole frame (header and batch, as found in a segment).
    pub fn push(&mut self, fh: &FrameHeader, frame: &[u8]) -> Result<(), StoreError> {
        debug_assert_eq!(frame.len(), fh.frame_len as usize);
        debug_assert!(self.first_seq.is_none() || fh.seq >= self.end_seq, "frames in stream order");
        let tp = Tp { topic: fh.topic_id, partition: fh.partition };
        let pos = self.pos;
        let since = self.since_entry.entry(tp).or_insert(u64::MAX);
        let e = self.tps.entry(tp).or_insert_with(|| StoreTp { first_offset: fh.base_offset, last_offset: fh.last_offset(), bytes: 0, max_ts: i64::MIN, entries: Vec::new() });
        let far = e.entries.last().is_some_and(|l| pos - l.pos > MAX_SCAN_GAP);
        if e.entries.is_empty() || far || *since >= self.index_interval {
            e.entries.push(Entry { offset: fh.base_offset, seq: fh.seq, pos, max_ts_before: e.max_ts });
            *since = 0;
        }
        *since += fh.frame_len as u64;
        e.last_offset = e.last_offset.max(fh.last_offset());
        e.bytes += fh.frame_len as u64;
        e.max_ts = e.max_ts.max(fh.max_timestamp);
        if self.marks.last().is_none_or(|&(_, p)| pos >= p + MARK_SPACING) {
            self.marks.push((fh.seq, pos));
        }
        self.first_seq.get_or_insert(fh.seq);
        self.end_seq = fh.seq + 1;
        self.frames += 1;
        self.file.write_all(frame).map_err(|source| StoreError::Io { path: self.path.display().to_string(), source })?;
        self.pos += frame.len() as u64;
        Ok(())
    }

    pub fn bytes(&self) -> u64 {
        self.pos
    }

    /// Widens `tp`'s share to at least `first..=last`: a cleaning's share
    /// keeps the offset range of the shares it replaces, whose first and
    /// last batches it may have removed. Nothing for a tp with no frame.
    /// Answers whether the tp has frames here (and so was covered).
    pub fn cover(&mut self, tp: &Tp, first: i64, last: i64) -> bool {
        let Some(e) = self.tps.get_mut(tp) else { return false };
        e.first_offset = e.first_offset.min(first);
        e.last_offset = e.last_offset.max(last);
        true
    }

    /// Writes the index and the footer and flushes to the file (not synced:
    /// see [`StoreWriter::sync`]). Returns the file.
    pub fn finish(mut self) -> Result<(PathBuf, FileRef), StoreError> {
        let io = |source| StoreError::Io { path: self.path.display().to_string(), source };
        let mut tps: Vec<(&Tp, &StoreTp)> = self.tps.iter().collect();
        tps.sort_by_key(|(tp, _)| **tp);
        let mut idx = Vec::new();
        idx.extend_from_slice(&(tps.len() as u32).to_be_bytes());
        for (tp, s) in tps {
            idx.extend_from_slice(&tp.topic);
            idx.extend_from_slice(&tp.partition.to_be_bytes());
            idx.extend_from_slice(&s.first_offset.to_be_bytes());
            idx.extend_from_slice(&s.last_offset.to_be_bytes());
            idx.extend_from_slice(&s.bytes.to_be_bytes());
            idx.extend_from_slice(&s.max_ts.to_be_bytes());
            idx.extend_from_slice(&(s.entries.len() as u32).to_be_bytes());
            for e in &s.entries {
                idx.extend_from_slice(&e.offset.to_be_bytes());
                idx.extend_from_slice(&e.seq.to_be_bytes());
                idx.extend_from_slice(&e.pos.to_be_bytes());
                idx.extend_from_slice(&e.max_ts_before.to_be_bytes());
            }
        }
        idx.extend_from_slice(&(self.marks.len() as u32).to_be_bytes());
        for (seq, pos) in &self.marks {
            idx.extend_from_slice(&seq.to_be_bytes());
            idx.extend_from_slice(&pos.to_be_bytes());
        }
        let mut f = [0u8; FOOTER_BYTES as usize];
        f[0..8].copy_from_slice(&self.pos.to_be_bytes());
        f[8..16].copy_from_slice(&(idx.len() as u64).to_be_bytes());
        f[16..24].copy_from_slice(&self.first_seq.unwrap_or(0).to_be_bytes());
        f[24..32].copy_from_slice(&self.end_seq.to_be_bytes());
        f[32..40].copy_from_slice(&self.frames.to_be_bytes());
        f[40..44].copy_from_slice(&crc32fast::hash(&idx).to_be_bytes());
        let crc = crc32fast::hash(&f[0..44]);
        f[44..48].copy_from_slice(&crc.to_be_bytes());
        f[48..56].copy_from_slice(FOOTER_MAGIC);
        self.file.write_all(&idx).map_err(io)?;
        self.file.write_all(&f).map_err(io)?;
        let file = self.file.into_inner().map_err(|e| StoreError::Io { path: self.path.display().to_string(), source: e.into_error() })?;
        Ok((self.path, file.into_file()))
    }
}

/// An opened store: its index in memory, the file ready for positioned
/// reads of its frames.
#[derive(Debug)]
pub struct Store {
    pub window: u64,
    pub store: u32,
    pub path: PathBuf,
    /// End of the frames (where the index starts).
    pub frames_end: u64,
    pub file_len: u64,
    pub first_seq: u64,
    pub end_seq: u64,
    pub frames: u64,
    pub tps: HashMap<Tp, StoreTp>,
    pub marks: Vec<(u64, u64)>,
}

impl Store {
    /// Opens and verifies a store's header, footer and index.
    pub fn open(disk: &dyn Disk, path: &Path) -> Result<Store, StoreError> {
        let io = |source| StoreError::Io { path: path.display().to_string(), source };
        let bad = |why: String| StoreError::Corrupt { path: path.display().to_string(), why };
        let file = disk.open(path, Mode::Read).map_err(io)?;
        let file_len = file.len().map_err(io)?;
        if file_len < FILE_HEADER_BYTES + FOOTER_BYTES {
            return Err(bad(format!("{file_len} bytes is shorter than header and footer")));
        }
        let mut h = [0u8; FILE_HEADER_BYTES as usize];
        file.read_exact_at(&mut h, 0).map_err(io)?;
        if &h[0..8] != MAGIC {
            return Err(bad("wrong magic".into()));
        }
        if u32::from_be_bytes(h[28..32].try_into().unwrap()) != crc32fast::hash(&h[0..28]) {
            return Err(bad("header checksum mismatch".into()));
        }
        let version = u16::from_be_bytes([h[8], h[9]]);
        if version != FORMAT_VERSION {
            return Err(bad(format!("unknown format version {version}")));
        }
        let window = u64::from_be_bytes(h[12..20].try_into().unwrap());
        let store = u32::from_be_bytes(h[20..24].try_into().unwrap());
        let mut f = [0u8; FOOTER_BYTES as usize];
        file.read_exact_at(&mut f, file_len - FOOTER_BYTES).map_err(io)?;
        if &f[48..56] != FOOTER_MAGIC {
            return Err(bad("no footer (the write did not finish)".into()));
        }
        if u32::from_be_bytes(f[44..48].try_into().unwrap()) != crc32fast::hash(&f[0..44]) {
            return Err(bad("footer checksum mismatch".into()));
        }
        let u = |r: std::ops::Range<usize>| u64::from_be_bytes(f[r].try_into().unwrap());
        let (index_pos, index_len, first_seq, end_seq, frames) = (u(0..8), u(8..16), u(16..24), u(24..32), u(32..40));
        if index_pos < FILE_HEADER_BYTES || index_pos.checked_add(index_len).and_then(|x| x.checked_add(FOOTER_BYTES)) != Some(file_len) {
            return Err(bad(format!("index at {index_pos}+{index_len} does not end at the footer")));
        }
        let mut idx = vec![0u8; index_len as usize];
        file.read_exact_at(&mut idx, index_pos).map_err(io)?;
        if crc32fast::hash(&idx) != u32::from_be_bytes(f[40..44].try_into().unwrap()) {
            return Err(bad("index checksum mismatch".into()));
        }
        let (tps, marks) = parse_index(&idx, index_pos).map_err(|why| bad(why.to_string()))?;
        // The file closes here: readers open it through the storage's
        // descriptor cache when they need it.
        drop(file);
        Ok(Store { window, store, path: path.to_owned(), frames_end: index_pos, file_len, first_seq, end_seq, frames, tps, marks })
    }

    /// Where to start walking for the first frame with sequence `seq` or later.
    pub fn mark_for(&self, seq: u64) -> u64 {
        let i = self.marks.partition_point(|&(s, _)| s <= seq);
        if i == 0 { FILE_HEADER_BYTES } else { self.marks[i - 1].1 }
    }

    /// Reads every frame and checks its checksum (tests and `fsck`-style
    /// checks; reads do not pay for it).
    pub fn verify_frames(&self, disk: &dyn Disk) -> Result<u64, StoreError> {
        let file = disk.open(&self.path, Mode::Read).map_err(|source| StoreError::Io { path: self.path.display().to_string(), source })?;
        let mut pos = FILE_HEADER_BYTES;
        let mut n = 0;
        let mut h = [0u8; FRAME_HEADER_BYTES];
        let mut last = None;
        while pos < self.frames_end {
            let bad = |why: String| StoreError::Corrupt { path: self.path.display().to_string(), why };
            segment::read_full_at(&*file, &mut h, pos).map_err(|source| StoreError::Io { path: self.path.display().to_string(), source })?;
            let fh = FrameHeader::decode(&h).ok_or_else(|| bad(format!("bad frame header at {pos}")))?;
            if pos + fh.frame_len as u64 > self.frames_end || last.is_some_and(|l| fh.seq <= l) {
                return Err(bad(format!("frame at {pos} overruns or is out of order")));
            }
            let mut body = vec![0u8; fh.frame_len as usize - 8];
            file.read_exact_at(&mut body, pos + 8).map_err(|source| StoreError::Io { path: self.path.display().to_string(), source })?;
            if crc32fast::hash(&body) != fh.crc {
                return Err(bad(format!("frame checksum mismatch at {pos}")));
            }
            last = Some(fh.seq);
            pos += fh.frame_len as u64;
            n += 1;
        }
        if n != self.frames {
            return Err(StoreError::Corrupt { path: self.path.display().to_string(), why: format!("{n} frames, footer says {}", self.frames) });
        }
        Ok(n)
    }
}

#[allow(clippy::type_complexity)]
fn parse_index(b: &[u8], frames_end: u64) -> Result<(HashMap<Tp, StoreTp>, Vec<(u64, u64)>), &'static str> {
    let mut at = 0usize;
    let take = |at: &mut usize, n: usize| -> Result<&[u8], &'static str> {
        let s = b.get(*at..*at + n).ok_or("index truncated")?;
        *at += n;
        Ok(s)
    };
    let u32_ = |s: &[u8]| u32::from_be_bytes(s.try_into().unwrap());
    let u64_ = |s: &[u8]| u64::from_be_bytes(s.try_into().unwrap());
    let count = u32_(take(&mut at, 4)?) as usize;
    // Every tp needs at least its fixed part and one entry.
    if count > (b.len() - at) / (TP_BYTES + ENTRY_BYTES) {
        return Err("tp count exceeds the index");
    }
    let mut tps = HashMap::with_capacity_and_hasher(count, Default::default());
    for _ in 0..count {
        let t = take(&mut at, TP_BYTES)?;
        let tp = Tp { topic: t[0..16].try_into().unwrap(), partition: u32_(&t[16..20]) as i32 };
        let (first_offset, last_offset) = (u64_(&t[20..28]) as i64, u64_(&t[28..36]) as i64);
        let (bytes, max_ts) = (u64_(&t[36..44]), u64_(&t[44..52]) as i64);
        let n = u32_(&t[52..56]) as usize;
        if n == 0 || n > (b.len() - at) / ENTRY_BYTES {
            return Err("entry count out of range");
        }
        let mut entries = Vec::with_capacity(n);
        for _ in 0..n {
            let e = take(&mut at, ENTRY_BYTES)?;
            let entry = Entry { offset: u64_(&e[0..8]) as i64, seq: u64_(&e[8..16]), pos: u64_(&e[16..24]), max_ts_before: u64_(&e[24..32]) as i64 };
            if entry.pos < FILE_HEADER_BYTES || entry.pos >= frames_end || entries.last().is_some_and(|l: &Entry| l.offset >= entry.offset || l.pos >= entry.pos) {
                return Err("index entry out of order or outside the frames");
            }
            entries.push(entry);
        }
        if first_offset > last_offset || entries[0].offset < first_offset || tps.insert(tp, StoreTp { first_offset, last_offset, bytes, max_ts, entries }).is_some() {
            return Err("tp offsets inconsistent or repeated");
        }
    }
    let n = u32_(take(&mut at, 4)?) as usize;
    if n > (b.len() - at) / MARK_BYTES {
        return Err("mark count exceeds the index");
    }
    let mut marks = Vec::with_capacity(n);
    for _ in 0..n {
        let m = take(&mut at, MARK_BYTES)?;
        marks.push((u64_(&m[0..8]), u64_(&m[8..16])));
    }
    if at != b.len() {
        return Err("bytes after the index");
    }
    Ok((tps, marks))
}

/// Syncs a finished store file and renames it to its final name.
pub fn sync_and_rename(disk: &dyn Disk, file: &FileRef, from: &Path, to: &Path) -> Result<(), StoreError> {
    let io = |source| StoreError::Io { path: from.display().to_string(), source };
    file.sync_all().map_err(io)?;
    disk.rename(from, to).map_err(io)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::disk::RealDisk;
    use crate::protocol::batch::tests::make_batch;

    fn frame(seq: u64, topic: u8, offset: i64, n: usize) -> (FrameHeader, Vec<u8>) {
        let mut out = Vec::new();
        let vals: Vec<Vec<u8>> = (0..n).map(|i| vec![b'v'; 20 + i]).collect();
        let refs: Vec<&[u8]> = vals.iter().map(|v| v.as_slice()).collect();
        let fh = segment::encode_frame(&mut out, seq, &[topic; 16], 0, offset, segment::Patch::default(), &make_batch(&refs, 100));
        (fh, out)
    }

    fn write(dir: &Path) -> PathBuf {
        let path = dir.join(file_name(3, 1));
        let mut w = StoreWriter::create(&RealDisk, &path, 3, 1, 4096).unwrap();
        let mut offsets = [0i64; 3];
        for seq in 0..300u64 {
            let t = (seq % 3) as usize;
            let (fh, bytes) = frame(seq * 2, t as u8, offsets[t], 4);
            offsets[t] += 4;
            w.push(&fh, &bytes).unwrap();
        }
        let (path, _) = w.finish().unwrap();
        path
    }

    #[test]
    fn round_trip() {
        let dir = tempfile::tempdir().unwrap();
        let path = write(dir.path());
        assert_eq!(parse_file_name(path.file_name().unwrap().to_str().unwrap()), Some((3, 1)));
        let s = Store::open(&RealDisk, &path).unwrap();
        assert_eq!((s.window, s.store, s.first_seq, s.end_seq, s.frames), (3, 1, 0, 599, 300));
        assert_eq!(s.verify_frames(&RealDisk).unwrap(), 300);
        assert_eq!(s.tps.len(), 3);
        let t0 = &s.tps[&Tp { topic: [0; 16], partition: 0 }];
        assert_eq!((t0.first_offset, t0.last_offset), (0, 399));
        assert!(t0.entries.len() > 1 && t0.entries.windows(2).all(|w| w[0].offset < w[1].offset));
        assert!(s.marks.len() > 1);
        assert_eq!(s.mark_for(0), FILE_HEADER_BYTES);
    }

    #[test]
    fn damage_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = write(dir.path());
        let good = std::fs::read(&path).unwrap();
        let len = good.len();
        let check = |bytes: &[u8], what: &str| {
            std::fs::write(&path, bytes).unwrap();
            match Store::open(&RealDisk, &path) {
                Err(StoreError::Corrupt { .. }) => {}
                other => panic!("{what}: {other:?}"),
            }
        };
        check(&good[..len - 1], "truncated by one byte");
        check(&good[..len / 2], "cut in half");
        check(&good[..40], "header only");
        let mut b = good.clone();
        b[3] ^= 1;
        check(&b, "header magic");
        let mut b = good.clone();
        b[len - 20] ^= 1;
        check(&b, "footer crc");
        let mut b = good.clone();
        let index_pos = u64::from_be_bytes(good[len - 56..len - 48].try_into().unwrap()) as usize;
        b[index_pos + 2] ^= 0x40;
        check(&b, "index byte");
        // An index whose counts lie, with checksums recomputed to match.
        let mut b = good.clone();
        b[index_pos..index_pos + 4].copy_from_slice(&u32::MAX.to_be_bytes());
        let idx_crc = crc32fast::hash(&b[index_pos..len - 56]);
        b[len - 16..len - 12].copy_from_slice(&idx_crc.to_be_bytes());
        let f_crc = crc32fast::hash(&b[len - 56..len - 12]);
        b[len - 12..len - 8].copy_from_slice(&f_crc.to_be_bytes());
        check(&b, "tp count of u32::MAX");
        // Frame damage is found by verification.
        let mut b = good.clone();
        b[FILE_HEADER_BYTES as usize + 100] ^= 1;
        std::fs::write(&path, &b).unwrap();
        assert!(Store::open(&RealDisk, &path).unwrap().verify_frames(&RealDisk).is_err());
    }
}
