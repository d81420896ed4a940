//! Segment, segment index and subtree store files opened from damaged
//! bytes: recovery's scan (shallow and deep) of a segment, the decoding of
//! a segment's index file (whatever decodes encodes back to the same
//! bytes), a store's open and frame check, and the two state files of
//! replicas (leader epochs, truncations: whatever decodes encodes to
//! something that decodes to the same). The first byte picks which;
//! the rest is the file, on the simulated disk (in memory: no file system
//! in the loop).
#![no_main]

use std::path::Path;

use canopy::storage::disk::sim::{Faults, SimDisk};
use canopy::storage::disk::{Disk, Mode};
use canopy::storage::log::{cuts, epochs};
use canopy::storage::segment;
use canopy::storage::subtree::store::Store;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&pick, file)) = data.split_first() else { return };
    let disk = SimDisk::new(0, Faults::default());
    let path = Path::new("/00000000000000000000.seg");
    disk.open(path, Mode::CreateNew).and_then(|f| f.write_all_at(file, 0)).expect("write the file");
    match pick % 5 {
        0 => {
            for deep in [false, true] {
                if let Ok(scan) = segment::scan(&disk, path, deep) {
                    assert!(scan.valid_len <= scan.file_len);
                }
            }
        }
        1 => {
            if let Ok(store) = Store::open(&disk, path) {
                let _ = store.verify_frames(&disk);
            }
        }
        2 => {
            if let Ok(again) = canopy::storage::log::reencode_index_file(file) {
                assert_eq!(again, file, "an index file decodes to what encodes back to it");
            }
        }
        3 => {
            if let Ok(caches) = epochs::decode(file) {
                let again = epochs::decode(&epochs::encode(caches.iter().map(|(tp, c)| (*tp, c)))).expect("what was decoded encodes");
                let kept: Vec<_> = caches.into_iter().filter(|(_, c)| !c.entries().is_empty()).collect();
                assert_eq!(again, kept, "an epoch checkpoint survives a round trip");
            }
        }
        _ => {
            if let Ok(found) = cuts::decode(file) {
                assert_eq!(cuts::decode(&cuts::encode(&found)).as_ref(), Ok(&found), "a truncation file survives a round trip");
            }
        }
    }
});
