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
//! replicas, with one exception: a truncation below a checkpointed hw
//! (a follower after an unclean election). [`LogWriter::truncate`]
//! lowers the tp's entry first, so the file never vouches for offsets a
//! cut has since given to other batches.
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
    /// an error refuses the cut.
    pub(super) fn lower_checkpointed_hw(&self, tp: &Tp, at: i64) -> Result<(), StorageError> {
        let mut on_disk = self.hws_on_disk.lock().expect("hw checkpoint lock");
        let listed = on_disk.hws.binary_search_by_key(tp, |(t, _)| *t).ok().map(|i| on_disk.hws[i].1);
        if listed.is_none_or(|hw| hw <= at) {
            return Ok(());
        }
        let mut now = self.replicated_hws();
        if let Ok(i) = now.binary_search_by_key(tp, |(t, _)| *t) {
            now[i].1 = now[i].1.min(at);
        }
        self.write_hws(&mut on_disk, now)
    }

    /// Every tp that keeps leader epochs, with its hw.
    fn replicated_hws(&self) -> Written {
        let mut now: Written = {
            let parts = self.parts.read().expect("parts lock");
            parts
                .iter()
                .filter_map(|(tp, p)| {
                    let st = p.st.read().expect("partition lock");
                    st.epochs.latest().map(|_| (*tp, st.hw))
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
    /// epochs sees no further than its checkpointed hw (its log start
    /// without one) until replication raises the cap. A checkpoint that
    /// does not verify refuses the start, as the epochs' does: a guess
    /// could expose what the in-sync replicas never had.
    pub(super) fn load_hws(&self, writers: &HashMap<Tp, PartWriter>) -> Result<(), StorageError> {
        let written = state::load_state(&*self.cfg.disk, &self.data_dir, CHECKPOINT, decode)?.unwrap_or_default();
        for (tp, w) in writers {
            let mut st = w.part.st.write().expect("partition lock");
            if st.epochs.latest().is_none() {
                continue;
            }
            let at = written.binary_search_by_key(tp, |(t, _)| *t).map_or(st.log_start, |i| written[i].1);
            st.hw_limit = at.max(st.log_start);
            st.hw = st.hw.min(st.hw_limit);
        }
        *self.hws_on_disk.lock().expect("hw checkpoint lock") = OnDisk { hws: written, exact: true };
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
    /// node mode) at its log end; a cut lowers the file first; no file
    /// means the log start; a damaged one refuses the start.
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
        assert!(s.checkpoint_hws().unwrap());
        drop((s, w));
        // Damaged: the start is refused, naming the file.
        let path = dir.path().join(CHECKPOINT);
        let mut bytes = std::fs::read(&path).unwrap();
        bytes[16] ^= 1;
        std::fs::write(&path, bytes).unwrap();
        let err = Storage::open(dir.path(), StorageConfig::default(), specs(), true).err().expect("a damaged checkpoint refuses the start");
        assert!(err.to_string().contains(CHECKPOINT), "{err}");
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
