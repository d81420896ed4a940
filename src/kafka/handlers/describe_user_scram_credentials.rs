//! DescribeUserScramCredentials: each user's SCRAM mechanisms and
//! iteration counts (never salts or keys). All users when the request
//! names none (a null or an empty list); a name asked twice is answered DUPLICATE_RESOURCE, an
//! unknown one RESOURCE_NOT_FOUND, as Kafka does.
//!
//! DESCRIBE on the cluster, as Kafka asks; without the authorizer, only
//! `super_users` (see `authz::Check::credentials`).

use kafka_protocol::messages::describe_user_scram_credentials_response::{CredentialInfo, DescribeUserScramCredentialsResult};
pub use kafka_protocol::messages::{DescribeUserScramCredentialsRequest as Request, DescribeUserScramCredentialsResponse as Response};
use kafka_protocol::protocol::VersionRange;
use kafka_protocol::ResponseError as E;

use super::{repeated, str_bytes};
use crate::auth::acl::Operation;
use crate::kafka::authz::Check;
use crate::kafka::Broker;

pub const VERSIONS: VersionRange = VersionRange { min: 0, max: 0 };

pub async fn handle(broker: &Broker, req: Request, _version: i16) -> Option<Response> {
    if !Check::current(broker).administers(Operation::Describe) {
        return Some(Response::default().with_error_code(E::ClusterAuthorizationFailed.code()).with_error_message(Some(str_bytes("Cluster authorization failed."))));
    }
    // No list, or an empty one, describes every user (as Kafka does).
    let names: Option<Vec<String>> = req.users.filter(|u| !u.is_empty()).map(|u| u.into_iter().map(|n| n.name.to_string()).collect());
    let twice = names.as_ref().map(|n| repeated(n.iter().cloned())).unwrap_or_default();
    let mut results = Vec::new();
    let mut answered = std::collections::HashSet::new();
    let unique: Option<Vec<String>> = names.as_ref().map(|n| n.iter().filter(|u| !twice.contains(*u)).cloned().collect());
    for (user, info) in broker.users.describe(unique.as_deref()) {
        let r = DescribeUserScramCredentialsResult::default().with_user(str_bytes(user.clone()));
        results.push(match info {
            Some(creds) => r.with_credential_infos(creds.into_iter().map(|(m, i)| CredentialInfo::default().with_mechanism(m.kafka_type()).with_iterations(i as i32)).collect()),
            None => r.with_error_code(E::ResourceNotFound.code()).with_error_message(Some(str_bytes(format!("Attempt to describe a user credential that does not exist: {user}")))),
        });
    }
    for user in names.iter().flatten().filter(|u| twice.contains(*u)) {
        if answered.insert(user.clone()) {
            results.push(
                DescribeUserScramCredentialsResult::default()
                    .with_user(str_bytes(user.clone()))
                    .with_error_code(E::DuplicateResource.code())
                    .with_error_message(Some(str_bytes(format!("Cannot describe SCRAM credentials for the same user twice in a single request: {user}")))),
            );
        }
    }
    Some(Response::default().with_results(results))
}
