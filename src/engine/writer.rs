//! The writer thread and the syncer thread: the write path's owners.
//!
//! ```text
//!  submit ──► WriteCmd (bounded queue) ──► Writer (one round: every queued command)
//!                                            ├─ append / marker / close_txn / switch, one method each
//!                                            ├─ producer expiry, storage flush, producer snapshot
//!                                            └─ acks=1 answered; acks=all ──► syncer: sync, publish, answer
//! ```
//!
//! The writer owns the idempotent-producer state (so the sequence check and
//! the append it allows are one step) and the log's write side
//! ([`LogWriter`]), which nothing else can reach: retention, compaction
//! and topic deletion send it their switches (`storage::log::switch`). A
//! round takes whatever is queued (up to [`MAX_ROUND`]), so many appends
//! share one flush and one fsync.
//!
//! # Failure
//!
//! A panic on either thread is caught at the round: storage is poisoned
//! with the reason (appends refused, `/ready` answers 503, the reason is
//! logged and exported), the answers of that round are refusals, and the
//! thread goes on refusing, so no client waits forever and shutdown still
//! completes. An I/O failure poisons storage the same way from inside it.

use bytes::Bytes;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};

use tokio::sync::{mpsc, oneshot};

use super::producers::{self, Refusal};
use super::validate::Validated;
use super::waiters::Waiters;
use super::{probe, txns, AppendResult, Clock, FlushPolicy, ProducerStats};
use crate::protocol::batch::{self, Marker};
use crate::storage::log::{Flushed, LogWriter, Switch};
use crate::storage::{Storage, StorageError, Tp};

/// Most commands taken in one round: bounds the latency of the first.
pub(super) const MAX_ROUND: usize = 4096;

/// The writer snapshots producer state (and the log end it covers) this
/// often, or after this many bytes appended, whichever comes first, while
/// anything is appended; a restart after a crash replays at most that much
/// of each tp.
const PRODUCER_SNAPSHOT_EVERY_MS: i64 = 30_000;
const PRODUCER_SNAPSHOT_EVERY_BYTES: u64 = 128 << 20;
/// A snapshot lists every tp's log end (collected on the writer thread,
/// about 100 B of JSON each): the byte trigger grows by this much per tp
/// the last snapshot covered, so with a million topics snapshots cost a
/// few percent of the bytes appended, not a multiple of them.
const PRODUCER_SNAPSHOT_BYTES_PER_TP: u64 = 4 << 10;

/// When an append is acknowledged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ack {
    /// After the bytes are written (acks=0 and acks=1).
    Written,
    /// After the bytes are durable under the flush policy (acks=all).
    Durable,
}

/// Why the writer could not take an append.
#[derive(Debug, Clone)]
pub(super) enum AppendFailure {
    /// The topic was deleted while the append was queued.
    UnknownPartition,
    Storage(String),
    Refused(Refusal),
    /// A replicated batch below the log end (see `LogWriter::append_at`).
    Misplaced(String),
}

pub(super) type Reply = oneshot::Sender<Result<AppendResult, AppendFailure>>;

/// One validated produce partition's batches.
pub(super) struct Append {
    pub tp: Tp,
    pub records: Validated,
    pub log_append_time: bool,
    pub ack: Ack,
    /// Counts each batch that reaches the log.
    pub traffic: Arc<probe::Traffic>,
    pub reply: Reply,
}

/// A follower's copy of its leader's batches for one tp (cluster mode):
/// checked for shape and CRC, not for the produce rules the leader applied.
pub(super) struct Replicate {
    pub tp: Tp,
    pub records: Bytes,
    pub ack: Ack,
    pub reply: Reply,
}

pub(super) enum WriteCmd {
    Append(Append),
    Replicate(Replicate),
    /// A transaction marker of a coordinator of `coordinator_epoch`; acked
    /// when durable. `checked` (WriteTxnMarkers): refused when the producer
    /// has a newer epoch at the tp (StaleEpoch), or a marker of a newer
    /// coordinator there (CoordinatorFenced).
    Marker { tp: Tp, producer_id: i64, epoch: i16, coordinator_epoch: i32, marker: Marker, checked: bool, reply: Reply },
    /// The coordinator is about to decide a transaction: no more of its
    /// batches for these tps; answers each tp's log end (-1: gone), taken
    /// in order with the appends, so every batch admitted lies below it.
    CloseTxn { producer_id: i64, tps: Vec<Tp>, reply: oneshot::Sender<Vec<i64>> },
    /// A change to the log's structure that retention or compaction
    /// prepared (see `storage::log::switch`); answered once applied.
    Switch { switch: Switch, reply: oneshot::Sender<Result<(), StorageError>> },
    /// This node leads `tps` in leader `epoch` from their next offsets
    /// (cluster mode; every tp of a unit at once).
    BeginEpoch { tps: Vec<Tp>, epoch: i32, reply: oneshot::Sender<Result<(), StorageError>> },
    /// Cuts a follower's divergent tail of `tp` at `end`; answers the new
    /// log end.
    Truncate { tp: Tp, end: i64, reply: oneshot::Sender<Result<i64, StorageError>> },
    /// The producers with state in each tp (DescribeProducers): the writer
    /// owns that state, so it answers, in order with the appends.
    DescribeProducers { tps: Vec<Tp>, reply: oneshot::Sender<Vec<Vec<producers::ActiveProducer>>> },
    Shutdown(oneshot::Sender<()>),
    /// Panics on the writer thread (tests of the poison path).
    #[cfg(test)]
    Panic,
}

/// What the writer hands the syncer after a round.
pub(super) struct SyncJob {
    moved: Flushed,
    replies: Vec<(Reply, AppendResult)>,
    done: Option<oneshot::Sender<()>>,
}

/// What the writer shares with the rest of the engine.
pub(super) struct Shared {
    pub txns: Arc<RwLock<txns::Txns>>,
    pub any_txns: Arc<AtomicBool>,
    pub stats: Arc<ProducerStats>,
}

/// How the writer runs: the clock, whom it wakes, when it answers, and
/// when producer state expires.
pub(super) struct Setup {
    pub clock: Clock,
    pub waiters: Arc<Waiters>,
    /// Followers' fetches: woken at the write, before the fsync.
    pub replica_waiters: Arc<Waiters>,
    pub policy: FlushPolicy,
    pub producer_expiry_ms: i64,
}

pub(super) struct Writer {
    /// The log's write side, owned by this thread alone.
    log: LogWriter,
    setup: Setup,
    sync_tx: std::sync::mpsc::SyncSender<SyncJob>,
    producers: producers::Producers,
    shared: Shared,
    expired_at: i64,
    snapshots: Snapshots,
    /// This round's answers: after the flush (acks=1), after the sync (acks=all).
    written: Vec<(Reply, AppendResult)>,
    durable: Vec<(Reply, AppendResult)>,
}

/// Whether the writer goes on after a round.
#[derive(PartialEq, Eq)]
enum Flow {
    Continue,
    Stop,
}

impl Writer {
    pub(super) fn new(log: LogWriter, setup: Setup, sync_tx: std::sync::mpsc::SyncSender<SyncJob>, producers: producers::Producers, shared: Shared) -> Writer {
        let now = (setup.clock)();
        let snapshots = Snapshots::start(log.storage().clone(), now);
        Writer { log, setup, sync_tx, producers, shared, expired_at: now, snapshots, written: Vec::new(), durable: Vec::new() }
    }

    /// The thread's body: a round per wake-up until shutdown.
    pub(super) fn run(mut self, mut rx: mpsc::Receiver<WriteCmd>) {
        let mut round = Vec::with_capacity(64);
        while let Some(first) = rx.blocking_recv() {
            round.push(first);
            while round.len() < MAX_ROUND {
                match rx.try_recv() {
                    Ok(c) => round.push(c),
                    Err(_) => break,
                }
            }
            let flow = match catch_unwind(AssertUnwindSafe(|| self.round(&mut round))) {
                Ok(flow) => flow,
                Err(panic) => self.panicked(&*panic, &mut round),
            };
            if flow == Flow::Stop || rx.is_closed() {
                // Appends queued after the shutdown command are refused.
                rx.close();
                while let Ok(cmd) = rx.try_recv() {
                    refuse(cmd, "the broker is shutting down");
                }
                break;
            }
        }
    }

    /// A round panicked: storage is poisoned, and whatever the round had not
    /// answered is refused (a shutdown in it still completes).
    fn panicked(&mut self, panic: &(dyn std::any::Any + Send), round: &mut Vec<WriteCmd>) -> Flow {
        let why = format!("the writer thread panicked: {}", panic_message(panic));
        let e = self.log.storage().poison_with(why.clone());
        tracing::error!(error = %e, "write path stopped");
        for (reply, _) in self.written.drain(..).chain(self.durable.drain(..)) {
            let _ = reply.send(Err(AppendFailure::Storage(why.clone())));
        }
        let mut flow = Flow::Continue;
        for cmd in round.drain(..) {
            if let WriteCmd::Shutdown(done) = cmd {
                let _ = self.sync_tx.send(SyncJob { moved: Flushed::default(), replies: Vec::new(), done: Some(done) });
                flow = Flow::Stop;
            } else {
                refuse(cmd, &why);
            }
        }
        flow
    }

    fn round(&mut self, round: &mut Vec<WriteCmd>) -> Flow {
        let now = (self.setup.clock)();
        let mut shutdown = None;
        // Taken one at a time from the end, so that after a panic the
        // commands not yet handled are still in `round`, to be answered.
        round.reverse();
        while let Some(cmd) = round.pop() {
            match cmd {
                WriteCmd::Append(a) => self.append(a, now),
                WriteCmd::Replicate(r) => self.replicate(r, now),
                WriteCmd::Marker { tp, producer_id, epoch, coordinator_epoch, marker, checked, reply } => {
                    if checked && self.producers.epoch_of(&tp, producer_id).is_some_and(|e| e > epoch) {
                        let _ = reply.send(Err(AppendFailure::Refused(Refusal::StaleEpoch)));
                    } else if checked && self.producers.coordinator_epoch_of(&tp, producer_id).is_some_and(|c| c > coordinator_epoch) {
                        let _ = reply.send(Err(AppendFailure::Refused(Refusal::CoordinatorFenced)));
                    } else {
                        self.marker(tp, producer_id, epoch, coordinator_epoch, marker, reply, now);
                    }
                }
                WriteCmd::CloseTxn { producer_id, tps, reply } => self.close_txn(producer_id, &tps, reply),
                WriteCmd::Switch { switch, reply } => {
                    let _ = reply.send(self.log.apply(switch));
                }
                WriteCmd::BeginEpoch { tps, epoch, reply } => {
                    let _ = reply.send(tps.into_iter().try_for_each(|tp| self.log.begin_epoch(tp, epoch)));
                }
                WriteCmd::Truncate { tp, end, reply } => {
                    let _ = reply.send(self.truncate(tp, end, now));
                }
                WriteCmd::DescribeProducers { tps, reply } => {
                    let _ = reply.send(self.producers.describe(&tps, &self.shared.txns.read().expect("txns lock")));
                }
                WriteCmd::Shutdown(done) => shutdown = Some(done),
                #[cfg(test)]
                WriteCmd::Panic => panic!("a planted panic"),
            }
        }
        self.expire(now);
        let moved = self.flush();
        let stopping = shutdown.is_some();
        if stopping {
            self.snapshots.last(&self.producers, &self.shared.txns, self.log.storage());
        } else {
            self.snapshots.maybe(now, &self.producers, &self.shared.txns, self.log.storage());
        }
        self.answer(moved, shutdown);
        if stopping {
            Flow::Stop
        } else {
            Flow::Continue
        }
    }

    /// One produce partition: each batch through the producer check, then
    /// into the log. Its answer waits for the flush (or the sync).
    fn append(&mut self, a: Append, now: i64) {
        let Append { tp, records, log_append_time, ack, traffic, reply } = a;
        let mut result: Option<AppendResult> = None;
        for (b, checked) in records.batches() {
            let ids = checked.ids;
            match admit(&self.producers, &self.shared.txns, tp, ids, checked.transactional) {
                producers::Check::Append => {}
                producers::Check::Duplicate { base_offset, last_offset } => {
                    self.shared.stats.duplicates.fetch_add(1, Ordering::Relaxed);
                    tracing::debug!(producer_id = ids.producer_id, sequence = ids.base_sequence, base_offset, "retried batch answered with its first offsets");
                    let log_start = self.log.storage().offsets(&tp).map_or(-1, |o| o.0);
                    let r = result.get_or_insert(AppendResult { base_offset, last_offset, log_append_time: -1, log_start });
                    r.last_offset = last_offset;
                    continue;
                }
                producers::Check::Refuse(why) => {
                    self.shared.stats.refused.fetch_add(1, Ordering::Relaxed);
                    tracing::debug!(producer_id = ids.producer_id, epoch = ids.epoch, sequence = ids.base_sequence, ?why, "producer batch refused");
                    let _ = reply.send(Err(AppendFailure::Refused(why)));
                    return;
                }
            }
            let a = match self.log.append(tp, b, now, log_append_time) {
                Ok(a) => a,
                Err(e) => {
                    let _ = reply.send(Err(storage_failure(e)));
                    return;
                }
            };
            self.snapshots.appended += b.len() as u64;
            traffic.appended(checked.records.max(0) as u64, b.len() as u64);
            let r = result.get_or_insert(AppendResult { base_offset: a.base_offset, last_offset: a.last_offset, log_append_time: if log_append_time { now } else { -1 }, log_start: a.log_start });
            r.last_offset = a.last_offset;
            if ids.producer_id >= 0 {
                self.producers.record(tp, ids, a.base_offset, a.last_offset, now);
                self.snapshots.dirty = true;
                if checked.transactional {
                    self.shared.any_txns.store(true, Ordering::Release);
                    self.shared.txns.write().expect("txns lock").on_batch(tp, ids.producer_id, ids.epoch, a.base_offset);
                }
            }
        }
        // Validation let no empty batch list through.
        let Some(r) = result else { return };
        self.hold(ack, reply, r);
    }

    /// A follower's copy: each batch at its leader's offsets and with its
    /// leader's bytes; producer and transaction state follow it as at
    /// replay, so this replica can lead at once. No producer check: the
    /// leader made it. The engine checked the batches' order, so a copy
    /// starting below the log end is refused at its first batch, before
    /// anything is staged; a storage failure later stops the copy there
    /// (what came before it stays, as the log end says).
    fn replicate(&mut self, r: Replicate, now: i64) {
        let Replicate { tp, records, ack, reply } = r;
        let mut result: Option<AppendResult> = None;
        for b in batch::split(&records) {
            // The engine checked every batch before queueing them.
            let Ok(b) = b else { break };
            let Ok(h) = batch::BatchHeader::parse(b) else { break };
            let a = match self.log.append_at(tp, b, now) {
                Ok(a) => a,
                Err(e) => {
                    let _ = reply.send(Err(storage_failure(e)));
                    return;
                }
            };
            self.snapshots.appended += b.len() as u64;
            let r = result.get_or_insert(AppendResult { base_offset: a.base_offset, last_offset: a.last_offset, log_append_time: -1, log_start: a.log_start });
            r.last_offset = a.last_offset;
            if h.producer_id >= 0 {
                if h.is_transactional() || h.is_control() {
                    self.shared.any_txns.store(true, Ordering::Release);
                }
                let mut txns = self.shared.txns.write().expect("txns lock");
                self.producers.apply(&mut txns, tp, b, &h, now);
                self.snapshots.dirty = true;
            }
        }
        let Some(r) = result else {
            let _ = reply.send(Err(AppendFailure::Storage("no batch to replicate".into())));
            return;
        };
        self.hold(ack, reply, r);
    }

    /// A follower's divergent tail of `tp` cut at `end`. What the round
    /// staged so far is written and answered first (storage cuts only a
    /// tp with nothing staged). The tp's producer and transaction state
    /// are rebuilt from what is left of its log, so a retry of a cut batch
    /// is appended again rather than answered as a duplicate.
    fn truncate(&mut self, tp: Tp, end: i64, now: i64) -> Result<i64, StorageError> {
        let moved = self.flush();
        self.answer(moved, None);
        let before = self.log.next_offset(&tp);
        let at = self.log.truncate(tp, end, now)?;
        if Some(at) == before {
            // Nothing cut (at most an unwritten epoch): the state stands.
            return Ok(at);
        }
        let mut txns = self.shared.txns.write().expect("txns lock");
        self.producers.forget_tp(&tp);
        txns.forget_tp(&tp);
        if let Err(e) = self.producers.replay(&mut txns, self.log.storage(), tp, 0, now) {
            tracing::error!(?tp, error = %e, "rebuilding producer state after a truncation failed");
        }
        drop(txns);
        // The snapshot on disk may cover offsets the cut took, which new
        // batches fill again: a restore from it would take the cut
        // batches' producer state for theirs, and skip them (a retry of a
        // cut batch answered with another batch's offsets: the
        // simulator's "a cut left the producer snapshot behind"). It is
        // replaced before anything more is appended; if it cannot be,
        // nothing more is (a restart then finds the log shorter than the
        // old snapshot covered, and rebuilds the tp from its log).
        if let Err(e) = self.snapshots.replace_now(&self.producers, &self.shared.txns, self.log.storage(), now) {
            return Err(self.log.storage().poison_with(format!("replacing the producer snapshot after a truncation: {e}")));
        }
        Ok(at)
    }

    /// Keeps an append's answer until the flush (acks=1) or the sync
    /// (acks=all) makes it true.
    fn hold(&mut self, ack: Ack, reply: Reply, r: AppendResult) {
        match ack {
            Ack::Written => self.written.push((reply, r)),
            Ack::Durable => self.durable.push((reply, r)),
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn marker(&mut self, tp: Tp, producer_id: i64, epoch: i16, coordinator_epoch: i32, marker: Marker, reply: Reply, now: i64) {
        let b = batch::control_batch(marker, producer_id, epoch, coordinator_epoch, now);
        match self.log.append(tp, &b, now, false) {
            Ok(a) => {
                self.snapshots.appended += b.len() as u64;
                self.producers.fence(tp, producer_id, epoch, coordinator_epoch, now);
                self.snapshots.dirty = true;
                self.shared.any_txns.store(true, Ordering::Release);
                self.shared.txns.write().expect("txns lock").on_marker(tp, producer_id, marker, a.base_offset);
                self.durable.push((reply, AppendResult { base_offset: a.base_offset, last_offset: a.last_offset, log_append_time: -1, log_start: a.log_start }));
            }
            // Deleted meanwhile (its state went with it), or storage failed.
            Err(e) => {
                let _ = reply.send(Err(storage_failure(e)));
            }
        }
    }

    fn close_txn(&mut self, producer_id: i64, tps: &[Tp], reply: oneshot::Sender<Vec<i64>>) {
        let mut t = self.shared.txns.write().expect("txns lock");
        let ends = tps
            .iter()
            .map(|tp| {
                t.close_partition(producer_id, tp);
                // Not the published end: this round's appends are not
                // flushed yet.
                self.log.next_offset(tp).unwrap_or(-1)
            })
            .collect();
        drop(t);
        let _ = reply.send(ends);
    }

    fn expire(&mut self, now: i64) {
        if now - self.expired_at >= 60_000 {
            let txns = self.shared.txns.read().expect("txns lock");
            self.snapshots.dirty |= self.producers.expire(now, self.setup.producer_expiry_ms, |tp, pid| txns.open_start(tp, pid).is_some()) > 0;
            self.expired_at = now;
        }
    }

    /// Writes the round; a failure refuses every answer the round holds.
    fn flush(&mut self) -> Flushed {
        match self.log.flush() {
            Ok(m) => m,
            Err(e) => {
                let msg = e.to_string();
                for (reply, _) in self.written.drain(..).chain(self.durable.drain(..)) {
                    let _ = reply.send(Err(AppendFailure::Storage(msg.clone())));
                }
                Flushed::default()
            }
        }
    }

    /// Answers the round: acks=1 now, acks=all after the syncer's fsync
    /// (with the `always` policy; otherwise everything now).
    fn answer(&mut self, moved: Flushed, shutdown: Option<oneshot::Sender<()>>) {
        let written = std::mem::take(&mut self.written);
        let durable = std::mem::take(&mut self.durable);
        // Followers read to the log end: what this round wrote is theirs
        // now, while the fsync runs (the leader's durable end still caps
        // the hw).
        self.setup.replica_waiters.wake(&moved.moved);
        match self.setup.policy {
            FlushPolicy::Always => {
                for (reply, r) in written {
                    let _ = reply.send(Ok(r));
                }
                let job = SyncJob { moved, replies: durable, done: shutdown };
                if job.done.is_some() || !job.moved.moved.is_empty() || !job.replies.is_empty() {
                    let _ = self.sync_tx.send(job);
                }
            }
            FlushPolicy::Interval(_) | FlushPolicy::Never => {
                self.log.storage().publish_hw(&moved);
                self.setup.waiters.wake(&moved.moved);
                for (reply, r) in written.into_iter().chain(durable) {
                    let _ = reply.send(Ok(r));
                }
                if let Some(done) = shutdown {
                    let _ = self.sync_tx.send(SyncJob { moved: Default::default(), replies: Vec::new(), done: Some(done) });
                }
            }
        }
    }
}

/// The writer's decision about one batch: the idempotent-producer check,
/// then, for a new transactional batch, whether its transaction added the
/// partition (checked here, where markers are written, so no marker can
/// slip in between). An `Append` is followed by the append and
/// [`producers::Producers::record`]. The simulator decides with it too.
pub(crate) fn admit(producers: &producers::Producers, txns: &RwLock<txns::Txns>, tp: Tp, ids: producers::BatchIds, transactional: bool) -> producers::Check {
    let check = producers.check(tp, ids);
    if check == producers::Check::Append && transactional && !txns.read().expect("txns lock").admits(ids.producer_id, ids.epoch, &tp) {
        return producers::Check::Refuse(Refusal::NotInTransaction);
    }
    check
}

fn storage_failure(e: StorageError) -> AppendFailure {
    match e {
        StorageError::UnknownPartition => AppendFailure::UnknownPartition,
        StorageError::Misplaced(why) => AppendFailure::Misplaced(why),
        e => AppendFailure::Storage(e.to_string()),
    }
}

/// Answers a command that will not run.
fn refuse(cmd: WriteCmd, why: &str) {
    match cmd {
        WriteCmd::Append(Append { reply, .. }) | WriteCmd::Replicate(Replicate { reply, .. }) | WriteCmd::Marker { reply, .. } => {
            let _ = reply.send(Err(AppendFailure::Storage(why.to_owned())));
        }
        WriteCmd::Switch { reply, .. } | WriteCmd::BeginEpoch { reply, .. } => {
            let _ = reply.send(Err(StorageError::Poisoned(why.to_owned())));
        }
        WriteCmd::Truncate { reply, .. } => {
            let _ = reply.send(Err(StorageError::Poisoned(why.to_owned())));
        }
        // Dropping the reply tells the caller the writer is gone.
        WriteCmd::CloseTxn { .. } | WriteCmd::DescribeProducers { .. } => {}
        WriteCmd::Shutdown(done) => {
            let _ = done.send(());
        }
        #[cfg(test)]
        WriteCmd::Panic => {}
    }
}

fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    panic.downcast_ref::<&str>().map(|s| s.to_string()).or_else(|| panic.downcast_ref::<String>().cloned()).unwrap_or_else(|| "(no message)".into())
}

/// Periodic producer snapshots, written by their own thread from a copy,
/// so the JSON and the fsync do not hold up appends; one at a time (a
/// snapshot due while one is being written waits for the next turn).
struct Snapshots {
    tx: Option<std::sync::mpsc::SyncSender<Snap>>,
    thread: Option<std::thread::JoinHandle<()>>,
    at: i64,
    /// Producer state changed since the last snapshot.
    dirty: bool,
    /// Bytes appended since the last snapshot.
    appended: u64,
    /// Tps the last snapshot walked (every tp storage holds).
    covered: u64,
    /// The thread is writing one: none is built meanwhile (building one
    /// walks every tp on the writer thread).
    busy: Arc<AtomicBool>,
}

type Snap = (producers::Producers, Vec<(Tp, txns::TpTxns)>, Vec<(Tp, i64)>);

impl Snapshots {
    fn start(storage: Arc<Storage>, now: i64) -> Snapshots {
        let (tx, rx) = std::sync::mpsc::sync_channel::<Snap>(1);
        let busy = Arc::new(AtomicBool::new(false));
        let thread = {
            let busy = busy.clone();
            std::thread::Builder::new()
                .name("canopy-producer-snapshot".into())
                .spawn(move || {
                    for (state, txns, covered) in rx {
                        match catch_unwind(AssertUnwindSafe(|| super::restore::write_snapshot(&storage, &state.encode_snapshot(&txns, &covered)))) {
                            Ok(()) => {}
                            Err(p) => tracing::error!(panic = %panic_message(&*p), "writing the producer snapshot panicked"),
                        }
                        busy.store(false, Ordering::Release);
                    }
                })
                .expect("spawn the producer snapshot thread")
        };
        Snapshots { tx: Some(tx), thread: Some(thread), at: now, dirty: false, appended: 0, covered: 0, busy }
    }

    /// After the flush, so every batch the snapshot remembers is in the
    /// files.
    fn maybe(&mut self, now: i64, producers: &producers::Producers, txns: &RwLock<txns::Txns>, storage: &Storage) {
        let moved_on = self.dirty || self.appended > 0;
        let every_bytes = PRODUCER_SNAPSHOT_EVERY_BYTES.max(self.covered.saturating_mul(PRODUCER_SNAPSHOT_BYTES_PER_TP));
        if !(moved_on && (now - self.at >= PRODUCER_SNAPSHOT_EVERY_MS || self.appended >= every_bytes)) {
            return;
        }
        let Some(tx) = &self.tx else { return };
        if self.busy.load(Ordering::Acquire) {
            return;
        }
        let t = txns.read().expect("txns lock").to_snapshot();
        let (ends, walked) = super::covered_ends(producers, storage);
        let covered = walked as u64;
        self.busy.store(true, Ordering::Release);
        if tx.try_send((producers.clone(), t, ends)).is_ok() {
            self.at = now;
            self.dirty = false;
            self.appended = 0;
            self.covered = covered;
        } else {
            self.busy.store(false, Ordering::Release);
        }
    }

    /// Now, on the writer thread, after any snapshot the thread is
    /// writing (an older one must not land after it): a truncation's.
    fn replace_now(&mut self, producers: &producers::Producers, txns: &RwLock<txns::Txns>, storage: &Storage, now: i64) -> Result<(), StorageError> {
        while self.busy.load(Ordering::Acquire) {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        super::replace_producer_snapshot(producers, &txns.read().expect("txns lock"), storage)?;
        self.at = now;
        self.dirty = false;
        self.appended = 0;
        Ok(())
    }

    /// At shutdown, always, so a clean restart replays nothing; written here
    /// once the thread has finished any earlier one (so an older snapshot
    /// cannot land after it).
    fn last(&mut self, producers: &producers::Producers, txns: &RwLock<txns::Txns>, storage: &Storage) {
        drop(self.tx.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        super::snapshot_producers(producers, &txns.read().expect("txns lock"), storage);
    }
}

/// The syncer thread's body: syncs after the writer's rounds (or on the
/// interval), then publishes and answers acks=all.
pub(super) fn syncer_loop(rx: std::sync::mpsc::Receiver<SyncJob>, storage: Arc<Storage>, waiters: Arc<Waiters>, policy: FlushPolicy, probe: probe::EngineProbe) {
    let interval = match policy {
        FlushPolicy::Interval(d) => Some(d),
        _ => None,
    };
    loop {
        let first = match interval {
            Some(d) => match rx.recv_timeout(d) {
                Ok(job) => Some(job),
                Err(std::sync::mpsc::RecvTimeoutError::Timeout) => None,
                Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => return,
            },
            None => match rx.recv() {
                Ok(job) => Some(job),
                Err(_) => return,
            },
        };
        let mut jobs: Vec<SyncJob> = first.into_iter().collect();
        while let Ok(j) = rx.try_recv() {
            jobs.push(j);
        }
        let needs_sync = interval.is_some() || policy == FlushPolicy::Always || jobs.iter().any(|j| j.done.is_some());
        let synced = if needs_sync {
            let started = std::time::Instant::now();
            let r = match catch_unwind(AssertUnwindSafe(|| storage.sync())) {
                Ok(r) => r.map_err(|e| e.to_string()),
                Err(panic) => Err(storage.poison_with(format!("the syncer thread panicked: {}", panic_message(&*panic))).to_string()),
            };
            if let Ok(bytes) = &r {
                probe.synced(started.elapsed().as_secs_f64(), *bytes);
            }
            r.map(drop)
        } else {
            Ok(())
        };
        let mut stop = false;
        for job in jobs {
            match &synced {
                Ok(()) => {
                    if policy == FlushPolicy::Always {
                        storage.publish_hw(&job.moved);
                        waiters.wake(&job.moved.moved);
                    }
                    for (reply, r) in job.replies {
                        let _ = reply.send(Ok(r));
                    }
                }
                Err(e) => {
                    tracing::error!(error = %e, "fsync failed; durable appends are refused from now on");
                    for (reply, _) in job.replies {
                        let _ = reply.send(Err(AppendFailure::Storage(e.clone())));
                    }
                }
            }
            if let Some(done) = job.done {
                let _ = done.send(());
                stop = true;
            }
        }
        if stop {
            return;
        }
    }
}
