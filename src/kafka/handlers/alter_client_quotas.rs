//! AlterClientQuotas: sets and removes quota values per entity, durably,
//! all of a request's valid entries in one catalog write. Each entry is
//! checked as Kafka checks it (entity types, known keys, positive values,
//! whole byte rates) and answered on its own; `validate_only` checks
//! without applying. With the authorizer, ALTER_CONFIGS on the cluster, as
//! Kafka asks; without it, super users only (see `Check::administers`).

use kafka_protocol::messages::alter_client_quotas_response::{EntityData, EntryData};
pub use kafka_protocol::messages::{AlterClientQuotasRequest as Request, AlterClientQuotasResponse as Response};
use kafka_protocol::protocol::VersionRange;
use kafka_protocol::ResponseError as E;

use super::str_bytes;
use crate::auth::acl::Operation;
use crate::auth::quota::{Entity, Kind, Op, Quotas};
use crate::kafka::authz::Check;
use crate::kafka::Broker;

pub const VERSIONS: VersionRange = VersionRange { min: 0, max: 1 };

/// An entry's error code and message.
type Refusal = (i16, String);

pub async fn handle(broker: &Broker, req: Request, _version: i16) -> Option<Response> {
    let allowed = Check::current(broker).administers(Operation::AlterConfigs);
    // Each entry's answer, and the change of those that pass.
    let mut answers: Vec<(Vec<EntityData>, Result<(), Refusal>)> = Vec::with_capacity(req.entries.len());
    let mut changes: Vec<(Entity, Vec<Op>)> = Vec::new();
    for e in &req.entries {
        let echo = e.entity.iter().map(|d| EntityData::default().with_entity_type(d.entity_type.clone()).with_entity_name(d.entity_name.clone())).collect();
        let checked = if allowed { check(e) } else { Err((E::ClusterAuthorizationFailed.code(), "Cluster authorization failed.".into())) };
        match checked {
            Ok(change) => {
                changes.push(change);
                answers.push((echo, Ok(())));
            }
            Err(why) => answers.push((echo, Err(why))),
        }
    }
    let stored = if req.validate_only || changes.is_empty() {
        Ok(())
    } else {
        let (quotas, catalog) = (broker.quotas.clone(), broker.engine.clone());
        match tokio::task::spawn_blocking(move || quotas.alter(catalog.catalog(), &changes)).await {
            Ok(r) => r.map_err(|e| {
                // etcd not taking it in time is retriable.
                let code = if matches!(e, crate::auth::quota::QuotaError::Cluster(_)) { E::RequestTimedOut.code() } else { E::UnknownServerError.code() };
                (code, e.to_string())
            }),
            Err(e) => Err((E::UnknownServerError.code(), e.to_string())),
        }
    };
    let entries = answers
        .into_iter()
        .map(|(entity, r)| {
            let r = r.and(stored.clone());
            let (code, msg) = match r {
                Ok(()) => (0, None),
                Err((code, why)) => (code, Some(str_bytes(why))),
            };
            EntryData::default().with_entity(entity).with_error_code(code).with_error_message(msg)
        })
        .collect();
    Some(Response::default().with_entries(entries))
}

/// An entry's entity and operations, or why Kafka would refuse it.
fn check(e: &kafka_protocol::messages::alter_client_quotas_request::EntryData) -> Result<(Entity, Vec<Op>), Refusal> {
    let invalid = |why: String| (E::InvalidRequest.code(), why);
    let entity = Entity::from_wire(e.entity.iter().map(|d| (d.entity_type.as_str(), d.entity_name.as_deref()))).map_err(invalid)?;
    let mut ops = Vec::with_capacity(e.ops.len());
    for op in &e.ops {
        let kind = Kind::parse(op.key.as_str()).ok_or_else(|| invalid(format!("Invalid configuration key {}", op.key.as_str())))?;
        ops.push((kind, (!op.remove).then_some(op.value)));
    }
    if let Some(why) = Quotas::check(&ops) {
        return Err(invalid(why));
    }
    Ok((entity, ops))
}
