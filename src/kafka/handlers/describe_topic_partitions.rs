//! DescribeTopicPartitions (v0, KIP-966): topics and their partitions in
//! name order, paged by a cursor — what `kafka-topics --describe` uses
//! from Kafka 3.8. The partitions of a response are bounded by the
//! request's `response_partition_limit` and by [`MAX_PARTITIONS`]; past
//! it, `next_cursor` names where the next request starts.
//!
//! Named topics are answered each (UNKNOWN_TOPIC_OR_PARTITION,
//! TOPIC_AUTHORIZATION_FAILED without DESCRIBE); with no names, every
//! topic the principal may describe. A cursor whose topic is not among the
//! names asked, or with a negative partition, is INVALID_REQUEST.

use kafka_protocol::messages::describe_topic_partitions_response::{Cursor, DescribeTopicPartitionsResponsePartition, DescribeTopicPartitionsResponseTopic};
pub use kafka_protocol::messages::{DescribeTopicPartitionsRequest as Request, DescribeTopicPartitionsResponse as Response};
use kafka_protocol::messages::TopicName;
use kafka_protocol::protocol::VersionRange;
use kafka_protocol::ResponseError as E;

use crate::auth::acl::Operation;
use crate::kafka::authz::Check;
use crate::kafka::Broker;

pub const VERSIONS: VersionRange = VersionRange { min: 0, max: 0 };

/// Partitions in one response at most, whatever the request asks (Kafka's
/// `max.request.partition.size.limit` default).
pub const MAX_PARTITIONS: usize = 2000;

/// The topic operations Kafka reports in `topic_authorized_operations`.
const TOPIC_OPERATIONS: [Operation; 8] =
    [Operation::Read, Operation::Write, Operation::Create, Operation::Delete, Operation::Alter, Operation::Describe, Operation::DescribeConfigs, Operation::AlterConfigs];

pub async fn handle(broker: &Broker, req: Request, _version: i16) -> Option<Response> {
    let view = broker.cluster.view();
    let check = broker.authorizer.enabled().then(|| Check::current(broker));
    let may = |op: Operation, name: &str| check.as_ref().is_none_or(|c| c.topic(op, name));
    let limit = usize::try_from(req.response_partition_limit).unwrap_or(0).clamp(1, MAX_PARTITIONS);
    let listing = req.topics.is_empty();
    // The names in order; a listing holds only what may be described.
    let mut names: Vec<String> = if listing {
        broker.engine.topics().iter().map(|t| t.name().to_owned()).filter(|n| may(Operation::Describe, n) && !crate::engine::topics::is_internal(n)).collect()
    } else {
        super::first_occurrences(req.topics.iter().map(|t| super::name(&t.name).to_owned()), |n| n.clone())
    };
    names.sort_unstable();
    let (from_topic, mut from_partition) = match &req.cursor {
        Some(c) => (Some(super::name(&c.topic_name).to_owned()), c.partition_index),
        None => (None, 0),
    };
    let bad_cursor = from_partition < 0 || (!listing && from_topic.as_ref().is_some_and(|t| names.binary_search(t).is_err()));
    if bad_cursor {
        let topics = names.into_iter().map(|n| topic_answer(n, E::InvalidRequest.code())).collect();
        return Some(Response::default().with_topics(topics).with_next_cursor(None));
    }
    let start = from_topic.as_ref().map_or(0, |t| names.partition_point(|n| n < t));
    if from_topic.as_ref().is_some_and(|t| names.get(start) != Some(t)) {
        // The cursor's topic went away since: start at the next one.
        from_partition = 0;
    }
    let mut topics = Vec::new();
    let mut room = limit;
    let mut next_cursor = None;
    for (i, name) in names.into_iter().enumerate().skip(start) {
        let first = if i == start { from_partition } else { 0 };
        if !may(Operation::Describe, &name) {
            topics.push(topic_answer(name, E::TopicAuthorizationFailed.code()));
            continue;
        }
        let Some(topic) = broker.engine.topic(&name) else {
            topics.push(topic_answer(name, E::UnknownTopicOrPartition.code()));
            continue;
        };
        if room == 0 {
            next_cursor = Some(Cursor::default().with_topic_name(TopicName(super::str_bytes(name))).with_partition_index(0));
            break;
        }
        let end = topic.partitions().min(first.saturating_add(room as i32));
        // Each partition as its unit says (cluster mode), as Metadata.
        let ids = |v: Vec<i32>| v.into_iter().map(Into::into).collect::<Vec<_>>();
        let partitions: Vec<_> = (first..end)
            .map(|p| {
                let s = view.partition(broker.node_id(), &name, p);
                let part = DescribeTopicPartitionsResponsePartition::default()
                    .with_partition_index(p)
                    .with_leader_id(s.leader.into())
                    .with_leader_epoch(s.leader_epoch)
                    .with_replica_nodes(ids(s.replicas))
                    .with_isr_nodes(ids(s.isr))
                    .with_offline_replicas(ids(s.offline))
                    .with_eligible_leader_replicas(Some(Vec::new()))
                    .with_last_known_elr(Some(Vec::new()));
                if s.leader < 0 { part.with_error_code(E::LeaderNotAvailable.code()) } else { part }
            })
            .collect();
        room -= partitions.len();
        let ops = TOPIC_OPERATIONS.iter().filter(|op| may(**op, &name)).fold(0i32, |bits, op| bits | 1 << op.code());
        if end < topic.partitions() {
            next_cursor = Some(Cursor::default().with_topic_name(TopicName(super::str_bytes(name.clone()))).with_partition_index(end));
        }
        topics.push(
            DescribeTopicPartitionsResponseTopic::default()
                .with_name(Some(TopicName(super::str_bytes(name))))
                .with_topic_id(uuid::Uuid::from_bytes(topic.id()))
                .with_partitions(partitions)
                .with_topic_authorized_operations(ops),
        );
        if next_cursor.is_some() {
            break;
        }
    }
    Some(Response::default().with_topics(topics).with_next_cursor(next_cursor))
}

fn topic_answer(name: String, code: i16) -> DescribeTopicPartitionsResponseTopic {
    DescribeTopicPartitionsResponseTopic::default().with_error_code(code).with_name(Some(TopicName(super::str_bytes(name)))).with_topic_authorized_operations(i32::MIN)
}
