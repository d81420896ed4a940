//! IncrementalAlterConfigs (v0–1): edits a resource's configs key by key
//! (SET, DELETE, APPEND and SUBTRACT on lists). Checks and the change are
//! AlterConfigs' ([`super::alter_configs::alter`]).

use kafka_protocol::messages::incremental_alter_configs_response::AlterConfigsResourceResponse;
pub use kafka_protocol::messages::{IncrementalAlterConfigsRequest as Request, IncrementalAlterConfigsResponse as Response};
use kafka_protocol::protocol::VersionRange;

use super::alter_configs::{alter, Resource};
use super::str_bytes;
use crate::engine::{Alter, Op};
use crate::kafka::Broker;

pub const VERSIONS: VersionRange = VersionRange { min: 0, max: 1 };

pub async fn handle(broker: &Broker, req: Request, _version: i16) -> Option<Response> {
    let resources = req
        .resources
        .into_iter()
        .map(|r| Resource { resource_type: r.resource_type, name: r.resource_name, alter: ops(r.configs).map(Alter::Incremental) })
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

/// A resource's operations, or why the request is malformed for it.
fn ops(configs: Vec<kafka_protocol::messages::incremental_alter_configs_request::AlterableConfig>) -> Result<Vec<Op>, String> {
    let twice = super::repeated(configs.iter().map(|c| c.name.clone()));
    if !twice.is_empty() {
        return Err("Error due to duplicate config keys".into());
    }
    let nulls: Vec<&str> = configs.iter().filter(|c| c.config_operation != 1 && c.value.is_none()).map(|c| c.name.as_str()).collect();
    if !nulls.is_empty() {
        return Err(format!("Null value not supported for : {}", nulls.join(", ")));
    }
    configs
        .into_iter()
        .map(|c| {
            let (k, v) = (c.name.to_string(), c.value.map(|v| v.to_string()).unwrap_or_default());
            Ok(match c.config_operation {
                0 => Op::Set(k, v),
                1 => Op::Delete(k),
                2 => Op::Append(k, v),
                3 => Op::Subtract(k, v),
                n => return Err(format!("Unknown operations type {n}")),
            })
        })
        .collect()
}
