//! DescribeCluster: the live brokers and the controller (single-node
//! mode: this broker, which is its own controller).

use kafka_protocol::messages::describe_cluster_response::DescribeClusterBroker;
pub use kafka_protocol::messages::{DescribeClusterRequest as Request, DescribeClusterResponse as Response};
use kafka_protocol::protocol::VersionRange;

use super::str_bytes;
use crate::kafka::Broker;

pub const VERSIONS: VersionRange = VersionRange { min: 0, max: 1 };

pub async fn handle(broker: &Broker, _req: Request, _version: i16) -> Option<Response> {
    let view = broker.cluster.view();
    let brokers = broker
        .brokers_in(&view)
        .into_iter()
        .map(|b| DescribeClusterBroker::default().with_broker_id(b.id.into()).with_host(str_bytes(b.host)).with_port(b.port).with_rack(b.rack.map(str_bytes)))
        .collect();
    Some(
        Response::default()
            .with_cluster_id(str_bytes(view.cluster_id.clone()))
            .with_controller_id(view.controller_id().into())
            .with_brokers(brokers),
    )
}
