//! Metadata: this broker, the cluster id, and topics with their ids.
//! Topics that do not exist are created when the request allows it and
//! `auto_create_topics` is on (Kafka's behaviour, with its partition count
//! `num_partitions`), within the request's and the broker's auto-create
//! bounds. Subtree streams (`<prefix>.__all`) are listed with one partition
//! when asked for by name, never created.
//!
//! # Streamed, not built
//!
//! A request may name a million topics, and a broker may hold a million:
//! decoded into `kafka-protocol`'s structs and answered as one response
//! struct, that is several hundred bytes of memory per name. So every
//! Metadata request is served by [`special`]: after the guard has checked
//! the body, the topic list is walked in place (each entry decoded alone,
//! its name still pointing into the frame), each name is answered as it is
//! met, and each answer is encoded straight into the response, which goes
//! out in parts. Memory is the frame, the set of names already answered
//! (Kafka reads the names into a set: each is answered once), and the
//! encoded response.

use std::collections::HashSet;
use std::sync::Arc;

use bytes::{Buf, BufMut, Bytes, BytesMut};
use kafka_protocol::messages::metadata_request::MetadataRequestTopic;
use kafka_protocol::messages::metadata_response::{MetadataResponseBroker, MetadataResponsePartition, MetadataResponseTopic};
use kafka_protocol::messages::{ApiKey, ResponseHeader};
pub use kafka_protocol::messages::{MetadataRequest as Request, MetadataResponse as Response};
use kafka_protocol::protocol::{Decodable, Encodable, HeaderVersion, VersionRange};

use super::{str_bytes, topic_name, IntoReply, Route};
use crate::auth::acl::Operation;
use crate::engine::subtree::Subtree;
use crate::engine::{topics, Engine, EngineError, Topic};
use crate::kafka::authz::Check;
use crate::kafka::probe::Closed;
use crate::kafka::{errors, Broker};
use crate::protocol::guard;
use crate::protocol::header::RequestHeader;

pub const VERSIONS: VersionRange = VersionRange { min: 0, max: 13 };

/// Encoded answers are gathered into parts of about this size.
const PART_BYTES: usize = 64 << 10;

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

/// A Metadata request as read in place: where its topic list is, and
/// whether it may create topics.
struct Query {
    body: Bytes,
    /// (count, offset of the first entry); None: all topics.
    topics: Option<(usize, usize)>,
    allow_create: bool,
}

/// Reads the top level of a body the guard accepted.
fn query(version: i16, body: Bytes) -> Query {
    let mut b = &body[..];
    let count: Option<usize> = if version >= 9 {
        let (n, used) = crate::protocol::header::uvarint(b).expect("guard-checked varint");
        b = &b[used..];
        n.checked_sub(1).map(|n| n as usize)
    } else {
        let n = b.get_i32();
        usize::try_from(n).ok()
    };
    let start = body.len() - b.len();
    // v0 has no null "all topics": an empty list means all.
    let topics = match count {
        Some(0) if version == 0 => None,
        c => c.map(|c| (c, start)),
    };
    // The flags follow the entries: only v4+ has allow_auto_topic_creation,
    // and it is the first byte after them.
    let allow_create = version < 4 || {
        let mut rest = body.slice(start..);
        for _ in 0..topics.map_or(0, |(c, _)| c) {
            MetadataRequestTopic::decode(&mut rest, version).expect("guard-checked entry");
        }
        rest.first() == Some(&1)
    };
    Query { body, topics, allow_create }
}

/// Serves every Metadata request this broker supports (see the module
/// docs); out-of-range versions fall through to the table, which closes.
pub fn special(broker: &Arc<Broker>, h: &RequestHeader, body: &Bytes) -> Option<Route> {
    let version = h.api_version;
    if version < VERSIONS.min || version > VERSIONS.max {
        return None;
    }
    if let Some(r) = librdkafka_all_topics(version, body) {
        let q = Query { body: Bytes::new(), topics: None, allow_create: r.allow_auto_topic_creation };
        let (broker, id) = (broker.clone(), h.correlation_id);
        return Some(Route::Run(Box::pin(async move { answer(&broker, q, version).await.into_reply(id, version, crate::kafka::conn::throttle::response_ms()) })));
    }
    let limits = super::guard_limits(broker);
    let checked = move |body: Bytes| match guard::check_request_body(ApiKey::Metadata as i16, version, &body, &limits) {
        Ok(()) => Ok(query(version, body)),
        Err(e) => Err(format!("malformed request body: {e}")),
    };
    let (broker, id) = (broker.clone(), h.correlation_id);
    if body.len() <= super::INLINE_DECODE_BYTES {
        let q = match checked(body.clone()) {
            Ok(q) => q,
            Err(why) => return Some(Route::Close(why, Closed::BadBody)),
        };
        return Some(Route::Run(Box::pin(async move { answer(&broker, q, version).await.into_reply(id, version, crate::kafka::conn::throttle::response_ms()) })));
    }
    // A long list is walked on the CPU pool, not the async worker.
    let body = body.clone();
    Some(Route::Run(Box::pin(async move {
        let q = match broker.engine.run_cpu(move || checked(body)).await? {
            Ok(q) => q,
            Err(why) => {
                tracing::warn!(api = "Metadata", version, reason = %why, "closing connection");
                crate::kafka::conn::closing(Closed::BadBody);
                return None;
            }
        };
        answer(&broker, q, version).await.into_reply(id, version, crate::kafka::conn::throttle::response_ms())
    })))
}

/// The decoded entry point the handler table requires. Every request is
/// served by [`special`]; this one re-encodes a decoded request and
/// answers it the same way (for callers that hold one, such as tests).
pub async fn handle(broker: &Broker, req: Request, version: i16) -> Option<Answer> {
    let mut b = BytesMut::new();
    req.encode(&mut b, version).ok()?;
    answer(broker, query(version, b.freeze()), version).await
}

/// The response: its fixed part, and the topic entries already encoded.
pub struct Answer {
    resp: Response,
    count: usize,
    entries: Vec<Bytes>,
}

impl IntoReply for Option<Answer> {
    fn into_reply(self, correlation_id: i32, version: i16, throttle_ms: i32) -> Option<Vec<Bytes>> {
        let mut a = self?;
        a.resp.throttle_time_ms = throttle_ms;
        Some(frame(correlation_id, version, &a.resp, a.count, a.entries))
    }
}

async fn answer(broker: &Broker, q: Query, version: i16) -> Option<Answer> {
    let engine = broker.engine.clone();
    let place = Place { view: broker.cluster.view(), me: broker.node_id() };
    // With the authorizer: only topics the principal may DESCRIBE are
    // listed; one asked for by name without it is TOPIC_AUTHORIZATION_FAILED,
    // and creating one on the way needs CREATE (cluster or topic).
    let check = broker.authorizer.enabled().then(|| Check::current(broker));
    let (count, parts) = tokio::task::spawn_blocking(move || resolve(&engine, &q, version, &place, &check)).await.ok()?;
    let view = broker.cluster.view();
    let brokers = broker
        .brokers_in(&view)
        .into_iter()
        .map(|b| MetadataResponseBroker::default().with_node_id(b.id.into()).with_host(str_bytes(b.host)).with_port(b.port).with_rack(b.rack.map(str_bytes)))
        .collect();
    let mut resp = Response::default().with_brokers(brokers);
    if version >= 2 {
        resp = resp.with_cluster_id(Some(str_bytes(view.cluster_id.clone())));
    }
    if version >= 1 {
        resp = resp.with_controller_id(view.controller_id().into());
    }
    if (8..=10).contains(&version) {
        resp = resp.with_cluster_authorized_operations(-2147483648);
    }
    Some(Answer { resp, count, entries: parts })
}

/// The response around the encoded topic entries: the message with an
/// empty topic list, cut where that list is, with the real count and the
/// entries put in. After the topic list come only fixed-size fields.
fn frame(correlation_id: i32, version: i16, resp: &Response, count: usize, entries: Vec<Bytes>) -> Vec<Bytes> {
    let mut empty = BytesMut::new();
    resp.encode(&mut empty, version).expect("a metadata response encodes");
    // cluster_authorized_operations (v8-10), error_code (v13+), tagged fields (v9+).
    let after = if (8..=10).contains(&version) { 4 } else { 0 } + if version >= 13 { 2 } else { 0 } + usize::from(version >= 9);
    let empty_list = if version >= 9 { 1 } else { 4 };
    let cut = empty.len() - after;
    let (before, tail) = (&empty[..cut - empty_list], &empty[cut..]);
    let mut head = BytesMut::with_capacity(16 + before.len());
    head.put_i32(0);
    ResponseHeader::default().with_correlation_id(correlation_id).encode(&mut head, Response::header_version(version)).expect("a response header encodes");
    head.put_slice(before);
    if version >= 9 {
        crate::protocol::fetch::put_uvarint(&mut head, count as u64 + 1);
    } else {
        head.put_i32(count as i32);
    }
    let total = head.len() - 4 + entries.iter().map(Bytes::len).sum::<usize>() + tail.len();
    head[0..4].copy_from_slice(&(total as i32).to_be_bytes());
    let mut out = Vec::with_capacity(entries.len() + 2);
    out.push(head.freeze());
    out.extend(entries);
    out.push(Bytes::copy_from_slice(tail));
    out
}

/// Encoded topic entries, gathered into parts.
struct Entries {
    version: i16,
    count: usize,
    parts: Vec<Bytes>,
    cur: BytesMut,
}

impl Entries {
    fn push(&mut self, t: &MetadataResponseTopic) {
        t.encode(&mut self.cur, self.version).expect("a metadata topic encodes");
        self.count += 1;
        if self.cur.len() >= PART_BYTES {
            self.parts.push(std::mem::take(&mut self.cur).freeze());
        }
    }

    fn finish(mut self) -> (usize, Vec<Bytes>) {
        if !self.cur.is_empty() {
            self.parts.push(self.cur.freeze());
        }
        (self.count, self.parts)
    }
}

/// Where partitions are led, as this node describes them: its view of
/// the cluster.
pub struct Place {
    pub view: Arc<crate::cluster::ClusterView>,
    pub me: i32,
}

impl Place {
    fn partition(&self, topic: &str, p: i32) -> crate::cluster::PartState {
        self.view.partition(self.me, topic, p)
    }

    /// A subtree stream's one partition: served by the node leading every
    /// unit it covers, in epoch 0 (docs/cluster.md); `None` when no node
    /// does.
    fn stream(&self, engine: &Engine, s: &Subtree) -> Option<crate::cluster::PartState> {
        let n = crate::kafka::stream_server(engine, &self.view, self.me, s)?;
        Some(crate::cluster::PartState { leader: n, leader_epoch: 0, replicas: vec![n], isr: vec![n], offline: Vec::new() })
    }
}

pub fn topic_entry(t: &Topic, version: i16, place: &Place) -> MetadataResponseTopic {
    entry(t.name(), t.id(), t.partitions(), version, &|p| place.partition(t.name(), p))
}

fn entry(name: &str, id: [u8; 16], partitions: i32, version: i16, state: &dyn Fn(i32) -> crate::cluster::PartState) -> MetadataResponseTopic {
    let ids = |v: Vec<i32>| v.into_iter().map(Into::into).collect::<Vec<_>>();
    let partitions = (0..partitions)
        .map(|p| {
            let s = state(p);
            let mut part = MetadataResponsePartition::default().with_partition_index(p).with_leader_id(s.leader.into());
            // No leader now (its node is gone, or the unit is not seen
            // yet): clients retry.
            if s.leader < 0 {
                part = part.with_error_code(kafka_protocol::ResponseError::LeaderNotAvailable.code());
            }
            if version >= 7 {
                part = part.with_leader_epoch(s.leader_epoch);
            }
            if version >= 5 {
                part = part.with_offline_replicas(ids(s.offline));
            }
            part.with_replica_nodes(ids(s.replicas)).with_isr_nodes(ids(s.isr))
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

/// Answers every topic the query names (or all), each once, encoded as it
/// goes. Blocking: it may create topics.
fn resolve(engine: &Engine, q: &Query, version: i16, place: &Place, check: &Option<Check>) -> (usize, Vec<Bytes>) {
    let mut out = Entries { version, count: 0, parts: Vec::new(), cur: BytesMut::new() };
    let may = |op: Operation, name: &str| check.as_ref().is_none_or(|c| c.topic(op, name));
    let Some((count, start)) = q.topics else {
        for t in engine.topics() {
            if may(Operation::Describe, t.name()) && !crate::engine::topics::is_internal(t.name()) {
                out.push(&topic_entry(&t, version, place));
            }
        }
        return out.finish();
    };
    let mut allowance = engine.auto_create_allowance();
    // Sized once: growing by doubling would briefly hold both tables.
    let mut names: HashSet<&str> = HashSet::with_capacity(count);
    let mut ids: HashSet<uuid::Uuid> = HashSet::new();
    let mut rest = q.body.slice(start..);
    for _ in 0..count {
        let at = q.body.len() - rest.len();
        let t = MetadataRequestTopic::decode(&mut rest, version).expect("guard-checked entry");
        let Some(n) = &t.name else {
            if ids.insert(t.topic_id) {
                out.push(&match engine.topic_by_id(t.topic_id.as_bytes()) {
                    Some(topic) if !may(Operation::Describe, topic.name()) => error_entry(None, kafka_protocol::ResponseError::TopicAuthorizationFailed.code()).with_topic_id(t.topic_id),
                    Some(topic) => topic_entry(&topic, version, place),
                    None => match engine.subtree_by_id(t.topic_id.as_bytes()) {
                        Some(s) if may(Operation::Describe, &s.name()) => match place.stream(engine, &s) {
                            Some(state) => entry(&s.name(), s.id(), 1, version, &|_| state.clone()),
                            None => error_entry(None, kafka_protocol::ResponseError::UnknownTopicOrPartition.code()).with_topic_id(t.topic_id),
                        },
                        _ => error_entry(None, kafka_protocol::ResponseError::UnknownTopicId.code()).with_topic_id(t.topic_id),
                    },
                });
            }
            continue;
        };
        // The name's bytes, borrowed from the frame (not from `t`, which
        // goes with this iteration).
        let name = name_in(&q.body, at, n.as_str());
        if !names.insert(name) {
            continue;
        }
        if !may(Operation::Describe, name) {
            out.push(&error_entry(Some(name), kafka_protocol::ResponseError::TopicAuthorizationFailed.code()));
            continue;
        }
        // CREATE is asked only of a request that would create the topic.
        let would_create = q.allow_create && engine.config().auto_create_topics && Subtree::parse(name).is_none() && engine.topic(name).is_none();
        if would_create && check.as_ref().is_some_and(|c| !(c.cluster(Operation::Create) || c.topic(Operation::Create, name))) {
            out.push(&error_entry(Some(name), kafka_protocol::ResponseError::TopicAuthorizationFailed.code()));
            continue;
        }
        out.push(&named(engine, name, q.allow_create, &mut allowance, version, place));
    }
    out.finish()
}

/// `name` as it lies in `body`, after `from`: the decoder hands out names
/// as slices of the frame they came from, so its address says where.
fn name_in<'b>(body: &'b Bytes, from: usize, name: &str) -> &'b str {
    if name.is_empty() {
        return "";
    }
    let at = (name.as_ptr() as usize).checked_sub(body.as_ptr() as usize).filter(|at| *at >= from && at + name.len() <= body.len());
    let at = at.filter(|at| &body[*at..at + name.len()] == name.as_bytes()).expect("a decoded name is a slice of its frame");
    std::str::from_utf8(&body[at..at + name.len()]).expect("guard-checked UTF-8")
}

fn named(engine: &Engine, name: &str, allow_create: bool, allowance: &mut crate::engine::AutoCreate, version: i16, place: &Place) -> MetadataResponseTopic {
    // A subtree stream: listed only when asked for by name.
    if Subtree::parse(name).is_some() {
        return match engine.subtree(name) {
            Some(s) => match place.stream(engine, &s) {
                Some(state) => entry(name, engine.stream_id(&s), 1, version, &|_| state.clone()),
                // Its topics are led by several nodes: none holds it all.
                None => error_entry(Some(name), kafka_protocol::ResponseError::UnknownTopicOrPartition.code()),
            },
            None => error_entry(Some(name), kafka_protocol::ResponseError::UnknownTopicOrPartition.code()),
        };
    }
    if topics::validate_name(name).is_err() {
        return error_entry(Some(name), kafka_protocol::ResponseError::InvalidTopicException.code());
    }
    let found = if allow_create { engine.topic_or_create(name, allowance) } else { engine.topic(name).ok_or(EngineError::UnknownTopicOrPartition) };
    match found {
        Ok(t) => topic_entry(&t, version, place),
        Err(e) => error_entry(Some(name), errors::code(&e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kafka_protocol::messages::TopicName;
    use kafka_protocol::protocol::StrBytes;

    fn body(req: &Request, version: i16) -> Bytes {
        let mut b = BytesMut::new();
        req.encode(&mut b, version).unwrap();
        b.freeze()
    }

    #[test]
    fn the_top_level_is_read_in_place_at_every_version() {
        for version in VERSIONS.min..=VERSIONS.max {
            let names = vec![MetadataRequestTopic::default().with_name(Some(TopicName(StrBytes::from_static_str("a.b")))); 3];
            let mut req = Request::default().with_topics(Some(names));
            if version >= 4 {
                req = req.with_allow_auto_topic_creation(false);
            }
            let q = query(version, body(&req, version));
            assert_eq!(q.topics.map(|t| t.0), Some(3), "v{version}");
            assert_eq!(q.allow_create, version < 4, "v{version}");
            if version >= 1 {
                let q = query(version, body(&Request::default().with_topics(None), version));
                assert!(q.topics.is_none(), "v{version}: null is all topics");
            }
        }
        let q = query(0, body(&Request::default().with_topics(Some(Vec::new())), 0));
        assert!(q.topics.is_none(), "v0: an empty list is all topics");
    }

    #[test]
    fn the_spliced_response_decodes_as_kafka_protocol_encodes_it() {
        for version in VERSIONS.min..=VERSIONS.max {
            let place = Place { view: Arc::new(crate::cluster::ClusterView { single: true, ..Default::default() }), me: 0 };
            let topics: Vec<MetadataResponseTopic> = (0..3).map(|i| entry(&format!("t{i}"), [i as u8; 16], i + 1, version, &|p| place.partition("t", p))).collect();
            let mut e = Entries { version, count: 0, parts: Vec::new(), cur: BytesMut::new() };
            for t in &topics {
                e.push(t);
            }
            let (count, parts) = e.finish();
            let mut resp = Response::default().with_brokers(vec![MetadataResponseBroker::default().with_node_id(0.into()).with_host(str_bytes("h")).with_port(9)]);
            if version >= 2 {
                resp = resp.with_cluster_id(Some(str_bytes("c")));
            }
            if (8..=10).contains(&version) {
                resp = resp.with_cluster_authorized_operations(-2147483648);
            }
            let framed: Vec<u8> = frame(7, version, &resp, count, parts).concat();
            let mut b = Bytes::from(framed);
            assert_eq!(b.get_i32() as usize, b.len(), "v{version}: length prefix");
            let header = ResponseHeader::decode(&mut b, Response::header_version(version)).unwrap();
            assert_eq!(header.correlation_id, 7);
            let decoded = Response::decode(&mut b, version).unwrap();
            assert!(b.is_empty(), "v{version}: nothing after the body");
            assert_eq!(decoded, resp.with_topics(topics), "v{version}");
        }
    }

    #[test]
    fn librdkafkas_all_topics_shapes_and_nothing_else() {
        assert!(librdkafka_all_topics(12, &[0, 0, 0, 0, 1, 0, 0]).is_some_and(|r| r.topics.is_none() && r.allow_auto_topic_creation));
        assert!(librdkafka_all_topics(10, &[0, 0, 0, 0, 0, 1, 1, 0]).is_some_and(|r| r.include_cluster_authorized_operations && r.include_topic_authorized_operations));
        assert!(librdkafka_all_topics(12, &[0, 0, 0, 0, 2, 0, 0]).is_none(), "flags are 0 or 1");
        assert!(librdkafka_all_topics(12, &[0, 0, 0, 0, 0, 0, 0, 0]).is_none(), "one byte too many");
        assert!(librdkafka_all_topics(8, &[0, 0, 0, 0, 0, 0, 0]).is_none(), "only flexible versions");
    }
}
