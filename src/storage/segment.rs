//! Branch-log segment files: the on-disk format and the two ways of reading
//! one back (a shallow walk of frame headers, a deep scan that verifies every
//! checksum and finds a torn tail).
//!
//! A segment holds the batches of every topic of one branch, in stream order,
//! each behind a small frame header of ours. The stored Kafka batch is
//! byte-for-byte what the producer sent, except `baseOffset` (and, for
//! LogAppendTime topics, the timestamp fields).
//!
//! # Format, version 1 (all integers big-endian)
//!
//! ```text
//! file header, 32 bytes
//!   0  magic            8 bytes  b"CNPYSEG\0"
//!   8  format version   u16      1
//!  10  reserved         u16      0
//!  12  base stream seq  u64      sequence number of the first frame this file may hold
//!  20  created at       i64      milliseconds since the epoch (drives time-based roll)
//!  28  header crc       u32      crc32 (IEEE, crc32fast) of bytes 0..28
//!
//! frame, 56 bytes + batch, repeated to the end of the file
//!   0  frame length     u32      bytes of the whole frame, this field included
//!   4  frame crc        u32      crc32 (IEEE) of bytes 8..frame length
//!   8  stream seq       u64      broker-wide, strictly increasing within the file
//!  16  topic id         16 bytes the topic's UUID (a re-created topic gets a new one)
//!  32  partition        i32
//!  36  base offset      i64      equal to the batch's own baseOffset
//!  44  last offset delta i32     equal to the batch's own lastOffsetDelta
//!  48  max timestamp    i64      the batch's maxTimestamp (after LogAppendTime rewrite)
//!  56  batch            the v2 RecordBatch, frame length - 56 bytes
//! ```
//!
//! The frame checksum is ours (crc32fast); the batch keeps its own CRC-32C,
//! which the fetch path hands to clients untouched. A frame whose length or
//! checksum does not verify ends the valid part of the file: recovery
//! truncates there.

use std::io::{self, Read};
use std::path::Path;

use super::disk::{Disk, FileRef, Mode, Reader};
pub use super::disk::read_full_at;
use super::TopicId;

pub const FORMAT_VERSION: u16 = 1;
pub const MAGIC: &[u8; 8] = b"CNPYSEG\0";
pub const FILE_HEADER_BYTES: u64 = 32;
pub const FRAME_HEADER_BYTES: usize = 56;
/// A tp's batch gets an index entry (in segments and stores alike) when
/// the tp's previous entry is more than this many bytes back in the file,
/// so a batch without an entry always lies within this distance after the
/// entry before it.
pub const MAX_SCAN_GAP: u64 = 256 * 1024;

const _: () = assert!(FRAME_HEADER_BYTES == 4 + 4 + 8 + 16 + 4 + 8 + 4 + 8);

/// Everything in a frame header, decoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameHeader {
    pub frame_len: u32,
    pub crc: u32,
    pub seq: u64,
    pub topic_id: TopicId,
    pub partition: i32,
    pub base_offset: i64,
    pub last_offset_delta: i32,
    pub max_timestamp: i64,
}

impl FrameHeader {
    pub fn batch_len(&self) -> usize {
        self.frame_len as usize - FRAME_HEADER_BYTES
    }
    pub fn last_offset(&self) -> i64 {
        self.base_offset + self.last_offset_delta as i64
    }

    pub fn decode(b: &[u8]) -> Option<FrameHeader> {
        if b.len() < FRAME_HEADER_BYTES {
            return None;
        }
        let frame_len = u32::from_be_bytes(b[0..4].try_into().ok()?);
        if (frame_len as usize) < FRAME_HEADER_BYTES + crate::protocol::batch::HEADER_BYTES {
            return None;
        }
        Some(FrameHeader {
            frame_len,
            crc: u32::from_be_bytes(b[4..8].try_into().ok()?),
            seq: u64::from_be_bytes(b[8..16].try_into().ok()?),
            topic_id: b[16..32].try_into().ok()?,
            partition: i32::from_be_bytes(b[32..36].try_into().ok()?),
            base_offset: i64::from_be_bytes(b[36..44].try_into().ok()?),
            last_offset_delta: i32::from_be_bytes(b[44..48].try_into().ok()?),
            max_timestamp: i64::from_be_bytes(b[48..56].try_into().ok()?),
        })
    }
}

/// What a leader changes in a batch it appends, besides `baseOffset`.
#[derive(Debug, Clone, Copy, Default)]
pub struct Patch {
    /// LogAppendTime: the timestamps, rewritten the way Kafka does.
    pub log_append_time: Option<i64>,
    /// Its `partitionLeaderEpoch`.
    pub leader_epoch: Option<i32>,
}

/// Appends one frame to `out`: the header, then a copy of `batch` with its
/// `baseOffset` set and `patch` applied. Patching the copy means the request buffer is never
/// written to and every byte is copied exactly once.
pub fn encode_frame(
    out: &mut Vec<u8>,
    seq: u64,
    topic_id: &TopicId,
    partition: i32,
    base_offset: i64,
    patch: Patch,
    batch: &[u8],
) -> FrameHeader {
    use crate::protocol::batch as kb;
    let header = kb::BatchHeader::parse(batch).expect("validated batch");
    let start = out.len();
    let frame_len = u32::try_from(FRAME_HEADER_BYTES + batch.len()).expect("batch under 4 GiB");
    out.extend_from_slice(&[0; FRAME_HEADER_BYTES]);
    out.extend_from_slice(batch);
    let stored = &mut out[start + FRAME_HEADER_BYTES..];
    kb::set_base_offset(stored, base_offset);
    if let Some(epoch) = patch.leader_epoch {
        kb::set_partition_leader_epoch(stored, epoch);
    }
    let max_timestamp = match patch.log_append_time {
        Some(now_ms) => {
            kb::set_log_append_time(stored, now_ms);
            now_ms
        }
        None => header.max_timestamp,
    };
    let fh = FrameHeader {
        frame_len,
        crc: 0,
        seq,
        topic_id: *topic_id,
        partition,
        base_offset,
        last_offset_delta: header.last_offset_delta,
        max_timestamp,
    };
    let h = &mut out[start..start + FRAME_HEADER_BYTES];
    h[0..4].copy_from_slice(&frame_len.to_be_bytes());
    h[8..16].copy_from_slice(&seq.to_be_bytes());
    h[16..32].copy_from_slice(topic_id);
    h[32..36].copy_from_slice(&partition.to_be_bytes());
    h[36..44].copy_from_slice(&base_offset.to_be_bytes());
    h[44..48].copy_from_slice(&header.last_offset_delta.to_be_bytes());
    h[48..56].copy_from_slice(&max_timestamp.to_be_bytes());
    let crc = crc32fast::hash(&out[start + 8..]);
    out[start + 4..start + 8].copy_from_slice(&crc.to_be_bytes());
    FrameHeader { crc, ..fh }
}

/// The decoded file header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileHeader {
    pub base_seq: u64,
    pub created_ms: i64,
}

pub fn encode_file_header(h: &FileHeader) -> [u8; FILE_HEADER_BYTES as usize] {
    let mut b = [0u8; FILE_HEADER_BYTES as usize];
    b[0..8].copy_from_slice(MAGIC);
    b[8..10].copy_from_slice(&FORMAT_VERSION.to_be_bytes());
    b[12..20].copy_from_slice(&h.base_seq.to_be_bytes());
    b[20..28].copy_from_slice(&h.created_ms.to_be_bytes());
    let crc = crc32fast::hash(&b[0..28]);
    b[28..32].copy_from_slice(&crc.to_be_bytes());
    b
}

#[derive(Debug, thiserror::Error)]
pub enum SegmentError {
    #[error("segment {path}: {source}")]
    Io { path: String, source: io::Error },
    #[error("segment {path}: bad file header ({why}); move the file away to start without it")]
    BadHeader { path: String, why: &'static str },
}

pub fn decode_file_header(b: &[u8], path: &Path) -> Result<FileHeader, SegmentError> {
    let bad = |why| SegmentError::BadHeader { path: path.display().to_string(), why };
    if b.len() < FILE_HEADER_BYTES as usize {
        return Err(bad("file shorter than its header"));
    }
    if &b[0..8] != MAGIC {
        return Err(bad("wrong magic"));
    }
    let crc = u32::from_be_bytes(b[28..32].try_into().unwrap());
    if crc != crc32fast::hash(&b[0..28]) {
        return Err(bad("header checksum mismatch"));
    }
    let version = u16::from_be_bytes([b[8], b[9]]);
    if version != FORMAT_VERSION {
        return Err(bad("unknown format version"));
    }
    Ok(FileHeader {
        base_seq: u64::from_be_bytes(b[12..20].try_into().unwrap()),
        created_ms: i64::from_be_bytes(b[20..28].try_into().unwrap()),
    })
}

/// Creates a new, empty segment file with its header written and synced.
/// A file that could not be finished is removed, so a later attempt at
/// the same name starts afresh.
pub fn create(disk: &dyn Disk, path: &Path, header: &FileHeader) -> Result<FileRef, SegmentError> {
    let io = |source| SegmentError::Io { path: path.display().to_string(), source };
    let file = disk.open(path, Mode::CreateNew).map_err(io)?;
    let written = file.write_all_at(&encode_file_header(header), 0).and_then(|_| file.sync_all());
    if let Err(e) = written {
        drop(file);
        let _ = disk.remove_file(path);
        return Err(io(e));
    }
    Ok(file)
}

/// What a scan of one segment found.
pub struct Scan {
    pub header: FileHeader,
    pub file: FileRef,
    /// Frames in file order with their positions.
    pub frames: Vec<(u64, FrameHeader)>,
    /// End of the last valid frame.
    pub valid_len: u64,
    /// Length of the file as found.
    pub file_len: u64,
}

/// Opens a segment and walks its frames. With `deep`, every frame's checksum
/// is verified by reading the whole file sequentially; without, only the
/// headers are read (one positioned read each) and lengths are checked.
/// Either way the walk stops at the first frame that does not verify.
pub fn scan(disk: &dyn Disk, path: &Path, deep: bool) -> Result<Scan, SegmentError> {
    let (header, file, file_len) = open(disk, path)?;
    scan_from(path, header, file, file_len, deep, FILE_HEADER_BYTES, None)
}

/// Opens a segment for recovery (read and write: a torn tail is cut) and
/// decodes its file header. Returns the header, the file and its length.
pub fn open(disk: &dyn Disk, path: &Path) -> Result<(FileHeader, FileRef, u64), SegmentError> {
    let io = |source| SegmentError::Io { path: path.display().to_string(), source };
    let file = disk.open(path, Mode::Write).map_err(io)?;
    let file_len = file.len().map_err(io)?;
    let mut hb = [0u8; FILE_HEADER_BYTES as usize];
    let n = read_full_at(&*file, &mut hb, 0).map_err(io)?;
    let header = decode_file_header(&hb[..n], path)?;
    Ok((header, file, file_len))
}

/// [`scan`] of an opened segment from the frame at `from`, which follows
/// the frame with sequence number `last_seq` (`None`: the first frame).
pub fn scan_from(path: &Path, header: FileHeader, file: FileRef, file_len: u64, deep: bool, from: u64, last_seq: Option<u64>) -> Result<Scan, SegmentError> {
    let io = |source| SegmentError::Io { path: path.display().to_string(), source };
    let mut frames = Vec::new();
    let mut pos = from.max(FILE_HEADER_BYTES);
    let mut last_seq = last_seq;
    if deep {
        let mut reader = io::BufReader::with_capacity(1 << 20, Reader::new(&*file, pos));
        let mut body = Vec::new();
        loop {
            let mut h = [0u8; FRAME_HEADER_BYTES];
            if !read_exact_or_eof(&mut reader, &mut h).map_err(io)? {
                break;
            }
            let Some(fh) = FrameHeader::decode(&h) else { break };
            if pos + fh.frame_len as u64 > file_len || !seq_follows(last_seq, fh.seq) {
                break;
            }
            body.resize(fh.batch_len(), 0);
            if !read_exact_or_eof(&mut reader, &mut body).map_err(io)? {
                break;
            }
            let mut hasher = crc32fast::Hasher::new();
            hasher.update(&h[8..]);
            hasher.update(&body);
            if hasher.finalize() != fh.crc || !batch_matches(&fh, &body) {
                break;
            }
            frames.push((pos, fh));
            last_seq = Some(fh.seq);
            pos += fh.frame_len as u64;
        }
    } else {
        let mut h = [0u8; FRAME_HEADER_BYTES];
        while pos + FRAME_HEADER_BYTES as u64 <= file_len {
            if read_full_at(&*file, &mut h, pos).map_err(io)? < FRAME_HEADER_BYTES {
                break;
            }
            let Some(fh) = FrameHeader::decode(&h) else { break };
            if pos + fh.frame_len as u64 > file_len || !seq_follows(last_seq, fh.seq) {
                break;
            }
            frames.push((pos, fh));
            last_seq = Some(fh.seq);
            pos += fh.frame_len as u64;
        }
    }
    Ok(Scan { header, file, frames, valid_len: pos, file_len })
}

fn seq_follows(last: Option<u64>, seq: u64) -> bool {
    last.is_none_or(|l| seq > l)
}

/// The frame header repeats fields of the batch; a mismatch means the frame
/// is not what we wrote.
fn batch_matches(fh: &FrameHeader, batch: &[u8]) -> bool {
    match crate::protocol::batch::BatchHeader::parse(batch) {
        Ok(b) => b.size == batch.len() && b.base_offset == fh.base_offset && b.last_offset_delta == fh.last_offset_delta,
        Err(_) => false,
    }
}

fn read_exact_or_eof(r: &mut impl Read, buf: &mut [u8]) -> io::Result<bool> {
    let mut got = 0;
    while got < buf.len() {
        match r.read(&mut buf[got..]) {
            Ok(0) => return Ok(false),
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::disk::RealDisk;
    use crate::protocol::batch::tests::make_batch;
    use std::io::Write;

    fn write_segment(path: &Path, frames: usize, tail: &[u8]) -> Vec<u8> {
        let mut bytes = encode_file_header(&FileHeader { base_seq: 7, created_ms: 1 }).to_vec();
        for i in 0..frames {
            let b = make_batch(&[format!("v{i}").as_bytes()], i as i64);
            encode_frame(&mut bytes, 7 + i as u64, &[3; 16], 0, i as i64, Patch::default(), &b);
        }
        bytes.extend_from_slice(tail);
        std::fs::File::create(path).unwrap().write_all(&bytes).unwrap();
        bytes
    }

    #[test]
    fn scans_agree_and_stop_at_garbage() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.seg");
        write_segment(&path, 5, &[0xde, 0xad, 0xbe, 0xef, 0, 0, 0, 0]);
        for deep in [false, true] {
            let s = scan(&RealDisk, &path, deep).unwrap();
            assert_eq!(s.frames.len(), 5, "deep={deep}");
            assert_eq!(s.file_len - s.valid_len, 8);
            assert_eq!(s.frames.iter().map(|(_, f)| f.base_offset).collect::<Vec<_>>(), vec![0, 1, 2, 3, 4]);
        }
    }

    #[test]
    fn bad_file_headers_are_named() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("bad.seg");
        let mut bytes = write_segment(&path, 1, &[]);
        bytes[3] ^= 1;
        std::fs::write(&path, &bytes).unwrap();
        assert!(matches!(scan(&RealDisk, &path, true), Err(SegmentError::BadHeader { why: "wrong magic", .. })));
        std::fs::write(&path, &bytes[..10]).unwrap();
        assert!(matches!(scan(&RealDisk, &path, false), Err(SegmentError::BadHeader { .. })));
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(64))]
        /// Recovery reads whatever a crash left: any damage to the frames
        /// region stops the scan at a frame boundary, never panics, and a
        /// deep scan never keeps a frame whose checksum fails.
        #[test]
        fn damaged_segments_never_panic(at in 0usize..2000, byte in proptest::prelude::any::<u8>(), cut in 0usize..2000) {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("d.seg");
            let mut bytes = write_segment(&path, 6, &[]);
            let i = FILE_HEADER_BYTES as usize + at % (bytes.len() - FILE_HEADER_BYTES as usize);
            bytes[i] ^= byte | 1;
            bytes.truncate(bytes.len() - cut % (bytes.len() - FILE_HEADER_BYTES as usize));
            std::fs::write(&path, &bytes).unwrap();
            let shallow = scan(&RealDisk, &path, false).unwrap();
            let deep = scan(&RealDisk, &path, true).unwrap();
            proptest::prop_assert!(deep.frames.len() <= shallow.frames.len());
            proptest::prop_assert!(deep.valid_len <= deep.file_len);
            for (pos, f) in &deep.frames {
                let end = *pos as usize + f.frame_len as usize;
                proptest::prop_assert_eq!(crc32fast::hash(&bytes[*pos as usize + 8..end]), f.crc);
            }
        }
    }
}
