//! DeleteRecords (v0–2): raises partitions' log starts (`kafka-delete-records`,
//! AdminClient.deleteRecords). Offset -1 means the high watermark; an
//! offset below zero otherwise, or past the high watermark, is
//! OFFSET_OUT_OF_RANGE; a compact-only topic is POLICY_VIOLATION, as in
//! Kafka. DELETE on the topic, as Kafka asks. The new starts are durable
//! before the answer; a partition named twice is answered once.

use kafka_protocol::messages::delete_records_response::{DeleteRecordsPartitionResult, DeleteRecordsTopicResult};
pub use kafka_protocol::messages::{DeleteRecordsRequest as Request, DeleteRecordsResponse as Response};
use kafka_protocol::protocol::VersionRange;

use crate::auth::acl::Operation;
use crate::kafka::{errors, Broker};

pub const VERSIONS: VersionRange = VersionRange { min: 0, max: 2 };

pub async fn handle(broker: &Broker, req: Request, _version: i16) -> Option<Response> {
    let super::PartitionAsks { topics, asks } =
        super::PartitionAsks::of(broker, Operation::Delete, req.topics, |t| &t.name, |t| t.partitions, |p| p.partition_index, |tp, p| (tp, p.offset));
    let engine = broker.engine.clone();
    let done = tokio::task::spawn_blocking(move || engine.delete_records(&asks)).await.ok()?;
    let topics = topics
        .into_iter()
        .map(|(name, parts)| {
            let partitions = parts
                .into_iter()
                .map(|(p, r)| {
                    let out = DeleteRecordsPartitionResult::default().with_partition_index(p).with_low_watermark(-1);
                    match r.map(|i| &done[i]) {
                        Err(code) => out.with_error_code(code),
                        Ok(Ok(start)) => out.with_low_watermark(*start),
                        Ok(Err(e)) => out.with_error_code(errors::code(e)),
                    }
                })
                .collect();
            DeleteRecordsTopicResult::default().with_name(name).with_partitions(partitions)
        })
        .collect();
    Some(Response::default().with_topics(topics))
}
