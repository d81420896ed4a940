//! WriteTxnMarkers (v1), Kafka's inter-broker request that ends a
//! transaction at a partition's leader: for each marker, the commit or
//! abort control record of (producer id, epoch) is written to every named
//! partition this node leads, and answered once the partition's in-sync
//! replicas have it (acks=all; at once in single-node mode, where the
//! write is durable). It is also what `kafka-transactions abort`
//! (KIP-664) sends to end a hanging transaction. docs/cluster.md,
//! "Transaction state", has the plan it is part of.
//!
//! CLUSTER_ACTION on the cluster, as Kafka asks (brokers hold it; an
//! operator aborting a transaction needs it too). Per partition, Kafka's
//! codes: NOT_LEADER_OR_FOLLOWER, UNKNOWN_TOPIC_OR_PARTITION,
//! TRANSACTION_COORDINATOR_FENCED (above),
//! INVALID_PRODUCER_EPOCH when the producer has a newer
//! epoch at the partition, NOT_ENOUGH_REPLICAS (before anything is
//! written) when the ISR is smaller than `min.insync.replicas`,
//! NOT_ENOUGH_REPLICAS_AFTER_APPEND or
//! REQUEST_TIMED_OUT when the in-sync replicas do not take it in time.
//! A partition named twice in one marker gets one marker. In cluster mode
//! the transaction coordinator sends every marker this way, to every
//! partition's leader (itself included), with the leader epoch of the
//! coordinator shard it loaded the transaction in as its coordinator
//! epoch: a marker from an older coordinator than one whose marker the
//! producer has at the partition is TRANSACTION_COORDINATOR_FENCED, as
//! Kafka's leaders answer, so a deposed coordinator's late marker cannot
//! end a transaction its successor has moved past. A coordinator shard
//! keeps each producer's newest coordinator epoch in its log for the same
//! check.
//!
//! A partition of the coordinator topic (cluster mode) is a group
//! coordinator shard: the marker ends the transaction's pending offsets
//! there (`Coordinator::end_txn_offsets`: committed or dropped, in the
//! shard's log first), as Kafka's markers on `__consumer_offsets` do.
//! NOT_LEADER_OR_FOLLOWER while this node does not lead the shard or has
//! not loaded it, INVALID_PRODUCER_EPOCH for a marker older than the
//! offsets, TRANSACTION_COORDINATOR_FENCED for an older coordinator's,
//! NOT_ENOUGH_REPLICAS when the shard's log does not take it.

use std::collections::BTreeMap;
use std::time::Duration;

use kafka_protocol::messages::write_txn_markers_response::{WritableTxnMarkerPartitionResult, WritableTxnMarkerResult, WritableTxnMarkerTopicResult};
pub use kafka_protocol::messages::{WriteTxnMarkersRequest as Request, WriteTxnMarkersResponse as Response};
use kafka_protocol::protocol::VersionRange;
use kafka_protocol::ResponseError as E;

use crate::auth::acl::Operation;
use crate::kafka::authz::Check;
use crate::kafka::Broker;
use crate::protocol::batch::Marker;

/// Kafka 4 serves version 1 only (KIP-896 removed 0).
pub const VERSIONS: VersionRange = VersionRange { min: 1, max: 1 };

/// How long a marker waits for the partition's in-sync replicas (Kafka
/// uses the broker's request timeout, 30 s).
const REPLICATED_WITHIN: Duration = Duration::from_secs(30);

fn partition(index: i32, code: i16) -> WritableTxnMarkerPartitionResult {
    WritableTxnMarkerPartitionResult::default().with_partition_index(index).with_error_code(code)
}

pub async fn handle(broker: &Broker, req: Request, _version: i16) -> Option<Response> {
    let allowed = !broker.authorizer.enabled() || Check::current(broker).cluster(Operation::ClusterAction);
    let deadline = tokio::time::Instant::now() + REPLICATED_WITHIN;
    let mut markers = Vec::with_capacity(req.markers.len());
    for m in req.markers {
        let marker = if m.transaction_result { Marker::Commit } else { Marker::Abort };
        let view = broker.cluster.view();
        // Per topic, each partition's code; the partitions to write, each
        // once, with the epoch this node leads them in.
        let mut codes: Vec<(kafka_protocol::messages::TopicName, Vec<(i32, i16)>)> = Vec::with_capacity(m.topics.len());
        let mut write: BTreeMap<(String, i32), (std::sync::Arc<crate::engine::Topic>, i32)> = BTreeMap::new();
        // Coordinator shards whose pending offsets the marker ends.
        let mut shards = std::collections::BTreeSet::new();
        for t in &m.topics {
            let name = super::name(&t.name);
            if name == crate::cluster::topics::COORDINATOR_TOPIC && !view.single {
                let count = broker.engine.topic(name).map_or(0, |t| t.partitions());
                let ps = t
                    .partition_indexes
                    .iter()
                    .map(|&p| match () {
                        _ if !allowed => (p, E::ClusterAuthorizationFailed.code()),
                        _ if p < 0 || p >= count => (p, E::UnknownTopicOrPartition.code()),
                        _ => {
                            shards.insert(p);
                            (p, 0)
                        }
                    })
                    .collect();
                codes.push((t.name.clone(), ps));
                continue;
            }
            let topic = broker.engine.topic(name).filter(|t| !crate::engine::topics::is_internal(t.name()));
            let mut ps = Vec::with_capacity(t.partition_indexes.len());
            for &p in &t.partition_indexes {
                let code = match topic.as_ref().filter(|t| p >= 0 && p < t.partitions()) {
                    _ if !allowed => E::ClusterAuthorizationFailed.code(),
                    None => E::UnknownTopicOrPartition.code(),
                    Some(topic) => match broker.lead(&view, name, p) {
                        Err(_) => E::NotLeaderOrFollower.code(),
                        // Refused before anything is written, as Kafka's
                        // acks=-1 append (a retry would add another marker).
                        Ok(_) if !crate::kafka::replication::Replication::enough_replicas(&view, topic, p) => E::NotEnoughReplicas.code(),
                        Ok(epoch) => {
                            write.insert((name.to_owned(), p), (topic.clone(), epoch));
                            0
                        }
                    },
                };
                ps.push((p, code));
            }
            codes.push((t.name.clone(), ps));
        }
        let targets: Vec<((String, i32), (std::sync::Arc<crate::engine::Topic>, i32))> = write.into_iter().collect();
        let tps: Vec<crate::storage::Tp> = targets.iter().map(|((_, p), (t, _))| t.tp(*p)).collect();
        let written = broker.engine.write_markers_checked(m.producer_id.0, m.producer_epoch, m.coordinator_epoch, marker, &tps).await;
        // Each written partition's outcome, once its in-sync replicas
        // have the marker.
        let mut outcome: BTreeMap<(String, i32), i16> = BTreeMap::new();
        for s in shards {
            let code = broker.coordinator.end_txn_offsets(s as u32, m.producer_id.0, m.producer_epoch, m.coordinator_epoch, m.transaction_result).await.err().unwrap_or(0);
            outcome.insert((crate::cluster::topics::COORDINATOR_TOPIC.to_owned(), s), code);
        }
        for (((name, p), (topic, epoch)), w) in targets.into_iter().zip(written) {
            let code = match w {
                Err(e) => crate::kafka::errors::code(&e),
                Ok(_) if !broker.cluster.in_good_standing() => E::NotLeaderOrFollower.code(),
                Ok(a) if !view.single => match broker.replication.replicated(broker, &topic, p, epoch, a.last_offset + 1, deadline).await {
                    Ok(()) => 0,
                    Err(code) => code,
                },
                Ok(_) => 0,
            };
            outcome.insert((name, p), code);
        }
        let topics = codes
            .into_iter()
            .map(|(name, ps)| {
                let n = super::name(&name).to_owned();
                let partitions = ps.into_iter().map(|(p, code)| partition(p, if code == 0 { outcome.get(&(n.clone(), p)).copied().unwrap_or(0) } else { code })).collect();
                WritableTxnMarkerTopicResult::default().with_name(name).with_partitions(partitions)
            })
            .collect();
        markers.push(WritableTxnMarkerResult::default().with_producer_id(m.producer_id).with_topics(topics));
    }
    Some(Response::default().with_markers(markers))
}
