//! ListOffsets: earliest (-2), latest (-1: the high watermark, or for
//! `read_committed` the last stable offset), max timestamp (-3, v7+),
//! earliest local (-4, v8+: the log start, nothing is tiered), latest
//! tiered (-5, v9+: offset -1, nothing is tiered) and by timestamp, through
//! the time index. A special timestamp the version may not ask for, or an
//! unknown one, is UNSUPPORTED_VERSION, as in Kafka. v10's timeout is for
//! remote storage; answers here never wait. Subtree streams answer earliest
//! and latest; a lookup by time gets INVALID_REQUEST (they have no time
//! index).

use kafka_protocol::messages::list_offsets_response::{ListOffsetsPartitionResponse, ListOffsetsTopicResponse};
pub use kafka_protocol::messages::{ListOffsetsRequest as Request, ListOffsetsResponse as Response};
use kafka_protocol::protocol::VersionRange;
use kafka_protocol::ResponseError;

use crate::auth::acl::Operation;
use crate::engine::subtree::Subtree;
use crate::engine::Engine;
use crate::kafka::authz::Check;
use crate::kafka::{errors, Broker};

pub const VERSIONS: VersionRange = VersionRange { min: 1, max: 10 };

const LATEST: i64 = -1;
const EARLIEST: i64 = -2;
const MAX_TIMESTAMP: i64 = -3;
const EARLIEST_LOCAL: i64 = -4;
const LATEST_TIERED: i64 = -5;

/// Whether a special (negative) timestamp is not one this version may ask
/// for: Kafka answers those UNSUPPORTED_VERSION (unknown ones included).
fn unsupported(ts: i64, version: i16) -> bool {
    let since = match ts {
        LATEST | EARLIEST => 1,
        MAX_TIMESTAMP => 7,
        EARLIEST_LOCAL => 8,
        LATEST_TIERED => 9,
        ts if ts < 0 => i16::MAX,
        _ => 0,
    };
    version < since
}

pub async fn handle(broker: &Broker, req: Request, version: i16) -> Option<Response> {
    let engine = broker.engine.clone();
    let committed = req.isolation_level == 1;
    // DESCRIBE on each topic (or stream name), as Kafka asks.
    let check = broker.authorizer.enabled().then(|| Check::current(broker));
    // Which partitions this node leads, in which epoch (KIP-320).
    let view = broker.cluster.view();
    let led: std::collections::HashMap<(String, i32), Result<i32, crate::kafka::NotLeader>> =
        req.topics.iter().flat_map(|t| t.partitions.iter().map(move |p| (super::name(&t.name).to_owned(), p.partition_index))).map(|(n, p)| {
            let l = broker.lead(&view, &n, p);
            ((n, p), l)
        }).collect();
    // Subtree streams this node may not serve (cluster mode).
    let stream_refused: std::collections::HashMap<String, i16> = req
        .topics
        .iter()
        .filter_map(|t| {
            let s = broker.engine.subtree(super::name(&t.name))?;
            let server = broker.serve_stream(&view, &s).err()?;
            Some((super::name(&t.name).to_owned(), crate::kafka::stream_refusal(server)))
        })
        .collect();
    let topics = tokio::task::spawn_blocking(move || {
        // As Kafka: a partition named twice gets one answer, INVALID_REQUEST.
        let twice = super::repeated(req.topics.iter().flat_map(|t| t.partitions.iter().map(|p| (t.name.0.clone(), p.partition_index))));
        let mut answered = std::collections::HashSet::new();
        req.topics
            .into_iter()
            .map(|t| {
                let denied = check.as_ref().is_some_and(|c| !c.topic(Operation::Describe, super::name(&t.name)));
                let topic = engine.topic(super::name(&t.name));
                let subtree = if topic.is_none() { engine.subtree(super::name(&t.name)) } else { None };
                let partitions = t
                    .partitions
                    .into_iter()
                    .filter(|p| !twice.contains(&(t.name.0.clone(), p.partition_index)) || answered.insert((t.name.0.clone(), p.partition_index)))
                    .map(|p| {
                        let r = ListOffsetsPartitionResponse::default().with_partition_index(p.partition_index).with_timestamp(-1).with_offset(-1);
                        if twice.contains(&(t.name.0.clone(), p.partition_index)) {
                            return r.with_error_code(ResponseError::InvalidRequest.code());
                        }
                        if unsupported(p.timestamp, version) {
                            return r.with_error_code(ResponseError::UnsupportedVersion.code());
                        }
                        if denied {
                            return r.with_error_code(ResponseError::TopicAuthorizationFailed.code());
                        }
                        if let (Some(s), 0) = (&subtree, p.partition_index) {
                            if let Some(code) = stream_refused.get(super::name(&t.name)) {
                                return r.with_error_code(*code);
                            }
                            return lookup_subtree(&engine, s, p.timestamp, r, version);
                        }
                        match &topic {
                            Some(topic) if p.partition_index >= 0 && p.partition_index < topic.partitions() => match led.get(&(topic.name().to_owned(), p.partition_index)).copied().unwrap_or(Err(crate::kafka::NotLeader { leader: -1, leader_epoch: -1 })) {
                                Err(_) => r.with_error_code(ResponseError::NotLeaderOrFollower.code()),
                                Ok(epoch) => match crate::kafka::epoch_error(p.current_leader_epoch, epoch) {
                                    Some(code) => r.with_error_code(code),
                                    None => lookup(&engine, &topic.tp(p.partition_index), p.timestamp, committed, r, version, epoch),
                                },
                            },
                            _ => r.with_error_code(ResponseError::UnknownTopicOrPartition.code()),
                        }
                    })
                    .collect();
                ListOffsetsTopicResponse::default().with_name(t.name).with_partitions(partitions)
            })
            .collect::<Vec<_>>()
    })
    .await
    .ok()?;
    Some(Response::default().with_topics(topics))
}

/// A subtree stream knows its start and end; it has no time index.
fn lookup_subtree(engine: &Engine, s: &Subtree, ts: i64, r: ListOffsetsPartitionResponse, version: i16) -> ListOffsetsPartitionResponse {
    let (log_start, hw) = engine.subtree_offsets(s);
    let r = if version >= 4 { r.with_leader_epoch(0) } else { r };
    match ts {
        LATEST => r.with_offset(hw),
        EARLIEST | EARLIEST_LOCAL => r.with_offset(log_start),
        LATEST_TIERED => r.with_leader_epoch(-1),
        _ => r.with_error_code(ResponseError::InvalidRequest.code()),
    }
}

fn lookup(engine: &Engine, tp: &crate::storage::Tp, ts: i64, committed: bool, r: ListOffsetsPartitionResponse, version: i16, epoch: i32) -> ListOffsetsPartitionResponse {
    let Some((log_start, hw, _)) = engine.offsets(tp) else {
        return r.with_error_code(ResponseError::UnknownTopicOrPartition.code());
    };
    let r = if version >= 4 { r.with_leader_epoch(epoch) } else { r };
    match ts {
        LATEST if committed => r.with_offset(engine.last_stable_offset(tp, hw)),
        LATEST => r.with_offset(hw),
        EARLIEST | EARLIEST_LOCAL => r.with_offset(log_start),
        // Nothing is tiered: offset -1 and epoch -1, as Kafka answers when
        // remote storage is off.
        LATEST_TIERED => r.with_leader_epoch(-1),
        // The record with the largest timestamp (the first of them), not
        // the last record: Kafka 3.7 and later.
        MAX_TIMESTAMP => match engine.offset_of_max_timestamp(tp) {
            Ok(Some((offset, ts))) => r.with_offset(offset).with_timestamp(ts),
            Ok(None) => r,
            Err(e) => r.with_error_code(errors::code(&e)),
        },
        ts => match engine.offset_for_timestamp(tp, ts) {
            Ok(Some((offset, found_ts))) => r.with_offset(offset).with_timestamp(found_ts),
            Ok(None) => r,
            Err(e) => r.with_error_code(errors::code(&e)),
        },
    }
}
