//! FindCoordinator: this broker coordinates every group and transaction.
//! The group protocol itself arrives with the consumer-group issue; until
//! then clients that look up a coordinator are pointed here and get a clean
//! answer instead of a dropped connection.

use kafka_protocol::messages::find_coordinator_response::Coordinator;
pub use kafka_protocol::messages::{FindCoordinatorRequest as Request, FindCoordinatorResponse as Response};
use kafka_protocol::protocol::VersionRange;

use super::str_bytes;
use crate::kafka::{Broker, NODE_ID};

pub const VERSIONS: VersionRange = VersionRange { min: 0, max: 6 };

pub async fn handle(broker: &Broker, req: Request, version: i16) -> Option<Response> {
    let (host, port) = crate::kafka::conn::advertised(broker);
    let host = str_bytes(host);
    if version >= 4 {
        let coordinators = req
            .coordinator_keys
            .into_iter()
            .map(|key| Coordinator::default().with_key(key).with_node_id(NODE_ID.into()).with_host(host.clone()).with_port(port))
            .collect();
        Some(Response::default().with_coordinators(coordinators))
    } else {
        Some(Response::default().with_node_id(NODE_ID.into()).with_host(host).with_port(port))
    }
}
