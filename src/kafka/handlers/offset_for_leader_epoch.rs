//! OffsetForLeaderEpoch. Clients use it to validate their position after
//! a leader change (KIP-320): the answer is the largest epoch at or below
//! the one asked for, with where it ends. In cluster mode that comes from
//! the leader's epoch cache, as Kafka's `LeaderEpochFileCache.endOffsetFor`
//! answers: the log end for the latest epoch, else the start of the next
//! epoch. Never the high watermark: a new leader's lags behind the one its
//! predecessor had let consumers read up to, and librdkafka takes an end
//! below its fetch position for a truncation and seeks back to it, dropping
//! the records it had fetched but not yet handed to the application, which
//! are then skipped (the nemesis found this). A log without epochs
//! (single-node mode: every epoch is 0, and one copy never diverged) ends
//! at the high watermark for every epoch, answered with the epoch asked
//! for (capped at the leader's). A partition this node does not lead is
//! NOT_LEADER_OR_FOLLOWER; a `current_leader_epoch` other than the
//! leader's is FENCED_LEADER_EPOCH or UNKNOWN_LEADER_EPOCH.

use kafka_protocol::messages::offset_for_leader_epoch_response::{EpochEndOffset, OffsetForLeaderTopicResult};
pub use kafka_protocol::messages::{OffsetForLeaderEpochRequest as Request, OffsetForLeaderEpochResponse as Response};
use kafka_protocol::protocol::VersionRange;
use kafka_protocol::ResponseError;

use crate::auth::acl::Operation;
use crate::kafka::authz;
use crate::kafka::Broker;

pub const VERSIONS: VersionRange = VersionRange { min: 2, max: 4 };

pub async fn handle(broker: &Broker, req: Request, _version: i16) -> Option<Response> {
    // DESCRIBE on each topic, as Kafka asks of clients.
    let check = broker.authorizer.enabled().then(|| authz::Check::current(broker));
    let view = broker.cluster.view();
    let topics = req
        .topics
        .into_iter()
        .map(|t| {
            let denied = check.as_ref().is_some_and(|c| !c.topic(Operation::Describe, super::name(&t.topic)));
            let topic = broker.engine.topic(super::name(&t.topic)).filter(|_| !denied);
            let subtree = if topic.is_none() { broker.engine.subtree(super::name(&t.topic)) } else { None };
            let partitions = t
                .partitions
                .into_iter()
                .map(|p| {
                    let r = EpochEndOffset::default().with_partition(p.partition).with_leader_epoch(-1).with_end_offset(-1);
                    let offsets = match (&subtree, p.partition) {
                        (Some(s), 0) => Some(broker.engine.subtree_offsets(s)).map(|(ls, hw)| (ls, hw, hw)),
                        _ => topic.as_ref().filter(|t| p.partition >= 0 && p.partition < t.partitions()).and_then(|t| broker.engine.offsets(&t.tp(p.partition))),
                    };
                    // A stream is served in epoch 0, by one node (cluster mode).
                    // Err: the code refusing the partition here.
                    let led = match (&topic, &subtree) {
                        (Some(t), _) => broker.lead(&view, t.name(), p.partition).map_err(|_| ResponseError::NotLeaderOrFollower.code()),
                        (None, Some(s)) => broker.serve_stream(&view, s).map(|()| 0).map_err(crate::kafka::stream_refusal),
                        (None, None) => Ok(0),
                    };
                    let led = led.and_then(|epoch| crate::kafka::epoch_error(p.current_leader_epoch, epoch).map_or(Ok(epoch), Err));
                    match (offsets, led) {
                        _ if denied => r.with_error_code(ResponseError::TopicAuthorizationFailed.code()),
                        (None, _) => r.with_error_code(ResponseError::UnknownTopicOrPartition.code()),
                        (Some(_), Err(code)) => r.with_error_code(code),
                        (Some((_, hw, _)), Ok(epoch)) if p.leader_epoch >= 0 => match topic.as_ref().and_then(|t| broker.engine.epoch_end(&t.tp(p.partition), p.leader_epoch)) {
                            Some((e, end)) => r.with_leader_epoch(e).with_end_offset(end),
                            None => r.with_leader_epoch(p.leader_epoch.min(epoch)).with_end_offset(hw),
                        },
                        (Some(_), Ok(_)) => r,
                    }
                })
                .collect();
            OffsetForLeaderTopicResult::default().with_topic(t.topic).with_partitions(partitions)
        })
        .collect();
    Some(Response::default().with_topics(topics))
}
