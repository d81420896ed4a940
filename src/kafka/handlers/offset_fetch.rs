//! OffsetFetch: one group (v1–7) or several (v8+). A partition without a
//! commit answers offset -1; a null topic list (v2+) means every topic the
//! group committed. With `require_stable` (v7+), a partition for which an
//! open transaction holds offsets answers UNSTABLE_OFFSET_COMMIT, which
//! clients retry, until the transaction ends. From v9 a consumer-group
//! member (KIP-848) names itself and its epoch, which must be current.

use std::collections::{HashMap, HashSet};

use kafka_protocol::messages::offset_fetch_response::{OffsetFetchResponseGroup, OffsetFetchResponsePartition, OffsetFetchResponsePartitions, OffsetFetchResponseTopic, OffsetFetchResponseTopics};
pub use kafka_protocol::messages::{OffsetFetchRequest as Request, OffsetFetchResponse as Response};
use kafka_protocol::protocol::VersionRange;

use super::{str_bytes, topic_name};
use crate::auth::acl::Operation;
use crate::kafka::authz;
use crate::kafka::Broker;
use crate::meta::OffsetRecord;

pub const VERSIONS: VersionRange = VersionRange { min: 1, max: 9 };

type Wanted = Option<Vec<(String, Vec<i32>)>>;

/// One partition's answer: (partition, offset, leader epoch, metadata, error).
type Part = (i32, i64, i32, Option<String>, i16);

/// (topic, partitions) for a group; `unstable`: partitions with offsets
/// waiting in an open transaction.
fn lookup(broker: &Broker, group: &str, wanted: Wanted, unstable: Option<&HashSet<(String, i32)>>) -> Result<Vec<(String, Vec<Part>)>, i16> {
    // DESCRIBE on the group; topics: only those the principal may DESCRIBE
    // are listed, one asked for by name is TOPIC_AUTHORIZATION_FAILED.
    if authz::group_denied(broker, Operation::Describe, group) {
        return Err(kafka_protocol::ResponseError::GroupAuthorizationFailed.code());
    }
    if let Some(code) = broker.coordinator_error(group) {
        return Err(code);
    }
    let check = broker.authorizer.enabled().then(|| authz::Check::current(broker));
    let may = |t: &str| check.as_ref().is_none_or(|c| c.topic(Operation::Describe, t));
    let asked = wanted.is_some();
    let rows = broker.coordinator.committed(group).map_err(|_| kafka_protocol::ResponseError::KafkaStorageError.code())?;
    // Cluster mode: the shard may have moved away while the catalog was
    // read (its rows are dropped then): an error, not "no offsets".
    if let Some(code) = broker.coordinator_error(group) {
        return Err(code);
    }
    let mut by_topic: HashMap<String, HashMap<i32, OffsetRecord>> = HashMap::new();
    for (t, p, r) in rows {
        by_topic.entry(t).or_default().insert(p, r);
    }
    let wanted = wanted.unwrap_or_else(|| {
        let mut all: Vec<(String, Vec<i32>)> = by_topic.iter().filter(|(t, _)| may(t)).map(|(t, ps)| (t.clone(), { let mut v: Vec<i32> = ps.keys().copied().collect(); v.sort(); v })).collect();
        all.sort();
        all
    });
    Ok(wanted
        .into_iter()
        .map(|(t, ps)| {
            let have = by_topic.get(&t);
            let denied = asked && !may(&t);
            let parts = ps
                .into_iter()
                .map(|p| match have.and_then(|h| h.get(&p)) {
                    _ if denied => (p, -1, -1, None, kafka_protocol::ResponseError::TopicAuthorizationFailed.code()),
                    _ if unstable.is_some_and(|u| u.contains(&(t.clone(), p))) => (p, -1, -1, None, kafka_protocol::ResponseError::UnstableOffsetCommit.code()),
                    Some(r) => (p, r.offset, r.leader_epoch, r.metadata.clone(), 0),
                    None => (p, -1, -1, Some(String::new()), 0),
                })
                .collect();
            (t, parts)
        })
        .collect())
}

pub async fn handle(broker: &Broker, req: Request, version: i16) -> Option<Response> {
    let stable = version >= 7 && req.require_stable;
    if version >= 8 {
        // Kafka answers a repeated group each time; with a null topic list
        // each answer is every offset the group holds, so repeats would
        // multiply the response: each group is answered once.
        let wanted_groups = super::first_occurrences(req.groups, |g| g.group_id.0.clone());
        let names: HashSet<String> = wanted_groups.iter().map(|g| g.group_id.0.to_string()).collect();
        let unstable = if stable { broker.transactions.pending_offsets(&names).await } else { HashMap::new() };
        let mut groups = Vec::with_capacity(wanted_groups.len());
        for g in wanted_groups {
                let wanted: Wanted = g.topics.map(|ts| ts.into_iter().map(|t| (t.name.0.to_string(), t.partition_indexes)).collect());
                let out = OffsetFetchResponseGroup::default().with_group_id(g.group_id.clone());
                // v9: a consumer-group member names itself and its epoch
                // (KIP-848); a stale epoch is STALE_MEMBER_EPOCH.
                let member = (version >= 9).then(|| g.member_id.as_ref().map(|m| m.to_string())).flatten();
                let denied = authz::group_denied(broker, Operation::Describe, &g.group_id.0);
                let elsewhere = if denied { None } else { broker.coordinator_error(&g.group_id.0) };
                let checked = match member {
                    _ if elsewhere.is_some() => Err(elsewhere.unwrap_or_default()),
                    Some(m) if !denied => broker.coordinator.fetch_check(g.group_id.0.to_string(), Some(m), g.member_epoch).await?,
                    _ => Ok(()),
                };
                let found = checked.and_then(|()| lookup(broker, &g.group_id.0, wanted, unstable.get(g.group_id.0.as_str())));
                groups.push(match found {
                    Err(code) => out.with_error_code(code),
                    Ok(topics) => out.with_topics(
                        topics
                            .into_iter()
                            .map(|(t, ps)| {
                                OffsetFetchResponseTopics::default().with_name(topic_name(&t)).with_partitions(
                                    ps.into_iter()
                                        .map(|(p, o, e, m, code)| OffsetFetchResponsePartitions::default().with_partition_index(p).with_committed_offset(o).with_committed_leader_epoch(e).with_metadata(m.map(str_bytes)).with_error_code(code))
                                        .collect(),
                                )
                            })
                            .collect(),
                    ),
                });
        }
        return Some(Response::default().with_groups(groups));
    }
    let wanted: Wanted = req.topics.map(|ts| ts.into_iter().map(|t| (t.name.0.to_string(), t.partition_indexes)).collect());
    let unstable = if stable { broker.transactions.pending_offsets(&HashSet::from([req.group_id.0.to_string()])).await } else { HashMap::new() };
    match lookup(broker, &req.group_id.0, wanted, unstable.get(req.group_id.0.as_str())) {
        Err(code) => Some(if version >= 2 { Response::default().with_error_code(code) } else { Response::default() }),
        Ok(topics) => Some(
            Response::default().with_topics(
                topics
                    .into_iter()
                    .map(|(t, ps)| {
                        OffsetFetchResponseTopic::default().with_name(topic_name(&t)).with_partitions(
                            ps.into_iter()
                                .map(|(p, o, e, m, code)| {
                                    let r = OffsetFetchResponsePartition::default().with_partition_index(p).with_committed_offset(o).with_metadata(m.map(str_bytes)).with_error_code(code);
                                    if version >= 5 { r.with_committed_leader_epoch(e) } else { r }
                                })
                                .collect(),
                        )
                    })
                    .collect(),
            ),
        ),
    }
}
