//! The consumer protocol's nested encodings (JoinGroup member metadata,
//! SyncGroup assignments), decoded as the broker decodes client bytes.
#![no_main]

use bytes::Bytes;
use canopy::protocol::consumer;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let b = Bytes::copy_from_slice(data);
    let _ = consumer::subscription(&b);
    let _ = consumer::assignment(&b);
});
