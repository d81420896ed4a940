//! Metadata: this broker, the cluster id, and topics with their ids.
//! Topics that do not exist are created when the request allows it and
//! `auto_create_topics` is on (Kafka's behaviour, with its partition count
//! `num_partitions`). Subtree streams (`<prefix>.__all`) are listed with
//! one partition when asked for by name, never created.

use std::sync::Arc;

use bytes::Bytes;
use kafka_protocol::messages::metadata_response::{MetadataResponseBroker, MetadataResponsePartition, MetadataResponseTopic};
pub use kafka_protocol::messages::{MetadataRequest as Request, MetadataResponse as Response};
use kafka_protocol::protocol::VersionRange;

use super::{str_bytes, topic_name, IntoReply, Route};
use crate::engine::subtree::Subtree;
use crate::engine::{topics, Engine, EngineError, Topic};
use crate::kafka::{errors, Broker, NODE_ID};
use crate::protocol::header::RequestHeader;

pub const VERSIONS: VersionRange = VersionRange { min: 0, max: 12 };

/// librdkafka 2.1 and later ask for all topics at v9+ with the null topic
/// array written as a 4-byte zero instead of a 1-byte varint (librdkafka
/// issue 5049, unfixed in every release so far): read strictly, that body
/// has bytes after its end. Only these exact shapes are read as what the
/// client meant; any other body with trailing bytes is refused.
///
/// ```text
/// v9-10:  00 00 00 00 | auto_create | cluster_ops | topic_ops | 00
/// v11+:   00 00 00 00 | auto_create | topic_ops | 00
/// ```
pub fn librdkafka_all_topics(version: i16, body: &[u8]) -> Option<Request> {
    let flag = |b: u8| (b <= 1).then_some(b == 1);
    match (version, body) {
        (9..=10, [0, 0, 0, 0, a, c, t, 0]) => Some(
            Request::default().with_topics(None).with_allow_auto_topic_creation(flag(*a)?).with_include_cluster_authorized_operations(flag(*c)?).with_include_topic_authorized_operations(flag(*t)?),
        ),
        (11.., [0, 0, 0, 0, a, t, 0]) => Some(Request::default().with_topics(None).with_allow_auto_topic_creation(flag(*a)?).with_include_topic_authorized_operations(flag(*t)?)),
        _ => None,
    }
}

pub fn special(broker: &Arc<Broker>, h: &RequestHeader, body: &Bytes) -> Option<Route> {
    if h.api_version < 9 || h.api_version > VERSIONS.max {
        return None;
    }
    let req = librdkafka_all_topics(h.api_version, body)?;
    let (broker, id, version) = (broker.clone(), h.correlation_id, h.api_version);
    Some(Route::Run(Box::pin(async move { handle(&broker, req, version).await.into_reply(id, version) })))
}

pub fn topic_entry(t: &Topic, version: i16) -> MetadataResponseTopic {
    entry(t.name(), t.id(), t.partitions(), version)
}

fn entry(name: &str, id: [u8; 16], partitions: i32, version: i16) -> MetadataResponseTopic {
    let partitions = (0..partitions)
        .map(|p| {
            let mut part = MetadataResponsePartition::default()
                .with_partition_index(p)
                .with_leader_id(NODE_ID.into())
                .with_replica_nodes(vec![NODE_ID.into()])
                .with_isr_nodes(vec![NODE_ID.into()]);
            if version >= 7 {
                part = part.with_leader_epoch(0);
            }
            part
        })
        .collect();
    let mut entry = MetadataResponseTopic::default().with_name(Some(topic_name(name))).with_partitions(partitions);
    if version >= 10 {
        entry = entry.with_topic_id(uuid::Uuid::from_bytes(id));
    }
    if version >= 8 {
        entry = entry.with_topic_authorized_operations(-2147483648);
    }
    entry
}

fn error_entry(name: Option<&str>, code: i16) -> MetadataResponseTopic {
    MetadataResponseTopic::default().with_error_code(code).with_name(name.map(topic_name))
}

pub async fn handle(broker: &Broker, req: Request, version: i16) -> Option<Response> {
    let engine = broker.engine.clone();
    // v0 has no null "all topics": an empty list means all; v1+ uses null.
    let wanted: Option<Vec<(Option<String>, uuid::Uuid)>> = match req.topics {
        None => None,
        Some(list) if list.is_empty() && version == 0 => None,
        // Kafka reads the names into a set: each is answered once.
        Some(list) => Some(super::first_occurrences(list.into_iter().map(|t| (t.name.map(|n| n.0.to_string()), t.topic_id)), |(n, id)| (n.clone(), *id))),
    };
    let allow_create = version < 4 || req.allow_auto_topic_creation;
    let topics = tokio::task::spawn_blocking(move || resolve(&engine, wanted, allow_create, version)).await.ok()?;

    let broker_entry = MetadataResponseBroker::default()
        .with_node_id(NODE_ID.into())
        .with_host(str_bytes(broker.cfg.advertised_host.clone()))
        .with_port(broker.cfg.advertised_port);
    let mut resp = Response::default().with_brokers(vec![broker_entry]).with_topics(topics);
    if version >= 2 {
        resp = resp.with_cluster_id(Some(str_bytes(broker.engine.cluster_id())));
    }
    if version >= 1 {
        resp = resp.with_controller_id(NODE_ID.into());
    }
    if (8..=10).contains(&version) {
        resp = resp.with_cluster_authorized_operations(-2147483648);
    }
    Some(resp)
}

fn resolve(engine: &Engine, wanted: Option<Vec<(Option<String>, uuid::Uuid)>>, allow_create: bool, version: i16) -> Vec<MetadataResponseTopic> {
    let Some(wanted) = wanted else {
        return engine.topics().iter().map(|t| topic_entry(t, version)).collect();
    };
    let mut allowance = engine.auto_create_allowance();
    wanted
        .into_iter()
        .map(|(name, id)| match name {
            Some(name) => {
                // A subtree stream: listed only when asked for by name.
                if Subtree::parse(&name).is_some() {
                    return match engine.subtree(&name) {
                        Some(s) => entry(&name, s.id(), 1, version),
                        None => error_entry(Some(&name), kafka_protocol::ResponseError::UnknownTopicOrPartition.code()),
                    };
                }
                if let Err(_e) = topics::validate_name(&name) {
                    return error_entry(Some(&name), kafka_protocol::ResponseError::InvalidTopicException.code());
                }
                let found = if allow_create { engine.topic_or_create(&name, &mut allowance) } else { engine.topic(&name).ok_or(EngineError::UnknownTopicOrPartition) };
                match found {
                    Ok(t) => topic_entry(&t, version),
                    Err(e) => error_entry(Some(&name), errors::code(&e)),
                }
            }
            None => match engine.topic_by_id(id.as_bytes()) {
                Some(t) => topic_entry(&t, version),
                None => error_entry(None, kafka_protocol::ResponseError::UnknownTopicId.code()).with_topic_id(id),
            },
        })
        .collect()
}
