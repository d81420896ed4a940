//! OffsetForLeaderEpoch: a single-node broker has had one leader epoch (0)
//! for every partition, so the end offset of any epoch a client knows is the
//! high watermark. Clients use it to validate their position after a
//! metadata change; there is never a divergence to report.

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
                    match offsets {
                        _ if denied => r.with_error_code(ResponseError::TopicAuthorizationFailed.code()),
                        None => r.with_error_code(ResponseError::UnknownTopicOrPartition.code()),
                        Some(_) if p.current_leader_epoch > 0 => r.with_error_code(ResponseError::UnknownLeaderEpoch.code()),
                        Some((_, hw, _)) if p.leader_epoch >= 0 => r.with_leader_epoch(0).with_end_offset(hw),
                        Some(_) => r,
                    }
                })
                .collect();
            OffsetForLeaderTopicResult::default().with_topic(t.topic).with_partitions(partitions)
        })
        .collect();
    Some(Response::default().with_topics(topics))
}
