//! Fetch with long polling.
//!
//! A fetch that finds fewer than `min_bytes` registers with the engine for
//! every tp it asked about *before* it reads, then sleeps until one of them
//! moves or `max_wait_ms` runs out: a record produced while the fetch waits
//! wakes it at once, never on a timer. Reads run on tokio's blocking pool.
//!
//! Fetch sessions (KIP-227) are not offered: the response carries session
//! id 0, which clients take as "send full fetch requests".

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use kafka_protocol::messages::fetch_response::{FetchableTopicResponse, PartitionData};
pub use kafka_protocol::messages::{FetchRequest as Request, FetchResponse as Response};
use kafka_protocol::messages::TopicName;
use kafka_protocol::protocol::VersionRange;
use kafka_protocol::ResponseError;
use tokio::sync::Notify;

use super::Route;
use crate::engine::{Engine, EngineError, Topic};
use crate::kafka::{errors, Broker};
use crate::protocol::header::RequestHeader;
use crate::storage::Tp;

pub const VERSIONS: VersionRange = VersionRange { min: 4, max: 12 };

pub fn special(_: &Arc<Broker>, _: &RequestHeader, _: &Bytes) -> Option<Route> {
    None
}

struct Want {
    partition: i32,
    topic: Option<Arc<Topic>>,
    offset: i64,
    max_bytes: usize,
}

pub async fn handle(broker: &Broker, req: Request, version: i16) -> Option<Response> {
    if req.session_id > 0 {
        return Some(Response::default().with_error_code(ResponseError::FetchSessionIdNotFound.code()));
    }
    let wait = Duration::from_millis(req.max_wait_ms.max(0) as u64).min(broker.cfg.max_fetch_wait);
    let deadline = tokio::time::Instant::now() + wait;
    let min_bytes = req.min_bytes.max(0) as usize;
    let max_bytes = req.max_bytes.max(0) as usize;
    let wants: Arc<Vec<(TopicName, Vec<Want>)>> = Arc::new(
        req.topics
            .into_iter()
            .map(|t| {
                let topic = broker.engine.topic(super::name(&t.topic));
                let parts = t
                    .partitions
                    .into_iter()
                    .map(|p| Want { partition: p.partition, topic: topic.clone(), offset: p.fetch_offset, max_bytes: p.partition_max_bytes.max(0) as usize })
                    .collect();
                (t.topic, parts)
            })
            .collect(),
    );
    let tps: Vec<Tp> = wants.iter().flat_map(|(_, ps)| ps.iter().filter_map(|w| w.topic.as_ref().map(|t| t.tp(w.partition)))).collect();
    loop {
        let notify = Arc::new(Notify::new());
        let may_wait = tokio::time::Instant::now() < deadline && !tps.is_empty();
        if may_wait {
            broker.engine.subscribe(&tps, &notify);
        }
        let engine = broker.engine.clone();
        let w = wants.clone();
        let (topics, bytes, errors) = tokio::task::spawn_blocking(move || read_all(&engine, &w, max_bytes, version)).await.ok()?;
        if !may_wait || bytes >= min_bytes.max(1) || errors {
            return Some(Response::default().with_responses(topics));
        }
        tokio::select! {
            _ = notify.notified() => {}
            _ = tokio::time::sleep_until(deadline) => {}
        }
        if tokio::time::Instant::now() >= deadline {
            // One last read so data that arrived with the deadline is sent.
            let engine = broker.engine.clone();
            let w = wants.clone();
            let (topics, _, _) = tokio::task::spawn_blocking(move || read_all(&engine, &w, max_bytes, version)).await.ok()?;
            return Some(Response::default().with_responses(topics));
        }
    }
}

/// Reads every wanted partition; returns the response topics, the record
/// bytes gathered and whether any partition carries an error.
fn read_all(engine: &Engine, wants: &[(TopicName, Vec<Want>)], max_bytes: usize, version: i16) -> (Vec<FetchableTopicResponse>, usize, bool) {
    let mut total = 0usize;
    let mut any_error = false;
    let topics = wants
        .iter()
        .map(|(name, parts)| {
            let partitions = parts
                .iter()
                .map(|w| {
                    let mut pd = PartitionData::default().with_partition_index(w.partition).with_high_watermark(-1).with_last_stable_offset(-1).with_log_start_offset(-1);
                    let Some(topic) = &w.topic else {
                        any_error = true;
                        return pd.with_error_code(ResponseError::UnknownTopicOrPartition.code());
                    };
                    if w.partition < 0 || w.partition >= topic.partitions() {
                        any_error = true;
                        return pd.with_error_code(ResponseError::UnknownTopicOrPartition.code());
                    }
                    let tp = topic.tp(w.partition);
                    let room = max_bytes.saturating_sub(total).min(w.max_bytes);
                    let result = if room == 0 && total > 0 {
                        // The response is full: report offsets, no records.
                        engine.offsets(&tp).map(|(ls, hw, leo)| crate::storage::ReadResult { records: Bytes::new(), high_watermark: hw, log_start: ls, log_end: leo, bytes_scanned: 0 }).ok_or(EngineError::UnknownTopicOrPartition)
                    } else {
                        engine.read(&tp, w.offset, room.max(1), total == 0)
                    };
                    match result {
                        Ok(r) => {
                            total += r.records.len();
                            pd = pd.with_high_watermark(r.high_watermark).with_last_stable_offset(r.high_watermark).with_records(Some(r.records));
                            if version >= 5 {
                                pd = pd.with_log_start_offset(r.log_start);
                            }
                            pd
                        }
                        Err(e) => {
                            any_error = true;
                            if let Some((ls, hw, _)) = engine.offsets(&tp) {
                                pd = pd.with_high_watermark(hw).with_last_stable_offset(hw);
                                if version >= 5 {
                                    pd = pd.with_log_start_offset(ls);
                                }
                            }
                            pd.with_error_code(errors::code(&e))
                        }
                    }
                })
                .collect();
            FetchableTopicResponse::default().with_topic(name.clone()).with_partitions(partitions)
        })
        .collect();
    (topics, total, any_error)
}
