//! CreatePartitions: raise a topic's partition count.

use kafka_protocol::messages::create_partitions_response::CreatePartitionsTopicResult;
pub use kafka_protocol::messages::{CreatePartitionsRequest as Request, CreatePartitionsResponse as Response};
use kafka_protocol::protocol::VersionRange;
use kafka_protocol::ResponseError;

use super::str_bytes;
use crate::auth::acl::Operation;
use crate::kafka::authz::Check;
use crate::kafka::{errors, Broker};

pub const VERSIONS: VersionRange = VersionRange { min: 0, max: 3 };

pub async fn handle(broker: &Broker, req: Request, _version: i16) -> Option<Response> {
    let engine = broker.engine.clone();
    // ALTER on each topic, as Kafka asks.
    let check = broker.authorizer.enabled().then(|| Check::current(broker));
    let results = tokio::task::spawn_blocking(move || {
        // As Kafka's controller: a topic named twice is left alone and
        // answered once, INVALID_REQUEST.
        let twice = super::repeated(req.topics.iter().map(|t| t.name.0.clone()));
        super::first_occurrences(req.topics, |t| t.name.0.clone())
            .into_iter()
            .map(|t| {
                let r = CreatePartitionsTopicResult::default().with_name(t.name.clone());
                if twice.contains(&t.name.0) {
                    return r.with_error_code(ResponseError::InvalidRequest.code()).with_error_message(Some(str_bytes("Duplicate topic name.")));
                }
                if check.as_ref().is_some_and(|c| !c.topic(Operation::Alter, super::name(&t.name))) {
                    return r.with_error_code(ResponseError::TopicAuthorizationFailed.code()).with_error_message(Some(str_bytes("Authorization failed.")));
                }
                match engine.create_partitions(super::name(&t.name), t.count, req.validate_only) {
                    Ok(()) => r,
                    Err(e) => r.with_error_code(errors::code(&e)).with_error_message(Some(str_bytes(e.to_string()))),
                }
            })
            .collect::<Vec<_>>()
    })
    .await
    .ok()?;
    Some(Response::default().with_results(results))
}
