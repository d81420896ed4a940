//! Segment, segment index and subtree store files opened from damaged
//! bytes: recovery's scan (shallow and deep) of a segment, the decoding of
//! a segment's index file (whatever decodes encodes back to the same
//! bytes), and a store's open and frame check. The first byte picks which;
//! the rest is the file, on the simulated disk (in memory: no file system
//! in the loop).
#![no_main]

use std::path::Path;

use canopy::storage::disk::sim::{Faults, SimDisk};
use canopy::storage::disk::{Disk, Mode};
use canopy::storage::segment;
use canopy::storage::subtree::store::Store;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&pick, file)) = data.split_first() else { return };
    let disk = SimDisk::new(0, Faults::default());
    let path = Path::new("/00000000000000000000.seg");
    disk.open(path, Mode::CreateNew).and_then(|f| f.write_all_at(file, 0)).expect("write the file");
    match pick % 3 {
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
        _ => {
            if let Ok(again) = canopy::storage::log::reencode_index_file(file) {
                assert_eq!(again, file, "an index file decodes to what encodes back to it");
            }
        }
    }
});
