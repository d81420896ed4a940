//! The one append path of the bridge: records with their partitions (or
//! the error that placed none), one batch per partition, every partition
//! submitted to the writer before any is awaited (one writer round, one
//! fsync for the request).

use std::collections::BTreeMap;
use std::sync::Arc;

use bytes::Bytes;
use kafka_protocol::ResponseError;

use super::{coalesce, engine_error, Bridge, RestError};
use crate::engine::{Ack, PendingAppend, Topic};
use crate::kafka::replication::peers::ForwardError;
use crate::protocol::batch::{self, NewRecord};

/// What became of one record: (partition, offset), or (partition if
/// known, the error).
pub type Outcome = Result<(i32, i64), (Option<i32>, RestError)>;

/// Per record, in order, its [`Outcome`]. With `Ack::Written` the answer comes after the write; the
/// caller that does not wait at all (acks=0) drops the future after
/// `submit` returned.
pub async fn append(b: &Bridge, t: &Arc<Topic>, records: &[NewRecord<'_>], placed: &[Result<i32, RestError>], ack: Ack) -> Vec<Outcome> {
    append_with(b, t, records, placed, ack, true).await
}

/// [`append`]; without `wait`, answers once the batches are queued (with
/// offset -1: not known yet), for acks=0. The outcomes are then per
/// partition, not in request order.
pub async fn append_with(b: &Bridge, t: &Arc<Topic>, records: &[NewRecord<'_>], placed: &[Result<i32, RestError>], ack: Ack, wait: bool) -> Vec<Outcome> {
    let out = place(b, t, records, placed, ack, wait).await;
    b.probe.appended(out.iter().filter(|o| o.is_ok()).count());
    out
}

async fn place(b: &Bridge, t: &Arc<Topic>, records: &[NewRecord<'_>], placed: &[Result<i32, RestError>], ack: Ack, wait: bool) -> Vec<Outcome> {
    let now = b.engine.now_ms();
    // Cluster mode: a partition another node leads goes to that node (see
    // `Forwarder`); one that has no leader now is refused (retriable).
    let view = b.view();
    let mut by_partition: BTreeMap<i32, Vec<usize>> = BTreeMap::new();
    let mut elsewhere: BTreeMap<i32, Vec<(i32, Vec<usize>)>> = BTreeMap::new();
    let mut out: Vec<Option<Outcome>> = placed.iter().map(|p| p.as_ref().err().map(|e| Err((None, e.clone())))).collect();
    for (i, p) in placed.iter().enumerate() {
        if let Ok(p) = p {
            by_partition.entry(*p).or_default().push(i);
        }
    }
    if let Some(v) = view.as_deref() {
        let me = b.node_id();
        by_partition.retain(|p, idx| {
            if b.leads(Some(v), t.name(), *p) {
                return true;
            }
            match v.partition(-1, t.name(), *p).leader {
                leader if leader >= 0 && Some(leader) != me && b.forwarder.is_some() => elsewhere.entry(leader).or_default().push((*p, std::mem::take(idx))),
                leader => {
                    // No leader, or this node named but not leading yet
                    // (its epoch begins in a moment): the client retries.
                    let why = if Some(leader) == me { "this broker is taking its leadership over".to_owned() } else { format!("it has no leader now (last known: broker {leader})") };
                    let mut e = RestError::new(axum::http::StatusCode::SERVICE_UNAVAILABLE, 50302, format!("partition {p} of {}: {why}; retry", t.name()));
                    e.retry_after = Some(1);
                    for &i in idx.iter() {
                        out[i] = Some(Err((Some(*p), e.clone())));
                    }
                }
            }
            false
        });
    }
    // Every part too big to share a batch is built and checked before
    // anything is submitted, joined or forwarded, so a request is refused
    // whole rather than written in part; small parts then join the
    // partition's open group (see `coalesce`), which always fits.
    let limit = t.config.max_message_bytes.max(0) as usize;
    let too_large = |p: i32, size: usize| {
        let e = RestError::new(axum::http::StatusCode::PAYLOAD_TOO_LARGE, 413, format!("a record for partition {p} makes a {size} byte batch on its own, over the topic's max.message.bytes = {limit}"));
        placed.iter().map(|_| Err((None, e.clone()))).collect::<Vec<Outcome>>()
    };
    // Per leader elsewhere: (partition, its records' indexes, its batches).
    type Forward = (i32, Vec<(i32, Vec<usize>, Bytes)>);
    let mut forwards: Vec<Forward> = Vec::with_capacity(elsewhere.len());
    for (leader, ps) in elsewhere {
        let mut parts = Vec::with_capacity(ps.len());
        for (p, idx) in ps {
            let recs = idx.iter().map(|&i| (i, records[i].clone())).collect();
            match batches(recs, limit, now) {
                Ok(built) => {
                    let mut all = bytes::BytesMut::with_capacity(built.iter().map(|(_, _, b)| b.len()).sum());
                    for (_, _, batch) in &built {
                        all.extend_from_slice(batch);
                    }
                    parts.push((p, idx, all.freeze()));
                }
                Err(size) => return too_large(p, size),
            }
        }
        forwards.push((leader, parts));
    }
    // (partition, its records' indexes in the request, the records, the
    // batch built for them unless they may join a group); a partition's
    // records are cut into as many batches as max.message.bytes needs.
    type Part<'r> = (i32, Vec<usize>, Vec<NewRecord<'r>>, Option<Bytes>);
    let mut parts: Vec<Part<'_>> = Vec::with_capacity(by_partition.len());
    for (p, idx) in &by_partition {
        let recs: Vec<NewRecord<'_>> = idx.iter().map(|&i| records[i].clone()).collect();
        if wait && b.cfg.coalesce && coalesce::fits(t, &recs) {
            parts.push((*p, idx.clone(), recs, None));
            continue;
        }
        match batches(idx.iter().copied().zip(recs).collect(), limit, now) {
            Ok(built) => parts.extend(built.into_iter().map(|(idx, recs, batch)| (*p, idx, recs, Some(batch)))),
            Err(size) => return too_large(*p, size),
        }
    }
    let mut pending = Vec::with_capacity(parts.len());
    for (p, idx, recs, batch) in parts {
        let joined = if batch.is_none() { b.coalescer.join(&b.engine, t, p, &recs, ack) } else { None };
        let submitted = match joined {
            Some(rx) => Ok(Pending::Joined(rx)),
            // Alone, or its group was full (a part that fits a group fits a batch).
            None => {
                let batch = batch.unwrap_or_else(|| Bytes::from(batch::build(&recs, now)));
                b.engine.submit(t, p, batch, ack).await.map(Pending::Alone)
            }
        };
        pending.push((p, idx, submitted));
    }
    // Records for other leaders go out now, to all of them at once
    // (acks=0 is forwarded with acks=1, not awaited: a link matches
    // answers to requests in order, so every request must have one).
    let acks = if ack == Ack::Durable { -1 } else { 1 };
    let forwarded: Vec<_> = forwards
        .into_iter()
        .map(|(leader, parts)| {
            let (forwarder, topic) = (b.forwarder.clone().expect("elsewhere only with a forwarder"), t.name().to_owned());
            let (owed, batches): (Vec<(i32, Vec<usize>)>, Vec<(i32, Bytes)>) = parts.into_iter().map(|(p, idx, batch)| ((p, idx), (p, batch))).unzip();
            let sent = tokio::spawn(async move { forwarder.produce(leader, &topic, batches, acks).await });
            (owed, sent)
        })
        .collect();
    if !wait {
        // acks=0: queued (or refused) here, not awaited.
        let mut queued: Vec<Outcome> = pending
            .into_iter()
            .flat_map(|(p, idx, r)| {
                let e = r.err().map(|e| engine_error(e, t.name()));
                idx.into_iter().map(move |_| match &e {
                    None => Ok((p, -1)),
                    Some(e) => Err((Some(p), e.clone())),
                })
            })
            .collect();
        queued.extend(forwarded.iter().flat_map(|(owed, _)| owed.iter().flat_map(|(p, idx)| idx.iter().map(move |_| Ok((*p, -1))))));
        queued.extend(out.into_iter().flatten());
        return queued;
    }
    // acks=all in cluster mode: answered once the partition's in-sync
    // replicas have the records, as a Kafka producer's acks=all is.
    let deadline = tokio::time::Instant::now() + REPLICATED_WITHIN;
    for (p, idx, submitted) in pending {
        let first = match submitted {
            Ok(Pending::Alone(w)) => w.wait().await.map(|a| a.base_offset).map_err(|e| engine_error(e, t.name())),
            Ok(Pending::Joined(rx)) => rx.await.unwrap_or_else(|_| Err(engine_error(crate::engine::EngineError::ShuttingDown, t.name()))),
            Err(e) => Err(engine_error(e, t.name())),
        };
        let first = match (first, view.as_deref()) {
            (Ok(base), Some(v)) if ack == Ack::Durable && v.partition(-1, t.name(), p).replicas.len() > 1 => replicated(b, t, p, b.lead_epoch(Some(v), t.name(), p), base + idx.len() as i64, deadline).await.map(|()| base),
            (first, _) => first,
        };
        match first {
            Ok(base) => {
                for (k, &i) in idx.iter().enumerate() {
                    out[i] = Some(Ok((p, base + k as i64)));
                }
            }
            Err(e) => {
                for &i in &idx {
                    out[i] = Some(Err((Some(p), e.clone())));
                }
            }
        }
    }
    for (owed, sent) in forwarded {
        let answer = sent.await.unwrap_or_else(|e| Err(ForwardError { leader: -1, why: e.to_string() }));
        for (k, (p, idx)) in owed.iter().enumerate() {
            let got = match &answer {
                Ok(acks) if acks[k].error_code == 0 => Ok(acks[k].base_offset),
                Ok(acks) => Err(forward_refused(t.name(), *p, acks[k].error_code, acks[k].error_message.as_deref())),
                Err(e) => Err(forward_failed(t.name(), *p, e)),
            };
            for (n, &i) in idx.iter().enumerate() {
                out[i] = Some(got.as_ref().map(|base| (*p, base + n as i64)).map_err(|e| (Some(*p), e.clone())));
            }
        }
    }
    out.into_iter().map(|o| o.expect("every record answered")).collect()
}

/// A leader's refusal of forwarded records, as the bridge answers it:
/// what a retry may fix is 503 with Retry-After, the rest as the engine's
/// own refusals are.
fn forward_refused(topic: &str, p: i32, code: i16, message: Option<&str>) -> RestError {
    use axum::http::StatusCode;
    let known = ResponseError::try_from_code(code);
    let why = format!("the broker leading partition {p} of {topic} refused the records: {} (error {code}){}", known.map_or("unknown".into(), |e| format!("{e:?}")), message.map(|m| format!(": {m}")).unwrap_or_default());
    match known {
        Some(ResponseError::UnknownTopicOrPartition) => RestError::topic_not_found(topic),
        Some(ResponseError::MessageTooLarge | ResponseError::RecordListTooLarge) => RestError::new(StatusCode::PAYLOAD_TOO_LARGE, 413, why),
        Some(ResponseError::InvalidRecord | ResponseError::CorruptMessage | ResponseError::InvalidTimestamp) => RestError::unprocessable(why),
        Some(e) if e.is_retriable() => {
            let mut e = RestError::new(StatusCode::SERVICE_UNAVAILABLE, 50302, why);
            e.retry_after = Some(1);
            e
        }
        _ => RestError::new(StatusCode::INTERNAL_SERVER_ERROR, 50001, why),
    }
}

/// No answer from the leader: the records may or may not be in its log.
fn forward_failed(topic: &str, p: i32, e: &ForwardError) -> RestError {
    let mut e = RestError::new(axum::http::StatusCode::SERVICE_UNAVAILABLE, 50302, format!("partition {p} of {topic}: {e}; the records may or may not be kept"));
    e.retry_after = Some(1);
    e
}

/// How long an acks=all append waits for the in-sync replicas (Kafka's
/// default request.timeout.ms).
const REPLICATED_WITHIN: std::time::Duration = std::time::Duration::from_secs(30);

/// Waits until every in-sync replica of partition `p` has everything
/// below `end`; refused (retriable) when this node stops leading it in
/// `epoch` (the one the records were placed in) first, or the replicas
/// take too long. A hw seen after leadership moved may be a new leader's
/// over this node's cut tail: refused too.
async fn replicated(b: &Bridge, t: &Topic, p: i32, epoch: Option<i32>, end: i64, deadline: tokio::time::Instant) -> Result<(), RestError> {
    use crate::engine::HwWait;
    let gone = |why: String| {
        let mut e = RestError::new(axum::http::StatusCode::SERVICE_UNAVAILABLE, 50302, why);
        e.retry_after = Some(1);
        e
    };
    let still = || epoch.is_some() && b.lead_epoch(b.view().as_deref(), t.name(), p) == epoch;
    match b.engine.wait_hw(t.tp(p), end, deadline, still).await {
        HwWait::Reached if still() => Ok(()),
        HwWait::Reached | HwWait::Stopped => Err(gone(format!("this broker stopped leading partition {p} of {} before its in-sync replicas had the records; they may or may not be kept", t.name()))),
        HwWait::TimedOut => Err(gone(format!("the in-sync replicas of partition {p} of {} did not have the records within {} s; they may or may not be kept", t.name(), REPLICATED_WITHIN.as_secs()))),
    }
}

/// Records (with their indexes in the request) as batches of at most
/// `limit` bytes, in order: cut where the records' sizes say, and cut
/// again where a built batch is still too big. `Err(size)`: one record
/// alone makes a batch over the limit.
type Built<'r> = (Vec<usize>, Vec<NewRecord<'r>>, Bytes);

fn batches<'r>(recs: Vec<(usize, NewRecord<'r>)>, limit: usize, now: i64) -> Result<Vec<Built<'r>>, usize> {
    let (idx, only): (Vec<usize>, Vec<NewRecord<'r>>) = recs.iter().cloned().unzip();
    let built = Bytes::from(batch::build(&only, now));
    if built.len() <= limit {
        return Ok(vec![(idx, only, built)]);
    }
    if recs.len() == 1 {
        return Err(built.len());
    }
    // About this many records fit in a batch (each takes about the
    // batch's size over their count); at least two pieces.
    let per = built.len() / recs.len() + 1;
    let take = (limit / per).clamp(1, recs.len().div_ceil(2));
    let mut rest = recs;
    let mut out = Vec::new();
    while !rest.is_empty() {
        let tail = rest.split_off(take.min(rest.len()));
        out.extend(batches(rest, limit, now)?);
        rest = tail;
    }
    Ok(out)
}

/// A partition's share of a request, submitted.
enum Pending {
    Joined(tokio::sync::oneshot::Receiver<Result<i64, RestError>>),
    Alone(PendingAppend),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_are_cut_into_batches_that_fit_in_order() {
        let values: Vec<Vec<u8>> = (0..100).map(|i| vec![b'a' + (i % 26) as u8; 1000]).collect();
        let recs: Vec<(usize, NewRecord<'_>)> = values.iter().enumerate().map(|(i, v)| (i, NewRecord { key: None, value: Some(v), headers: Vec::new() })).collect();
        let built = batches(recs, 10_000, 0).unwrap();
        assert!(built.len() >= 10, "{} batches", built.len());
        assert!(built.iter().all(|(_, _, b)| b.len() <= 10_000));
        let order: Vec<usize> = built.iter().flat_map(|(idx, _, _)| idx.iter().copied()).collect();
        assert_eq!(order, (0..100).collect::<Vec<_>>(), "every record once, in order");
        let huge = vec![b'x'; 20_000];
        assert!(batches(vec![(0, NewRecord { key: None, value: Some(&huge), headers: Vec::new() })], 10_000, 0).is_err());
    }
}
