//! AddOffsetsToTxn: the transaction will commit offsets for a group. In
//! cluster mode the group's coordinator may be another node: the group's
//! shard joins the transaction, so its end's marker reaches the offsets
//! that coordinator holds (docs/cluster.md, "Transaction state").

pub use kafka_protocol::messages::{AddOffsetsToTxnRequest as Request, AddOffsetsToTxnResponse as Response};
use kafka_protocol::protocol::VersionRange;
use kafka_protocol::ResponseError as E;

use crate::auth::acl::Operation;
use crate::kafka::authz;
use crate::kafka::{coordinator, Broker};

pub const VERSIONS: VersionRange = VersionRange { min: 0, max: 4 };

pub async fn handle(broker: &Broker, req: Request, version: i16) -> Option<Response> {
    let group = req.group_id.0.as_str();
    if group.is_empty() || group.len() > coordinator::MAX_GROUP_ID_LEN {
        return Some(Response::default().with_error_code(E::InvalidGroupId.code()));
    }
    // WRITE on the transactional id, READ on the group, as Kafka asks.
    if authz::transactional_id_denied(broker, Operation::Write, &req.transactional_id.0) {
        return Some(Response::default().with_error_code(E::TransactionalIdAuthorizationFailed.code()));
    }
    if authz::group_denied(broker, Operation::Read, group) {
        return Some(Response::default().with_error_code(E::GroupAuthorizationFailed.code()));
    }
    if let Some(code) = broker.coordinator_error(&req.transactional_id.0) {
        return Some(Response::default().with_error_code(code));
    }
    let code = match broker.transactions.add_offsets(&req.transactional_id.0, req.producer_id.0, req.producer_epoch, group, version).await {
        Ok(()) => 0,
        Err(code) => code,
    };
    Some(Response::default().with_error_code(code))
}
