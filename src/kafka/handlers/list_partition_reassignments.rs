//! ListPartitionReassignments (KIP-455): the partitions being reassigned,
//! with their replicas (the target, then the replicas it drops) and the
//! replicas added and removed, from this node's view of the cluster.
//! DESCRIBE on the cluster, as Kafka asks. Null topics: every partition
//! being reassigned; named topics and partitions that do not exist or
//! are not moving are left out, as Kafka answers. A partition moves with
//! its unit (docs/cluster.md), so every partition of the unit is listed.

pub use kafka_protocol::messages::{ListPartitionReassignmentsRequest as Request, ListPartitionReassignmentsResponse as Response};
use kafka_protocol::messages::list_partition_reassignments_response::{OngoingPartitionReassignment, OngoingTopicReassignment};
use kafka_protocol::messages::BrokerId;
use kafka_protocol::protocol::VersionRange;
use kafka_protocol::ResponseError as E;

use super::str_bytes;
use crate::auth::acl::Operation;
use crate::cluster::topics::unit_of;
use crate::kafka::authz::Check;
use crate::kafka::Broker;

pub const VERSIONS: VersionRange = VersionRange { min: 0, max: 0 };

fn ids(v: &[i32]) -> Vec<BrokerId> {
    v.iter().map(|n| BrokerId(*n)).collect()
}

pub async fn handle(broker: &Broker, req: Request, _version: i16) -> Option<Response> {
    if broker.authorizer.enabled() && !Check::current(broker).cluster(Operation::Describe) {
        return Some(Response::default().with_error_code(E::ClusterAuthorizationFailed.code()).with_error_message(Some(str_bytes("Cluster authorization failed.".to_owned()))));
    }
    let view = broker.cluster.view();
    if view.units.values().all(|u| !u.reassigning()) {
        return Some(Response::default());
    }
    let asked: Vec<(String, Vec<i32>)> = match req.topics {
        Some(ts) => ts.into_iter().map(|t| (super::name(&t.name).to_owned(), t.partition_indexes)).collect(),
        None => view.topics.iter().map(|(name, t)| (name.clone(), (0..t.partitions).collect())).collect(),
    };
    let mut topics: Vec<OngoingTopicReassignment> = Vec::new();
    for (name, mut ps) in asked {
        let Some(t) = view.topics.get(&name).filter(|_| !crate::engine::topics::is_internal(&name)) else { continue };
        ps.sort_unstable();
        ps.dedup();
        let partitions: Vec<OngoingPartitionReassignment> = ps
            .into_iter()
            .filter(|p| *p >= 0 && *p < t.partitions)
            .filter_map(|p| {
                let u = view.units.get(&unit_of(&name, p)).filter(|u| u.reassigning())?;
                Some(OngoingPartitionReassignment::default().with_partition_index(p).with_replicas(ids(&u.replicas)).with_adding_replicas(ids(&u.adding)).with_removing_replicas(ids(&u.removing)))
            })
            .collect();
        if !partitions.is_empty() {
            topics.push(OngoingTopicReassignment::default().with_name(super::topic_name(&name)).with_partitions(partitions));
        }
    }
    Some(Response::default().with_topics(topics))
}
