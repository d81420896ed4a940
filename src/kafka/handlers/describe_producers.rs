//! DescribeProducers (v0): the producers with state in each partition,
//! with epoch, last sequence, last timestamp and the start of an open
//! transaction (what `kafka-transactions describe-producers` shows, to
//! find the producer holding a transaction open). READ on the topic, as
//! Kafka asks. A partition named twice is answered once.

use kafka_protocol::messages::describe_producers_response::{PartitionResponse, ProducerState, TopicResponse};
pub use kafka_protocol::messages::{DescribeProducersRequest as Request, DescribeProducersResponse as Response};
use kafka_protocol::protocol::VersionRange;

use crate::auth::acl::Operation;
use crate::kafka::{errors, Broker};

pub const VERSIONS: VersionRange = VersionRange { min: 0, max: 0 };

pub async fn handle(broker: &Broker, req: Request, _version: i16) -> Option<Response> {
    let super::PartitionAsks { topics, asks: ask } =
        super::PartitionAsks::of(broker, Operation::Read, req.topics, |t| &t.name, |t| t.partition_indexes, |p| *p, |tp, _| tp);
    let found = if ask.is_empty() { Ok(Vec::new()) } else { broker.engine.describe_producers(ask).await };
    let topics = topics
        .into_iter()
        .map(|(name, parts)| {
            let partitions = parts
                .into_iter()
                .map(|(p, r)| {
                    let out = PartitionResponse::default().with_partition_index(p);
                    match (r, &found) {
                        (Err(code), _) => out.with_error_code(code),
                        (Ok(_), Err(e)) => out.with_error_code(errors::code(e)),
                        (Ok(i), Ok(all)) => out.with_active_producers(
                            all[i]
                                .iter()
                                .map(|a| {
                                    ProducerState::default()
                                        .with_producer_id(a.producer_id.into())
                                        .with_producer_epoch(a.epoch.into())
                                        .with_last_sequence(a.last_sequence)
                                        .with_last_timestamp(a.last_timestamp)
                                        .with_coordinator_epoch(a.coordinator_epoch)
                                        .with_current_txn_start_offset(a.txn_start_offset)
                                })
                                .collect(),
                        ),
                    }
                })
                .collect();
            TopicResponse::default().with_name(name).with_partitions(partitions)
        })
        .collect();
    Some(Response::default().with_topics(topics))
}
