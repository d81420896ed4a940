//! FindCoordinator: this broker coordinates every group and transaction.
//! The group protocol itself arrives with the consumer-group issue; until
//! then clients that look up a coordinator are pointed here and get a clean
//! answer instead of a dropped connection.

use kafka_protocol::messages::find_coordinator_response::Coordinator;
pub use kafka_protocol::messages::{FindCoordinatorRequest as Request, FindCoordinatorResponse as Response};
use kafka_protocol::protocol::VersionRange;

use super::str_bytes;
use crate::auth::acl::Operation;
use crate::kafka::authz;
use crate::kafka::Broker;

pub const VERSIONS: VersionRange = VersionRange { min: 0, max: 6 };

pub async fn handle(broker: &Broker, req: Request, version: i16) -> Option<Response> {
    let (host, port) = crate::kafka::conn::advertised(broker);
    let host = str_bytes(host);
    let me = broker.node_id();
    // DESCRIBE on the group or the transactional id, as Kafka asks.
    let denied = |key: &str| match req.key_type {
        0 => authz::group_denied(broker, Operation::Describe, key).then_some(kafka_protocol::ResponseError::GroupAuthorizationFailed),
        1 => authz::transactional_id_denied(broker, Operation::Describe, key).then_some(kafka_protocol::ResponseError::TransactionalIdAuthorizationFailed),
        _ => None,
    };
    if version >= 4 {
        let coordinators = req
            .coordinator_keys
            .iter()
            .map(|key| match denied(key.as_str()) {
                Some(e) => Coordinator::default().with_key(key.clone()).with_node_id((-1).into()).with_port(-1).with_error_code(e.code()),
                None => Coordinator::default().with_key(key.clone()).with_node_id(me.into()).with_host(host.clone()).with_port(port),
            })
            .collect();
        Some(Response::default().with_coordinators(coordinators))
    } else if let Some(e) = denied(req.key.as_str()) {
        Some(Response::default().with_error_code(e.code()).with_node_id((-1).into()).with_port(-1))
    } else {
        Some(Response::default().with_node_id(me.into()).with_host(host).with_port(port))
    }
}
