//! Bounded inflation of compressed record batches, for validation only:
//! Canopy stores and serves compressed batches exactly as the producer sent
//! them, but checks that their records are what the header claims.
//!
//! Every codec is read through a stream that stops one byte past `limit`
//! (the broker's `max_inflated_batch_bytes`, at least the topic's
//! `max.message.bytes`), so a batch that would inflate to a gigabyte costs
//! at most `limit` bytes of memory and the CPU to produce them. On top of that a ratio guard refuses batches that inflate more
//! than [`MAX_RATIO`] times once they pass [`RATIO_FLOOR`] bytes: real
//! record data does not do that, decompression bombs do.
//!
//! Formats, as Kafka clients write them: gzip (one or more members), snappy
//! (raw, or in the xerial framing the Java client uses), LZ4 frame, zstd
//! frame.

use std::io::Read;

/// A Kafka compression codec (a batch's low attribute bits name one).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Compression {
    None,
    Gzip,
    Snappy,
    Lz4,
    Zstd,
    Unknown(u8),
}

/// Largest zstd window (log2 bytes) a batch may need to inflate.
const ZSTD_WINDOW_LOG_MAX: u32 = 24;

/// Inflated/compressed ratio above which a batch is refused...
pub const MAX_RATIO: usize = 1024;
/// ...once it has inflated past this many bytes.
pub const RATIO_FLOOR: usize = 1 << 20;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InflateError {
    #[error("records inflate past {limit} bytes")]
    TooLarge { limit: usize },
    #[error("records inflate more than {MAX_RATIO} times their compressed size")]
    Ratio,
    #[error("{codec} data does not decode: {why}")]
    Corrupt { codec: &'static str, why: String },
    #[error("unknown compression codec {0}")]
    UnknownCodec(u8),
}

/// Inflates `data` (the records section of a batch) compressed with
/// `codec`, refusing to produce more than `limit` bytes.
pub fn inflate(codec: Compression, data: &[u8], limit: usize) -> Result<Vec<u8>, InflateError> {
    match codec {
        Compression::None => Ok(data.to_vec()),
        Compression::Gzip => bounded("gzip", flate2::read::MultiGzDecoder::new(data), data.len(), limit),
        Compression::Snappy => snappy(data, limit),
        Compression::Lz4 => match lz4::Decoder::new(data) {
            Ok(d) => bounded("lz4", d, data.len(), limit),
            Err(e) => Err(InflateError::Corrupt { codec: "lz4", why: e.to_string() }),
        },
        Compression::Zstd => {
            let corrupt = |e: std::io::Error| InflateError::Corrupt { codec: "zstd", why: e.to_string() };
            let mut d = zstd::stream::read::Decoder::with_buffer(data).map_err(corrupt)?;
            // The frame header may ask for a window of up to 128 MiB, which
            // the decoder would allocate up front: cap it (16 MiB is more
            // than any client's compression level asks for).
            d.window_log_max(ZSTD_WINDOW_LOG_MAX).map_err(corrupt)?;
            bounded("zstd", d, data.len(), limit)
        }
        Compression::Unknown(c) => Err(InflateError::UnknownCodec(c)),
    }
}

/// Reads `r` to its end in steps, never holding more than `limit + 1`
/// bytes, checking the ratio guard as it goes.
fn bounded(codec: &'static str, r: impl Read, compressed: usize, limit: usize) -> Result<Vec<u8>, InflateError> {
    let mut out = Vec::new();
    let mut r = r.take(limit as u64 + 1);
    let mut chunk = [0u8; 64 * 1024];
    loop {
        let n = r.read(&mut chunk).map_err(|e| InflateError::Corrupt { codec, why: e.to_string() })?;
        if n == 0 {
            break;
        }
        out.extend_from_slice(&chunk[..n]);
        check(out.len(), compressed, limit)?;
    }
    Ok(out)
}

fn check(inflated: usize, compressed: usize, limit: usize) -> Result<(), InflateError> {
    if inflated > limit {
        return Err(InflateError::TooLarge { limit });
    }
    if inflated > RATIO_FLOOR && inflated / compressed.max(1) > MAX_RATIO {
        return Err(InflateError::Ratio);
    }
    Ok(())
}

/// Compresses `data` (a records section) with `codec`, in the format Kafka
/// clients read: gzip, snappy in the xerial framing the Java client writes
/// (librdkafka and kafka-python read it too), LZ4 frame, zstd frame.
pub fn compress(codec: Compression, data: &[u8]) -> Vec<u8> {
    use std::io::Write;
    match codec {
        Compression::None | Compression::Unknown(_) => data.to_vec(),
        Compression::Gzip => {
            let mut e = flate2::write::GzEncoder::new(Vec::with_capacity(data.len() / 2), flate2::Compression::default());
            e.write_all(data).expect("writing to a Vec");
            e.finish().expect("writing to a Vec")
        }
        Compression::Snappy => {
            let mut out = XERIAL_MAGIC.to_vec();
            out.extend_from_slice(&1i32.to_be_bytes());
            out.extend_from_slice(&1i32.to_be_bytes());
            let mut enc = snap::raw::Encoder::new();
            for chunk in data.chunks(32 * 1024) {
                let block = enc.compress_vec(chunk).expect("snappy block");
                out.extend_from_slice(&(block.len() as u32).to_be_bytes());
                out.extend_from_slice(&block);
            }
            out
        }
        Compression::Lz4 => {
            // Independent blocks: Kafka's Java reader refuses linked ones.
            let mut e = lz4::EncoderBuilder::new().block_mode(lz4::BlockMode::Independent).build(Vec::with_capacity(data.len() / 2)).expect("lz4 encoder");
            e.write_all(data).expect("writing to a Vec");
            let (out, r) = e.finish();
            r.expect("lz4 frame end");
            out
        }
        Compression::Zstd => zstd::encode_all(data, 3).expect("zstd of a slice"),
    }
}

const XERIAL_MAGIC: &[u8] = b"\x82SNAPPY\x00";

fn snappy(data: &[u8], limit: usize) -> Result<Vec<u8>, InflateError> {
    let corrupt = |why: String| InflateError::Corrupt { codec: "snappy", why };
    if !data.starts_with(XERIAL_MAGIC) {
        return snappy_block(data, data.len(), limit, Vec::new());
    }
    // xerial: magic, version (4), compatible version (4), then chunks of
    // a 4-byte big-endian length and a raw snappy block.
    let mut rest = data.get(16..).ok_or_else(|| corrupt("truncated xerial header".into()))?;
    let mut out = Vec::new();
    while !rest.is_empty() {
        let len = rest.get(..4).map(|b| u32::from_be_bytes(b.try_into().expect("4 bytes")) as usize).ok_or_else(|| corrupt("truncated chunk length".into()))?;
        let block = rest.get(4..4 + len).ok_or_else(|| corrupt("truncated chunk".into()))?;
        out = snappy_block(block, data.len(), limit, out)?;
        rest = &rest[4 + len..];
    }
    Ok(out)
}

/// Appends one raw snappy block to `out`; its inflated length is in its
/// preamble, checked before anything is allocated.
fn snappy_block(block: &[u8], compressed: usize, limit: usize, mut out: Vec<u8>) -> Result<Vec<u8>, InflateError> {
    let corrupt = |e: snap::Error| InflateError::Corrupt { codec: "snappy", why: e.to_string() };
    let n = snap::raw::decompress_len(block).map_err(corrupt)?;
    check(out.len().saturating_add(n), compressed, limit)?;
    let at = out.len();
    out.resize(at + n, 0);
    let written = snap::raw::Decoder::new().decompress(block, &mut out[at..]).map_err(corrupt)?;
    out.truncate(at + written);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn sample() -> Vec<u8> {
        (0..50_000u32).flat_map(|i| format!("record {i} ").into_bytes()).collect()
    }

    fn gzip(data: &[u8]) -> Vec<u8> {
        let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        e.write_all(data).unwrap();
        e.finish().unwrap()
    }

    fn lz4(data: &[u8]) -> Vec<u8> {
        let mut e = lz4::EncoderBuilder::new().build(Vec::new()).unwrap();
        e.write_all(data).unwrap();
        let (out, r) = e.finish();
        r.unwrap();
        out
    }

    fn xerial(data: &[u8]) -> Vec<u8> {
        let mut out = XERIAL_MAGIC.to_vec();
        out.extend_from_slice(&1i32.to_be_bytes());
        out.extend_from_slice(&1i32.to_be_bytes());
        for chunk in data.chunks(32 * 1024) {
            let block = snap::raw::Encoder::new().compress_vec(chunk).unwrap();
            out.extend_from_slice(&(block.len() as u32).to_be_bytes());
            out.extend_from_slice(&block);
        }
        out
    }

    #[test]
    fn every_codec_round_trips() {
        let data = sample();
        let cases: Vec<(Compression, Vec<u8>)> = vec![
            (Compression::Gzip, gzip(&data)),
            (Compression::Snappy, snap::raw::Encoder::new().compress_vec(&data).unwrap()),
            (Compression::Snappy, xerial(&data)),
            (Compression::Lz4, lz4(&data)),
            (Compression::Zstd, zstd::encode_all(&data[..], 3).unwrap()),
        ];
        for (codec, packed) in cases {
            assert_eq!(inflate(codec, &packed, 1 << 20).unwrap(), data, "{codec:?}");
            // One byte less room than needed.
            assert_eq!(inflate(codec, &packed, data.len() - 1), Err(InflateError::TooLarge { limit: data.len() - 1 }), "{codec:?}");
            // Truncated input is corrupt or a prefix of the data (a frame
            // cut in its end marker), never garbage or a panic; the record
            // walk that follows catches a short prefix.
            for cut in [0, 1, packed.len() / 2, packed.len() - 1] {
                match inflate(codec, &packed[..cut], 1 << 20) {
                    Err(InflateError::Corrupt { .. }) => {}
                    Ok(short) => assert!(data.starts_with(&short), "{codec:?} cut at {cut}"),
                    Err(e) => panic!("{codec:?} cut at {cut}: {e}"),
                }
            }
        }
        assert_eq!(inflate(Compression::Unknown(7), b"x", 10), Err(InflateError::UnknownCodec(7)));
        assert!(matches!(inflate(Compression::Gzip, b"not gzip at all", 1 << 20), Err(InflateError::Corrupt { .. })));
    }

    #[test]
    fn what_compress_writes_inflate_reads() {
        let data = sample();
        for codec in [Compression::None, Compression::Gzip, Compression::Snappy, Compression::Lz4, Compression::Zstd] {
            let packed = compress(codec, &data);
            assert_eq!(inflate(codec, &packed, 1 << 20).unwrap(), data, "{codec:?}");
        }
        assert!(compress(Compression::Snappy, &data).starts_with(XERIAL_MAGIC));
        // LZ4 frame: magic, then FLG with the block-independence bit (5).
        let lz = compress(Compression::Lz4, &data);
        assert_eq!(&lz[..4], &[0x04, 0x22, 0x4d, 0x18]);
        assert_ne!(lz[4] & 0x20, 0, "independent blocks, as Kafka's Java reader requires");
    }

    #[test]
    fn bombs_stop_at_the_limit_or_the_ratio_guard() {
        let zeros = vec![0u8; 64 << 20];
        let bomb = gzip(&zeros);
        assert_eq!(inflate(Compression::Gzip, &bomb, 1 << 20), Err(InflateError::TooLarge { limit: 1 << 20 }));
        // With room for all of it, the ratio guard still refuses.
        assert_eq!(inflate(Compression::Gzip, &bomb, 128 << 20), Err(InflateError::Ratio));
        // A snappy block claiming a huge length is refused before allocating.
        let mut lie = Vec::new();
        let mut n: u64 = 1 << 40;
        while n >= 0x80 {
            lie.push((n as u8) | 0x80);
            n >>= 7;
        }
        lie.push(n as u8);
        assert!(inflate(Compression::Snappy, &lie, 1 << 20).is_err());
    }
}
