//! Transactions as the partitions see them.
//!
//! Per tp: the transactions with data in it that have not ended yet (each
//! producer's first offset in it), and the aborted ones (producer, first
//! offset, marker offset). From these come the last stable offset (LSO:
//! the first offset of the oldest open transaction, else the high
//! watermark) that bounds `read_committed` fetches, and the aborted list a
//! fetch returns so the consumer drops the aborted records.
//!
//! Beside that, which partitions the transaction coordinator has added to
//! which producer's transaction (`open`): the writer refuses a
//! transactional batch for a partition its transaction has not added
//! (KIP-890's check), so no batch can start a transaction the coordinator
//! will never end.
//!
//! The writer thread changes it (batches and markers are appended there)
//! and the coordinator adds partitions; fetches read it under a read lock.
//! It is saved with the producer snapshot and rebuilt by the same replay.

use std::collections::{HashMap, VecDeque};

use serde::{Deserialize, Serialize};

use crate::protocol::batch::Marker;
use crate::storage::Tp;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct AbortedTxn {
    pub producer_id: i64,
    pub first_offset: i64,
    /// The abort marker's offset.
    pub last_offset: i64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct OpenTxn {
    pub producer_id: i64,
    pub epoch: i16,
    pub first_offset: i64,
}

#[derive(Debug, Default, Clone, Serialize, Deserialize)]
pub struct TpTxns {
    /// Transactions with data here and no marker yet; few at a time.
    pub ongoing: Vec<OpenTxn>,
    /// Aborted transactions in marker order.
    pub aborted: VecDeque<AbortedTxn>,
}

/// A verification guard older than this is dropped when the next is
/// taken (a verification answers well within it: the call timeout is 35 s).
pub const GUARD_TTL_MS: i64 = 60_000;

/// Verification guards (KIP-890) by key: a token taken before a
/// transaction's coordinator is asked, redeemed when the answer comes, and
/// dropped by the transaction's marker, so an answer that crossed the
/// transaction's end is told apart. Tokens are never reused; one its
/// request never redeemed (cancelled with its connection) goes once it is
/// [`GUARD_TTL_MS`] old.
#[derive(Debug, Clone)]
pub struct Guards<K> {
    last: u64,
    by: HashMap<K, HashMap<u64, i64>>,
}

impl<K> Default for Guards<K> {
    fn default() -> Self {
        Guards { last: 0, by: HashMap::new() }
    }
}

impl<K: std::hash::Hash + Eq> Guards<K> {
    /// A new token for `key`, taken at `now_ms`.
    pub fn take(&mut self, key: K, now_ms: i64) -> u64 {
        self.by.retain(|_, tokens| {
            tokens.retain(|_, born| now_ms - *born < GUARD_TTL_MS);
            !tokens.is_empty()
        });
        self.last += 1;
        self.by.entry(key).or_default().insert(self.last, now_ms);
        self.last
    }

    /// Uses `token` up: whether it still stood.
    pub fn redeem(&mut self, key: &K, token: u64) -> bool {
        let Some(tokens) = self.by.get_mut(key) else { return false };
        let stood = tokens.remove(&token).is_some();
        if tokens.is_empty() {
            self.by.remove(key);
        }
        stood
    }

    /// Drops `key`'s tokens (its transaction's marker came).
    pub fn drop_key(&mut self, key: &K) {
        self.by.remove(key);
    }

    /// Drops the tokens of every key `gone` says.
    pub fn drop_where(&mut self, gone: impl Fn(&K) -> bool) {
        self.by.retain(|k, _| !gone(k));
    }

    /// The last token taken (0: none yet).
    pub fn last(&self) -> u64 {
        self.last
    }

    /// How many keys hold a token.
    pub fn len(&self) -> usize {
        self.by.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by.is_empty()
    }
}

#[derive(Debug, Default, Clone)]
pub struct Txns {
    tps: HashMap<Tp, TpTxns>,
    /// Partitions added to a producer's transaction, with its epoch.
    open: HashMap<(i64, Tp), i16>,
    /// Verification guards (KIP-890): taken before a leader asks the
    /// transaction's coordinator (another node) whether a partition is in
    /// the transaction; a marker for the producer there removes them, so
    /// an answer that crossed the transaction's end adds nothing. Not
    /// kept in snapshots.
    verifying: Guards<(i64, Tp)>,
}

impl Txns {
    pub fn is_empty(&self) -> bool {
        self.tps.is_empty() && self.open.is_empty()
    }

    /// The coordinator added `tp` to the transaction of `producer_id` at
    /// `epoch`.
    pub fn add_partition(&mut self, producer_id: i64, epoch: i16, tp: Tp) {
        self.open.insert((producer_id, tp), epoch);
    }

    /// A verification guard for `producer_id`'s batches to `tp`.
    pub fn begin_verification(&mut self, producer_id: i64, tp: Tp, now_ms: i64) -> u64 {
        self.verifying.take((producer_id, tp), now_ms)
    }

    /// The coordinator said `tp` is in (`producer_id`, `epoch`)'s
    /// transaction: added if `guard` still stands (no marker for the
    /// producer reached `tp` since it was taken); the guard is used up
    /// either way. False: the transaction ended while the answer
    /// travelled.
    pub fn add_verified(&mut self, producer_id: i64, epoch: i16, tp: Tp, guard: u64) -> bool {
        let stood = self.verifying.redeem(&(producer_id, tp), guard);
        if stood {
            self.add_partition(producer_id, epoch, tp);
        }
        stood
    }

    /// Gives `guard` back unused (the verification failed); whether it
    /// still stood.
    pub fn release_verification(&mut self, producer_id: i64, tp: Tp, guard: u64) -> bool {
        self.verifying.redeem(&(producer_id, tp), guard)
    }

    /// The transaction is being decided: no more of its batches for `tp`.
    pub fn close_partition(&mut self, producer_id: i64, tp: &Tp) {
        self.open.remove(&(producer_id, *tp));
        self.verifying.drop_key(&(producer_id, *tp));
    }

    /// Forgets everything of `tp` (before it is replayed from scratch).
    pub fn forget_tp(&mut self, tp: &Tp) {
        self.tps.remove(tp);
        self.open.retain(|(_, t), _| t != tp);
        self.verifying.drop_where(|(_, t)| t == tp);
    }

    /// Whether a transactional batch of this producer and epoch may go to
    /// `tp`.
    pub fn admits(&self, producer_id: i64, epoch: i16, tp: &Tp) -> bool {
        self.open.get(&(producer_id, *tp)) == Some(&epoch)
    }

    /// A transactional data batch was appended at `base_offset`.
    pub fn on_batch(&mut self, tp: Tp, producer_id: i64, epoch: i16, base_offset: i64) {
        let t = self.tps.entry(tp).or_default();
        if !t.ongoing.iter().any(|o| o.producer_id == producer_id) {
            t.ongoing.push(OpenTxn { producer_id, epoch, first_offset: base_offset });
        }
    }

    /// A marker for `producer_id` was appended at `offset`.
    pub fn on_marker(&mut self, tp: Tp, producer_id: i64, marker: Marker, offset: i64) {
        self.open.remove(&(producer_id, tp));
        self.verifying.drop_key(&(producer_id, tp));
        let Some(t) = self.tps.get_mut(&tp) else { return };
        let Some(i) = t.ongoing.iter().position(|o| o.producer_id == producer_id) else { return };
        let open = t.ongoing.swap_remove(i);
        if marker == Marker::Abort {
            t.aborted.push_back(AbortedTxn { producer_id, first_offset: open.first_offset, last_offset: offset });
        }
        if t.ongoing.is_empty() && t.aborted.is_empty() {
            self.tps.remove(&tp);
        }
    }

    /// The first offset of the oldest transaction still open in `tp`.
    pub fn first_unstable(&self, tp: &Tp) -> Option<i64> {
        self.tps.get(tp)?.ongoing.iter().map(|o| o.first_offset).min()
    }

    /// Aborted transactions with records in `[from, to)`: (producer id,
    /// first offset), as a fetch returns them.
    pub fn aborted_in(&self, tp: &Tp, from: i64, to: i64) -> Vec<(i64, i64)> {
        let Some(t) = self.tps.get(tp) else { return Vec::new() };
        // Marker offsets grow along the list: skip those ending before `from`.
        let start = t.aborted.partition_point(|a| a.last_offset < from);
        t.aborted.range(start..).filter(|a| a.first_offset < to).map(|a| (a.producer_id, a.first_offset)).collect()
    }

    /// Whether the batch of `producer_id` at `offset` in `tp` belongs to an
    /// aborted transaction.
    pub fn is_aborted(&self, tp: &Tp, producer_id: i64, offset: i64) -> bool {
        let Some(t) = self.tps.get(tp) else { return false };
        let start = t.aborted.partition_point(|a| a.last_offset < offset);
        t.aborted.range(start..).any(|a| a.producer_id == producer_id && a.first_offset <= offset)
    }

    /// Where `producer_id`'s open transaction starts in `tp`, if it has one.
    pub fn open_start(&self, tp: &Tp, producer_id: i64) -> Option<i64> {
        self.tps.get(tp)?.ongoing.iter().find(|o| o.producer_id == producer_id).map(|o| o.first_offset)
    }

    /// Open transactions per tp (for recovery: those the coordinator does
    /// not know of are aborted).
    pub fn ongoing(&self) -> Vec<(Tp, OpenTxn)> {
        self.tps.iter().flat_map(|(tp, t)| t.ongoing.iter().map(|o| (*tp, *o))).collect()
    }

    /// Forgets aborted transactions wholly below `log_start`.
    pub fn trim(&mut self, tp: &Tp, log_start: i64) {
        if let Some(t) = self.tps.get_mut(tp) {
            while t.aborted.front().is_some_and(|a| a.last_offset < log_start) {
                t.aborted.pop_front();
            }
            if t.ongoing.is_empty() && t.aborted.is_empty() {
                self.tps.remove(tp);
            }
        }
    }

    /// Forgets what lies at or past each tp's log end (None: the tp is
    /// gone), after a restart that recovered a shorter log.
    pub fn drop_beyond(&mut self, end: impl Fn(&Tp) -> Option<i64>) {
        self.tps.retain(|tp, t| {
            let Some(end) = end(tp) else { return false };
            t.ongoing.retain(|o| o.first_offset < end);
            t.aborted.retain(|a| a.last_offset < end);
            !(t.ongoing.is_empty() && t.aborted.is_empty())
        });
    }

    /// Forgets a deleted topic's partitions.
    pub fn remove_topic(&mut self, topic: &[u8; 16]) {
        self.tps.retain(|tp, _| &tp.topic != topic);
        self.open.retain(|(_, tp), _| &tp.topic != topic);
        self.verifying.drop_where(|(_, tp)| &tp.topic == topic);
    }

    pub fn to_snapshot(&self) -> Vec<(Tp, TpTxns)> {
        self.tps.iter().map(|(tp, t)| (*tp, t.clone())).collect()
    }

    pub fn from_snapshot(rows: Vec<(Tp, TpTxns)>) -> Txns {
        Txns { tps: rows.into_iter().collect(), ..Default::default() }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tp(p: i32) -> Tp {
        Tp { topic: [3; 16], partition: p }
    }

    /// KIP-890's guard at a partition's leader: a verification answered
    /// after the transaction's marker reached the partition adds nothing,
    /// so a late batch cannot open a transaction nobody will end.
    #[test]
    fn a_verification_that_crossed_the_marker_adds_nothing() {
        let mut t = Txns::default();
        let late = t.begin_verification(1, tp(0), 0);
        let other = t.begin_verification(1, tp(1), 0);
        t.on_marker(tp(0), 1, Marker::Abort, 5);
        assert!(!t.add_verified(1, 0, tp(0), late));
        assert!(!t.admits(1, 0, &tp(0)));
        // The guard on another partition stands, once.
        assert!(t.add_verified(1, 0, tp(1), other));
        assert!(t.admits(1, 0, &tp(1)));
        assert!(!t.add_verified(1, 0, tp(1), other));
        // A failed verification gives its guard back.
        let failed = t.begin_verification(2, tp(0), 0);
        assert!(t.release_verification(2, tp(0), failed));
        assert!(t.verifying.is_empty(), "no guard left behind");
        // A guard its request never used (cancelled) goes once it is old.
        let _abandoned = t.begin_verification(3, tp(0), 0);
        let fresh = t.begin_verification(4, tp(0), GUARD_TTL_MS);
        assert_eq!(t.verifying.len(), 1);
        assert!(t.add_verified(4, 0, tp(0), fresh));
    }

    #[test]
    fn the_stable_offset_waits_for_the_oldest_open_transaction() {
        let mut t = Txns::default();
        assert_eq!(t.first_unstable(&tp(0)), None);
        t.on_batch(tp(0), 1, 0, 10);
        t.on_batch(tp(0), 2, 0, 12);
        t.on_batch(tp(0), 1, 0, 14); // a later batch of the same transaction
        assert_eq!(t.first_unstable(&tp(0)), Some(10));
        t.on_marker(tp(0), 1, Marker::Commit, 20);
        assert_eq!(t.first_unstable(&tp(0)), Some(12));
        t.on_marker(tp(0), 2, Marker::Abort, 21);
        assert_eq!(t.first_unstable(&tp(0)), None);
        assert_eq!(t.aborted_in(&tp(0), 0, 100), vec![(2, 12)]);
        assert_eq!(t.aborted_in(&tp(0), 22, 100), vec![]);
        assert_eq!(t.aborted_in(&tp(0), 0, 12), vec![]);
        t.trim(&tp(0), 22);
        assert!(t.is_empty());
    }

    #[test]
    fn only_added_partitions_admit_transactional_batches_and_markers_close_them() {
        let mut t = Txns::default();
        t.add_partition(5, 3, tp(1));
        assert!(t.admits(5, 3, &tp(1)));
        assert!(!t.admits(5, 2, &tp(1)));
        assert!(!t.admits(5, 3, &tp(2)));
        t.on_marker(tp(1), 5, Marker::Commit, 0);
        assert!(!t.admits(5, 3, &tp(1)));
    }

    #[test]
    fn a_shorter_log_drops_what_it_lost() {
        let mut t = Txns::default();
        t.on_batch(tp(0), 1, 0, 5);
        t.on_marker(tp(0), 1, Marker::Abort, 9);
        t.on_batch(tp(0), 2, 0, 10);
        t.on_batch(tp(1), 3, 0, 0);
        let snap = Txns::from_snapshot(t.to_snapshot());
        let mut u = snap.clone();
        u.drop_beyond(|p| (p.partition == 0).then_some(10));
        assert_eq!(u.first_unstable(&tp(0)), None);
        assert_eq!(u.aborted_in(&tp(0), 0, 10), vec![(1, 5)]);
        assert_eq!(u.ongoing().len(), 0);
        assert_eq!(snap.ongoing().len(), 2);
    }
}
