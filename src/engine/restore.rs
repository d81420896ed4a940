//! Producer state across restarts: the snapshot file storage keeps for
//! the engine, and the restore at start-up (the snapshot, cut to what the
//! log kept, then a replay of the log after it). The writer thread takes
//! the snapshots (`writer::Snapshots`); the state itself is
//! `producers::Producers`.

use super::*;

/// The idempotent-producer snapshot: a state file storage keeps.
const PRODUCER_SNAPSHOT: &str = "producers.snapshot";

/// Producer state at startup: the snapshot (if any and readable), minus
/// what the recovered log no longer holds, plus a replay of every batch
/// after the log end the snapshot covered (all of a tp created since).
/// Without any snapshot (a data directory from before snapshots, or an
/// unreadable one) only the last `expiry_ms` of each log is replayed, by
/// its time index: older producers would have expired anyway.
pub(crate) fn restore_producers(storage: &Storage, now_ms: i64, expiry_ms: i64) -> Result<(producers::Producers, txns::Txns), EngineError> {
    let started = std::time::Instant::now();
    let loaded = storage.get_state(PRODUCER_SNAPSHOT).map_err(|e| e.to_string()).and_then(|raw| raw.map(|r| producers::Producers::decode_snapshot(&r)).transpose());
    let (mut state, mut txns, covered) = match loaded {
        Ok(Some((state, txns, covered))) => (state, txns, Some(covered)),
        Ok(None) => (Default::default(), Default::default(), None),
        Err(e) => {
            tracing::warn!(file = PRODUCER_SNAPSHOT, error = %e, "ignoring an unreadable producer snapshot; rebuilding from the recent log");
            (Default::default(), Default::default(), None)
        }
    };
    // What the snapshot knows of a tp ends at the log end it covered (a
    // producer's batch recorded past it was not yet written when it was
    // taken: the replay from there finds it if it was written after), and
    // at the log end now (a crash may have lost the rest). Found by the
    // simulator: past either, a retry was answered with a lost batch's
    // offsets, or a batch recorded twice pushed a retried one out of the
    // window.
    let known = |tp: &Tp| {
        let leo = storage.offsets(tp)?.2;
        Some(covered.as_ref().and_then(|c| c.get(tp)).map_or(leo, |&end| end.min(leo)))
    };
    state.drop_beyond(known);
    txns.drop_beyond(known);
    let mut replayed = 0;
    // Whether the log came back shorter than the snapshot on disk covered.
    let mut truncated = false;
    // Only tps holding data have batches to replay, and only those the
    // snapshot covered can have come back shorter than it saw: with a
    // million idle topics, most are neither.
    let mut tps: Vec<Tp> = storage.nonempty_log_ends().0.into_iter().map(|(tp, _)| tp).collect();
    if let Some(c) = &covered {
        tps.extend(c.keys().copied());
    }
    tps.sort_unstable();
    tps.dedup();
    for tp in tps {
        let Some((log_start, _, leo)) = storage.offsets(&tp) else { continue };
        let from = match &covered {
            // The log came back shorter than the snapshot saw (a machine
            // crash lost a tail it covered): what the snapshot says of this
            // tp may rest on the lost part (a marker that closed a
            // transaction), so the tp is rebuilt from its log start.
            Some(c) if c.get(&tp).is_some_and(|&end| leo < end) => {
                tracing::warn!(topic = %crate::meta::hex(&tp.topic), partition = tp.partition, "log shorter than the producer snapshot covered; replaying the partition from its start");
                truncated = true;
                state.forget_tp(&tp);
                txns.forget_tp(&tp);
                0
            }
            // Retention took batches after what the snapshot covered: a
            // producer's last batch may be among them, and the snapshot's
            // older state would refuse its next one as out of order; or a
            // marker that closed a transaction the snapshot holds open,
            // which would then hold the stable offset back for good. The
            // tp is rebuilt from what the log holds; a producer whose
            // batches are all gone is unknown here, and its next batch is
            // refused with UNKNOWN_PRODUCER_ID unless it starts at
            // sequence 0 (both found by the simulator).
            Some(c) if c.get(&tp).is_some_and(|&end| end < log_start) => {
                state.forget_tp(&tp);
                txns.forget_tp(&tp);
                log_start
            }
            Some(c) => c.get(&tp).copied().unwrap_or(0),
            None => match storage.offset_for_timestamp_in_log(&tp, now_ms.saturating_sub(expiry_ms)) {
                Ok(Some((offset, _))) => offset,
                Ok(None) => continue,
                Err(_) => 0,
            },
        };
        // A partition whose batches cannot be read back has producer state
        // that cannot be trusted: a retry of a batch it holds would be
        // written twice. The start fails instead (found by the simulator:
        // one read error at start-up used to cost a duplicate).
        replayed += state.replay(&mut txns, storage, tp, from, now_ms).inspect_err(|e| {
            tracing::error!(topic = %crate::meta::hex(&tp.topic), partition = tp.partition, error = %e, "replaying producer state failed; not starting without it");
        })?;
    }
    tracing::info!(producers = state.len(), replayed_batches = replayed, elapsed_ms = started.elapsed().as_millis() as u64, "producer state restored");
    // So a crash soon after this start does not replay the same again.
    // After a truncation this one must land: the snapshot on disk speaks of
    // batches the log lost, and once new batches fill those offsets again
    // a later start could not tell (found by the simulator: a retry was
    // answered with the offsets of a lost batch).
    let snapshot = state.encode_snapshot(&txns.to_snapshot(), &covered_ends(&state, storage).0);
    match storage.put_state(PRODUCER_SNAPSHOT, &snapshot) {
        Ok(()) => {}
        Err(e) if truncated => {
            tracing::error!(file = PRODUCER_SNAPSHOT, error = %e, "replacing a producer snapshot the log no longer matches failed; not starting with it in place");
            return Err(e.into());
        }
        Err(e) => tracing::warn!(file = PRODUCER_SNAPSHOT, error = %e, "writing the producer snapshot failed"),
    }
    Ok((state, txns))
}

/// Writes the producer snapshot covering every tp's current log end.
pub(crate) fn snapshot_producers(state: &producers::Producers, txns: &txns::Txns, storage: &Storage) {
    write_snapshot(storage, &state.encode_snapshot(&txns.to_snapshot(), &covered_ends(state, storage).0));
}

/// [`snapshot_producers`] where the snapshot must land: after a
/// truncation (`LogWriter::truncate`) the one on disk covers offsets the
/// cut took, which new batches fill again, and a restore from it would
/// skip them (found by the simulator: a retried batch appended twice).
/// A failure leaves the writer unable to go on.
pub(crate) fn replace_producer_snapshot(state: &producers::Producers, txns: &txns::Txns, storage: &Storage) -> Result<(), StorageError> {
    storage.put_state(PRODUCER_SNAPSHOT, &state.encode_snapshot(&txns.to_snapshot(), &covered_ends(state, storage).0))
}

/// The log ends a producer snapshot covers: every tp holding data, and
/// every tp a producer has state in even if retention emptied it (so a
/// restore knows how far the snapshot's knowledge of it went). With the
/// number of tps walked, for the snapshot cadence.
pub(crate) fn covered_ends(state: &producers::Producers, storage: &Storage) -> (Vec<(Tp, i64)>, usize) {
    let (mut ends, walked) = storage.nonempty_log_ends();
    // A tp both lists name has the same log end in both (only the writer
    // moves it, and it is the one asking, or stopped): the dedup merges them.
    ends.extend(state.tps().filter_map(|tp| storage.offsets(&tp).map(|(_, _, leo)| (tp, leo))));
    ends.sort_unstable();
    ends.dedup();
    (ends, walked)
}

/// A failed snapshot costs a longer replay at the next start, nothing
/// more: logged, not fatal.
pub(super) fn write_snapshot(storage: &Storage, snapshot: &[u8]) {
    if let Err(e) = storage.put_state(PRODUCER_SNAPSHOT, snapshot) {
        tracing::warn!(file = PRODUCER_SNAPSHOT, error = %e, "writing the producer snapshot failed");
    }
}

#[cfg(test)]
/// Producer state across restarts, at the storage level: the log, the
/// writer's decision and the restore, as the simulator drives them.
/// Each test is a bug the simulator found (seeds 389, 1540, 3929 and
/// 262 of its first idempotent-producer runs).
mod tests {
    use super::*;
    use crate::protocol::batch::tests::make_batch;
    use crate::protocol::batch::{self, Marker};
    use crate::storage::disk::sim::{Faults, SimDisk};
    use crate::storage::{LogWriter, PartitionSpec, RetentionPolicy, StorageConfig};
    use std::path::Path;

    const PID: i64 = 7;
    const A: Tp = Tp { topic: [1; 16], partition: 0 };
    const B: Tp = Tp { topic: [2; 16], partition: 0 };

    struct Broker {
        disk: SimDisk,
        cfg: StorageConfig,
        storage: Arc<Storage>,
        log: LogWriter,
        producers: producers::Producers,
        txns: RwLock<txns::Txns>,
        log_start: i64,
    }

    impl Broker {
        fn new() -> Broker {
            let disk = SimDisk::new(1, Faults::default());
            let cfg = StorageConfig { segment_bytes: 200, disk: Arc::new(disk.clone()), ..StorageConfig::default() };
            let (storage, log) = Storage::open(Path::new("/data"), cfg.clone(), specs(0), false).unwrap();
            Broker { disk, cfg, storage, log, producers: Default::default(), txns: Default::default(), log_start: 0 }
        }

        /// Producer `PID`'s batch `seq` to A, through the writer's
        /// decision; the decision.
        fn send(&mut self, seq: i32) -> producers::Check {
            self.send_as(seq, false)
        }

        /// [`Broker::send`], in a transaction when `transactional`.
        fn send_as(&mut self, seq: i32, transactional: bool) -> producers::Check {
            self.send_in(0, seq, transactional)
        }

        /// [`Broker::send_as`] in producer epoch `epoch`.
        fn send_in(&mut self, epoch: i16, seq: i32, transactional: bool) -> producers::Check {
            let mut b = make_batch(&[format!("record {seq}").as_bytes()], 1_000);
            if transactional {
                batch::set_transactional(&mut b, PID, epoch, seq);
            } else {
                batch::set_producer(&mut b, PID, epoch, seq);
            }
            let ids = producers::BatchIds::of(&batch::BatchHeader::parse(&b).unwrap());
            let check = writer::admit(&self.producers, &self.txns, A, ids, transactional);
            if check == producers::Check::Append {
                let a = self.log.append(A, &b, 1_000, false).unwrap();
                self.producers.record(A, ids, a.base_offset, a.last_offset, 1_000);
                if transactional {
                    self.txns.write().unwrap().on_batch(A, PID, 0, a.base_offset);
                }
            }
            check
        }

        /// Ends `PID`'s transaction on A with `marker`, as the writer does.
        fn marker(&mut self, marker: Marker) {
            let a = self.log.append(A, &batch::control_batch(marker, PID, 0, 0, 1_000), 1_000, false).unwrap();
            self.producers.fence(A, PID, 0, 0, 1_000);
            self.txns.write().unwrap().on_marker(A, PID, marker, a.base_offset);
        }

        /// A plain batch to B (same branch: it seals A's segment).
        fn other(&mut self) {
            self.log.append(B, &make_batch(&[b"other"], 1_000), 1_000, false).unwrap();
        }

        fn flush(&mut self, sync: bool) {
            let f = self.log.flush().unwrap();
            if sync {
                self.storage.sync().unwrap();
            }
            self.storage.publish_hw(&f);
        }

        fn snapshot(&self) {
            snapshot_producers(&self.producers, &self.txns.read().unwrap(), &self.storage);
        }

        /// Retention with A's batches all expired.
        fn retention(&mut self) {
            let (moved, _) = self.storage.enforce_retention(10_000_000, |tp| RetentionPolicy { retention_ms: (*tp == A).then_some(1), retention_bytes: None }, |_| Ok(()), |_| Ok(()), &mut |sw| self.log.apply(sw)).unwrap();
            for (tp, start) in moved {
                if tp == A {
                    self.log_start = start;
                }
            }
        }

        /// A crash (the machine's: every unsynced write lost) and a start.
        fn crash_and_restart(self) -> Result<Broker, EngineError> {
            let Broker { disk, cfg, log_start, .. } = self;
            disk.crash_losing_everything_unsynced();
            Broker::start(disk, cfg, log_start)
        }

        /// Storage recovered, then producer state restored, as
        /// `Engine::open` does.
        fn start(disk: SimDisk, cfg: StorageConfig, log_start: i64) -> Result<Broker, EngineError> {
            let (storage, log) = Storage::open(Path::new("/data"), cfg.clone(), specs(log_start), false)?;
            let (producers, txns) = restore_producers(&storage, 1_000, 7 * 24 * 3600 * 1000)?;
            Ok(Broker { disk, cfg, storage, log, producers, txns: RwLock::new(txns), log_start })
        }
    }

    fn specs(a_start: i64) -> Vec<PartitionSpec> {
        vec![PartitionSpec { tp: A, branch: "b.x".into(), log_start: a_start }, PartitionSpec { tp: B, branch: "b.x".into(), log_start: 0 }]
    }

    /// Retention took batches after what the snapshot covered: the
    /// snapshot's older state of the producer must not refuse its next
    /// batch as out of order (a client takes that for lost records and
    /// stops). With its batches all gone, the producer is unknown here:
    /// its next batch is refused with UNKNOWN_PRODUCER_ID, and the client
    /// starts over at sequence 0 (a new epoch), which is taken.
    #[test]
    fn retention_past_the_snapshot_makes_the_producer_start_over() {
        let mut b = Broker::new();
        assert_eq!(b.send(0), producers::Check::Append);
        b.flush(true);
        b.snapshot();
        assert_eq!(b.send(1), producers::Check::Append);
        b.other();
        b.flush(true);
        b.retention();
        assert_eq!(b.log_start, 2, "retention took both of the producer's batches");
        let mut b = b.crash_and_restart().unwrap();
        assert_eq!(b.send(2), producers::Check::Refuse(producers::Refusal::UnknownProducer));
        assert_eq!(b.send_in(1, 0, false), producers::Check::Append);
    }

    /// Retention took a transaction's marker after what the snapshot
    /// covered: the transaction the snapshot holds open must not hold the
    /// stable offset back for good (the simulator's seed 249 of its first
    /// runs with transactions: read_committed consumers of the partition
    /// would have read nothing more).
    #[test]
    fn retention_past_the_snapshot_does_not_leave_a_transaction_open() {
        let mut b = Broker::new();
        b.txns.write().unwrap().add_partition(PID, 0, A);
        assert_eq!(b.send_as(0, true), producers::Check::Append);
        b.flush(true);
        b.snapshot();
        assert_eq!(b.txns.read().unwrap().first_unstable(&A), Some(0));
        b.marker(Marker::Abort);
        b.other();
        b.flush(true);
        b.retention();
        assert_eq!(b.log_start, 2, "retention took the batch and its marker");
        let b = b.crash_and_restart().unwrap();
        assert_eq!(b.txns.read().unwrap().first_unstable(&A), None, "no transaction is open in A");
    }

    /// A tp retention emptied still has producer state: snapshots cover
    /// it, so a later restore knows how far they knew it.
    #[test]
    fn snapshots_cover_tps_retention_emptied() {
        let mut b = Broker::new();
        assert_eq!(b.send(0), producers::Check::Append);
        b.other();
        b.flush(true);
        b.retention();
        assert_eq!(b.log_start, 1);
        assert!(covered_ends(&b.producers, &b.storage).0.contains(&(A, 1)), "the emptied tp is covered");
        b.snapshot();
        assert_eq!(b.send(1), producers::Check::Append);
        b.other();
        b.flush(true);
        b.retention();
        assert_eq!(b.log_start, 2);
        let mut b = b.crash_and_restart().unwrap();
        // Not out of order: unknown, and taken again from sequence 0.
        assert_eq!(b.send(2), producers::Check::Refuse(producers::Refusal::UnknownProducer));
        assert_eq!(b.send_in(1, 0, false), producers::Check::Append);
    }

    /// Producer state that cannot be read back from the log is not
    /// guessed at: a retry of a batch it would miss is written twice.
    #[test]
    fn a_read_error_while_replaying_fails_the_start() {
        let mut b = Broker::new();
        assert_eq!(b.send(0), producers::Check::Append);
        b.flush(true);
        // A start without a snapshot replays the log.
        let b = b.crash_and_restart().unwrap();
        assert_eq!(b.producers.len(), 1);
        b.disk.set_faults(Faults { read_eio: 1_000_000, ..Faults::default() });
        assert!(restore_producers(&b.storage, 1_000, 7 * 24 * 3600 * 1000).is_err());
    }

    /// The log came back shorter than the snapshot covered: the start
    /// must replace the snapshot, or not happen. A snapshot left in
    /// place would be trusted once new batches fill the lost offsets,
    /// and a retry of the lost batch answered with their offsets.
    #[test]
    fn a_snapshot_the_log_no_longer_matches_is_replaced_or_the_start_fails() {
        let mut b = Broker::new();
        assert_eq!(b.send(0), producers::Check::Append);
        // Flushed, not synced: the snapshot covers what a crash loses.
        b.flush(false);
        b.snapshot();
        let (disk, cfg) = (b.disk.clone(), b.cfg.clone());
        disk.set_faults(Faults { nospc: 1_000_000, ..Faults::default() });
        assert!(b.crash_and_restart().is_err(), "a start that cannot replace the stale snapshot fails");
        // On a healthy disk it starts, and the lost batch is written
        // again, not answered as a duplicate of what is not there.
        disk.set_faults(Faults::default());
        let mut b = Broker::start(disk, cfg, 0).unwrap();
        assert_eq!(b.storage.offsets(&A), Some((0, 0, 0)));
        assert_eq!(b.send(0), producers::Check::Append);
    }
}
