//! REST bodies in every format the bridge reads (REST Proxy v2 JSON and
//! binary, /ingest JSON and NDJSON, v3 single, concatenated, streamed and
//! batch), in every Content-Encoding, through the real router against an
//! in-process engine. The first byte picks the route, format and
//! encoding; the rest is the body as sent.
#![no_main]

mod common;

use axum::body::Body;
use axum::http::Request;
use libfuzzer_sys::fuzz_target;
use tower::ServiceExt;

const ROUTES: [(&str, &str); 7] = [
    ("/topics/fuzz.v2", "application/vnd.kafka.json.v2+json"),
    ("/topics/fuzz.v2", "application/vnd.kafka.binary.v2+json"),
    ("/ingest/fuzz.ingest", "application/json"),
    ("/ingest/fuzz.ingest", "application/x-ndjson"),
    ("/v3/clusters/{cluster}/topics/fuzz.v3/records", "application/json"),
    ("/v3/clusters/{cluster}/topics/fuzz.v3/records", "chunked"),
    ("/v3/clusters/{cluster}/topics/fuzz.v3/records:batch", "application/json"),
];
const ENCODINGS: [Option<&str>; 4] = [None, Some("gzip"), Some("deflate"), Some("zstd")];

fuzz_target!(|data: &[u8]| {
    let Some((&pick, body)) = data.split_first() else { return };
    let p = common::broker();
    let (route, ct) = ROUTES[pick as usize % ROUTES.len()];
    let encoding = ENCODINGS[(pick as usize / ROUTES.len()) % ENCODINGS.len()];
    let uri = route.replace("{cluster}", p.broker.engine.cluster_id());
    let mut req = Request::post(uri);
    if ct == "chunked" {
        req = req.header("content-type", "application/json").header("transfer-encoding", "chunked");
    } else {
        req = req.header("content-type", ct);
    }
    if let Some(e) = encoding {
        req = req.header("content-encoding", e);
    }
    let req = req.body(Body::from(body.to_vec())).expect("a request");
    let app = canopy::rest::router(p.bridge.clone());
    p.rt.block_on(async {
        if let Ok(Ok(resp)) = tokio::time::timeout(std::time::Duration::from_secs(5), app.oneshot(req)).await {
            let _ = tokio::time::timeout(std::time::Duration::from_secs(5), axum::body::to_bytes(resp.into_body(), 1 << 24)).await;
        }
    });
});
