//! DescribeAcls: the ACLs a filter matches, grouped by resource pattern.
//! DESCRIBE on the cluster, as Kafka asks; SECURITY_DISABLED without the
//! authorizer (Kafka's answer when no authorizer is configured).

use kafka_protocol::messages::describe_acls_response::{AclDescription, DescribeAclsResource};
pub use kafka_protocol::messages::{DescribeAclsRequest as Request, DescribeAclsResponse as Response};
use kafka_protocol::protocol::VersionRange;
use kafka_protocol::ResponseError as E;

use super::str_bytes;
use crate::auth::acl::{Filter, Operation};
use crate::kafka::authz;
use crate::kafka::Broker;

pub const VERSIONS: VersionRange = VersionRange { min: 1, max: 3 };

pub async fn handle(broker: &Broker, req: Request, _version: i16) -> Option<Response> {
    let fail = |code: i16, msg: &str| Some(Response::default().with_error_code(code).with_error_message(Some(str_bytes(msg))));
    if let Some((code, msg)) = authz::acl_api_refusal(broker, Operation::Describe) {
        return fail(code, msg);
    }
    let filter = Filter::from_wire(
        req.resource_type_filter,
        req.resource_name_filter.as_deref(),
        req.pattern_type_filter,
        req.principal_filter.as_deref(),
        req.host_filter.as_deref(),
        req.operation,
        req.permission_type,
    );
    if let Some(why) = filter.invalid() {
        return fail(E::InvalidRequest.code(), why);
    }
    let mut resources: Vec<DescribeAclsResource> = Vec::new();
    // The ACLs come sorted by resource type, pattern and name: one group
    // per resource pattern.
    for a in broker.authorizer.describe(&filter) {
        let d = AclDescription::default().with_principal(str_bytes(a.principal.clone())).with_host(str_bytes(a.host.clone())).with_operation(a.operation.code()).with_permission_type(a.permission.code());
        match resources.last_mut() {
            Some(r) if r.resource_type == a.resource_type.code() && r.pattern_type == a.pattern.code() && r.resource_name.as_str() == a.name => r.acls.push(d),
            _ => resources.push(DescribeAclsResource::default().with_resource_type(a.resource_type.code()).with_resource_name(str_bytes(a.name.clone())).with_pattern_type(a.pattern.code()).with_acls(vec![d])),
        }
    }
    Some(Response::default().with_resources(resources))
}
