//! Idempotent-producer state: per (producer id, tp), the producer's epoch
//! and the sequence ranges and offsets of its last [`WINDOW`] batches, as
//! Kafka keeps them. The writer thread owns it and consults it before every
//! append of a batch that carries a producer id, so the decision and the
//! append are one step: a retried batch is answered with the offsets it got
//! the first time and is not written again.
//!
//! The state survives restarts through a snapshot (encoded here, kept by
//! storage as a state file at clean shutdown and periodically, see
//! [`Producers::encode_snapshot`]) plus a
//! replay of the batches appended after it ([`Producers::replay`]). A
//! snapshot taken before a crash may remember batches whose bytes never
//! became durable; [`Producers::drop_beyond`] forgets every remembered batch
//! past the recovered log end, so a retry of a lost batch is written again
//! rather than answered with offsets that no longer exist.
//!
//! Single-threaded, no clock of its own, no I/O.

use std::collections::{HashMap, VecDeque};

use serde::{Deserialize, Serialize};

use super::txns::{TpTxns, Txns};
use crate::protocol::batch;
use crate::storage::{Storage, Tp};

/// Batches remembered per (producer, tp): Kafka's
/// `max.in.flight.requests.per.connection` limit for idempotence.
pub const WINDOW: usize = 5;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
struct Cached {
    first_seq: i32,
    last_seq: i32,
    base_offset: i64,
    last_offset: i64,
}

#[derive(Debug, Clone)]
struct Entry {
    epoch: i16,
    batches: VecDeque<Cached>,
    last_used_ms: i64,
    /// The largest timestamp of its last batch (-1: none seen).
    last_timestamp: i64,
    /// Every batch of this epoch since sequence 0 went through the check,
    /// so a sequence before the window was written: DUPLICATE is safe to
    /// say. Not so for state picked up mid-stream (expired, lost, or a
    /// producer first seen after a restart): there it is out of order.
    complete: bool,
    /// A marker moved this entry to a newer epoch and no batch of it came
    /// since: only sequence 0 may follow (the epoch a transaction v2 end
    /// hands the producer). Not kept in snapshots: a restart forgets
    /// entries without batches, and takes the producer from where it is.
    opened_by_marker: bool,
    /// The newest coordinator epoch of this producer's markers here (-1:
    /// none): a marker from an older one (a deposed transaction
    /// coordinator's, late) is refused (Kafka's
    /// TRANSACTION_COORDINATOR_FENCED). Snapshots keep it; an entry the
    /// window forgets at a restart or expiry forgets it too, as Kafka's.
    coordinator_epoch: i32,
}

/// What to do with a batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Check {
    /// Not idempotent, or the next batch in sequence: append it, then
    /// [`Producers::record`] its offsets.
    Append,
    /// A retry of a batch already written: answer with these offsets.
    Duplicate { base_offset: i64, last_offset: i64 },
    Refuse(Refusal),
}

/// Why a producer's batch is refused (each maps to the Kafka error a client
/// expects, in `kafka::errors`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// Producer fields that cannot be right (a negative sequence, no records).
    InvalidRecord,
    /// An epoch older than one already seen: a zombie producer.
    StaleEpoch,
    /// The sequence does not follow the last one written.
    OutOfOrder,
    /// The sequence overlaps batches written, but is not a retry of one.
    DuplicateSequence,
    /// A producer id this broker never handed out, or a producer this
    /// partition knows nothing of whose batch does not start at
    /// sequence 0.
    UnknownProducer,
    /// A transactional batch for a partition its transaction did not add.
    NotInTransaction,
    /// A transaction marker from a coordinator older than one whose
    /// marker this producer has here already (a deposed coordinator's).
    CoordinatorFenced,
}

/// The producer fields of a batch header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchIds {
    pub producer_id: i64,
    pub epoch: i16,
    pub base_sequence: i32,
    /// Records in the batch (last offset delta + 1).
    pub count: i32,
    /// The batch's largest timestamp (DescribeProducers shows the last).
    pub max_timestamp: i64,
}

impl BatchIds {
    /// The producer fields of a batch's header.
    pub fn of(h: &crate::protocol::batch::BatchHeader) -> BatchIds {
        BatchIds { producer_id: h.producer_id, epoch: h.producer_epoch, base_sequence: h.base_sequence, count: h.last_offset_delta.saturating_add(1), max_timestamp: h.max_timestamp }
    }

    fn last_seq(&self) -> i32 {
        // Sequences wrap at i32::MAX, as in Kafka.
        let last = self.base_sequence as i64 + self.count as i64 - 1;
        (last % (i32::MAX as i64 + 1)) as i32
    }
}

fn next_seq(seq: i32) -> i32 {
    if seq == i32::MAX {
        0
    } else {
        seq + 1
    }
}

const SNAPSHOT_VERSION: u32 = 1;

/// `producers.snapshot`: JSON, versioned.
#[derive(Serialize, Deserialize)]
struct SnapshotFile {
    version: u32,
    entries: Vec<SnapEntry>,
    /// (topic id hex, partition, log end the snapshot covers).
    covered: Vec<(String, i32, i64)>,
    /// Open and aborted transactions per tp (topic id hex, partition).
    #[serde(default)]
    txns: Vec<(String, i32, TpTxns)>,
}

#[derive(Serialize, Deserialize)]
struct SnapEntry {
    producer_id: i64,
    topic: String,
    partition: i32,
    epoch: i16,
    last_used_ms: i64,
    batches: Vec<Cached>,
    #[serde(default)]
    complete: bool,
    #[serde(default = "no_timestamp")]
    last_timestamp: i64,
    #[serde(default = "no_coordinator_epoch")]
    coordinator_epoch: i32,
}

fn no_timestamp() -> i64 {
    -1
}

fn no_coordinator_epoch() -> i32 {
    -1
}

/// A producer with state in a partition, as DescribeProducers shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ActiveProducer {
    pub producer_id: i64,
    pub epoch: i16,
    /// -1 when no batch of this epoch was seen (a fence alone).
    pub last_sequence: i32,
    pub last_timestamp: i64,
    /// Where its open transaction starts in the partition (-1: none).
    pub txn_start_offset: i64,
    /// The newest coordinator epoch of its markers here (-1: none), which
    /// `kafka-transactions abort` sends back on its marker.
    pub coordinator_epoch: i32,
}

/// A loaded snapshot: producer state, transactions, and the log end per tp
/// it covers.
pub type Loaded = (Producers, Txns, HashMap<Tp, i64>);

/// Producer state by partition, then producer id: what a partition's
/// producers are (DescribeProducers) is found without walking the others,
/// on the writer thread that owns it. No partition is kept without a
/// producer.
#[derive(Debug, Default, Clone)]
pub struct Producers {
    entries: HashMap<Tp, HashMap<i64, Entry>>,
}

impl Producers {
    /// (producer, tp) entries held.
    pub fn len(&self) -> usize {
        self.entries.values().map(HashMap::len).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The epoch `producer_id` has at `tp`, if this partition knows it.
    pub fn epoch_of(&self, tp: &Tp, producer_id: i64) -> Option<i16> {
        self.entries.get(tp).and_then(|m| m.get(&producer_id)).map(|e| e.epoch)
    }

    /// The entry of `producer_id` in `tp`, made with `new` if it has none.
    fn entry(&mut self, tp: Tp, producer_id: i64, new: impl FnOnce() -> Entry) -> &mut Entry {
        self.entries.entry(tp).or_default().entry(producer_id).or_insert_with(new)
    }

    /// The producers with state in each of `tps` (in order), each with
    /// the start of its open transaction there, if `txns` has one.
    pub fn describe(&self, tps: &[Tp], txns: &Txns) -> Vec<Vec<ActiveProducer>> {
        tps.iter()
            .map(|tp| {
                let mut list: Vec<ActiveProducer> = self
                    .entries
                    .get(tp)
                    .into_iter()
                    .flatten()
                    .map(|(pid, e)| ActiveProducer {
                        producer_id: *pid,
                        epoch: e.epoch,
                        last_sequence: e.batches.back().map_or(-1, |c| c.last_seq),
                        last_timestamp: e.last_timestamp,
                        txn_start_offset: txns.open_start(tp, *pid).unwrap_or(-1),
                        coordinator_epoch: e.coordinator_epoch,
                    })
                    .collect();
                list.sort_by_key(|p| p.producer_id);
                list
            })
            .collect()
    }

    /// The tps some producer has state in: once per producer there, in no
    /// order.
    pub fn tps(&self) -> impl Iterator<Item = Tp> + '_ {
        self.entries.iter().flat_map(|(tp, m)| std::iter::repeat_n(*tp, m.len()))
    }

    /// Decides about one batch for `tp`.
    pub fn check(&self, tp: Tp, ids: BatchIds) -> Check {
        if ids.producer_id < 0 {
            return Check::Append;
        }
        if ids.base_sequence < 0 || ids.count <= 0 {
            return Check::Refuse(Refusal::InvalidRecord);
        }
        let Some(e) = self.entries.get(&tp).and_then(|m| m.get(&ids.producer_id)) else {
            // Nothing known of this producer here. Its first batch starts
            // at sequence 0. A later one means the batches before it are
            // not here: refused or lost before they were appended (a
            // pipelined request that met a leader change, a node that
            // was not yet leader), or gone with state that expired. Taking
            // it would tell the client its earlier batches were written
            // too (librdkafka acknowledges them implicitly), so it is
            // refused with UNKNOWN_PRODUCER_ID, as Kafka did before
            // KIP-360: a client resets its producer id or epoch and sends
            // them again from sequence 0.
            return if ids.base_sequence == 0 { Check::Append } else { Check::Refuse(Refusal::UnknownProducer) };
        };
        if ids.epoch < e.epoch {
            return Check::Refuse(Refusal::StaleEpoch);
        }
        if ids.epoch > e.epoch {
            // A bumped epoch starts its sequences over.
            return if ids.base_sequence == 0 { Check::Append } else { Check::Refuse(Refusal::OutOfOrder) };
        }
        let last = ids.last_seq();
        if let Some(c) = e.batches.iter().find(|c| c.first_seq == ids.base_sequence && c.last_seq == last) {
            return Check::Duplicate { base_offset: c.base_offset, last_offset: c.last_offset };
        }
        let Some(newest) = e.batches.back() else {
            // A marker moved the epoch here (transactions v2 move it with
            // every end): its sequences start at 0, as in Kafka. Otherwise
            // nothing is known of the sequences (an entry a marker made
            // from nothing): take the producer from where it is.
            return if e.opened_by_marker && ids.base_sequence != 0 { Check::Refuse(Refusal::OutOfOrder) } else { Check::Append };
        };
        if ids.base_sequence == next_seq(newest.last_seq) {
            return Check::Append;
        }
        let oldest = e.batches.front().expect("non-empty").first_seq;
        if e.complete && ids.base_sequence < oldest && newest.last_seq >= oldest {
            // Before the window (and no wrap in it): written long ago.
            return Check::Refuse(Refusal::DuplicateSequence);
        }
        Check::Refuse(Refusal::OutOfOrder)
    }

    /// Records an appended batch.
    pub fn record(&mut self, tp: Tp, ids: BatchIds, base_offset: i64, last_offset: i64, now_ms: i64) {
        if ids.producer_id < 0 {
            return;
        }
        let e = self.entry(tp, ids.producer_id, || Entry {
            epoch: ids.epoch,
            batches: VecDeque::with_capacity(WINDOW),
            last_used_ms: now_ms,
            last_timestamp: -1,
            complete: ids.base_sequence == 0,
            opened_by_marker: false,
            coordinator_epoch: -1,
        });
        if ids.epoch != e.epoch || e.opened_by_marker {
            // A new epoch: its history starts here (from 0, or picked up
            // mid-stream).
            e.epoch = ids.epoch;
            e.batches.clear();
            e.complete = ids.base_sequence == 0;
            e.opened_by_marker = false;
        }
        let cached = Cached { first_seq: ids.base_sequence, last_seq: ids.last_seq(), base_offset, last_offset };
        // The same batch twice (a replay over state that already had it)
        // must not push an older one out of the window.
        if e.batches.contains(&cached) {
            e.last_used_ms = now_ms;
            return;
        }
        e.last_timestamp = ids.max_timestamp;
        e.batches.push_back(cached);
        if e.batches.len() > WINDOW {
            e.batches.pop_front();
        }
        e.last_used_ms = now_ms;
    }

    /// The newest coordinator epoch of `producer_id`'s markers at `tp`, if
    /// this partition knows one.
    pub fn coordinator_epoch_of(&self, tp: &Tp, producer_id: i64) -> Option<i32> {
        self.entries.get(tp).and_then(|m| m.get(&producer_id)).map(|e| e.coordinator_epoch).filter(|e| *e >= 0)
    }

    /// A transaction marker of `epoch` was written for this producer on
    /// `tp`, by a coordinator of `coordinator_epoch`: a newer epoch fences
    /// the older one there (its batches are refused from now on) and
    /// starts its sequences over; the coordinator epoch is the newest seen.
    pub fn fence(&mut self, tp: Tp, producer_id: i64, epoch: i16, coordinator_epoch: i32, now_ms: i64) {
        let e = self.entry(tp, producer_id, || Entry { epoch, batches: VecDeque::new(), last_used_ms: now_ms, last_timestamp: -1, complete: false, opened_by_marker: false, coordinator_epoch });
        e.coordinator_epoch = e.coordinator_epoch.max(coordinator_epoch);
        if epoch > e.epoch {
            e.epoch = epoch;
            e.batches.clear();
            e.complete = false;
            e.opened_by_marker = true;
        }
        e.last_used_ms = now_ms;
    }

    /// Forgets producers idle for `max_idle_ms` (Kafka's
    /// `producer.id.expiration.ms`); returns how many entries went.
    /// A producer with a transaction open in the tp (`open`) stays, as in
    /// Kafka: its next batch would otherwise be refused as unknown.
    pub fn expire(&mut self, now_ms: i64, max_idle_ms: i64, open: impl Fn(&Tp, i64) -> bool) -> usize {
        let before = self.len();
        self.entries.retain(|tp, m| {
            m.retain(|pid, e| now_ms - e.last_used_ms < max_idle_ms || open(tp, *pid));
            !m.is_empty()
        });
        before - self.len()
    }

    /// Forgets remembered batches at or past each tp's log end (`end`
    /// gives it; None: the tp is gone), and producers left with none.
    pub fn drop_beyond(&mut self, end: impl Fn(&Tp) -> Option<i64>) {
        self.entries.retain(|tp, m| {
            let Some(end) = end(tp) else { return false };
            m.retain(|_, e| {
                e.batches.retain(|c| c.last_offset < end);
                !e.batches.is_empty()
            });
            !m.is_empty()
        });
    }

    /// Forgets every producer's state in `tp` (before it is replayed from
    /// the log start).
    pub fn forget_tp(&mut self, tp: &Tp) {
        self.entries.remove(tp);
    }

    /// Takes one batch already in the log into the state — replayed, or a
    /// follower's copy of its leader's batch: a producer's batch is
    /// recorded, transactional batches and markers go to `txns` too.
    /// Returns whether it was a producer's batch.
    pub fn apply(&mut self, txns: &mut Txns, tp: Tp, b: &[u8], h: &batch::BatchHeader, now_ms: i64) -> bool {
        if h.producer_id < 0 {
            return false;
        }
        if h.is_control() {
            if let Some((marker, coordinator_epoch)) = batch::end_marker(b, h) {
                txns.on_marker(tp, h.producer_id, marker, h.base_offset);
                self.fence(tp, h.producer_id, h.producer_epoch, coordinator_epoch, now_ms);
            }
            return true;
        }
        self.record(tp, BatchIds::of(h), h.base_offset, h.last_offset(), now_ms);
        if h.is_transactional() {
            txns.on_batch(tp, h.producer_id, h.producer_epoch, h.base_offset);
        }
        true
    }

    /// Replays the batches of `tp` from `from` to its log end into the
    /// state, and transactional batches and markers into `txns`; returns
    /// how many producer batches it saw. (At start-up the log end is the
    /// high watermark; after a follower's truncation it may be past it.)
    pub fn replay(&mut self, txns: &mut Txns, storage: &Storage, tp: Tp, from: i64, now_ms: i64) -> Result<usize, crate::storage::ReadError> {
        let Some((log_start, _, end)) = storage.offsets(&tp) else { return Ok(0) };
        let mut offset = from.max(log_start);
        let mut seen = 0;
        while offset < end {
            let r = storage.read_for_replica(&tp, offset, 1 << 20, true)?;
            if r.records.is_empty() {
                break;
            }
            for part in &r.records {
                for b in batch::split(part) {
                    let Ok(b) = b else { break };
                    let Ok(h) = batch::BatchHeader::parse(b) else { break };
                    if h.last_offset() < offset {
                        continue;
                    }
                    if self.apply(txns, tp, b, &h, now_ms) {
                        seen += 1;
                    }
                }
            }
            if r.next_offset <= offset {
                break;
            }
            offset = r.next_offset;
        }
        Ok(seen)
    }

    /// The state, and for every tp the log end it covers, as a snapshot.
    /// The same state always encodes to the same bytes (entries in
    /// producer and tp order), whatever order the maps hold them in.
    pub fn encode_snapshot(&self, txns: &[(Tp, TpTxns)], covered: &[(Tp, i64)]) -> Vec<u8> {
        let mut entries: Vec<((i64, Tp), &Entry)> = self.entries.iter().flat_map(|(tp, m)| m.iter().map(move |(pid, e)| ((*pid, *tp), e))).collect();
        entries.sort_unstable_by_key(|(key, _)| *key);
        let mut txns: Vec<&(Tp, TpTxns)> = txns.iter().collect();
        txns.sort_unstable_by_key(|(tp, _)| *tp);
        let file = SnapshotFile {
            version: SNAPSHOT_VERSION,
            entries: entries
                .into_iter()
                .map(|((pid, tp), e)| SnapEntry {
                    producer_id: pid,
                    topic: crate::meta::hex(&tp.topic),
                    partition: tp.partition,
                    epoch: e.epoch,
                    last_used_ms: e.last_used_ms,
                    batches: e.batches.iter().copied().collect(),
                    complete: e.complete,
                    last_timestamp: e.last_timestamp,
                    coordinator_epoch: e.coordinator_epoch,
                })
                .collect(),
            covered: covered.iter().map(|(tp, end)| (crate::meta::hex(&tp.topic), tp.partition, *end)).collect(),
            txns: txns.iter().map(|(tp, t)| (crate::meta::hex(&tp.topic), tp.partition, t.clone())).collect(),
        };
        serde_json::to_vec(&file).expect("a snapshot of plain data encodes")
    }

    /// Decodes a snapshot: the state and the log end it covers per tp.
    pub fn decode_snapshot(raw: &[u8]) -> Result<Loaded, String> {
        let file: SnapshotFile = serde_json::from_slice(raw).map_err(|e| e.to_string())?;
        if file.version != SNAPSHOT_VERSION {
            return Err(format!("unknown snapshot version {}", file.version));
        }
        let tp = |topic: &str, partition: i32| crate::meta::unhex(topic).map(|topic| Tp { topic, partition }).ok_or_else(|| format!("bad topic id {topic:?}"));
        let mut p = Producers::default();
        for e in file.entries {
            if e.batches.len() > WINDOW {
                return Err("more batches than the window".into());
            }
            p.entries.entry(tp(&e.topic, e.partition)?).or_default().insert(e.producer_id, Entry { epoch: e.epoch, batches: e.batches.into(), last_used_ms: e.last_used_ms, complete: e.complete, last_timestamp: e.last_timestamp, opened_by_marker: false, coordinator_epoch: e.coordinator_epoch });
        }
        let mut covered = HashMap::new();
        for (topic, partition, end) in file.covered {
            covered.insert(tp(&topic, partition)?, end);
        }
        let mut txns = Vec::with_capacity(file.txns.len());
        for (topic, partition, t) in file.txns {
            txns.push((tp(&topic, partition)?, t));
        }
        Ok((p, Txns::from_snapshot(txns), covered))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tp() -> Tp {
        Tp { topic: [7; 16], partition: 0 }
    }

    fn ids(epoch: i16, seq: i32, count: i32) -> BatchIds {
        BatchIds { producer_id: 1000, epoch, base_sequence: seq, count, max_timestamp: 0 }
    }

    /// Appends as the writer would: check, then record at `next` offsets.
    fn append(p: &mut Producers, b: BatchIds, next: &mut i64) -> Check {
        let c = p.check(tp(), b);
        if c == Check::Append {
            p.record(tp(), b, *next, *next + b.count as i64 - 1, 0);
            *next += b.count as i64;
        }
        c
    }

    #[test]
    fn retries_in_the_window_get_their_first_offsets() {
        let mut p = Producers::default();
        let mut next = 100;
        for i in 0..7 {
            assert_eq!(append(&mut p, ids(0, i * 10, 10), &mut next), Check::Append);
        }
        // The last five batches (seq 20..69) are remembered.
        assert_eq!(p.check(tp(), ids(0, 60, 10)), Check::Duplicate { base_offset: 160, last_offset: 169 });
        assert_eq!(p.check(tp(), ids(0, 20, 10)), Check::Duplicate { base_offset: 120, last_offset: 129 });
        // Older than the window, with the whole history seen: a duplicate.
        assert_eq!(p.check(tp(), ids(0, 10, 10)), Check::Refuse(Refusal::DuplicateSequence));
        // A gap.
        assert_eq!(p.check(tp(), ids(0, 71, 1)), Check::Refuse(Refusal::OutOfOrder));
        // Same start, other length: not the batch we have.
        assert_eq!(p.check(tp(), ids(0, 60, 3)), Check::Refuse(Refusal::OutOfOrder));
        assert_eq!(append(&mut p, ids(0, 70, 1), &mut next), Check::Append);
    }

    /// The nemesis's lost records: a leader that refused a producer's
    /// first batches before appending them (it was not leader yet) then
    /// took the next pipelined one, and librdkafka counted the refused
    /// ones as written. A producer unknown here starts at sequence 0.
    #[test]
    fn a_producer_unknown_here_starts_at_sequence_0() {
        let mut p = Producers::default();
        let mut next = 0;
        assert_eq!(p.check(tp(), ids(0, 2, 1)), Check::Refuse(Refusal::UnknownProducer));
        assert_eq!(p.check(tp(), ids(3, 7, 4)), Check::Refuse(Refusal::UnknownProducer));
        assert_eq!(append(&mut p, ids(0, 0, 2), &mut next), Check::Append);
        assert_eq!(append(&mut p, ids(0, 2, 1), &mut next), Check::Append);
        // Per partition: another one has not seen this producer.
        assert_eq!(p.check(Tp { topic: [8; 16], partition: 0 }, ids(0, 3, 1)), Check::Refuse(Refusal::UnknownProducer));
        // State that expired: the client's next batch is refused, and it
        // starts over (a new id or epoch) at sequence 0.
        assert_eq!(p.expire(1_000_000, 1, |_, _| false), 1);
        assert_eq!(p.check(tp(), ids(0, 3, 1)), Check::Refuse(Refusal::UnknownProducer));
        assert_eq!(append(&mut p, ids(1, 0, 1), &mut next), Check::Append);
    }

    #[test]
    fn state_picked_up_mid_stream_never_claims_old_sequences_were_written() {
        let mut p = Producers::default();
        let mut next = 10;
        // First seen at sequence 60: a replay of a log whose earlier
        // batches retention took (a client's batch never starts there).
        p.record(tp(), ids(0, 60, 10), 0, 9, 0);
        assert_eq!(append(&mut p, ids(0, 70, 10), &mut next), Check::Append);
        // Sequence 50 may never have been written: out of order, so the
        // client does not take it for delivered.
        assert_eq!(p.check(tp(), ids(0, 50, 10)), Check::Refuse(Refusal::OutOfOrder));
        assert_eq!(p.check(tp(), ids(0, 60, 10)), Check::Duplicate { base_offset: 0, last_offset: 9 });
    }

    #[test]
    fn epochs_fence_and_restart_sequences() {
        let mut p = Producers::default();
        let mut next = 0;
        assert_eq!(append(&mut p, ids(3, 0, 5), &mut next), Check::Append);
        assert_eq!(p.check(tp(), ids(2, 5, 1)), Check::Refuse(Refusal::StaleEpoch));
        assert_eq!(p.check(tp(), ids(4, 5, 1)), Check::Refuse(Refusal::OutOfOrder));
        assert_eq!(append(&mut p, ids(4, 0, 2), &mut next), Check::Append);
        // The old epoch's batches are forgotten with it.
        assert_eq!(p.check(tp(), ids(4, 0, 2)), Check::Duplicate { base_offset: 5, last_offset: 6 });
        assert_eq!(p.check(tp(), ids(3, 0, 5)), Check::Refuse(Refusal::StaleEpoch));
        // A marker of a newer epoch (the end of a transaction v2) fences
        // the old one and opens the new one at sequence 0.
        p.fence(tp(), 1000, 5, 0, 0);
        assert_eq!(p.check(tp(), ids(4, 2, 1)), Check::Refuse(Refusal::StaleEpoch));
        assert_eq!(p.check(tp(), ids(5, 3, 1)), Check::Refuse(Refusal::OutOfOrder));
        assert_eq!(append(&mut p, ids(5, 0, 1), &mut next), Check::Append);
        assert_eq!(append(&mut p, ids(5, 1, 1), &mut next), Check::Append);
        assert_eq!(p.check(tp(), ids(5, 0, 1)), Check::Duplicate { base_offset: 7, last_offset: 7 });
        // A marker at the same epoch (transactions v1) changes nothing.
        p.fence(tp(), 1000, 5, 0, 0);
        assert_eq!(append(&mut p, ids(5, 2, 1), &mut next), Check::Append);
        // A marker that finds no entry (state expired, or the log's data
        // batches retired before it) knows no sequence: the producer is
        // taken from where it is, as without the marker.
        let mut q = Producers::default();
        q.fence(tp(), 1000, 5, 0, 0);
        assert_eq!(q.check(tp(), ids(5, 9, 1)), Check::Append);
    }

    #[test]
    fn sequences_wrap_and_non_idempotent_batches_pass() {
        let mut p = Producers::default();
        let mut next = 2;
        // (Known from a replay: a client's first batch starts at 0.)
        p.record(tp(), ids(0, i32::MAX - 1, 2), 0, 1, 0);
        assert_eq!(append(&mut p, ids(0, 0, 3), &mut next), Check::Append);
        assert_eq!(p.check(tp(), ids(0, i32::MAX - 1, 2)), Check::Duplicate { base_offset: 0, last_offset: 1 });
        let plain = BatchIds { producer_id: -1, epoch: -1, base_sequence: -1, count: 1, max_timestamp: 0 };
        assert_eq!(p.check(tp(), plain), Check::Append);
        assert_eq!(p.check(tp(), ids(0, -1, 1)), Check::Refuse(Refusal::InvalidRecord));
    }

    #[test]
    fn snapshots_round_trip_and_drop_what_the_log_lost() {
        let mut p = Producers::default();
        let mut next = 0;
        for i in 0..3 {
            append(&mut p, ids(2, i * 4, 4), &mut next);
        }
        let mut txns = Txns::default();
        txns.on_batch(tp(), 1000, 2, 3);
        // A marker of coordinator epoch 6 (and an older one's after it,
        // as a follower's log may hold one: the newest stays).
        p.fence(tp(), 1000, 2, 6, 0);
        p.fence(tp(), 1000, 2, 4, 0);
        assert_eq!(p.coordinator_epoch_of(&tp(), 1000), Some(6));
        let snap = p.encode_snapshot(&txns.to_snapshot(), &[(tp(), next)]);
        let (mut q, t, covered) = Producers::decode_snapshot(&snap).unwrap();
        assert_eq!(t.first_unstable(&tp()), Some(3));
        assert_eq!(q.coordinator_epoch_of(&tp(), 1000), Some(6));
        assert_eq!(q.coordinator_epoch_of(&tp(), 1001), None);
        assert_eq!(covered[&tp()], 12);
        assert_eq!(q.check(tp(), ids(2, 4, 4)), Check::Duplicate { base_offset: 4, last_offset: 7 });
        // The log came back shorter (a torn tail): batches past its end are
        // forgotten, so their retries are written again.
        q.drop_beyond(|_| Some(8));
        assert_eq!(q.check(tp(), ids(2, 4, 4)), Check::Duplicate { base_offset: 4, last_offset: 7 });
        assert_eq!(q.check(tp(), ids(2, 8, 4)), Check::Append);
        q.drop_beyond(|_| None);
        assert!(q.is_empty());
        assert!(Producers::decode_snapshot(b"{not json").is_err());
        assert_eq!(crate::meta::unhex(&crate::meta::hex(&[0xab; 16])), Some([0xab; 16]));
        assert_eq!(crate::meta::unhex("zz"), None);
    }

    /// A follower (or a replay) takes the coordinator epoch from the
    /// marker it copies, so its leadership fences a deposed coordinator
    /// as its leader's did.
    #[test]
    fn a_copied_marker_brings_its_coordinator_epoch() {
        let mut p = Producers::default();
        let mut txns = Txns::default();
        let b = batch::control_batch(batch::Marker::Commit, 1000, 3, 9, 0);
        let h = batch::BatchHeader::parse(&b).unwrap();
        assert!(p.apply(&mut txns, tp(), &b, &h, 0));
        assert_eq!((p.epoch_of(&tp(), 1000), p.coordinator_epoch_of(&tp(), 1000)), (Some(3), Some(9)));
    }

    #[test]
    fn idle_producers_expire() {
        let mut p = Producers::default();
        p.record(tp(), ids(0, 0, 1), 0, 0, 1_000);
        p.record(Tp { topic: [8; 16], partition: 1 }, ids(0, 0, 1), 0, 0, 5_000);
        assert_eq!(p.expire(6_000, 2_000, |_, _| false), 1);
        assert_eq!(p.len(), 1);
        // One with a transaction open there stays, however idle.
        assert_eq!(p.expire(8_000, 2_000, |tp, pid| tp.partition == 1 && pid == 1000), 0);
        assert_eq!(p.expire(8_000, 2_000, |_, _| false), 1);
        assert!(p.is_empty());
    }
}
