//! What a replica does to its logs besides appending (see `docs/simulator.md`,
//! "Leader epochs" and "Truncations"): beginning leader epochs, and cutting
//! a tp's divergent tail, each checked against the model.

use super::*;

impl Sim {
    /// This node leads `tp` from here in a new epoch (now and then the same
    /// one again, or a stale one that must be refused).
    pub(super) fn begin_epoch(&mut self, tp: Tp) -> Check {
        let latest = self.mtp(&tp).epochs.latest().map_or(-1, |l| l.epoch);
        let epoch = match self.rng.below(6) {
            0 if latest > 0 => self.rng.below(latest as u64) as i32,
            1 if latest >= 0 => latest,
            _ => latest + 1 + self.rng.below(2) as i32,
        };
        let next = self.mtp(&tp).next_offset();
        if self.trace {
            eprintln!("  {tp:?}: begin leader epoch {epoch} at {next} (latest {latest})");
        }
        match self.writer().begin_epoch(tp, epoch) {
            Ok(()) if epoch >= latest => {
                self.mtp(&tp).epochs.assign(epoch, next);
                self.out.epochs_begun += 1;
                Ok(())
            }
            Ok(()) => Err(format!("{tp:?}: epoch {epoch} begun below the latest, {latest}")),
            Err(StorageError::StaleEpoch { .. }) if epoch < latest => {
                self.out.stale_epoch_refusals += 1;
                Ok(())
            }
            Err(e) if epoch >= latest => self.poisoned(e),
            Err(e) => Err(format!("{tp:?}: a stale epoch {epoch} (latest {latest}) refused with {e}")),
        }
    }

    /// Cuts `tp` back inside one of its last batches, as a follower cuts
    /// its divergent tail (`LogWriter::truncate`). Only plain batches are
    /// cut: the engine's producer and transaction state do not follow a
    /// cut yet. Refused as it must be: below the log start or into what
    /// stores hold (misplaced), with batches of the tp staged (busy).
    pub(super) fn truncate(&mut self, tp: Tp) -> Check {
        if self.rng.below(6) == 0 {
            // At the log end: nothing is cut, but an epoch begun there and
            // never written goes (a node that led briefly, then follows).
            let next = self.mtp(&tp).next_offset();
            let now = self.now_ms;
            return match self.writer().truncate(tp, next, now) {
                Ok(n) => {
                    ensure(n == next, || format!("{tp:?}: a truncation at the log end {next} answered {n}"))?;
                    let log_start = self.storage().offsets(&tp).map_or(0, |o| o.0);
                    let m = self.mtp(&tp);
                    m.epochs.truncate_from_start(log_start);
                    m.epochs.truncate_from_end(next);
                    Ok(())
                }
                Err(e) => self.poisoned(e),
            };
        }
        let m = self.mtp(&tp);
        let plain_from = m.batches.iter().rposition(|b| b.kind != Kind::Plain).map_or(0, |i| i + 1);
        if plain_from == m.batches.len() {
            return Ok(());
        }
        let staged = m.batches.iter().any(|b| b.state == State::Staged);
        let n = m.batches.len();
        let k = plain_from + self.rng.below((n - plain_from) as u64) as usize;
        let (base, last) = (self.mtp(&tp).batches[k].base, self.mtp(&tp).batches[k].last);
        let end = base + self.rng.below((last - base + 1) as u64) as i64;
        let (log_start, _, _) = self.storage().offsets(&tp).ok_or_else(|| format!("{tp:?} unknown to storage"))?;
        let into_stores = self.storage().stored_to(&tp).is_some_and(|l| l >= end);
        let before = self.storage().cuts_of(&tp).last().map_or(0, |c| c.seq);
        if self.trace {
            eprintln!("  {tp:?}: truncate to {end} (batch {base}..={last}; log start {log_start}, staged {staged}, into stores {into_stores})");
        }
        self.pending_cut = Some((tp, base, before));
        let lowered = self.lowered_hws(tp, base);
        let now = self.now_ms;
        let r = self.writer().truncate(tp, end, now);
        if let (Err(_), Some(f)) = (&r, &lowered) {
            // The checkpoint's lowering may have been written.
            self.hw_file_may_hold(f.clone());
        }
        match r {
            Ok(at) => {
                if let Some(f) = lowered {
                    self.hw_files = vec![f];
                }
                ensure(end >= log_start && !staged && !into_stores, || format!("{tp:?}: a truncation to {end} was taken (log start {log_start}, staged {staged}, into stores {into_stores})"))?;
                ensure(at == base, || format!("{tp:?}: a truncation to {end}, inside the batch {base}..={last}, cut at {at}"))?;
                self.pending_cut = None;
                self.cut_model(tp, at);
                self.out.truncations += 1;
                // The engine's part: the producer snapshot on disk covers
                // what the cut took; it is replaced before anything more is
                // appended, or the writer stops. A snapshot is taken right
                // after a flush (it covers the log ends the flush
                // published, and producer state of what it wrote).
                let flushed = self.writer().flush();
                match flushed {
                    Ok(f) => self.flushed(f),
                    Err(e) => return self.poisoned(e),
                }
                let replaced = crate::engine::replace_producer_snapshot(&self.producers, &self.txns.read().expect("txns lock"), self.storage());
                match replaced {
                    Ok(()) => Ok(()),
                    Err(e) => self.poisoned(e),
                }
            }
            Err(StorageError::Misplaced(_)) if end < log_start || (!staged && into_stores) => {
                self.pending_cut = None;
                self.out.refused_truncations += 1;
                Ok(())
            }
            Err(StorageError::Busy(_)) if staged && end >= log_start => {
                self.pending_cut = None;
                self.out.refused_truncations += 1;
                Ok(())
            }
            Err(StorageError::Exhausted { .. }) => {
                self.pending_cut = None;
                Ok(())
            }
            Err(e @ (StorageError::Misplaced(_) | StorageError::Busy(_))) => Err(format!("{tp:?}: a truncation to {end} refused: {e} (log start {log_start}, staged {staged}, into stores {into_stores})")),
            // Failed writing the cut: whether it holds is for recovery to
            // say (`open` looks).
            Err(e) => self.poisoned(e),
        }
    }

    /// The model after a cut of `tp` at `at`.
    pub(super) fn cut_model(&mut self, tp: Tp, at: i64) {
        let log_start = self.storage().offsets(&tp).map_or(0, |o| o.0);
        let m = self.mtp(&tp);
        m.batches.retain(|b| b.base < at);
        m.hw_seen = m.hw_seen.min(at);
        m.hw_max = m.hw_max.min(at);
        // Storage's epochs were cut to the log start as it rose: so the
        // model's, before the cut to the end.
        m.epochs.truncate_from_start(log_start);
        m.epochs.truncate_from_end(at);
    }
}

/// A model of the high-watermark checkpoint: each listed tp's hw.
pub(super) type HwFile = BTreeMap<Tp, i64>;

impl Sim {
    /// Every tp that keeps leader epochs, with its hw now if past its log
    /// start: what a checkpoint written now holds.
    fn replicated_hws(&mut self) -> HwFile {
        let mut out = HwFile::new();
        for tp in self.tps() {
            let (log_start, hw, _) = self.storage().offsets(&tp).unwrap_or_default();
            if hw > log_start && self.storage().epochs(&tp).is_some_and(|e| !e.is_empty()) {
                out.insert(tp, hw);
            }
        }
        out
    }

    /// As replication caps a replicated tp's hw (a leader: what its in-sync
    /// replicas have; a follower: its leader's hw): anywhere from its log
    /// start to past its end, or no cap. The hw never goes down for it,
    /// nor rises past the cap.
    pub(super) fn cap_hw(&mut self) -> Check {
        let Some(tp) = self.pick_tp() else { return Ok(()) };
        if self.storage().epochs(&tp).is_none_or(|e| e.is_empty()) {
            return Ok(());
        }
        let (log_start, hw, leo) = self.storage().offsets(&tp).ok_or_else(|| format!("{tp:?} unknown to storage"))?;
        let cap = if self.rng.below(4) == 0 { i64::MAX } else { log_start + self.rng.below((leo - log_start + 2) as u64) as i64 };
        self.storage().limit_hw(&tp, cap);
        let after = self.storage().offsets(&tp).map_or(0, |o| o.1);
        if self.trace {
            eprintln!("  {tp:?}: hw capped at {cap}: {hw} -> {after}");
        }
        ensure(after >= hw && after <= hw.max(cap), || format!("{tp:?}: a cap of {cap} moved the hw from {hw} to {after}"))
    }

    /// The engine's periodic checkpoint. A write that failed leaves the
    /// old file or the new one.
    pub(super) fn checkpoint_hws(&mut self) -> Check {
        let content = self.replicated_hws();
        match self.storage().checkpoint_hws() {
            Ok(_) => self.hw_files = vec![content],
            Err(e) => {
                ensure(self.faulty(), || format!("the hw checkpoint failed on a healthy disk: {e}"))?;
                self.hw_file_may_hold(content);
            }
        }
        Ok(())
    }

    /// After a write that failed, the checkpoint may hold `f` too.
    fn hw_file_may_hold(&mut self, f: HwFile) {
        if !self.hw_files.contains(&f) {
            self.hw_files.push(f);
        }
    }

    /// What a cut of `tp` at `at` writes to the checkpoint before it
    /// cuts: nothing when no file it may hold lists `tp` past `at`; else
    /// every replicated tp's hw now, `tp`'s lowered to `at`.
    fn lowered_hws(&mut self, tp: Tp, at: i64) -> Option<HwFile> {
        if !self.hw_files.iter().any(|f| f.get(&tp).is_some_and(|&hw| hw > at)) {
            return None;
        }
        let mut now = self.replicated_hws();
        if let Some(hw) = now.get_mut(&tp) {
            *hw = (*hw).min(at);
        }
        Some(now)
    }

    /// The hws storage may have had: compaction's gate saw at most these.
    pub(super) fn note_hws(&mut self) {
        for tp in self.tps() {
            let hw = self.storage().offsets(&tp).map_or(0, |o| o.1);
            let m = self.mtp(&tp);
            m.hw_max = m.hw_max.max(hw);
        }
    }

    /// After an open: a tp without epochs exposes everything it recovered;
    /// one with epochs no more than the checkpoint held for it (its log
    /// start without an entry), the same file for every tp.
    pub(super) fn recovered_hws(&mut self) -> Check {
        let mut seen = Vec::new();
        for tp in self.tps() {
            let (log_start, hw, leo) = self.storage().offsets(&tp).ok_or_else(|| format!("{tp:?} missing after recovery"))?;
            let replicated = self.storage().epochs(&tp).is_some_and(|e| !e.is_empty());
            seen.push((tp, log_start, hw, leo, replicated));
        }
        let expect = |f: &HwFile, &(tp, log_start, _, leo, replicated): &(Tp, i64, i64, i64, bool)| {
            if replicated { leo.min(f.get(&tp).copied().unwrap_or(log_start).max(log_start)) } else { leo }
        };
        let matching: Vec<HwFile> = self.hw_files.iter().filter(|f| seen.iter().all(|t| expect(f, t) == t.2)).cloned().collect();
        if matching.is_empty() {
            let (tp, _, hw, leo, replicated) = *seen.iter().find(|t| expect(&self.hw_files[0], t) != t.2).expect("a mismatch");
            return Err(format!("{tp:?}: high watermark {hw} after recovery (log end {leo}, epochs {replicated}) matches none of the checkpoints storage may hold: {:?}", self.hw_files));
        }
        // An entry past its tp's log end is lowered in the file at the
        // open (if that write failed, the open did: either may be there).
        let mut files = Vec::new();
        for f in matching {
            let mut kept = HwFile::new();
            let mut lowered = false;
            for &(tp, log_start, _, leo, replicated) in &seen {
                if let Some(&hw) = f.get(&tp).filter(|_| replicated) {
                    let at = hw.min(leo).max(log_start);
                    lowered |= hw > at;
                    if at > log_start {
                        kept.insert(tp, at);
                    }
                }
            }
            if lowered && !files.contains(&kept) {
                files.push(kept);
            }
            if !files.contains(&f) {
                files.push(f);
            }
        }
        self.hw_files = files;
        for (tp, _, hw, _, _) in seen {
            self.mtp(&tp).hw_seen = hw;
        }
        Ok(())
    }
}
