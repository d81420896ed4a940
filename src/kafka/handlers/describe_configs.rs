//! DescribeConfigs for topics (resource type 2) and the broker (4).

use kafka_protocol::messages::describe_configs_response::{DescribeConfigsResourceResult, DescribeConfigsResult};
pub use kafka_protocol::messages::{DescribeConfigsRequest as Request, DescribeConfigsResponse as Response};
use kafka_protocol::protocol::VersionRange;
use kafka_protocol::ResponseError;

use super::str_bytes;
use crate::auth::acl::Operation;
use crate::kafka::authz::Check;
use crate::kafka::Broker;

pub const VERSIONS: VersionRange = VersionRange { min: 1, max: 4 };

const TOPIC: i8 = 2;
const BROKER: i8 = 4;
const SOURCE_TOPIC: i8 = 1;
const SOURCE_STATIC_BROKER: i8 = 4;
const SOURCE_DEFAULT: i8 = 5;

pub async fn handle(broker: &Broker, req: Request, _version: i16) -> Option<Response> {
    // Kafka answers every occurrence of a resource, each with all its
    // configs; answered once each here, so repeats cannot multiply the
    // response (clients match answers by resource).
    // DESCRIBE_CONFIGS on the topic or the cluster, as Kafka asks.
    let check = broker.authorizer.enabled().then(|| Check::current(broker));
    let results = super::first_occurrences(req.resources, |r| (r.resource_type, r.resource_name.clone()))
        .into_iter()
        .map(|res| {
            let out = DescribeConfigsResult::default().with_resource_type(res.resource_type).with_resource_name(res.resource_name.clone());
            let denied = |c: &Check| match res.resource_type {
                TOPIC => (!c.topic(Operation::DescribeConfigs, &res.resource_name)).then_some(ResponseError::TopicAuthorizationFailed),
                BROKER => (!c.cluster(Operation::DescribeConfigs)).then_some(ResponseError::ClusterAuthorizationFailed),
                _ => None,
            };
            if let Some(e) = check.as_ref().and_then(denied) {
                return out.with_error_code(e.code()).with_error_message(Some(str_bytes("Authorization failed.")));
            }
            let entries: Vec<(String, String, i8)> = match res.resource_type {
                TOPIC => match broker.engine.topic(&res.resource_name) {
                    Some(t) => t
                        .config
                        .describe(&t.record.configs)
                        .into_iter()
                        .map(|(k, v, default)| (k, v, if default { SOURCE_DEFAULT } else { SOURCE_TOPIC }))
                        .collect(),
                    None => {
                        return out.with_error_code(ResponseError::UnknownTopicOrPartition.code()).with_error_message(Some(str_bytes("unknown topic")));
                    }
                },
                BROKER => broker_configs(broker),
                _ => {
                    return out.with_error_code(ResponseError::InvalidRequest.code()).with_error_message(Some(str_bytes("unsupported resource type")));
                }
            };
            let configs = entries
                .into_iter()
                .filter(|(k, _, _)| res.configuration_keys.as_ref().is_none_or(|keys| keys.iter().any(|w| w.as_str() == k)))
                .map(|(k, v, source)| {
                    DescribeConfigsResourceResult::default().with_name(str_bytes(k)).with_value(Some(str_bytes(v))).with_config_source(source)
                })
                .collect();
            out.with_configs(configs)
        })
        .collect();
    Some(Response::default().with_results(results))
}

fn broker_configs(broker: &Broker) -> Vec<(String, String, i8)> {
    let c = broker.engine.config();
    let d = &c.topic_defaults;
    vec![
        ("num.partitions".into(), c.num_partitions.to_string(), SOURCE_STATIC_BROKER),
        ("auto.create.topics.enable".into(), c.auto_create_topics.to_string(), SOURCE_STATIC_BROKER),
        ("log.retention.ms".into(), d.retention_ms.to_string(), SOURCE_STATIC_BROKER),
        ("log.retention.bytes".into(), d.retention_bytes.to_string(), SOURCE_STATIC_BROKER),
        ("message.max.bytes".into(), d.max_message_bytes.to_string(), SOURCE_STATIC_BROKER),
        ("log.segment.bytes".into(), c.storage.segment_bytes.to_string(), SOURCE_STATIC_BROKER),
        ("socket.request.max.bytes".into(), broker.cfg.max_request_bytes.to_string(), SOURCE_STATIC_BROKER),
        ("default.replication.factor".into(), "1".into(), SOURCE_DEFAULT),
        ("min.insync.replicas".into(), "1".into(), SOURCE_DEFAULT),
    ]
}
