//! Heartbeat: keeps a member's session alive and tells it when to rejoin.

pub use kafka_protocol::messages::{HeartbeatRequest as Request, HeartbeatResponse as Response};
use kafka_protocol::protocol::VersionRange;

use crate::auth::acl::Operation;
use crate::kafka::authz;
use crate::kafka::Broker;

pub const VERSIONS: VersionRange = VersionRange { min: 0, max: 4 };

pub async fn handle(broker: &Broker, req: Request, _version: i16) -> Option<Response> {
    if authz::group_denied(broker, Operation::Read, req.group_id.0.as_str()) {
        return Some(Response::default().with_error_code(kafka_protocol::ResponseError::GroupAuthorizationFailed.code()));
    }
    match broker.coordinator_error(req.group_id.0.as_str()) {
        None => {}
        // Kafka answers a heartbeat blindly while the group loads: the
        // member's session counts from the load, and a member the loaded
        // group does not know learns it at its next heartbeat.
        Some(code) if code == kafka_protocol::ResponseError::CoordinatorLoadInProgress.code() => return Some(Response::default()),
        Some(code) => return Some(Response::default().with_error_code(code)),
    }
    let code = broker
        .coordinator
        .heartbeat(req.group_id.0.to_string(), req.generation_id, req.member_id.to_string(), req.group_instance_id.map(|s| s.to_string()))
        .await?;
    Some(Response::default().with_error_code(code))
}
