//! TxnOffsetCommit: offsets a transaction commits for a group, held in the
//! transaction until it commits (dropped if it aborts). Checked against the
//! group's generation when the producer names its consumer's membership
//! (v3+), as Kafka does.
//!
//! v5 is transactions v2 (KIP-890 part 2): the commit brings its group
//! into the transaction, beginning it if need be (no AddOffsetsToTxn first).

use kafka_protocol::messages::txn_offset_commit_response::{TxnOffsetCommitResponsePartition, TxnOffsetCommitResponseTopic};
pub use kafka_protocol::messages::{TxnOffsetCommitRequest as Request, TxnOffsetCommitResponse as Response};
use kafka_protocol::protocol::VersionRange;
use kafka_protocol::ResponseError as E;

use crate::auth::acl::Operation;
use crate::kafka::authz;
use crate::kafka::{coordinator, Broker};

pub const VERSIONS: VersionRange = VersionRange { min: 0, max: 5 };

pub async fn handle(broker: &Broker, req: Request, version: i16) -> Option<Response> {
    let group = req.group_id.0.to_string();
    let offsets: Vec<_> = req
        .topics
        .iter()
        .flat_map(|t| t.partitions.iter().map(move |p| (super::name(&t.name).to_owned(), p.partition_index, p.committed_offset, p.committed_leader_epoch, p.committed_metadata.as_ref().map(|m| m.to_string()))))
        .collect();
    let n = offsets.len();
    // WRITE on the transactional id, READ on the group and each topic.
    let check = broker.authorizer.enabled().then(|| authz::Check::current(broker));
    let denied_topic = |t: &str| check.as_ref().is_some_and(|c| !c.topic(Operation::Read, t));
    let codes = if group.is_empty() || group.len() > coordinator::MAX_GROUP_ID_LEN {
        vec![E::InvalidGroupId.code(); n]
    } else if check.as_ref().is_some_and(|c| !c.transactional_id(Operation::Write, &req.transactional_id.0)) {
        vec![E::TransactionalIdAuthorizationFailed.code(); n]
    } else if check.as_ref().is_some_and(|c| !c.group(Operation::Read, &group)) {
        vec![E::GroupAuthorizationFailed.code(); n]
    } else if let Some(code) = broker.coordinator_error(&group) {
        vec![code; n]
    } else if offsets.iter().any(|(t, ..)| denied_topic(t)) {
        offsets.iter().map(|(t, ..)| if denied_topic(t) { E::TopicAuthorizationFailed.code() } else { E::OperationNotAttempted.code() }).collect()
    } else {
        let member = if version >= 3 { (req.generation_id, req.member_id.to_string(), req.group_instance_id.as_ref().map(|s| s.to_string())) } else { (-1, String::new(), None) };
        match broker.transactions.commit_offsets(&req.transactional_id.0, &group, req.producer_id.0, req.producer_epoch, member, offsets, version).await {
            Ok(codes) => codes,
            Err(code) => vec![code; n],
        }
    };
    let mut codes = codes.into_iter();
    let topics = req
        .topics
        .iter()
        .map(|t| {
            TxnOffsetCommitResponseTopic::default().with_name(t.name.clone()).with_partitions(
                t.partitions.iter().map(|p| TxnOffsetCommitResponsePartition::default().with_partition_index(p.partition_index).with_error_code(codes.next().unwrap_or_default())).collect(),
            )
        })
        .collect();
    Some(Response::default().with_topics(topics))
}
