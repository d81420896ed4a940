//! Writer and syncer work inside retention and compaction (see the module
//! docs of `sim`, "The writer inside maintenance").

use super::*;

/// Writer and syncer work done inside a retention or compaction call:
/// the engine's threads do not wait for the maintenance thread, so the
/// simulator runs theirs at a point inside it. The batches are made
/// before (the driver's randomness is not reachable from there).
#[derive(Default)]
pub(super) struct Interleaved {
    batches: Vec<(Tp, Vec<u8>)>,
    flush: bool,
    sync: bool,
    appended: Vec<(Tp, Vec<u8>, crate::storage::Appended)>,
    flushed: Option<Flushed>,
    synced: bool,
    failed: Option<StorageError>,
}

impl Interleaved {
    /// Appends, flushes and syncs (then publishes, as the syncer does);
    /// stops at the first failure. Runs once.
    pub(super) fn run(&mut self, storage: &Storage, writer: &mut LogWriter, unsynced: &[(u64, Flushed)], now: i64) {
        for (tp, bytes) in std::mem::take(&mut self.batches) {
            match writer.append(tp, &bytes, now, false) {
                Ok(a) => self.appended.push((tp, bytes, a)),
                Err(StorageError::Exhausted { .. }) => {}
                Err(e) => {
                    self.failed = Some(e);
                    return;
                }
            }
        }
        if std::mem::take(&mut self.flush) {
            match writer.flush() {
                Ok(f) => self.flushed = Some(f),
                Err(e) => {
                    self.failed = Some(e);
                    return;
                }
            }
        }
        if std::mem::take(&mut self.sync) {
            match storage.sync() {
                Ok(_) => {
                    for f in unsynced.iter().map(|(_, f)| f).chain(self.flushed.as_ref()) {
                        storage.publish_hw(f);
                    }
                    self.synced = true;
                }
                Err(e) => self.failed = Some(e),
            }
        }
    }
}

impl Sim {
    /// Now and then, writer and syncer work to run inside a maintenance
    /// call: a few appends, then perhaps a flush, then perhaps a sync.
    pub(super) fn interleaved_work(&mut self) -> Option<Interleaved> {
        if self.rng.below(2) == 0 {
            return None;
        }
        let mut batches = Vec::new();
        for _ in 0..self.rng.below(4) {
            if let Some(tp) = self.pick_tp() {
                let b = self.plain_batch();
                batches.push((tp, b));
            }
        }
        let flush = self.rng.below(2) == 0;
        let sync = flush && self.rng.below(2) == 0;
        Some(Interleaved { batches, flush, sync, ..Interleaved::default() })
    }

    /// The model after work done inside a maintenance call.
    pub(super) fn absorb(&mut self, w: Interleaved) -> Check {
        if self.trace {
            eprintln!("  meanwhile: {} appends, flushed {}, synced {}, failed {:?}", w.appended.len(), w.flushed.is_some(), w.synced, w.failed.as_ref().map(|e| e.to_string()));
        }
        if !w.appended.is_empty() || w.flushed.is_some() {
            self.out.interleaved += 1;
        }
        for (tp, bytes, a) in w.appended {
            self.appended(tp, bytes, &a, State::Staged, Kind::Plain, false)?;
        }
        if let Some(f) = w.flushed {
            self.flushed(f);
        }
        if w.synced {
            self.synced();
        }
        match w.failed {
            Some(e) => self.poisoned(e),
            None => Ok(()),
        }
    }
}
