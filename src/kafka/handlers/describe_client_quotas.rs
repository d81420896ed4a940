//! DescribeClientQuotas: the quota entities a filter matches, with their
//! values. With the authorizer, DESCRIBE_CONFIGS on the cluster, as Kafka
//! asks; without it, super users only (the answer names users, and
//! DescribeUserScramCredentials is held to the same rule).

use kafka_protocol::messages::describe_client_quotas_response::{EntityData, EntryData, ValueData};
pub use kafka_protocol::messages::{DescribeClientQuotasRequest as Request, DescribeClientQuotasResponse as Response};
use kafka_protocol::protocol::VersionRange;
use kafka_protocol::ResponseError as E;

use super::str_bytes;
use crate::auth::acl::Operation;
use crate::auth::quota::{Match, CLIENT_ID, IP, USER};
use crate::kafka::authz::Check;
use crate::kafka::Broker;

pub const VERSIONS: VersionRange = VersionRange { min: 0, max: 1 };

pub async fn handle(broker: &Broker, req: Request, _version: i16) -> Option<Response> {
    let fail = |code: i16, msg: String| Some(Response::default().with_error_code(code).with_error_message(Some(str_bytes(msg))).with_entries(None));
    if !Check::current(broker).administers(Operation::DescribeConfigs) {
        return fail(E::ClusterAuthorizationFailed.code(), "Cluster authorization failed.".into());
    }
    let filter = match filter(&req) {
        Ok(f) => f,
        Err((code, why)) => return fail(code, why),
    };
    let entries = broker
        .quotas
        .describe(&filter, req.strict)
        .into_iter()
        .map(|(entity, values)| {
            EntryData::default()
                .with_entity(entity.to_wire().into_iter().map(|(t, n)| EntityData::default().with_entity_type(str_bytes(t)).with_entity_name(n.map(str_bytes))).collect())
                .with_values(values.into_iter().map(|(k, v)| ValueData::default().with_key(str_bytes(k.key())).with_value(v)).collect())
        })
        .collect();
    Some(Response::default().with_entries(Some(entries)))
}

/// The filter's components, refused as Kafka refuses them.
fn filter(req: &Request) -> Result<Vec<(String, Match)>, (i16, String)> {
    let invalid = |why: String| (E::InvalidRequest.code(), why);
    let mut out: Vec<(String, Match)> = Vec::with_capacity(req.components.len());
    for c in &req.components {
        let kind = c.entity_type.as_str();
        if kind.is_empty() {
            return Err(invalid("Invalid empty entity type.".into()));
        }
        if out.iter().any(|(k, _)| k == kind) {
            return Err(invalid(format!("Entity type {kind} cannot appear more than once in the filter.")));
        }
        if ![USER, CLIENT_ID, IP].contains(&kind) {
            return Err((E::UnsupportedVersion.code(), format!("Custom entity type {kind} not supported")));
        }
        let m = match (c.match_type, &c._match) {
            (0, Some(name)) => Match::Exact(name.to_string()),
            (0, None) => return Err(invalid(format!("An exact match for {kind} needs a name"))),
            (1, _) => Match::Default,
            (2, _) => Match::Any,
            (other, _) => return Err(invalid(format!("Unexpected match type {other}"))),
        };
        out.push((kind.to_owned(), m));
    }
    let has = |k: &str| out.iter().any(|(t, _)| t == k);
    if has(IP) && (has(USER) || has(CLIENT_ID)) {
        return Err(invalid("Invalid entity filter component combination. IP filter component should not be used with user or clientId filter component.".into()));
    }
    Ok(out)
}
