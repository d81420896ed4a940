//! DescribeConfigs for topics (resource type 2) and the broker (4): each
//! config's value, where it comes from (topic, dynamic broker, dynamic
//! cluster default, static, default), its synonyms when asked (v1+), and
//! its type and documentation (v3+). The layers are `engine::configs`'.

use kafka_protocol::messages::describe_configs_response::{DescribeConfigsResourceResult, DescribeConfigsResult, DescribeConfigsSynonym};
pub use kafka_protocol::messages::{DescribeConfigsRequest as Request, DescribeConfigsResponse as Response};
use kafka_protocol::protocol::VersionRange;
use kafka_protocol::ResponseError;

use super::str_bytes;
use crate::auth::acl::Operation;
use crate::engine::{BrokerScope, Described, Source};
use crate::kafka::authz::Check;
use crate::kafka::Broker;

pub const VERSIONS: VersionRange = VersionRange { min: 1, max: 4 };

pub const TOPIC: i8 = 2;
pub const BROKER: i8 = 4;

/// A BROKER resource name: "" is the cluster-wide default, else it must
/// be this broker's id (Kafka's messages).
pub fn broker_scope(name: &str, node_id: i32) -> Result<BrokerScope, String> {
    if name.is_empty() {
        return Ok(BrokerScope::Cluster);
    }
    match name.parse::<i32>() {
        Ok(id) if id == node_id => Ok(BrokerScope::Node),
        Ok(id) => Err(format!("Unexpected broker id, expected {node_id} or empty string, but received {id}")),
        Err(_) => Err(format!("Node id must be an integer, but it is: {name}")),
    }
}

pub async fn handle(broker: &Broker, req: Request, version: i16) -> Option<Response> {
    let synonyms = req.include_synonyms;
    let docs = version >= 3 && req.include_documentation;
    // DESCRIBE_CONFIGS on the topic or the cluster, as Kafka asks.
    let check = broker.authorizer.enabled().then(|| Check::current(broker));
    // Kafka answers every occurrence of a resource, each with all its
    // configs; answered once each here, so repeats cannot multiply the
    // response (clients match answers by resource).
    let results = super::first_occurrences(req.resources, |r| (r.resource_type, r.resource_name.clone()))
        .into_iter()
        .map(|res| {
            let out = DescribeConfigsResult::default().with_resource_type(res.resource_type).with_resource_name(res.resource_name.clone());
            let fail = |e: ResponseError, why: String| out.clone().with_error_code(e.code()).with_error_message(Some(str_bytes(why)));
            let denied = |c: &Check| match res.resource_type {
                TOPIC => (!c.topic(Operation::DescribeConfigs, &res.resource_name)).then_some(ResponseError::TopicAuthorizationFailed),
                BROKER => (!c.cluster(Operation::DescribeConfigs)).then_some(ResponseError::ClusterAuthorizationFailed),
                _ => None,
            };
            if let Some(e) = check.as_ref().and_then(denied) {
                return fail(e, "Authorization failed.".into());
            }
            let entries = match res.resource_type {
                TOPIC => match broker.engine.topic(&res.resource_name) {
                    Some(t) => broker.engine.describe_topic_configs(&t),
                    None => return out.with_error_code(ResponseError::UnknownTopicOrPartition.code()),
                },
                BROKER => match broker_scope(&res.resource_name, broker.node_id()) {
                    Ok(BrokerScope::Cluster) => broker.engine.describe_broker_configs(BrokerScope::Cluster),
                    Ok(BrokerScope::Node) => {
                        let mut all = broker.engine.describe_broker_configs(BrokerScope::Node);
                        all.extend(static_broker_configs(broker));
                        all
                    }
                    Err(why) => return fail(ResponseError::InvalidRequest, why),
                },
                t => return fail(ResponseError::InvalidRequest, format!("Unsupported resource type {t}")),
            };
            // Unknown keys asked for are left out, as Kafka does.
            let wanted = |d: &Described| res.configuration_keys.as_ref().is_none_or(|keys| keys.is_empty() || keys.iter().any(|k| k.as_str() == d.name));
            out.with_configs(entries.into_iter().filter(wanted).map(|d| entry(d, synonyms, docs)).collect())
        })
        .collect();
    Some(Response::default().with_results(results))
}

fn entry(d: Described, synonyms: bool, docs: bool) -> DescribeConfigsResourceResult {
    let listed = if synonyms {
        d.synonyms.into_iter().map(|(name, value, source)| DescribeConfigsSynonym::default().with_name(str_bytes(name)).with_value(Some(str_bytes(value))).with_source(source as i8)).collect()
    } else {
        Vec::new()
    };
    DescribeConfigsResourceResult::default()
        .with_name(str_bytes(d.name))
        .with_value(Some(str_bytes(d.value)))
        .with_read_only(d.read_only)
        .with_config_source(d.source as i8)
        .with_is_sensitive(false)
        .with_synonyms(listed)
        .with_config_type(d.kind as i8)
        .with_documentation(docs.then(|| str_bytes(d.doc)))
}

/// Broker settings that are not topic defaults: reported, read-only (an
/// alter naming one is refused).
pub fn static_broker_configs(broker: &Broker) -> Vec<Described> {
    use crate::engine::configs::Kind;
    let c = broker.engine.config();
    let fixed = |name: &str, value: String, kind: Kind, doc: &'static str| Described {
        name: name.to_owned(),
        synonyms: vec![(name.to_owned(), value.clone(), Source::Static)],
        value,
        source: Source::Static,
        read_only: true,
        kind,
        doc,
    };
    vec![
        fixed("node.id", broker.node_id().to_string(), Kind::Int, "This broker's id (node_id)."),
        fixed("broker.id", broker.node_id().to_string(), Kind::Int, "This broker's id (node_id)."),
        fixed("log.dirs", c.data_dir.display().to_string(), Kind::String, "The data directory (data_dir)."),
        fixed("num.partitions", c.num_partitions.to_string(), Kind::Int, "Partitions of an auto-created topic (num_partitions)."),
        fixed("auto.create.topics.enable", c.auto_create_topics.to_string(), Kind::Boolean, "Whether topics are created when first used (auto_create_topics)."),
        fixed("socket.request.max.bytes", broker.cfg.max_request_bytes.to_string(), Kind::Int, "Largest request (max_request_bytes)."),
        fixed("default.replication.factor", "1".into(), Kind::Int, "A single node holds one replica."),
    ]
}
