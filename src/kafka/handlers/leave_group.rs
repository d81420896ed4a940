//! LeaveGroup: one member (v0–2) or a batch of members (v3+).

use kafka_protocol::messages::leave_group_response::MemberResponse;
pub use kafka_protocol::messages::{LeaveGroupRequest as Request, LeaveGroupResponse as Response};
use kafka_protocol::protocol::VersionRange;

use crate::auth::acl::Operation;
use crate::kafka::authz;
use crate::kafka::Broker;

pub const VERSIONS: VersionRange = VersionRange { min: 0, max: 5 };

pub async fn handle(broker: &Broker, req: Request, version: i16) -> Option<Response> {
    let group = req.group_id.0.to_string();
    if authz::group_denied(broker, Operation::Read, &group) {
        return Some(Response::default().with_error_code(kafka_protocol::ResponseError::GroupAuthorizationFailed.code()));
    }
    if let Some(code) = broker.coordinator_error(&group) {
        return Some(Response::default().with_error_code(code));
    }
    if version < 3 {
        let (code, codes) = broker.coordinator.leave(group, vec![(req.member_id.to_string(), None)]).await?;
        let code = if code != 0 { code } else { codes.first().copied().unwrap_or(0) };
        return Some(Response::default().with_error_code(code));
    }
    let members: Vec<(String, Option<String>)> = req.members.iter().map(|m| (m.member_id.to_string(), m.group_instance_id.as_ref().map(|s| s.to_string()))).collect();
    let (code, codes) = broker.coordinator.leave(group, members).await?;
    let responses = req
        .members
        .into_iter()
        .zip(codes)
        .map(|(m, c)| MemberResponse::default().with_member_id(m.member_id).with_group_instance_id(m.group_instance_id).with_error_code(c))
        .collect();
    Some(Response::default().with_error_code(code).with_members(responses))
}
