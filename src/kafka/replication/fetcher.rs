//! A follower's fetcher: one task per leader this node follows tps from,
//! on one connection to the leader's inter-broker listener (TLS with both
//! sides' certificates when it is SSL). Each round asks for
//! every followed tp from its log end with the epoch of its last batch
//! (`LastFetchedEpoch`, so the leader can say where the logs diverge),
//! appends what comes back at the leader's offsets and waits until it is
//! durable before asking for more: the fetch offset is the follower's only
//! report of progress, and the leader counts it towards the high
//! watermark (docs/cluster.md, "Durability"). A tp whose leader's log
//! starts past this replica's end starts over at the leader's log start,
//! and every tp's log start follows its leader's once the hw reaches it.
//!
//! The answer comes from the network: it is decoded by
//! `protocol::fetch::decode_response`, which checks every count and length
//! against the bytes present before allocating.

use std::time::Duration;

use bytes::{BufMut, Bytes, BytesMut};
use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
use kafka_protocol::messages::{BrokerId, FetchRequest, RequestHeader};
use kafka_protocol::protocol::{Encodable, StrBytes};
use kafka_protocol::ResponseError;
use std::sync::Arc;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::watch;

use super::Followed;
use crate::engine::Ack;
use crate::kafka::Broker;
use crate::protocol::fetch::{decode_response, PartitionIn};

/// Fetch v14: topics by id, `LastFetchedEpoch` and `DivergingEpoch`, the
/// replica id in the body (v15 moves it into a tagged `ReplicaState`).
const VERSION: i16 = 14;
/// How long the leader may hold a fetch with nothing new.
const MAX_WAIT_MS: i32 = 500;
const MAX_BYTES: i32 = 32 << 20;
const PARTITION_MAX_BYTES: i32 = 8 << 20;
const BACKOFF: Duration = Duration::from_millis(200);

/// Fetches from `leader` for as long as this node follows any tp there.
pub async fn run(broker: Arc<Broker>, leader: i32, mut follows: watch::Receiver<u64>) {
    let mut conn: Option<super::peers::Conn> = None;
    let mut correlation = 0i32;
    // Why the last connection failed: a new reason is a warning, the
    // same one again (every backoff) is not.
    let mut failing: Option<String> = None;
    loop {
        let tps = broker.replication.followed_from(leader);
        if tps.is_empty() {
            return;
        }
        follows.borrow_and_update();
        if conn.is_none() {
            match super::peers::connect(&broker, leader).await {
                Ok(c) => {
                    failing = None;
                    conn = Some(c);
                }
                Err(why) => {
                    if failing.as_ref() != Some(&why) {
                        tracing::warn!(leader, %why, "cannot reach the leader to fetch from it; retrying");
                        failing = Some(why);
                    }
                    pause(&mut follows).await;
                    continue;
                }
            }
        }
        correlation = correlation.wrapping_add(1);
        let stream = conn.as_mut().expect("connected");
        let answer = match tokio::time::timeout(Duration::from_millis(MAX_WAIT_MS as u64) + Duration::from_secs(10), round_trip(stream, &broker, correlation, &tps)).await {
            Ok(Ok(a)) => a,
            Ok(Err(why)) => {
                tracing::debug!(leader, %why, "fetching from the leader failed; reconnecting");
                conn = None;
                pause(&mut follows).await;
                continue;
            }
            Err(_) => {
                tracing::debug!(leader, "the leader did not answer a fetch in time; reconnecting");
                conn = None;
                continue;
            }
        };
        if !apply(&broker, leader, &tps, answer).await {
            pause(&mut follows).await;
        }
    }
}

/// Waits a little, or until what this node follows changes.
async fn pause(follows: &mut watch::Receiver<u64>) {
    tokio::select! {
        _ = tokio::time::sleep(BACKOFF) => {}
        _ = follows.changed() => {}
    }
}

/// What one fetch asked for each tp, to match the answer against.
struct Asked {
    id: [u8; 16],
    partition: i32,
}

async fn round_trip(stream: &mut super::peers::Conn, broker: &Broker, correlation: i32, tps: &[Followed]) -> Result<(Vec<Asked>, Vec<(Asked, PartitionIn)>), String> {
    let mut topics: Vec<FetchTopic> = Vec::new();
    let mut asked = Vec::with_capacity(tps.len());
    for f in tps {
        let tp = f.topic.tp(f.partition);
        let Some((log_start, _, end)) = broker.engine.offsets(&tp) else { continue };
        let (from, last_epoch) = broker.replication.fetch_from(&broker.engine, &tp, end);
        let p = FetchPartition::default()
            .with_partition(f.partition)
            .with_current_leader_epoch(f.leader_epoch)
            .with_fetch_offset(from)
            .with_last_fetched_epoch(last_epoch)
            .with_log_start_offset(log_start)
            .with_partition_max_bytes(PARTITION_MAX_BYTES);
        let id = uuid::Uuid::from_bytes(f.topic.id());
        match topics.iter_mut().find(|t| t.topic_id == id) {
            Some(t) => t.partitions.push(p),
            None => topics.push(FetchTopic::default().with_topic_id(id).with_partitions(vec![p])),
        }
        asked.push(Asked { id: f.topic.id(), partition: f.partition });
    }
    let req = FetchRequest::default()
        .with_replica_id(BrokerId(broker.node_id()))
        .with_max_wait_ms(MAX_WAIT_MS)
        .with_min_bytes(1)
        .with_max_bytes(MAX_BYTES)
        .with_session_id(0)
        .with_session_epoch(-1)
        .with_topics(topics);
    let header = RequestHeader::default()
        .with_request_api_key(kafka_protocol::messages::ApiKey::Fetch as i16)
        .with_request_api_version(VERSION)
        .with_correlation_id(correlation)
        .with_client_id(Some(StrBytes::from_string(format!("canopy-replica-{}", broker.node_id()))));
    let mut buf = BytesMut::with_capacity(256);
    buf.put_i32(0);
    header.encode(&mut buf, 2).map_err(|e| e.to_string())?;
    req.encode(&mut buf, VERSION).map_err(|e| e.to_string())?;
    let len = (buf.len() - 4) as i32;
    buf[..4].copy_from_slice(&len.to_be_bytes());
    stream.write_all(&buf).await.map_err(|e| e.to_string())?;
    stream.flush().await.map_err(|e| e.to_string())?;
    let len = stream.read_i32().await.map_err(|e| e.to_string())?;
    // The asked bytes, plus the one batch an answer may carry past them
    // (no batch is larger than a request), plus headers.
    let max_frame = MAX_BYTES as usize + broker.cfg.max_request_bytes + (1 << 20);
    let len = usize::try_from(len).ok().filter(|l| *l <= max_frame).ok_or_else(|| format!("an answer of {len} bytes"))?;
    let mut body = vec![0; len];
    stream.read_exact(&mut body).await.map_err(|e| e.to_string())?;
    let answer = decode_response(VERSION, &Bytes::from(body)).map_err(|e| format!("the answer does not decode: {e}"))?;
    if answer.correlation_id != correlation {
        return Err(format!("answer {} to request {correlation}", answer.correlation_id));
    }
    if answer.error_code != 0 {
        return Err(format!("the leader refused the fetch with error {}", answer.error_code));
    }
    // Matched by (topic id, partition): an answer for something not
    // asked is dropped.
    let mut got = Vec::new();
    for t in answer.topics {
        for p in t.partitions {
            if asked.iter().any(|a| a.id == t.id && a.partition == p.partition) {
                got.push((Asked { id: t.id, partition: p.partition }, p));
            }
        }
    }
    Ok((asked, got))
}

/// Takes one answer in: copies appended (all submitted, then waited for:
/// one writer round and one fsync), divergent tails cut, hws taken from
/// the leader. Returns whether the round went well (else the fetcher
/// pauses before the next).
async fn apply(broker: &Broker, leader: i32, tps: &[Followed], (_, got): (Vec<Asked>, Vec<(Asked, PartitionIn)>)) -> bool {
    let mut fine = true;
    let mut pending = Vec::new();
    for (a, p) in got {
        let Some(f) = tps.iter().find(|f| f.topic.id() == a.id && f.partition == a.partition) else { continue };
        let tp = f.topic.tp(f.partition);
        // The role may have changed while the fetch was out (this node
        // may lead now): nothing is cut or appended for an old one.
        if !broker.replication.follows(&tp, leader, f.leader_epoch) {
            continue;
        }
        if let Some((epoch, end)) = p.diverging_epoch.filter(|(e, end)| *e >= 0 && *end >= 0) {
            // Kafka's follower: cut where its own log leaves the leader's
            // for that epoch.
            let (mine, my_end) = broker.engine.end_offset_for(&tp, epoch).unwrap_or((-1, 0));
            let at = if mine == epoch { end.min(my_end) } else { my_end };
            match broker.engine.truncate(tp, at).await {
                Ok(cut) => tracing::info!(topic = f.topic.name(), partition = f.partition, leader, epoch, at = cut, "divergent tail cut"),
                Err(e) => {
                    tracing::warn!(topic = f.topic.name(), partition = f.partition, error = %e, "cutting a divergent tail failed; trying again");
                    fine = false;
                }
            }
            continue;
        }
        if p.error_code != 0 {
            let (start, end) = broker.engine.offsets(&tp).map_or((0, 0), |o| (o.0, o.2));
            if p.error_code == ResponseError::OffsetOutOfRange.code() && p.log_start_offset > end {
                // The leader's log starts past this replica's end (its
                // retention, DeleteRecords, or a new replica): start over
                // there, as Kafka's follower does; what lies below is gone
                // at the leader, so no consumer can read it there either.
                // What this replica has goes first (Kafka empties the log),
                // and with it the producer and transaction state it held
                // (a transaction open here whose marker the leader no
                // longer has would hold read_committed readers for ever).
                if start < end {
                    match broker.engine.truncate(tp, start).await {
                        Ok(_) => tracing::info!(topic = f.topic.name(), partition = f.partition, from = start, to = end, "this replica's records, all below its leader's log start, cut"),
                        // Not cuttable (into subtree stores, or through the
                        // batch holding the log start): started over beside
                        // them; the log start then hides them.
                        Err(e @ crate::engine::EngineError::Storage(crate::storage::StorageError::Misplaced(_))) => tracing::warn!(topic = f.topic.name(), partition = f.partition, error = %e, "cutting this replica's records below its leader's log start failed; starting over beside them"),
                        // Anything else (busy with compaction or retention,
                        // the hw checkpoint not written): the next round.
                        Err(e) => {
                            tracing::debug!(topic = f.topic.name(), partition = f.partition, error = %e, "cutting this replica's records below its leader's log start: trying again");
                            fine = false;
                            continue;
                        }
                    }
                }
                if broker.replication.start_over(tp, p.log_start_offset) {
                    tracing::info!(topic = f.topic.name(), partition = f.partition, leader, end, log_start = p.log_start_offset, "the leader's log starts past this replica's end: starting over at the leader's log start");
                }
            } else if p.error_code == ResponseError::OffsetOutOfRange.code() {
                broker.replication.lagged(&broker.engine, tp, p.high_watermark);
                // Past the leader's end with no divergence said: nothing
                // this replica can do but wait (once a minute, said).
                if broker.replication.warn_out_of_range(&tp, broker.engine.now_ms()) {
                    tracing::warn!(topic = f.topic.name(), partition = f.partition, leader, end, log_start = p.log_start_offset, hw = p.high_watermark, "the leader refused this replica's fetch offset as out of range");
                }
            } else {
                tracing::debug!(topic = f.topic.name(), partition = f.partition, leader, code = p.error_code, "the leader refused a partition");
                fine = false;
            }
            continue;
        }
        if !p.records.is_empty() {
            match broker.engine.replicate(tp, p.records, Ack::Durable).await {
                Ok(w) => pending.push((tp, f, w, p.high_watermark, p.log_start_offset)),
                Err(e) => {
                    tracing::warn!(topic = f.topic.name(), partition = f.partition, error = %e, "a leader's copy was refused");
                    fine = false;
                }
            }
        } else {
            broker.engine.limit_hw(&tp, p.high_watermark);
            broker.replication.lagged(&broker.engine, tp, p.high_watermark);
            follow_log_start(broker, f, p.log_start_offset).await;
        }
    }
    for (tp, f, w, hw, log_start) in pending {
        match w.wait().await {
            Ok(_) => {
                broker.engine.limit_hw(&tp, hw);
                broker.replication.lagged(&broker.engine, tp, hw);
                follow_log_start(broker, f, log_start).await;
            }
            Err(e) => {
                tracing::warn!(topic = f.topic.name(), partition = f.partition, error = %e, "appending a leader's copy failed");
                fine = false;
            }
        }
    }
    fine
}

/// Raises followed `f`'s log start to its leader's `leader_start` (Kafka's
/// follower does the same with every fetch), once this replica's hw has
/// reached it: records the leader deleted (DeleteRecords, its retention,
/// or never copied here by a replica that started over) are gone here
/// too, so a consumer of a later leader does not find them again. Only
/// where records may be deleted (`cleanup.policy` has `delete`); a failure
/// is tried again at the next fetch.
async fn follow_log_start(broker: &Broker, f: &Followed, leader_start: i64) {
    let tp = f.topic.tp(f.partition);
    let Some((start, hw, _)) = broker.engine.offsets(&tp) else { return };
    if leader_start <= start || leader_start > hw || !f.topic.config.cleanup.delete {
        return;
    }
    let engine = broker.engine.clone();
    match tokio::task::spawn_blocking(move || engine.delete_records(&[(tp, leader_start)]).pop()).await {
        Ok(Some(Ok(_))) => tracing::debug!(topic = f.topic.name(), partition = f.partition, log_start = leader_start, "log start raised to the leader's"),
        Ok(Some(Err(e))) => tracing::debug!(topic = f.topic.name(), partition = f.partition, error = %e, "raising the log start to the leader's failed; trying again"),
        _ => {}
    }
}
