//! ListGroups, with the state filter (v4+) and type filter (v5+).

use kafka_protocol::messages::list_groups_response::ListedGroup;
pub use kafka_protocol::messages::{ListGroupsRequest as Request, ListGroupsResponse as Response};
use kafka_protocol::messages::GroupId;
use kafka_protocol::protocol::VersionRange;

use super::str_bytes;
use crate::auth::acl::Operation;
use crate::kafka::authz;
use crate::kafka::Broker;

pub const VERSIONS: VersionRange = VersionRange { min: 0, max: 5 };

pub async fn handle(broker: &Broker, req: Request, version: i16) -> Option<Response> {
    // DESCRIBE on the cluster lists every group; without it, the groups
    // the principal may DESCRIBE (as Kafka).
    let check = broker.authorizer.enabled().then(|| authz::Check::current(broker)).filter(|c| !c.cluster(Operation::Describe));
    let groups = broker
        .coordinator
        .list()
        .await
        .into_iter()
        .filter(|(id, _, _, _)| check.as_ref().is_none_or(|c| c.group(Operation::Describe, id)))
        // In cluster mode, only the groups this node coordinates now (its
        // catalog may still know groups of shards that moved away).
        .filter(|(id, _, _, _)| broker.coordinates(id))
        .filter(|(_, _, state, _)| req.states_filter.is_empty() || req.states_filter.iter().any(|s| s.eq_ignore_ascii_case(state)))
        .filter(|(_, _, _, kind)| req.types_filter.is_empty() || req.types_filter.iter().any(|t| t.eq_ignore_ascii_case(kind)))
        .map(|(id, protocol_type, state, kind)| {
            let g = ListedGroup::default().with_group_id(GroupId(str_bytes(id))).with_protocol_type(str_bytes(protocol_type));
            let g = if version >= 4 { g.with_group_state(str_bytes(state)) } else { g };
            if version >= 5 { g.with_group_type(str_bytes(kind)) } else { g }
        })
        .collect();
    Some(Response::default().with_groups(groups))
}
