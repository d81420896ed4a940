//! InitProducerId: hands a producer its producer id and epoch.
//!
//! Without a transactional id every init gets a fresh producer id at epoch
//! 0, also one naming its current id and epoch (v3+, KIP-360), as Kafka's
//! coordinator does: bumping an epoch the broker does not track would let
//! any client fence any producer. With one, the transaction coordinator
//! keeps the id's producer id and bumps its epoch, fencing the previous
//! holder and ending its open transaction (see `coordinator::transactions`).

pub use kafka_protocol::messages::{InitProducerIdRequest as Request, InitProducerIdResponse as Response};
use kafka_protocol::messages::ProducerId;
use kafka_protocol::protocol::VersionRange;
use kafka_protocol::ResponseError as E;

use crate::auth::acl::Operation;
use crate::kafka::authz;
use crate::kafka::Broker;

pub const VERSIONS: VersionRange = VersionRange { min: 0, max: 5 };

pub async fn handle(broker: &Broker, req: Request, version: i16) -> Option<Response> {
    let fail = |code: i16| Some(Response::default().with_error_code(code).with_producer_id(ProducerId(-1)).with_producer_epoch(-1));
    let txn = req.transactional_id.map(|t| t.0.to_string()).filter(|t| !t.is_empty());
    // WRITE on the transactional id; an idempotent producer needs
    // IDEMPOTENT_WRITE on the cluster or WRITE on some topic (KIP-679).
    if let Some(c) = broker.authorizer.enabled().then(|| authz::Check::current(broker)) {
        match &txn {
            Some(id) if !c.transactional_id(Operation::Write, id) => return fail(E::TransactionalIdAuthorizationFailed.code()),
            None if !c.any_topic(Operation::Write) && !c.cluster(Operation::IdempotentWrite) => {
                return fail(E::ClusterAuthorizationFailed.code());
            }
            _ => {}
        }
    }
    if let Some(id) = txn {
        if let Some(code) = broker.coordinator_error(&id) {
            return fail(code);
        }
        return match broker.transactions.init(&id, req.transaction_timeout_ms, req.producer_id.0, req.producer_epoch, version).await {
            Ok((pid, epoch)) => Some(Response::default().with_producer_id(ProducerId(pid)).with_producer_epoch(epoch)),
            Err(code) => fail(code),
        };
    }
    match crate::kafka::allocate_producer_id(&broker.engine, &broker.cluster).await {
        Ok(id) => Some(Response::default().with_producer_id(ProducerId(id)).with_producer_epoch(0)),
        Err(code) => fail(code),
    }
}
