//! A view over one Kafka v2 `RecordBatch`, and the only two rewrites the
//! broker ever makes to a produced batch.
//!
//! Canopy stores batches verbatim (DESIGN.md, "Batches stored verbatim"), so
//! this module never decodes records on the append or fetch path. It checks
//! the header against the bytes present, verifies the CRC-32C that covers
//! `attributes..end`, and patches `baseOffset` (outside the CRC) or, for
//! LogAppendTime topics, the timestamp fields (inside it: CRC recomputed).
//!
//! Layout of the v2 header (big-endian), offsets in bytes:
//!
//! ```text
//!  0 baseOffset           i64   ─┐ not covered by the CRC
//!  8 batchLength          i32    │ bytes after this field
//! 12 partitionLeaderEpoch i32    │
//! 16 magic                i8     │ must be 2
//! 17 crc                  u32   ─┘ CRC-32C of bytes 21..end
//! 21 attributes           i16      bits 0-2 codec, 3 timestamp type, 4 transactional, 5 control
//! 23 lastOffsetDelta      i32
//! 27 baseTimestamp        i64
//! 35 maxTimestamp         i64
//! 43 producerId           i64
//! 51 producerEpoch        i16
//! 53 baseSequence         i32
//! 57 recordsCount         i32
//! 61 records…
//! ```

use thiserror::Error;

/// Size of the fixed v2 batch header.
pub const HEADER_BYTES: usize = 61;
/// Bytes before `batchLength`'s coverage starts (baseOffset + batchLength).
pub const LOG_OVERHEAD: usize = 12;

const OFF_BASE_OFFSET: usize = 0;
const OFF_BATCH_LENGTH: usize = 8;
const OFF_PARTITION_LEADER_EPOCH: usize = 12;
const OFF_MAGIC: usize = 16;
const OFF_CRC: usize = 17;
const OFF_ATTRIBUTES: usize = 21;
const OFF_LAST_OFFSET_DELTA: usize = 23;
const OFF_BASE_TIMESTAMP: usize = 27;
const OFF_MAX_TIMESTAMP: usize = 35;
const OFF_PRODUCER_ID: usize = 43;
const OFF_PRODUCER_EPOCH: usize = 51;
const OFF_BASE_SEQUENCE: usize = 53;
const OFF_RECORDS_COUNT: usize = 57;

const ATTR_COMPRESSION_MASK: i16 = 0x07;
pub const ATTR_TIMESTAMP_TYPE: i16 = 0x08;
const ATTR_TRANSACTIONAL: i16 = 0x10;
const ATTR_CONTROL: i16 = 0x20;
/// KIP-534: the base timestamp is the batch's delete horizon (set by log
/// compaction on batches holding tombstones).
pub const ATTR_DELETE_HORIZON: i16 = 0x40;

const _: () = assert!(OFF_RECORDS_COUNT + 4 == HEADER_BYTES);
const _: () = assert!(OFF_CRC + 4 == OFF_ATTRIBUTES);

#[derive(Debug, Error, PartialEq, Eq, Clone)]
pub enum BatchError {
    #[error("batch truncated: {present} bytes present, {needed} needed")]
    Truncated { present: usize, needed: usize },
    #[error("batch length field {0} is invalid")]
    BadLength(i32),
    #[error("unsupported record batch magic {0} (only v2 is accepted)")]
    BadMagic(i8),
    #[error("batch CRC mismatch: header says {stored:#010x}, bytes give {computed:#010x}")]
    BadCrc { stored: u32, computed: u32 },
    #[error("records count {count} does not match lastOffsetDelta {last_offset_delta}")]
    BadCount { count: i32, last_offset_delta: i32 },
    #[error("batch of {size} bytes is over the limit of {limit}")]
    TooLarge { size: usize, limit: usize },
    #[error("produce request carried no record batch")]
    Empty,
    #[error("clients may not produce control batches")]
    ControlBatch,
    #[error("record {index} of the batch is malformed: {why}")]
    BadRecord { index: i32, why: &'static str },
    #[error(transparent)]
    Inflate(#[from] super::compression::InflateError),
}

/// The codec of a batch (its low attribute bits); it lives with the
/// codecs, which know nothing of batches.
pub use super::compression::Compression;

/// A checked view over the header of one batch. Cheap to copy; holds no bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchHeader {
    pub base_offset: i64,
    /// Total size of the batch in bytes, including the 12-byte log overhead.
    pub size: usize,
    /// The epoch of the leader that appended it; -1 from producers.
    pub partition_leader_epoch: i32,
    pub attributes: i16,
    pub last_offset_delta: i32,
    pub base_timestamp: i64,
    pub max_timestamp: i64,
    pub producer_id: i64,
    pub producer_epoch: i16,
    pub base_sequence: i32,
    pub records_count: i32,
}

impl BatchHeader {
    /// Parses a header without verifying the CRC. `buf` must start at a
    /// batch; bytes past the batch are ignored.
    pub fn parse(buf: &[u8]) -> Result<BatchHeader, BatchError> {
        if buf.len() < HEADER_BYTES {
            return Err(BatchError::Truncated { present: buf.len(), needed: HEADER_BYTES });
        }
        let batch_length = get_i32(buf, OFF_BATCH_LENGTH);
        if batch_length < (HEADER_BYTES - LOG_OVERHEAD) as i32 {
            return Err(BatchError::BadLength(batch_length));
        }
        let magic = buf[OFF_MAGIC] as i8;
        if magic != 2 {
            return Err(BatchError::BadMagic(magic));
        }
        let size = LOG_OVERHEAD + batch_length as usize;
        if buf.len() < size {
            return Err(BatchError::Truncated { present: buf.len(), needed: size });
        }
        Ok(BatchHeader {
            base_offset: get_i64(buf, OFF_BASE_OFFSET),
            size,
            partition_leader_epoch: get_i32(buf, OFF_PARTITION_LEADER_EPOCH),
            attributes: get_i16(buf, OFF_ATTRIBUTES),
            last_offset_delta: get_i32(buf, OFF_LAST_OFFSET_DELTA),
            base_timestamp: get_i64(buf, OFF_BASE_TIMESTAMP),
            max_timestamp: get_i64(buf, OFF_MAX_TIMESTAMP),
            producer_id: get_i64(buf, OFF_PRODUCER_ID),
            producer_epoch: get_i16(buf, OFF_PRODUCER_EPOCH),
            base_sequence: get_i32(buf, OFF_BASE_SEQUENCE),
            records_count: get_i32(buf, OFF_RECORDS_COUNT),
        })
    }

    pub fn compression(&self) -> Compression {
        match (self.attributes & ATTR_COMPRESSION_MASK) as u8 {
            0 => Compression::None,
            1 => Compression::Gzip,
            2 => Compression::Snappy,
            3 => Compression::Lz4,
            4 => Compression::Zstd,
            other => Compression::Unknown(other),
        }
    }

    pub fn is_log_append_time(&self) -> bool {
        self.attributes & ATTR_TIMESTAMP_TYPE != 0
    }
    pub fn is_transactional(&self) -> bool {
        self.attributes & ATTR_TRANSACTIONAL != 0
    }
    pub fn is_control(&self) -> bool {
        self.attributes & ATTR_CONTROL != 0
    }
    /// The delete horizon compaction set (KIP-534), if any.
    pub fn delete_horizon(&self) -> Option<i64> {
        (self.attributes & ATTR_DELETE_HORIZON != 0).then_some(self.base_timestamp)
    }
    /// Offset of the last record, given the (possibly patched) base offset.
    pub fn last_offset(&self) -> i64 {
        self.base_offset + self.last_offset_delta as i64
    }
    /// Number of offsets this batch occupies.
    pub fn offset_count(&self) -> i64 {
        self.last_offset_delta as i64 + 1
    }
}

/// Checks one batch's shape: its header, its length against `buf`
/// (exactly one batch) and its CRC-32C. What a replica checks of its
/// leader's batches; a produced batch gets [`validate`].
pub fn check_shape(buf: &[u8]) -> Result<BatchHeader, BatchError> {
    let header = BatchHeader::parse(buf)?;
    if header.size != buf.len() {
        return Err(BatchError::BadLength(get_i32(buf, OFF_BATCH_LENGTH)));
    }
    let stored = get_u32(buf, OFF_CRC);
    let computed = crc32c::crc32c(&buf[OFF_ATTRIBUTES..]);
    if stored != computed {
        return Err(BatchError::BadCrc { stored, computed });
    }
    Ok(header)
}

/// Validates one produced batch fully: header, sizes, CRC-32C and the
/// records-count/offset-delta relationship. `buf` must be exactly one batch.
pub fn validate(buf: &[u8], max_bytes: usize) -> Result<BatchHeader, BatchError> {
    if buf.len() > max_bytes {
        return Err(BatchError::TooLarge { size: buf.len(), limit: max_bytes });
    }
    let header = check_shape(buf)?;
    if header.last_offset_delta < 0
        || header.records_count <= 0
        || header.records_count as i64 != header.last_offset_delta as i64 + 1
    {
        return Err(BatchError::BadCount {
            count: header.records_count,
            last_offset_delta: header.last_offset_delta,
        });
    }
    Ok(header)
}

/// Checks the records of a validated batch, inflating them (bounded by
/// `max_bytes`) if the batch is compressed: exactly `records_count`
/// records, each parsing to its stated length, with offset deltas 0, 1, …
/// as Kafka requires of produced batches. Returns the smallest and largest
/// record timestamp.
pub fn validate_records(buf: &[u8], header: &BatchHeader, max_bytes: usize) -> Result<(i64, i64), BatchError> {
    check_records(&records_of(buf, header, max_bytes)?, header)
}

/// The records section of a validated batch: borrowed when uncompressed,
/// inflated (bounded by `max_bytes`) when compressed.
pub fn records_of<'a>(buf: &'a [u8], header: &BatchHeader, max_bytes: usize) -> Result<std::borrow::Cow<'a, [u8]>, BatchError> {
    let body = &buf[HEADER_BYTES..header.size];
    Ok(match header.compression() {
        Compression::None => std::borrow::Cow::Borrowed(body),
        codec => std::borrow::Cow::Owned(super::compression::inflate(codec, body, max_bytes)?),
    })
}

/// Walks the (inflated) `records` of a batch with `header`; returns the
/// smallest and largest record timestamp.
pub fn check_records(records: &[u8], header: &BatchHeader) -> Result<(i64, i64), BatchError> {
    let (min, max) = walk_records(records, header.records_count)?;
    Ok((header.base_timestamp.saturating_add(min), header.base_timestamp.saturating_add(max)))
}

/// The batch `buf` with its records section replaced by `records`, which
/// are compressed with `codec`: header fields kept, length, compression
/// bits and CRC rewritten.
pub fn with_records(buf: &[u8], records: &[u8], codec: Compression) -> Vec<u8> {
    let bits: i16 = match codec {
        Compression::None | Compression::Unknown(_) => 0,
        Compression::Gzip => 1,
        Compression::Snappy => 2,
        Compression::Lz4 => 3,
        Compression::Zstd => 4,
    };
    let mut out = Vec::with_capacity(HEADER_BYTES + records.len());
    out.extend_from_slice(&buf[..HEADER_BYTES]);
    out.extend_from_slice(records);
    let length = (out.len() - LOG_OVERHEAD) as i32;
    out[OFF_BATCH_LENGTH..OFF_BATCH_LENGTH + 4].copy_from_slice(&length.to_be_bytes());
    let attributes = (get_i16(buf, OFF_ATTRIBUTES) & !ATTR_COMPRESSION_MASK) | bits;
    out[OFF_ATTRIBUTES..OFF_ATTRIBUTES + 2].copy_from_slice(&attributes.to_be_bytes());
    let crc = crc32c::crc32c(&out[OFF_ATTRIBUTES..]);
    out[OFF_CRC..OFF_CRC + 4].copy_from_slice(&crc.to_be_bytes());
    out
}

/// Walks `count` records; returns the smallest and largest timestamp delta.
/// On the produce path for every record (about 20 ns of a 100 B record's
/// cost), so the fields are read through a cursor, not re-sliced.
fn walk_records(mut rest: &[u8], count: i32) -> Result<(i64, i64), BatchError> {
    let (mut min_ts, mut max_ts) = (i64::MAX, i64::MIN);
    for index in 0..count {
        let bad = |why| BatchError::BadRecord { index, why };
        let (len, n) = varint(rest).ok_or(bad("length"))?;
        let len = usize::try_from(len).map_err(|_| bad("negative length"))?;
        let rec = rest[n..].get(..len).ok_or(bad("length past the end of the batch"))?;
        rest = &rest[n + len..];
        if rec.is_empty() {
            return Err(bad("empty"));
        }
        // attributes (one byte), timestamp delta, offset delta, key, value,
        // headers.
        let mut c = Cursor { rec, p: 1 };
        let ts = c.varint().ok_or(bad("timestamp delta"))?;
        min_ts = min_ts.min(ts);
        max_ts = max_ts.max(ts);
        if c.varint().ok_or(bad("offset delta"))? != index as i64 {
            return Err(bad("offset delta out of sequence"));
        }
        c.nullable_bytes().ok_or(bad("key"))?;
        c.nullable_bytes().ok_or(bad("value"))?;
        let headers = c.varint().ok_or(bad("header count"))?;
        if headers < 0 || headers as usize > rec.len() {
            return Err(bad("header count"));
        }
        for _ in 0..headers {
            let klen = c.varint().ok_or(bad("header key"))?;
            if klen < 0 {
                return Err(bad("header key"));
            }
            c.skip(klen as usize).ok_or(bad("header key"))?;
            c.nullable_bytes().ok_or(bad("header value"))?;
        }
        if c.p != rec.len() {
            return Err(bad("bytes left over"));
        }
    }
    if !rest.is_empty() {
        return Err(BatchError::BadRecord { index: count, why: "bytes after the last record" });
    }
    Ok((min_ts, max_ts))
}

/// What a record-level rule needs of one record: its index in the batch,
/// its timestamp (base timestamp plus delta) and whether its key is null.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecordFacts {
    pub index: i32,
    pub timestamp: i64,
    pub null_key: bool,
}

/// Each record of the (inflated) records of a batch that
/// [`check_records`] accepted. Stops early, and short, only if they were
/// not accepted (a debug assertion then).
pub fn record_facts<'a>(records: &'a [u8], header: &BatchHeader) -> impl Iterator<Item = RecordFacts> + 'a {
    let base = header.base_timestamp;
    let mut rest = records;
    let mut index = 0;
    let count = header.records_count;
    std::iter::from_fn(move || {
        if index >= count {
            return None;
        }
        let facts = (|| {
            let (len, n) = varint(rest)?;
            let rec = rest.get(n..)?.get(..usize::try_from(len).ok()?)?;
            rest = &rest[n + rec.len()..];
            let mut c = Cursor { rec, p: 1 };
            let ts = c.varint()?;
            c.varint()?;
            let null_key = c.varint()? == -1;
            Some(RecordFacts { index, timestamp: base.saturating_add(ts), null_key })
        })();
        debug_assert!(facts.is_some(), "record_facts walks only accepted records");
        index += 1;
        facts
    })
}

/// Splits the `records` field of a produce partition into its batches,
/// checking each header against the bytes present. Nothing is allocated per
/// wire length: each item is a sub-slice of `buf`.
pub fn split(buf: &[u8]) -> impl Iterator<Item = Result<&[u8], BatchError>> {
    let mut rest = buf;
    std::iter::from_fn(move || {
        if rest.is_empty() {
            return None;
        }
        match BatchHeader::parse(rest) {
            Ok(h) => {
                let (one, tail) = rest.split_at(h.size);
                rest = tail;
                Some(Ok(one))
            }
            Err(e) => {
                rest = &[];
                Some(Err(e))
            }
        }
    })
}

/// Rewrites `baseOffset`. It lies outside the CRC, so nothing else changes.
pub fn set_base_offset(buf: &mut [u8], base_offset: i64) {
    debug_assert!(buf.len() >= HEADER_BYTES);
    buf[OFF_BASE_OFFSET..OFF_BASE_OFFSET + 8].copy_from_slice(&base_offset.to_be_bytes());
}

/// Rewrites `partitionLeaderEpoch`, which a leader stamps on append. It
/// lies outside the CRC too.
pub fn set_partition_leader_epoch(buf: &mut [u8], epoch: i32) {
    debug_assert!(buf.len() >= HEADER_BYTES);
    buf[OFF_PARTITION_LEADER_EPOCH..OFF_PARTITION_LEADER_EPOCH + 4].copy_from_slice(&epoch.to_be_bytes());
}

/// Marks the batch as LogAppendTime with `now_ms` as its max timestamp, the
/// way Kafka does, and recomputes the CRC over the changed bytes.
pub fn set_log_append_time(buf: &mut [u8], now_ms: i64) {
    debug_assert!(buf.len() >= HEADER_BYTES);
    let attributes = get_i16(buf, OFF_ATTRIBUTES) | ATTR_TIMESTAMP_TYPE;
    buf[OFF_ATTRIBUTES..OFF_ATTRIBUTES + 2].copy_from_slice(&attributes.to_be_bytes());
    buf[OFF_MAX_TIMESTAMP..OFF_MAX_TIMESTAMP + 8].copy_from_slice(&now_ms.to_be_bytes());
    let crc = crc32c::crc32c(&buf[OFF_ATTRIBUTES..]);
    buf[OFF_CRC..OFF_CRC + 4].copy_from_slice(&crc.to_be_bytes());
}

/// Walks the records of an uncompressed batch and returns the offset delta
/// and timestamp of each record, without allocating. `None` if the batch is
/// compressed or its records do not parse.
pub fn record_timestamps(buf: &[u8]) -> Option<Vec<(i32, i64)>> {
    let header = BatchHeader::parse(buf).ok()?;
    if header.compression() != Compression::None {
        return None;
    }
    let mut out = Vec::with_capacity((header.records_count.max(0) as usize).min(buf.len()));
    let mut pos = HEADER_BYTES;
    for _ in 0..header.records_count {
        let (len, n) = varint(&buf[pos.min(buf.len())..])?;
        let start = pos + n;
        let end = start.checked_add(usize::try_from(len).ok()?)?;
        if end > header.size {
            return None;
        }
        let rec = &buf[start..end];
        let mut p = 1; // attributes byte
        let (ts_delta, n) = varint(rec.get(p..)?)?;
        p += n;
        let (off_delta, _) = varint(rec.get(p..)?)?;
        out.push((i32::try_from(off_delta).ok()?, header.base_timestamp.checked_add(ts_delta)?));
        pos = end;
    }
    Some(out)
}

/// A transaction marker: what a control batch's one record says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Marker {
    Abort,
    Commit,
}

/// Builds the control batch (transactional, control, one record) that ends
/// producer `producer_id`'s transaction on a partition, as Kafka writes it:
/// key = version 0 + type (0 abort, 1 commit), value = version 0 +
/// coordinator epoch. Base offset 0: the log assigns it.
pub fn control_batch(marker: Marker, producer_id: i64, epoch: i16, coordinator_epoch: i32, now_ms: i64) -> Vec<u8> {
    let kind: i16 = match marker {
        Marker::Abort => 0,
        Marker::Commit => 1,
    };
    // attributes, timestamp delta 0, offset delta 0, key (4), value (6), no headers.
    let mut record = vec![0u8, 0, 0, 4 << 1];
    record.extend_from_slice(&0i16.to_be_bytes());
    record.extend_from_slice(&kind.to_be_bytes());
    record.push(6 << 1);
    record.extend_from_slice(&0i16.to_be_bytes());
    record.extend_from_slice(&coordinator_epoch.to_be_bytes());
    record.push(0);
    let mut out = Vec::with_capacity(HEADER_BYTES + 1 + record.len());
    let header = NewBatch {
        base_offset: 0,
        attributes: ATTR_TRANSACTIONAL | ATTR_CONTROL,
        last_offset_delta: 0,
        base_timestamp: now_ms,
        max_timestamp: now_ms,
        producer_id,
        producer_epoch: epoch,
        base_sequence: -1,
        records_count: 1,
    };
    out.extend_from_slice(&header.header());
    out.push((record.len() as u8) << 1);
    out.extend_from_slice(&record);
    seal(&mut out);
    out
}

/// The header fields of a batch the broker builds itself.
#[derive(Debug, Clone, Copy)]
pub struct NewBatch {
    pub base_offset: i64,
    pub attributes: i16,
    pub last_offset_delta: i32,
    pub base_timestamp: i64,
    pub max_timestamp: i64,
    pub producer_id: i64,
    pub producer_epoch: i16,
    pub base_sequence: i32,
    pub records_count: i32,
}

impl NewBatch {
    /// The v2 header, with batchLength and CRC left for [`seal`].
    pub fn header(&self) -> [u8; HEADER_BYTES] {
        let mut h = [0u8; HEADER_BYTES];
        h[OFF_BASE_OFFSET..OFF_BASE_OFFSET + 8].copy_from_slice(&self.base_offset.to_be_bytes());
        h[OFF_MAGIC] = 2;
        h[OFF_ATTRIBUTES..OFF_ATTRIBUTES + 2].copy_from_slice(&self.attributes.to_be_bytes());
        h[OFF_LAST_OFFSET_DELTA..OFF_LAST_OFFSET_DELTA + 4].copy_from_slice(&self.last_offset_delta.to_be_bytes());
        h[OFF_BASE_TIMESTAMP..OFF_BASE_TIMESTAMP + 8].copy_from_slice(&self.base_timestamp.to_be_bytes());
        h[OFF_MAX_TIMESTAMP..OFF_MAX_TIMESTAMP + 8].copy_from_slice(&self.max_timestamp.to_be_bytes());
        h[OFF_PRODUCER_ID..OFF_PRODUCER_ID + 8].copy_from_slice(&self.producer_id.to_be_bytes());
        h[OFF_PRODUCER_EPOCH..OFF_PRODUCER_EPOCH + 2].copy_from_slice(&self.producer_epoch.to_be_bytes());
        h[OFF_BASE_SEQUENCE..OFF_BASE_SEQUENCE + 4].copy_from_slice(&self.base_sequence.to_be_bytes());
        h[OFF_RECORDS_COUNT..OFF_RECORDS_COUNT + 4].copy_from_slice(&self.records_count.to_be_bytes());
        h
    }
}

/// One record to build a batch from (the REST bridge's input).
#[derive(Debug, Clone, Default)]
pub struct NewRecord<'a> {
    pub key: Option<&'a [u8]>,
    pub value: Option<&'a [u8]>,
    pub headers: Vec<(&'a str, Option<&'a [u8]>)>,
}

/// An uncompressed v2 batch of `records`, all with CreateTime `timestamp`,
/// base offset 0 (the log assigns offsets) and no producer id.
pub fn build(records: &[NewRecord<'_>], timestamp: i64) -> Vec<u8> {
    let bytes = |out: &mut Vec<u8>, b: Option<&[u8]>| match b {
        Some(b) => {
            put_varint(out, b.len() as i64);
            out.extend_from_slice(b);
        }
        None => put_varint(out, -1),
    };
    let h = NewBatch {
        base_offset: 0,
        attributes: 0,
        last_offset_delta: records.len() as i32 - 1,
        base_timestamp: timestamp,
        max_timestamp: timestamp,
        producer_id: -1,
        producer_epoch: -1,
        base_sequence: -1,
        records_count: records.len() as i32,
    };
    let mut out = h.header().to_vec();
    let mut rec = Vec::new();
    for (i, r) in records.iter().enumerate() {
        rec.clear();
        rec.push(0); // attributes
        put_varint(&mut rec, 0); // timestamp delta
        put_varint(&mut rec, i as i64); // offset delta
        bytes(&mut rec, r.key);
        bytes(&mut rec, r.value);
        put_varint(&mut rec, r.headers.len() as i64);
        for (k, v) in &r.headers {
            bytes(&mut rec, Some(k.as_bytes()));
            bytes(&mut rec, *v);
        }
        put_varint(&mut out, rec.len() as i64);
        out.extend_from_slice(&rec);
    }
    seal(&mut out);
    out
}

/// Makes `buf` (a whole batch, as [`build`] returns it) an idempotent
/// producer's: its producer id, epoch and base sequence set, sealed again.
pub fn set_producer(buf: &mut [u8], producer_id: i64, epoch: i16, base_sequence: i32) {
    buf[OFF_PRODUCER_ID..OFF_PRODUCER_ID + 8].copy_from_slice(&producer_id.to_be_bytes());
    buf[OFF_PRODUCER_EPOCH..OFF_PRODUCER_EPOCH + 2].copy_from_slice(&epoch.to_be_bytes());
    buf[OFF_BASE_SEQUENCE..OFF_BASE_SEQUENCE + 4].copy_from_slice(&base_sequence.to_be_bytes());
    seal(buf);
}

/// [`set_producer`], and marks the batch transactional.
pub fn set_transactional(buf: &mut [u8], producer_id: i64, epoch: i16, base_sequence: i32) {
    let attributes = i16::from_be_bytes([buf[OFF_ATTRIBUTES], buf[OFF_ATTRIBUTES + 1]]) | ATTR_TRANSACTIONAL;
    buf[OFF_ATTRIBUTES..OFF_ATTRIBUTES + 2].copy_from_slice(&attributes.to_be_bytes());
    set_producer(buf, producer_id, epoch, base_sequence);
}

/// Fills in batchLength and the CRC-32C of the whole batch in `buf` (a
/// [`NewBatch::header`] followed by its records).
pub fn seal(buf: &mut [u8]) {
    let length = (buf.len() - LOG_OVERHEAD) as i32;
    buf[OFF_BATCH_LENGTH..OFF_BATCH_LENGTH + 4].copy_from_slice(&length.to_be_bytes());
    let crc = crc32c::crc32c(&buf[OFF_ATTRIBUTES..]);
    buf[OFF_CRC..OFF_CRC + 4].copy_from_slice(&crc.to_be_bytes());
}

/// The marker a control batch carries; None for any other batch or a
/// control record that does not parse (Kafka ignores unknown types too).
pub fn marker_of(buf: &[u8], header: &BatchHeader) -> Option<Marker> {
    end_marker(buf, header).map(|(m, _)| m)
}

/// [`marker_of`], with the coordinator epoch its value carries (-1 when
/// the value is missing or short: a marker all the same).
pub fn end_marker(buf: &[u8], header: &BatchHeader) -> Option<(Marker, i32)> {
    if !header.is_control() || header.compression() != Compression::None || header.records_count < 1 {
        return None;
    }
    let rest = buf.get(HEADER_BYTES..header.size)?;
    let (len, n) = varint(rest)?;
    let rec = rest.get(n..n + usize::try_from(len).ok()?)?;
    let mut p = 1usize;
    for _ in 0..2 {
        p += varint(rec.get(p..)?)?.1; // timestamp and offset deltas
    }
    let (klen, n) = varint(rec.get(p..)?)?;
    p += n;
    if klen < 4 {
        return None;
    }
    let marker = match i16::from_be_bytes([*rec.get(p + 2)?, *rec.get(p + 3)?]) {
        0 => Marker::Abort,
        1 => Marker::Commit,
        _ => return None,
    };
    // The value: version i16, coordinator epoch i32.
    let coordinator_epoch = (|| {
        let mut v = p + usize::try_from(klen).ok()?;
        let (vlen, n) = varint(rec.get(v..)?)?;
        v += n;
        if vlen < 6 {
            return None;
        }
        Some(i32::from_be_bytes(rec.get(v + 2..v + 6)?.try_into().ok()?))
    })()
    .unwrap_or(-1);
    Some((marker, coordinator_epoch))
}

/// One record of a batch's (inflated) records section, for log compaction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecordView<'a> {
    /// The whole record, its length varint included.
    pub raw: &'a [u8],
    pub offset_delta: i64,
    pub timestamp_delta: i64,
    pub key: Option<&'a [u8]>,
    pub value: Option<&'a [u8]>,
    /// A null value: a tombstone.
    pub tombstone: bool,
}

/// The records of an (inflated) records section, in order; an error for
/// one that does not parse. Unlike [`check_records`] it accepts the gaps
/// in offset deltas that compaction leaves.
pub fn records_view(records: &[u8], count: i32) -> impl Iterator<Item = Result<RecordView<'_>, BatchError>> {
    let mut rest = records;
    let mut index = 0;
    std::iter::from_fn(move || {
        if index >= count {
            return None;
        }
        let i = index;
        index += 1;
        let bad = |why| BatchError::BadRecord { index: i, why };
        let view = (|| {
            let (len, n) = varint(rest)?;
            let end = n.checked_add(usize::try_from(len).ok()?)?;
            let raw = rest.get(..end)?;
            let rec = &raw[n..];
            let mut c = Cursor { rec, p: 1 };
            let timestamp_delta = c.varint()?;
            let offset_delta = c.varint()?;
            let key = c.bytes()?;
            let value = c.bytes()?;
            rest = &rest[end..];
            Some(RecordView { raw, offset_delta, timestamp_delta, key, value, tombstone: value.is_none() })
        })();
        Some(view.ok_or_else(|| {
            index = count;
            bad("does not parse")
        }))
    })
}

/// A batch holding `records` (whole records, as [`RecordView::raw`]) in
/// place of `buf`'s: the other header fields kept, the records count set,
/// compressed with `codec`, sealed. With `horizon`, the batch gets that
/// delete horizon (KIP-534): the base timestamp becomes it and each
/// record's timestamp delta is rebased so its timestamp is unchanged.
pub fn rebuilt(buf: &[u8], records: &[RecordView<'_>], codec: Compression, horizon: Option<i64>) -> Vec<u8> {
    let old_base = get_i64(buf, OFF_BASE_TIMESTAMP);
    let mut body = Vec::with_capacity(records.iter().map(|r| r.raw.len() + 8).sum());
    let mut rec = Vec::new();
    for r in records {
        match horizon {
            None => body.extend_from_slice(r.raw),
            Some(base) => {
                // attributes, then the rebased timestamp delta, then the
                // rest as it was.
                let (len, n) = varint(r.raw).expect("parsed record");
                let old = &r.raw[n..n + len as usize];
                let (_, ts_len) = varint(&old[1..]).expect("parsed record");
                rec.clear();
                rec.push(old[0]);
                put_varint(&mut rec, old_base.saturating_add(r.timestamp_delta).saturating_sub(base));
                rec.extend_from_slice(&old[1 + ts_len..]);
                put_varint(&mut body, rec.len() as i64);
                body.extend_from_slice(&rec);
            }
        }
    }
    let packed = match codec {
        Compression::None | Compression::Unknown(_) => body,
        c => super::compression::compress(c, &body),
    };
    let mut out = with_records(buf, &packed, codec);
    out[OFF_RECORDS_COUNT..OFF_RECORDS_COUNT + 4].copy_from_slice(&(records.len() as i32).to_be_bytes());
    if let Some(base) = horizon {
        let attributes = get_i16(&out, OFF_ATTRIBUTES) | ATTR_DELETE_HORIZON;
        out[OFF_ATTRIBUTES..OFF_ATTRIBUTES + 2].copy_from_slice(&attributes.to_be_bytes());
        out[OFF_BASE_TIMESTAMP..OFF_BASE_TIMESTAMP + 8].copy_from_slice(&base.to_be_bytes());
    }
    seal(&mut out);
    out
}

/// Fields of one record, read in order.
struct Cursor<'a> {
    rec: &'a [u8],
    p: usize,
}

impl<'a> Cursor<'a> {
    #[inline(always)]
    fn varint(&mut self) -> Option<i64> {
        let (v, n) = varint(self.rec.get(self.p..)?)?;
        self.p += n;
        Some(v)
    }

    #[inline(always)]
    fn skip(&mut self, n: usize) -> Option<()> {
        self.p = self.p.checked_add(n).filter(|&e| e <= self.rec.len())?;
        Some(())
    }

    /// A varint length, then that many bytes, returned; -1 is null.
    fn bytes(&mut self) -> Option<Option<&'a [u8]>> {
        match self.varint()? {
            -1 => Some(None),
            len if len >= 0 => {
                let at = self.p;
                self.skip(len as usize)?;
                Some(Some(&self.rec[at..self.p]))
            }
            _ => None,
        }
    }

    /// A varint length, then that many bytes; -1 is null.
    #[inline(always)]
    fn nullable_bytes(&mut self) -> Option<()> {
        match self.varint()? {
            -1 => Some(()),
            len if len >= 0 => self.skip(len as usize),
            _ => None,
        }
    }
}

/// Decodes a zig-zag varint (as used inside records). Returns value and bytes used.
#[inline]
pub fn varint(buf: &[u8]) -> Option<(i64, usize)> {
    // Most deltas and short lengths take one byte.
    if let Some(&b) = buf.first() {
        if b & 0x80 == 0 {
            return Some((((b >> 1) as i64) ^ -((b & 1) as i64), 1));
        }
    }
    varint_multi(buf)
}

fn varint_multi(buf: &[u8]) -> Option<(i64, usize)> {
    let mut raw: u64 = 0;
    for (i, b) in buf.iter().take(10).enumerate() {
        raw |= ((b & 0x7f) as u64) << (7 * i);
        if b & 0x80 == 0 {
            let value = ((raw >> 1) as i64) ^ -((raw & 1) as i64);
            return Some((value, i + 1));
        }
    }
    None
}

fn get_i16(b: &[u8], at: usize) -> i16 {
    i16::from_be_bytes([b[at], b[at + 1]])
}
fn get_i32(b: &[u8], at: usize) -> i32 {
    i32::from_be_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}
fn get_u32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}
fn get_i64(b: &[u8], at: usize) -> i64 {
    i64::from_be_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

/// Appends `v` as a zig-zag varint (the inverse of [`varint`]).
pub fn put_varint(out: &mut Vec<u8>, v: i64) {
    let mut z = ((v << 1) ^ (v >> 63)) as u64;
    loop {
        let b = (z & 0x7f) as u8;
        z >>= 7;
        if z == 0 {
            out.push(b);
            return;
        }
        out.push(b | 0x80);
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// Builds a valid uncompressed batch of `n` records with the given values.
    pub fn make_batch(values: &[&[u8]], base_ts: i64) -> Vec<u8> {
        make_keyed_batch(&vec![None; values.len()], values, base_ts)
    }

    /// [`make_batch`] with a key per record.
    pub fn make_keyed_batch(keys: &[Option<&[u8]>], values: &[&[u8]], base_ts: i64) -> Vec<u8> {
        let mut records = Vec::new();
        for (i, (v, k)) in values.iter().zip(keys).enumerate() {
            let mut rec = vec![0u8];
            put_varint(&mut rec, i as i64); // timestamp delta
            put_varint(&mut rec, i as i64); // offset delta
            match k {
                None => put_varint(&mut rec, -1),
                Some(k) => {
                    put_varint(&mut rec, k.len() as i64);
                    rec.extend_from_slice(k);
                }
            }
            put_varint(&mut rec, v.len() as i64);
            rec.extend_from_slice(v);
            put_varint(&mut rec, 0); // headers
            put_varint(&mut records, rec.len() as i64);
            records.extend_from_slice(&rec);
        }
        let n = values.len() as i32;
        let mut b = Vec::new();
        b.extend_from_slice(&0i64.to_be_bytes());
        b.extend_from_slice(&((HEADER_BYTES - LOG_OVERHEAD + records.len()) as i32).to_be_bytes());
        b.extend_from_slice(&(-1i32).to_be_bytes());
        b.push(2);
        b.extend_from_slice(&0u32.to_be_bytes());
        b.extend_from_slice(&0i16.to_be_bytes());
        b.extend_from_slice(&(n - 1).to_be_bytes());
        b.extend_from_slice(&base_ts.to_be_bytes());
        b.extend_from_slice(&(base_ts + n as i64 - 1).to_be_bytes());
        b.extend_from_slice(&(-1i64).to_be_bytes());
        b.extend_from_slice(&(-1i16).to_be_bytes());
        b.extend_from_slice(&(-1i32).to_be_bytes());
        b.extend_from_slice(&n.to_be_bytes());
        b.extend_from_slice(&records);
        let crc = crc32c::crc32c(&b[OFF_ATTRIBUTES..]);
        b[OFF_CRC..OFF_CRC + 4].copy_from_slice(&crc.to_be_bytes());
        b
    }

    #[test]
    fn record_facts_give_each_records_index_timestamp_and_key() {
        let b = make_keyed_batch(&[Some(b"k"), None, Some(b"")], &[b"a", b"b", b"c"], 1_000);
        let h = validate(&b, 1 << 20).unwrap();
        let records = records_of(&b, &h, 1 << 20).unwrap();
        check_records(&records, &h).unwrap();
        let facts: Vec<_> = record_facts(&records, &h).map(|f| (f.index, f.timestamp, f.null_key)).collect();
        assert_eq!(facts, [(0, 1_000, false), (1, 1_001, true), (2, 1_002, false)]);
    }

    #[test]
    fn control_batches_are_valid_and_say_which_marker_they_are() {
        for marker in [Marker::Abort, Marker::Commit] {
            let b = control_batch(marker, 42, 7, 0, 1_000);
            let h = validate(&b, 1 << 20).unwrap();
            assert!(h.is_control() && h.is_transactional());
            assert_eq!((h.producer_id, h.producer_epoch, h.base_sequence, h.records_count, h.last_offset_delta), (42, 7, -1, 1, 0));
            validate_records(&b, &h, 1 << 20).unwrap();
            assert_eq!(marker_of(&b, &h), Some(marker));
            for coordinator_epoch in [0, 17, i32::MAX] {
                let b = control_batch(marker, 42, 7, coordinator_epoch, 1_000);
                assert_eq!(end_marker(&b, &validate(&b, 1 << 20).unwrap()), Some((marker, coordinator_epoch)));
            }
        }
        // A value too short for a coordinator epoch: a marker of epoch -1.
        // (The record's value length sits after its attributes, two deltas
        // and the 4-byte key.)
        let mut short = control_batch(Marker::Commit, 1, 0, 5, 0);
        let vlen_at = HEADER_BYTES + 1 + 4 + 4;
        assert_eq!(short[vlen_at], 6 << 1);
        short[vlen_at] = 2 << 1;
        let crc = crc32c::crc32c(&short[OFF_ATTRIBUTES..]);
        short[OFF_CRC..OFF_CRC + 4].copy_from_slice(&crc.to_be_bytes());
        let h = BatchHeader::parse(&short).unwrap();
        assert_eq!(end_marker(&short, &h), Some((Marker::Commit, -1)));
        // Cut anywhere: never a panic.
        let b = control_batch(Marker::Abort, 1, 0, 5, 0);
        let h = BatchHeader::parse(&b).unwrap();
        for cut in 0..b.len() {
            let _ = end_marker(&b[..cut], &h);
        }
        let plain = make_batch(&[b"x"], 0);
        assert_eq!(marker_of(&plain, &validate(&plain, 1 << 20).unwrap()), None);
        // An unknown control type is no marker.
        let mut odd = control_batch(Marker::Commit, 1, 0, 0, 0);
        let at = HEADER_BYTES + 1 + 4 + 3;
        odd[at] = 9;
        let crc = crc32c::crc32c(&odd[OFF_ATTRIBUTES..]);
        odd[OFF_CRC..OFF_CRC + 4].copy_from_slice(&crc.to_be_bytes());
        assert_eq!(marker_of(&odd, &validate(&odd, 1 << 20).unwrap()), None);
    }

    #[test]
    fn batches_are_recompressed_with_their_header_kept() {
        let plain = make_batch(&[b"one", b"two", b"three"], 5_000);
        let h = validate(&plain, 1 << 20).unwrap();
        let records = records_of(&plain, &h, 1 << 20).unwrap();
        let packed = with_records(&plain, &super::super::compression::compress(Compression::Zstd, &records), Compression::Zstd);
        let p = validate(&packed, 1 << 20).unwrap();
        assert_eq!(p.compression(), Compression::Zstd);
        assert_eq!((p.records_count, p.base_timestamp, p.max_timestamp, p.producer_id), (h.records_count, h.base_timestamp, h.max_timestamp, h.producer_id));
        assert_eq!(records_of(&packed, &p, 1 << 20).unwrap(), records);
        let back = with_records(&packed, &records, Compression::None);
        assert_eq!(back, plain, "decompressing gives the original batch back");
    }

    #[test]
    fn records_are_walked_and_malformed_ones_refused() {
        let good = make_batch(&[b"one", b"", b"three"], 1_000);
        let h = validate(&good, 1 << 20).unwrap();
        validate_records(&good, &h, 1 << 20).unwrap();
        let records = &good[HEADER_BYTES..];
        // Fewer records than the header claims.
        assert!(matches!(walk_records(records, 4), Err(BatchError::BadRecord { index: 3, .. })));
        // More bytes than the records use.
        let mut extra = records.to_vec();
        extra.push(0);
        assert!(matches!(walk_records(&extra, 3), Err(BatchError::BadRecord { index: 3, .. })));
        // Every truncation of the records section is refused, never a panic.
        for cut in 0..records.len() {
            assert!(walk_records(&records[..cut], 3).is_err(), "cut at {cut}");
        }
        // An offset delta out of sequence (record 0's offset delta byte).
        let mut skewed = records.to_vec();
        skewed[3] = 2; // zig-zag 1
        assert!(matches!(walk_records(&skewed, 3), Err(BatchError::BadRecord { index: 0, why: "offset delta out of sequence" })));
    }

    #[test]
    fn valid_batch_round_trips() {
        let b = make_batch(&[b"a", b"bb", b"ccc"], 1000);
        let h = validate(&b, 1 << 20).unwrap();
        assert_eq!(h.records_count, 3);
        assert_eq!(h.last_offset_delta, 2);
        assert_eq!(h.size, b.len());
        assert_eq!(record_timestamps(&b).unwrap(), vec![(0, 1000), (1, 1001), (2, 1002)]);
    }

    #[test]
    fn every_truncation_is_rejected() {
        let b = make_batch(&[b"hello", b"world"], 5);
        for cut in 0..b.len() {
            assert!(validate(&b[..cut], 1 << 20).is_err(), "prefix {cut} accepted");
        }
    }

    #[test]
    fn bit_flips_in_crc_range_are_rejected() {
        let b = make_batch(&[b"hello"], 5);
        for i in OFF_ATTRIBUTES..b.len() {
            let mut c = b.clone();
            c[i] ^= 0x01;
            assert!(validate(&c, 1 << 20).is_err(), "flip at {i} accepted");
        }
    }

    #[test]
    fn bad_magic_length_and_size_limit() {
        let mut b = make_batch(&[b"x"], 0);
        assert!(matches!(validate(&b, 10), Err(BatchError::TooLarge { .. })));
        b[OFF_MAGIC] = 1;
        assert_eq!(validate(&b, 1 << 20), Err(BatchError::BadMagic(1)));
        let mut b = make_batch(&[b"x"], 0);
        b[OFF_BATCH_LENGTH..OFF_BATCH_LENGTH + 4].copy_from_slice(&(-5i32).to_be_bytes());
        assert_eq!(validate(&b, 1 << 20), Err(BatchError::BadLength(-5)));
        let mut b = make_batch(&[b"x"], 0);
        b[OFF_BATCH_LENGTH..OFF_BATCH_LENGTH + 4].copy_from_slice(&i32::MAX.to_be_bytes());
        assert!(matches!(validate(&b, 1 << 20), Err(BatchError::Truncated { .. })));
    }

    #[test]
    fn patches_keep_crc_valid() {
        let mut b = make_batch(&[b"x", b"y"], 7);
        set_base_offset(&mut b, 42);
        let h = validate(&b, 1 << 20).unwrap();
        assert_eq!(h.base_offset, 42);
        set_log_append_time(&mut b, 99);
        let h = validate(&b, 1 << 20).unwrap();
        assert!(h.is_log_append_time());
        assert_eq!(h.max_timestamp, 99);
    }

    #[test]
    fn split_walks_concatenated_batches() {
        let mut two = make_batch(&[b"a"], 0);
        two.extend(make_batch(&[b"b", b"c"], 0));
        let parts: Vec<_> = split(&two).collect::<Result<_, _>>().unwrap();
        assert_eq!(parts.len(), 2);
        let mut bad = two.clone();
        bad.truncate(two.len() - 1);
        assert!(split(&bad).any(|r| r.is_err()));
    }

    /// The record walk as it was before the cursor (the oracle the
    /// faster one must agree with, error for error).
    fn reference_walk(mut rest: &[u8], count: i32) -> Result<(i64, i64), BatchError> {
        let (mut min_ts, mut max_ts) = (i64::MAX, i64::MIN);
        for index in 0..count {
            let bad = |why| BatchError::BadRecord { index, why };
            let (len, n) = reference_varint(rest).ok_or(bad("length"))?;
            let len = usize::try_from(len).map_err(|_| bad("negative length"))?;
            let rec = rest.get(n..n + len).ok_or(bad("length past the end of the batch"))?;
            rest = &rest[n + len..];
            // attributes, timestamp delta, offset delta, key, value, headers.
            let mut p = 1usize;
            if rec.is_empty() {
                return Err(bad("empty"));
            }
            let mut field = |what| -> Result<i64, BatchError> {
                let (v, n) = reference_varint(rec.get(p..).unwrap_or(&[])).ok_or(bad(what))?;
                p += n;
                Ok(v)
            };
            let ts = field("timestamp delta")?;
            min_ts = min_ts.min(ts);
            max_ts = max_ts.max(ts);
            if field("offset delta")? != index as i64 {
                return Err(bad("offset delta out of sequence"));
            }
            let bytes = |what, p: &mut usize| -> Result<(), BatchError> {
                let (len, n) = reference_varint(rec.get(*p..).unwrap_or(&[])).ok_or(bad(what))?;
                *p += n;
                if len >= 0 {
                    *p = p.checked_add(len as usize).filter(|&e| e <= rec.len()).ok_or(bad(what))?;
                } else if len != -1 {
                    return Err(bad(what));
                }
                Ok(())
            };
            bytes("key", &mut p)?;
            bytes("value", &mut p)?;
            let (headers, n) = reference_varint(rec.get(p..).unwrap_or(&[])).ok_or(bad("header count"))?;
            p += n;
            if headers < 0 || headers as usize > rec.len() {
                return Err(bad("header count"));
            }
            for _ in 0..headers {
                let (klen, n) = reference_varint(rec.get(p..).unwrap_or(&[])).ok_or(bad("header key"))?;
                p += n;
                if klen < 0 {
                    return Err(bad("header key"));
                }
                p = p.checked_add(klen as usize).filter(|&e| e <= rec.len()).ok_or(bad("header key"))?;
                bytes("header value", &mut p)?;
            }
            if p != rec.len() {
                return Err(bad("bytes left over"));
            }
        }
        if !rest.is_empty() {
            return Err(BatchError::BadRecord { index: count, why: "bytes after the last record" });
        }
        Ok((min_ts, max_ts))
    }

    /// The varint decoder without its one-byte fast path.
    use super::varint_multi as reference_varint;

    /// Every byte of a records section changed to values at varint and
    /// length edges, whole and cut short: the walk returns what the plain
    /// walk before it returned, error for error.
    #[test]
    fn the_record_walk_agrees_with_its_reference() {
        let b = make_batch(&[b"alpha", b"", &[7u8; 200], b"gamma"], 42);
        let good = &b[HEADER_BYTES..];
        for i in 0..good.len() {
            let o = good[i];
            for byte in [0, 1, 2, 3, 0x7e, 0x7f, 0x80, 0x81, 0xfe, 0xff, o.wrapping_add(1), o.wrapping_sub(1), o.wrapping_add(2), o.wrapping_sub(2)] {
                let mut records = good.to_vec();
                records[i] = byte;
                for cut in [0, 1, records.len() - i] {
                    let r = &records[..records.len() - cut];
                    for count in 3..=5 {
                        assert_eq!(walk_records(r, count), reference_walk(r, count), "byte {i} = {byte:#x}, cut {cut}, count {count}");
                    }
                    let v = &r[i.min(r.len())..];
                    assert_eq!(varint(v), reference_varint(v));
                }
            }
        }
    }

    proptest::proptest! {
        #[test]
        fn arbitrary_bytes_never_panic(data in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..512)) {
            let _ = validate(&data, 1 << 20);
            let _ = split(&data).count();
            let _ = record_timestamps(&data);
        }

        #[test]
        fn mutated_batches_never_panic(at in 0usize..400, byte in proptest::prelude::any::<u8>(), cut in 0usize..400) {
            let mut b = make_batch(&[b"alpha", b"beta", b"gamma"], 42);
            let i = at % b.len();
            b[i] = byte;
            b.truncate(b.len() - cut % b.len());
            let _ = validate(&b, 1 << 20);
            let _ = split(&b).count();
            let _ = record_timestamps(&b);
        }
    }
}
