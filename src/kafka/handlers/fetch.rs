//! Fetch with long polling.
//!
//! A fetch that finds fewer than `min_bytes` registers with the engine for
//! every tp it asked about *before* it reads, then sleeps until one of them
//! moves or `max_wait_ms` runs out: a record produced while the fetch waits
//! wakes it at once, never on a timer. Reads run on tokio's blocking pool.
//!
//! `read_committed` fetches stop at the last stable offset (the start of
//! the oldest open transaction) and carry the aborted transactions that
//! have records in what they return; clients drop those records.
//!
//! A subtree stream (`<prefix>.__all`, see `engine::subtree`) is fetched
//! like partition 0 of a topic; it waits on every tp.
//!
//! Fetch sessions (KIP-227, v7+) are `kafka::fetch_session`'s: a full
//! request may open one, an incremental one reads every partition of its
//! session and answers only those with news.
//!
//! From v13 topics are named by id (KIP-516): a topic's id, or the id
//! Metadata gave a subtree stream; an id nothing has is UNKNOWN_TOPIC_ID.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
pub use kafka_protocol::messages::{FetchRequest as Request, FetchResponse as Response};
use kafka_protocol::messages::TopicName;
use kafka_protocol::protocol::VersionRange;
use kafka_protocol::ResponseError;
use tokio::sync::Notify;

use super::IntoReply;
use crate::protocol::fetch::{self as wire, PartitionOut, TopicOut};
use crate::engine::subtree::Subtree;
use crate::engine::{Engine, EngineError, Topic};
use crate::auth::acl::Operation;
use crate::auth::quota::Kind;
use crate::kafka::authz::Check;
use crate::kafka::conn::throttle;
use crate::kafka::fetch_session::{Answered, Cached, Changes, Context, Key, INITIAL_EPOCH};
use crate::kafka::{conn, errors, Broker};
use crate::storage::Tp;

pub const VERSIONS: VersionRange = VersionRange { min: 4, max: 18 };

struct Want {
    partition: i32,
    topic: Option<Arc<Topic>>,
    /// Set instead of `topic` for a subtree stream (`<prefix>.__all`).
    subtree: Option<Subtree>,
    offset: i64,
    max_bytes: usize,
    /// The reader may not READ the topic: TOPIC_AUTHORIZATION_FAILED.
    denied: bool,
    /// v13+: no topic (or stream) has the id: UNKNOWN_TOPIC_ID.
    unknown_id: bool,
    /// This node does not lead the partition (NOT_LEADER_OR_FOLLOWER, with
    /// the leader and its epoch when one is known), or the client names
    /// another leader epoch (KIP-320).
    refused: Option<(i16, Option<(i32, i32)>)>,
}

/// One topic of the request, its partitions each once.
struct Asked {
    /// Resolved from the id from v13 (empty if no topic has it).
    name: TopicName,
    /// As the request gave it from v13; the topic's up to v12.
    id: [u8; 16],
    parts: Vec<Want>,
}

/// The fetch answer before framing; encoded by `protocol::fetch`.
pub struct Reply {
    error_code: i16,
    session_id: i32,
    topics: Vec<TopicOut>,
    /// The leaders NOT_LEADER_OR_FOLLOWER answers name (v16+, KIP-951).
    endpoints: Vec<wire::Endpoint>,
}

impl Reply {
    /// An answer without sessions or leader endpoints (a follower's).
    pub(super) fn new(error_code: i16, topics: Vec<TopicOut>) -> Reply {
        Reply { error_code, session_id: 0, topics, endpoints: Vec::new() }
    }
}

impl IntoReply for Option<Reply> {
    fn into_reply(self, correlation_id: i32, version: i16, throttle_ms: i32) -> Option<Vec<Bytes>> {
        let r = self?;
        Some(wire::encode_with(correlation_id, version, throttle_ms, r.error_code, r.session_id, &r.topics, &r.endpoints))
    }
}

pub async fn handle(broker: &Broker, mut req: Request, version: i16) -> Option<Reply> {
    // A follower's fetch (cluster mode; single-node mode has no
    // followers and answers it as a consumer's, as before).
    if let Some(replica) = super::replica_fetch::replica_of(&req, version).filter(|_| !broker.cluster.view().single) {
        return super::replica_fetch::handle(broker, req, version, replica).await;
    }
    let principal = conn::session().principal();
    let now_ms = broker.engine.now_ms();
    // v7+ carry a session id and epoch; older fetches have no session.
    // v13+ names topics by id (KIP-516).
    let by_id = version >= 13;
    let context = if version >= 7 {
        let changes = if req.session_epoch > INITIAL_EPOCH { changes(&mut req, by_id) } else { Changes::default() };
        broker.fetch_sessions.begin(&principal, req.session_id, req.session_epoch, by_id, changes, now_ms)
    } else {
        Context::Sessionless
    };
    let session_id = match &context {
        Context::Error(code) => return Some(Reply { error_code: *code, session_id: 0, topics: Vec::new(), endpoints: Vec::new() }),
        Context::Incremental { id, .. } => *id,
        Context::Sessionless | Context::Full => 0,
    };
    // A consumer over its byte rate is answered empty, with the time to
    // wait, as Kafka does; nothing is read for it (an incremental session
    // has moved to its next epoch, as in Kafka).
    if !throttle::charge(Kind::Fetch, 0).is_zero() {
        return Some(Reply { error_code: 0, session_id, topics: Vec::new(), endpoints: Vec::new() });
    }
    let requested = match &context {
        Context::Incremental { partitions, .. } => session_topics(partitions),
        _ => std::mem::take(&mut req.topics),
    };
    let read_committed = req.isolation_level == 1;
    let wait = Duration::from_millis(req.max_wait_ms.max(0) as u64).min(broker.cfg.max_fetch_wait);
    let deadline = tokio::time::Instant::now() + wait;
    let min_bytes = req.min_bytes.max(0) as usize;
    // Kafka's fetch.max.bytes caps what a client may ask for.
    let limit = broker.cfg.fetch_max_bytes;
    // A consumer with a byte-rate quota asks for at most a window's worth
    // (Kafka bounds a throttled fetch the same way).
    let max_bytes = (req.max_bytes.max(0) as usize).min(limit).min(throttle::window_bytes(Kind::Fetch).unwrap_or(usize::MAX));
    // READ on each topic, as Kafka asks (TOPIC_AUTHORIZATION_FAILED, never
    // waited on); a subtree stream carries only the topics the reader may
    // read, filtered inside the merge.
    let check = broker.authorizer.enabled().then(|| Check::current(broker));
    // A session's partitions are distinct already: no merging.
    let distinct = matches!(context, Context::Incremental { .. });
    let wants = Arc::new(wanted(broker, requested, by_id, distinct, limit, &check));
    // Partitions that exist: only those can move (a made-up partition of a
    // real topic is answered UNKNOWN_TOPIC_OR_PARTITION and never waited on).
    let tps: Vec<Tp> = wants.iter().flat_map(|a| a.parts.iter().filter(|w| !w.denied).filter_map(|w| w.topic.as_ref().filter(|t| w.partition >= 0 && w.partition < t.partitions()).map(|t| t.tp(w.partition)))).collect();
    let streams = wants.iter().any(|a| a.parts.iter().any(|w| w.subtree.is_some()));
    let mut stopping = broker.stopping.clone();
    // One registration for the whole poll, made before the first read so
    // nothing produced meanwhile is missed; it unregisters when dropped.
    let notify = Arc::new(Notify::new());
    let may_wait = tokio::time::Instant::now() < deadline && (!tps.is_empty() || streams) && !*stopping.borrow();
    // A subtree stream moves with any tp.
    let _registration = may_wait.then(|| broker.engine.subscribe(tps, streams, &notify));
    loop {
        let engine = broker.engine.clone();
        let w = wants.clone();
        let c = check.clone();
        let (topics, bytes, errors) = tokio::task::spawn_blocking(move || read_all(&engine, &w, max_bytes, read_committed, &c)).await.ok()?;
        if !may_wait || bytes >= min_bytes || errors || tokio::time::Instant::now() >= deadline || *stopping.borrow() {
            throttle::charge(Kind::Fetch, bytes);
            return Some(finish(broker, &context, &principal, by_id, &wants, topics));
        }
        let stop = tokio::select! {
            _ = notify.notified() => false,
            _ = tokio::time::sleep_until(deadline) => false,
            _ = stopping.wait_for(|s| *s) => true,
        };
        if stop || tokio::time::Instant::now() >= deadline {
            // One last read so data that arrived with the deadline is sent.
            let engine = broker.engine.clone();
            let w = wants.clone();
            let c = check.clone();
            let (topics, bytes, _) = tokio::task::spawn_blocking(move || read_all(&engine, &w, max_bytes, read_committed, &c)).await.ok()?;
            throttle::charge(Kind::Fetch, bytes);
            return Some(finish(broker, &context, &principal, by_id, &wants, topics));
        }
    }
}

/// What the request asks for, each partition once: Kafka keys a fetch by
/// partition, so a partition listed again moves to the offset and size it
/// was last given and keeps the place it was first given. From v13
/// (`by_id`) topics are found by id; a subtree stream's id is the one
/// Metadata gave out for it.
fn wanted(broker: &Broker, topics: Vec<kafka_protocol::messages::fetch_request::FetchTopic>, by_id: bool, distinct: bool, limit: usize, check: &Option<Check>) -> Vec<Asked> {
    // The common fetch names one partition, and a session's are distinct:
    // nothing to merge, no map.
    let single = distinct || topics.iter().map(|t| t.partitions.len()).sum::<usize>() <= 1;
    let mut at: std::collections::HashMap<(TopicName, [u8; 16], i32), (usize, usize)> = std::collections::HashMap::new();
    let view = broker.cluster.view();
    let mut out: Vec<Asked> = Vec::new();
    for t in topics {
        let (name, id, topic, subtree) = if by_id {
            let id = *t.topic_id.as_bytes();
            match broker.engine.topic_by_id(&id) {
                Some(topic) => (super::topic_name(topic.name()), id, Some(topic), None),
                None => match broker.engine.subtree_by_id(&id) {
                    Some(s) => (super::topic_name(&s.name()), id, None, Some(s)),
                    None => (TopicName::default(), id, None, None),
                },
            }
        } else {
            let topic = broker.engine.topic(super::name(&t.topic));
            let subtree = if topic.is_none() { broker.engine.subtree(super::name(&t.topic)) } else { None };
            let id = topic.as_ref().map(|t| t.id()).or(subtree.as_ref().map(Subtree::id)).unwrap_or_default();
            (t.topic, id, topic, subtree)
        };
        let unknown_id = by_id && topic.is_none() && subtree.is_none();
        // Unknown topics too: the answer must not tell a principal without
        // READ whether a topic exists (streams filter inside the merge).
        // An id nothing has names nothing to check.
        let denied = !unknown_id && subtree.is_none() && check.as_ref().is_some_and(|c| !c.topic(crate::auth::acl::Operation::Read, super::name(&name)));
        let ti = out.len();
        let mut parts = Vec::new();
        for p in t.partitions {
            let max_bytes = (p.partition_max_bytes.max(0) as usize).min(limit);
            let refused = match (&topic, &subtree) {
                (Some(t), _) if p.partition >= 0 && p.partition < t.partitions() => match broker.lead(&view, t.name(), p.partition) {
                    Ok(epoch) => crate::kafka::epoch_error(p.current_leader_epoch, epoch).map(|code| (code, None)),
                    Err(hint) => Some((ResponseError::NotLeaderOrFollower.code(), Some((hint.leader, hint.leader_epoch)))),
                },
                (_, Some(s)) if p.partition == 0 => match broker.serve_stream(&view, s) {
                    Ok(()) => None,
                    Err(server) => Some((crate::kafka::stream_refusal(server), server.map(|n| (n, 0)))),
                },
                _ => None,
            };
            let want = |p: &kafka_protocol::messages::fetch_request::FetchPartition| Want { partition: p.partition, topic: topic.clone(), subtree: subtree.clone(), offset: p.fetch_offset, max_bytes, denied, unknown_id, refused };
            if single {
                parts.push(want(&p));
                continue;
            }
            match at.entry((name.clone(), id, p.partition)) {
                std::collections::hash_map::Entry::Occupied(e) => {
                    let (i, j) = *e.get();
                    let w = if i == ti { &mut parts[j] } else { &mut out[i].parts[j] };
                    let w: &mut Want = w;
                    (w.offset, w.max_bytes, w.refused) = (p.fetch_offset, max_bytes, refused);
                }
                std::collections::hash_map::Entry::Vacant(e) => {
                    e.insert((ti, parts.len()));
                    parts.push(want(&p));
                }
            }
        }
        if !parts.is_empty() {
            out.push(Asked { name, id, parts });
        }
    }
    out
}

/// A partition as its session keys it: by name up to v12, by id after.
/// The name is copied: a decoded name is a slice of its request frame,
/// which a session must not keep alive.
fn session_key(by_id: bool, name: &TopicName, id: [u8; 16], partition: i32) -> Key {
    if by_id {
        (TopicName::default(), id, partition)
    } else {
        (TopicName(kafka_protocol::protocol::StrBytes::from_string(name.0.to_string())), [0; 16], partition)
    }
}

/// An incremental request's changes to its session: the partitions it
/// names (new offsets and sizes, or new partitions) and those it forgets.
fn changes(req: &mut Request, by_id: bool) -> Changes {
    let fetch = req.topics.iter().flat_map(|t| t.partitions.iter().map(move |p| (session_key(by_id, &t.topic, *t.topic_id.as_bytes(), p.partition), p.fetch_offset, p.partition_max_bytes))).collect();
    let forget = req.forgotten_topics_data.iter().flat_map(|t| t.partitions.iter().map(move |p| session_key(by_id, &t.topic, *t.topic_id.as_bytes(), *p))).collect();
    Changes { fetch, forget }
}

/// A session's partitions as request topics, in the session's order (a
/// topic whose partitions are not adjacent is listed more than once, as
/// Kafka's own responses do).
fn session_topics(partitions: &[Cached]) -> Vec<kafka_protocol::messages::fetch_request::FetchTopic> {
    use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
    let mut out: Vec<FetchTopic> = Vec::new();
    for c in partitions {
        let p = FetchPartition::default().with_partition(c.partition).with_fetch_offset(c.fetch_offset).with_partition_max_bytes(c.max_bytes);
        match out.last_mut() {
            Some(t) if t.topic == c.topic && *t.topic_id.as_bytes() == c.topic_id => t.partitions.push(p),
            _ => out.push(FetchTopic::default().with_topic(c.topic.clone()).with_topic_id(uuid::Uuid::from_bytes(c.topic_id)).with_partitions(vec![p])),
        }
    }
    out
}

fn answered(p: &PartitionOut) -> Answered {
    Answered { error_code: p.error_code, high_watermark: p.high_watermark, log_start_offset: p.log_start_offset, records: p.records.iter().map(Bytes::len).sum() }
}

/// The answer as the session context wants it: a full one opens a session
/// if there is room; an incremental one keeps only the partitions with
/// news.
fn finish(broker: &Broker, context: &Context, principal: &Arc<crate::auth::KafkaPrincipal>, by_id: bool, wants: &[Asked], topics: Vec<TopicOut>) -> Reply {
    let mut reply = counted(broker, wants, topics);
    match context {
        Context::Full => {
            let cached = wants
                .iter()
                .zip(&reply.topics)
                .flat_map(|(a, t)| {
                    a.parts.iter().zip(&t.partitions).map(move |(w, p)| {
                        let (topic, id, partition) = session_key(by_id, &a.name, a.id, w.partition);
                        let mut c = Cached::new(topic, id, partition, w.offset, w.max_bytes.min(i32::MAX as usize) as i32);
                        c.must_respond(&answered(p), true);
                        c
                    })
                })
                .collect();
            reply.session_id = broker.fetch_sessions.create(principal, by_id, cached, broker.engine.now_ms());
        }
        Context::Incremental { id, .. } => {
            let answers: Vec<(Key, Answered)> = wants
                .iter()
                .zip(&reply.topics)
                .flat_map(|(a, t)| t.partitions.iter().map(move |p| (session_key(by_id, &a.name, a.id, p.partition), answered(p))))
                .collect();
            let mut include = broker.fetch_sessions.answered(*id, &answers).into_iter();
            for t in reply.topics.iter_mut() {
                t.partitions.retain(|_| include.next().unwrap_or(true));
            }
            reply.topics.retain(|t| !t.partitions.is_empty());
            reply.session_id = *id;
        }
        Context::Sessionless | Context::Error(_) => {}
    }
    reply
}

/// The answer, counted for metrics: its partition errors and the bytes it
/// carries (counted here, for the reply sent, not for each read of a long
/// poll).
fn counted(broker: &Broker, wants: &[Asked], topics: Vec<TopicOut>) -> Reply {
    // `read_all` answers the wants in order, one partition for each.
    for (a, t) in wants.iter().zip(&topics) {
        for (w, p) in a.parts.iter().zip(&t.partitions) {
            broker.probe.error(kafka_protocol::messages::ApiKey::Fetch, p.error_code);
            let bytes = p.records.iter().map(Bytes::len).sum::<usize>() as u64;
            match &w.topic {
                Some(topic) => topic.traffic.fetched(bytes),
                None => broker.engine.config().probe.traffic.fetched(bytes),
            }
        }
    }
    // The leaders named, by their address on this listener.
    let named: std::collections::BTreeSet<i32> = topics.iter().flat_map(|t| &t.partitions).filter_map(|p| p.current_leader).map(|(l, _)| l).filter(|l| *l >= 0).collect();
    let endpoints = if named.is_empty() {
        Vec::new()
    } else {
        let view = broker.cluster.view();
        let brokers = broker.brokers_in(&view);
        brokers.into_iter().filter(|b| named.contains(&b.id)).map(|b| wire::Endpoint { node_id: b.id, host: Bytes::from(b.host), port: b.port, rack: b.rack.map(Bytes::from) }).collect()
    };
    Reply { error_code: 0, session_id: 0, topics, endpoints }
}

/// Reads every wanted partition; returns the response topics, the record
/// bytes gathered and whether to answer without waiting (a partition
/// carries an error, or a subtree stream has more to read right away).
fn read_all(engine: &Arc<Engine>, wants: &[Asked], max_bytes: usize, read_committed: bool, check: &Option<Check>) -> (Vec<TopicOut>, usize, bool) {
    let mut total = 0usize;
    let mut ahead = Vec::new();
    let mut any_error = false;
    let mut more = false;
    let topics = wants
        .iter()
        .map(|a| {
            let partitions = a
                .parts
                .iter()
                .map(|w| {
                    let mut out = PartitionOut {
                        partition: w.partition,
                        high_watermark: -1,
                        last_stable_offset: -1,
                        log_start_offset: -1,
                        aborted_transactions: read_committed.then(Vec::new),
                        ..PartitionOut::default()
                    };
                    if let (Some(s), 0) = (&w.subtree, w.partition) {
                        if let Some((code, leader)) = w.refused {
                            any_error = true;
                            (out.error_code, out.current_leader) = (code, leader);
                            return out;
                        }
                        let room = max_bytes.saturating_sub(total).min(w.max_bytes);
                        let may_read = |topic: &str| check.as_ref().is_none_or(|c| c.topic(Operation::Read, topic));
                        match engine.read_subtree(s, w.offset, room.max(1), total == 0, read_committed, &may_read) {
                            Ok(r) => {
                                total += r.records.iter().map(Bytes::len).sum::<usize>();
                                out.high_watermark = r.high_watermark;
                                out.last_stable_offset = r.last_stable;
                                out.log_start_offset = r.log_start;
                                out.records = r.records;
                                out.records.extend(r.tail);
                                // More to read now: answer without waiting.
                                more |= r.more;
                            }
                            Err(e) => {
                                any_error = true;
                                let (ls, hw) = engine.subtree_offsets(s);
                                (out.high_watermark, out.last_stable_offset, out.log_start_offset) = (hw, hw, ls);
                                out.error_code = errors::code(&e);
                            }
                        }
                        return out;
                    }
                    if w.unknown_id {
                        any_error = true;
                        out.error_code = ResponseError::UnknownTopicId.code();
                        return out;
                    }
                    if w.denied {
                        any_error = true;
                        out.error_code = ResponseError::TopicAuthorizationFailed.code();
                        return out;
                    }
                    let Some(topic) = w.topic.as_ref().filter(|t| w.partition >= 0 && w.partition < t.partitions()) else {
                        any_error = true;
                        out.error_code = ResponseError::UnknownTopicOrPartition.code();
                        return out;
                    };
                    if let Some((code, leader)) = w.refused {
                        any_error = true;
                        (out.error_code, out.current_leader) = (code, leader);
                        return out;
                    }
                    let tp = topic.tp(w.partition);
                    let room = max_bytes.saturating_sub(total).min(w.max_bytes);
                    let result = if room == 0 && total > 0 {
                        // The response is full: report offsets, no records.
                        engine
                            .offsets(&tp)
                            .map(|(ls, hw, leo)| {
                                let r = crate::storage::ReadResult { records: Vec::new(), high_watermark: hw, log_start: ls, log_end: leo, bytes_scanned: 0, next_offset: w.offset, from_tip: false };
                                (r, engine.last_stable_offset(&tp, hw), Vec::new())
                            })
                            .ok_or(EngineError::UnknownTopicOrPartition)
                    } else if read_committed {
                        engine.read_committed(&tp, w.offset, room.max(1), total == 0)
                    } else {
                        engine.read(&tp, w.offset, room.max(1), total == 0).map(|r| {
                            let lso = engine.last_stable_offset(&tp, r.high_watermark);
                            (r, lso, Vec::new())
                        })
                    };
                    match result {
                        Ok((r, lso, aborted)) => {
                            let len = r.len();
                            total += len;
                            // Offsets are dense in a log nothing compacts:
                            // a first batch past the fetch offset skips
                            // records the consumer will never see.
                            if let Some(first) = r.records.first().and_then(|b| crate::protocol::batch::BatchHeader::parse(b).ok()) {
                                if first.base_offset > w.offset && !topic.config.cleanup.compact {
                                    tracing::error!(topic = topic.name(), partition = w.partition, offset = w.offset, first = first.base_offset, from_tip = r.from_tip, hw = r.high_watermark, log_start = r.log_start, "a read answered past its offset");
                                }
                            }
                            // A consumer that got a full share is catching up:
                            // read its next share while this one is sent.
                            if len > 0 && !r.from_tip && len >= w.max_bytes / 2 && r.next_offset < lso.min(r.high_watermark) {
                                ahead.push((tp, r.next_offset, w.max_bytes));
                            }
                            out.high_watermark = r.high_watermark;
                            out.last_stable_offset = lso;
                            out.log_start_offset = r.log_start;
                            out.records = r.records;
                            if read_committed {
                                out.aborted_transactions = Some(aborted);
                            }
                        }
                        Err(e) => {
                            any_error = true;
                            if let Some((ls, hw, _)) = engine.offsets(&tp) {
                                out.high_watermark = hw;
                                out.last_stable_offset = engine.last_stable_offset(&tp, hw);
                                out.log_start_offset = ls;
                            }
                            out.error_code = errors::code(&e);
                        }
                    }
                    out
                })
                .collect();
            TopicOut { name: a.name.0.clone().into_bytes(), id: a.id, partitions }
        })
        .collect();
    if !ahead.is_empty() {
        let engine = engine.clone();
        tokio::task::spawn_blocking(move || {
            for (tp, offset, max) in ahead {
                engine.read_ahead(&tp, offset, max);
            }
        });
    }
    (topics, total, any_error || more)
}
