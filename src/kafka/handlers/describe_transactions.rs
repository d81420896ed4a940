//! DescribeTransactions: state, producer, timeout, start time and
//! partitions of each named transactional id.

use std::collections::BTreeMap;

use kafka_protocol::messages::describe_transactions_response::{TopicData, TransactionState};
pub use kafka_protocol::messages::{DescribeTransactionsRequest as Request, DescribeTransactionsResponse as Response};
use kafka_protocol::messages::ProducerId;
use kafka_protocol::protocol::VersionRange;
use kafka_protocol::ResponseError as E;

use super::{str_bytes, topic_name};
use crate::auth::acl::Operation;
use crate::kafka::authz;
use crate::kafka::coordinator::transactions::state_name;
use crate::kafka::Broker;

pub const VERSIONS: VersionRange = VersionRange { min: 0, max: 0 };

pub async fn handle(broker: &Broker, req: Request, _version: i16) -> Option<Response> {
    // Each id is described once: an answer lists the transaction's
    // partitions, which repeats would multiply.
    let wanted = super::first_occurrences(req.transactional_ids, |t| t.0.clone());
    // Ids another node coordinates are NOT_COORDINATOR, not looked up.
    let here: Vec<bool> = wanted.iter().map(|t| broker.coordinates(&t.0)).collect();
    let ids: Vec<String> = wanted.iter().zip(&here).filter(|(_, h)| **h).map(|(t, _)| t.0.to_string()).collect();
    let mut found = broker.transactions.describe(&ids).await.into_iter();
    // DESCRIBE on each transactional id, as Kafka asks; its partitions of
    // topics the principal may not DESCRIBE are left out.
    let check = broker.authorizer.enabled().then(|| authz::Check::current(broker));
    let states = wanted
        .into_iter()
        .zip(here)
        .map(|(id, here)| {
            // One record for each id looked up, in order.
            let rec = if here { found.next().flatten() } else { None };
            let out = TransactionState::default().with_transactional_id(id.clone());
            if check.as_ref().is_some_and(|c| !c.transactional_id(Operation::Describe, &id.0)) {
                return out.with_error_code(E::TransactionalIdAuthorizationFailed.code()).with_producer_id(ProducerId(-1)).with_producer_epoch(-1);
            }
            if !here {
                return out.with_error_code(E::NotCoordinator.code()).with_producer_id(ProducerId(-1)).with_producer_epoch(-1);
            }
            let Some(rec) = rec else { return out.with_error_code(E::TransactionalIdNotFound.code()).with_producer_id(ProducerId(-1)).with_producer_epoch(-1) };
            let mut topics: BTreeMap<String, Vec<i32>> = BTreeMap::new();
            for (t, p) in rec.partitions.iter().filter(|(t, _)| check.as_ref().is_none_or(|c| c.topic(Operation::Describe, t))) {
                topics.entry(t.clone()).or_default().push(*p);
            }
            out.with_transaction_state(str_bytes(state_name(rec.state)))
                .with_transaction_timeout_ms(rec.timeout_ms)
                .with_transaction_start_time_ms(rec.start_ms)
                .with_producer_id(ProducerId(rec.producer_id))
                .with_producer_epoch(rec.epoch)
                .with_topics(topics.into_iter().map(|(t, ps)| TopicData::default().with_topic(topic_name(&t)).with_partitions(ps)).collect())
        })
        .collect();
    Some(Response::default().with_transaction_states(states))
}
