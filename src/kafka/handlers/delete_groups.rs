//! DeleteGroups: only groups without members; their committed offsets go
//! too (the coordinator removes both).

use kafka_protocol::messages::delete_groups_response::DeletableGroupResult;
pub use kafka_protocol::messages::{DeleteGroupsRequest as Request, DeleteGroupsResponse as Response};
use kafka_protocol::protocol::VersionRange;

use crate::auth::acl::Operation;
use crate::kafka::authz;
use crate::kafka::Broker;

pub const VERSIONS: VersionRange = VersionRange { min: 0, max: 2 };

pub async fn handle(broker: &Broker, req: Request, _version: i16) -> Option<Response> {
    // Kafka deletes each distinct group once (`distinct`).
    let names = super::first_occurrences(req.groups_names, |g| g.0.clone());
    // DELETE on each group, as Kafka asks; refused ones are not touched.
    let (denied, allowed): (Vec<_>, Vec<_>) = names.into_iter().partition(|g| authz::group_denied(broker, Operation::Delete, g.0.as_str()));
    // Groups another node coordinates (or whose shard is loading) are
    // not touched.
    let (allowed, elsewhere): (Vec<_>, Vec<_>) = allowed.into_iter().partition(|g| broker.coordinates(g.0.as_str()));
    let ids: Vec<String> = allowed.iter().map(|g| g.0.to_string()).collect();
    let codes = broker.coordinator.delete(ids).await;
    let refused = kafka_protocol::ResponseError::GroupAuthorizationFailed.code();
    let results = allowed
        .into_iter()
        .zip(codes)
        .chain(denied.into_iter().map(|g| (g, refused)))
        .chain(elsewhere.into_iter().map(|g| {
            let code = broker.coordinator_error(g.0.as_str()).unwrap_or(kafka_protocol::ResponseError::NotCoordinator.code());
            (g, code)
        }))
        .map(|(g, c)| DeletableGroupResult::default().with_group_id(g).with_error_code(c))
        .collect();
    Some(Response::default().with_results(results))
}
