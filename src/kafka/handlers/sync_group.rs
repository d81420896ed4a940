//! SyncGroup: members wait for the leader's assignment.

pub use kafka_protocol::messages::{SyncGroupRequest as Request, SyncGroupResponse as Response};
use kafka_protocol::protocol::VersionRange;
use kafka_protocol::ResponseError;

use super::str_bytes;
use crate::auth::acl::Operation;
use crate::kafka::authz;
use crate::kafka::coordinator::group::SyncArgs;
use crate::kafka::Broker;

pub const VERSIONS: VersionRange = VersionRange { min: 0, max: 5 };

pub async fn handle(broker: &Broker, req: Request, version: i16) -> Option<Response> {
    if authz::group_denied(broker, Operation::Read, req.group_id.0.as_str()) {
        return Some(Response::default().with_error_code(ResponseError::GroupAuthorizationFailed.code()));
    }
    if let Some(code) = broker.coordinator_error(req.group_id.0.as_str()) {
        // Kafka answers REBALANCE_IN_PROGRESS while the group loads: older
        // clients (the Java consumer among them) take any other code as
        // fatal here.
        let code = if code == ResponseError::CoordinatorLoadInProgress.code() { ResponseError::RebalanceInProgress.code() } else { code };
        return Some(Response::default().with_error_code(code));
    }
    let args = SyncArgs {
        generation: req.generation_id,
        member_id: req.member_id.to_string(),
        instance_id: req.group_instance_id.map(|s| s.to_string()),
        // v5: the protocol the client names must be the group's.
        protocol_type: req.protocol_type.map(|s| s.to_string()),
        protocol_name: req.protocol_name.map(|s| s.to_string()),
        assignments: req.assignments.into_iter().map(|a| (a.member_id.to_string(), a.assignment)).collect(),
    };
    let r = broker.coordinator.sync(req.group_id.0.to_string(), args).await?;
    let mut resp = Response::default().with_error_code(r.error).with_assignment(r.assignment);
    if version >= 5 {
        resp = resp.with_protocol_type(r.protocol_type.map(str_bytes)).with_protocol_name(r.protocol_name.map(str_bytes));
    }
    Some(resp)
}
