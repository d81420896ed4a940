//! ConsumerGroupDescribe (KIP-848): a consumer group's epochs, assignor
//! and members, each with its assignment and target assignment.

use kafka_protocol::messages::consumer_group_describe_response::{Assignment, DescribedGroup, Member, TopicPartitions};
pub use kafka_protocol::messages::{ConsumerGroupDescribeRequest as Request, ConsumerGroupDescribeResponse as Response};
use kafka_protocol::protocol::VersionRange;
use kafka_protocol::ResponseError;

use super::{str_bytes, topic_name};
use crate::auth::acl::Operation;
use crate::engine::Engine;
use crate::kafka::coordinator::consumer;
use crate::kafka::{authz, Broker};

pub const VERSIONS: VersionRange = VersionRange { min: 0, max: 1 };

fn assignment(engine: &Engine, a: &consumer::Assignment) -> Assignment {
    Assignment::default().with_topic_partitions(
        a.iter()
            .map(|(id, ps)| {
                let name = engine.topic_by_id(id).map(|t| t.name().to_owned()).unwrap_or_default();
                TopicPartitions::default().with_topic_id(uuid::Uuid::from_bytes(*id)).with_topic_name(topic_name(&name)).with_partitions(ps.iter().copied().collect())
            })
            .collect(),
    )
}

pub async fn handle(broker: &Broker, req: Request, version: i16) -> Option<Response> {
    // Each group once, in the order first asked.
    let mut seen = std::collections::HashSet::new();
    let ids: Vec<String> = req.group_ids.iter().map(|g| g.0.to_string()).filter(|g| seen.insert(g.clone())).collect();
    let allowed: Vec<String> = ids.iter().filter(|g| !authz::group_denied(broker, Operation::Describe, g) && broker.coordinates(g)).cloned().collect();
    let mut found: std::collections::HashMap<String, Option<crate::kafka::coordinator::ConsumerGroupDescription>> = broker.coordinator.consumer_describe(allowed).await.into_iter().collect();
    let groups = ids
        .into_iter()
        .map(|id| {
            let g = DescribedGroup::default().with_group_id(kafka_protocol::messages::GroupId(str_bytes(id.clone())));
            let Some(d) = found.remove(&id) else {
                if !authz::group_denied(broker, Operation::Describe, &id) {
                    return g.with_error_code(ResponseError::NotCoordinator.code());
                }
                return g.with_error_code(ResponseError::GroupAuthorizationFailed.code());
            };
            let Some(d) = d else {
                return g.with_error_code(ResponseError::GroupIdNotFound.code()).with_error_message(Some(str_bytes(format!("Group {id} is not a consumer group."))));
            };
            g.with_group_state(str_bytes(d.state.to_owned()))
                .with_group_epoch(d.group_epoch)
                .with_assignment_epoch(d.assignment_epoch)
                .with_assignor_name(str_bytes(d.assignor.to_owned()))
                .with_authorized_operations(i32::MIN)
                .with_members(
                    d.members
                        .iter()
                        .map(|m| {
                            let mem = Member::default()
                                .with_member_id(str_bytes(m.member_id.clone()))
                                .with_instance_id(m.instance_id.clone().map(str_bytes))
                                .with_rack_id(m.rack_id.clone().map(str_bytes))
                                .with_member_epoch(m.member_epoch)
                                .with_client_id(str_bytes(m.client_id.clone()))
                                .with_client_host(str_bytes(m.client_host.clone()))
                                .with_subscribed_topic_names(m.subscribed_topic_names.iter().map(|n| topic_name(n)).collect())
                                .with_subscribed_topic_regex(m.subscribed_topic_regex.clone().map(str_bytes))
                                .with_assignment(assignment(&broker.engine, &m.assignment))
                                .with_target_assignment(assignment(&broker.engine, &m.target_assignment));
                            // v1: 1 for a consumer-protocol member.
                            if version >= 1 { mem.with_member_type(1) } else { mem }
                        })
                        .collect(),
                )
        })
        .collect();
    Some(Response::default().with_groups(groups))
}
