//! DeleteGroups: only groups without members; their committed offsets go
//! too (the coordinator removes both).

use kafka_protocol::messages::delete_groups_response::DeletableGroupResult;
pub use kafka_protocol::messages::{DeleteGroupsRequest as Request, DeleteGroupsResponse as Response};
use kafka_protocol::protocol::VersionRange;

use crate::kafka::Broker;

pub const VERSIONS: VersionRange = VersionRange { min: 0, max: 2 };

pub async fn handle(broker: &Broker, req: Request, _version: i16) -> Option<Response> {
    // Kafka deletes each distinct group once (`distinct`).
    let names = super::first_occurrences(req.groups_names, |g| g.0.clone());
    let ids: Vec<String> = names.iter().map(|g| g.0.to_string()).collect();
    let codes = broker.coordinator.delete(ids).await;
    let results = names.into_iter().zip(codes).map(|(g, c)| DeletableGroupResult::default().with_group_id(g).with_error_code(c)).collect();
    Some(Response::default().with_results(results))
}
