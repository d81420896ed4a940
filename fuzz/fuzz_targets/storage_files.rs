//! Segment and subtree store files opened from damaged bytes: recovery's
//! scan (shallow and deep) of a segment, and a store's open and frame
//! check. The first byte picks which; the rest is the file.
#![no_main]

use canopy::storage::segment;
use canopy::storage::subtree::store::Store;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&pick, file)) = data.split_first() else { return };
    let dir = tempfile::tempdir().expect("a temporary directory");
    let path = dir.path().join("00000000000000000000.seg");
    std::fs::write(&path, file).expect("write the file");
    if pick % 2 == 0 {
        for deep in [false, true] {
            if let Ok(scan) = segment::scan(&path, deep) {
                assert!(scan.valid_len <= scan.file_len);
            }
        }
    } else if let Ok(store) = Store::open(&path) {
        let _ = store.verify_frames();
    }
});
