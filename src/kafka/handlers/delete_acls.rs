//! DeleteAcls: per filter, the ACLs it matched and removed. ALTER on the
//! cluster, as Kafka asks; SECURITY_DISABLED without the authorizer. A
//! filter with unknown numbers is answered INVALID_REQUEST and removes
//! nothing; the other filters of the request still apply.

use kafka_protocol::messages::delete_acls_response::{DeleteAclsFilterResult, DeleteAclsMatchingAcl};
pub use kafka_protocol::messages::{DeleteAclsRequest as Request, DeleteAclsResponse as Response};
use kafka_protocol::protocol::VersionRange;
use kafka_protocol::ResponseError as E;

use super::str_bytes;
use crate::auth::acl::{Filter, Operation};
use crate::kafka::authz;
use crate::kafka::Broker;

pub const VERSIONS: VersionRange = VersionRange { min: 1, max: 3 };

fn failed(code: i16, msg: &str) -> DeleteAclsFilterResult {
    DeleteAclsFilterResult::default().with_error_code(code).with_error_message(Some(str_bytes(msg)))
}

pub async fn handle(broker: &Broker, req: Request, _version: i16) -> Option<Response> {
    if let Some((code, msg)) = authz::acl_api_refusal(broker, Operation::Alter) {
        return Some(Response::default().with_filter_results(req.filters.iter().map(|_| failed(code, msg)).collect()));
    }
    let filters: Vec<Filter> = req
        .filters
        .into_iter()
        .map(|f| Filter::from_wire(f.resource_type_filter, f.resource_name_filter.as_deref(), f.pattern_type_filter, f.principal_filter.as_deref(), f.host_filter.as_deref(), f.operation, f.permission_type))
        .collect();
    let invalid: Vec<Option<&'static str>> = filters.iter().map(Filter::invalid).collect();
    let valid: Vec<Filter> = filters.into_iter().zip(&invalid).filter(|(_, i)| i.is_none()).map(|(f, _)| f).collect();
    let (authorizer, engine) = (broker.authorizer.clone(), broker.engine.clone());
    let deleted = tokio::task::spawn_blocking(move || authorizer.delete(engine.catalog(), &valid)).await.ok()?;
    let results = match deleted {
        Err(e) => {
            let code = if matches!(e, crate::auth::acl::AclError::Cluster(_)) { E::RequestTimedOut.code() } else { E::KafkaStorageError.code() };
            invalid.iter().map(|i| failed(if i.is_some() { E::InvalidRequest.code() } else { code }, &i.map(str::to_owned).unwrap_or(e.to_string()))).collect()
        }
        Ok(removed) => {
            let mut removed = removed.into_iter();
            invalid
                .iter()
                .map(|i| match i {
                    Some(why) => failed(E::InvalidRequest.code(), why),
                    None => DeleteAclsFilterResult::default().with_matching_acls(
                        removed
                            .next()
                            .expect("one answer per valid filter")
                            .into_iter()
                            .map(|a| {
                                DeleteAclsMatchingAcl::default()
                                    .with_resource_type(a.resource_type.code())
                                    .with_resource_name(str_bytes(a.name))
                                    .with_pattern_type(a.pattern.code())
                                    .with_principal(str_bytes(a.principal))
                                    .with_host(str_bytes(a.host))
                                    .with_operation(a.operation.code())
                                    .with_permission_type(a.permission.code())
                            })
                            .collect(),
                    ),
                })
                .collect()
        }
    };
    Some(Response::default().with_filter_results(results))
}
