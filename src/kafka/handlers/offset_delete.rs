//! OffsetDelete: remove a group's committed offsets for some partitions.
//! Refused per partition with GROUP_SUBSCRIBED_TO_TOPIC while a member of
//! the group subscribes to the topic.

use kafka_protocol::messages::consumer_protocol_subscription::ConsumerProtocolSubscription;
use kafka_protocol::messages::offset_delete_response::{OffsetDeleteResponsePartition, OffsetDeleteResponseTopic};
pub use kafka_protocol::messages::{OffsetDeleteRequest as Request, OffsetDeleteResponse as Response};
use kafka_protocol::protocol::{Decodable, VersionRange};
use kafka_protocol::ResponseError;

use crate::kafka::Broker;

pub const VERSIONS: VersionRange = VersionRange { min: 0, max: 0 };

/// Topics the members of a consumer group subscribe to, from their
/// protocol metadata (version-prefixed ConsumerProtocolSubscription).
fn subscribed(metadata: &[bytes::Bytes]) -> Vec<String> {
    let mut out = Vec::new();
    for m in metadata {
        let mut b = m.clone();
        if b.len() < 2 {
            continue;
        }
        let version = i16::from_be_bytes([b[0], b[1]]);
        let _ = bytes::Buf::get_i16(&mut b);
        // Member metadata comes from clients: decode only what fits in it.
        if b.len() > 1 << 20 || !(0..=3).contains(&version) {
            continue;
        }
        if let Ok(s) = ConsumerProtocolSubscription::decode(&mut b, version) {
            out.extend(s.topics.into_iter().map(|t| t.to_string()));
        }
    }
    out
}

pub async fn handle(broker: &Broker, req: Request, _version: i16) -> Option<Response> {
    let group = req.group_id.0.to_string();
    let d = broker.coordinator.describe(vec![group.clone()]).await.pop()?;
    if d.state.is_none() {
        return Some(Response::default().with_error_code(ResponseError::GroupIdNotFound.code()));
    }
    let subs = if d.protocol_type == "consumer" { subscribed(&d.members.iter().map(|m| m.metadata.clone()).collect::<Vec<_>>()) } else { Vec::new() };
    let mut remove = Vec::new();
    let topics = req
        .topics
        .into_iter()
        .map(|t| {
            let name = t.name.0.to_string();
            let busy = subs.contains(&name);
            let partitions = t
                .partitions
                .into_iter()
                .map(|p| {
                    if busy {
                        OffsetDeleteResponsePartition::default().with_partition_index(p.partition_index).with_error_code(ResponseError::GroupSubscribedToTopic.code())
                    } else {
                        remove.push((name.clone(), p.partition_index));
                        OffsetDeleteResponsePartition::default().with_partition_index(p.partition_index)
                    }
                })
                .collect();
            OffsetDeleteResponseTopic::default().with_name(t.name).with_partitions(partitions)
        })
        .collect();
    let engine = broker.engine.clone();
    let ok = tokio::task::spawn_blocking(move || engine.catalog().remove_offsets(&group, Some(&remove)).and_then(|_| engine.catalog().flush())).await.ok()?;
    if ok.is_err() {
        return Some(Response::default().with_error_code(ResponseError::KafkaStorageError.code()));
    }
    Some(Response::default().with_topics(topics))
}
