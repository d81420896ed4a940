//! Ordered subtree streams as Kafka topics: `<prefix>.__all` reads the
//! subtree of the topic tree under `prefix` (the topic `prefix` and every
//! topic whose name continues with `prefix.`), `__all` the whole stream,
//! each as one read-only partition in arrival order.
//!
//! Offsets are `(stream sequence number << 24) | record index`
//! ([`tagged`]): sparse and increasing, stable across restarts (sequence
//! numbers are in the frames), so a consumer group can commit on them. The
//! high watermark is the first sequence number not yet published, shifted;
//! the log start the oldest sequence number a branch of the subtree still
//! holds. Records come re-encoded with their source in headers (see
//! [`tagged`]); control batches are left out, and a `read_committed`
//! stream leaves out aborted transactions and stops at the first batch of
//! a transaction still open (the stream's last stable offset). A read
//! that reaches the published end closes with a control batch at the high
//! watermark - 1 (see [`SubtreeRead::tail`]), so consumers get there.

use std::collections::HashMap;

use bytes::Bytes;

use super::{topics, Engine, EngineError, Topic};
use crate::protocol::batch::{self, BatchHeader};
use crate::protocol::tagged::{self, split_offset, virtual_offset, Source};
use crate::storage::tip::Pick;
use crate::storage::{self, ReadError, TopicId, Tp};
use std::sync::Arc;

/// The name of the whole stream, and the last segment of a subtree's.
pub const ALL: &str = "__all";

/// A subtree of the topic tree, as a virtual topic names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Subtree {
    /// None: the whole stream.
    prefix: Option<String>,
}

/// What a subtree fetch returns.
#[derive(Debug, Default)]
pub struct SubtreeRead {
    /// Re-encoded batches, in stream order.
    pub records: Vec<Bytes>,
    pub high_watermark: i64,
    pub log_start: i64,
    /// Where a `read_committed` stream stops (else the high watermark).
    pub last_stable: i64,
    pub from_tip: bool,
    /// When the read looked at everything up to some point past the last
    /// record it returns (the published end, or where its scan budget ran
    /// out): a control batch just below that point, which every client
    /// skips and steps past. It is how a consumer of a sparse stream gets
    /// past other topics' data and reaches the end (partition EOF, lag 0).
    /// Not data: it does not count towards a fetch's `min_bytes`.
    pub tail: Option<Bytes>,
    /// The read ran out of its scan budget before the published end: the
    /// consumer should fetch again at once (the tail moves it past what
    /// was looked at), not wait.
    pub more: bool,
}

impl Subtree {
    /// The subtree a virtual topic name stands for: `__all`, or
    /// `<prefix>.__all` with a legal topic name as prefix. None for any
    /// other name.
    pub fn parse(name: &str) -> Option<Subtree> {
        if name == ALL {
            return Some(Subtree { prefix: None });
        }
        let prefix = name.strip_suffix(ALL)?.strip_suffix('.')?;
        topics::validate_name(prefix).ok()?;
        Some(Subtree { prefix: Some(prefix.to_owned()) })
    }

    /// Whether the topic named `topic` is in the subtree.
    pub fn contains(&self, topic: &str) -> bool {
        match &self.prefix {
            None => true,
            Some(p) => topic.strip_prefix(p.as_str()).is_some_and(|rest| rest.is_empty() || rest.starts_with('.')),
        }
    }

    /// Whether branch `branch` can hold topics of the subtree.
    fn picks_branch(&self, branch: &str) -> bool {
        match &self.prefix {
            None => true,
            Some(p) => {
                let own = storage::branch_of(p);
                // Deeper than a branch: inside that one branch. Else every
                // branch under the prefix.
                if own.len() < p.len() { branch == own } else { self.contains(branch) }
            }
        }
    }

    /// The stream's topic name: `<prefix>.__all`, or `__all`.
    pub fn name(&self) -> String {
        self.prefix.as_deref().map_or_else(|| ALL.to_owned(), |p| format!("{p}.{ALL}"))
    }

    /// A stable topic id for the virtual topic (Metadata v10+ reports one).
    pub fn id(&self) -> TopicId {
        let name = self.name();
        let mut id = [0u8; 16];
        for (half, salt) in [(0usize, 0xcbf2_9ce4_8422_2325u64), (8, 0x8422_2325_cbf2_9ce4)] {
            // FNV-1a, twice with different bases.
            let h = name.bytes().fold(salt, |h, b| (h ^ b as u64).wrapping_mul(0x100_0000_01b3));
            id[half..half + 8].copy_from_slice(&h.to_be_bytes());
        }
        id
    }
}

impl Engine {
    /// The subtree `name` stands for, if it is a virtual topic's name and
    /// the subtree holds a topic (`__all` always exists). Linear in the
    /// number of topics when the prefix is not itself a topic.
    pub fn subtree(&self, name: &str) -> Option<Subtree> {
        let s = Subtree::parse(name)?;
        let Some(p) = &s.prefix else { return Some(s) };
        // `p` itself, or the first name after `p.`: one step in the sorted
        // map, however many topics there are.
        let topics = self.topics.read().expect("topics lock");
        let below = format!("{p}.");
        let exists = topics.contains(p.as_str()) || topics.range::<str, _>((std::ops::Bound::Included(below.as_str()), std::ops::Bound::Unbounded)).next().is_some_and(|t| t.0.name().starts_with(&below));
        exists.then_some(s)
    }

    /// The topics of the subtree, in name order. Linear in the number of
    /// topics when the subtree is `__all`, else in the subtree's.
    pub fn subtree_topics(&self, s: &Subtree) -> Vec<Arc<Topic>> {
        let topics = self.topics.read().expect("topics lock");
        let Some(p) = &s.prefix else { return topics.iter().map(|t| t.0.clone()).collect() };
        topics.range::<str, _>((std::ops::Bound::Included(p.as_str()), std::ops::Bound::Unbounded)).take_while(|t| t.0.name().starts_with(p.as_str())).filter(|t| s.contains(t.0.name())).map(|t| t.0.clone()).collect()
    }

    /// The stream's id, remembered so [`Engine::subtree_by_id`] finds it
    /// (Metadata gives ids out through here). The memory is bounded: past
    /// `STREAM_IDS` streams it starts over, and a client whose id was
    /// forgotten gets UNKNOWN_TOPIC_ID and asks Metadata again.
    pub fn stream_id(&self, s: &Subtree) -> TopicId {
        const STREAM_IDS: usize = 65_536;
        let id = s.id();
        let mut ids = self.stream_ids.lock().expect("stream ids");
        if ids.len() >= STREAM_IDS && !ids.contains_key(&id) {
            ids.clear();
        }
        ids.entry(id).or_insert_with(|| s.name());
        id
    }

    /// The subtree stream with this id, if Metadata gave it out and it
    /// still has topics.
    pub fn subtree_by_id(&self, id: &TopicId) -> Option<Subtree> {
        let name = self.stream_ids.lock().expect("stream ids").get(id).cloned()?;
        self.subtree(&name)
    }

    fn subtree_branches(&self, s: &Subtree) -> Vec<String> {
        self.storage.branches_where(|b| s.picks_branch(b))
    }

    /// (log start, high watermark) of a subtree stream.
    pub fn subtree_offsets(&self, s: &Subtree) -> (i64, i64) {
        let branches = self.subtree_branches(s);
        let visible = self.storage.visible_seq();
        (virtual_offset(self.storage.stream_start(&branches).min(visible), 0), virtual_offset(visible, 0))
    }

    /// Reads the subtree stream from virtual offset `offset`, up to about
    /// `max_bytes` of re-encoded batches (at least one with `min_one`).
    /// Does file I/O.
    ///
    /// `may_read` says which topics' records the reader may have: the
    /// others are passed over inside the merge like control batches, so no
    /// stream carries a sibling's data to a reader who may not read it.
    /// It is asked once per topic per read.
    #[allow(clippy::too_many_arguments)]
    pub fn read_subtree(&self, s: &Subtree, offset: i64, max_bytes: usize, min_one: bool, read_committed: bool, may_read: &dyn Fn(&str) -> bool) -> Result<SubtreeRead, EngineError> {
        let branches = self.subtree_branches(s);
        let (log_start, hw) = self.subtree_offsets(s);
        if offset < log_start || offset > hw {
            return Err(ReadError::OffsetOutOfRange { offset, log_start, end: hw }.into());
        }
        let (from_seq, skip) = split_offset(offset);
        let mut topics: HashMap<TopicId, Option<Arc<Topic>>> = HashMap::new();
        let mut starts: HashMap<Tp, i64> = HashMap::new();
        let mut stopped = None;
        let txns = self.any_txns.load(std::sync::atomic::Ordering::Acquire).then(|| self.txns.clone());
        let read = {
            let mut pick = |seq: u64, tp: &Tp, last_offset: i64, bytes: &[u8]| -> Pick {
                let topic = topics.entry(tp.topic).or_insert_with(|| self.topic_by_id(&tp.topic).filter(|t| s.contains(t.name()) && may_read(t.name())));
                if topic.is_none() {
                    return Pick::Skip;
                }
                // Below the tp's log start: deleted by retention.
                if last_offset < *starts.entry(*tp).or_insert_with(|| self.storage.offsets(tp).map_or(i64::MAX, |o| o.0)) {
                    return Pick::Skip;
                }
                let Ok(h) = BatchHeader::parse(bytes) else { return Pick::Skip };
                if seq == from_seq && skip > h.last_offset_delta as i64 {
                    return Pick::Skip; // the consumer has all of it
                }
                if let (Some(t), true) = (&txns, read_committed) {
                    let t = t.read().expect("txns lock");
                    if t.first_unstable(tp).is_some_and(|f| last_offset >= f) {
                        stopped = Some(seq);
                        return Pick::Stop;
                    }
                    if h.is_transactional() && !h.is_control() && t.is_aborted(tp, h.producer_id, h.base_offset) {
                        return Pick::Skip;
                    }
                }
                if h.is_control() { Pick::Skip } else { Pick::Take }
            };
            self.storage.read_stream(&branches, from_seq, max_bytes, min_one, &mut pick)?
        };
        let hw = virtual_offset(read.visible_seq, 0);
        let mut out = SubtreeRead { records: Vec::new(), high_watermark: hw, log_start, last_stable: stopped.map_or(hw, |s| virtual_offset(s, 0)), from_tip: read.from_tip, tail: None, more: false };
        let mut total = 0usize;
        let examined_to = virtual_offset(read.examined_to, 0);
        out.more = examined_to < hw;
        let mut complete = !read.cut && stopped.is_none();
        let mut next = offset;
        for m in read.batches {
            let Some(Some(topic)) = topics.get(&m.tp.topic) else { continue };
            let src = Source { topic: topic.name(), partition: m.tp.partition, base_offset: m.base_offset, seq: m.seq };
            let limit = self.cfg.max_inflated_batch_bytes.max(topic.config.max_message_bytes.max(0) as usize);
            let mut buf = Vec::with_capacity(m.bytes.len() + 64);
            match tagged::tag_batch(&m.bytes, src, if m.seq == from_seq { skip } else { 0 }, limit, &mut buf) {
                Ok(Some(after)) => {
                    if total > 0 && total + buf.len() > max_bytes || total == 0 && !min_one && buf.len() > max_bytes {
                        complete = false;
                        break;
                    }
                    total += buf.len();
                    out.records.push(Bytes::from(buf));
                    next = after;
                }
                Ok(None) => {}
                Err(e) => tracing::error!(topic = topic.name(), partition = m.tp.partition, offset = m.base_offset, error = %e,
                    "stored batch does not decode for a subtree stream; left out"),
            }
        }
        if complete && next < examined_to {
            let mut end = batch::control_batch(batch::Marker::Commit, -1, -1, 0, self.now_ms());
            batch::set_base_offset(&mut end, examined_to - 1);
            out.tail = Some(Bytes::from(end));
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn virtual_names() {
        assert_eq!(Subtree::parse("__all"), Some(Subtree { prefix: None }));
        assert_eq!(Subtree::parse("app.__all"), Some(Subtree { prefix: Some("app".into()) }));
        assert_eq!(Subtree::parse("app.b.c.__all"), Some(Subtree { prefix: Some("app.b.c".into()) }));
        for not in ["app", "app__all", ".__all", "app.__all.x", "__consumer_offsets", "a.__x.__all", "a b.__all", "app.__ALL"] {
            assert_eq!(Subtree::parse(not), None, "{not}");
        }
    }

    #[test]
    fn subtree_membership() {
        let s = Subtree::parse("app.b.__all").unwrap();
        assert!(s.contains("app.b") && s.contains("app.b.y") && s.contains("app.b.y.z"));
        assert!(!s.contains("app.bx") && !s.contains("app") && !s.contains("app.a.b"));
        assert!(s.picks_branch("app.b") && !s.picks_branch("app.bx") && !s.picks_branch("app"));
        let s = Subtree::parse("app.__all").unwrap();
        assert!(s.picks_branch("app") && s.picks_branch("app.a") && !s.picks_branch("apps.a"));
        let s = Subtree::parse("app.b.c.__all").unwrap();
        assert!(s.picks_branch("app.b") && !s.picks_branch("app.c"));
        assert!(s.contains("app.b.c.d") && !s.contains("app.b.cd") && !s.contains("app.b"));
        assert!(Subtree::parse("__all").unwrap().picks_branch("x"));
        assert_ne!(Subtree::parse("a.__all").unwrap().id(), Subtree::parse("b.__all").unwrap().id());
    }
}
