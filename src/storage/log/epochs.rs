//! Leader epochs (KIP-101): per tp, the first offset of each leader epoch
//! its log holds, and the checkpoint file that keeps them across restarts.
//!
//! A leader stamps its epoch into each batch's `partitionLeaderEpoch`; a
//! tp's [`EpochCache`] says where each epoch starts. Replicas compare them
//! to find where their logs diverge: a follower asks (OffsetForLeaderEpoch,
//! or Fetch's `LastFetchedEpoch`) where the leader's log ends for its last
//! epoch, and truncates past that.
//!
//! Entries come from two places, as in Kafka: a node becoming leader of a
//! unit assigns its new epoch at every tp's log end, written or not
//! ([`LogWriter::begin_epoch`]); a follower's copy assigns the epoch of a
//! batch whose epoch is new to the tp ([`LogWriter::append_at`]). In both
//! epochs and start offsets strictly increase; an entry that would break
//! that removes the entries it contradicts (they described a log that was
//! since cut).
//!
//! # The checkpoint
//!
//! One state file, `leader-epochs`, holds every tp's entries. The writer
//! replaces it (see `log/state.rs`) at the flush after any entry changed,
//! before that flush writes its frames: the file never misses an entry
//! the log holds a batch of. It may hold entries past what the log kept
//! (a crash lost the batches after the checkpoint), so every open cuts
//! each tp's entries to its log end and its log start, as Kafka's loader
//! does. Leadership changes are rare, so one file for every tp costs a
//! rewrite of a few bytes per tp only when some unit changes leaders.
//!
//! ```text
//!   0  magic     8 bytes  b"CNPYEPO\0"
//!   8  version   u16      1
//!  10  tps       u32
//!  per tp:       topic id (16 bytes), partition i32, entries u32,
//!                entries × (epoch i32, start offset i64)
//!  end crc       u32      crc32 (IEEE) of everything before it
//! ```

use super::*;

/// The state file holding every tp's leader epochs.
pub const CHECKPOINT: &str = "leader-epochs";
const MAGIC: &[u8; 8] = b"CNPYEPO\0";
const VERSION: u16 = 1;
/// Kafka's "no epoch" (`UNDEFINED_EPOCH`, `UNDEFINED_EPOCH_OFFSET`).
pub const UNDEFINED: (i32, i64) = (-1, -1);

/// One leader epoch of a tp and the first offset it holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EpochEntry {
    pub epoch: i32,
    pub start: i64,
}

/// A tp's leader epochs, oldest first; epochs and starts strictly increase.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EpochCache {
    entries: Vec<EpochEntry>,
}

impl EpochCache {
    pub fn entries(&self) -> &[EpochEntry] {
        &self.entries
    }

    pub fn latest(&self) -> Option<EpochEntry> {
        self.entries.last().copied()
    }

    /// Whether [`EpochCache::assign`] would change anything: a new epoch,
    /// or the latest one starting earlier (a follower truncated and
    /// fetched it again from lower down).
    pub fn needs(&self, epoch: i32, start: i64) -> bool {
        self.latest().is_none_or(|l| l.epoch != epoch || start < l.start)
    }

    /// Records that `epoch` starts at `start`; entries it contradicts (an
    /// epoch not below it, or a start not below its start) go first.
    /// Returns whether the cache changed.
    pub fn assign(&mut self, epoch: i32, start: i64) -> bool {
        debug_assert!(epoch >= 0 && start >= 0, "epoch {epoch} at {start}");
        if !self.needs(epoch, start) {
            return false;
        }
        while self.entries.last().is_some_and(|l| l.epoch >= epoch || l.start >= start) {
            self.entries.pop();
        }
        self.entries.push(EpochEntry { epoch, start });
        true
    }

    /// Where `epoch` ends in this log (OffsetForLeaderEpoch's answer, as
    /// Kafka's `endOffsetFor`): for the latest epoch the log end; for an
    /// older one the start of the next epoch the log holds, with the
    /// largest epoch at or below the one asked about (the asked one itself
    /// if there is none); [`UNDEFINED`] for an undefined or unknown epoch.
    pub fn end_offset_for(&self, epoch: i32, log_end: i64) -> (i32, i64) {
        if epoch < 0 {
            return UNDEFINED;
        }
        if self.latest().is_some_and(|l| l.epoch == epoch) {
            return (epoch, log_end);
        }
        let higher = self.entries.partition_point(|e| e.epoch <= epoch);
        let Some(next) = self.entries.get(higher) else { return UNDEFINED };
        match higher.checked_sub(1).map(|i| self.entries[i]) {
            Some(floor) => (floor.epoch, next.start),
            None => (epoch, next.start),
        }
    }

    /// The epoch that wrote `offset`, if the cache covers it.
    pub fn epoch_at(&self, offset: i64) -> Option<i32> {
        let i = self.entries.partition_point(|e| e.start <= offset);
        i.checked_sub(1).map(|i| self.entries[i].epoch)
    }

    /// Drops the entries of epochs that start at or past `end` (the log
    /// was cut there). Returns whether any went.
    pub fn truncate_from_end(&mut self, end: i64) -> bool {
        let keep = self.entries.partition_point(|e| e.start < end);
        let cut = keep < self.entries.len();
        self.entries.truncate(keep);
        cut
    }

    /// The log now starts at `start`: entries wholly below it go, and the
    /// epoch it falls in starts there. Returns whether anything changed.
    pub fn truncate_from_start(&mut self, start: i64) -> bool {
        let below = self.entries.partition_point(|e| e.start <= start);
        let Some(last) = below.checked_sub(1).map(|i| self.entries[i]) else { return false };
        if below == 1 && last.start == start {
            return false;
        }
        self.entries.drain(..below);
        self.entries.insert(0, EpochEntry { epoch: last.epoch, start });
        true
    }
}

impl Storage {
    /// Where leader `epoch` ends in `tp`'s log (OffsetForLeaderEpoch, a
    /// follower's divergence check): see [`EpochCache::end_offset_for`],
    /// with the published log end. None for a tp storage does not hold.
    pub fn end_offset_for(&self, tp: &Tp, epoch: i32) -> Option<(i32, i64)> {
        let part = self.parts.read().expect("parts lock").get(tp).cloned()?;
        let st = part.st.read().expect("partition lock");
        Some(st.epochs.end_offset_for(epoch, st.leo))
    }

    /// [`Storage::end_offset_for`] where the tp's log keeps leader epochs;
    /// None where it keeps none (single-node mode).
    pub fn epoch_end(&self, tp: &Tp, epoch: i32) -> Option<(i32, i64)> {
        let part = self.parts.read().expect("parts lock").get(tp).cloned()?;
        let st = part.st.read().expect("partition lock");
        st.epochs.latest()?;
        Some(st.epochs.end_offset_for(epoch, st.leo))
    }

    /// A tp's leader epochs, oldest first (empty in single-node mode).
    pub fn epochs(&self, tp: &Tp) -> Option<Vec<EpochEntry>> {
        let part = self.parts.read().expect("parts lock").get(tp).cloned()?;
        let entries = part.st.read().expect("partition lock").epochs.entries().to_vec();
        Some(entries)
    }
}

/// The checkpoint's bytes for `caches` (empty caches are left out).
pub fn encode<'a>(caches: impl Iterator<Item = (Tp, &'a EpochCache)>) -> Vec<u8> {
    let mut records = Vec::with_capacity(64);
    let mut n = 0u32;
    for (tp, cache) in caches.filter(|(_, c)| !c.entries.is_empty()) {
        n += 1;
        records.extend_from_slice(&tp.topic);
        records.extend_from_slice(&tp.partition.to_be_bytes());
        records.extend_from_slice(&(cache.entries.len() as u32).to_be_bytes());
        for e in &cache.entries {
            records.extend_from_slice(&e.epoch.to_be_bytes());
            records.extend_from_slice(&e.start.to_be_bytes());
        }
    }
    state::framed(MAGIC, VERSION, n, &records)
}

/// Reads a checkpoint back. Anything that does not verify (magic,
/// version, checksum, counts that overrun it, entries that do not
/// increase) is an error naming what.
pub fn decode(bytes: &[u8]) -> Result<Vec<(Tp, EpochCache)>, String> {
    let (n, body) = state::unframe(bytes, MAGIC, VERSION, "leader-epoch checkpoint")?;
    let mut r = Cursor { b: body, at: 0 };
    let mut out = Vec::new();
    for _ in 0..n {
        let topic: TopicId = r.take(16)?.try_into().expect("16 bytes");
        let partition = i32::from_be_bytes(r.take(4)?.try_into().expect("4 bytes"));
        let count = u32::from_be_bytes(r.take(4)?.try_into().expect("4 bytes")) as usize;
        if count.checked_mul(12).is_none_or(|b| b > body.len() - r.at) {
            return Err(format!("{count} entries overrun the file"));
        }
        let mut cache = EpochCache { entries: Vec::with_capacity(count) };
        for _ in 0..count {
            let epoch = i32::from_be_bytes(r.take(4)?.try_into().expect("4 bytes"));
            let start = i64::from_be_bytes(r.take(8)?.try_into().expect("8 bytes"));
            let increasing = cache.latest().is_none_or(|l| epoch > l.epoch && start > l.start);
            if epoch < 0 || start < 0 || !increasing {
                return Err(format!("entry (epoch {epoch}, start {start}) out of order"));
            }
            cache.entries.push(EpochEntry { epoch, start });
        }
        out.push((Tp { topic, partition }, cache));
    }
    if r.at != body.len() {
        return Err(format!("{} bytes past the last tp", body.len() - r.at));
    }
    Ok(out)
}

struct Cursor<'a> {
    b: &'a [u8],
    at: usize,
}

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], String> {
        let s = self.b.get(self.at..self.at + n).ok_or("truncated")?;
        self.at += n;
        Ok(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cache(entries: &[(i32, i64)]) -> EpochCache {
        EpochCache { entries: entries.iter().map(|&(epoch, start)| EpochEntry { epoch, start }).collect() }
    }

    #[test]
    fn assign_keeps_epochs_and_starts_increasing() {
        let mut c = EpochCache::default();
        assert!(c.assign(2, 6));
        // The same epoch again, at or past its start: nothing to do.
        assert!(!c.assign(2, 6) && !c.assign(2, 10));
        assert!(c.assign(3, 8));
        assert_eq!(c, cache(&[(2, 6), (3, 8)]));
        // The latest epoch starting earlier (refetched after a cut).
        assert!(c.assign(3, 7));
        assert_eq!(c, cache(&[(2, 6), (3, 7)]));
        // An epoch below the latest replaces every entry it contradicts.
        assert!(c.assign(1, 7));
        assert_eq!(c, cache(&[(1, 7)]));
        // A new epoch starting below an older one's start: the older goes.
        let mut c = cache(&[(1, 0), (2, 10)]);
        assert!(c.assign(3, 5));
        assert_eq!(c, cache(&[(1, 0), (3, 5)]));
    }

    #[test]
    fn end_offsets_answer_as_kafkas_cache_does() {
        let c = cache(&[(1, 0), (2, 10), (4, 25)]);
        assert_eq!(c.end_offset_for(-1, 40), UNDEFINED);
        // The latest epoch ends at the log end.
        assert_eq!(c.end_offset_for(4, 40), (4, 40));
        // An older one where the next epoch starts.
        assert_eq!(c.end_offset_for(1, 40), (1, 10));
        assert_eq!(c.end_offset_for(2, 40), (2, 25));
        // An epoch that wrote nothing here: the one before it, ended by the
        // next.
        assert_eq!(c.end_offset_for(3, 40), (2, 25));
        // Below every epoch: the asked one, ended where the first starts.
        let late = cache(&[(5, 100)]);
        assert_eq!(cache(&[(5, 100), (6, 120)]).end_offset_for(3, 130), (3, 100));
        assert_eq!(late.end_offset_for(3, 130), (3, 100));
        // Above every epoch: unknown.
        assert_eq!(c.end_offset_for(9, 40), UNDEFINED);
        assert_eq!(EpochCache::default().end_offset_for(0, 5), UNDEFINED);
    }

    #[test]
    fn truncation_cuts_entries_at_either_end() {
        let mut c = cache(&[(1, 0), (2, 10), (4, 25)]);
        assert!(!c.truncate_from_end(26));
        assert!(c.truncate_from_end(25));
        assert_eq!(c, cache(&[(1, 0), (2, 10)]));
        assert!(c.truncate_from_start(12));
        assert_eq!(c, cache(&[(2, 12)]));
        assert!(!c.truncate_from_start(12) && !c.truncate_from_start(3));
        let mut c = cache(&[(1, 0), (2, 10)]);
        assert!(c.truncate_from_start(10));
        assert_eq!(c, cache(&[(2, 10)]));
        assert_eq!((c.epoch_at(9), c.epoch_at(10), c.epoch_at(99)), (None, Some(2), Some(2)));
    }

    #[test]
    fn the_checkpoint_reads_back_and_refuses_damage() {
        let a = Tp { topic: [1; 16], partition: 0 };
        let b = Tp { topic: [2; 16], partition: 3 };
        let (ca, cb) = (cache(&[(0, 0), (3, 17)]), cache(&[(2, 5)]));
        let empty = EpochCache::default();
        let bytes = encode([(a, &ca), (b, &cb), (Tp { topic: [3; 16], partition: 0 }, &empty)].into_iter());
        assert_eq!(decode(&bytes).unwrap(), vec![(a, ca.clone()), (b, cb)]);
        assert_eq!(decode(&encode(std::iter::empty())).unwrap(), vec![]);
        // Every truncation, every flipped byte: refused, never a panic.
        for n in 0..bytes.len() {
            assert!(decode(&bytes[..n]).is_err(), "{n} bytes");
        }
        for i in 0..bytes.len() {
            let mut bad = bytes.clone();
            bad[i] ^= 0x40;
            assert!(decode(&bad).is_err(), "byte {i}");
        }
        // A count that overruns, with a valid checksum.
        let mut lie = bytes[..bytes.len() - 4].to_vec();
        lie[14 + 20..14 + 24].copy_from_slice(&u32::MAX.to_be_bytes());
        let crc = crc32fast::hash(&lie);
        lie.extend_from_slice(&crc.to_be_bytes());
        assert!(decode(&lie).unwrap_err().contains("overrun"));
        // Entries out of order, with a valid checksum.
        let mut bad = encode([(a, &ca)].into_iter());
        bad[14 + 24 + 12 + 3] = 0; // the second epoch, 3 → 0
        let n = bad.len() - 4;
        let crc = crc32fast::hash(&bad[..n]);
        bad[n..].copy_from_slice(&crc.to_be_bytes());
        assert!(decode(&bad).unwrap_err().contains("out of order"));
    }
}
