//! JoinGroup: hand the request to the coordinator and wait for the
//! rebalance it joins (or an immediate answer).

use kafka_protocol::messages::join_group_response::JoinGroupResponseMember;
pub use kafka_protocol::messages::{JoinGroupRequest as Request, JoinGroupResponse as Response};
use kafka_protocol::protocol::VersionRange;
use kafka_protocol::ResponseError;

use super::str_bytes;
use crate::auth::acl::Operation;
use crate::kafka::authz;
use crate::kafka::coordinator::group::JoinArgs;
use crate::kafka::{conn, coordinator, Broker};

pub const VERSIONS: VersionRange = VersionRange { min: 0, max: 9 };

pub async fn handle(broker: &Broker, req: Request, version: i16) -> Option<Response> {
    let group = req.group_id.0.to_string();
    if group.is_empty() || group.len() > coordinator::MAX_GROUP_ID_LEN {
        return Some(Response::default().with_error_code(ResponseError::InvalidGroupId.code()).with_generation_id(-1).with_member_id(req.member_id));
    }
    // READ on the group, as Kafka asks.
    if authz::group_denied(broker, Operation::Read, &group) {
        return Some(Response::default().with_error_code(ResponseError::GroupAuthorizationFailed.code()).with_generation_id(-1).with_member_id(req.member_id));
    }
    if let Some(code) = broker.coordinator_error(&group) {
        return Some(Response::default().with_error_code(code).with_generation_id(-1).with_member_id(req.member_id));
    }
    let args = JoinArgs {
        member_id: req.member_id.to_string(),
        instance_id: req.group_instance_id.map(|s| s.to_string()),
        client_id: conn::client_id(),
        client_host: conn::peer_host(),
        session_timeout_ms: req.session_timeout_ms,
        // v0 has no rebalance timeout: Kafka uses the session timeout.
        rebalance_timeout_ms: if version >= 1 { req.rebalance_timeout_ms } else { req.session_timeout_ms },
        protocol_type: req.protocol_type.to_string(),
        protocols: req.protocols.into_iter().map(|p| (p.name.to_string(), p.metadata)).collect(),
        require_known_member_id: version >= 4,
        supports_skip_assignment: version >= 9,
    };
    let r = broker.coordinator.join(group, args).await?;
    let members = r
        .members
        .into_iter()
        .map(|(id, instance, metadata)| {
            let m = JoinGroupResponseMember::default().with_member_id(str_bytes(id)).with_metadata(metadata);
            if version >= 5 { m.with_group_instance_id(instance.map(str_bytes)) } else { m }
        })
        .collect();
    let mut resp = Response::default()
        .with_error_code(r.error)
        .with_generation_id(r.generation)
        .with_leader(str_bytes(r.leader))
        .with_member_id(str_bytes(r.member_id))
        .with_members(members);
    if version >= 7 {
        resp = resp.with_protocol_type(r.protocol_type.map(str_bytes)).with_protocol_name(r.protocol_name.map(str_bytes));
    } else {
        resp = resp.with_protocol_name(Some(str_bytes(r.protocol_name.unwrap_or_default())));
    }
    if version >= 9 {
        resp = resp.with_skip_assignment(r.skip_assignment);
    }
    Some(resp)
}
