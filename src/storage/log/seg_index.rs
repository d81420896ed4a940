//! Segment index files: what recovery learns from a segment, kept beside
//! it, so a restart reads one small file per segment instead of walking
//! every frame header (millions of positioned reads with the page cache
//! cold).
//!
//! `<base seq>.idx` sits beside `<base seq>.seg` and describes the
//! segment's frames up to a *covered length*: the tps it holds (last
//! offset, bytes, largest timestamp), their index entries, and the
//! segment's stream marks. Recovery takes all that from the file and walks
//! (or, after a crash, deep-scans) only what lies past the covered length.
//!
//! # When it is written, and why it needs no fsync
//!
//! - when a segment is sealed (after the segment itself was synced), by
//!   the writer before it creates the next one, so retention and
//!   compaction, which take only sealed segments, never delete a segment
//!   whose index is still being written;
//! - for an active segment, each time it grew by `index_checkpoint_bytes`
//!   (64 MiB by default): captured by the writer after the flush that
//!   wrote it, written by the next sync after its fsyncs, so what a crash
//!   leaves to deep-scan is bounded;
//! - at a clean stop, after the last sync, for each branch's active
//!   segment;
//! - at recovery, for a sealed segment found without one.
//!
//! It only ever describes frames that were durable before it was written,
//! and it is an optimisation, not a record: a file that is missing, torn,
//! or does not match its segment is ignored (and removed), and the segment
//! is walked as it would be without it. So it is written without an fsync:
//! a crash can only lose it or tear it, and a torn file fails its checksum.
//! It is replaced by removing the old one and writing the new one; a crash
//! in between leaves none. Frames appended after it was written lie past
//! its covered length, which recovery walks.
//!
//! A file is trusted only if, beyond its own checksum, it names the
//! segment's base sequence number and creation time, its covered length is
//! within the segment, and the segment's frame header at the last frame's
//! position has the sequence number and checksum the file records and ends
//! exactly at the covered length (one positioned read).
//!
//! # Format, version 1 (all integers big-endian)
//!
//! ```text
//! header, 72 bytes
//!   0  magic            8 bytes  b"CNPYIDX\0"
//!   8  format version   u16      1
//!  10  reserved         u16      0
//!  12  base seq         u64      the segment's (its file header says the same)
//!  20  created at       i64      the segment's
//!  28  covered length   u64      the frames described end here
//!  36  frames           u64      how many frames lie before the covered length
//!  44  end seq          u64      one past the last frame's sequence number (0: no frames)
//!  52  last frame pos   u64      where the last frame starts (0: no frames)
//!  60  last frame crc   u32      its frame checksum
//!  64  marks            u32      stream marks that follow
//!  68  tps              u32      tp records that follow the marks
//! mark, 16 bytes: stream seq u64, position u64
//! tp record, 56 bytes and 32 per entry
//!   0  topic id         16 bytes
//!  16  partition        i32
//!  20  last offset      i64      of the tp's last batch in the segment
//!  28  bytes            u64      frame bytes of the tp in the segment
//!  36  max timestamp    i64      largest of the tp's batches in the segment
//!  44  since entry      u64      frame bytes from its last entry on (spaces the next)
//!  52  entries          u32      index entries that follow
//!  56  entry            offset i64, stream seq u64, position u64,
//!                       largest timestamp of the tp before it i64
//! trailer: crc32 (IEEE, crc32fast) u32 of every byte before it
//! ```
//!
//! Counts are checked against the file's length before anything is
//! allocated; positions, sequence numbers and offsets are checked against
//! the header. The entries' earlier-timestamp field is what the writer
//! knew when it made the entry; after retention dropped older segments it
//! may be larger than what is left, which only makes a time lookup start a
//! little earlier.

use super::*;

pub const MAGIC: &[u8; 8] = b"CNPYIDX\0";
pub const FORMAT_VERSION: u16 = 1;
const HEADER_BYTES: usize = 72;
const MARK_BYTES: usize = 16;
const TP_BYTES: usize = 56;
const ENTRY_BYTES: usize = 32;
const TRAILER_BYTES: usize = 4;
const _: () = assert!(HEADER_BYTES == 8 + 2 + 2 + 8 + 8 + 8 + 8 + 8 + 8 + 4 + 4 + 4);
const _: () = assert!(TP_BYTES == 16 + 4 + 8 + 8 + 8 + 8 + 4);
const _: () = assert!(ENTRY_BYTES == 8 + 8 + 8 + 8);

/// The index file of the segment at `seg_path`.
pub(super) fn index_path(seg_path: &Path) -> PathBuf {
    seg_path.with_extension("idx")
}

/// The last frame before the covered length: where it starts, its
/// sequence number and its frame checksum.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct LastFrame {
    pub pos: u64,
    pub seq: u64,
    pub crc: u32,
}

/// One tp's share of a segment, with its index entries there.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct TpIndex {
    pub tp: Tp,
    pub last_offset: i64,
    pub bytes: u64,
    pub max_ts: i64,
    pub since_entry: u64,
    pub entries: Vec<IndexEntry>,
}

/// What a segment index file holds, decoded.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct SegIndex {
    pub base_seq: u64,
    pub created_ms: i64,
    pub covered_len: u64,
    pub frames: u64,
    pub end_seq: u64,
    pub last: Option<LastFrame>,
    pub marks: Vec<(u64, u64)>,
    pub tps: Vec<TpIndex>,
}

impl PartialEq for IndexEntry {
    fn eq(&self, o: &IndexEntry) -> bool {
        (self.offset, self.seq, self.seg, self.pos, self.max_ts_before) == (o.offset, o.seq, o.seg, o.pos, o.max_ts_before)
    }
}

impl SegIndex {
    pub fn encode(&self) -> Vec<u8> {
        let entries: usize = self.tps.iter().map(|t| t.entries.len()).sum();
        let mut b = Vec::with_capacity(HEADER_BYTES + self.marks.len() * MARK_BYTES + self.tps.len() * TP_BYTES + entries * ENTRY_BYTES + TRAILER_BYTES);
        b.extend_from_slice(MAGIC);
        b.extend_from_slice(&FORMAT_VERSION.to_be_bytes());
        b.extend_from_slice(&0u16.to_be_bytes());
        b.extend_from_slice(&self.base_seq.to_be_bytes());
        b.extend_from_slice(&self.created_ms.to_be_bytes());
        b.extend_from_slice(&self.covered_len.to_be_bytes());
        b.extend_from_slice(&self.frames.to_be_bytes());
        b.extend_from_slice(&self.end_seq.to_be_bytes());
        let last = self.last.unwrap_or(LastFrame { pos: 0, seq: 0, crc: 0 });
        b.extend_from_slice(&last.pos.to_be_bytes());
        b.extend_from_slice(&last.crc.to_be_bytes());
        b.extend_from_slice(&u32::try_from(self.marks.len()).expect("marks fit a u32").to_be_bytes());
        b.extend_from_slice(&u32::try_from(self.tps.len()).expect("tps fit a u32").to_be_bytes());
        debug_assert_eq!(b.len(), HEADER_BYTES);
        for (seq, pos) in &self.marks {
            b.extend_from_slice(&seq.to_be_bytes());
            b.extend_from_slice(&pos.to_be_bytes());
        }
        for t in &self.tps {
            b.extend_from_slice(&t.tp.topic);
            b.extend_from_slice(&t.tp.partition.to_be_bytes());
            b.extend_from_slice(&t.last_offset.to_be_bytes());
            b.extend_from_slice(&t.bytes.to_be_bytes());
            b.extend_from_slice(&t.max_ts.to_be_bytes());
            b.extend_from_slice(&t.since_entry.to_be_bytes());
            b.extend_from_slice(&u32::try_from(t.entries.len()).expect("entries fit a u32").to_be_bytes());
            for e in &t.entries {
                debug_assert_eq!(e.seg, self.base_seq);
                b.extend_from_slice(&e.offset.to_be_bytes());
                b.extend_from_slice(&e.seq.to_be_bytes());
                b.extend_from_slice(&e.pos.to_be_bytes());
                b.extend_from_slice(&e.max_ts_before.to_be_bytes());
            }
        }
        let crc = crc32fast::hash(&b);
        b.extend_from_slice(&crc.to_be_bytes());
        b
    }

    /// Decodes and checks a file's bytes: the checksum, the counts against
    /// the length (before allocating), and every position, sequence number
    /// and offset against the header. The reason when it fails.
    pub fn decode(b: &[u8]) -> Result<SegIndex, &'static str> {
        if b.len() < HEADER_BYTES + TRAILER_BYTES {
            return Err("shorter than its header");
        }
        let (body, trailer) = b.split_at(b.len() - TRAILER_BYTES);
        if &body[0..8] != MAGIC {
            return Err("wrong magic");
        }
        if u32::from_be_bytes(trailer.try_into().expect("4 bytes")) != crc32fast::hash(body) {
            return Err("checksum mismatch");
        }
        let mut r = Cursor { b: body, at: 8 };
        if r.u16() != FORMAT_VERSION {
            return Err("unknown format version");
        }
        if r.u16() != 0 {
            return Err("reserved bytes set");
        }
        let base_seq = r.u64();
        let created_ms = r.i64();
        let covered_len = r.u64();
        let frames = r.u64();
        let end_seq = r.u64();
        let last_pos = r.u64();
        let last_crc = r.u32();
        let marks_n = r.u32() as usize;
        let tps_n = r.u32() as usize;
        if covered_len < FILE_HEADER_BYTES {
            return Err("covered length inside the segment header");
        }
        let last = match (frames, end_seq) {
            (0, 0) if covered_len == FILE_HEADER_BYTES && last_pos == 0 && last_crc == 0 => None,
            (0, _) | (_, 0) => return Err("frame count and end sequence disagree"),
            _ => {
                if end_seq <= base_seq || last_pos < FILE_HEADER_BYTES || last_pos.checked_add(FRAME_HEADER_BYTES as u64).is_none_or(|end| end > covered_len) {
                    return Err("last frame outside the covered length");
                }
                Some(LastFrame { pos: last_pos, seq: end_seq - 1, crc: last_crc })
            }
        };
        let rest = body.len() - HEADER_BYTES;
        if marks_n.checked_mul(MARK_BYTES).is_none_or(|m| m > rest) || tps_n.checked_mul(TP_BYTES).is_none_or(|t| t > rest - marks_n * MARK_BYTES) {
            return Err("counts beyond the file");
        }
        let in_frames = |seq: u64, pos: u64| seq >= base_seq && seq < end_seq && pos >= FILE_HEADER_BYTES && pos < covered_len;
        let mut marks = Vec::with_capacity(marks_n);
        for _ in 0..marks_n {
            let (seq, pos) = (r.u64(), r.u64());
            if !in_frames(seq, pos) || marks.last().is_some_and(|&(s, p)| seq <= s || pos <= p) {
                return Err("stream mark out of place");
            }
            marks.push((seq, pos));
        }
        let mut tps = Vec::with_capacity(tps_n);
        for _ in 0..tps_n {
            if r.left() < TP_BYTES {
                return Err("tp record beyond the file");
            }
            let topic: TopicId = r.take(16).try_into().expect("16 bytes");
            let tp = Tp { topic, partition: r.i32() };
            let (last_offset, bytes, max_ts, since_entry) = (r.i64(), r.u64(), r.i64(), r.u64());
            let n = r.u32() as usize;
            if n.checked_mul(ENTRY_BYTES).is_none_or(|e| e > r.left()) {
                return Err("entries beyond the file");
            }
            let mut entries: Vec<IndexEntry> = Vec::with_capacity(n);
            for _ in 0..n {
                let e = IndexEntry { offset: r.i64(), seq: r.u64(), seg: base_seq, pos: r.u64(), max_ts_before: r.i64() };
                let ordered = entries.last().is_none_or(|p| e.offset > p.offset && e.seq > p.seq && e.pos > p.pos);
                if !in_frames(e.seq, e.pos) || !ordered || e.offset > last_offset || e.offset < 0 {
                    return Err("index entry out of place");
                }
                entries.push(e);
            }
            tps.push(TpIndex { tp, last_offset, bytes, max_ts, since_entry, entries });
        }
        if r.left() != 0 {
            return Err("bytes past the last tp record");
        }
        Ok(SegIndex { base_seq, created_ms, covered_len, frames, end_seq, last, marks, tps })
    }

    /// Whether this file describes the segment opened as `seg`: the same
    /// header, a covered length within the file, and the last frame where
    /// the file says, ending at the covered length.
    pub fn matches(&self, header: &FileHeader, file: &dyn DiskFile, file_len: u64) -> bool {
        if self.base_seq != header.base_seq || self.created_ms != header.created_ms || self.covered_len > file_len {
            return false;
        }
        let Some(last) = self.last else { return true };
        let mut h = [0u8; FRAME_HEADER_BYTES];
        if !matches!(segment::read_full_at(file, &mut h, last.pos), Ok(n) if n == FRAME_HEADER_BYTES) {
            return false;
        }
        FrameHeader::decode(&h).is_some_and(|fh| fh.seq == last.seq && fh.crc == last.crc && last.pos + fh.frame_len as u64 == self.covered_len)
    }
}

/// Decodes an index file's bytes and encodes what it found again (for the
/// fuzz target: a file that decodes is exactly what encoding its contents
/// writes, so no field is ignored on the way in).
pub fn reencode(bytes: &[u8]) -> Result<Vec<u8>, &'static str> {
    SegIndex::decode(bytes).map(|ix| ix.encode())
}

/// Reads big-endian integers from a buffer whose length was checked.
struct Cursor<'a> {
    b: &'a [u8],
    at: usize,
}

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize) -> &'a [u8] {
        let s = &self.b[self.at..self.at + n];
        self.at += n;
        s
    }
    fn left(&self) -> usize {
        self.b.len() - self.at
    }
    fn u16(&mut self) -> u16 {
        u16::from_be_bytes(self.take(2).try_into().expect("2 bytes"))
    }
    fn u32(&mut self) -> u32 {
        u32::from_be_bytes(self.take(4).try_into().expect("4 bytes"))
    }
    fn i32(&mut self) -> i32 {
        self.u32() as i32
    }
    fn u64(&mut self) -> u64 {
        u64::from_be_bytes(self.take(8).try_into().expect("8 bytes"))
    }
    fn i64(&mut self) -> i64 {
        self.u64() as i64
    }
}

/// Reads the index file of the segment at `seg_path` if there is one and
/// it describes the segment as opened; removes one that does not (it
/// would be replaced anyway). `None` means: walk the segment.
pub(super) fn load(disk: &dyn Disk, seg_path: &Path, header: &FileHeader, file: &dyn DiskFile, file_len: u64) -> Option<SegIndex> {
    let path = index_path(seg_path);
    if !disk.exists(&path) {
        return None;
    }
    let read = || -> io::Result<Vec<u8>> {
        let f = disk.open(&path, Mode::Read)?;
        let len = usize::try_from(f.len()?).map_err(|_| io::Error::other("too large"))?;
        // An index is far smaller than its segment; a file claiming more
        // is not one of ours.
        if len as u64 > file_len.max(1 << 20) {
            return Err(io::Error::other("larger than its segment"));
        }
        let mut buf = vec![0u8; len];
        f.read_exact_at(&mut buf, 0)?;
        Ok(buf)
    };
    let why = match read().map_err(|e| e.to_string()).and_then(|b| SegIndex::decode(&b).map_err(str::to_owned)) {
        Ok(ix) if ix.matches(header, file, file_len) => return Some(ix),
        Ok(_) => "does not match its segment".to_owned(),
        Err(e) => e,
    };
    tracing::warn!(path = %path.display(), why, "ignoring a segment index file; walking the segment instead");
    let _ = disk.remove_file(&path);
    None
}

impl Storage {
    /// The index of `seg` as it stands: its tps' published entries into
    /// it, plus `pending` ones (staged, published at the next flush).
    /// `None` while frames are staged into the segment but not written
    /// (what the segment notes at staging would run past its length).
    fn seg_index(&self, seg: &Segment, pending: &[(Arc<Partition>, i64, Option<IndexEntry>)]) -> Option<SegIndex> {
        let base = seg.base_seq;
        let covered_len = seg.len.load(Ordering::Acquire);
        let (marks, last, frames) = {
            let m = seg.marks.lock().expect("segment marks lock");
            (m.sparse.clone(), m.last, m.frames)
        };
        if last.is_some_and(|l| l.pos >= covered_len) {
            return None;
        }
        let shares: Vec<(Tp, SegTp)> = seg.tps.lock().expect("segment tps lock").iter().map(|(tp, s)| (*tp, *s)).collect();
        let mut tps = Vec::with_capacity(shares.len());
        {
            let parts = self.parts.read().expect("parts lock");
            for (tp, s) in shares {
                let mut entries = Vec::new();
                if let Some(part) = parts.get(&tp).filter(|p| !p.deleted.load(Ordering::Acquire)) {
                    let st = part.st.read().expect("partition lock");
                    let from = st.index.partition_point(|e| e.seg < base);
                    let to = st.index.partition_point(|e| e.seg <= base);
                    entries.extend(st.index.range(from..to).copied());
                }
                tps.push(TpIndex { tp, last_offset: s.last_offset, bytes: s.bytes, max_ts: s.max_ts, since_entry: s.since_entry, entries });
            }
        }
        if !pending.is_empty() {
            let at: HashMap<Tp, usize> = tps.iter().enumerate().map(|(i, t)| (t.tp, i)).collect();
            for (part, _, e) in pending {
                if let (Some(e), Some(&i)) = (e, at.get(&part.tp)) {
                    if e.seg == base && !part.deleted.load(Ordering::Acquire) {
                        tps[i].entries.push(*e);
                    }
                }
            }
        }
        Some(SegIndex {
            base_seq: base,
            created_ms: seg.created_ms,
            covered_len,
            frames,
            end_seq: last.map_or(0, |l| l.seq + 1),
            last,
            marks,
            tps,
        })
    }

    /// Writes `seg`'s index file (see the module doc: no fsync, replaced
    /// by remove-then-write). Every frame it describes must be durable.
    /// A failure is logged and costs a walk at the next start, nothing
    /// more.
    pub(super) fn write_seg_index(&self, seg: &Segment, pending: &[(Arc<Partition>, i64, Option<IndexEntry>)]) {
        if let Some(ix) = self.seg_index(seg, pending) {
            self.write_index_file(seg, &ix);
        }
    }

    /// Writes `ix` as `seg`'s index file unless the one there covers as
    /// much already.
    fn write_index_file(&self, seg: &Segment, ix: &SegIndex) {
        let mut indexed = seg.indexed.lock().expect("segment index lock");
        if *indexed >= ix.covered_len {
            return;
        }
        let disk = &*self.cfg.disk;
        let path = index_path(&seg.path);
        let written = (|| -> io::Result<()> {
            if disk.exists(&path) {
                disk.remove_file(&path)?;
            }
            disk.open(&path, Mode::CreateNew)?.write_all_at(&ix.encode(), 0)
        })();
        match written {
            Ok(()) => *indexed = ix.covered_len,
            Err(e) => tracing::warn!(path = %path.display(), error = %e, "writing a segment index file failed; the next start walks the segment"),
        }
    }

    /// Writes the index file of each branch's active segment (the last
    /// step of a clean stop, after the last sync).
    ///
    /// Only what the partitions' indexes fully describe: a segment whose
    /// frames were all written by flushes, which publish the entries with
    /// the write. Frames a roll wrote (sealing the segment before, or
    /// failing to create the next and leaving this one active) have their
    /// entries published only by the next flush: a segment holding such
    /// frames is walked at the next start instead (a sealed one got its
    /// file when it was sealed, with those entries). The simulator found
    /// both: an index written from the published entries alone said a tp
    /// had none there, and reads found nothing below the high watermark.
    pub(super) fn write_seg_indexes(&self) {
        let branches: Vec<Arc<Branch>> = self.branches.read().expect("branches lock").values().cloned().collect();
        for b in branches {
            let active = b.segs.read().expect("branch lock").last().cloned();
            let Some(seg) = active else { continue };
            let len = seg.len.load(Ordering::Acquire);
            if seg.published_len.load(Ordering::Acquire) == len {
                self.write_seg_index(&seg, &[]);
            }
        }
    }

    /// After a flush published `seg`'s entries up to its length: if it grew
    /// by the checkpoint spacing since the last checkpoint, its index as it
    /// stands is queued for the next sync, which writes it once the frames
    /// are durable (the writer's thread does the capture, where nothing is
    /// staged into the segment; the syncer the file).
    pub(super) fn checkpoint(&self, seg: &Arc<Segment>) {
        let len = seg.len.load(Ordering::Acquire);
        if len < seg.checkpoint_queued.load(Ordering::Acquire) + self.cfg.index_checkpoint_bytes || seg.published_len.load(Ordering::Acquire) != len {
            return;
        }
        if let Some(ix) = self.seg_index(seg, &[]) {
            seg.checkpoint_queued.store(len, Ordering::Release);
            self.checkpoints.lock().expect("checkpoints lock").push((seg.clone(), ix));
        }
    }

    /// Writes the checkpoints a sync took, after its fsyncs. Under the
    /// maintenance lock, so retention or compaction cannot delete a
    /// segment while its file is written (a retired one is skipped);
    /// while they run, the checkpoints are dropped (the next ones come).
    pub(super) fn write_checkpoints(&self, checkpoints: Vec<(Arc<Segment>, SegIndex)>) {
        if checkpoints.is_empty() {
            return;
        }
        let Ok(_maintenance) = self.maintenance.try_lock() else { return };
        for (seg, ix) in checkpoints {
            if !seg.file.retired() {
                self.write_index_file(&seg, &ix);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::batch::tests::make_batch;

    fn sample() -> SegIndex {
        let tp = |n: u8| Tp { topic: [n; 16], partition: n as i32 };
        let e = |offset, seq, pos| IndexEntry { offset, seq, seg: 100, pos, max_ts_before: offset * 10 - 1 };
        SegIndex {
            base_seq: 100,
            created_ms: 5,
            covered_len: 9000,
            frames: 4,
            end_seq: 104,
            last: Some(LastFrame { pos: 7000, seq: 103, crc: 0xdead_beef }),
            marks: vec![(100, 32), (102, 4096)],
            tps: vec![
                TpIndex { tp: tp(1), last_offset: 20, bytes: 5000, max_ts: 200, since_entry: 4000, entries: vec![e(0, 100, 32), e(10, 102, 4096)] },
                TpIndex { tp: tp(2), last_offset: 3, bytes: 3000, max_ts: 30, since_entry: 3000, entries: vec![e(0, 101, 2000)] },
                TpIndex { tp: tp(3), last_offset: 7, bytes: 900, max_ts: 1, since_entry: 0, entries: vec![] },
            ],
        }
    }

    #[test]
    fn an_index_decodes_to_what_was_encoded() {
        let ix = sample();
        assert_eq!(SegIndex::decode(&ix.encode()), Ok(ix));
        let empty = SegIndex { base_seq: 9, created_ms: 1, covered_len: FILE_HEADER_BYTES, frames: 0, end_seq: 0, last: None, marks: vec![], tps: vec![] };
        assert_eq!(SegIndex::decode(&empty.encode()), Ok(empty));
    }

    /// A version-1 file as written, checked in (it seeds the fuzz target
    /// too): later versions of this code must still read it.
    #[test]
    fn the_version_1_fixture_still_decodes() {
        let seed = include_bytes!("../../../fuzz/seeds/storage_files/index");
        let ix = SegIndex::decode(&seed[1..]).expect("the fixture decodes");
        assert_eq!((ix.base_seq, ix.covered_len, ix.frames, ix.end_seq), (100, 9000, 4, 104));
        assert_eq!(ix.tps.iter().map(|t| t.entries.len()).collect::<Vec<_>>(), vec![2, 1]);
        assert_eq!(ix.tps[0].since_entry, 4000);
        assert_eq!(ix.encode(), &seed[1..]);
    }

    #[test]
    fn truncated_and_oversized_files_are_refused() {
        let b = sample().encode();
        for cut in 0..b.len() {
            assert!(SegIndex::decode(&b[..cut]).is_err(), "accepted {cut} of {} bytes", b.len());
        }
        let mut long = b.clone();
        long.extend_from_slice(&[0; 8]);
        assert!(SegIndex::decode(&long).is_err());
    }

    /// Fields that pass the checksum (the file was written so) but do not
    /// fit the header are refused, and counts never allocate past the file.
    #[test]
    fn well_formed_nonsense_is_refused() {
        let reencode = |f: &dyn Fn(&mut SegIndex)| {
            let mut ix = sample();
            f(&mut ix);
            SegIndex::decode(&ix.encode())
        };
        assert_eq!(reencode(&|ix| ix.marks[1].1 = 9000), Err("stream mark out of place"));
        assert_eq!(reencode(&|ix| ix.marks[1].0 = 100), Err("stream mark out of place"));
        assert_eq!(reencode(&|ix| ix.tps[0].entries[1].seq = 99), Err("index entry out of place"));
        assert_eq!(reencode(&|ix| ix.tps[0].entries[1].offset = 0), Err("index entry out of place"));
        assert_eq!(reencode(&|ix| ix.tps[0].last_offset = 5), Err("index entry out of place"));
        assert_eq!(reencode(&|ix| ix.last = Some(LastFrame { pos: 8990, seq: 103, crc: 1 })), Err("last frame outside the covered length"));
        assert_eq!(reencode(&|ix| ix.frames = 0), Err("frame count and end sequence disagree"));
        // A last frame so far out that its end overflows (found by the fuzz target).
        assert_eq!(reencode(&|ix| ix.last = Some(LastFrame { pos: u64::MAX - 8, seq: 103, crc: 1 })), Err("last frame outside the covered length"));
        // A count claiming 2^32 - 1 records, with the checksum fixed up.
        let mut b = sample().encode();
        b[68..72].copy_from_slice(&u32::MAX.to_be_bytes());
        let n = b.len() - 4;
        let crc = crc32fast::hash(&b[..n]);
        b[n..].copy_from_slice(&crc.to_be_bytes());
        assert_eq!(SegIndex::decode(&b), Err("counts beyond the file"));
    }

    /// Everything recovery rebuilds, in a stable order: per segment its
    /// length, marks, last frame and shares; per tp its offsets and index.
    fn dump(s: &Storage) -> String {
        use std::fmt::Write;
        let mut out = String::new();
        let mut branches: Vec<(String, Arc<Branch>)> = s.branches.read().unwrap().iter().map(|(n, b)| (n.clone(), b.clone())).collect();
        branches.sort_by(|a, b| a.0.cmp(&b.0));
        for (name, b) in branches {
            for seg in b.segs.read().unwrap().iter() {
                let m = seg.marks.lock().unwrap();
                let mut tps: Vec<(Tp, SegTp)> = seg.tps.lock().unwrap().iter().map(|(t, s)| (*t, *s)).collect();
                tps.sort_by_key(|t| t.0);
                writeln!(out, "{name} {} len {} end {} marks {:?} last {:?} frames {} {tps:?}", seg.base_seq, seg.len.load(Ordering::Acquire), seg.end_seq.load(Ordering::Acquire), m.sparse, m.last, m.frames).unwrap();
            }
        }
        let mut parts: Vec<Arc<Partition>> = s.parts.read().unwrap().values().cloned().collect();
        parts.sort_by_key(|p| p.tp);
        for p in parts {
            let st = p.st.read().unwrap();
            writeln!(out, "{:?} start {} leo {} hw {} {:?}", p.tp, st.log_start, st.leo, st.hw, st.index).unwrap();
        }
        out
    }

    fn index_files(dir: &Path) -> Vec<PathBuf> {
        let mut found = Vec::new();
        for b in std::fs::read_dir(dir.join("log")).unwrap() {
            for f in std::fs::read_dir(b.unwrap().path()).unwrap() {
                let f = f.unwrap().path();
                if f.extension().is_some_and(|x| x == "idx") {
                    found.push(f);
                }
            }
        }
        found.sort();
        found
    }

    fn copy_dir(from: &Path, to: &Path) {
        std::fs::create_dir_all(to).unwrap();
        for e in std::fs::read_dir(from).unwrap() {
            let e = e.unwrap();
            if e.file_type().unwrap().is_dir() {
                copy_dir(&e.path(), &to.join(e.file_name()));
            } else {
                std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
            }
        }
    }

    /// Opens `dir` as it is, and a copy of it without index files, and
    /// checks that both recover the same state and hand out the same next
    /// offsets and sequence numbers. Returns the first.
    fn open_both(dir: &Path, cfg: &StorageConfig, specs: &[PartitionSpec], clean: bool) -> (Arc<Storage>, LogWriter) {
        let copy = tempfile::tempdir().unwrap();
        copy_dir(dir, copy.path());
        for f in index_files(copy.path()) {
            std::fs::remove_file(f).unwrap();
        }
        let (walked, mut ww) = Storage::open(copy.path(), cfg.clone(), specs.to_vec(), clean).unwrap();
        let files = index_files(dir).len();
        let (read, mut rw) = Storage::open(dir, cfg.clone(), specs.to_vec(), clean).unwrap();
        // Every file was read but the (at most two) damaged ones.
        assert!(read.recovery_report().indexed_segments + 2 >= files, "{} of {files} index files read", read.recovery_report().indexed_segments);
        let (a, b) = (dump(&read), dump(&walked));
        if let Some((x, y)) = a.lines().zip(b.lines()).find(|(x, y)| x != y) {
            panic!("recovered from index files:\n{x}\nby walking:\n{y}");
        }
        assert_eq!(a.lines().count(), b.lines().count());
        assert_eq!(read.recovery_report().frames, walked.recovery_report().frames);
        assert_eq!(walked.recovery_report().indexed_segments, 0);
        // Walking wrote the sealed segments' index files: they say the same.
        let (a, b) = (index_files(copy.path()).len(), index_files(dir).len());
        assert!(a <= b, "{a} index files after walking, {b} after reading");
        for spec in specs {
            assert_eq!(rw.next_offset(&spec.tp), ww.next_offset(&spec.tp));
        }
        let probe = make_batch(&[b"probe"], 1);
        let t = specs[0].tp;
        let (x, y) = (rw.append(t, &probe, 0, false).unwrap(), ww.append(t, &probe, 0, false).unwrap());
        assert_eq!((x.base_offset, x.seq), (y.base_offset, y.seq));
        drop((walked, ww, rw));
        // The probe is dropped unflushed: reopen as the caller asked.
        Storage::open(dir, cfg.clone(), specs.to_vec(), clean).unwrap()
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(24))]
        /// Recovery by index files finds exactly what walking the frames
        /// finds: clean and unclean, with active segments that grew past
        /// what their file covers, and with index files damaged or swapped
        /// (which are ignored).
        #[test]
        fn recovery_from_index_files_equals_recovery_by_walking(
            rounds in proptest::collection::vec(proptest::collection::vec((0usize..5, 1usize..6, 10usize..700), 1..60), 2..4),
            interval in proptest::prop_oneof![proptest::strategy::Just(4096u64), 1u64..3000],
            clean in proptest::prelude::any::<bool>(),
            damage in 0u8..3,
        ) {
            let dir = tempfile::tempdir().unwrap();
            let specs: Vec<PartitionSpec> = [(1, 0, "a.x"), (1, 1, "a.x"), (2, 0, "a.y"), (3, 0, "a.x"), (4, 0, "b.z")]
                .iter()
                .map(|&(n, p, b)| PartitionSpec { tp: Tp { topic: [n; 16], partition: p }, branch: b.into(), log_start: 0 })
                .collect();
            let cfg = StorageConfig { segment_bytes: 3000, index_interval_bytes: interval, index_checkpoint_bytes: 700, ..StorageConfig::default() };
            let (mut s, mut w) = Storage::open(dir.path(), cfg.clone(), specs.clone(), true).unwrap();
            for (r, round) in rounds.iter().enumerate() {
                for (i, &(t, n, len)) in round.iter().enumerate() {
                    let vals: Vec<Vec<u8>> = (0..n).map(|k| vec![b'a' + (k % 26) as u8; len]).collect();
                    let refs: Vec<&[u8]> = vals.iter().map(|v| v.as_slice()).collect();
                    w.append(specs[t].tp, &make_batch(&refs, (r * 1000 + i) as i64 * 7 % 5000), 0, false).unwrap();
                    if i % 5 == 4 {
                        let f = w.flush().unwrap();
                        s.publish_hw(&f);
                    }
                }
                let f = w.flush().unwrap();
                s.publish_hw(&f);
                s.sync().unwrap();
                if clean {
                    s.mark_clean().unwrap();
                }
                drop((s, w));
                let found = index_files(dir.path());
                match (damage, found.len()) {
                    (1, n) if n > 0 => {
                        let f = &found[r % n];
                        let mut b = std::fs::read(f).unwrap();
                        let i = b.len() / 2;
                        b[i] ^= 0x40;
                        std::fs::write(f, b).unwrap();
                    }
                    (2, n) if n > 1 => {
                        let (a, b) = (std::fs::read(&found[0]).unwrap(), std::fs::read(&found[1]).unwrap());
                        std::fs::write(&found[0], b).unwrap();
                        std::fs::write(&found[1], a).unwrap();
                    }
                    _ => {}
                }
                (s, w) = open_both(dir.path(), &cfg, &specs, clean);
                s.clear_clean_marker().unwrap();
            }
        }
    }

    /// The active segment's index file is written again as it grows, once
    /// its frames are synced: after a crash, recovery deep-scans only what
    /// lies past the last one, not the whole segment.
    #[test]
    fn a_crash_deep_scans_only_past_the_last_checkpoint() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = StorageConfig { index_checkpoint_bytes: 4096, ..StorageConfig::default() };
        let tp = Tp { topic: [1; 16], partition: 0 };
        let specs = vec![PartitionSpec { tp, branch: "a.x".into(), log_start: 0 }];
        let total = {
            let (s, mut w) = Storage::open(dir.path(), cfg.clone(), specs.clone(), true).unwrap();
            for round in 0..20 {
                for i in 0..10 {
                    w.append(tp, &make_batch(&[&[b'a' + (i % 26) as u8; 400][..]], round), 0, false).unwrap();
                }
                let f = w.flush().unwrap();
                s.sync().unwrap();
                s.publish_hw(&f);
            }
            // One more round written and never synced.
            w.append(tp, &make_batch(&[b"last"], 99), 0, false).unwrap();
            let f = w.flush().unwrap();
            s.publish_hw(&f);
            assert_eq!(s.segment_count(), 1);
            s.offsets(&tp).unwrap().2
        };
        // No clean stop: the next open deep-scans the active segment.
        let (s, _w) = Storage::open(dir.path(), cfg, specs, false).unwrap();
        let r = s.recovery_report().clone();
        assert_eq!((r.indexed_segments, r.segments), (1, 1), "{r:?}");
        assert!(r.bytes > 80_000, "{r:?}");
        assert!(r.deep_scanned_bytes > 0 && r.deep_scanned_bytes < 2 * 4096, "deep-scanned {} of {} bytes", r.deep_scanned_bytes, r.bytes);
        assert_eq!(s.offsets(&tp).unwrap().2, total, "everything written is recovered");
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(256))]
        /// Any damage is refused by the checksum or the checks, never a panic.
        #[test]
        fn damaged_indexes_never_panic(at in 0usize..1000, byte in 1u8.., fix_crc in proptest::prelude::any::<bool>()) {
            let mut b = sample().encode();
            let i = at % b.len();
            b[i] ^= byte;
            if fix_crc && i < b.len() - 4 {
                let n = b.len() - 4;
                let crc = crc32fast::hash(&b[..n]);
                b[n..].copy_from_slice(&crc.to_be_bytes());
            }
            if let Ok(ix) = SegIndex::decode(&b) {
                proptest::prop_assert!(fix_crc, "damage passed the checksum");
                proptest::prop_assert!(ix.tps.len() <= 3 && ix.marks.len() <= 2);
            }
        }
    }
}
