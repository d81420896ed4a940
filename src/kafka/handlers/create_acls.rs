//! CreateAcls: each creation answered on its own, durable before the
//! answer. ALTER on the cluster, as Kafka asks; SECURITY_DISABLED without
//! the authorizer. Unknown resource, pattern, operation or permission
//! numbers, or a malformed principal, are INVALID_REQUEST.

use kafka_protocol::messages::create_acls_response::AclCreationResult;
pub use kafka_protocol::messages::{CreateAclsRequest as Request, CreateAclsResponse as Response};
use kafka_protocol::protocol::VersionRange;
use kafka_protocol::ResponseError as E;

use super::str_bytes;
use crate::auth::acl::{Acl, AclError, Operation, PatternType, Permission, ResourceType};
use crate::kafka::authz;
use crate::kafka::Broker;

pub const VERSIONS: VersionRange = VersionRange { min: 1, max: 3 };

fn failed(code: i16, msg: &str) -> AclCreationResult {
    AclCreationResult::default().with_error_code(code).with_error_message(Some(str_bytes(msg)))
}

pub async fn handle(broker: &Broker, req: Request, _version: i16) -> Option<Response> {
    if let Some((code, msg)) = authz::acl_api_refusal(broker, Operation::Alter) {
        return Some(Response::default().with_results(req.creations.iter().map(|_| failed(code, msg)).collect()));
    }
    // Parsed here; refused ones keep their place in the answer.
    let parsed: Vec<Result<Acl, &'static str>> = req
        .creations
        .into_iter()
        .map(|c| {
            Ok(Acl {
                resource_type: ResourceType::from_code(c.resource_type).ok_or("invalid resource type")?,
                name: c.resource_name.to_string(),
                pattern: PatternType::from_code(c.resource_pattern_type).ok_or("invalid pattern type: LITERAL or PREFIXED")?,
                principal: c.principal.to_string(),
                host: c.host.to_string(),
                operation: Operation::from_code(c.operation).ok_or("invalid operation")?,
                permission: Permission::from_code(c.permission_type).ok_or("invalid permission type")?,
            })
        })
        .collect();
    let valid: Vec<Acl> = parsed.iter().filter_map(|p| p.as_ref().ok().cloned()).collect();
    let (authorizer, engine) = (broker.authorizer.clone(), broker.engine.clone());
    let mut created = tokio::task::spawn_blocking(move || authorizer.create(engine.catalog(), &valid)).await.ok()?.into_iter();
    let results = parsed
        .into_iter()
        .map(|p| match p {
            Err(why) => failed(E::InvalidRequest.code(), why),
            Ok(_) => match created.next().expect("one answer per valid creation") {
                Ok(()) => AclCreationResult::default(),
                Err(AclError::Invalid(why)) => failed(E::InvalidRequest.code(), why),
                Err(e @ AclError::Storage(_)) => failed(E::KafkaStorageError.code(), &e.to_string()),
                // etcd did not take it in time: retriable (creation is
                // idempotent).
                Err(e @ AclError::Cluster(_)) => failed(E::RequestTimedOut.code(), &e.to_string()),
            },
        })
        .collect();
    Some(Response::default().with_results(results))
}
