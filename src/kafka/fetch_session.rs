//! Fetch sessions (KIP-227): a consumer of many partitions names them all
//! once; its later fetches name only what changed (new offsets, partitions
//! added or forgotten), and the answers carry only partitions with news.
//!
//! # The protocol
//!
//! A Fetch carries (session id, epoch):
//! - (0, -1): no session; answered in full, session id 0.
//! - (id, 0): a full request that asks for a session (the session `id`
//!   names, if any, is closed). Answered in full; if the cache has room,
//!   the answer carries a new session id, whose next epoch is 1.
//! - (id, -1): closes session `id`; answered in full without a session.
//! - (id, n > 0): incremental. The request's partitions update the
//!   session's (offset, size; new ones are added at the end), forgotten
//!   partitions leave it, and every partition of the session is read. The
//!   answer carries those with records, an error, or a high watermark or
//!   log start offset that moved since the session last answered them;
//!   those that returned records move to the end, so every partition gets
//!   its turn when responses fill up. A session id the cache does not hold
//!   is FETCH_SESSION_ID_NOT_FOUND, an epoch other than the expected one
//!   INVALID_FETCH_SESSION_EPOCH; either leaves the session as it was, and
//!   the client starts again with a full request.
//!
//! From Fetch v13 a session names its topics by id (KIP-516); a request of
//! the other kind than its session's gets FETCH_SESSION_TOPIC_ID_ERROR.
//! A session's partitions are keyed by (topic name, topic id, partition)
//! with the name empty in id sessions and the id zero in named ones, which
//! is what the requests of each kind carry.
//!
//! # Ownership and bounds
//!
//! The cache is shared by every connection (a client may reconnect and go
//! on with its session), behind one mutex held only to look up, update or
//! create a session — never across a read or a wait. A session belongs to
//! the principal that created it; another principal naming it gets
//! FETCH_SESSION_ID_NOT_FOUND, so session ids are not capabilities.
//!
//! The cache holds at most `slots` sessions
//! (`max_incremental_fetch_session_cache_slots`) and `max_partitions`
//! cached partitions in all. A new session that does not fit evicts, as
//! Kafka does, first a session unused for `EVICTION_MS`, else the smallest
//! session older than `EVICTION_MS` if the new one is larger; otherwise it
//! is not created (the client fetches without one). An incremental request
//! that would grow the cache past `max_partitions` closes its session
//! (FETCH_SESSION_ID_NOT_FOUND: the client falls back to a full request).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use kafka_protocol::messages::TopicName;
use kafka_protocol::ResponseError as E;

use crate::auth::KafkaPrincipal;

/// The epoch of a full request that asks for a session.
pub const INITIAL_EPOCH: i32 = 0;
/// The epoch of a request without a session (or that closes one).
pub const FINAL_EPOCH: i32 = -1;
/// Kafka's `min.incremental.fetch.session.eviction.ms`: a session is safe
/// from being evicted by a larger one this long after it was made, and is
/// stale once unused this long.
pub const EVICTION_MS: i64 = 120_000;
/// Most partitions one session holds: the cache's mutex is held while a
/// session is updated, so no session may make that long.
pub const MAX_SESSION_PARTITIONS: usize = 100_000;

/// The epoch after `epoch` (Kafka's `nextEpoch`): 1 after the initial one,
/// wrapping to 1 past the largest.
pub fn next_epoch(epoch: i32) -> i32 {
    if epoch < 0 {
        FINAL_EPOCH
    } else if epoch == i32::MAX {
        1
    } else {
        epoch + 1
    }
}

/// One partition of a session: what the client last asked for, and what
/// the session last answered about it.
#[derive(Debug, Clone, PartialEq)]
pub struct Cached {
    /// Empty in a session by topic id.
    pub topic: TopicName,
    /// Zero in a session by topic name.
    pub topic_id: [u8; 16],
    pub partition: i32,
    pub fetch_offset: i64,
    pub max_bytes: i32,
    /// -1 until answered (and after an error, so the partition is sent
    /// again once the error goes away).
    high_watermark: i64,
    log_start_offset: i64,
}

impl Cached {
    pub fn new(topic: TopicName, topic_id: [u8; 16], partition: i32, fetch_offset: i64, max_bytes: i32) -> Cached {
        Cached { topic, topic_id, partition, fetch_offset, max_bytes, high_watermark: -1, log_start_offset: -1 }
    }

    fn key(&self) -> Key {
        (self.topic.clone(), self.topic_id, self.partition)
    }

    /// Whether an answer about this partition must be sent, and (with
    /// `update`) remembers what it says: records, an error, or moved
    /// offsets (Kafka's `maybeUpdateResponseData`).
    pub fn must_respond(&mut self, answer: &Answered, update: bool) -> bool {
        let mut respond = answer.records > 0;
        if self.high_watermark != answer.high_watermark {
            respond = true;
            if update {
                self.high_watermark = answer.high_watermark;
            }
        }
        if self.log_start_offset != answer.log_start_offset {
            respond = true;
            if update {
                self.log_start_offset = answer.log_start_offset;
            }
        }
        if answer.error_code != 0 {
            if update {
                self.high_watermark = -1;
            }
            respond = true;
        }
        respond
    }
}

/// What a fetch answered about one partition.
#[derive(Debug, Clone, Copy, Default)]
pub struct Answered {
    pub error_code: i16,
    pub high_watermark: i64,
    pub log_start_offset: i64,
    /// Record bytes carried.
    pub records: usize,
}

/// (topic name, topic id, partition); see the module docs.
pub type Key = (TopicName, [u8; 16], i32);

struct Session {
    /// Where each partition is in `partitions`; None after a reorder,
    /// rebuilt when a request names partitions.
    index: Option<HashMap<Key, usize>>,
    principal: Arc<KafkaPrincipal>,
    /// Made by a v13+ request: its topics are named by id.
    by_id: bool,
    /// The epoch the next request must carry.
    epoch: i32,
    partitions: Vec<Cached>,
    created_ms: i64,
    last_used_ms: i64,
}

impl Session {
    fn index(&mut self) -> &mut HashMap<Key, usize> {
        let partitions = &self.partitions;
        self.index.get_or_insert_with(|| partitions.iter().enumerate().map(|(i, c)| (c.key(), i)).collect())
    }
}

/// How a fetch is to be answered.
#[derive(Debug, PartialEq)]
pub enum Context {
    /// In full, with session id 0.
    Sessionless,
    /// In full; then [`FetchSessions::create`] may make a session of it.
    Full,
    /// Session `id`: read `partitions` (the session's, in its order, as
    /// this request updated them), answer what changed, then
    /// [`FetchSessions::answered`].
    Incremental { id: i32, partitions: Vec<Cached> },
    /// Answered with this error alone.
    Error(i16),
}

/// A request's changes to its session: partitions to add or update (with
/// offset and max bytes), and partitions to forget.
#[derive(Debug, Default)]
pub struct Changes {
    pub fetch: Vec<(Key, i64, i32)>,
    pub forget: Vec<Key>,
}

#[derive(Default)]
struct Cache {
    sessions: HashMap<i32, Session>,
    partitions: usize,
}

/// The broker's fetch sessions.
pub struct FetchSessions {
    cache: Mutex<Cache>,
    slots: usize,
    max_partitions: usize,
    /// Sessions evicted to make room for others.
    pub evictions: AtomicU64,
    /// Fetches answered incrementally.
    pub incremental: AtomicU64,
    /// Session ids are random (never 0), so a client cannot guess the next.
    rng: Mutex<u64>,
}

impl FetchSessions {
    pub fn new(slots: usize, max_partitions: usize) -> FetchSessions {
        let seed = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(0x9e37_79b9_7f4a_7c15) | 1;
        FetchSessions { cache: Mutex::new(Cache::default()), slots, max_partitions, evictions: AtomicU64::new(0), incremental: AtomicU64::new(0), rng: Mutex::new(seed) }
    }

    fn cache(&self) -> std::sync::MutexGuard<'_, Cache> {
        self.cache.lock().expect("fetch session cache")
    }

    /// (sessions, cached partitions), for metrics.
    pub fn stats(&self) -> (usize, usize) {
        let c = self.cache();
        (c.sessions.len(), c.partitions)
    }

    /// Decides how a fetch with this session id and epoch is answered,
    /// applying an incremental request's `changes` to its session.
    /// `by_id`: the request is v13+ (topics by id).
    pub fn begin(&self, principal: &Arc<KafkaPrincipal>, session_id: i32, epoch: i32, by_id: bool, changes: Changes, now_ms: i64) -> Context {
        let mut cache = self.cache();
        if epoch == INITIAL_EPOCH || epoch == FINAL_EPOCH {
            // A full request closes the session it names (if the principal
            // owns it).
            if session_id != 0 && cache.sessions.get(&session_id).is_some_and(|s| s.principal == *principal) {
                cache.remove(session_id);
            }
            return if epoch == FINAL_EPOCH { Context::Sessionless } else { Context::Full };
        }
        if session_id <= 0 {
            // An epoch without a session.
            return Context::Error(E::FetchSessionIdNotFound.code());
        }
        let max_partitions = self.max_partitions;
        let per_session = MAX_SESSION_PARTITIONS.min(max_partitions);
        let Cache { sessions, partitions: total } = &mut *cache;
        let Some(session) = sessions.get_mut(&session_id).filter(|s| s.principal == *principal) else {
            return Context::Error(E::FetchSessionIdNotFound.code());
        };
        if session.epoch != epoch {
            return Context::Error(E::InvalidFetchSessionEpoch.code());
        }
        if session.by_id != by_id {
            return Context::Error(E::FetchSessionTopicIdError.code());
        }
        let before = session.partitions.len();
        if !changes.fetch.is_empty() {
            session.index();
        }
        for (key, offset, max_bytes) in changes.fetch {
            let found = session.index.as_ref().and_then(|ix| ix.get(&key).copied());
            match found {
                Some(i) => {
                    let c = &mut session.partitions[i];
                    (c.fetch_offset, c.max_bytes) = (offset, max_bytes);
                }
                None => {
                    let at = session.partitions.len();
                    session.index().insert(key.clone(), at);
                    let (topic, id, partition) = key;
                    session.partitions.push(Cached::new(topic, id, partition, offset, max_bytes));
                }
            }
            if session.partitions.len() > per_session {
                break;
            }
        }
        if !changes.forget.is_empty() {
            let forget: std::collections::HashSet<Key> = changes.forget.into_iter().collect();
            session.partitions.retain(|c| !forget.contains(&c.key()));
            session.index = None;
        }
        let after = session.partitions.len();
        if *total - before + after > max_partitions || after > per_session || after == 0 {
            // Too large for the cache, or nothing left to fetch: the
            // session ends (an empty one as Kafka does, answered without a
            // session; an oversized one as not found, so the client starts
            // over with a full request).
            *total -= before;
            sessions.remove(&session_id);
            return if after == 0 { Context::Sessionless } else { Context::Error(E::FetchSessionIdNotFound.code()) };
        }
        *total = *total - before + after;
        session.epoch = next_epoch(session.epoch);
        session.last_used_ms = now_ms;
        self.incremental.fetch_add(1, Ordering::Relaxed);
        Context::Incremental { id: session_id, partitions: session.partitions.clone() }
    }

    /// After a full fetch: makes a session of its partitions (with what
    /// the answer said of each) if it fits. Returns the session id, or 0.
    pub fn create(&self, principal: &Arc<KafkaPrincipal>, by_id: bool, partitions: Vec<Cached>, now_ms: i64) -> i32 {
        if partitions.is_empty() || partitions.len() > self.max_partitions.min(MAX_SESSION_PARTITIONS) || self.slots == 0 {
            return 0;
        }
        let mut cache = self.cache();
        while cache.sessions.len() >= self.slots || cache.partitions + partitions.len() > self.max_partitions {
            let Some(victim) = cache.evictable(partitions.len(), now_ms) else { return 0 };
            cache.remove(victim);
            self.evictions.fetch_add(1, Ordering::Relaxed);
        }
        let id = loop {
            let id = self.random_id();
            if !cache.sessions.contains_key(&id) {
                break id;
            }
        };
        cache.partitions += partitions.len();
        cache.sessions.insert(id, Session { index: None, principal: principal.clone(), by_id, epoch: next_epoch(INITIAL_EPOCH), partitions, created_ms: now_ms, last_used_ms: now_ms });
        id
    }

    /// After an incremental fetch: what it answered about each partition
    /// it read, by key. Remembers what was sent and moves the partitions
    /// that returned records to the end. Returns, for each answer in order,
    /// whether the response includes it. Matched by key, not position: a
    /// later epoch may have changed the session meanwhile (its client went
    /// on, on another connection); a partition it no longer has is sent.
    pub fn answered(&self, id: i32, answers: &[(Key, Answered)]) -> Vec<bool> {
        let mut cache = self.cache();
        let Some(session) = cache.sessions.get_mut(&id) else {
            // Closed meanwhile (a full request came on another connection):
            // send everything read.
            return vec![true; answers.len()];
        };
        let by_key: HashMap<&Key, &Answered> = answers.iter().map(|(k, a)| (k, a)).collect();
        let mut include: HashMap<Key, bool> = HashMap::with_capacity(answers.len());
        let mut fed = Vec::new();
        let mut rest = Vec::with_capacity(session.partitions.len());
        for mut c in std::mem::take(&mut session.partitions) {
            let key = c.key();
            match by_key.get(&key) {
                Some(a) => {
                    include.insert(key, c.must_respond(a, true));
                    if a.records > 0 { fed.push(c) } else { rest.push(c) }
                }
                None => rest.push(c),
            }
        }
        // Partitions that returned records go to the end, in order.
        if !fed.is_empty() {
            session.index = None;
        }
        rest.append(&mut fed);
        session.partitions = rest;
        answers.iter().map(|(k, _)| include.get(k).copied().unwrap_or(true)).collect()
    }

    fn random_id(&self) -> i32 {
        let mut s = self.rng.lock().expect("fetch session ids");
        // xorshift64*: not a secret (sessions are bound to principals),
        // only hard to guess by accident.
        *s ^= *s >> 12;
        *s ^= *s << 25;
        *s ^= *s >> 27;
        let v = s.wrapping_mul(0x2545_f491_4f6c_dd1d);
        ((v >> 33) as i32).max(1)
    }
}

impl Cache {
    fn remove(&mut self, id: i32) {
        if let Some(s) = self.sessions.remove(&id) {
            self.partitions -= s.partitions.len();
        }
    }

    /// The session a new one of `size` partitions may evict: the least
    /// recently used if it is stale, else the smallest (then oldest id)
    /// session past its protection if it is smaller than the newcomer.
    fn evictable(&self, size: usize, now_ms: i64) -> Option<i32> {
        let lru = self.sessions.iter().min_by_key(|(id, s)| (s.last_used_ms, **id))?;
        if now_ms - lru.1.last_used_ms > EVICTION_MS {
            return Some(*lru.0);
        }
        let (id, s) = self.sessions.iter().filter(|(_, s)| now_ms - s.created_ms > EVICTION_MS).min_by_key(|(id, s)| (s.partitions.len(), **id))?;
        (size > s.partitions.len()).then_some(*id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn name(s: &str) -> TopicName {
        TopicName(kafka_protocol::protocol::StrBytes::from_string(s.to_owned()))
    }

    fn alice() -> Arc<KafkaPrincipal> {
        Arc::new(KafkaPrincipal::user("alice"))
    }

    fn parts(n: i32) -> Vec<Cached> {
        (0..n).map(|p| Cached::new(name("t"), [0; 16], p, 0, 1024)).collect()
    }

    fn answered(records: usize, hw: i64) -> Answered {
        Answered { error_code: 0, high_watermark: hw, log_start_offset: 0, records }
    }

    /// Answers for partitions 0, 1, 2... of topic "t", in that order.
    fn keyed(order: &[i32], answers: &[Answered]) -> Vec<(Key, Answered)> {
        order.iter().zip(answers).map(|(p, a)| ((name("t"), [0; 16], *p), *a)).collect()
    }

    #[test]
    fn a_session_answers_only_what_changed_and_rotates_partitions_that_returned_records() {
        let s = FetchSessions::new(10, 1000);
        let p = alice();
        assert_eq!(s.begin(&p, 0, INITIAL_EPOCH, false, Changes::default(), 0), Context::Full);
        let id = s.create(&p, false, parts(3), 0);
        assert!(id > 0);
        // Epoch 1, nothing changed: every partition is read; the first
        // answer about each is news (the cache has not seen a watermark).
        let Context::Incremental { id: got, partitions } = s.begin(&p, id, 1, false, Changes::default(), 1) else { panic!() };
        assert_eq!((got, partitions.len()), (id, 3));
        assert_eq!(s.answered(id, &keyed(&[0, 1, 2], &[answered(0, 5), answered(0, 5), answered(0, 5)])), vec![true, true, true]);
        // Epoch 2: only partition 1 moved.
        let Context::Incremental { partitions, .. } = s.begin(&p, id, 2, false, Changes::default(), 2) else { panic!() };
        assert_eq!(partitions.iter().map(|c| c.partition).collect::<Vec<_>>(), vec![0, 1, 2]);
        assert_eq!(s.answered(id, &keyed(&[0, 1, 2], &[answered(0, 5), answered(100, 9), answered(0, 5)])), vec![false, true, false]);
        // It returned records: it goes to the end. The client moves its
        // offset and names only that partition.
        let changes = Changes { fetch: vec![((name("t"), [0; 16], 1), 9, 1024)], forget: vec![] };
        let Context::Incremental { partitions, .. } = s.begin(&p, id, 3, false, changes, 3) else { panic!() };
        assert_eq!(partitions.iter().map(|c| (c.partition, c.fetch_offset)).collect::<Vec<_>>(), vec![(0, 0), (2, 0), (1, 9)]);
        // An error is always sent, and the partition again once it clears.
        assert_eq!(s.answered(id, &keyed(&[0, 2, 1], &[Answered { error_code: 3, ..answered(0, 5) }, answered(0, 5), answered(0, 9)])), vec![true, false, false]);
        let Context::Incremental { .. } = s.begin(&p, id, 4, false, Changes::default(), 4) else { panic!() };
        assert_eq!(s.answered(id, &keyed(&[0, 2, 1], &[answered(0, 5), answered(0, 5), answered(0, 9)])), vec![true, false, false]);
        // Answers in another order than the session's (a later epoch went
        // on meanwhile) still land on their own partitions.
        let Context::Incremental { .. } = s.begin(&p, id, 5, false, Changes::default(), 5) else { panic!() };
        assert_eq!(s.answered(id, &keyed(&[1, 0, 7], &[answered(0, 9), answered(0, 6), answered(0, 1)])), vec![false, true, true]);
    }

    #[test]
    fn wrong_ids_epochs_and_principals_get_kafkas_errors_and_change_nothing() {
        let s = FetchSessions::new(10, 1000);
        let p = alice();
        let id = s.create(&p, false, parts(2), 0);
        let not_found = Context::Error(E::FetchSessionIdNotFound.code());
        let bad_epoch = Context::Error(E::InvalidFetchSessionEpoch.code());
        assert_eq!(s.begin(&p, id.wrapping_add(1).max(1), 1, false, Changes::default(), 0), not_found, "never issued");
        assert_eq!(s.begin(&p, 0, 1, false, Changes::default(), 0), not_found, "an epoch without a session");
        assert_eq!(s.begin(&p, -5, 3, false, Changes::default(), 0), not_found);
        assert_eq!(s.begin(&Arc::new(KafkaPrincipal::user("mallory")), id, 1, false, Changes::default(), 0), not_found, "another principal's session");
        assert_eq!(s.begin(&p, id, 2, false, Changes::default(), 0), bad_epoch, "ahead");
        assert_eq!(s.begin(&p, id, i32::MAX, false, Changes::default(), 0), bad_epoch);
        // None of that moved the epoch or touched the partitions.
        let forget = Changes { fetch: vec![], forget: vec![(name("t"), [0; 16], 0)] };
        let Context::Incremental { partitions, .. } = s.begin(&p, id, 1, false, forget, 0) else { panic!() };
        assert_eq!(partitions.len(), 1);
        assert_eq!(s.begin(&p, id, 1, false, Changes::default(), 0), bad_epoch, "an epoch already used (a repeated request)");
        // Mallory cannot close it either.
        assert_eq!(s.begin(&Arc::new(KafkaPrincipal::user("mallory")), id, FINAL_EPOCH, false, Changes::default(), 0), Context::Sessionless);
        assert!(matches!(s.begin(&p, id, 2, false, Changes::default(), 0), Context::Incremental { .. }));
        // Its owner can; then the id is unknown.
        assert_eq!(s.begin(&p, id, FINAL_EPOCH, false, Changes::default(), 0), Context::Sessionless);
        assert_eq!(s.begin(&p, id, 3, false, Changes::default(), 0), not_found);
        assert_eq!(s.stats(), (0, 0));
    }

    #[test]
    fn forgetting_every_partition_ends_the_session() {
        let s = FetchSessions::new(10, 1000);
        let p = alice();
        let id = s.create(&p, false, parts(2), 0);
        let forget = Changes { fetch: vec![], forget: vec![(name("t"), [0; 16], 0), (name("t"), [0; 16], 1), (name("t"), [0; 16], 1), (name("nope"), [0; 16], 7)] };
        assert_eq!(s.begin(&p, id, 1, false, forget, 0), Context::Sessionless);
        assert_eq!(s.stats(), (0, 0));
    }

    #[test]
    fn the_cache_is_bounded_and_evicts_as_kafka_does() {
        let s = FetchSessions::new(2, 1000);
        let p = alice();
        let a = s.create(&p, false, parts(5), 0);
        let b = s.create(&p, false, parts(10), 0);
        // Full, nobody stale, nobody past protection: no session.
        assert_eq!(s.create(&p, false, parts(50), 1000), 0);
        // Both in use, and past their protection: a larger session evicts
        // the smallest; a smaller one evicts nothing.
        let now = EVICTION_MS + 1;
        assert!(matches!(s.begin(&p, a, 1, false, Changes::default(), now), Context::Incremental { .. }));
        assert!(matches!(s.begin(&p, b, 1, false, Changes::default(), now), Context::Incremental { .. }));
        assert_eq!(s.create(&p, false, parts(3), now), 0, "not larger than any");
        let c = s.create(&p, false, parts(50), now);
        assert!(c > 0);
        assert_eq!(s.evictions.load(Ordering::Relaxed), 1);
        assert_eq!(s.begin(&p, a, 2, false, Changes::default(), now), Context::Error(E::FetchSessionIdNotFound.code()), "the smallest went");
        assert!(matches!(s.begin(&p, b, 2, false, Changes::default(), now + 10), Context::Incremental { .. }));
        // A session unused for the eviction time goes first, whatever its
        // size: c was last used at `now`, b at `now + 10`.
        let d = s.create(&p, false, parts(1), now + EVICTION_MS + 5);
        assert!(d > 0);
        assert_eq!(s.begin(&p, c, 1, false, Changes::default(), now + EVICTION_MS + 5), Context::Error(E::FetchSessionIdNotFound.code()), "the stale one went");
        assert_eq!(s.stats(), (2, 11));
        // The partition bound: a session larger than the cache is never
        // made, and growing one past it ends it.
        let s = FetchSessions::new(10, 100);
        assert_eq!(s.create(&p, false, parts(101), 0), 0);
        let id = s.create(&p, false, parts(60), 0);
        let grow = Changes { fetch: (0..50).map(|i| ((name("u"), [0; 16], i), 0, 1)).collect(), forget: vec![] };
        assert_eq!(s.begin(&p, id, 1, false, grow, 0), Context::Error(E::FetchSessionIdNotFound.code()));
        assert_eq!(s.stats(), (0, 0));
    }

    #[test]
    fn epochs_wrap_past_the_largest() {
        assert_eq!(next_epoch(INITIAL_EPOCH), 1);
        assert_eq!(next_epoch(i32::MAX), 1);
        assert_eq!(next_epoch(FINAL_EPOCH), FINAL_EPOCH);
    }
}
