//! Confluent REST Proxy v2: produce and topic listing.
//!
//! `POST /topics/{topic}` with `application/vnd.kafka.json.v2+json` (keys
//! and values are JSON, stored as their JSON text) or
//! `application/vnd.kafka.binary.v2+json` (base64) bodies of
//! `{"records":[{"key","value","partition","headers"}]}`; headers are
//! `[{"name": …, "value": base64 or null}]`. Records are grouped per
//! partition into one batch each; every partition is submitted before any
//! is awaited, so a request shares one writer round and one fsync.
//! Answered after the batches are durable (acks=all).

use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use base64::Engine as _;
use serde_json::Value;

use super::{partition, Bridge, RestError};
use crate::engine::{Ack, Topic};
use crate::protocol::batch::NewRecord;

const CONTENT_TYPE: &str = "application/vnd.kafka.v2+json";

/// The embedded format a request's Content-Type names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Format {
    Json,
    Binary,
}

fn format(headers: &HeaderMap) -> Result<Format, RestError> {
    let ct = headers.get("content-type").and_then(|v| v.to_str().ok()).unwrap_or("");
    let ct = ct.split(';').next().unwrap_or("").trim().to_ascii_lowercase();
    match ct.as_str() {
        "application/vnd.kafka.json.v2+json" | "application/vnd.kafka.json.v1+json" | "application/json" | "application/vnd.kafka.v2+json" => Ok(Format::Json),
        "application/vnd.kafka.binary.v2+json" | "application/vnd.kafka.binary.v1+json" => Ok(Format::Binary),
        t if ["avro", "protobuf", "jsonschema"].iter().any(|f| t.starts_with(&format!("application/vnd.kafka.{f}."))) => Err(RestError::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            415,
            format!("{t}: schema-based formats are not supported by Canopy (no schema registry); use the json or binary format"),
        )),
        _ => Err(RestError::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            415,
            format!("unsupported Content-Type {ct:?}: use application/vnd.kafka.json.v2+json or application/vnd.kafka.binary.v2+json"),
        )),
    }
}

fn ok(body: Value) -> Response {
    (StatusCode::OK, [("content-type", CONTENT_TYPE)], body.to_string()).into_response()
}

pub async fn list_topics(State(b): State<Arc<Bridge>>, headers: HeaderMap) -> Response {
    let may = match b.authorize(&headers, None).await {
        Ok(who) => b.describable(who),
        Err(e) => return e.into_response(),
    };
    let names: Vec<String> = b.engine.topics().iter().map(|t| t.name().to_owned()).filter(|n| may(n) && !crate::engine::topics::is_internal(n)).collect();
    ok(serde_json::json!(names))
}

pub async fn get_topic(State(b): State<Arc<Bridge>>, Path(topic): Path<String>, headers: HeaderMap) -> Response {
    let visible = match b.authorize(&headers, None).await {
        Ok(who) => b.describable(who)(&topic),
        Err(e) => return e.into_response(),
    };
    let Some(t) = b.engine.topic(&topic).filter(|_| visible) else { return RestError::topic_not_found(&topic).into_response() };
    let partitions: Vec<Value> = (0..t.partitions())
        .map(|p| serde_json::json!({"partition": p, "leader": 0, "replicas": [{"broker": 0, "leader": true, "in_sync": true}]}))
        .collect();
    ok(serde_json::json!({"name": t.name(), "configs": t.record.configs, "partitions": partitions}))
}

pub async fn produce_topic(State(b): State<Arc<Bridge>>, Path(topic): Path<String>, headers: HeaderMap, body: Body) -> Response {
    produce(b, topic, None, headers, body).await.unwrap_or_else(IntoResponse::into_response)
}

pub async fn produce_partition(State(b): State<Arc<Bridge>>, Path((topic, partition)): Path<(String, String)>, headers: HeaderMap, body: Body) -> Response {
    let Ok(p) = partition.parse::<i32>() else {
        return RestError::partition_not_found(-1).into_response();
    };
    produce(b, topic, Some(p), headers, body).await.unwrap_or_else(IntoResponse::into_response)
}

/// One record of a request, decoded.
struct Decoded {
    key: Option<Vec<u8>>,
    value: Option<Vec<u8>>,
    headers: Vec<(String, Option<Vec<u8>>)>,
    partition: Option<i32>,
}

/// The envelope, each record left as its text: one slice per record,
/// whatever the records hold, so the request's memory can be counted
/// before each record is decoded.
#[derive(serde::Deserialize)]
struct Envelope<'a> {
    #[serde(borrow)]
    records: Option<Vec<&'a serde_json::value::RawValue>>,
}

fn envelope(body: &[u8]) -> Result<Vec<&serde_json::value::RawValue>, RestError> {
    let doc: Envelope<'_> = match serde_json::from_slice(body) {
        Ok(d) => d,
        // Valid JSON of another shape (no object, records not an array).
        Err(e) if e.is_data() => return Err(RestError::unprocessable("the body needs a \"records\" array")),
        Err(e) => return Err(RestError::new(StatusCode::BAD_REQUEST, 400, format!("the body is not JSON: {e}"))),
    };
    doc.records.ok_or_else(|| RestError::unprocessable("the body needs a \"records\" array"))
}

fn decode_records(raw: &[&serde_json::value::RawValue], fmt: Format) -> Result<Vec<Decoded>, RestError> {
    let b64 = base64::engine::general_purpose::STANDARD;
    let field = |i: usize, name: &str, v: Option<&Value>| -> Result<Option<Vec<u8>>, RestError> {
        match (v, fmt) {
            (None | Some(Value::Null), _) => Ok(None),
            (Some(v), Format::Json) => Ok(Some(v.to_string().into_bytes())),
            (Some(Value::String(s)), Format::Binary) => {
                b64.decode(s).map(Some).map_err(|e| RestError::unprocessable(format!("record {i}: {name} is not base64: {e}")))
            }
            (Some(_), Format::Binary) => Err(RestError::unprocessable(format!("record {i}: {name} must be a base64 string"))),
        }
    };
    let mut out = Vec::with_capacity(raw.len());
    for (i, r) in raw.iter().enumerate() {
        let r: Value = serde_json::from_str(r.get()).map_err(|e| RestError::new(StatusCode::BAD_REQUEST, 400, format!("record {i} is not JSON: {e}")))?;
        let Some(obj) = r.as_object() else { return Err(RestError::unprocessable(format!("record {i} is not an object"))) };
        let partition = match obj.get("partition") {
            None | Some(Value::Null) => None,
            Some(p) => Some(p.as_i64().and_then(|p| i32::try_from(p).ok()).ok_or_else(|| RestError::unprocessable(format!("record {i}: partition must be an integer")))?),
        };
        let mut headers = Vec::new();
        match obj.get("headers") {
            None | Some(Value::Null) => {}
            Some(Value::Array(hs)) => {
                for h in hs {
                    let name = h.get("name").and_then(Value::as_str).ok_or_else(|| RestError::unprocessable(format!("record {i}: a header needs a \"name\"")))?;
                    let value = match h.get("value") {
                        None | Some(Value::Null) => None,
                        Some(Value::String(s)) => Some(b64.decode(s).map_err(|e| RestError::unprocessable(format!("record {i}: header {name} is not base64: {e}")))?),
                        Some(_) => return Err(RestError::unprocessable(format!("record {i}: header {name} must be base64"))),
                    };
                    headers.push((name.to_owned(), value));
                }
            }
            Some(_) => return Err(RestError::unprocessable(format!("record {i}: headers must be an array"))),
        }
        out.push(Decoded { key: field(i, "key", obj.get("key"))?, value: field(i, "value", obj.get("value"))?, headers, partition });
    }
    Ok(out)
}


async fn produce(b: Arc<Bridge>, topic: String, route_partition: Option<i32>, headers: HeaderMap, body: Body) -> Result<Response, RestError> {
    let who = b.authorize(&headers, Some(&topic)).await?;
    let fmt = format(&headers)?;
    let (body, mut held) = b.body(&headers, body).await?;
    let _ = b.charge(who.as_deref(), body.len());
    let raw = envelope(&body)?;
    b.hold_events(&mut held, raw.len())?;
    let records = decode_records(&raw, fmt)?;
    drop(raw);
    let t: Arc<Topic> = b.topic(&topic).await?;
    let n = t.partitions();
    if let Some(p) = route_partition {
        if !(0..n).contains(&p) {
            return Err(RestError::partition_not_found(p));
        }
    }
    // Each record's partition, or its error.
    let keyless = b.keyless(b.view().as_deref(), &t);
    let placed: Vec<Result<i32, (u32, String)>> = records
        .iter()
        .map(|r| match route_partition.or(r.partition) {
            Some(p) if (0..n).contains(&p) => Ok(p),
            Some(p) => Err((40402, format!("Partition {p} not found."))),
            None => Ok(match &r.key {
                Some(k) => partition::for_key(k, n),
                None => keyless.pick(),
            }),
        })
        .collect();
    let recs: Vec<NewRecord<'_>> = records
        .iter()
        .map(|r| NewRecord { key: r.key.as_deref(), value: r.value.as_deref(), headers: r.headers.iter().map(|(k, v)| (k.as_str(), v.as_deref())).collect() })
        .collect();
    let placed: Vec<Result<i32, RestError>> = placed.into_iter().map(|p| p.map_err(|(code, msg)| RestError::new(StatusCode::NOT_FOUND, code, msg))).collect();
    let outcome = super::append::append(&b, &t, &recs, &placed, Ack::Durable).await;
    let result: Vec<Value> = outcome
        .into_iter()
        .map(|o| match o {
            Ok((p, offset)) => serde_json::json!({"partition": p, "offset": offset, "error_code": null, "error": null}),
            Err((p, e)) => serde_json::json!({"partition": p, "offset": null, "error_code": e.code, "error": e.message}),
        })
        .collect();
    Ok(ok(serde_json::json!({"offsets": result, "key_schema_id": null, "value_schema_id": null})))
}
