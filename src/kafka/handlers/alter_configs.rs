//! AlterConfigs (v0–2): replaces a resource's configs as a whole (keys
//! not named return to their defaults). The checks and the change are
//! shared with IncrementalAlterConfigs ([`alter`]), which edits key by key.
//!
//! Both follow Kafka's answers: a resource named twice, a key named twice
//! or a null value is INVALID_REQUEST; a bad topic value INVALID_CONFIG
//! with Kafka's message; a broker change that is not a dynamic topic
//! default INVALID_REQUEST; ALTER_CONFIGS on the topic or the cluster is
//! checked when the authorizer is on. Each resource is all or nothing.

use std::collections::BTreeMap;

use kafka_protocol::messages::alter_configs_response::AlterConfigsResourceResponse;
pub use kafka_protocol::messages::{AlterConfigsRequest as Request, AlterConfigsResponse as Response};
use kafka_protocol::protocol::{StrBytes, VersionRange};
use kafka_protocol::ResponseError as E;

use super::describe_configs::{broker_scope, static_broker_configs, BROKER, TOPIC};
use super::str_bytes;
use crate::auth::acl::Operation;
use crate::engine::{Alter, BrokerScope};
use crate::kafka::authz::Check;
use crate::kafka::{errors, Broker};

pub const VERSIONS: VersionRange = VersionRange { min: 0, max: 2 };

pub async fn handle(broker: &Broker, req: Request, _version: i16) -> Option<Response> {
    let resources = req
        .resources
        .into_iter()
        .map(|r| {
            let mut set = BTreeMap::new();
            let mut alter = Ok(());
            for c in r.configs {
                let Some(value) = c.value else {
                    alter = Err(format!("Null value not supported for : {}", c.name.as_str()));
                    break;
                };
                if set.insert(c.name.to_string(), value.to_string()).is_some() {
                    alter = Err("Error due to duplicate config keys".to_owned());
                    break;
                }
            }
            Resource { resource_type: r.resource_type, name: r.resource_name, alter: alter.map(|()| Alter::Replace(set)) }
        })
        .collect();
    let answers = alter(broker, resources, req.validate_only).await;
    let responses = answers
        .into_iter()
        .map(|(resource_type, name, code, msg)| {
            AlterConfigsResourceResponse::default().with_resource_type(resource_type).with_resource_name(name).with_error_code(code).with_error_message(msg.map(str_bytes))
        })
        .collect();
    Some(Response::default().with_responses(responses))
}

/// One resource of an alter request: its change, or why the request
/// itself is malformed for it (INVALID_REQUEST).
pub struct Resource {
    pub resource_type: i8,
    pub name: StrBytes,
    pub alter: Result<Alter, String>,
}

/// Checks and applies each resource's change; one answer per resource,
/// in order: (type, name, error code, message).
pub async fn alter(broker: &Broker, resources: Vec<Resource>, validate_only: bool) -> Vec<(i8, StrBytes, i16, Option<String>)> {
    let twice = super::repeated(resources.iter().map(|r| (r.resource_type, r.name.clone())));
    let check = broker.authorizer.enabled().then(|| Check::current(broker));
    let mut out = Vec::with_capacity(resources.len());
    for r in resources {
        let answer = if twice.contains(&(r.resource_type, r.name.clone())) {
            Err((E::InvalidRequest.code(), "Each resource must appear at most once.".to_owned()))
        } else {
            one(broker, check.as_ref(), r.resource_type, &r.name, r.alter, validate_only).await
        };
        let (code, msg) = match answer {
            Ok(()) => (errors::NONE, None),
            Err((code, msg)) => (code, Some(msg)),
        };
        out.push((r.resource_type, r.name, code, msg));
    }
    out
}

async fn one(broker: &Broker, check: Option<&Check>, resource_type: i8, name: &str, alter: Result<Alter, String>, validate_only: bool) -> Result<(), (i16, String)> {
    let invalid = |why: String| (E::InvalidRequest.code(), why);
    let alter = alter.map_err(invalid)?;
    let engine = broker.engine.clone();
    let name = name.to_owned();
    let work: Box<dyn FnOnce() -> Result<(), crate::engine::EngineError> + Send> = match resource_type {
        TOPIC => {
            if name.is_empty() {
                return Err(invalid("Default topic resources are not allowed.".into()));
            }
            if check.is_some_and(|c| !c.topic(Operation::AlterConfigs, &name)) {
                return Err((E::TopicAuthorizationFailed.code(), "Topic authorization failed.".into()));
            }
            Box::new(move || engine.alter_topic_configs(&name, alter, validate_only))
        }
        BROKER => {
            let scope: BrokerScope = broker_scope(&name, broker.node_id()).map_err(invalid)?;
            if check.is_some_and(|c| !c.cluster(Operation::AlterConfigs)) {
                return Err((E::ClusterAuthorizationFailed.code(), "Cluster authorization failed.".into()));
            }
            let keys: Vec<&str> = match &alter {
                Alter::Replace(set) => set.keys().map(String::as_str).collect(),
                Alter::Incremental(ops) => ops.iter().map(|o| o.key()).collect(),
            };
            let statics = static_broker_configs(broker);
            let fixed: Vec<&str> = keys.into_iter().filter(|k| statics.iter().any(|d| d.name == *k)).collect();
            if !fixed.is_empty() {
                return Err(invalid(format!("Cannot update these configs dynamically: {}; they are static settings of the broker", fixed.join(", "))));
            }
            Box::new(move || engine.alter_broker_configs(scope, alter, validate_only))
        }
        t => return Err(invalid(format!("Unknown resource type {t}"))),
    };
    match tokio::task::spawn_blocking(work).await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => Err((errors::code(&e), e.to_string())),
        Err(e) => Err((E::UnknownServerError.code(), e.to_string())),
    }
}
