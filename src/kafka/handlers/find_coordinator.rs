//! FindCoordinator. In single-node mode this broker coordinates every
//! group and transactional id. In cluster mode a key's coordinator is the
//! leader of its shard (`cluster::topics::coordinator_unit`); the shards
//! are created at the first lookup, and until then, or while a shard has
//! no leader, the answer is COORDINATOR_NOT_AVAILABLE, which clients
//! retry.

use kafka_protocol::messages::find_coordinator_response::Coordinator;
pub use kafka_protocol::messages::{FindCoordinatorRequest as Request, FindCoordinatorResponse as Response};
use kafka_protocol::protocol::VersionRange;
use kafka_protocol::ResponseError;

use super::str_bytes;
use crate::auth::acl::Operation;
use crate::kafka::authz;
use crate::kafka::{Broker, BrokerAddr};

pub const VERSIONS: VersionRange = VersionRange { min: 0, max: 6 };

pub async fn handle(broker: &Broker, req: Request, version: i16) -> Option<Response> {
    let view = broker.cluster.view();
    let brokers = broker.brokers_in(&view);
    // DESCRIBE on the group or the transactional id, as Kafka asks.
    let denied = |key: &str| match req.key_type {
        0 => authz::group_denied(broker, Operation::Describe, key).then_some(ResponseError::GroupAuthorizationFailed),
        1 => authz::transactional_id_denied(broker, Operation::Describe, key).then_some(ResponseError::TransactionalIdAuthorizationFailed),
        _ => None,
    };
    let find = |key: &str| -> Result<&BrokerAddr, ResponseError> {
        if let Some(e) = denied(key) {
            return Err(e);
        }
        let id = broker.cluster.coordinator(key).ok_or(ResponseError::CoordinatorNotAvailable)?;
        brokers.iter().find(|b| b.id == id).ok_or(ResponseError::CoordinatorNotAvailable)
    };
    if version >= 4 {
        let coordinators = req
            .coordinator_keys
            .iter()
            .map(|key| match find(key.as_str()) {
                Err(e) => Coordinator::default().with_key(key.clone()).with_node_id((-1).into()).with_port(-1).with_error_code(e.code()),
                Ok(b) => Coordinator::default().with_key(key.clone()).with_node_id(b.id.into()).with_host(str_bytes(b.host.clone())).with_port(b.port),
            })
            .collect();
        Some(Response::default().with_coordinators(coordinators))
    } else {
        match find(req.key.as_str()) {
            Err(e) => Some(Response::default().with_error_code(e.code()).with_node_id((-1).into()).with_port(-1)),
            Ok(b) => Some(Response::default().with_node_id(b.id.into()).with_host(str_bytes(b.host.clone())).with_port(b.port)),
        }
    }
}
