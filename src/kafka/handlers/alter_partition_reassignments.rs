//! AlterPartitionReassignments (KIP-455), as `kafka-reassign-partitions
//! --execute` and admin clients' `alterPartitionReassignments` ask it:
//! each named partition moves to its target replicas, or (null replicas)
//! its reassignment under way is cancelled. ALTER on the cluster, as
//! Kafka asks. A partition's replicas are its unit's (docs/cluster.md: one
//! replica set per branch and partition), so moving one partition moves
//! every partition of its branch with the same number; partitions of one
//! unit named with different targets in one request are refused.
//!
//! The answer comes once each move is written (the unit lists the target
//! first, then the replicas it drops); the new replicas copy the log, and
//! the controller finishes the move once they are all in sync
//! (ListPartitionReassignments shows it meanwhile). Per partition,
//! Kafka's codes: INVALID_REPLICA_ASSIGNMENT (no replica, one named twice,
//! a broker not registered, partitions of one unit given different
//! targets), INVALID_REPLICATION_FACTOR (a target of another size when
//! the request does not allow the factor to change: a target of another
//! size changes the partition's factor, and its whole unit's),
//! NO_REASSIGNMENT_IN_PROGRESS (a cancel
//! with nothing to cancel), UNKNOWN_TOPIC_OR_PARTITION, REQUEST_TIMED_OUT
//! when the write is not seen within the request's timeout,
//! UNKNOWN_SERVER_ERROR when etcd failed it.

use std::collections::BTreeMap;
use std::time::Duration;

use kafka_protocol::messages::alter_partition_reassignments_response::{ReassignablePartitionResponse, ReassignableTopicResponse};
pub use kafka_protocol::messages::{AlterPartitionReassignmentsRequest as Request, AlterPartitionReassignmentsResponse as Response};
use kafka_protocol::protocol::VersionRange;
use kafka_protocol::ResponseError as E;

use super::str_bytes;
use crate::auth::acl::Operation;
use crate::cluster::topics::{unit_of, NoReassignment};
use crate::cluster::Reassigned;
use crate::kafka::authz::Check;
use crate::kafka::Broker;

/// Version 1 adds AllowReplicationFactorChange (KIP-860): false refuses a
/// target of another size (version 0 allows it, as Kafka does).
pub const VERSIONS: VersionRange = VersionRange { min: 0, max: 1 };

/// The longest a request waits for its writes.
const MAX_TIMEOUT: Duration = Duration::from_secs(60);

fn result(partition: i32, code: i16, message: Option<String>) -> ReassignablePartitionResponse {
    ReassignablePartitionResponse::default().with_partition_index(partition).with_error_code(code).with_error_message(message.map(str_bytes))
}

pub async fn handle(broker: &Broker, req: Request, _version: i16) -> Option<Response> {
    let allow = req.allow_replication_factor_change;
    if broker.authorizer.enabled() && !Check::current(broker).cluster(Operation::Alter) {
        let code = E::ClusterAuthorizationFailed.code();
        let responses = req
            .topics
            .into_iter()
            .map(|t| {
                let ps = t.partitions.iter().map(|p| result(p.partition_index, code, Some("Cluster authorization failed.".into()))).collect();
                ReassignableTopicResponse::default().with_name(t.name).with_partitions(ps)
            })
            .collect();
        return Some(Response::default().with_allow_replication_factor_change(allow).with_error_code(code).with_error_message(Some(str_bytes("Cluster authorization failed.".to_owned()))).with_responses(responses));
    }
    // Each asked partition: its unit's index in `units`, or its error.
    let mut units: Vec<(String, Option<Vec<i32>>)> = Vec::new();
    let mut index: std::collections::HashMap<String, usize> = std::collections::HashMap::new();
    let mut conflicting: std::collections::HashSet<usize> = std::collections::HashSet::new();
    let mut asked: Vec<(kafka_protocol::messages::TopicName, Vec<(i32, Result<usize, (i16, String)>)>)> = Vec::new();
    for t in req.topics {
        let name = super::name(&t.name).to_owned();
        let topic = broker.engine.topic(&name).filter(|t| !crate::engine::topics::is_internal(t.name()));
        let mut ps = Vec::with_capacity(t.partitions.len());
        for p in t.partitions {
            let target: Option<Vec<i32>> = p.replicas.map(|rs| rs.into_iter().map(|b| b.0).collect());
            let Some(topic) = topic.as_ref().filter(|topic| p.partition_index >= 0 && p.partition_index < topic.partitions()) else {
                ps.push((p.partition_index, Err((E::UnknownTopicOrPartition.code(), "This server does not host this topic-partition.".into()))));
                continue;
            };
            let unit = unit_of(topic.name(), p.partition_index);
            let i = *index.entry(unit.clone()).or_insert_with(|| {
                units.push((unit, target.clone()));
                units.len() - 1
            });
            if units[i].1 != target {
                conflicting.insert(i);
            }
            ps.push((p.partition_index, Ok(i)));
        }
        asked.push((t.name, ps));
    }
    // Partitions sharing a log move together: two targets for one unit
    // are refused for all of its partitions, and nothing of it is written.
    let to_write: Vec<(String, Option<Vec<i32>>)> = units.iter().enumerate().filter(|(i, _)| !conflicting.contains(i)).map(|(_, u)| u.clone()).collect();
    let timeout = Duration::from_millis(req.timeout_ms.max(0) as u64).min(MAX_TIMEOUT);
    let written = broker.cluster.reassign(&to_write, allow, timeout).await;
    let mut answers: BTreeMap<usize, Reassigned> = BTreeMap::new();
    let mut w = written.into_iter();
    for i in (0..units.len()).filter(|i| !conflicting.contains(i)) {
        answers.insert(i, w.next().expect("one answer per unit written"));
    }
    let responses = asked
        .into_iter()
        .map(|(name, ps)| {
            let partitions = ps
                .into_iter()
                .map(|(p, at)| match at {
                    Err((code, message)) => result(p, code, Some(message)),
                    Ok(i) if conflicting.contains(&i) => result(p, E::InvalidReplicaAssignment.code(), Some(format!("partitions of unit {} (partition {p} of every topic of this branch, which share one log) were given different targets", units[i].0))),
                    Ok(i) => match &answers[&i] {
                        Reassigned::Done => result(p, 0, None),
                        Reassigned::Refused(NoReassignment::Invalid(why)) => result(p, E::InvalidReplicaAssignment.code(), Some(why.clone())),
                        Reassigned::Refused(NoReassignment::Factor(why)) => result(p, E::InvalidReplicationFactor.code(), Some(why.clone())),
                        Reassigned::Refused(NoReassignment::NotInProgress) => result(p, E::NoReassignmentInProgress.code(), Some("No reassignment is in progress for this partition.".into())),
                        Reassigned::Unknown => result(p, E::UnknownTopicOrPartition.code(), Some("This server does not host this topic-partition.".into())),
                        Reassigned::TimedOut => result(p, E::RequestTimedOut.code(), Some("The reassignment was not seen within the request's timeout.".into())),
                        Reassigned::Failed(why) => result(p, E::UnknownServerError.code(), Some(why.clone())),
                    },
                })
                .collect();
            ReassignableTopicResponse::default().with_name(name).with_partitions(partitions)
        })
        .collect();
    Some(Response::default().with_allow_replication_factor_change(allow).with_responses(responses))
}
