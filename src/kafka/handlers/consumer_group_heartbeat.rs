//! ConsumerGroupHeartbeat (KIP-848): a member of a consumer group joins,
//! heartbeats, reports what it owns and gets its assignment; the group's
//! state machine is `coordinator::consumer`.

use kafka_protocol::messages::consumer_group_heartbeat_response::{Assignment, TopicPartitions};
pub use kafka_protocol::messages::{ConsumerGroupHeartbeatRequest as Request, ConsumerGroupHeartbeatResponse as Response};
use kafka_protocol::protocol::VersionRange;
use kafka_protocol::ResponseError;

use super::str_bytes;
use crate::auth::acl::Operation;
use crate::kafka::coordinator::consumer::{self, HeartbeatArgs};
use crate::kafka::{authz, conn, coordinator, Broker};

pub const VERSIONS: VersionRange = VersionRange { min: 0, max: 1 };

fn error(code: i16, message: &str) -> Response {
    Response::default().with_error_code(code).with_error_message(Some(str_bytes(message.to_owned()))).with_member_epoch(-1)
}

pub async fn handle(broker: &Broker, req: Request, version: i16) -> Option<Response> {
    let group = req.group_id.0.to_string();
    if group.is_empty() || group.len() > coordinator::MAX_GROUP_ID_LEN {
        return Some(error(ResponseError::InvalidRequest.code(), "the group id must be 1 to 255 bytes"));
    }
    // READ on the group, as Kafka asks (and DESCRIBE on the topics it
    // names: a subscription to a topic the member may not see is refused).
    if authz::group_denied(broker, Operation::Read, &group) {
        return Some(error(ResponseError::GroupAuthorizationFailed.code(), "not authorized for the group"));
    }
    if broker.authorizer.enabled() {
        let check = authz::Check::current(broker);
        if req.subscribed_topic_names.as_ref().is_some_and(|names| names.iter().any(|n| !check.topic(Operation::Describe, super::name(n)))) {
            return Some(error(ResponseError::TopicAuthorizationFailed.code(), "not authorized for a subscribed topic"));
        }
        // The broker matches a regex against every topic, and the group's
        // members see what it matched: with ACLs on, that needs DESCRIBE
        // on the cluster (matches are not yet filtered per member).
        if version >= 1 && req.subscribed_topic_regex.as_ref().is_some_and(|r| !r.is_empty()) && !check.cluster(Operation::Describe) {
            return Some(error(ResponseError::TopicAuthorizationFailed.code(), "a regex subscription needs DESCRIBE on the cluster while ACLs are on"));
        }
    }
    // Compiled here, on the connection's task, so a bad or costly regex
    // costs the coordinator nothing.
    if let Some(re) = req.subscribed_topic_regex.as_ref().filter(|r| version >= 1 && !r.is_empty()) {
        if let Err(e) = consumer::compile_regex(re) {
            return Some(error(ResponseError::InvalidRegularExpression.code(), &e));
        }
    }
    if let Some(code) = broker.coordinator_error(&group) {
        return Some(error(code, "this broker does not coordinate the group now"));
    }
    let args = HeartbeatArgs {
        version,
        member_id: req.member_id.to_string(),
        member_epoch: req.member_epoch,
        instance_id: req.instance_id.map(|s| s.to_string()),
        rack_id: req.rack_id.map(|s| s.to_string()),
        rebalance_timeout_ms: req.rebalance_timeout_ms,
        subscribed_topic_names: req.subscribed_topic_names.map(|v| v.into_iter().map(|n| n.0.to_string()).collect()),
        subscribed_topic_regex: if version >= 1 { req.subscribed_topic_regex.map(|s| s.to_string()) } else { None },
        server_assignor: req.server_assignor.map(|s| s.to_string()),
        owned: req.topic_partitions.map(|v| v.into_iter().map(|t| (*t.topic_id.as_bytes(), t.partitions)).collect()),
        client_id: conn::client_id(),
        client_host: conn::peer_host(),
    };
    let r = broker.coordinator.consumer_heartbeat(group, args).await?;
    let mut resp = Response::default()
        .with_error_code(r.error)
        .with_error_message(r.message.map(str_bytes))
        .with_member_epoch(r.member_epoch)
        .with_heartbeat_interval_ms(r.heartbeat_interval_ms)
        .with_member_id((!r.member_id.is_empty()).then(|| str_bytes(r.member_id)));
    if let Some(a) = r.assignment {
        resp = resp.with_assignment(Some(Assignment::default().with_topic_partitions(a.into_iter().map(|(t, ps)| TopicPartitions::default().with_topic_id(uuid::Uuid::from_bytes(t)).with_partitions(ps)).collect())));
    }
    Some(resp)
}
