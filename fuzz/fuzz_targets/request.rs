//! A request frame (header and body, without the length prefix) through
//! header parsing, the wire-shape guard, decoding and the handler, against
//! an in-process engine. Whatever the bytes, nothing panics or aborts,
//! and every request is answered or refused.
#![no_main]

mod common;

use bytes::Bytes;
use canopy::kafka::handlers::{self, Route};
use canopy::protocol::header;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let p = common::broker();
    let Ok(h) = header::parse(data) else { return };
    let body = Bytes::copy_from_slice(&data[h.len..]);
    if let Route::Run(fut) = handlers::route(&p.broker, &h, body) {
        p.rt.block_on(async {
            // A join or sync may park for its group: not for long here.
            let _ = tokio::time::timeout(std::time::Duration::from_millis(200), fut).await;
        });
    }
});
