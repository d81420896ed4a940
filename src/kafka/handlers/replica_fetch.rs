//! Fetch from a follower replica (cluster mode: a replica id of 0 or
//! more; docs/cluster.md, "Replication protocol"). Unlike a consumer's,
//! it reads up to the log end, not the high watermark, since what
//! followers have is what moves the high watermark; it records the
//! follower's position (its fetch offset) and raises the hw; and it
//! answers `DivergingEpoch` when the follower's last fetched epoch says
//! its log left the leader's (KIP-595's check, as Kafka's replica fetcher
//! uses since 2.7). No fetch sessions: a follower asks for every tp it
//! follows here each round (a known cost; docs/cluster.md).
//!
//! Kafka asks CLUSTER_ACTION on the cluster of the principal; the fetch
//! must name a replica of each tp's unit. Besides, it is taken only on the
//! inter-broker listener (`inter_broker_listener_name`):
//! CLUSTER_AUTHORIZATION_FAILED on any other, authorizer or not.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use kafka_protocol::ResponseError;
use tokio::sync::Notify;

use super::fetch::{Reply, Request};
use crate::auth::acl::Operation;
use crate::cluster::topics::unit_of;
use crate::engine::Topic;
use crate::kafka::authz::Check;
use crate::kafka::{errors, Broker};
use crate::protocol::fetch::{PartitionOut, TopicOut};

/// The follower's id, if `req` comes from one (v15+ carries it in
/// `ReplicaState`).
pub fn replica_of(req: &Request, version: i16) -> Option<i32> {
    let id = if version >= 15 { req.replica_state.replica_id.0 } else { req.replica_id.0 };
    (id >= 0).then_some(id)
}

/// Each asked topic: its name (up to v12), its id, its partitions.
type Asked = Vec<(Bytes, [u8; 16], Vec<Want>)>;

struct Want {
    partition: i32,
    topic: Option<Arc<Topic>>,
    fetch_offset: i64,
    last_fetched_epoch: i32,
    current_leader_epoch: i32,
    max_bytes: usize,
}

pub async fn handle(broker: &Broker, req: Request, version: i16, replica: i32) -> Option<Reply> {
    // Only on the listener brokers use between them: one open to clients
    // must not let a client pose as a replica and move the high watermark.
    let listener = crate::kafka::conn::session().listener.name.clone();
    if listener != broker.cfg.inter_broker.listener {
        tracing::debug!(replica, %listener, "a replica fetch on a listener that is not the inter-broker one; refused");
        return Some(Reply::new(ResponseError::ClusterAuthorizationFailed.code(), Vec::new()));
    }
    if broker.authorizer.enabled() && !Check::current(broker).cluster(Operation::ClusterAction) {
        return Some(Reply::new(ResponseError::ClusterAuthorizationFailed.code(), Vec::new()));
    }
    let by_id = version >= 13;
    let wait = Duration::from_millis(req.max_wait_ms.max(0) as u64).min(broker.cfg.max_fetch_wait);
    let deadline = tokio::time::Instant::now() + wait;
    let max_bytes = (req.max_bytes.max(0) as usize).min(broker.cfg.fetch_max_bytes);
    let asked: Asked = req
        .topics
        .into_iter()
        .map(|t| {
            let topic = if by_id { broker.engine.topic_by_id(t.topic_id.as_bytes()) } else { broker.engine.topic(super::name(&t.topic)) };
            let name = if by_id { Bytes::new() } else { t.topic.0.clone().into_bytes() };
            let wants = t
                .partitions
                .iter()
                .map(|p| Want {
                    partition: p.partition,
                    topic: topic.clone(),
                    fetch_offset: p.fetch_offset,
                    last_fetched_epoch: if version >= 12 { p.last_fetched_epoch } else { -1 },
                    current_leader_epoch: p.current_leader_epoch,
                    max_bytes: (p.partition_max_bytes.max(0) as usize).min(max_bytes),
                })
                .collect();
            (name, *t.topic_id.as_bytes(), wants)
        })
        .collect();
    let asked = Arc::new(asked);
    let tps: Vec<_> = asked.iter().flat_map(|(_, _, w)| w.iter().filter_map(|w| w.topic.as_ref().filter(|t| w.partition >= 0 && w.partition < t.partitions()).map(|t| t.tp(w.partition)))).collect();
    let notify = Arc::new(Notify::new());
    let mut stopping = broker.stopping.clone();
    let _registration = (!wait.is_zero()).then(|| broker.engine.subscribe_replica(tps, &notify));
    loop {
        let (topics, bytes, errors) = read_all(broker, &asked, replica, max_bytes, by_id).await?;
        if bytes > 0 || errors || tokio::time::Instant::now() >= deadline || *stopping.borrow() {
            return Some(Reply::new(0, topics));
        }
        tokio::select! {
            _ = notify.notified() => {}
            _ = tokio::time::sleep_until(deadline) => {}
            _ = stopping.wait_for(|s| *s) => {}
        }
    }
}

/// One pass over the asked tps: (the answer, record bytes, whether any
/// partition carries an error).
async fn read_all(broker: &Broker, asked: &Arc<Asked>, replica: i32, max_bytes: usize, by_id: bool) -> Option<(Vec<TopicOut>, usize, bool)> {
    let view = broker.cluster.view();
    let now = broker.engine.now_ms();
    // Positions are kept per registration of the follower; an unregistered
    // one follows nothing.
    let incarnation = view.nodes.get(&replica).map(|n| n.incarnation);
    let mut total = 0usize;
    let mut any_error = false;
    let mut out = Vec::with_capacity(asked.len());
    for (name, id, wants) in asked.iter() {
        let mut partitions = Vec::with_capacity(wants.len());
        for w in wants {
            let mut p = PartitionOut { partition: w.partition, high_watermark: -1, last_stable_offset: -1, log_start_offset: -1, ..PartitionOut::default() };
            let Some(topic) = w.topic.as_ref().filter(|t| w.partition >= 0 && w.partition < t.partitions()) else {
                p.error_code = if by_id && w.topic.is_none() { ResponseError::UnknownTopicId.code() } else { ResponseError::UnknownTopicOrPartition.code() };
                any_error = true;
                partitions.push(p);
                continue;
            };
            let tp = topic.tp(w.partition);
            let refused = match broker.lead(&view, topic.name(), w.partition) {
                Err(hint) => Some((ResponseError::NotLeaderOrFollower.code(), Some((hint.leader, hint.leader_epoch)))),
                Ok(epoch) => match crate::kafka::epoch_error(w.current_leader_epoch, epoch) {
                    Some(code) => Some((code, None)),
                    // Only a replica of the unit follows it.
                    None if incarnation.is_none() || !view.units.get(&unit_of(topic.name(), w.partition)).is_some_and(|u| u.replicas.contains(&replica)) => Some((ResponseError::NotLeaderOrFollower.code(), None)),
                    None => None,
                },
            };
            if let Some((code, leader)) = refused {
                (p.error_code, p.current_leader) = (code, leader);
                any_error = true;
                partitions.push(p);
                continue;
            }
            let offsets = broker.engine.offsets(&tp);
            // The follower's log left this one's in its last epoch: say
            // where this one's ends for that epoch, and send nothing.
            if w.last_fetched_epoch >= 0 {
                if let Some((epoch, end)) = broker.engine.end_offset_for(&tp, w.last_fetched_epoch) {
                    if epoch < w.last_fetched_epoch || end < w.fetch_offset {
                        if let Some((ls, hw, _)) = offsets {
                            (p.log_start_offset, p.high_watermark, p.last_stable_offset) = (ls, hw, hw);
                        }
                        p.diverging_epoch = Some((epoch, end));
                        partitions.push(p);
                        // Answered now: the follower has a cut to make.
                        any_error = true;
                        continue;
                    }
                }
            }
            let Some((_, _, end)) = offsets else {
                p.error_code = ResponseError::UnknownTopicOrPartition.code();
                any_error = true;
                partitions.push(p);
                continue;
            };
            if w.fetch_offset <= end {
                broker.replication.fetched(replica, incarnation.unwrap_or(-1), &tp, w.fetch_offset, end, now);
                broker.replication.advance(broker, &view, &tp);
            }
            let room = max_bytes.saturating_sub(total).min(w.max_bytes);
            let engine = broker.engine.clone();
            // Only the answer's first batch may go past the room (Kafka's
            // rule), so an answer stays near what the follower asked.
            let (offset, read_room, min_one) = (w.fetch_offset, room.max(1), total == 0);
            let read = if room == 0 && total > 0 { None } else { Some(tokio::task::spawn_blocking(move || engine.read_for_replica(&tp, offset, read_room, min_one)).await.ok()?) };
            match read {
                None => {
                    if let Some((ls, hw, _)) = broker.engine.offsets(&tp) {
                        (p.log_start_offset, p.high_watermark, p.last_stable_offset) = (ls, hw, hw);
                    }
                }
                Some(Ok(r)) => {
                    total += r.len();
                    (p.log_start_offset, p.high_watermark, p.last_stable_offset) = (r.log_start, broker.engine.offsets(&tp).map_or(r.high_watermark, |o| o.1), r.high_watermark);
                    p.records = r.records;
                }
                Some(Err(e)) => {
                    if let Some((ls, hw, _)) = broker.engine.offsets(&tp) {
                        (p.log_start_offset, p.high_watermark, p.last_stable_offset) = (ls, hw, hw);
                    }
                    p.error_code = errors::code(&e);
                    any_error = true;
                }
            }
            partitions.push(p);
        }
        out.push(TopicOut { name: name.clone(), id: *id, partitions });
    }
    Some((out, total, any_error))
}
