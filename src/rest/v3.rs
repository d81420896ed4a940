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
    if id == b.engine.cluster_id() {
        Ok(())
    } else {
        Err(RestError::new(StatusCode::NOT_FOUND, 404, format!("Cluster {id} not found.")))
    }
}

pub async fn clusters(State(b): State<Arc<Bridge>>, headers: HeaderMap) -> Response {
    if let Err(e) = b.authorize(&headers, None) {
        return e.into_response();
    }
    json_ok(StatusCode::OK, json!({"kind": "KafkaClusterList", "metadata": {}, "data": [{"kind": "KafkaCluster", "cluster_id": b.engine.cluster_id()}]}))
}

pub async fn topics(State(b): State<Arc<Bridge>>, Path(cluster): Path<String>, headers: HeaderMap) -> Response {
    if let Err(e) = b.authorize(&headers, None).and_then(|_| check_cluster(&b, &cluster)) {
        return e.into_response();
    }
    let data: Vec<Value> = b
        .engine
        .topics()
        .iter()
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

/// Appends one record; its delivery report (v3 shape) or error.
async fn produce_one(b: &Bridge, cluster: &str, t: &Arc<Topic>, r: Result<Rec, String>) -> (StatusCode, Value) {
    let fail = |status: StatusCode, code: u32, msg: String| (status, json!({"error_code": code, "message": msg}));
    let r = match r {
        Ok(r) => r,
        Err(msg) => return fail(StatusCode::BAD_REQUEST, 400, msg),
    };
    let n = t.partitions();
    let p = match r.partition {
        Some(p) if !(0..n).contains(&p) => return fail(StatusCode::NOT_FOUND, 40402, format!("Partition {p} not found.")),
        Some(p) => p,
        None => r.key.as_ref().map_or_else(|| b.round_robin.pick(n), |k| partition::for_key(k, n)),
    };
    let rec = NewRecord { key: r.key.as_deref(), value: r.value.as_deref(), headers: r.headers.iter().map(|(k, v)| (k.as_str(), v.as_deref())).collect() };
    let out = super::append::append(b, t, &[rec], &[Ok(p)], Ack::Durable).await;
    match out.into_iter().next().expect("one outcome") {
        Ok((p, offset)) => (
            StatusCode::OK,
            json!({
                "error_code": 200, "cluster_id": cluster, "topic_name": t.name(), "partition_id": p, "offset": offset,
                "timestamp": b.engine.now_ms(),
                "key": r.key.as_ref().map(|k| json!({"type": "BINARY", "size": k.len()})),
                "value": r.value.as_ref().map(|v| json!({"type": "BINARY", "size": v.len()})),
            }),
        ),
        Err((_, e)) => fail(e.status, e.code, e.message),
    }
}

async fn topic_for(b: &Arc<Bridge>, cluster: &str, topic: &str, headers: &HeaderMap) -> Result<Arc<Topic>, RestError> {
    b.authorize(headers, Some(topic))?;
    check_cluster(b, cluster)?;
    b.topic(topic).await
}

/// `POST …/records`: one record, or (chunked) a stream of them.
pub async fn records(State(b): State<Arc<Bridge>>, Path((cluster, topic)): Path<(String, String)>, headers: HeaderMap, body: Body) -> Response {
    let t = match topic_for(&b, &cluster, &topic, &headers).await {
        Ok(t) => t,
        Err(e) => return e.into_response(),
    };
    let chunked = headers.get("transfer-encoding").is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"chunked"));
    if headers.get("content-encoding").is_some() || !chunked {
        // One record (a compressed body is read whole).
        let (raw, _held) = match b.body(&headers, body).await {
            Ok(r) => r,
            Err(e) => return e.into_response(),
        };
        let values: Vec<Result<Value, String>> = serde_json::Deserializer::from_slice(&raw).into_iter::<Value>().map(|v| v.map_err(|e| format!("not JSON: {e}"))).collect();
        if values.len() == 1 {
            let v = values.into_iter().next().expect("one");
            let (status, body) = produce_one(&b, &cluster, &t, v.and_then(|v| decode(&v))).await;
            return json_ok(status, body);
        }
        let mut out = String::new();
        for v in values {
            let (_, report) = produce_one(&b, &cluster, &t, v.and_then(|v| decode(&v))).await;
            out.push_str(&report.to_string());
            out.push('\n');
        }
        return (StatusCode::OK, [("content-type", "application/json")], out).into_response();
    }
    // Streaming: parse records as they arrive, answer each in order.
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Bytes, std::io::Error>>(64);
    let limit = b.cfg.max_body_bytes;
    tokio::spawn(async move {
        let mut stream = body.into_data_stream();
        let mut buf = BytesMut::new();
        loop {
            // Every complete value in the buffer.
            let mut consumed = 0;
            let mut values = Vec::new();
            {
                let mut it = serde_json::Deserializer::from_slice(&buf).into_iter::<Value>();
                loop {
                    match it.next() {
                        Some(Ok(v)) => {
                            consumed = it.byte_offset();
                            values.push(Ok(v));
                        }
                        Some(Err(e)) if e.is_eof() => break,
                        Some(Err(e)) => {
                            values.push(Err(format!("not JSON: {e}")));
                            consumed = buf.len();
                            break;
                        }
                        None => {
                            consumed = buf.len();
                            break;
                        }
                    }
                }
            }
            let _ = buf.split_to(consumed);
            for v in values {
                let (_, report) = produce_one(&b, &cluster, &t, v.and_then(|v| decode(&v))).await;
                let mut line = report.to_string().into_bytes();
                line.push(b'\n');
                if tx.send(Ok(Bytes::from(line))).await.is_err() {
                    return;
                }
            }
            match stream.next().await {
                Some(Ok(chunk)) => {
                    buf.extend_from_slice(&chunk);
                    // One record may not exceed the body limit.
                    if buf.len() > limit {
                        let e = json!({"error_code": 413, "message": format!("a record exceeds {limit} bytes")});
                        let _ = tx.send(Ok(Bytes::from(format!("{e}\n")))).await;
                        return;
                    }
                }
                Some(Err(e)) => {
                    let _ = tx.send(Err(std::io::Error::other(e.to_string()))).await;
                    return;
                }
                None => return,
            }
        }
    });
    let stream = tokio_stream_from(rx);
    (StatusCode::OK, [("content-type", "application/json")], Body::from_stream(stream)).into_response()
}

fn tokio_stream_from(mut rx: tokio::sync::mpsc::Receiver<Result<Bytes, std::io::Error>>) -> impl futures_util::Stream<Item = Result<Bytes, std::io::Error>> {
    futures_util::stream::poll_fn(move |cx| rx.poll_recv(cx))
}

/// `POST …/records:batch`: `{"entries": [{"id", …record}]}`, answered 207
/// with the successes and failures by id.
pub async fn batch(State(b): State<Arc<Bridge>>, Path((cluster, topic)): Path<(String, String)>, headers: HeaderMap, body: Body) -> Response {
    let t = match topic_for(&b, &cluster, &topic, &headers).await {
        Ok(t) => t,
        Err(e) => return e.into_response(),
    };
    let (raw, _held) = match b.body(&headers, body).await {
        Ok(r) => r,
        Err(e) => return e.into_response(),
    };
    let doc: Value = match serde_json::from_slice(&raw) {
        Ok(v) => v,
        Err(e) => return RestError::new(StatusCode::BAD_REQUEST, 400, format!("the body is not JSON: {e}")).into_response(),
    };
    let Some(entries) = doc.get("entries").and_then(Value::as_array) else {
        return RestError::unprocessable("the body needs an \"entries\" array").into_response();
    };
    let (mut successes, mut failures) = (Vec::new(), Vec::new());
    for (i, e) in entries.iter().enumerate() {
        let id = e.get("id").cloned().unwrap_or_else(|| json!(i.to_string()));
        let (status, mut report) = produce_one(&b, &cluster, &t, decode(e)).await;
        report["id"] = id;
        if status == StatusCode::OK {
            successes.push(report);
        } else {
            failures.push(report);
        }
    }
    json_ok(StatusCode::MULTI_STATUS, json!({"successes": successes, "failures": failures}))
}
