//! Confluent REST Proxy v3: produce records (one per request, a stream of
//! concatenated records over one chunked request, or a batch), and the
//! cluster and topic listings.
//!
//! A record is `{"partition_id"?, "headers"?: [{"name","value"(base64)}],
//! "key"?: {"type": "JSON"|"BINARY"|"STRING", "data": …}, "value"?: …}`.
//! In streaming mode each record is appended as soon as it is parsed and
//! its delivery report written to the chunked response, in order.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use base64::Engine as _;
use bytes::{Bytes, BytesMut};
use futures_util::StreamExt;
use serde_json::{json, Value};

use super::{partition, Bridge, RestError};
use crate::engine::{Ack, Topic};
use crate::protocol::batch::NewRecord;

fn json_ok(status: StatusCode, v: Value) -> Response {
    (status, [("content-type", "application/json")], v.to_string()).into_response()
}

fn check_cluster(b: &Bridge, id: &str) -> Result<(), RestError> {
    if id == b.cluster_id() {
        Ok(())
    } else {
        Err(RestError::new(StatusCode::NOT_FOUND, 404, format!("Cluster {id} not found.")))
    }
}

pub async fn clusters(State(b): State<Arc<Bridge>>, headers: HeaderMap) -> Response {
    if let Err(e) = b.authorize(&headers, None).await {
        return e.into_response();
    }
    json_ok(StatusCode::OK, json!({"kind": "KafkaClusterList", "metadata": {}, "data": [{"kind": "KafkaCluster", "cluster_id": b.cluster_id()}]}))
}

pub async fn topics(State(b): State<Arc<Bridge>>, Path(cluster): Path<String>, headers: HeaderMap) -> Response {
    let may = match b.authorize(&headers, None).await.and_then(|who| check_cluster(&b, &cluster).map(|()| who)) {
        Ok(who) => b.describable(who),
        Err(e) => return e.into_response(),
    };
    let data: Vec<Value> = b
        .engine
        .topics()
        .iter()
        .filter(|t| may(t.name()) && !crate::engine::topics::is_internal(t.name()))
        .map(|t| json!({"kind": "KafkaTopic", "cluster_id": cluster, "topic_name": t.name(), "partitions_count": t.partitions(), "replication_factor": 1, "is_internal": false}))
        .collect();
    json_ok(StatusCode::OK, json!({"kind": "KafkaTopicList", "metadata": {}, "data": data}))
}

/// One decoded v3 record.
struct Rec {
    key: Option<Vec<u8>>,
    value: Option<Vec<u8>>,
    headers: Vec<(String, Option<Vec<u8>>)>,
    partition: Option<i32>,
}

fn data(v: Option<&Value>, what: &str) -> Result<Option<Vec<u8>>, String> {
    let Some(v) = v.filter(|v| !v.is_null()) else { return Ok(None) };
    let ty = v.get("type").and_then(Value::as_str).unwrap_or("JSON");
    let d = v.get("data");
    match (ty, d) {
        (_, None | Some(Value::Null)) => Ok(None),
        ("BINARY", Some(Value::String(s))) => base64::engine::general_purpose::STANDARD.decode(s).map(Some).map_err(|e| format!("{what} data is not base64: {e}")),
        ("STRING", Some(Value::String(s))) => Ok(Some(s.clone().into_bytes())),
        ("JSON", Some(d)) => Ok(Some(d.to_string().into_bytes())),
        ("AVRO" | "PROTOBUF" | "JSONSCHEMA", _) => Err(format!("{what} type {ty} needs a schema registry, which Canopy does not have")),
        _ => Err(format!("{what}: type {ty} with this data is not supported (JSON, BINARY or STRING)")),
    }
}

fn decode(v: &Value) -> Result<Rec, String> {
    let obj = v.as_object().ok_or("a record must be a JSON object")?;
    let partition = match obj.get("partition_id") {
        None | Some(Value::Null) => None,
        Some(p) => Some(p.as_i64().and_then(|p| i32::try_from(p).ok()).ok_or("partition_id must be an integer")?),
    };
    let mut headers = Vec::new();
    if let Some(hs) = obj.get("headers").filter(|h| !h.is_null()) {
        for h in hs.as_array().ok_or("headers must be an array")? {
            let name = h.get("name").and_then(Value::as_str).ok_or("a header needs a name")?;
            let value = match h.get("value") {
                None | Some(Value::Null) => None,
                Some(Value::String(s)) => Some(base64::engine::general_purpose::STANDARD.decode(s).map_err(|e| format!("header {name} is not base64: {e}"))?),
                Some(_) => return Err(format!("header {name} must be base64")),
            };
            headers.push((name.to_owned(), value));
        }
    }
    Ok(Rec { key: data(obj.get("key"), "key")?, value: data(obj.get("value"), "value")?, headers, partition })
}

/// Appends records (those that decoded) in one go: one batch per
/// partition, one writer round; each gets its delivery report (v3 shape)
/// or error, in order.
async fn produce_many(b: &Bridge, cluster: &str, t: &Arc<Topic>, recs: Vec<Result<Rec, String>>) -> Vec<(StatusCode, Value)> {
    let keyless = b.keyless(b.view().as_deref(), t);
    let fail = |status: StatusCode, code: u32, msg: String| (status, json!({"error_code": code, "message": msg}));
    let n = t.partitions();
    let mut reports: Vec<Option<(StatusCode, Value)>> = Vec::with_capacity(recs.len());
    let mut good: Vec<(usize, Rec, i32)> = Vec::with_capacity(recs.len());
    for (i, r) in recs.into_iter().enumerate() {
        reports.push(None);
        let r = match r {
            Ok(r) => r,
            Err(msg) => {
                reports[i] = Some(fail(StatusCode::BAD_REQUEST, 400, msg));
                continue;
            }
        };
        let p = match r.partition {
            Some(p) if !(0..n).contains(&p) => {
                reports[i] = Some(fail(StatusCode::NOT_FOUND, 40402, format!("Partition {p} not found.")));
                continue;
            }
            Some(p) => p,
            None => r.key.as_ref().map_or_else(|| keyless.pick(), |k| partition::for_key(k, n)),
        };
        good.push((i, r, p));
    }
    let records: Vec<NewRecord<'_>> = good.iter().map(|(_, r, _)| NewRecord { key: r.key.as_deref(), value: r.value.as_deref(), headers: r.headers.iter().map(|(k, v)| (k.as_str(), v.as_deref())).collect() }).collect();
    let placed: Vec<Result<i32, RestError>> = good.iter().map(|(_, _, p)| Ok(*p)).collect();
    let outcomes = if records.is_empty() { Vec::new() } else { super::append::append(b, t, &records, &placed, Ack::Durable).await };
    let now = b.engine.now_ms();
    for ((i, r, _), o) in good.iter().zip(outcomes) {
        reports[*i] = Some(match o {
            Ok((p, offset)) => (
                StatusCode::OK,
                json!({
                    "error_code": 200, "cluster_id": cluster, "topic_name": t.name(), "partition_id": p, "offset": offset,
                    "timestamp": now,
                    "key": r.key.as_ref().map(|k| json!({"type": "BINARY", "size": k.len()})),
                    "value": r.value.as_ref().map(|v| json!({"type": "BINARY", "size": v.len()})),
                }),
            ),
            Err((_, e)) => fail(e.status, e.code, e.message),
        });
    }
    reports.into_iter().map(|r| r.expect("every record answered")).collect()
}

/// Each JSON value of `raw` (concatenated or newline separated), decoded
/// as a record, or why not. Values are found first, as slices of `raw`,
/// so the request's memory can be held before records are built.
fn values(raw: &[u8]) -> Vec<Result<&serde_json::value::RawValue, String>> {
    let mut out = Vec::new();
    for v in serde_json::Deserializer::from_slice(raw).into_iter::<&serde_json::value::RawValue>() {
        match v {
            Ok(v) => out.push(Ok(v)),
            Err(e) => {
                // Nothing after a syntax error can be found reliably.
                out.push(Err(format!("not JSON: {e}")));
                break;
            }
        }
    }
    out
}

fn decode_raw(v: Result<&serde_json::value::RawValue, String>) -> Result<Rec, String> {
    let v: Value = serde_json::from_str(v?.get()).map_err(|e| format!("not JSON: {e}"))?;
    decode(&v)
}

/// The topic a produce writes to, and who produces (for its quota).
async fn topic_for(b: &Arc<Bridge>, cluster: &str, topic: &str, headers: &HeaderMap) -> Result<(Arc<Topic>, Option<String>), RestError> {
    let who = b.authorize(headers, Some(topic)).await?;
    check_cluster(b, cluster)?;
    Ok((b.topic(topic).await?, who))
}

/// `POST …/records`: one record, or (chunked) a stream of them.
pub async fn records(State(b): State<Arc<Bridge>>, Path((cluster, topic)): Path<(String, String)>, headers: HeaderMap, body: Body) -> Response {
    let (t, who) = match topic_for(&b, &cluster, &topic, &headers).await {
        Ok(t) => t,
        Err(e) => return e.into_response(),
    };
    let chunked = headers.get("transfer-encoding").is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"chunked"));
    if headers.get("content-encoding").is_some() || !chunked {
        // One record, or several in one body (a compressed body is read
        // whole): appended together, answered in order.
        let (raw, mut held) = match b.body(&headers, body).await {
            Ok(r) => r,
            Err(e) => return e.into_response(),
        };
        let _ = b.charge(who.as_deref(), raw.len());
        let found = values(&raw);
        if let Err(e) = b.hold_events(&mut held, found.len()) {
            return e.into_response();
        }
        let single = found.len() == 1;
        let recs: Vec<Result<Rec, String>> = found.into_iter().map(decode_raw).collect();
        let mut reports = produce_many(&b, &cluster, &t, recs).await;
        if single {
            let (status, body) = reports.pop().expect("one");
            return json_ok(status, body);
        }
        let mut out = String::new();
        for (_, report) in reports {
            out.push_str(&report.to_string());
            out.push('\n');
        }
        return (StatusCode::OK, [("content-type", "application/json")], out).into_response();
    }
    // Streaming: parse records as they arrive, answer each in order.
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Bytes, std::io::Error>>(64);
    tokio::spawn(async move {
        let line = |v: Value| Ok(Bytes::from(format!("{v}\n")));
        let stop = |code: u32, msg: String| line(json!({"error_code": code, "message": msg}));
        if let Err(e) = stream_records(&b, &cluster, &t, who.as_deref(), body, &tx).await {
            let _ = tx.send(stop(e.code, e.message)).await;
        }
    });
    let stream = tokio_stream_from(rx);
    (StatusCode::OK, [("content-type", "application/json")], Body::from_stream(stream)).into_response()
}

/// The streaming mode: each complete record is appended as soon as it is
/// in (all those that arrived together in one append) and its report sent,
/// in order. The bytes waiting for the rest of a record are held against
/// the in-flight budget; a chunk must come within the body timeout, and a
/// record must be whole within it of its first byte; a record may not be
/// larger than the body limit. Each byte is scanned once (`Splitter`).
async fn stream_records(b: &Arc<Bridge>, cluster: &str, t: &Arc<Topic>, who: Option<&str>, body: Body, tx: &tokio::sync::mpsc::Sender<Result<Bytes, std::io::Error>>) -> Result<(), RestError> {
    let limit = b.cfg.max_body_bytes;
    let deadline = b.cfg.body_timeout;
    let mut stream = body.into_data_stream();
    let mut buf = BytesMut::new();
    let mut held = b.reserve(0)?;
    let mut split = Splitter::default();
    let mut record_started: Option<std::time::Instant> = None;
    let mut done = false;
    loop {
        // Every complete value in the buffer.
        let mut found: Vec<Bytes> = Vec::new();
        while let Some((start, end)) = split.next_value(&buf, done) {
            let v = buf.split_to(end).freeze();
            found.push(v.slice(start..));
            split.consumed(end);
        }
        // Whitespace before the next value is not kept (nor held).
        let skip = split.skippable();
        let _ = buf.split_to(skip);
        split.consumed(skip);
        // A record under way has its own deadline, from when it was seen.
        if split.pending(&buf) == 0 {
            record_started = None;
        } else if record_started.is_none() {
            record_started = Some(std::time::Instant::now());
        }
        if !found.is_empty() {
            b.hold_events(&mut held, found.len())?;
            let recs: Vec<Result<Rec, String>> = found.iter().map(|v| serde_json::from_slice::<Value>(v).map_err(|e| format!("not JSON: {e}")).and_then(|v| decode(&v))).collect();
            for (_, report) in produce_many(b, cluster, t, recs).await {
                if tx.send(Ok(Bytes::from(format!("{report}\n")))).await.is_err() {
                    return Ok(());
                }
            }
            drop(found);
        }
        held.shrink_to(buf.len());
        if done {
            return Ok(());
        }
        let wait = match record_started {
            Some(at) => deadline.saturating_sub(at.elapsed()),
            None => deadline,
        };
        match tokio::time::timeout(wait, stream.next()).await {
            Err(_) => return Err(RestError::new(StatusCode::REQUEST_TIMEOUT, 408, format!("the next record did not arrive within {} ms", deadline.as_millis()))),
            Ok(Some(Ok(chunk))) => {
                // One record may not exceed the body limit.
                if split.pending(&buf) + chunk.len() > limit {
                    return Err(RestError::new(StatusCode::PAYLOAD_TOO_LARGE, 413, format!("a record exceeds {limit} bytes")));
                }
                held.absorb(b.reserve(chunk.len())?);
                // A stream over its producer quota is read no faster than
                // the quota (the client feels it as backpressure).
                let debt = b.charge(who, chunk.len());
                if !debt.is_zero() {
                    tokio::time::sleep(debt).await;
                }
                buf.extend_from_slice(&chunk);
            }
            Ok(Some(Err(e))) => {
                let _ = tx.send(Err(std::io::Error::other(e.to_string()))).await;
                return Ok(());
            }
            Ok(None) => done = true,
        }
    }
}

/// Finds where each top-level JSON value of a stream ends, keeping its
/// state between chunks, so every byte is looked at once however the
/// stream is cut (parsing the buffer again on each chunk made one large
/// record cost the square of its chunks).
#[derive(Debug, Default)]
struct Splitter {
    /// Next byte to look at.
    pos: usize,
    /// Where the value being scanned starts.
    start: usize,
    state: Scan,
    depth: usize,
    in_string: bool,
    escape: bool,
}

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
enum Scan {
    /// Between values.
    #[default]
    Idle,
    /// In an object, an array or a string.
    Nested,
    /// In a number or literal (true, false, null) or anything else.
    Bare,
}

impl Splitter {
    /// The (start, end) of the next complete value of `buf`, if it is in;
    /// at the end of the stream (`eof`) a bare value ends with the bytes.
    fn next_value(&mut self, buf: &[u8], eof: bool) -> Option<(usize, usize)> {
        while self.pos < buf.len() {
            let c = buf[self.pos];
            self.pos += 1;
            match self.state {
                Scan::Idle => {
                    if c.is_ascii_whitespace() {
                        continue;
                    }
                    self.start = self.pos - 1;
                    match c {
                        b'{' | b'[' => (self.state, self.depth) = (Scan::Nested, 1),
                        // A string at the top level: nested at depth 0.
                        b'"' => (self.state, self.depth, self.in_string) = (Scan::Nested, 0, true),
                        // A stray closing or separating byte is a value of
                        // its own (that does not parse).
                        b'}' | b']' | b',' | b':' => return Some((self.start, self.pos)),
                        _ => self.state = Scan::Bare,
                    }
                }
                Scan::Nested if self.in_string => {
                    if self.escape {
                        self.escape = false;
                    } else if c == b'\\' {
                        self.escape = true;
                    } else if c == b'"' {
                        self.in_string = false;
                    }
                }
                Scan::Nested => match c {
                    b'"' => self.in_string = true,
                    b'{' | b'[' => self.depth += 1,
                    b'}' | b']' => self.depth = self.depth.saturating_sub(1),
                    _ => {}
                },
                Scan::Bare => {
                    if c.is_ascii_whitespace() || b"{}[],:\"".contains(&c) {
                        self.pos -= 1;
                        self.state = Scan::Idle;
                        return Some((self.start, self.pos));
                    }
                }
            }
            if self.state == Scan::Nested && self.depth == 0 && !self.in_string {
                self.state = Scan::Idle;
                return Some((self.start, self.pos));
            }
        }
        if eof && self.state == Scan::Bare {
            self.state = Scan::Idle;
            return Some((self.start, self.pos));
        }
        if eof && self.state != Scan::Idle {
            // A value cut off by the end: what there is, which will not parse.
            self.state = Scan::Idle;
            return Some((self.start, self.pos));
        }
        None
    }

    /// The first `n` bytes were taken from the buffer.
    fn consumed(&mut self, n: usize) {
        self.pos -= n;
        self.start = self.start.saturating_sub(n);
    }

    /// Bytes at the front of the buffer that belong to no value (the
    /// whitespace before the next one).
    fn skippable(&self) -> usize {
        if self.state == Scan::Idle { self.pos } else { self.start }
    }

    /// Bytes of `buf` held for a value not yet complete.
    fn pending(&self, buf: &[u8]) -> usize {
        if self.state == Scan::Idle { 0 } else { buf.len() - self.start }
    }
}

fn tokio_stream_from(mut rx: tokio::sync::mpsc::Receiver<Result<Bytes, std::io::Error>>) -> impl futures_util::Stream<Item = Result<Bytes, std::io::Error>> {
    futures_util::stream::poll_fn(move |cx| rx.poll_recv(cx))
}

/// `POST …/records:batch`: `{"entries": [{"id", …record}]}`, answered 207
/// with the successes and failures by id.
pub async fn batch(State(b): State<Arc<Bridge>>, Path((cluster, topic)): Path<(String, String)>, headers: HeaderMap, body: Body) -> Response {
    let (t, who) = match topic_for(&b, &cluster, &topic, &headers).await {
        Ok(t) => t,
        Err(e) => return e.into_response(),
    };
    let (raw, mut held) = match b.body(&headers, body).await {
        Ok(r) => r,
        Err(e) => return e.into_response(),
    };
    let _ = b.charge(who.as_deref(), raw.len());
    #[derive(serde::Deserialize)]
    struct Entries<'a> {
        #[serde(borrow)]
        entries: Option<Vec<&'a serde_json::value::RawValue>>,
    }
    let entries = match serde_json::from_slice::<Entries<'_>>(&raw) {
        Ok(Entries { entries: Some(e) }) => e,
        Ok(_) => return RestError::unprocessable("the body needs an \"entries\" array").into_response(),
        Err(e) if e.is_data() => return RestError::unprocessable("the body needs an \"entries\" array").into_response(),
        Err(e) => return RestError::new(StatusCode::BAD_REQUEST, 400, format!("the body is not JSON: {e}")).into_response(),
    };
    if let Err(e) = b.hold_events(&mut held, entries.len()) {
        return e.into_response();
    }
    // Every entry decoded, then all appended together (one batch per
    // partition), then each answered by its id.
    let mut ids = Vec::with_capacity(entries.len());
    let mut recs = Vec::with_capacity(entries.len());
    for (i, e) in entries.iter().enumerate() {
        match serde_json::from_str::<Value>(e.get()) {
            Ok(v) => {
                ids.push(v.get("id").cloned().unwrap_or_else(|| json!(i.to_string())));
                recs.push(decode(&v));
            }
            Err(err) => {
                ids.push(json!(i.to_string()));
                recs.push(Err(format!("not JSON: {err}")));
            }
        }
    }
    let (mut successes, mut failures) = (Vec::new(), Vec::new());
    for ((status, mut report), id) in produce_many(&b, &cluster, &t, recs).await.into_iter().zip(ids) {
        report["id"] = id;
        if status == StatusCode::OK {
            successes.push(report);
        } else {
            failures.push(report);
        }
    }
    json_ok(StatusCode::MULTI_STATUS, json!({"successes": successes, "failures": failures}))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The values of `input` fed in pieces of `step` bytes.
    fn split(input: &str, step: usize) -> Vec<String> {
        let mut s = Splitter::default();
        let mut buf = BytesMut::new();
        let mut out = Vec::new();
        let bytes = input.as_bytes();
        let mut fed = 0;
        loop {
            let eof = fed == bytes.len();
            while let Some((start, end)) = s.next_value(&buf, eof) {
                let v = buf.split_to(end);
                out.push(String::from_utf8(v[start..].to_vec()).unwrap());
                s.consumed(end);
            }
            if eof {
                return out;
            }
            let n = step.min(bytes.len() - fed);
            buf.extend_from_slice(&bytes[fed..fed + n]);
            fed += n;
        }
    }

    #[test]
    fn values_are_found_however_the_stream_is_cut() {
        let input = r#" {"value":{"a":[1,{"b":"}]\"{"}]}} [1,2] "s\"}" 42 true{"x":"y"}
null"#;
        let want = vec![r#"{"value":{"a":[1,{"b":"}]\"{"}]}}"#, "[1,2]", r#""s\"}""#, "42", "true", r#"{"x":"y"}"#, "null"];
        for step in [1, 2, 3, 7, 100, 1000] {
            assert_eq!(split(input, step), want, "step {step}");
        }
    }

    #[test]
    fn garbage_and_cut_off_values_come_out_as_values_that_do_not_parse() {
        assert_eq!(split("} {\"a\":1}", 1), vec!["}", "{\"a\":1}"]);
        assert_eq!(split("{\"a\":", 2), vec!["{\"a\":"]);
    }

    #[test]
    fn every_byte_is_scanned_once() {
        // One 1 MB record in 1-byte chunks: the scan position only moves on.
        let big = format!("{{\"value\":\"{}\"}}", "x".repeat(1 << 20));
        let mut s = Splitter::default();
        let mut buf = BytesMut::new();
        let mut looked = 0;
        for b in big.as_bytes() {
            buf.extend_from_slice(&[*b]);
            let before = s.pos;
            let got = s.next_value(&buf, false);
            looked += s.pos - before;
            if got.is_some() {
                break;
            }
        }
        assert_eq!(looked, big.len());
    }
}
