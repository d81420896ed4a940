//! CreateTopics: answered after the catalog is durable.

use std::collections::BTreeMap;
use kafka_protocol::messages::create_topics_response::{CreatableTopicConfigs, CreatableTopicResult};
pub use kafka_protocol::messages::{CreateTopicsRequest as Request, CreateTopicsResponse as Response};
use kafka_protocol::protocol::VersionRange;
use kafka_protocol::ResponseError;

use super::str_bytes;
use crate::auth::acl::Operation;
use crate::engine::{EngineError, NewTopic};
use crate::kafka::authz::Check;
use crate::kafka::{errors, Broker};

pub const VERSIONS: VersionRange = VersionRange { min: 2, max: 7 };

pub async fn handle(broker: &Broker, req: Request, version: i16) -> Option<Response> {
    let engine = broker.engine.clone();
    // CREATE on the cluster, or else on each topic, as Kafka asks.
    let check = broker.authorizer.enabled().then(|| Check::current(broker)).filter(|c| !c.cluster(Operation::Create));
    let topics = tokio::task::spawn_blocking(move || {
        // As Kafka's controller: a name given twice is not created, and
        // gets one answer, INVALID_REQUEST.
        let twice = super::repeated(req.topics.iter().map(|t| t.name.0.clone()));
        let fail = |r: CreatableTopicResult, code: i16, msg: String| r.with_error_code(code).with_error_message(Some(str_bytes(msg)));
        // Refused here, or handed to the engine (all together: one catalog
        // flush for the request).
        let mut answers: Vec<(CreatableTopicResult, Option<usize>)> = Vec::new();
        let mut new = Vec::new();
        for t in super::first_occurrences(req.topics, |t| t.name.0.clone()) {
            let r = CreatableTopicResult::default().with_name(t.name.clone()).with_num_partitions(-1).with_replication_factor(-1);
            if twice.contains(&t.name.0) {
                answers.push((fail(r, ResponseError::InvalidRequest.code(), "Duplicate topic name.".into()), None));
                continue;
            }
            if check.as_ref().is_some_and(|c| !c.topic(Operation::Create, super::name(&t.name))) {
                answers.push((fail(r, ResponseError::TopicAuthorizationFailed.code(), "Authorization failed.".into()), None));
                continue;
            }
            let partitions = if !t.assignments.is_empty() {
                t.assignments.len() as i32
            } else if t.num_partitions == -1 {
                engine.config().num_partitions
            } else {
                t.num_partitions
            };
            let configs: BTreeMap<String, String> = t.configs.iter().filter_map(|c| c.value.as_ref().map(|v| (c.name.to_string(), v.to_string()))).collect();
            answers.push((r, Some(new.len())));
            new.push(NewTopic { name: super::name(&t.name).to_owned(), partitions, replication_factor: t.replication_factor, configs });
        }
        let names: Vec<String> = new.iter().map(|t| t.name.clone()).collect();
        let mut created: Vec<Option<Result<_, EngineError>>> = engine.create_topics(new, req.validate_only).into_iter().map(Some).collect();
        answers
            .into_iter()
            .map(|(mut r, slot)| {
                let Some(i) = slot else { return r };
                match created[i].take().expect("one answer per topic") {
                    Ok(topic) => {
                        if version >= 5 {
                            r = r.with_num_partitions(topic.partitions()).with_replication_factor(topic.record.replication_factor).with_configs(Some(
                                engine
                                    .describe_topic_configs(&topic)
                                    .into_iter()
                                    .map(|d| {
                                        CreatableTopicConfigs::default()
                                            .with_name(str_bytes(d.name))
                                            .with_value(Some(str_bytes(d.value)))
                                            .with_read_only(d.read_only)
                                            .with_config_source(d.source as i8)
                                    })
                                    .collect(),
                            ));
                        }
                        if version >= 7 {
                            r = r.with_topic_id(uuid::Uuid::from_bytes(topic.id()));
                        }
                        r
                    }
                    Err(e @ EngineError::TopicExists) => fail(r, errors::code(&e), format!("topic {} already exists", names[i])),
                    Err(e) => {
                        let code = errors::code(&e);
                        fail(r, code, e.to_string())
                    }
                }
            })
            .collect::<Vec<_>>()
    })
    .await
    .ok()?;
    Some(Response::default().with_topics(topics))
}
