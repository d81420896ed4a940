//! Idempotent-producer state: per (producer id, tp), the producer's epoch
//! and the sequence ranges and offsets of its last [`WINDOW`] batches, as
//! Kafka keeps them. The writer thread owns it and consults it before every
//! append of a batch that carries a producer id, so the decision and the
//! append are one step: a retried batch is answered with the offsets it got
//! the first time and is not written again.
//!
//! Pure and single-threaded: no I/O, no clock of its own.

use std::collections::{HashMap, VecDeque};

use kafka_protocol::ResponseError as E;

use crate::storage::Tp;

/// Batches remembered per (producer, tp): Kafka's
/// `max.in.flight.requests.per.connection` limit for idempotence.
pub const WINDOW: usize = 5;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
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
}

/// What to do with a batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Check {
    /// Not idempotent, or the next batch in sequence: append it, then
    /// [`Producers::record`] its offsets.
    Append,
    /// A retry of a batch already written: answer with these offsets.
    Duplicate { base_offset: i64, last_offset: i64 },
    /// Refused with this Kafka error code.
    Refuse(i16),
}

/// The producer fields of a batch header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchIds {
    pub producer_id: i64,
    pub epoch: i16,
    pub base_sequence: i32,
    /// Records in the batch (last offset delta + 1).
    pub count: i32,
}

impl BatchIds {
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

#[derive(Debug, Default)]
pub struct Producers {
    entries: HashMap<(i64, Tp), Entry>,
}

impl Producers {
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Decides about one batch for `tp`.
    pub fn check(&self, tp: Tp, ids: BatchIds) -> Check {
        if ids.producer_id < 0 {
            return Check::Append;
        }
        if ids.base_sequence < 0 || ids.count <= 0 {
            return Check::Refuse(E::InvalidRecord.code());
        }
        let Some(e) = self.entries.get(&(ids.producer_id, tp)) else {
            // Nothing known of this producer here (a new producer, or
            // state lost with a restart): take it from where it is.
            return Check::Append;
        };
        if ids.epoch < e.epoch {
            return Check::Refuse(E::InvalidProducerEpoch.code());
        }
        if ids.epoch > e.epoch {
            // A bumped epoch starts its sequences over.
            return if ids.base_sequence == 0 { Check::Append } else { Check::Refuse(E::OutOfOrderSequenceNumber.code()) };
        }
        let last = ids.last_seq();
        if let Some(c) = e.batches.iter().find(|c| c.first_seq == ids.base_sequence && c.last_seq == last) {
            return Check::Duplicate { base_offset: c.base_offset, last_offset: c.last_offset };
        }
        let Some(newest) = e.batches.back() else { return Check::Append };
        if ids.base_sequence == next_seq(newest.last_seq) {
            return Check::Append;
        }
        let oldest = e.batches.front().expect("non-empty").first_seq;
        if ids.base_sequence < oldest && newest.last_seq >= oldest {
            // Before the window (and no wrap in it): written long ago.
            return Check::Refuse(E::DuplicateSequenceNumber.code());
        }
        Check::Refuse(E::OutOfOrderSequenceNumber.code())
    }

    /// Records an appended batch.
    pub fn record(&mut self, tp: Tp, ids: BatchIds, base_offset: i64, last_offset: i64, now_ms: i64) {
        if ids.producer_id < 0 {
            return;
        }
        let e = self.entries.entry((ids.producer_id, tp)).or_insert_with(|| Entry { epoch: ids.epoch, batches: VecDeque::with_capacity(WINDOW), last_used_ms: now_ms });
        if ids.epoch != e.epoch {
            e.epoch = ids.epoch;
            e.batches.clear();
        }
        e.batches.push_back(Cached { first_seq: ids.base_sequence, last_seq: ids.last_seq(), base_offset, last_offset });
        if e.batches.len() > WINDOW {
            e.batches.pop_front();
        }
        e.last_used_ms = now_ms;
    }

    /// Forgets producers idle for `max_idle_ms` (Kafka's
    /// `producer.id.expiration.ms`); returns how many entries went.
    pub fn expire(&mut self, now_ms: i64, max_idle_ms: i64) -> usize {
        let before = self.entries.len();
        self.entries.retain(|_, e| now_ms - e.last_used_ms < max_idle_ms);
        before - self.entries.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tp() -> Tp {
        Tp { topic: [7; 16], partition: 0 }
    }

    fn ids(epoch: i16, seq: i32, count: i32) -> BatchIds {
        BatchIds { producer_id: 1000, epoch, base_sequence: seq, count }
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
        // Older than the window.
        assert_eq!(p.check(tp(), ids(0, 10, 10)), Check::Refuse(E::DuplicateSequenceNumber.code()));
        // A gap.
        assert_eq!(p.check(tp(), ids(0, 71, 1)), Check::Refuse(E::OutOfOrderSequenceNumber.code()));
        // Same start, other length: not the batch we have.
        assert_eq!(p.check(tp(), ids(0, 60, 3)), Check::Refuse(E::OutOfOrderSequenceNumber.code()));
        assert_eq!(append(&mut p, ids(0, 70, 1), &mut next), Check::Append);
    }

    #[test]
    fn epochs_fence_and_restart_sequences() {
        let mut p = Producers::default();
        let mut next = 0;
        assert_eq!(append(&mut p, ids(3, 0, 5), &mut next), Check::Append);
        assert_eq!(p.check(tp(), ids(2, 5, 1)), Check::Refuse(E::InvalidProducerEpoch.code()));
        assert_eq!(p.check(tp(), ids(4, 5, 1)), Check::Refuse(E::OutOfOrderSequenceNumber.code()));
        assert_eq!(append(&mut p, ids(4, 0, 2), &mut next), Check::Append);
        // The old epoch's batches are forgotten with it.
        assert_eq!(p.check(tp(), ids(4, 0, 2)), Check::Duplicate { base_offset: 5, last_offset: 6 });
        assert_eq!(p.check(tp(), ids(3, 0, 5)), Check::Refuse(E::InvalidProducerEpoch.code()));
    }

    #[test]
    fn sequences_wrap_and_non_idempotent_batches_pass() {
        let mut p = Producers::default();
        let mut next = 0;
        assert_eq!(append(&mut p, ids(0, i32::MAX - 1, 2), &mut next), Check::Append);
        assert_eq!(append(&mut p, ids(0, 0, 3), &mut next), Check::Append);
        assert_eq!(p.check(tp(), ids(0, i32::MAX - 1, 2)), Check::Duplicate { base_offset: 0, last_offset: 1 });
        let plain = BatchIds { producer_id: -1, epoch: -1, base_sequence: -1, count: 1 };
        assert_eq!(p.check(tp(), plain), Check::Append);
        assert_eq!(p.check(tp(), ids(0, -1, 1)), Check::Refuse(E::InvalidRecord.code()));
    }

    #[test]
    fn idle_producers_expire() {
        let mut p = Producers::default();
        p.record(tp(), ids(0, 0, 1), 0, 0, 1_000);
        p.record(Tp { topic: [8; 16], partition: 1 }, ids(0, 0, 1), 0, 0, 5_000);
        assert_eq!(p.expire(6_000, 2_000), 1);
        assert_eq!(p.len(), 1);
        assert_eq!(p.expire(8_000, 2_000), 1);
        assert!(p.is_empty());
    }
}
