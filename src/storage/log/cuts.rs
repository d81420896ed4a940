//! Truncation of one tp in a shared branch log (a follower cutting its
//! divergent tail back to where it agrees with its leader, KIP-101).
//!
//! A tp's tail cannot be cut off a log its siblings' later batches follow,
//! so a truncation is logical. [`LogWriter::truncate`] rolls the branch
//! (sealing the active segment, after the frames staged into it are
//! written and synced), so that every frame before the cut lies in a
//! segment based below the cut's sequence number and every frame after it
//! in one based at or above. It then records the cut, `(tp, seq, end)`,
//! durably in the state file `truncations`, and only then lowers the tp's
//! log end in memory. A frame is *dead* when some cut of its tp has a
//! larger sequence number and an end at or below its base offset: every
//! reader's cursor (`Frames`: tp reads, subtree streams, compaction,
//! cleaning) passes dead frames by, and the tip, which cannot tell them
//! apart, is emptied.
//!
//! Dead frames stay in their segments until retention or compaction
//! retires those; compaction copies only live frames, so stores never hold
//! a dead one. A truncation into what stores already hold is refused: a
//! follower does not cut below its high watermark, and compaction takes
//! nothing at or past it (`log/compact.rs`), nor does a restart expose more
//! than the hw checkpoint held (`log/hws.rs`); only a cut below the hw (an
//! unclean election; a follower starting over at its leader's log start
//! cuts below its hw too, and is let start over beside what it cannot cut)
//! can meet stores. A cut is dropped at a start
//! once its branch keeps no segment based below it: its dead frames are
//! gone.
//!
//! Not yet: the bytes and largest timestamps segments record for a tp
//! still count its dead frames until those segments go, so
//! `retention.bytes` and partition sizes over-count (retention by bytes
//! may retire live batches early) and ListOffsets by the largest
//! timestamp may find none; a read-ahead computed across a cut can keep
//! dead batches in its slot, and a read that took the high watermark
//! before a cut and its start after may return a new batch past the cut
//! with the old high watermark. None of this arises before the engine
//! truncates (cluster step 3), which must settle it.
//!
//! Recovery takes the segments in order and applies each cut when it
//! reaches the first segment based at or above it, to what the segments
//! before it (and the stores) left: the tp's end, index entries and
//! segment summaries. A crash before the state file is replaced leaves
//! the tail uncut, as if the truncation had not begun (the follower finds
//! the divergence again); after, the cut holds.
//!
//! ```text
//!   0  magic     8 bytes  b"CNPYCUT\0"
//!   8  version   u16      1
//!  10  cuts      u32
//!  per cut:      topic id (16 bytes), partition i32, seq u64, end i64
//!  end crc       u32      crc32 (IEEE) of everything before it
//! ```

use super::*;

/// The state file holding every cut still in force.
pub const CHECKPOINT: &str = "truncations";
const MAGIC: &[u8; 8] = b"CNPYCUT\0";
const VERSION: u16 = 1;
const CUT_BYTES: usize = 16 + 4 + 8 + 8;

/// One truncation of a tp: its frames with a smaller sequence number and a
/// base offset at or past `end` are dead.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cut {
    pub seq: u64,
    pub end: i64,
}

impl Cut {
    pub fn kills(&self, fh: &FrameHeader) -> bool {
        fh.seq < self.seq && fh.base_offset >= self.end
    }
}

/// Every cut in force, by tp, each tp's in sequence order.
pub type Cuts = HashMap<Tp, Vec<Cut>>;

impl Storage {
    /// The truncations in force, if any.
    pub(super) fn cuts_in_force(&self) -> Option<Arc<Cuts>> {
        if !self.any_cuts.load(Ordering::Acquire) {
            return None;
        }
        Some(self.cuts.read().expect("cuts lock").clone())
    }

    /// `tp`'s truncations in force (tests, the simulator).
    pub fn cuts_of(&self, tp: &Tp) -> Vec<Cut> {
        self.cuts_in_force().and_then(|c| c.get(tp).cloned()).unwrap_or_default()
    }

    /// The last offset of `tp` that subtree stores hold, if any: a
    /// truncation may not reach below it.
    pub fn stored_to(&self, tp: &Tp) -> Option<i64> {
        let part = self.parts.read().expect("parts lock").get(tp).cloned()?;
        let stored = part.st.read().expect("partition lock").stored_to(tp);
        stored
    }
}

/// Whether any of `cuts` kills the frame.
pub fn dead(cuts: &Cuts, fh: &FrameHeader) -> bool {
    cuts.get(&Tp { topic: fh.topic_id, partition: fh.partition }).is_some_and(|cs| cs.iter().any(|c| c.kills(fh)))
}

pub fn encode(cuts: &Cuts) -> Vec<u8> {
    let mut all: Vec<(Tp, Cut)> = cuts.iter().flat_map(|(tp, cs)| cs.iter().map(move |c| (*tp, *c))).collect();
    all.sort_by_key(|(tp, c)| (c.seq, *tp));
    let mut records = Vec::with_capacity(all.len() * CUT_BYTES);
    for (tp, c) in &all {
        records.extend_from_slice(&tp.topic);
        records.extend_from_slice(&tp.partition.to_be_bytes());
        records.extend_from_slice(&c.seq.to_be_bytes());
        records.extend_from_slice(&c.end.to_be_bytes());
    }
    state::framed(MAGIC, VERSION, all.len() as u32, &records)
}

/// Reads the state file back; anything that does not verify is an error
/// naming what.
pub fn decode(bytes: &[u8]) -> Result<Cuts, String> {
    let (n, body) = state::unframe(bytes, MAGIC, VERSION, "truncation file")?;
    let n = n as usize;
    if n.checked_mul(CUT_BYTES) != Some(body.len()) {
        return Err(format!("{n} cuts in {} bytes", body.len()));
    }
    let mut cuts = Cuts::default();
    for rec in body.chunks_exact(CUT_BYTES) {
        let tp = Tp { topic: rec[..16].try_into().expect("16 bytes"), partition: i32::from_be_bytes(rec[16..20].try_into().expect("4 bytes")) };
        let cut = Cut { seq: u64::from_be_bytes(rec[20..28].try_into().expect("8 bytes")), end: i64::from_be_bytes(rec[28..36].try_into().expect("8 bytes")) };
        let cs = cuts.entry(tp).or_default();
        if cut.end < 0 || cs.last().is_some_and(|l: &Cut| l.seq >= cut.seq) {
            return Err(format!("cut {cut:?} out of order"));
        }
        cs.push(cut);
    }
    Ok(cuts)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_file_reads_back_and_refuses_damage() {
        let a = Tp { topic: [1; 16], partition: 0 };
        let b = Tp { topic: [2; 16], partition: 5 };
        let mut cuts = Cuts::default();
        cuts.insert(a, vec![Cut { seq: 10, end: 4 }, Cut { seq: 30, end: 2 }]);
        cuts.insert(b, vec![Cut { seq: 20, end: 0 }]);
        let bytes = encode(&cuts);
        assert_eq!(decode(&bytes).unwrap(), cuts);
        assert_eq!(decode(&encode(&Cuts::default())).unwrap(), Cuts::default());
        for n in 0..bytes.len() {
            assert!(decode(&bytes[..n]).is_err(), "{n} bytes");
        }
        for i in 0..bytes.len() {
            let mut bad = bytes.clone();
            bad[i] ^= 0x10;
            assert!(decode(&bad).is_err(), "byte {i}");
        }
        // A count that lies, with a valid checksum.
        let mut lie = bytes[..bytes.len() - 4].to_vec();
        lie[10..14].copy_from_slice(&7u32.to_be_bytes());
        let crc = crc32fast::hash(&lie);
        lie.extend_from_slice(&crc.to_be_bytes());
        assert!(decode(&lie).unwrap_err().contains("7 cuts"));
    }

    #[test]
    fn a_cut_kills_the_tps_earlier_frames_at_or_past_its_end() {
        let tp = Tp { topic: [1; 16], partition: 0 };
        let fh = |seq, base| FrameHeader { frame_len: 0, crc: 0, seq, topic_id: tp.topic, partition: 0, base_offset: base, last_offset_delta: 0, max_timestamp: 0 };
        let mut cuts = Cuts::default();
        cuts.insert(tp, vec![Cut { seq: 10, end: 5 }, Cut { seq: 20, end: 8 }]);
        assert!(!dead(&cuts, &fh(9, 4)) && dead(&cuts, &fh(9, 5)) && dead(&cuts, &fh(9, 9)));
        // After the first cut, before the second: dead from 8 only.
        assert!(!dead(&cuts, &fh(12, 5)) && !dead(&cuts, &fh(12, 7)) && dead(&cuts, &fh(12, 8)));
        // After both: alive.
        assert!(!dead(&cuts, &fh(20, 9)));
        let other = FrameHeader { partition: 1, ..fh(9, 9) };
        assert!(!dead(&cuts, &other));
    }
}
