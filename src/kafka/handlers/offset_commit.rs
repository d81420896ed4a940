//! OffsetCommit: checked against the group's generation and members (the
//! codes Kafka uses, so clients recover the same way), then made durable
//! before the answer.

use kafka_protocol::messages::offset_commit_response::{OffsetCommitResponsePartition, OffsetCommitResponseTopic};
pub use kafka_protocol::messages::{OffsetCommitRequest as Request, OffsetCommitResponse as Response};
use kafka_protocol::protocol::VersionRange;
use kafka_protocol::ResponseError;

use crate::auth::acl::Operation;
use crate::kafka::authz;
use crate::kafka::{coordinator, Broker};
use crate::meta::OffsetRecord;

pub const VERSIONS: VersionRange = VersionRange { min: 2, max: 9 };

/// Kafka's `offset.metadata.max.bytes`.
pub const MAX_METADATA_BYTES: usize = 4096;

pub async fn handle(broker: &Broker, req: Request, version: i16) -> Option<Response> {
    let group = req.group_id.0.to_string();
    let all = |code: i16, topics: &[kafka_protocol::messages::offset_commit_request::OffsetCommitRequestTopic]| {
        topics
            .iter()
            .map(|t| {
                OffsetCommitResponseTopic::default()
                    .with_name(t.name.clone())
                    .with_partitions(t.partitions.iter().map(|p| OffsetCommitResponsePartition::default().with_partition_index(p.partition_index).with_error_code(code)).collect())
            })
            .collect::<Vec<_>>()
    };
    if group.is_empty() || group.len() > coordinator::MAX_GROUP_ID_LEN {
        return Some(Response::default().with_topics(all(ResponseError::InvalidGroupId.code(), &req.topics)));
    }
    // READ on the group, and on each topic, as Kafka asks.
    if authz::group_denied(broker, Operation::Read, &group) {
        return Some(Response::default().with_topics(all(ResponseError::GroupAuthorizationFailed.code(), &req.topics)));
    }
    if let Some(code) = broker.coordinator_error(&group) {
        return Some(Response::default().with_topics(all(code, &req.topics)));
    }
    let acl = broker.authorizer.enabled().then(|| authz::Check::current(broker));
    let check = broker
        .coordinator
        .commit_check(group.clone(), coordinator::CommitIds { generation: req.generation_id_or_member_epoch, member_id: req.member_id.to_string(), instance_id: req.group_instance_id.as_ref().map(|s| s.to_string()) }, version)
        .await?;
    if let Err(code) = check {
        return Some(Response::default().with_topics(all(code, &req.topics)));
    }
    let now = broker.engine.now_ms();
    let mut rows = Vec::new();
    let mut codes: Vec<Vec<i16>> = Vec::with_capacity(req.topics.len());
    for t in &req.topics {
        let name = super::name(&t.name);
        // A subtree stream has one partition.
        let partitions = broker.engine.topic(name).map(|t| t.partitions()).or_else(|| broker.engine.subtree(name).map(|_| 1));
        let denied = acl.as_ref().is_some_and(|c| !c.topic(Operation::Read, name));
        let mut tc = Vec::with_capacity(t.partitions.len());
        for p in &t.partitions {
            let code = match partitions {
                _ if denied => ResponseError::TopicAuthorizationFailed.code(),
                None => ResponseError::UnknownTopicOrPartition.code(),
                Some(n) if p.partition_index < 0 || p.partition_index >= n => ResponseError::UnknownTopicOrPartition.code(),
                Some(_) if p.committed_metadata.as_ref().is_some_and(|m| m.len() > MAX_METADATA_BYTES) => ResponseError::OffsetMetadataTooLarge.code(),
                Some(_) => {
                    rows.push((
                        group.clone(),
                        super::name(&t.name).to_owned(),
                        p.partition_index,
                        OffsetRecord { offset: p.committed_offset, leader_epoch: p.committed_leader_epoch, metadata: p.committed_metadata.as_ref().map(|m| m.to_string()), commit_ms: now },
                    ));
                    0
                }
            };
            tc.push(code);
        }
        codes.push(tc);
    }
    if !rows.is_empty() {
        if let Err(e) = broker.coordinator.store_offsets(rows).await {
            tracing::error!(group = %group, error = %e, "storing committed offsets failed");
            for tc in codes.iter_mut() {
                for c in tc.iter_mut().filter(|c| **c == 0) {
                    *c = e.code;
                }
            }
        }
    }
    let topics = req
        .topics
        .iter()
        .zip(codes)
        .map(|(t, tc)| {
            OffsetCommitResponseTopic::default().with_name(t.name.clone()).with_partitions(
                t.partitions.iter().zip(tc).map(|(p, c)| OffsetCommitResponsePartition::default().with_partition_index(p.partition_index).with_error_code(c)).collect(),
            )
        })
        .collect();
    Some(Response::default().with_topics(topics))
}
