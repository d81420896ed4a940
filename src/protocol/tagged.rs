//! Batches of an ordered subtree stream (`<prefix>.__all`): each stored
//! batch re-encoded, uncompressed, with every record tagged by where it came
//! from.
//!
//! A subtree stream is one virtual partition whose offsets are
//! `(stream sequence number << 24) | record index`, so the records of one
//! stored batch keep their offset deltas and the batch's base offset is its
//! sequence number shifted. Each record gets three more headers (values in
//! UTF-8 text, numbers in decimal): `canopy.topic`, `canopy.partition` and
//! `canopy.offset`, its source tp and offset. Key, value, timestamp and the
//! record's own headers are copied byte for byte.
//!
//! This is the one place the broker decodes records on a read path: a
//! stream mixes many tps, and a consumer must be told which record is
//! whose.

use super::batch::{self, BatchError, BatchHeader, HEADER_BYTES};

/// Bits of a virtual offset that index a record inside its batch.
pub const INDEX_BITS: u32 = 24;
/// Records per batch a stream can address.
pub const MAX_RECORDS: i64 = 1 << INDEX_BITS;

pub const TOPIC_HEADER: &str = "canopy.topic";
pub const PARTITION_HEADER: &str = "canopy.partition";
pub const OFFSET_HEADER: &str = "canopy.offset";

/// The virtual offset of record `index` of the batch with sequence `seq`.
pub fn virtual_offset(seq: u64, index: i64) -> i64 {
    ((seq as i64) << INDEX_BITS) | index
}

/// Splits a virtual offset into (sequence number, record index).
pub fn split_offset(offset: i64) -> (u64, i64) {
    ((offset >> INDEX_BITS) as u64, offset & (MAX_RECORDS - 1))
}

/// The source of a stored batch.
#[derive(Debug, Clone, Copy)]
pub struct Source<'a> {
    pub topic: &'a str,
    pub partition: i32,
    /// Offset of the batch's first record in its tp.
    pub base_offset: i64,
    /// Stream sequence number of the batch.
    pub seq: u64,
}

/// Re-encodes the stored batch `buf` (validated when it was produced) for
/// a stream, dropping records whose index is below `skip` (the consumer
/// already has them) and any past [`MAX_RECORDS`]. Appends it to `out` and
/// returns the offset after its last record, or None (and appends
/// nothing) when no record is left. `inflate_limit` bounds decompression.
pub fn tag_batch(buf: &[u8], src: Source<'_>, skip: i64, inflate_limit: usize, out: &mut Vec<u8>) -> Result<Option<i64>, BatchError> {
    let h = BatchHeader::parse(buf)?;
    let records = batch::records_of(buf, &h, inflate_limit)?;
    let start = out.len();
    out.extend_from_slice(&[0u8; HEADER_BYTES]);
    let (topic, partition) = (src.topic.as_bytes(), src.partition.to_string());
    let mut rest: &[u8] = &records;
    let (mut count, mut last_delta) = (0i32, -1i64);
    let mut body = Vec::new();
    for index in 0..h.records_count {
        let bad = |why| BatchError::BadRecord { index, why };
        let (len, n) = batch::varint(rest).ok_or(bad("length"))?;
        let len = usize::try_from(len).map_err(|_| bad("negative length"))?;
        let rec = rest.get(n..n + len).ok_or(bad("length past the end of the batch"))?;
        rest = &rest[n + len..];
        let view = RecordView::parse(rec).ok_or(bad("does not parse"))?;
        if view.offset_delta < skip || view.offset_delta >= MAX_RECORDS {
            continue;
        }
        body.clear();
        // attributes, timestamp delta, offset delta, key and value as sent.
        body.extend_from_slice(&rec[..view.headers_at]);
        batch::put_varint(&mut body, view.header_count + 3);
        body.extend_from_slice(&rec[view.headers_body_at..]);
        let offset = (src.base_offset + view.offset_delta).to_string();
        for (k, v) in [(TOPIC_HEADER.as_bytes(), topic), (PARTITION_HEADER.as_bytes(), partition.as_bytes()), (OFFSET_HEADER.as_bytes(), offset.as_bytes())] {
            batch::put_varint(&mut body, k.len() as i64);
            body.extend_from_slice(k);
            batch::put_varint(&mut body, v.len() as i64);
            body.extend_from_slice(v);
        }
        batch::put_varint(out, body.len() as i64);
        out.extend_from_slice(&body);
        count += 1;
        last_delta = view.offset_delta;
    }
    if count == 0 {
        out.truncate(start);
        return Ok(None);
    }
    // Keep only the timestamp type: the copy is plain data, uncompressed,
    // outside any transaction (aborted data is filtered before this).
    let header = batch::NewBatch {
        base_offset: virtual_offset(src.seq, 0),
        attributes: h.attributes & batch::ATTR_TIMESTAMP_TYPE,
        last_offset_delta: last_delta as i32,
        base_timestamp: h.base_timestamp,
        max_timestamp: h.max_timestamp,
        producer_id: -1,
        producer_epoch: -1,
        base_sequence: -1,
        records_count: count,
    };
    out[start..start + HEADER_BYTES].copy_from_slice(&header.header());
    batch::seal(&mut out[start..]);
    Ok(Some(virtual_offset(src.seq, last_delta + 1)))
}

/// Where the parts of one record are.
struct RecordView {
    offset_delta: i64,
    /// Position of the header count.
    headers_at: usize,
    header_count: i64,
    /// Position of the first header.
    headers_body_at: usize,
}

impl RecordView {
    fn parse(rec: &[u8]) -> Option<RecordView> {
        let mut p = 1usize; // attributes
        let field = |p: &mut usize| -> Option<i64> {
            let (v, n) = batch::varint(rec.get(*p..)?)?;
            *p += n;
            Some(v)
        };
        field(&mut p)?; // timestamp delta
        let offset_delta = field(&mut p)?;
        for _ in 0..2 {
            let len = field(&mut p)?;
            if len >= 0 {
                p = p.checked_add(len as usize).filter(|&e| e <= rec.len())?;
            } else if len != -1 {
                return None;
            }
        }
        let headers_at = p;
        let header_count = field(&mut p)?;
        if header_count < 0 || header_count as usize > rec.len() {
            return None;
        }
        Some(RecordView { offset_delta, headers_at, header_count, headers_body_at: p })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::batch::tests::make_batch;
    use crate::protocol::compression;
    use kafka_protocol::records::RecordBatchDecoder;

    const SRC: Source<'static> = Source { topic: "app.b.y", partition: 3, base_offset: 40, seq: 7 };

    fn decode(b: &[u8]) -> Vec<kafka_protocol::records::Record> {
        let mut buf = bytes::Bytes::copy_from_slice(b);
        RecordBatchDecoder::decode(&mut buf).expect("a well-formed batch").records
    }

    fn stored(values: &[&[u8]], codec: batch::Compression) -> Vec<u8> {
        let mut b = make_batch(values, 1_000);
        batch::set_base_offset(&mut b, SRC.base_offset);
        if codec == batch::Compression::None {
            return b;
        }
        let h = BatchHeader::parse(&b).unwrap();
        let records = batch::records_of(&b, &h, 1 << 20).unwrap().into_owned();
        batch::with_records(&b, &compression::compress(codec, &records), codec)
    }

    #[test]
    fn records_keep_their_data_and_gain_their_source() {
        for codec in [batch::Compression::None, batch::Compression::Gzip, batch::Compression::Lz4] {
            let b = stored(&[b"one", b"", b"three"], codec);
            let mut out = Vec::new();
            let next = tag_batch(&b, SRC, 0, 1 << 20, &mut out).unwrap();
            assert_eq!(next, Some(virtual_offset(7, 3)));
            batch::validate(&out, usize::MAX).expect("valid v2 batch, CRC included");
            let recs = decode(&out);
            assert_eq!(recs.len(), 3);
            for (i, r) in recs.iter().enumerate() {
                assert_eq!(r.offset, (7 << INDEX_BITS) + i as i64);
                assert_eq!(split_offset(r.offset), (7, i as i64));
                assert_eq!(r.value.as_deref(), Some([&b"one"[..], b"", b"three"][i]));
                assert_eq!(r.timestamp, 1_000 + i as i64);
                assert!(!r.transactional && !r.control && r.producer_id == -1);
                let h = |k: &str| r.headers.get(&kafka_protocol::protocol::StrBytes::from_string(k.to_owned())).cloned().flatten().map(|v| String::from_utf8(v.to_vec()).unwrap());
                assert_eq!(h(TOPIC_HEADER).as_deref(), Some("app.b.y"));
                assert_eq!(h(PARTITION_HEADER).as_deref(), Some("3"));
                assert_eq!(h(OFFSET_HEADER), Some((40 + i).to_string()));
            }
        }
    }

    #[test]
    fn skipped_records_are_left_out() {
        let b = stored(&[b"a", b"b", b"c"], batch::Compression::None);
        let mut out = Vec::new();
        assert_eq!(tag_batch(&b, SRC, 2, 1 << 20, &mut out).unwrap(), Some(virtual_offset(7, 3)));
        let recs = decode(&out);
        assert_eq!(recs.iter().map(|r| r.offset).collect::<Vec<_>>(), vec![virtual_offset(7, 2)]);
        // All of it skipped: nothing appended.
        let mut out = vec![9u8];
        assert_eq!(tag_batch(&b, SRC, 3, 1 << 20, &mut out).unwrap(), None);
        assert_eq!(out, vec![9u8]);
    }

    #[test]
    fn bad_batches_are_errors_not_panics() {
        let b = stored(&[b"abc", b"defg"], batch::Compression::None);
        // Truncated anywhere, and each records byte corrupted in turn.
        for cut in 0..b.len() {
            let _ = tag_batch(&b[..cut], SRC, 0, 1 << 20, &mut Vec::new());
        }
        for i in HEADER_BYTES..b.len() {
            for v in [0x00, 0x7f, 0x80, 0xff] {
                let mut bad = b.clone();
                bad[i] = v;
                let _ = tag_batch(&bad, SRC, 0, 1 << 20, &mut Vec::new());
            }
        }
        assert!(tag_batch(&b[..b.len() - 1], SRC, 0, 1 << 20, &mut Vec::new()).is_err());
        // A compressed batch that inflates past the limit.
        let g = stored(&[&[b'z'; 4096][..]], batch::Compression::Gzip);
        assert!(tag_batch(&g, SRC, 0, 1024, &mut Vec::new()).is_err());
    }
}
