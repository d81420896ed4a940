//! High-watermark checkpoints: what a replicated tp's readers may see
//! survives a restart as a lower bound, never as the whole log.
//!
//! A replica's log may end with batches its in-sync replicas never had: a
//! leader's last appends before it died, or a follower's copy of them. The
//! high watermark is what keeps them from readers (and from compaction,
//! which never takes a frame at or past it, so a later truncation of that
//! tail never reaches into subtree stores). Recovery knows only what is
//! durable; without a record of the hw, a restarted node would expose its
//! whole log, and a node that leads again after every replica of a unit
//! went down would serve records a surviving replica may not have.
//!
//! So tps that keep leader epochs (every tp replication touches; single-
//! node mode keeps none and is left alone) have their hws written to the
//! state file `high-watermarks` ([`Storage::checkpoint_hws`], which the
//! engine calls every few seconds, as Kafka's
//! `replica.high.watermark.checkpoint.interval.ms`), and every open caps
//! each such tp's hw at its checkpointed value (its log start without
//! one) until replication says more ([`Storage::limit_hw`]). A checkpoint
//! is only ever behind the hw, so what it holds was in the in-sync
//! replicas, with two exceptions: a truncation below a checkpointed hw
//! (a follower after an unclean election, or one starting over at its
//! leader's log start, which cuts everything it has). [`LogWriter::truncate`]
//! lowers the tp's entry first and holds the file's lock until the tp's
//! hw is cut, so the file never vouches for offsets a cut has since given
//! to other batches. A tp whose hw is at its log start has no entry.
//!
//! A write that fails leaves the old file or the new one (`log/state.rs`),
//! both lower bounds: it is reported and tried again, and storage is not
//! poisoned for it. Storage then takes the larger of the two, per tp, as
//! what the file may hold, so a cut still lowers it.
//!
//! A restart replays producer state over the whole log, past the hw
//! (`Storage::offset_for_timestamp_in_log`): found by the simulator, whose
//! rebuilt state missed a transaction's batches above a checkpointed hw.
//!
//! ```text
//!   0  magic     8 bytes  b"CNPYHWM\0"
//!   8  version   u16      1
//!  10  tps       u32
//!  per tp:       topic id (16 bytes), partition i32, hw i64
//!  end crc       u32      crc32 (IEEE) of everything before it
//! ```

use super::*;

/// The state file holding replicated tps' high watermarks.
pub const CHECKPOINT: &str = "high-watermarks";
const MAGIC: &[u8; 8] = b"CNPYHWM\0";
const VERSION: u16 = 1;
const ENTRY_BYTES: usize = 16 + 4 + 8;

/// Each tp's hw, sorted by tp.
pub(super) type Written = Vec<(Tp, i64)>;

/// What storage knows of the file on disk.
#[derive(Debug, Default)]
pub(super) struct OnDisk {
    /// Per tp, at least what the file holds: exactly, unless a write
    /// failed (then the larger of the old and the new, either of which
    /// the file may hold).
    hws: Written,
    exact: bool,
}

pub fn encode(hws: &[(Tp, i64)]) -> Vec<u8> {
    let mut records = Vec::with_capacity(hws.len() * ENTRY_BYTES);
    for (tp, hw) in hws {
        records.extend_from_slice(&tp.topic);
        records.extend_from_slice(&tp.partition.to_be_bytes());
        records.extend_from_slice(&hw.to_be_bytes());
    }
    state::framed(MAGIC, VERSION, hws.len() as u32, &records)
}

/// Reads a checkpoint back; anything that does not verify (magic, version,
/// checksum, a count the bytes do not hold, a negative hw, a tp twice) is
/// an error naming what.
pub fn decode(bytes: &[u8]) -> Result<Written, String> {
    let (n, body) = state::unframe(bytes, MAGIC, VERSION, "high-watermark checkpoint")?;
    if (n as usize).checked_mul(ENTRY_BYTES) != Some(body.len()) {
        return Err(format!("{n} entries in {} bytes", body.len()));
    }
    let mut out: Written = body
        .chunks_exact(ENTRY_BYTES)
        .map(|e| {
            let tp = Tp { topic: e[..16].try_into().expect("16 bytes"), partition: i32::from_be_bytes(e[16..20].try_into().expect("4 bytes")) };
            (tp, i64::from_be_bytes(e[20..].try_into().expect("8 bytes")))
        })
        .collect();
    if let Some((tp, hw)) = out.iter().find(|(_, hw)| *hw < 0) {
        return Err(format!("{tp:?} has a negative high watermark {hw}"));
    }
    out.sort_by_key(|(tp, _)| *tp);
    if let Some(w) = out.windows(2).find(|w| w[0].0 == w[1].0) {
        return Err(format!("{:?} is listed twice", w[0].0));
    }
    Ok(out)
}

impl Storage {
    /// Writes the hw of every tp that keeps leader epochs, if any moved
    /// since the last write (see the module docs). Returns whether it
    /// wrote. An error leaves a lower bound on disk and changes nothing
    /// else; the next call writes again.
    pub fn checkpoint_hws(&self) -> Result<bool, StorageError> {
        let mut on_disk = self.hws_on_disk.lock().expect("hw checkpoint lock");
        let now = self.replicated_hws();
        if on_disk.exact && now == on_disk.hws {
            return Ok(false);
        }
        self.write_hws(&mut on_disk, now).map(|_| true)
    }

    /// Before a cut of `tp` at `at`: the file may not keep a hw past it.
    /// Written anew (every hw as it is now, `tp`'s lowered) when it may;
    /// an error refuses the cut. The cut holds the returned guard until
    /// the tp's hw is cut: a checkpoint in between would write the old hw
    /// back (found by review).
    pub(super) fn lower_checkpointed_hw(&self, tp: &Tp, at: i64) -> Result<std::sync::MutexGuard<'_, OnDisk>, StorageError> {
        let mut on_disk = self.hws_on_disk.lock().expect("hw checkpoint lock");
        let listed = on_disk.hws.binary_search_by_key(tp, |(t, _)| *t).ok().map(|i| on_disk.hws[i].1);
        if listed.is_none_or(|hw| hw <= at) {
            return Ok(on_disk);
        }
        let mut now = self.replicated_hws();
        if let Ok(i) = now.binary_search_by_key(tp, |(t, _)| *t) {
            now[i].1 = now[i].1.min(at);
        }
        self.write_hws(&mut on_disk, now)?;
        Ok(on_disk)
    }

    /// Every tp that keeps leader epochs, with its hw (past its log start).
    fn replicated_hws(&self) -> Written {
        let mut now: Written = {
            let parts = self.parts.read().expect("parts lock");
            parts
                .iter()
                .filter_map(|(tp, p)| {
                    // A hw at the log start needs no entry: it is where an
                    // unlisted tp starts.
                    let st = p.st.read().expect("partition lock");
                    st.epochs.latest().filter(|_| st.hw > st.log_start).map(|_| (*tp, st.hw))
                })
                .collect()
        };
        now.sort_by_key(|(tp, _)| *tp);
        now
    }

    fn write_hws(&self, on_disk: &mut OnDisk, hws: Written) -> Result<(), StorageError> {
        match self.put_state(CHECKPOINT, &encode(&hws)) {
            Ok(()) => {
                *on_disk = OnDisk { hws, exact: true };
                Ok(())
            }
            Err(e) => {
                // The old file or the new: keep the larger of each.
                let mut both: std::collections::BTreeMap<Tp, i64> = on_disk.hws.iter().copied().collect();
                for (tp, hw) in hws {
                    let e = both.entry(tp).or_insert(hw);
                    *e = (*e).max(hw);
                }
                *on_disk = OnDisk { hws: both.into_iter().collect(), exact: false };
                Err(e)
            }
        }
    }

    /// At open, after recovery and the leader epochs: every tp that keeps
    /// epochs sees no further than its checkpointed hw, within its log
    /// (its log start without one), until replication raises the cap. A
    /// file that does not verify is taken as none, with a warning: the
    /// log starts are a lower bound too. An entry past its tp's log end (a
    /// crash lost offsets a flush policy without fsync had counted as
    /// durable) is lowered in the file at once: the lost offsets may be
    /// written again by batches no in-sync replica has.
    pub(super) fn load_hws(&self, writers: &HashMap<Tp, PartWriter>) -> Result<(), StorageError> {
        // A file that cannot be read fails the open (the disk's trouble);
        // one that does not decode is taken as none.
        let raw = state::read_state(&*self.cfg.disk, &self.data_dir, CHECKPOINT)?;
        let written = match raw.as_deref().map(decode).transpose() {
            Ok(w) => w.unwrap_or_default(),
            Err(why) => {
                tracing::warn!(file = CHECKPOINT, %why, "ignoring a high-watermark checkpoint that does not verify: replicated partitions start at their log starts until their leaders say more");
                Vec::new()
            }
        };
        let mut kept: Written = Vec::with_capacity(written.len());
        let mut lowered = false;
        for (tp, w) in writers {
            let mut st = w.part.st.write().expect("partition lock");
            if st.epochs.latest().is_none() {
                continue;
            }
            let listed = written.binary_search_by_key(tp, |(t, _)| *t).ok().map(|i| written[i].1);
            let at = listed.unwrap_or(st.log_start).min(w.next_offset).max(st.log_start);
            lowered |= listed.is_some_and(|l| l > at);
            st.hw_limit = at;
            st.hw = st.hw.min(at);
            if listed.is_some() && at > st.log_start {
                kept.push((*tp, at));
            }
        }
        kept.sort_by_key(|(tp, _)| *tp);
        let mut on_disk = OnDisk { hws: written, exact: true };
        if lowered {
            self.write_hws(&mut on_disk, kept)?;
        }
        *self.hws_on_disk.lock().expect("hw checkpoint lock") = on_disk;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::batch::tests::make_batch;

    fn tp(p: i32) -> Tp {
        Tp { topic: [7; 16], partition: p }
    }

    /// A replicated tp (one that keeps leader epochs) opens at the hw its
    /// checkpoint holds, not at its log end; a tp without epochs (single-
    /// node mode) at its log end; a cut lowers the file first; no file,
    /// or a damaged one, means the log start; an entry past the log end
    /// is lowered to it.
    #[test]
    fn a_replicated_tp_opens_at_its_checkpointed_hw() {
        let dir = tempfile::tempdir().unwrap();
        let (t, plain) = (tp(0), tp(1));
        let specs = || vec![PartitionSpec { tp: t, branch: "a".into(), log_start: 0 }, PartitionSpec { tp: plain, branch: "a".into(), log_start: 0 }];
        let open = || Storage::open(dir.path(), StorageConfig::default(), specs(), true).unwrap();
        let append = |s: &Storage, w: &mut LogWriter, n: usize| {
            for i in 0..n {
                w.append(t, &make_batch(&[format!("t{i}").as_bytes()], 0), 0, false).unwrap();
                w.append(plain, &make_batch(&[format!("p{i}").as_bytes()], 0), 0, false).unwrap();
            }
            let f = w.flush().unwrap();
            s.sync().unwrap();
            s.publish_hw(&f);
        };
        let (s, mut w) = open();
        w.begin_epoch(t, 1).unwrap();
        s.limit_hw(&t, 3);
        append(&s, &mut w, 5);
        assert_eq!((s.offsets(&t), s.offsets(&plain)), (Some((0, 3, 5)), Some((0, 5, 5))));
        assert!(s.checkpoint_hws().unwrap());
        assert!(!s.checkpoint_hws().unwrap(), "nothing moved");
        // Moved, not checkpointed: the restart goes back to the file's 3.
        s.limit_hw(&t, 4);
        assert_eq!(s.offsets(&t), Some((0, 4, 5)));
        s.mark_clean().unwrap();
        drop((s, w));
        let (s, mut w) = open();
        assert_eq!(s.offsets(&t), Some((0, 3, 5)), "the checkpointed hw, not the log end");
        assert_eq!(s.offsets(&plain), Some((0, 5, 5)), "no epochs: everything durable");
        s.limit_hw(&t, i64::MAX);
        assert_eq!(s.offsets(&t), Some((0, 5, 5)));
        assert!(s.checkpoint_hws().unwrap());
        // A cut below the checkpointed 5, then new batches past it: the
        // file must not vouch for them.
        assert_eq!(w.truncate(t, 4, 0).unwrap(), 4);
        append(&s, &mut w, 2);
        assert_eq!(s.offsets(&t), Some((0, 6, 6)));
        drop((s, w));
        let (s, w) = Storage::open(dir.path(), StorageConfig::default(), specs(), false).unwrap();
        assert_eq!(s.offsets(&t), Some((0, 4, 6)), "the cut lowered the checkpoint to 4");
        drop((s, w));
        // No file: nothing is vouched for.
        std::fs::remove_file(dir.path().join(CHECKPOINT)).unwrap();
        let (s, w) = open();
        assert_eq!((s.offsets(&t), s.offsets(&plain)), (Some((0, 0, 6)), Some((0, 7, 7))));
        assert!(!s.checkpoint_hws().unwrap(), "a hw at the log start needs no entry");
        drop((s, w));
        // An entry past the log end (a crash took offsets a flush without
        // fsync had counted): capped at the log end, and the file lowered
        // at once.
        let path = dir.path().join(CHECKPOINT);
        std::fs::write(&path, encode(&[(t, 100)])).unwrap();
        let (s, w) = open();
        assert_eq!(s.offsets(&t), Some((0, 6, 6)));
        assert_eq!(decode(&std::fs::read(&path).unwrap()).unwrap(), vec![(t, 6)]);
        drop((s, w));
        // Damaged: taken as no file (the log start), not a refused start.
        let mut bytes = std::fs::read(&path).unwrap();
        bytes[16] ^= 1;
        std::fs::write(&path, bytes).unwrap();
        let (s, _w) = open();
        assert_eq!(s.offsets(&t), Some((0, 0, 6)));
    }

    /// A checkpoint racing a cut below the hw never writes the old hw
    /// back after the cut lowered the file (the cut holds the file's lock
    /// until the tp's hw is cut). Without that, a checkpoint in between
    /// wrote it back in two runs of three with ten rounds (checked).
    #[test]
    fn a_checkpoint_racing_a_cut_never_vouches_past_it() {
        let dir = tempfile::tempdir().unwrap();
        let t = tp(0);
        let (s, mut w) = Storage::open(dir.path(), StorageConfig::default(), vec![PartitionSpec { tp: t, branch: "a".into(), log_start: 0 }], true).unwrap();
        w.begin_epoch(t, 1).unwrap();
        let mut end = 0;
        for round in 0..40 {
            for _ in 0..4 {
                w.append(t, &make_batch(&[b"v"], 0), 0, false).unwrap();
            }
            let f = w.flush().unwrap();
            s.sync().unwrap();
            s.publish_hw(&f);
            end += 4;
            s.limit_hw(&t, i64::MAX);
            assert_eq!(s.offsets(&t).map(|o| o.1), Some(end));
            s.checkpoint_hws().unwrap();
            let stop = std::sync::atomic::AtomicBool::new(false);
            let at = std::thread::scope(|scope| {
                scope.spawn(|| {
                    while !stop.load(Ordering::Acquire) {
                        s.checkpoint_hws().unwrap();
                    }
                });
                let at = w.truncate(t, end - 2, 0).unwrap();
                stop.store(true, Ordering::Release);
                at
            });
            let on_disk = decode(&std::fs::read(dir.path().join(CHECKPOINT)).unwrap()).unwrap();
            assert!(on_disk.iter().all(|&(_, hw)| hw <= at), "round {round}: {on_disk:?} past the cut at {at}");
            end = at;
        }
    }

    #[test]
    fn the_file_reads_back_and_refuses_damage() {
        let hws = vec![(tp(0), 5), (tp(1), 0), (tp(2), i64::MAX - 1)];
        let bytes = encode(&hws);
        assert_eq!(decode(&bytes).unwrap(), hws);
        assert_eq!(decode(&encode(&[])).unwrap(), vec![]);
        // Every byte flipped is caught (the checksum, or the checks
        // behind it), every truncation too.
        for i in 0..bytes.len() {
            let mut b = bytes.clone();
            b[i] ^= 0x40;
            assert!(decode(&b).is_err(), "byte {i} flipped");
        }
        for len in 0..bytes.len() {
            assert!(decode(&bytes[..len]).is_err(), "cut to {len}");
        }
        // Well framed, but wrong inside.
        let bad = |entries: &[u8], n: u32| state::framed(MAGIC, VERSION, n, entries);
        let one = &encode(&[(tp(0), 5)])[14..14 + ENTRY_BYTES];
        assert!(decode(&bad(one, 2)).unwrap_err().contains("entries"), "a count past the bytes");
        assert!(decode(&bad(&[one, one].concat(), 2)).unwrap_err().contains("twice"));
        let negative = &encode(&[(tp(0), -1)])[14..14 + ENTRY_BYTES];
        assert!(decode(&bad(negative, 1)).unwrap_err().contains("negative"));
        assert!(decode(&state::framed(MAGIC, 2, 0, &[])).unwrap_err().contains("version"));
        assert!(decode(&state::framed(b"CNPYEPO\0", VERSION, 0, &[])).is_err(), "another state file");
    }
}
