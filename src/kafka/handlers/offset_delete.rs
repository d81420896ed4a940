//! OffsetDelete: remove a group's committed offsets for some partitions.
//! Refused per partition with GROUP_SUBSCRIBED_TO_TOPIC while a member of
//! the group subscribes to the topic.

use kafka_protocol::messages::offset_delete_response::{OffsetDeleteResponsePartition, OffsetDeleteResponseTopic};
pub use kafka_protocol::messages::{OffsetDeleteRequest as Request, OffsetDeleteResponse as Response};
use kafka_protocol::protocol::VersionRange;
use kafka_protocol::ResponseError;

use crate::auth::acl::Operation;
use crate::kafka::authz;
use crate::kafka::Broker;

pub const VERSIONS: VersionRange = VersionRange { min: 0, max: 0 };

/// Topics the members of a consumer group subscribe to, from their
/// protocol metadata. Client bytes: decoded through the guard; a member
/// whose metadata does not decode subscribes to nothing we can name.
fn subscribed(metadata: &[bytes::Bytes]) -> std::collections::HashSet<String> {
    metadata.iter().filter_map(|m| crate::protocol::consumer::subscription(m).ok()).flat_map(|s| s.topics.into_iter().map(|t| t.to_string())).collect()
}

pub async fn handle(broker: &Broker, req: Request, _version: i16) -> Option<Response> {
    let group = req.group_id.0.to_string();
    // DELETE on the group, READ on each topic, as Kafka asks.
    if authz::group_denied(broker, Operation::Delete, &group) {
        return Some(Response::default().with_error_code(ResponseError::GroupAuthorizationFailed.code()));
    }
    if let Some(code) = broker.coordinator_error(&group) {
        return Some(Response::default().with_error_code(code));
    }
    let acl = broker.authorizer.enabled().then(|| authz::Check::current(broker));
    let d = broker.coordinator.describe(vec![group.clone()]).await.pop()?;
    if d.state.is_none() {
        return Some(Response::default().with_error_code(ResponseError::GroupIdNotFound.code()));
    }
    let subs = if d.protocol_type == "consumer" { subscribed(&d.members.iter().map(|m| m.metadata.clone()).collect::<Vec<_>>()) } else { Default::default() };
    let mut remove = Vec::new();
    let topics = req
        .topics
        .into_iter()
        .map(|t| {
            let name = t.name.0.to_string();
            let busy = subs.contains(&name);
            let denied = acl.as_ref().is_some_and(|c| !c.topic(Operation::Read, &name));
            let partitions = t
                .partitions
                .into_iter()
                .map(|p| {
                    if denied {
                        OffsetDeleteResponsePartition::default().with_partition_index(p.partition_index).with_error_code(ResponseError::TopicAuthorizationFailed.code())
                    } else if busy {
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
    if let Err(e) = broker.coordinator.delete_offsets(group, remove).await {
        return Some(Response::default().with_error_code(e.code));
    }
    Some(Response::default().with_topics(topics))
}
