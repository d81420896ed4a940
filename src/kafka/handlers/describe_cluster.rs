//! DescribeCluster: one broker, which is also the controller.

use kafka_protocol::messages::describe_cluster_response::DescribeClusterBroker;
pub use kafka_protocol::messages::{DescribeClusterRequest as Request, DescribeClusterResponse as Response};
use kafka_protocol::protocol::VersionRange;

use super::str_bytes;
use crate::kafka::{Broker, NODE_ID};

pub const VERSIONS: VersionRange = VersionRange { min: 0, max: 1 };

pub async fn handle(broker: &Broker, _req: Request, _version: i16) -> Option<Response> {
    let (host, port) = crate::kafka::conn::advertised(broker);
    let b = DescribeClusterBroker::default().with_broker_id(NODE_ID.into()).with_host(str_bytes(host)).with_port(port);
    Some(
        Response::default()
            .with_cluster_id(str_bytes(broker.engine.cluster_id()))
            .with_controller_id(NODE_ID.into())
            .with_brokers(vec![b]),
    )
}
