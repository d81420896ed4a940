//! ElectLeaders (KIP-460): preferred and unclean leader elections, as
//! `kafka-leader-election --election-type PREFERRED|UNCLEAN` asks them.
//! ALTER on the cluster, as Kafka asks. A partition's leader is its unit's
//! (docs/cluster.md: one replica set per branch and partition), so
//! electing one partition moves every partition of its branch with the
//! same number. Null partitions: every partition of every topic, and (as
//! Kafka answers it) only those an election was tried for are listed.
//!
//! Per partition, Kafka's codes: ELECTION_NOT_NEEDED when its preferred
//! replica leads already (PREFERRED) or its leader is live (UNCLEAN);
//! PREFERRED_LEADER_NOT_AVAILABLE when the preferred replica is not live
//! or not in sync; ELIGIBLE_LEADERS_NOT_AVAILABLE when no replica is live
//! (UNCLEAN: a live ISR member is taken first, else any live replica, whose
//! log then decides what the others keep); UNKNOWN_TOPIC_OR_PARTITION;
//! REQUEST_TIMED_OUT when the election is not seen within the request's
//! timeout, UNKNOWN_SERVER_ERROR when etcd failed it. Version 0 has no
//! election type: it is PREFERRED.

use std::collections::BTreeMap;
use std::time::Duration;

use kafka_protocol::messages::elect_leaders_response::{PartitionResult, ReplicaElectionResult};
pub use kafka_protocol::messages::{ElectLeadersRequest as Request, ElectLeadersResponse as Response};
use kafka_protocol::protocol::VersionRange;
use kafka_protocol::ResponseError as E;

use super::str_bytes;
use crate::auth::acl::Operation;
use crate::cluster::topics::unit_of;
use crate::cluster::Elected;
use crate::kafka::authz::Check;
use crate::kafka::Broker;

pub const VERSIONS: VersionRange = VersionRange { min: 0, max: 2 };

/// Kafka's `ElectionType`s.
const PREFERRED: i8 = 0;
const UNCLEAN: i8 = 1;

/// The longest a request waits for its elections.
const MAX_TIMEOUT: Duration = Duration::from_secs(60);

fn result(partition: i32, code: i16, message: Option<&str>) -> PartitionResult {
    PartitionResult::default().with_partition_id(partition).with_error_code(code).with_error_message(message.map(|m| str_bytes(m.to_owned())))
}

pub async fn handle(broker: &Broker, req: Request, version: i16) -> Option<Response> {
    if broker.authorizer.enabled() && !Check::current(broker).cluster(Operation::Alter) {
        // The asked partitions each refused; none named for a request for
        // all (which must not list the topics to who may not see them).
        let code = E::ClusterAuthorizationFailed.code();
        let results = req
            .topic_partitions
            .unwrap_or_default()
            .into_iter()
            .map(|t| {
                let ps = t.partitions.iter().map(|p| result(*p, code, Some("Cluster authorization failed."))).collect();
                ReplicaElectionResult::default().with_topic(t.topic).with_partition_result(ps)
            })
            .collect();
        return Some(Response::default().with_error_code(if version >= 1 { code } else { 0 }).with_replica_election_results(results));
    }
    // Null: every partition, and (as Kafka answers it) only those an
    // election was tried for are listed.
    let every = req.topic_partitions.is_none();
    // The asked partitions, by topic, once each.
    let asked: BTreeMap<String, Vec<i32>> = match req.topic_partitions {
        Some(tps) => {
            let mut m: BTreeMap<String, Vec<i32>> = BTreeMap::new();
            for t in tps {
                let ps = m.entry(t.topic.0.to_string()).or_default();
                ps.extend(t.partitions);
                ps.sort_unstable();
                ps.dedup();
            }
            m
        }
        None => broker.engine.topics().iter().filter(|t| !crate::engine::topics::is_internal(t.name())).map(|t| (t.name().to_owned(), (0..t.partitions()).collect())).collect(),
    };
    let all = |code: i16, message: &str| -> Vec<ReplicaElectionResult> {
        asked.iter().map(|(t, ps)| ReplicaElectionResult::default().with_topic(super::topic_name(t)).with_partition_result(ps.iter().map(|p| result(*p, code, Some(message))).collect())).collect()
    };
    let unclean = version >= 1 && req.election_type == UNCLEAN;
    if version >= 1 && !(req.election_type == PREFERRED || unclean) {
        return Some(Response::default().with_replica_election_results(all(E::InvalidRequest.code(), &format!("unknown election type {}", req.election_type))));
    }
    // Each existing partition's unit, elected once however many ask it.
    let mut units: Vec<String> = Vec::new();
    let mut index: std::collections::HashMap<String, usize> = std::collections::HashMap::new();
    let mut of: BTreeMap<(String, i32), Option<usize>> = BTreeMap::new();
    for (t, ps) in &asked {
        let topic = broker.engine.topic(t);
        for p in ps {
            let i = topic.as_ref().filter(|topic| *p >= 0 && *p < topic.partitions()).map(|_| {
                *index.entry(unit_of(t, *p)).or_insert_with_key(|unit| {
                    units.push(unit.clone());
                    units.len() - 1
                })
            });
            of.insert((t.clone(), *p), i);
        }
    }
    let timeout = Duration::from_millis(req.timeout_ms.max(0) as u64).min(MAX_TIMEOUT);
    let elected = if unclean { broker.cluster.elect_unclean(&units, timeout).await } else { broker.cluster.elect_preferred(&units, timeout).await };
    let results = asked
        .iter()
        .map(|(t, ps)| {
            let partitions: Vec<PartitionResult> = ps
                .iter()
                .filter(|p| !(every && of[&(t.clone(), **p)].is_some_and(|i| elected[i] == Elected::NotNeeded)))
                .map(|p| match of[&(t.clone(), *p)].map(|i| &elected[i]) {
                    None | Some(Elected::Unknown) => result(*p, E::UnknownTopicOrPartition.code(), Some("This server does not host this topic-partition.")),
                    Some(Elected::Done) => result(*p, 0, None),
                    Some(Elected::NotNeeded) => result(*p, E::ElectionNotNeeded.code(), Some("Leader election not needed for topic partition.")),
                    Some(Elected::NotAvailable) if unclean => result(*p, E::EligibleLeadersNotAvailable.code(), Some("No replica of the partition is live.")),
                    Some(Elected::NotAvailable) => result(*p, E::PreferredLeaderNotAvailable.code(), Some("The preferred leader is not live or not in sync.")),
                    Some(Elected::TimedOut) => result(*p, E::RequestTimedOut.code(), Some("The election was not seen within the request's timeout.")),
                    Some(Elected::Failed(why)) => result(*p, E::UnknownServerError.code(), Some(why.as_str())),
                })
                .collect();
            ReplicaElectionResult::default().with_topic(super::topic_name(t)).with_partition_result(partitions)
        })
        .filter(|r| !r.partition_result.is_empty())
        .collect();
    Some(Response::default().with_replica_election_results(results))
}
