//! SyncGroup: members wait for the leader's assignment.

pub use kafka_protocol::messages::{SyncGroupRequest as Request, SyncGroupResponse as Response};
use kafka_protocol::protocol::VersionRange;
use kafka_protocol::ResponseError;

use super::str_bytes;
use crate::auth::acl::Operation;
use crate::kafka::authz;
use crate::kafka::Broker;

pub const VERSIONS: VersionRange = VersionRange { min: 0, max: 5 };

pub async fn handle(broker: &Broker, req: Request, version: i16) -> Option<Response> {
    if authz::group_denied(broker, Operation::Read, req.group_id.0.as_str()) {
        return Some(Response::default().with_error_code(ResponseError::GroupAuthorizationFailed.code()));
    }
    let r = broker
        .coordinator
        .sync(
            req.group_id.0.to_string(),
            req.generation_id,
            req.member_id.to_string(),
            req.group_instance_id.map(|s| s.to_string()),
            req.assignments.into_iter().map(|a| (a.member_id.to_string(), a.assignment)).collect(),
        )
        .await?;
    // v5: the protocol the client names must be the group's.
    if version >= 5 && r.error == 0 {
        let mismatch = |asked: &Option<kafka_protocol::protocol::StrBytes>, have: &Option<String>| asked.as_ref().is_some_and(|a| Some(a.as_str()) != have.as_deref());
        if mismatch(&req.protocol_type, &r.protocol_type) || mismatch(&req.protocol_name, &r.protocol_name) {
            return Some(Response::default().with_error_code(ResponseError::InconsistentGroupProtocol.code()));
        }
    }
    let mut resp = Response::default().with_error_code(r.error).with_assignment(r.assignment);
    if version >= 5 {
        resp = resp.with_protocol_type(r.protocol_type.map(str_bytes)).with_protocol_name(r.protocol_name.map(str_bytes));
    }
    Some(resp)
}
