//! Concurrent small requests for one partition share one record batch.
//!
//! The first request to find no open group for its (partition, ack) opens
//! one and spawns its flush; requests arriving before the flush runs join
//! the group. The flush yields once (to the end of the scheduler's tick,
//! after the ready connections have been polled), takes the group, builds
//! one batch, submits it, waits for the ack and hands each request its
//! offsets. So under load many single-event POSTs become one batch, one
//! writer command and one validation; alone, a request waits one tick.
//!
//! The flush is its own task: a client that disconnects cannot cancel the
//! others' write. A group is bounded (`MAX_GROUP_BYTES`, and the topic's
//! `max.message.bytes`); a request that does not fit goes alone.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use tokio::sync::oneshot;

use super::{engine_error, RestError};
use crate::engine::{Ack, Engine, Topic};
use crate::protocol::batch::{self, NewRecord};
use crate::storage::Tp;

/// Largest estimated batch a group grows to.
pub const MAX_GROUP_BYTES: usize = 1 << 20;

/// A record the group owns until its flush.
#[derive(Debug, Clone)]
pub struct Owned {
    pub key: Option<Bytes>,
    pub value: Option<Bytes>,
    pub headers: Vec<(String, Option<Bytes>)>,
}

impl Owned {
    pub fn of(r: &NewRecord<'_>) -> Owned {
        Owned {
            key: r.key.map(Bytes::copy_from_slice),
            value: r.value.map(Bytes::copy_from_slice),
            headers: r.headers.iter().map(|(k, v)| ((*k).to_owned(), v.map(Bytes::copy_from_slice))).collect(),
        }
    }
}

/// An upper bound of a record's bytes in a batch (the fields, their
/// varint lengths and the record's own header).
pub fn estimate(r: &NewRecord<'_>) -> usize {
    32 + r.key.map_or(0, <[u8]>::len) + r.value.map_or(0, <[u8]>::len) + r.headers.iter().map(|(k, v)| 10 + k.len() + v.map_or(0, <[u8]>::len)).sum::<usize>()
}

/// The most a group of `topic` may hold, by [`estimate`].
fn cap(topic: &Topic) -> usize {
    MAX_GROUP_BYTES.min((topic.config.max_message_bytes.max(0) as usize).saturating_sub(1024))
}

/// Whether `records` may join a group of `topic` (then they also fit in
/// a batch of their own).
pub fn fits(topic: &Topic, records: &[NewRecord<'_>]) -> bool {
    records.iter().map(estimate).sum::<usize>() <= cap(topic)
}

/// The first offset of a request's records, or why they were not written.
type Reply = Result<i64, RestError>;

struct Group {
    topic: Arc<Topic>,
    records: Vec<Owned>,
    bytes: usize,
    waiters: Vec<(usize, oneshot::Sender<Reply>)>,
}

/// The open groups, by partition and ack.
#[derive(Default)]
pub struct Coalescer {
    open: Mutex<HashMap<(Tp, bool), Group>>,
}

impl Coalescer {
    /// Appends `records` to partition `p` of `topic` in a batch shared with
    /// whatever else arrives for it now; answers the first offset. `None`:
    /// the records do not fit in a group (send them alone).
    pub fn join(self: &Arc<Self>, engine: &Arc<Engine>, topic: &Arc<Topic>, p: i32, records: &[NewRecord<'_>], ack: Ack) -> Option<oneshot::Receiver<Reply>> {
        let bytes: usize = records.iter().map(estimate).sum();
        let cap = cap(topic);
        if bytes > cap {
            return None;
        }
        let key = (topic.tp(p), ack == Ack::Durable);
        let (tx, rx) = oneshot::channel();
        let mut open = self.open.lock().expect("coalescer lock");
        match open.get_mut(&key) {
            // A group of a deleted and recreated topic is not joined.
            Some(g) if g.bytes + bytes <= cap && Arc::ptr_eq(&g.topic, topic) => {
                g.waiters.push((g.records.len(), tx));
                g.records.extend(records.iter().map(Owned::of));
                g.bytes += bytes;
            }
            Some(_) => return None,
            None => {
                open.insert(key, Group { topic: topic.clone(), records: records.iter().map(Owned::of).collect(), bytes, waiters: vec![(0, tx)] });
                drop(open);
                tokio::spawn(flush(self.clone(), engine.clone(), key, p, ack));
            }
        }
        Some(rx)
    }
}

async fn flush(c: Arc<Coalescer>, engine: Arc<Engine>, key: (Tp, bool), p: i32, ack: Ack) {
    tokio::task::yield_now().await;
    let Some(g) = c.open.lock().expect("coalescer lock").remove(&key) else {
        return;
    };
    let views: Vec<NewRecord<'_>> = g
        .records
        .iter()
        .map(|r| NewRecord { key: r.key.as_deref(), value: r.value.as_deref(), headers: r.headers.iter().map(|(k, v)| (k.as_str(), v.as_deref())).collect() })
        .collect();
    let built = Bytes::from(batch::build(&views, engine.now_ms()));
    drop(views);
    let outcome = match engine.submit(&g.topic, p, built, ack).await {
        Ok(pending) => pending.wait().await,
        Err(e) => Err(e),
    };
    match outcome {
        Ok(a) => {
            for (first, tx) in g.waiters {
                let _ = tx.send(Ok(a.base_offset + first as i64));
            }
        }
        Err(e) => {
            let e = engine_error(e, g.topic.name());
            for (_, tx) in g.waiters {
                let _ = tx.send(Err(e.clone()));
            }
        }
    }
}
