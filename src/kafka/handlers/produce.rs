//! Produce: validate each partition's batches, append them through the
//! engine, answer when they are acknowledged (acks=1: written; acks=all:
//! durable under the flush policy; acks=0: no answer at all).
//!
//! Every partition of a request is submitted to the writer before any is
//! awaited, so a request for 16 partitions shares one writer round and one
//! fsync rather than paying for 16.
//!
//! Versions: decoded 3–12 (13 addresses topics by id). 0–2 are advertised,
//! as Kafka 4 does, because older librdkafka keys its compression support
//! off the advertised Produce range; they are answered with
//! UNSUPPORTED_VERSION per partition by a small hand-written codec, since the
//! crate has no codec for them.

use std::collections::HashMap;
use std::sync::Arc;

use bytes::{BufMut, Bytes, BytesMut};
use kafka_protocol::messages::produce_response::{BatchIndexAndErrorMessage, LeaderIdAndEpoch, NodeEndpoint, PartitionProduceResponse, TopicProduceResponse};
pub use kafka_protocol::messages::{ProduceRequest as Request, ProduceResponse as Response};
use kafka_protocol::protocol::VersionRange;
use kafka_protocol::ResponseError;

use super::Route;
use crate::auth::acl::Operation;
use crate::auth::quota::Kind;
use crate::engine::{Ack, EngineError};
use crate::kafka::authz::Check;
use crate::kafka::conn::throttle;
use crate::kafka::{errors, Broker};
use crate::protocol::batch::BatchHeader;
use crate::protocol::header::RequestHeader;

/// Advertised range.
pub const VERSIONS: VersionRange = VersionRange { min: 0, max: 12 };
/// Range decoded and served.
pub const DECODED: VersionRange = VersionRange { min: 3, max: 12 };

pub fn special(_broker: &Arc<Broker>, h: &RequestHeader, body: &Bytes) -> Option<Route> {
    if h.api_version >= DECODED.min {
        return None;
    }
    if h.api_version < 0 {
        return Some(Route::Close("negative produce version".into(), crate::kafka::probe::Closed::Unsupported));
    }
    let Some((acks, topics)) = parse_legacy(body) else {
        return Some(Route::Close("malformed produce v0-2 request".into(), crate::kafka::probe::Closed::BadBody));
    };
    if acks == 0 {
        return Some(Route::Run(Box::pin(async { Some(Vec::new()) })));
    }
    let resp = encode_legacy(h.correlation_id, h.api_version, &topics);
    Some(Route::Run(Box::pin(async move { Some(vec![resp.freeze()]) })))
}

/// acks, then (topic, partitions) of a Produce v0–2 body.
fn parse_legacy(mut b: &[u8]) -> Option<(i16, Vec<(Bytes, Vec<i32>)>)> {
    fn take<'a>(b: &mut &'a [u8], n: usize) -> Option<&'a [u8]> {
        if b.len() < n {
            return None;
        }
        let (head, tail) = b.split_at(n);
        *b = tail;
        Some(head)
    }
    let acks = i16::from_be_bytes(take(&mut b, 2)?.try_into().ok()?);
    take(&mut b, 4)?; // timeout
    let topics = i32::from_be_bytes(take(&mut b, 4)?.try_into().ok()?);
    // Each topic needs at least 6 bytes: a count larger than that is a lie.
    if topics < 0 || topics as usize > b.len() / 6 {
        return None;
    }
    let mut out = Vec::with_capacity(topics as usize);
    for _ in 0..topics {
        let len = i16::from_be_bytes(take(&mut b, 2)?.try_into().ok()?);
        let name = Bytes::copy_from_slice(take(&mut b, usize::try_from(len).ok()?)?);
        let parts = i32::from_be_bytes(take(&mut b, 4)?.try_into().ok()?);
        if parts < 0 || parts as usize > b.len() / 8 {
            return None;
        }
        let mut ps = Vec::with_capacity(parts as usize);
        for _ in 0..parts {
            ps.push(i32::from_be_bytes(take(&mut b, 4)?.try_into().ok()?));
            let size = i32::from_be_bytes(take(&mut b, 4)?.try_into().ok()?);
            if size > 0 {
                take(&mut b, size as usize)?;
            }
        }
        out.push((name, ps));
    }
    // A request is exactly its frame.
    b.is_empty().then_some((acks, out))
}

fn encode_legacy(correlation_id: i32, version: i16, topics: &[(Bytes, Vec<i32>)]) -> BytesMut {
    let mut buf = BytesMut::new();
    buf.put_i32(0);
    buf.put_i32(correlation_id);
    buf.put_i32(topics.len() as i32);
    for (name, parts) in topics {
        buf.put_i16(name.len() as i16);
        buf.put_slice(name);
        buf.put_i32(parts.len() as i32);
        for p in parts {
            buf.put_i32(*p);
            buf.put_i16(ResponseError::UnsupportedVersion.code());
            buf.put_i64(-1);
            if version >= 2 {
                buf.put_i64(-1);
            }
        }
    }
    if version >= 1 {
        buf.put_i32(0);
    }
    let len = (buf.len() - 4) as i32;
    buf[0..4].copy_from_slice(&len.to_be_bytes());
    buf
}

/// Why a topic's partitions are not appended to.
enum Refused {
    TransactionalId,
    Topic,
    Engine(EngineError),
}

impl Refused {
    fn code(&self) -> i16 {
        match self {
            Refused::TransactionalId => ResponseError::TransactionalIdAuthorizationFailed.code(),
            Refused::Topic => ResponseError::TopicAuthorizationFailed.code(),
            Refused::Engine(e) => errors::code(e),
        }
    }
}

/// A partition's refusal: its code, and from v8 its message and the
/// records refused one by one (KIP-467), which clients report per record.
struct Failed {
    code: i16,
    message: Option<String>,
    records: Vec<(i32, String)>,
    /// NOT_LEADER_OR_FOLLOWER's leader hint (KIP-951, v10+).
    leader: Option<crate::kafka::NotLeader>,
}

impl Failed {
    fn not_leader(hint: crate::kafka::NotLeader) -> Failed {
        Failed { code: ResponseError::NotLeaderOrFollower.code(), message: None, records: Vec::new(), leader: Some(hint) }
    }

    fn of(e: &EngineError) -> Failed {
        let code = errors::code(e);
        match e {
            EngineError::RecordsRefused(r) => Failed { code, message: Some(r.message.clone()), records: r.records.clone(), leader: None },
            // What the client sent is wrong: say what.
            EngineError::Corrupt(_) | EngineError::MessageTooLarge { .. } | EngineError::InvalidTopic(_) => Failed { code, message: Some(e.to_string()), records: Vec::new(), leader: None },
            _ => Failed { code, message: None, records: Vec::new(), leader: None },
        }
    }

    fn answer(self, r: PartitionProduceResponse, version: i16) -> PartitionProduceResponse {
        let mut r = r.with_error_code(self.code);
        if let Some(hint) = self.leader.filter(|_| version >= 10) {
            r = r.with_current_leader(LeaderIdAndEpoch::default().with_leader_id(hint.leader.into()).with_leader_epoch(hint.leader_epoch));
        }
        if version < 8 {
            return r;
        }
        let records = self.records.into_iter().map(|(i, why)| BatchIndexAndErrorMessage::default().with_batch_index(i).with_batch_index_error_message(Some(super::str_bytes(why)))).collect();
        r.with_error_message(self.message.map(super::str_bytes)).with_record_errors(records)
    }
}

/// acks=0 requests get no answer at all; one that failed closes the
/// connection (as Kafka does), the only way such a producer learns of it.
pub enum Reply {
    Silent,
    Answer(Response),
}

impl super::IntoReply for Option<Reply> {
    fn into_reply(self, correlation_id: i32, version: i16, throttle_ms: i32) -> Option<Vec<Bytes>> {
        match self? {
            Reply::Silent => Some(Vec::new()),
            Reply::Answer(mut r) => {
                r.throttle_time_ms = throttle_ms;
                super::encode(correlation_id, version, &r)
            }
        }
    }
}

pub async fn handle(broker: &Broker, req: Request, version: i16) -> Option<Reply> {
    debug_assert!(version >= DECODED.min && version <= DECODED.max);
    let acks = req.acks;
    // acks=all in cluster mode waits for the in-sync replicas this long.
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_millis(req.timeout_ms.max(0) as u64);
    // The producer byte rate is charged the request's records; acks=0
    // requests are not charged for their time (as in Kafka).
    let size: usize = req.topic_data.iter().flat_map(|t| &t.partition_data).map(|p| p.records.as_ref().map_or(0, |r| r.len())).sum();
    throttle::charge(Kind::Produce, size);
    if acks == 0 {
        throttle::exempt();
    }
    let ack = match acks {
        0 | 1 => Some(Ack::Written),
        -1 => Some(Ack::Durable),
        _ => None,
    };
    // Submit everything first, then wait: one writer round for the request.
    // Requests of one connection submit in request order.
    // Held until every batch is with the writer: the connection's next
    // Produce starts then.
    let ticket = crate::kafka::conn::take_produce_ticket();
    // Kafka keys a produce by partition: a partition given twice appends
    // only the records of its last occurrence, and is answered once.
    let keys: Vec<(&str, i32)> = req.topic_data.iter().flat_map(|t| t.partition_data.iter().map(move |p| (super::name(&t.name), p.index))).collect();
    let mut last = super::last_occurrences(&keys).into_iter();
    let keep: Vec<Vec<bool>> = req.topic_data.iter().map(|t| t.partition_data.iter().map(|_| last.next().expect("one per partition")).collect()).collect();
    drop(keys);
    let mut pending = Vec::with_capacity(req.topic_data.len());
    let mut allowance = broker.engine.auto_create_allowance();
    // The authorizer, as Kafka asks it: WRITE on the transactional id of a
    // transactional produce, WRITE on each topic; creating a topic on the
    // way needs CREATE (on the cluster or the topic).
    let check = broker.authorizer.enabled().then(|| Check::current(broker));
    // Transactional batches need WRITE on the request's transactional id,
    // and a request without one may not carry them (a producer could
    // otherwise write into another's transaction by its id and epoch).
    let transactional_id = req.transactional_id.as_ref().map(|t| t.0.to_string()).filter(|t| !t.is_empty());
    let txn_denied = check.as_ref().is_some_and(|c| match &transactional_id {
        Some(id) => !c.transactional_id(Operation::Write, id),
        None => req.topic_data.iter().flat_map(|t| &t.partition_data).any(|p| p.records.as_ref().and_then(transactional_producer).is_some()),
    });
    // Every topic is resolved before any batch is submitted: a transaction
    // v2 brings the partitions into its transaction first.
    let mut resolved = Vec::with_capacity(req.topic_data.len());
    for (topic, keep) in req.topic_data.into_iter().zip(keep) {
        if !keep.contains(&true) {
            continue;
        }
        let name = super::name(&topic.name).to_owned();
        let may_create = || check.as_ref().is_none_or(|c| c.cluster(Operation::Create) || c.topic(Operation::Create, &name));
        let found = match crate::engine::topics::validate_name(&name) {
            _ if txn_denied => Err(Refused::TransactionalId),
            _ if check.as_ref().is_some_and(|c| !c.topic(Operation::Write, &name)) => Err(Refused::Topic),
            Err(e) => Err(Refused::Engine(EngineError::InvalidTopic(e))),
            Ok(()) if broker.engine.config().auto_create_topics && broker.engine.topic(&name).is_none() && !may_create() => Err(Refused::Engine(EngineError::UnknownTopicOrPartition)),
            Ok(()) if broker.engine.config().auto_create_topics => {
                let engine = broker.engine.clone();
                let n = name.clone();
                match broker.engine.topic(&name) {
                    Some(t) => Ok(t),
                    None => {
                        let mut a = allowance;
                        let (found, left) = tokio::task::spawn_blocking(move || (engine.topic_or_create(&n, &mut a), a)).await.unwrap_or((Err(EngineError::ShuttingDown), allowance));
                        allowance = left;
                        found.map_err(Refused::Engine)
                    }
                }
            }
            Ok(()) => broker.engine.topic(&name).ok_or(Refused::Engine(EngineError::UnknownTopicOrPartition)),
        };
        let parts: Vec<_> = topic.partition_data.into_iter().zip(keep).filter(|(_, k)| *k).map(|(p, _)| p).collect();
        resolved.push((topic.name, name, found, parts));
    }
    // Cluster mode: a producer id from a block another node took moments
    // ago may not be in this node's view yet. Before validation refuses it
    // as unknown (UNKNOWN_PRODUCER_ID, which costs the client a reset),
    // etcd is asked where the handed-out ids end now (before the view is
    // taken, so the wait does not leave it stale).
    if !broker.cluster.view().single {
        let highest = resolved
            .iter()
            .flat_map(|(.., parts)| parts)
            .filter_map(|p| p.records.as_deref())
            .flat_map(crate::protocol::batch::split)
            .filter_map(|b| b.ok().and_then(|b| BatchHeader::parse(b).ok()))
            .map(|h| h.producer_id)
            .max();
        if highest.is_some_and(|id| id >= broker.engine.catalog().producer_ids_below()) {
            if let Some(end) = broker.cluster.producer_ids_end_now().await {
                broker.engine.catalog().raise_producer_ids_below(end);
            }
        }
    }
    // One view for the request: what joins a transaction and what is
    // appended agree on who leads.
    let view = broker.cluster.view();
    let not_joined = match (&transactional_id, ack) {
        (Some(id), Some(_)) => join_transaction(broker, &view, id, &resolved, version).await,
        _ => HashMap::new(),
    };
    // Leaders named in NOT_LEADER_OR_FOLLOWER answers (their endpoints go
    // in the response, v10+).
    let mut moved = std::collections::BTreeSet::new();
    for (i, (topic_name, name, found, parts)) in resolved.into_iter().enumerate() {
        let mut out = Vec::with_capacity(parts.len());
        for (j, p) in parts.into_iter().enumerate() {
            let led = found.as_ref().ok().filter(|t| p.index >= 0 && p.index < t.partitions()).map(|_| broker.lead(&view, &name, p.index));
            let elsewhere = led.and_then(Result::err);
            // acks=all in cluster mode: answered once the in-sync replicas
            // have it, in the epoch it was appended in.
            let replicated = match (&found, led) {
                (Ok(t), Some(Ok(epoch))) if ack == Some(Ack::Durable) && !view.single => Some((t.clone(), epoch)),
                _ => None,
            };
            let submitted = match (&found, ack) {
                (_, None) => Err(None),
                (Err(Refused::Engine(e)), _) => Err(Some(Failed::of(e))),
                (Err(e), _) => Err(Some(Failed { code: e.code(), message: None, records: Vec::new(), leader: None })),
                (Ok(_), Some(_)) if elsewhere.is_some() => {
                    let hint = elsewhere.unwrap_or(crate::kafka::NotLeader { leader: -1, leader_epoch: -1 });
                    moved.insert(hint.leader);
                    Err(Some(Failed::not_leader(hint)))
                }
                (Ok(_), _) if not_joined.contains_key(&(i, j)) => Err(Some(Failed { code: not_joined[&(i, j)], message: None, records: Vec::new(), leader: None })),
                (Ok(t), Some(Ack::Durable)) if p.index >= 0 && p.index < t.partitions() && !crate::kafka::replication::Replication::enough_replicas(&view, t, p.index) => {
                    Err(Some(Failed { code: ResponseError::NotEnoughReplicas.code(), message: Some(format!("fewer in-sync replicas than min.insync.replicas ({})", t.config.min_insync_replicas)), records: Vec::new(), leader: None }))
                }
                (Ok(t), Some(ack)) => {
                    let records = p.records.unwrap_or_default();
                    broker.engine.submit(t, p.index, records, ack).await.map_err(|e| Some(Failed::of(&e)))
                }
            };
            out.push((p.index, submitted, replicated));
        }
        pending.push((topic_name, out));
    }
    drop(ticket);
    let mut responses = Vec::with_capacity(pending.len());
    for (name, parts) in pending {
        let mut partition_responses = Vec::with_capacity(parts.len());
        for (index, submitted, replicated) in parts {
            let mut r = PartitionProduceResponse::default().with_index(index).with_base_offset(-1).with_log_append_time_ms(-1).with_log_start_offset(-1);
            match submitted {
                Err(None) => r = r.with_error_code(ResponseError::InvalidRequiredAcks.code()),
                Err(Some(failed)) => r = failed.answer(r, version),
                Ok(wait) => match wait.wait().await {
                    // The fence is checked when the answer goes out, not only
                    // when the request came in: a node paused past its lease
                    // (or cut off from etcd) may have been replaced meanwhile.
                    Ok(_) if !broker.cluster.in_good_standing() => r = Failed::not_leader(crate::kafka::NotLeader { leader: -1, leader_epoch: -1 }).answer(r, version),
                    Ok(a) if replicated.is_some() && a.last_offset >= 0 => {
                        let (topic, epoch) = replicated.as_ref().expect("checked");
                        match broker.replication.replicated(broker, topic, index, *epoch, a.last_offset + 1, deadline).await {
                            Ok(()) => {
                                r = r.with_base_offset(a.base_offset).with_log_append_time_ms(a.log_append_time);
                                if version >= 5 {
                                    r = r.with_log_start_offset(a.log_start);
                                }
                            }
                            Err(code) if code == ResponseError::NotLeaderOrFollower.code() => r = Failed::not_leader(crate::kafka::NotLeader { leader: -1, leader_epoch: -1 }).answer(r, version),
                            Err(code) => r = Failed { code, message: None, records: Vec::new(), leader: None }.answer(r, version),
                        }
                    }
                    Ok(a) => {
                        r = r.with_base_offset(a.base_offset).with_log_append_time_ms(a.log_append_time);
                        if version >= 5 {
                            r = r.with_log_start_offset(a.log_start);
                        }
                    }
                    Err(e) => r = Failed::of(&e).answer(r, version),
                },
            }
            // Java's producer retries UNKNOWN_PRODUCER_ID until the answer
            // names the partition's log start (KIP-360), and only then
            // starts its sequences over; Kafka's answer carries it.
            if r.error_code == ResponseError::UnknownProducerId.code() && version >= 5 {
                if let Some((start, ..)) = broker.engine.topic(&name.0).and_then(|t| broker.engine.offsets(&t.tp(index))) {
                    r = r.with_log_start_offset(start);
                }
            }
            partition_responses.push(r);
        }
        responses.push(TopicProduceResponse::default().with_name(name).with_partition_responses(partition_responses));
    }
    for p in responses.iter().flat_map(|t| &t.partition_responses) {
        broker.probe.error(kafka_protocol::messages::ApiKey::Produce, p.error_code);
    }
    if acks == 0 {
        let failed = responses.iter().flat_map(|t| &t.partition_responses).any(|p| p.error_code != 0);
        return if failed { None } else { Some(Reply::Silent) };
    }
    let mut resp = Response::default().with_responses(responses);
    if version >= 10 {
        resp = resp.with_node_endpoints(
            broker
                .brokers_in(&view)
                .into_iter()
                .filter(|b| moved.contains(&b.id))
                .map(|b| NodeEndpoint::default().with_node_id(b.id.into()).with_host(super::str_bytes(b.host)).with_port(b.port).with_rack(b.rack.map(super::str_bytes)))
                .collect(),
        );
    }
    Some(Reply::Answer(resp))
}

/// The producer id and epoch of the first transactional batch in `records`.
fn transactional_producer(records: &Bytes) -> Option<(i64, i16)> {
    crate::protocol::batch::split(records).filter_map(|b| b.ok().and_then(|b| BatchHeader::parse(b).ok())).find(|h| h.is_transactional()).map(|h| (h.producer_id, h.producer_epoch))
}

/// The partitions this request writes transactional batches to, that
/// their transaction has not let in here yet, are asked for at its
/// coordinator, as Kafka's partition leader asks before it appends
/// (KIP-890): under transactions v2 (Produce v12+) they join the
/// transaction; before, the producer added them itself (AddPartitionsToTxn)
/// and the coordinator is asked whether it did. A coordinator on this node
/// is asked directly (before v12 its additions let the batches in
/// already); one on another node by AddPartitionsToTxn v5 over the
/// inter-broker link, and what it lets in is remembered here until the
/// transaction's marker. Only partitions not let in yet are asked for, so a
/// transaction costs the coordinator one call per partition it touches.
/// Returns the code for each (topic, partition) position that did not join.
async fn join_transaction(broker: &Broker, view: &crate::cluster::ClusterView, id: &str, resolved: &[Resolved], version: i16) -> HashMap<(usize, usize), i16> {
    // Per (producer id, epoch): each partition's position and name.
    type Positions = Vec<((usize, usize), (String, i32))>;
    let mut wanted: HashMap<(i64, i16), Positions> = HashMap::new();
    for (i, (_, name, found, parts)) in resolved.iter().enumerate() {
        let Ok(topic) = found else { continue };
        for (j, p) in parts.iter().enumerate() {
            let Some((pid, epoch)) = p.records.as_ref().and_then(transactional_producer) else { continue };
            // A partition the topic lacks, or another node leads, is
            // refused by the append itself: it does not join.
            if p.index < 0 || p.index >= topic.partitions() || broker.lead(view, name, p.index).is_err() || broker.engine.txn_admits(pid, epoch, &topic.tp(p.index)) {
                continue;
            }
            wanted.entry((pid, epoch)).or_default().push(((i, j), (name.clone(), p.index)));
        }
    }
    let mut refused = HashMap::new();
    if wanted.is_empty() {
        return refused;
    }
    if !broker.coordinates(id) {
        // Cluster mode: the transaction's coordinator is another node.
        for ((pid, epoch), parts) in wanted {
            let names: Vec<(String, i32)> = parts.iter().map(|(_, w)| w.clone()).collect();
            // Guards first (KIP-890): a marker for the producer that
            // reaches a partition while the answer travels removes its
            // guard, and the partition is not added.
            let guards: Vec<Option<(crate::storage::Tp, u64)>> = names.iter().map(|(name, p)| broker.engine.topic(name).map(|t| (t.tp(*p), broker.engine.begin_txn_verification(pid, t.tp(*p))))).collect();
            let codes = ask_coordinator(broker, view, id, pid, epoch, version < 12, &names).await;
            for (((at, _), code), guard) in parts.into_iter().zip(codes).zip(guards) {
                match guard {
                    _ if code != 0 => {
                        if let Some((tp, guard)) = guard {
                            broker.engine.release_txn_verification(pid, tp, guard);
                        }
                        refused.insert(at, produce_code(code));
                    }
                    // The transaction ended meanwhile: this batch is late.
                    Some((tp, guard)) if !broker.engine.add_verified_txn_partition(pid, epoch, tp, guard) => {
                        refused.insert(at, ResponseError::InvalidTxnState.code());
                    }
                    // Added, or the topic is gone (the append refuses it).
                    _ => {}
                }
            }
        }
        return refused;
    }
    if version < 12 {
        // The coordinator here let in what the producer added.
        return refused;
    }
    for ((pid, epoch), parts) in wanted {
        let names: Vec<(String, i32)> = parts.iter().map(|(_, w)| w.clone()).collect();
        let codes = broker.transactions.add_produced(id, pid, epoch, &names).await;
        refused.extend(parts.into_iter().zip(codes).filter(|(_, c)| *c != 0).map(|((at, _), c)| (at, produce_code(c))));
    }
    refused
}

/// Asks the coordinator of transactional id `id` (another node) whether
/// (`verify_only`) or that (`pid`, `epoch`)'s transaction has `parts`:
/// AddPartitionsToTxn v5, the brokers' batched form. A code per part, in
/// order; no coordinator or no answer is COORDINATOR_NOT_AVAILABLE for
/// all (retriable).
pub(crate) async fn ask_coordinator(broker: &Broker, view: &crate::cluster::ClusterView, id: &str, pid: i64, epoch: i16, verify_only: bool, parts: &[(String, i32)]) -> Vec<i16> {
    use kafka_protocol::messages::add_partitions_to_txn_request::{AddPartitionsToTxnTopic, AddPartitionsToTxnTransaction};
    use kafka_protocol::messages::{AddPartitionsToTxnRequest, ProducerId, TransactionalId};
    let unavailable = || vec![ResponseError::CoordinatorNotAvailable.code(); parts.len()];
    let (Ok(coordinator), Some(peers)) = (view.coordinator(broker.node_id(), id), broker.peers.get()) else { return unavailable() };
    let named = || parts.iter().map(|(name, p)| (name.as_str(), *p));
    let topics = crate::protocol::txn::by_topic(named()).into_iter().map(|(name, ps)| AddPartitionsToTxnTopic::default().with_name(super::topic_name(name)).with_partitions(ps)).collect();
    let req = AddPartitionsToTxnRequest::default().with_transactions(vec![AddPartitionsToTxnTransaction::default()
        .with_transactional_id(TransactionalId(super::str_bytes(id.to_owned())))
        .with_producer_id(ProducerId(pid))
        .with_producer_epoch(epoch)
        .with_verify_only(verify_only)
        .with_topics(topics)]);
    let answer = match peers.call(coordinator, crate::kafka::replication::peers::Lane::Coordinator, kafka_protocol::messages::ApiKey::AddPartitionsToTxn, crate::protocol::txn::ADD_PARTITIONS_VERSION, &req).await {
        Ok(body) => crate::protocol::txn::decode_add_partitions(&body),
        Err(e) => {
            tracing::debug!(transactional_id = id, error = %e, "asking a transaction's coordinator failed");
            return unavailable();
        }
    };
    let answer = match answer {
        Ok(a) => a,
        Err(e) => {
            tracing::warn!(transactional_id = id, coordinator, error = %e, "a transaction coordinator's answer does not decode");
            return unavailable();
        }
    };
    if answer.error_code != 0 {
        return vec![answer.error_code; parts.len()];
    }
    answer.codes(id, named()).into_iter().map(|c| c.unwrap_or(ResponseError::CoordinatorNotAvailable.code())).collect()
}

/// What a producer is answered when its partition could not join the
/// transaction, as Kafka's leader translates its coordinator's answer: a
/// fenced producer gets INVALID_PRODUCER_EPOCH, which producers expect on
/// Produce; a coordinator that is busy or away gets NOT_ENOUGH_REPLICAS,
/// which every producer retries without a metadata refresh.
fn produce_code(code: i16) -> i16 {
    use ResponseError as E;
    match ResponseError::try_from_code(code) {
        Some(E::ProducerFenced) => E::InvalidProducerEpoch.code(),
        Some(E::ConcurrentTransactions | E::CoordinatorNotAvailable | E::NotCoordinator | E::CoordinatorLoadInProgress | E::NetworkException | E::OperationNotAttempted) => E::NotEnoughReplicas.code(),
        _ => code,
    }
}

/// A request's topic, resolved: its wire name, name, topic (or why not),
/// and the partitions kept.
type Resolved = (kafka_protocol::messages::TopicName, String, Result<Arc<crate::engine::Topic>, Refused>, Vec<kafka_protocol::messages::produce_request::PartitionProduceData>);

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Buf;

    #[test]
    fn legacy_parse_rejects_lies_and_truncation() {
        let mut ok = Vec::new();
        ok.extend_from_slice(&1i16.to_be_bytes());
        ok.extend_from_slice(&1000i32.to_be_bytes());
        ok.extend_from_slice(&1i32.to_be_bytes());
        ok.extend_from_slice(&1i16.to_be_bytes());
        ok.push(b't');
        ok.extend_from_slice(&1i32.to_be_bytes());
        ok.extend_from_slice(&0i32.to_be_bytes());
        ok.extend_from_slice(&3i32.to_be_bytes());
        ok.extend_from_slice(b"abc");
        let (acks, topics) = parse_legacy(&ok).unwrap();
        assert_eq!(acks, 1);
        assert_eq!(topics, vec![(Bytes::from_static(b"t"), vec![0])]);
        for cut in 0..ok.len() {
            assert!(parse_legacy(&ok[..cut]).is_none(), "prefix {cut}");
        }
        let mut long = ok.clone();
        long.push(0);
        assert!(parse_legacy(&long).is_none(), "trailing bytes");
        let mut lie = ok.clone();
        lie[6..10].copy_from_slice(&i32::MAX.to_be_bytes());
        assert!(parse_legacy(&lie).is_none());
        let resp = encode_legacy(9, 2, &topics);
        let mut r = &resp[..];
        assert_eq!(r.get_i32() as usize, resp.len() - 4);
        assert_eq!(r.get_i32(), 9);
    }
}
