//! DescribeGroups: state, protocol and members with their assignments.

use kafka_protocol::messages::describe_groups_response::{DescribedGroup, DescribedGroupMember};
pub use kafka_protocol::messages::{DescribeGroupsRequest as Request, DescribeGroupsResponse as Response};
use kafka_protocol::protocol::VersionRange;

use super::str_bytes;
use crate::auth::acl::Operation;
use crate::kafka::authz;
use crate::kafka::Broker;

pub const VERSIONS: VersionRange = VersionRange { min: 0, max: 5 };

pub async fn handle(broker: &Broker, req: Request, version: i16) -> Option<Response> {
    // Kafka answers every occurrence of a repeated group id; each answer
    // carries every member's metadata, so a million copies of one name
    // would make a response a million times the group's size. Each group is
    // described once (clients match answers by group id).
    let wanted = super::first_occurrences(req.groups, |g| g.0.clone());
    // DESCRIBE on each group, as Kafka asks; a refused one is not looked at.
    // A group another node coordinates: NOT_COORDINATOR, not looked at.
    let refused: Vec<Option<i16>> = wanted
        .iter()
        .map(|g| match g.0.as_str() {
            g if authz::group_denied(broker, Operation::Describe, g) => Some(kafka_protocol::ResponseError::GroupAuthorizationFailed.code()),
            g if !broker.coordinates(g) => broker.coordinator_error(g),
            _ => None,
        })
        .collect();
    let ids: Vec<String> = wanted.iter().zip(&refused).filter(|(_, r)| r.is_none()).map(|(g, _)| g.0.to_string()).collect();
    let mut described = broker.coordinator.describe(ids).await.into_iter();
    let groups = wanted
        .into_iter()
        .zip(refused)
        .map(|(id, refused)| {
            if let Some(code) = refused {
                return DescribedGroup::default().with_group_id(id).with_error_code(code);
            }
            let d = described.next().expect("one description per group looked at");
            let Some(state) = d.state else {
                // Kafka describes an unknown group as Dead with no error.
                return DescribedGroup::default().with_group_id(id).with_group_state(str_bytes("Dead"));
            };
            let members = d
                .members
                .into_iter()
                .map(|m| {
                    let dm = DescribedGroupMember::default()
                        .with_member_id(str_bytes(m.member_id))
                        .with_client_id(str_bytes(m.client_id))
                        .with_client_host(str_bytes(m.client_host))
                        .with_member_metadata(m.metadata)
                        .with_member_assignment(m.assignment);
                    if version >= 4 { dm.with_group_instance_id(m.instance_id.map(str_bytes)) } else { dm }
                })
                .collect();
            DescribedGroup::default()
                .with_group_id(id)
                .with_group_state(str_bytes(state))
                .with_protocol_type(str_bytes(d.protocol_type))
                .with_protocol_data(str_bytes(d.protocol))
                .with_members(members)
        })
        .collect();
    Some(Response::default().with_groups(groups))
}
