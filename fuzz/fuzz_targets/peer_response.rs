//! The answers a node reads from another (cluster mode): a leader's Fetch
//! response, as a follower decodes it; a leader's Produce response, as
//! the REST bridge's forwarder decodes it; a leader's WriteTxnMarkers
//! response, as a transaction coordinator decodes it; a coordinator's
//! AddPartitionsToTxn response, as a partition leader decodes it. The
//! first byte picks the decoder (and the Fetch version); the rest is the
//! body after the frame length.
#![no_main]

use bytes::Bytes;
use canopy::protocol::{fetch, produce, txn};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&pick, body)) = data.split_first() else { return };
    let b = Bytes::copy_from_slice(body);
    if pick & 0x80 == 0 {
        let version = fetch::FIRST_DECODED_VERSION + (pick % (fetch::MAX_VERSION - fetch::FIRST_DECODED_VERSION + 1) as u8) as i16;
        let _ = fetch::decode_response(version, &b);
    } else {
        match pick & 0x03 {
            1 => drop(txn::decode_markers(&b)),
            2 => drop(txn::decode_add_partitions(&b)),
            _ => drop(produce::decode_response(&b)),
        }
    }
});
