//! InitProducerId: hands an idempotent producer its producer id and epoch,
//! from the catalog (so ids are never reused across restarts).
//!
//! Transactions are not served yet (no AddPartitionsToTxn, EndTxn, …), so
//! a request with a transactional id is refused with
//! TRANSACTIONAL_ID_AUTHORIZATION_FAILED: one of the codes every client
//! treats as fatal at init. Accepting it would let a transactional
//! producer start and then hang at its first commit. (The catalog already
//! keeps transactional ids' producer ids and epochs for when they land.)
//!
//! Without a transactional id every init gets a fresh producer id at epoch
//! 0, also one naming its current id and epoch (v3+, KIP-360), as Kafka's
//! coordinator does: bumping an epoch the broker does not track would let
//! any client fence any producer.

pub use kafka_protocol::messages::{InitProducerIdRequest as Request, InitProducerIdResponse as Response};
use kafka_protocol::messages::ProducerId;
use kafka_protocol::protocol::VersionRange;
use kafka_protocol::ResponseError as E;

use crate::kafka::Broker;

pub const VERSIONS: VersionRange = VersionRange { min: 0, max: 5 };

/// Kafka's `transaction.max.timeout.ms` default.
const MAX_TRANSACTION_TIMEOUT_MS: i32 = 900_000;

pub async fn handle(broker: &Broker, req: Request, _version: i16) -> Option<Response> {
    let fail = |e: E| Some(Response::default().with_error_code(e.code()).with_producer_id(ProducerId(-1)).with_producer_epoch(-1));
    let txn = req.transactional_id.map(|t| t.0.to_string()).filter(|t| !t.is_empty());
    if txn.is_some() && (req.transaction_timeout_ms <= 0 || req.transaction_timeout_ms > MAX_TRANSACTION_TIMEOUT_MS) {
        return fail(E::InvalidTransactionTimeout);
    }
    if let Some(t) = &txn {
        tracing::warn!(transactional_id = %t, "refusing a transactional producer: transactions are not supported yet");
        return fail(E::TransactionalIdAuthorizationFailed);
    }
    let engine = broker.engine.clone();
    let allocated = tokio::task::spawn_blocking(move || engine.catalog().allocate_producer_id().map(|id| (id, 0i16))).await;
    match allocated {
        Ok(Ok((id, epoch))) => Some(Response::default().with_producer_id(ProducerId(id)).with_producer_epoch(epoch)),
        Ok(Err(e)) => {
            tracing::error!(error = %e, "InitProducerId: catalog failed");
            fail(E::KafkaStorageError)
        }
        Err(_) => fail(E::CoordinatorNotAvailable),
    }
}
