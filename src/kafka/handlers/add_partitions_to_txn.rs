//! AddPartitionsToTxn: v0–3 name one transaction; v4+ batch several (the
//! form brokers use among themselves, a partition leader asking a
//! transaction's coordinator; `verify_only` asks whether the partitions
//! are already in the transaction). As in Kafka, v4+ needs CLUSTER_ACTION
//! on the cluster (and no ACL on the ids or topics: the leader checked
//! the producer's); v0–3 need WRITE on the id and every topic.

use kafka_protocol::messages::add_partitions_to_txn_request::AddPartitionsToTxnTopic;
use kafka_protocol::messages::add_partitions_to_txn_response::{AddPartitionsToTxnPartitionResult, AddPartitionsToTxnResult, AddPartitionsToTxnTopicResult};
pub use kafka_protocol::messages::{AddPartitionsToTxnRequest as Request, AddPartitionsToTxnResponse as Response};
use kafka_protocol::protocol::VersionRange;

use crate::auth::acl::Operation;
use crate::kafka::authz;
use crate::kafka::Broker;

pub const VERSIONS: VersionRange = VersionRange { min: 0, max: 5 };

pub async fn handle(broker: &Broker, req: Request, version: i16) -> Option<Response> {
    if version <= 3 {
        let topics = one(broker, &req.v3_and_below_transactional_id.0, req.v3_and_below_producer_id.0, req.v3_and_below_producer_epoch, &req.v3_and_below_topics, false, version).await;
        return Some(Response::default().with_results_by_topic_v3_and_below(topics));
    }
    if broker.authorizer.enabled() && !authz::Check::current(broker).cluster(Operation::ClusterAction) {
        let code = kafka_protocol::ResponseError::ClusterAuthorizationFailed.code();
        let results = req
            .transactions
            .iter()
            .map(|t| AddPartitionsToTxnResult::default().with_transactional_id(t.transactional_id.clone()).with_topic_results(results(&t.topics, std::iter::repeat(code))))
            .collect();
        return Some(Response::default().with_error_code(code).with_results_by_transaction(results));
    }
    let mut results = Vec::with_capacity(req.transactions.len());
    for t in &req.transactions {
        let topics = one(broker, &t.transactional_id.0, t.producer_id.0, t.producer_epoch, &t.topics, t.verify_only, version).await;
        results.push(AddPartitionsToTxnResult::default().with_transactional_id(t.transactional_id.clone()).with_topic_results(topics));
    }
    Some(Response::default().with_results_by_transaction(results))
}

async fn one(broker: &Broker, id: &str, producer_id: i64, epoch: i16, topics: &[AddPartitionsToTxnTopic], verify_only: bool, version: i16) -> Vec<AddPartitionsToTxnTopicResult> {
    let wanted: Vec<(String, i32)> = topics.iter().flat_map(|t| t.partitions.iter().map(move |p| (super::name(&t.name).to_owned(), *p))).collect();
    // WRITE on the transactional id and on every topic, as Kafka asks: a
    // refused topic fails the request, the others are OPERATION_NOT_ATTEMPTED.
    // (v4+: the cluster action was checked instead.)
    let check = (broker.authorizer.enabled() && version <= 3).then(|| authz::Check::current(broker));
    let refused_topics: std::collections::HashSet<&str> = match &check {
        Some(c) => topics.iter().map(|t| super::name(&t.name)).filter(|n| !c.topic(Operation::Write, n)).collect(),
        None => Default::default(),
    };
    let codes = if check.as_ref().is_some_and(|c| !c.transactional_id(Operation::Write, id)) {
        vec![kafka_protocol::ResponseError::TransactionalIdAuthorizationFailed.code(); wanted.len()]
    } else if let Some(code) = broker.coordinator_error(id) {
        vec![code; wanted.len()]
    } else if !refused_topics.is_empty() {
        let (refused, skipped) = (kafka_protocol::ResponseError::TopicAuthorizationFailed.code(), kafka_protocol::ResponseError::OperationNotAttempted.code());
        wanted.iter().map(|(t, _)| if refused_topics.contains(t.as_str()) { refused } else { skipped }).collect()
    } else {
        match broker.transactions.add_partitions(id, producer_id, epoch, &wanted, verify_only, version).await {
            Ok(codes) => codes,
            Err(code) => vec![code; wanted.len()],
        }
    };
    results(topics, codes)
}

/// The answer for `topics`, each partition taking the next of `codes`
/// (in the order the request names them).
fn results(topics: &[AddPartitionsToTxnTopic], codes: impl IntoIterator<Item = i16>) -> Vec<AddPartitionsToTxnTopicResult> {
    let mut codes = codes.into_iter();
    topics
        .iter()
        .map(|t| {
            let parts = t
                .partitions
                .iter()
                .map(|p| AddPartitionsToTxnPartitionResult::default().with_partition_index(*p).with_partition_error_code(codes.next().unwrap_or_default()))
                .collect();
            AddPartitionsToTxnTopicResult::default().with_name(t.name.clone()).with_results_by_partition(parts)
        })
        .collect()
}
