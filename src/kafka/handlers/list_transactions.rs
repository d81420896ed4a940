//! ListTransactions, with the state and producer id filters and (v1) the
//! duration filter: only transactions running longer than that.

use kafka_protocol::messages::list_transactions_response::TransactionState;
pub use kafka_protocol::messages::{ListTransactionsRequest as Request, ListTransactionsResponse as Response};
use kafka_protocol::messages::{ProducerId, TransactionalId};
use kafka_protocol::protocol::VersionRange;

use super::str_bytes;
use crate::auth::acl::Operation;
use crate::kafka::authz;
use crate::kafka::coordinator::transactions::{state_name, STATE_NAMES};
use crate::kafka::Broker;

pub const VERSIONS: VersionRange = VersionRange { min: 0, max: 1 };

pub async fn handle(broker: &Broker, req: Request, version: i16) -> Option<Response> {
    let unknown: Vec<_> = req.state_filters.iter().filter(|s| !STATE_NAMES.contains(&s.as_str())).cloned().collect();
    let now = broker.transactions.now_ms();
    let min_duration = if version >= 1 { req.duration_filter } else { -1 };
    // Only the transactional ids the principal may DESCRIBE (as Kafka).
    let check = broker.authorizer.enabled().then(|| authz::Check::current(broker));
    let states = broker
        .transactions
        .list()
        .await
        .into_iter()
        .filter(|v| check.as_ref().is_none_or(|c| c.transactional_id(Operation::Describe, &v.id)))
        .filter(|v| req.state_filters.is_empty() || req.state_filters.iter().any(|s| s.as_str() == state_name(v.record.state)))
        .filter(|v| req.producer_id_filters.is_empty() || req.producer_id_filters.iter().any(|p| p.0 == v.record.producer_id))
        .filter(|v| min_duration < 0 || (v.record.start_ms >= 0 && now - v.record.start_ms > min_duration))
        .map(|v| {
            TransactionState::default()
                .with_transactional_id(TransactionalId(str_bytes(v.id)))
                .with_producer_id(ProducerId(v.record.producer_id))
                .with_transaction_state(str_bytes(state_name(v.record.state)))
        })
        .collect();
    Some(Response::default().with_unknown_state_filters(unknown).with_transaction_states(states))
}
