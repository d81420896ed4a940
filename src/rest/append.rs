//! The one append path of the bridge: records with their partitions (or
//! the error that placed none), one batch per partition, every partition
//! submitted to the writer before any is awaited (one writer round, one
//! fsync for the request).

use std::collections::BTreeMap;
use std::sync::Arc;

use bytes::Bytes;

use super::{coalesce, engine_error, Bridge, RestError};
use crate::engine::{Ack, PendingAppend, Topic};
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
    // Cluster mode: a partition another node leads is refused (retriable:
    // leadership moves), until routing to leaders is built.
    let view = b.view();
    let rerouted: Vec<Result<i32, RestError>>;
    let placed = match view.as_deref() {
        Some(v) if placed.iter().any(|p| p.as_ref().is_ok_and(|p| !b.leads(Some(v), t.name(), *p))) => {
            rerouted = placed
                .iter()
                .map(|p| match p {
                    Ok(p) if !b.leads(Some(v), t.name(), *p) => {
                        let leader = v.partition(-1, t.name(), *p).leader;
                        let mut e = RestError::new(axum::http::StatusCode::SERVICE_UNAVAILABLE, 50302, format!("this broker does not lead partition {p} of {} (its leader is broker {leader}); produce to that broker's REST bridge", t.name()));
                        e.retry_after = Some(1);
                        Err(e)
                    }
                    other => other.clone(),
                })
                .collect();
            &rerouted[..]
        }
        _ => placed,
    };
    let mut by_partition: BTreeMap<i32, Vec<usize>> = BTreeMap::new();
    for (i, p) in placed.iter().enumerate() {
        if let Ok(p) = p {
            by_partition.entry(*p).or_default().push(i);
        }
    }
    // Every part too big to share a batch is built and checked before
    // anything is submitted or joined, so a request is refused whole
    // rather than written in part; small parts then join the partition's
    // open group (see `coalesce`), which always fits.
    let limit = t.config.max_message_bytes.max(0) as usize;
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
            Err(size) => {
                let e = RestError::new(axum::http::StatusCode::PAYLOAD_TOO_LARGE, 413, format!("a record for partition {p} makes a {size} byte batch on its own, over the topic's max.message.bytes = {limit}"));
                return placed.iter().map(|_| Err((None, e.clone()))).collect();
            }
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
    if !wait {
        // acks=0: queued (or refused) here, not awaited.
        return pending
            .into_iter()
            .flat_map(|(p, idx, r)| {
                let e = r.err().map(|e| engine_error(e, t.name()));
                idx.into_iter().map(move |_| match &e {
                    None => Ok((p, -1)),
                    Some(e) => Err((Some(p), e.clone())),
                })
            })
            .collect();
    }
    let mut out: Vec<Option<Outcome>> = placed
        .iter()
        .map(|p| match p {
            Ok(_) => None,
            Err(e) => Some(Err((None, e.clone()))),
        })
        .collect();
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
    out.into_iter().map(|o| o.expect("every record answered")).collect()
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
