//! TxnOffsetCommit: offsets a transaction commits for a group, held in the
//! transaction until it commits (dropped if it aborts). Checked against the
//! group's generation when the producer names its consumer's membership
//! (v3+), as Kafka does.
//!
//! v5 is transactions v2 (KIP-890 part 2): the commit brings its group
//! into the transaction, beginning it if need be (no AddOffsetsToTxn first).
//!
//! Cluster mode (docs/cluster.md, "Transaction state"): the group's
//! coordinator (this node) checks the member, asks the transaction's
//! coordinator (any node) whether the group's shard is in the
//! transaction — or, for v5, to add it — as Kafka's group coordinator
//! verifies since KIP-890, and appends the offsets to the group's shard
//! as pending ones. The transaction's marker on that shard commits or
//! drops them (WriteTxnMarkers).

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
        if !broker.cluster.view().single {
            return Some(response(&req, staged(broker, &req.transactional_id.0, &group, req.producer_id.0, req.producer_epoch, member, offsets, version).await));
        }
        match broker.transactions.commit_offsets(&req.transactional_id.0, &group, req.producer_id.0, req.producer_epoch, member, offsets, version).await {
            Ok(codes) => codes,
            Err(code) => vec![code; n],
        }
    };
    Some(response(&req, codes))
}

fn response(req: &Request, codes: Vec<i16>) -> Response {
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
    Response::default().with_topics(topics)
}

/// Cluster mode: the offsets wait in the group's shard for the
/// transaction's end (see the module docs). A code per offset.
#[allow(clippy::too_many_arguments)]
async fn staged(broker: &Broker, id: &str, group: &str, producer_id: i64, epoch: i16, member: (i32, String, Option<String>), offsets: Vec<(String, i32, i64, i32, Option<String>)>, version: i16) -> Vec<i16> {
    let n = offsets.len();
    let (generation, member_id, instance_id) = member;
    match broker.coordinator.txn_commit_check(group.to_owned(), coordinator::CommitIds { generation, member_id, instance_id }).await {
        Some(Ok(())) => {}
        Some(Err(code)) => return vec![code; n],
        None => return vec![E::CoordinatorNotAvailable.code(); n],
    }
    // The group's shard must be in the transaction (added by
    // AddOffsetsToTxn; v5 adds it here).
    let shard = vec![(crate::cluster::topics::COORDINATOR_TOPIC.to_owned(), coordinator::journal::shard_of(group) as i32)];
    let verify_only = version < 5;
    // Taken before the question: a marker reaching the shard while the
    // answer travels removes it, and the offsets are not staged.
    let guard = broker.coordinator.guard_txn_offsets(group, producer_id);
    let code = if broker.coordinates(id) {
        match broker.transactions.add_partitions(id, producer_id, epoch, &shard, verify_only, 5).await {
            Ok(codes) => codes.first().copied().unwrap_or_default(),
            Err(code) => code,
        }
    } else {
        let view = broker.cluster.view();
        super::produce::ask_coordinator(broker, &view, id, producer_id, epoch, verify_only, &shard).await.first().copied().unwrap_or_default()
    };
    if code != 0 {
        broker.coordinator.release_txn_offsets_guard(group, producer_id, guard);
        return vec![verification_code(code, version); n];
    }
    let now = broker.engine.now_ms();
    let mut codes = Vec::with_capacity(n);
    // One row per partition: the last offset a request names for it wins.
    let mut rows: std::collections::HashMap<(String, i32), crate::meta::OffsetRecord> = std::collections::HashMap::with_capacity(n);
    for (topic, partition, offset, leader_epoch, metadata) in offsets {
        let known = broker.engine.topic(&topic).is_some_and(|t| partition >= 0 && partition < t.partitions());
        codes.push(if !known {
            E::UnknownTopicOrPartition.code()
        } else if metadata.as_ref().is_some_and(|m| m.len() > super::offset_commit::MAX_METADATA_BYTES) {
            E::OffsetMetadataTooLarge.code()
        } else {
            rows.insert((topic, partition), crate::meta::OffsetRecord { offset, leader_epoch, metadata, commit_ms: now });
            0
        });
    }
    if rows.is_empty() {
        broker.coordinator.release_txn_offsets_guard(group, producer_id, guard);
        return codes;
    }
    let rows = rows.into_iter().map(|((t, p), r)| (t, p, r)).collect();
    match broker.coordinator.stage_txn_offsets(producer_id, epoch, group, rows, guard).await {
        Ok(()) => codes,
        Err(code) => codes.into_iter().map(|c| if c == 0 { code } else { c }).collect(),
    }
}

/// What a TxnOffsetCommit answers when the transaction's coordinator did
/// not let the group's shard in: its own verdicts (fenced, not in a
/// transaction, unknown producer) as they are, PRODUCER_FENCED as
/// INVALID_PRODUCER_EPOCH before v3 (KIP-588); a coordinator that is busy,
/// moving or away as COORDINATOR_LOAD_IN_PROGRESS, which every client
/// retries here.
fn verification_code(code: i16, version: i16) -> i16 {
    match E::try_from_code(code) {
        Some(E::ProducerFenced) if version < 3 => E::InvalidProducerEpoch.code(),
        Some(E::ConcurrentTransactions | E::CoordinatorNotAvailable | E::NotCoordinator | E::CoordinatorLoadInProgress | E::NetworkException | E::OperationNotAttempted | E::RequestTimedOut) => E::CoordinatorLoadInProgress.code(),
        _ => code,
    }
}
