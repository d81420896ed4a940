//! EndTxn: commit or abort. Answered once the markers are durable in every
//! partition of the transaction and its offsets are committed.
//!
//! v5 is transactions v2 (KIP-890 part 2): every end moves the producer's
//! epoch, and the answer carries the producer id and epoch to go on with.

pub use kafka_protocol::messages::{EndTxnRequest as Request, EndTxnResponse as Response};
use kafka_protocol::messages::ProducerId;
use kafka_protocol::protocol::VersionRange;

use crate::auth::acl::Operation;
use crate::kafka::authz;
use crate::kafka::Broker;

pub const VERSIONS: VersionRange = VersionRange { min: 0, max: 5 };

pub async fn handle(broker: &Broker, req: Request, version: i16) -> Option<Response> {
    let failed = |code: i16| Some(Response::default().with_error_code(code).with_producer_id(ProducerId(-1)).with_producer_epoch(-1));
    if authz::transactional_id_denied(broker, Operation::Write, &req.transactional_id.0) {
        return failed(kafka_protocol::ResponseError::TransactionalIdAuthorizationFailed.code());
    }
    if let Some(code) = broker.coordinator_error(&req.transactional_id.0) {
        return failed(code);
    }
    match broker.transactions.end_txn(&req.transactional_id.0, req.producer_id.0, req.producer_epoch, req.committed, version).await {
        Ok((producer_id, epoch)) => Some(Response::default().with_producer_id(ProducerId(producer_id)).with_producer_epoch(epoch)),
        Err(code) => failed(code),
    }
}
