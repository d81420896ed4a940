//! EndTxn: commit or abort. Answered once the markers are durable in every
//! partition of the transaction and its offsets are committed.
//!
//! v5 (KIP-890 part 2: a new epoch after every transaction) is not served;
//! clients fall back to v4.

pub use kafka_protocol::messages::{EndTxnRequest as Request, EndTxnResponse as Response};
use kafka_protocol::protocol::VersionRange;

use crate::auth::acl::Operation;
use crate::kafka::authz;
use crate::kafka::Broker;

pub const VERSIONS: VersionRange = VersionRange { min: 0, max: 4 };

pub async fn handle(broker: &Broker, req: Request, version: i16) -> Option<Response> {
    if authz::transactional_id_denied(broker, Operation::Write, &req.transactional_id.0) {
        return Some(Response::default().with_error_code(kafka_protocol::ResponseError::TransactionalIdAuthorizationFailed.code()));
    }
    let code = match broker.transactions.end_txn(&req.transactional_id.0, req.producer_id.0, req.producer_epoch, req.committed, version).await {
        Ok(()) => 0,
        Err(code) => code,
    };
    Some(Response::default().with_error_code(code))
}
