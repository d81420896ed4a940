//! DeleteTopics, by name (all versions) or by topic id (v6).

use kafka_protocol::messages::delete_topics_response::DeletableTopicResult;
pub use kafka_protocol::messages::{DeleteTopicsRequest as Request, DeleteTopicsResponse as Response};
use kafka_protocol::protocol::VersionRange;
use kafka_protocol::ResponseError;

use super::{str_bytes, topic_name};
use crate::auth::acl::Operation;
use crate::kafka::authz::Check;
use crate::kafka::{errors, Broker};

pub const VERSIONS: VersionRange = VersionRange { min: 1, max: 6 };

pub async fn handle(broker: &Broker, req: Request, version: i16) -> Option<Response> {
    let engine = broker.engine.clone();
    let targets: Vec<(Option<String>, uuid::Uuid)> = if version >= 6 {
        req.topics.into_iter().map(|t| (t.name.map(|n| n.0.to_string()), t.topic_id)).collect()
    } else {
        req.topic_names.into_iter().map(|n| (Some(n.0.to_string()), uuid::Uuid::nil())).collect()
    };
    // DELETE on each topic, as Kafka asks.
    let check = broker.authorizer.enabled().then(|| Check::current(broker));
    let responses = tokio::task::spawn_blocking(move || {
        // As Kafka's controller: a topic named (or identified) twice is not
        // deleted, and gets one answer, INVALID_REQUEST.
        // A topic named by id is named in the answer only to a principal
        // that may DESCRIBE it (Kafka answers the others with a null name).
        let mut hidden = std::collections::HashSet::new();
        let resolved: Vec<(Option<String>, uuid::Uuid)> = targets
            .into_iter()
            .map(|(name, id)| {
                let name = name.or_else(|| {
                    let n = engine.topic_by_id(id.as_bytes()).map(|t| t.name().to_owned())?;
                    if check.as_ref().is_some_and(|c| !c.topic(Operation::Describe, &n)) {
                        hidden.insert(id);
                    }
                    Some(n)
                });
                (name, id)
            })
            .collect();
        let twice = super::repeated(resolved.iter().map(|(name, id)| name.clone().ok_or(*id)));
        super::first_occurrences(resolved, |(name, id)| name.clone().ok_or(*id))
            .into_iter()
            .map(|(name, id)| {
                if hidden.contains(&id) {
                    return DeletableTopicResult::default().with_name(None).with_topic_id(id).with_error_code(ResponseError::TopicAuthorizationFailed.code());
                }
                let mut r = DeletableTopicResult::default().with_name(name.as_deref().map(topic_name));
                if twice.contains(&name.clone().ok_or(id)) {
                    let r = if version >= 6 { r.with_topic_id(id) } else { r };
                    return r.with_error_code(ResponseError::InvalidRequest.code()).with_error_message((version >= 5).then(|| str_bytes(if name.is_some() { "Duplicate topic name." } else { "Duplicate topic id." })));
                }
                let Some(name) = name else {
                    return r.with_topic_id(id).with_error_code(ResponseError::UnknownTopicId.code());
                };
                if version >= 6 {
                    r = r.with_topic_id(engine.topic(&name).map(|t| uuid::Uuid::from_bytes(t.id())).unwrap_or(id));
                }
                if check.as_ref().is_some_and(|c| !c.topic(Operation::Delete, &name)) {
                    let r = r.with_error_code(ResponseError::TopicAuthorizationFailed.code());
                    return if version >= 5 { r.with_error_message(Some(str_bytes("Authorization failed."))) } else { r };
                }
                match engine.delete_topic(&name) {
                    Ok(()) => r,
                    Err(e) => {
                        let r = r.with_error_code(errors::code(&e));
                        if version >= 5 { r.with_error_message(Some(str_bytes(e.to_string()))) } else { r }
                    }
                }
            })
            .collect::<Vec<_>>()
    })
    .await
    .ok()?;
    Some(Response::default().with_responses(responses))
}
