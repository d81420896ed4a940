//! Produced record batches: splitting, header and CRC checks, inflation
//! (every codec, bounded) and the per-record walk, on arbitrary bytes.
//! The first byte also picks a codec to inflate the rest with directly.
#![no_main]

use canopy::protocol::batch::{self, Compression};
use canopy::protocol::compression;
use libfuzzer_sys::fuzz_target;

const LIMIT: usize = 1 << 20;

fuzz_target!(|data: &[u8]| {
    for b in batch::split(data) {
        let Ok(b) = b else { break };
        let Ok(h) = batch::validate(b, LIMIT) else { continue };
        if let Ok(records) = batch::records_of(b, &h, LIMIT) {
            let _ = batch::check_records(&records, &h);
        }
        let _ = batch::record_timestamps(b);
        let _ = batch::marker_of(b, &h);
    }
    if let Some((&pick, rest)) = data.split_first() {
        let codec = match pick % 4 {
            0 => Compression::Gzip,
            1 => Compression::Snappy,
            2 => Compression::Lz4,
            _ => Compression::Zstd,
        };
        if let Ok(out) = compression::inflate(codec, rest, LIMIT) {
            assert!(out.len() <= LIMIT, "inflation stays within its limit");
        }
    }
});
