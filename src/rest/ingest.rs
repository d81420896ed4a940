//! The native bulk endpoint: `POST /ingest/{topic}` (or the topic's
//! segments as a path, `/ingest/app/codestore/commits` for
//! `app.codestore.commits`) with one JSON event, a JSON array of events,
//! or NDJSON (one event per line). Each event is stored as its JSON text,
//! byte for byte as sent (array elements as they appear in the body).
//!
//! Query parameters: `acks=all` (default: answered once durable), `1`
//! (once written) or `0` (202 as soon as the append is queued); `key=`
//! a JSON pointer (`/user/id`) whose value keys each event (strings as
//! their text, other values as their JSON). The `X-Canopy-Key` header
//! keys every event of the request. A topic's route (`rest_routes_file`,
//! see `routes`) gives defaults for `acks` and the key pointer. Answer: the count and, per partition,
//! the offset range.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::value::RawValue;
use serde_json::Value;

use super::{partition, Bridge, RestError};
use crate::engine::{Ack, Topic};
use crate::protocol::batch::NewRecord;

#[derive(Debug, serde::Deserialize, Default)]
pub struct Params {
    acks: Option<String>,
    key: Option<String>,
}

pub async fn ingest(State(b): State<Arc<Bridge>>, Path(path): Path<String>, Query(q): Query<Params>, headers: HeaderMap, body: Body) -> Response {
    run(b, path, q, headers, body).await.unwrap_or_else(IntoResponse::into_response)
}

/// The events of a body, as byte ranges of it.
fn events(body: &[u8], ndjson_type: bool) -> Result<Vec<&[u8]>, RestError> {
    let trimmed = body.trim_ascii();
    if trimmed.is_empty() {
        return Err(RestError::unprocessable("the body holds no event"));
    }
    if trimmed[0] == b'[' && !ndjson_type {
        let arr: Vec<&RawValue> = serde_json::from_slice(trimmed).map_err(|e| RestError::new(StatusCode::BAD_REQUEST, 400, format!("the body is not a JSON array of events: {e}")))?;
        return Ok(arr.into_iter().map(|r| r.get().as_bytes()).collect());
    }
    // One event, pretty-printed or not.
    if !ndjson_type && serde_json::from_slice::<&RawValue>(trimmed).is_ok() {
        return Ok(vec![trimmed]);
    }
    let lines: Vec<&[u8]> = trimmed.split(|&c| c == b'\n').map(|l| l.trim_ascii()).filter(|l| !l.is_empty()).collect();
    if lines.len() == 1 && !ndjson_type {
        serde_json::from_slice::<&RawValue>(lines[0]).map_err(|e| RestError::new(StatusCode::BAD_REQUEST, 400, format!("the body is not a JSON event: {e}")))?;
        return Ok(lines);
    }
    for (i, l) in lines.iter().enumerate() {
        serde_json::from_slice::<&RawValue>(l).map_err(|e| RestError::new(StatusCode::BAD_REQUEST, 400, format!("line {} (event {i}) is not JSON: {e}", i + 1)))?;
    }
    Ok(lines)
}

async fn run(b: Arc<Bridge>, path: String, q: Params, headers: HeaderMap, body: Body) -> Result<Response, RestError> {
    let topic = path.trim_matches('/').replace('/', ".");
    let who = b.authorize(&headers, Some(&topic)).await?;
    let route = b.cfg.routes.for_topic(&topic);
    let acks = q.acks.as_deref().or(route.and_then(|r| r.acks.as_deref()));
    let ack = match acks {
        None | Some("all") | Some("-1") => Some(Ack::Durable),
        Some("1") => Some(Ack::Written),
        Some("0") => None,
        Some(other) => return Err(RestError::new(StatusCode::BAD_REQUEST, 400, format!("acks must be all, 1 or 0, not {other:?}"))),
    };
    let ct = headers.get("content-type").and_then(|v| v.to_str().ok()).unwrap_or("application/json").to_ascii_lowercase();
    let ndjson = ct.starts_with("application/x-ndjson") || ct.starts_with("application/ndjson") || ct.starts_with("application/jsonl");
    if !(ndjson || ct.starts_with("application/") && ct.contains("json") || ct.starts_with("text/plain")) {
        return Err(RestError::new(StatusCode::UNSUPPORTED_MEDIA_TYPE, 415, format!("unsupported Content-Type {ct:?}: send application/json or application/x-ndjson")));
    }
    let (body, mut held) = b.body(&headers, body).await?;
    let _ = b.charge(who.as_deref(), body.len());
    let events = events(&body, ndjson)?;
    b.hold_events(&mut held, events.len())?;
    let header_key = headers.get("x-canopy-key").map(|v| v.as_bytes().to_vec());
    // The request's own key beats its route's pointer.
    let pointer = q.key.as_deref().or(if header_key.is_none() { route.and_then(|r| r.key.as_deref()) } else { None });
    let keys: Vec<Option<Vec<u8>>> = match (pointer, &header_key) {
        (Some(ptr), _) => events
            .iter()
            .map(|e| {
                let v: Value = serde_json::from_slice(e).unwrap_or(Value::Null);
                v.pointer(ptr).map(|k| match k {
                    Value::String(s) => s.clone().into_bytes(),
                    other => other.to_string().into_bytes(),
                })
            })
            .collect(),
        (None, Some(k)) => vec![Some(k.clone()); events.len()],
        (None, None) => vec![None; events.len()],
    };
    let t: Arc<Topic> = b.topic(&topic).await?;
    let n = t.partitions();
    let keyless = b.keyless(b.view().as_deref(), &t);
    let placed: Vec<Result<i32, RestError>> = keys.iter().map(|k| Ok(k.as_ref().map_or_else(|| keyless.pick(), |k| partition::for_key(k, n)))).collect();
    let records: Vec<NewRecord<'_>> = events.iter().zip(&keys).map(|(e, k)| NewRecord { key: k.as_deref(), value: Some(e), headers: Vec::new() }).collect();
    let Some(ack) = ack else {
        // acks=0: 202 once every batch is queued with the writer (which
        // pushes back when it is full), not awaited.
        let queued = super::append::append_with(&b, &t, &records, &placed, Ack::Written, false).await;
        if let Some(Err((_, e))) = queued.into_iter().find(|o| o.is_err()) {
            return Err(e);
        }
        return Ok((StatusCode::ACCEPTED, [("content-type", "application/json")], serde_json::json!({"topic": topic, "count": events.len()}).to_string()).into_response());
    };
    let outcome = super::append::append(&b, &t, &records, &placed, ack).await;
    let mut parts: std::collections::BTreeMap<i32, (i64, i64, usize)> = Default::default();
    let mut failed = None;
    for o in outcome {
        match o {
            Ok((p, off)) => {
                let e = parts.entry(p).or_insert((off, off, 0));
                e.0 = e.0.min(off);
                e.1 = e.1.max(off);
                e.2 += 1;
            }
            Err((_, e)) => failed = Some(e),
        }
    }
    if let Some(e) = failed {
        return Err(e);
    }
    let partitions: Vec<Value> = parts.iter().map(|(p, (first, last, count))| serde_json::json!({"partition": p, "first_offset": first, "last_offset": last, "count": count})).collect();
    Ok((StatusCode::OK, [("content-type", "application/json")], serde_json::json!({"topic": topic, "count": events.len(), "partitions": partitions}).to_string()).into_response())
}
