//! The transactional producer and its coordinator (see the module docs
//! of `sim`, "Transactions").

use super::*;

/// The transactional producer's id.
const TXN_PRODUCER: i64 = 2_000;

/// The transactional producer, and its transaction coordinator's record
/// (durable when written, as the engine's catalog row is). The coordinator
/// is played as the engine's plays it (`kafka::coordinator::transactions`):
/// partitions added before their batches, each partition closed and its log
/// end noted when the transaction is decided, markers after, and at a
/// restart a decided transaction finished where its partitions are still
/// open, an undecided one aborted with the epoch bumped, and one the logs
/// hold open but the record does not name aborted the same way.
/// Every other transaction is of transactions v2 (KIP-890 part 2), as a
/// producer switches when the broker's `transaction.version` changes: its
/// end moves the epoch and the markers carry the new one, so the next
/// transaction starts its sequences at 0 and a late batch of the last one
/// meets a fenced epoch.
#[derive(Debug, Clone, Default)]
pub(super) struct Transactor {
    epoch: i16,
    /// Transactions begun so far.
    begun: u64,
    /// The next sequence number per tp at this epoch.
    pub(super) seqs: BTreeMap<Tp, i32>,
    /// The transaction under way, until its markers are acknowledged.
    current: Option<Txn>,
}

#[derive(Debug, Clone)]
struct Txn {
    /// Partitions the coordinator added, in order.
    tps: Vec<Tp>,
    /// Data batches sent: (tp, base offset).
    sent: Vec<(Tp, i64)>,
    /// Decided (PrepareCommit or PrepareAbort), with each partition's log
    /// end when it was closed.
    decided: Option<(Marker, BTreeMap<Tp, i64>)>,
    /// Transactions v2: the end moves the epoch.
    v2: bool,
}

impl Sim {
    /// The transactional producer's next step: begin a transaction (the
    /// coordinator adds one to three partitions), send a batch in it, send
    /// one it must not be able to (to a partition it did not add, or with
    /// an epoch already fenced), or end it; a decided transaction whose
    /// markers are not all written gets them first (the coordinator's retry).
    pub(super) fn transact(&mut self) -> Check {
        let Some(txn) = self.transactor.current.clone() else { return self.begin_txn() };
        if let Some((marker, ends)) = txn.decided {
            let missing: Vec<Tp> = ends.iter().filter(|(tp, end)| self.topics.contains_key(&tp.topic) && self.markers_from(tp, **end).next().is_none()).map(|(tp, _)| *tp).collect();
            return self.write_markers(marker, &missing).map(drop);
        }
        let live: Vec<Tp> = txn.tps.iter().copied().filter(|tp| self.topics.contains_key(&tp.topic)).collect();
        match self.rng.below(10) {
            0..=5 if !live.is_empty() => {
                let tp = live[self.rng.below(live.len() as u64) as usize];
                self.send_txn(tp)
            }
            6 => match self.pick_tp() {
                Some(tp) if !txn.tps.contains(&tp) => self.send_refused(tp, self.transactor.epoch, "to a partition its transaction did not add"),
                _ => Ok(()),
            },
            7 if self.transactor.epoch > 0 && !live.is_empty() => {
                let tp = live[self.rng.below(live.len() as u64) as usize];
                self.send_refused(tp, self.transactor.epoch - 1, "with a fenced epoch")
            }
            _ => {
                // Kafka's producer waits for every send before it commits;
                // one still unacknowledged (or lost) makes this an abort.
                let all_acked = txn.sent.iter().all(|(tp, base)| self.topics.get(&tp.topic).is_none_or(|t| t.parts[tp.partition as usize].batches.iter().any(|b| b.base == *base && b.state == State::Acked)));
                match (all_acked, self.rng.below(4)) {
                    (_, 0) => self.end_txn(Marker::Abort, false),
                    (true, _) => self.end_txn(Marker::Commit, false),
                    // Waiting for its sends.
                    (false, _) => Ok(()),
                }
            }
        }
    }

    fn begin_txn(&mut self) -> Check {
        let mut tps = Vec::new();
        for _ in 0..1 + self.rng.below(3) {
            if let Some(tp) = self.pick_tp() {
                if !tps.contains(&tp) {
                    tps.push(tp);
                }
            }
        }
        if tps.is_empty() {
            return self.create_topic();
        }
        let mut t = self.txns.write().expect("txns lock");
        for tp in &tps {
            t.add_partition(TXN_PRODUCER, self.transactor.epoch, *tp);
        }
        drop(t);
        let v2 = self.transactor.begun % 2 == 1;
        self.transactor.begun += 1;
        if self.trace {
            eprintln!("  transaction (v{}) begins at epoch {} on {:?}", if v2 { 2 } else { 1 }, self.transactor.epoch, tps.iter().map(|tp| (tp.topic[15], tp.partition)).collect::<Vec<_>>());
        }
        self.transactor.current = Some(Txn { tps, sent: Vec::new(), decided: None, v2 });
        Ok(())
    }

    /// A transactional batch builder: `n` random records with the
    /// producer's ids.
    fn txn_batch(&mut self, tp: Tp, epoch: i16) -> Vec<u8> {
        let n = 1 + self.rng.below(3) as usize;
        let values: Vec<Vec<u8>> = (0..n).map(|_| (0..self.rng.below(150)).map(|_| self.rng.next_u64() as u8).collect()).collect();
        let records: Vec<batch::NewRecord<'_>> = values.iter().map(|v| batch::NewRecord { value: Some(v), ..Default::default() }).collect();
        let mut bytes = batch::build(&records, self.now_ms);
        let seq = self.transactor.seqs.get(&tp).copied().unwrap_or(0);
        batch::set_transactional(&mut bytes, TXN_PRODUCER, epoch, seq);
        bytes
    }

    /// One batch of the transaction under way, through the writer's
    /// decision, which must take it.
    fn send_txn(&mut self, tp: Tp) -> Check {
        let epoch = self.transactor.epoch;
        let bytes = self.txn_batch(tp, epoch);
        let ids = crate::engine::producers::BatchIds::of(&batch::BatchHeader::parse(&bytes).map_err(|e| format!("a transactional batch does not parse: {e:?}"))?);
        let decision = crate::engine::admit(&self.producers, &self.txns, tp, ids, true);
        if self.trace {
            eprintln!("  transactional batch, sequence {} to {}/{}: {decision:?}", ids.base_sequence, tp.topic[15], tp.partition);
        }
        use crate::engine::producers::{Check as Decision, Refusal};
        let lost = decision == Decision::Refuse(Refusal::OutOfOrder) && self.txn_batch_lost(tp, epoch, ids.base_sequence);
        // Or the engine knows nothing of the producer here (a crash took
        // its state, or retention past the snapshot its batches) and the
        // batch does not start at sequence 0.
        let unknown = decision == Decision::Refuse(Refusal::UnknownProducer) && ids.base_sequence != 0;
        if lost || unknown {
            // A crash took a batch it sent earlier in this epoch: its
            // sequence no longer follows. Told so, the client aborts and
            // bumps its epoch (KIP-360), as Kafka's does.
            return self.end_txn(Marker::Abort, true);
        }
        ensure(decision == crate::engine::producers::Check::Append, || format!("{tp:?}: the transaction's batch (epoch {epoch}, sequence {}) was not admitted: {decision:?}", ids.base_sequence))?;
        let opens = self.opens;
        match self.append_batch(tp, bytes, State::Staged, Kind::TxnData(epoch, ids.base_sequence, ids.count))? {
            Some(a) => {
                self.producers.record(tp, ids, a.base_offset, a.last_offset, self.now_ms);
                self.txns.write().expect("txns lock").on_batch(tp, TXN_PRODUCER, epoch, a.base_offset);
                *self.transactor.seqs.entry(tp).or_default() += ids.count;
                if let Some(t) = &mut self.transactor.current {
                    t.sent.push((tp, a.base_offset));
                }
                self.out.txn_batches += 1;
                Ok(())
            }
            // Refused: the client aborts (unless storage was reopened, and
            // the coordinator's recovery ended the transaction already).
            None if self.opens == opens => self.end_txn(Marker::Abort, false),
            None => Ok(()),
        }
    }

    /// Whether a transactional batch sent to `tp` before `seq` in `epoch`
    /// is not in the log (a crash took it before it was durable).
    fn txn_batch_lost(&self, tp: Tp, epoch: i16, seq: i32) -> bool {
        let next = self.topics[&tp.topic].parts[tp.partition as usize]
            .batches
            .iter()
            .filter_map(|b| match b.kind {
                Kind::TxnData(e, s, n) if e == epoch => Some(s + n),
                _ => None,
            })
            .max()
            .unwrap_or(0);
        next != seq
    }

    /// A transactional batch the writer must not append.
    fn send_refused(&mut self, tp: Tp, epoch: i16, why: &str) -> Check {
        let bytes = self.txn_batch(tp, epoch);
        let ids = crate::engine::producers::BatchIds::of(&batch::BatchHeader::parse(&bytes).map_err(|e| format!("a transactional batch does not parse: {e:?}"))?);
        let decision = crate::engine::admit(&self.producers, &self.txns, tp, ids, true);
        if self.trace {
            eprintln!("  transactional batch {why}, epoch {epoch} to {}/{}: {decision:?}", tp.topic[15], tp.partition);
        }
        // A batch with the same ids as one written is answered as its retry
        // (Kafka's idempotence): nothing is appended either way.
        ensure(decision != crate::engine::producers::Check::Append, || format!("{tp:?}: a transactional batch {why} (epoch {epoch}) was admitted"))?;
        self.out.txn_refusals += 1;
        Ok(())
    }

    /// The coordinator decides: each partition closed (no batch of the
    /// transaction after this) with its log end noted, the decision made
    /// durable, then the markers. `bump`: the epoch moves on first (an
    /// abort the coordinator makes on its own); a transaction v2 moves it
    /// with every end.
    fn end_txn(&mut self, marker: Marker, bump: bool) -> Check {
        let Some(txn) = self.transactor.current.clone() else { return Ok(()) };
        let live: Vec<Tp> = txn.tps.iter().copied().filter(|tp| self.topics.contains_key(&tp.topic)).collect();
        let mut ends = BTreeMap::new();
        for tp in &live {
            self.txns.write().expect("txns lock").close_partition(TXN_PRODUCER, tp);
            let end = self.writer().next_offset(tp).ok_or_else(|| format!("{tp:?} unknown to the writer"))?;
            ends.insert(*tp, end);
        }
        if bump || txn.v2 {
            self.bump_epoch(self.transactor.epoch);
        }
        if self.trace {
            eprintln!("  transaction decided: {marker:?} at epoch {}, partition ends {:?}", self.transactor.epoch, ends.iter().map(|(tp, e)| (tp.topic[15], tp.partition, *e)).collect::<Vec<_>>());
        }
        self.transactor.current = Some(Txn { decided: Some((marker, ends)), ..txn });
        self.write_markers(marker, &live).map(drop)
    }

    fn bump_epoch(&mut self, from: i16) {
        self.transactor.epoch = from + 1;
        self.transactor.seqs.clear();
    }

    /// Appends `marker` to each of `tps` at the producer's epoch, as the
    /// writer does. False: storage refused one (and may have been
    /// reopened; then the coordinator's recovery took over).
    fn write_markers(&mut self, marker: Marker, tps: &[Tp]) -> Result<bool, String> {
        let epoch = self.transactor.epoch;
        let opens = self.opens;
        for tp in tps {
            let b = batch::control_batch(marker, TXN_PRODUCER, epoch, 0, self.now_ms);
            match self.append_batch(*tp, b, State::Staged, Kind::TxnMarker(marker))? {
                Some(a) => {
                    self.producers.fence(*tp, TXN_PRODUCER, epoch, 0, self.now_ms);
                    self.txns.write().expect("txns lock").on_marker(*tp, TXN_PRODUCER, marker, a.base_offset);
                }
                None => return Ok(false),
            }
            if self.opens != opens {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// The transactional producer's markers in `tp` at or past `end` (those
    /// ending the transaction decided at `end`); none if the topic is gone.
    fn markers_from(&self, tp: &Tp, end: i64) -> impl Iterator<Item = &MBatch> {
        let p = tp.partition as usize;
        self.topics.get(&tp.topic).into_iter().flat_map(move |t| t.parts[p].batches.iter().filter(move |b| b.base >= end && matches!(b.kind, Kind::TxnMarker(_))))
    }

    /// After a sync: a decided transaction whose every marker is
    /// acknowledged is complete.
    pub(super) fn complete_txn(&mut self) {
        let Some(Txn { decided: Some((marker, ends)), .. }) = &self.transactor.current else { return };
        let done = ends.iter().all(|(tp, end)| !self.topics.contains_key(&tp.topic) || self.markers_from(tp, *end).any(|b| b.state == State::Acked));
        if done {
            match marker {
                Marker::Commit => self.out.txn_commits += 1,
                Marker::Abort => self.out.txn_aborts += 1,
            }
            self.transactor.current = None;
        }
    }

    /// The coordinator's start-up, over the producer state the engine
    /// restored: a decided transaction gets markers where it is still open
    /// below its decision's log end; an undecided one is aborted with the
    /// epoch bumped; a transaction the logs hold open that no record names
    /// (its beginning was lost) is aborted, its producer fenced.
    pub(super) fn recover_txns(&mut self) -> Check {
        let opens = self.opens;
        match self.transactor.current.clone() {
            Some(Txn { decided: Some((marker, ends)), .. }) => {
                let open = self.txns.read().expect("txns lock").ongoing();
                let tps: Vec<Tp> = ends.iter().filter(|(tp, end)| self.topics.contains_key(&tp.topic) && open.iter().any(|(t, o)| t == *tp && o.producer_id == TXN_PRODUCER && o.first_offset < **end)).map(|(tp, _)| *tp).collect();
                if self.trace {
                    eprintln!("  recovery finishes a decided transaction ({marker:?}) on {} partitions", tps.len());
                }
                self.write_markers(marker, &tps)?;
            }
            Some(_) => {
                if self.trace {
                    eprintln!("  recovery aborts the transaction under way");
                }
                self.end_txn(Marker::Abort, true)?;
            }
            None => {}
        }
        if self.opens != opens {
            return Ok(());
        }
        let dangling: Vec<(Tp, crate::engine::txns::OpenTxn)> = self.txns.read().expect("txns lock").ongoing().into_iter().filter(|(tp, o)| o.producer_id == TXN_PRODUCER && self.topics.contains_key(&tp.topic)).collect();
        if dangling.is_empty() {
            return Ok(());
        }
        // Only the transaction under way can be open, and recovery just
        // ended it (or its markers were refused: the next step retries).
        if self.transactor.current.as_ref().is_some_and(|t| t.decided.is_some()) {
            return Ok(());
        }
        let from = dangling.iter().map(|(_, o)| o.epoch).max().unwrap_or(0).max(self.transactor.epoch);
        self.bump_epoch(from);
        if self.trace {
            eprintln!("  recovery aborts {} partitions left open in the logs, epoch now {}", dangling.len(), self.transactor.epoch);
        }
        let tps: Vec<Tp> = dangling.iter().map(|(tp, _)| *tp).collect();
        self.write_markers(Marker::Abort, &tps).map(drop)
    }

    /// The engine's transaction state against the model, for every tp: a
    /// batch of an open transaction lies at or past the last stable
    /// offset; a batch of an aborted one is reported aborted (a
    /// read_committed consumer drops it), a committed one is not; and with
    /// no transaction open the stable offset does not wait.
    pub(super) fn check_txns(&self) -> Check {
        let t = self.txns.read().expect("txns lock");
        for (id, topic) in &self.topics {
            for (p, m) in topic.parts.iter().enumerate() {
                let tp = Tp { topic: *id, partition: p as i32 };
                // The model's view: each data batch's fate.
                let mut open: Vec<usize> = Vec::new();
                let mut fate: Vec<Option<Marker>> = vec![None; m.batches.len()];
                for (i, b) in m.batches.iter().enumerate() {
                    match b.kind {
                        Kind::TxnData(..) => open.push(i),
                        Kind::TxnMarker(marker) => {
                            for j in open.drain(..) {
                                fate[j] = Some(marker);
                            }
                        }
                        _ => {}
                    }
                }
                let first_unstable = t.first_unstable(&tp);
                for (i, b) in m.batches.iter().enumerate().filter(|(_, b)| matches!(b.kind, Kind::TxnData(..)) && b.last >= m.log_start) {
                    match fate[i] {
                        None => ensure(first_unstable.is_some_and(|f| f <= b.base), || {
                            let kinds: Vec<(i64, Kind, State)> = m.batches.iter().map(|b| (b.base, b.kind, b.state)).collect();
                            format!("{tp:?}: open transactional batch at {} below the stable offset ({first_unstable:?}); log start {}, the model's batches {kinds:?}", b.base, m.log_start)
                        })?,
                        Some(marker) => {
                            let aborted = t.is_aborted(&tp, TXN_PRODUCER, b.base);
                            ensure(aborted == (marker == Marker::Abort), || format!("{tp:?}: transactional batch at {} ended by {marker:?} but reported {}", b.base, if aborted { "aborted" } else { "not aborted" }))?;
                        }
                    }
                }
                // The stable offset waits for an open transaction only.
                if let Some(f) = first_unstable {
                    let kafka_first = open.first().map(|&i| m.batches[i].base);
                    ensure(kafka_first.is_some_and(|k| f >= k), || format!("{tp:?}: stable offset held at {f}, the model's oldest open transaction starts at {kafka_first:?}"))?;
                }
            }
        }
        Ok(())
    }
}
