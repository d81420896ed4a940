//! What cluster mode's replication asks of the engine (docs/cluster.md,
//! "Replication protocol"): leader epochs begun when this node takes a
//! unit's leadership, a follower's divergent tail cut, reads for
//! followers up to the log end, and the high watermark replication
//! decides. Appending a leader's copy is [`Engine::replicate`].

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{oneshot, Notify};

use super::writer::WriteCmd;
use super::{Engine, EngineError};
use crate::storage::{ReadResult, Tp};

impl Engine {
    /// This node leads `tps` (every tp of a unit) in leader `epoch` from
    /// their next offsets: later appends are stamped with it, and
    /// OffsetForLeaderEpoch answers from it. The same epoch again changes
    /// nothing; a stale one is refused (`StorageError::StaleEpoch`).
    pub async fn begin_epoch(&self, tps: Vec<Tp>, epoch: i32) -> Result<(), EngineError> {
        let (reply, rx) = oneshot::channel();
        self.writer.send(WriteCmd::BeginEpoch { tps, epoch, reply }).await.map_err(|_| EngineError::ShuttingDown)?;
        Ok(rx.await.map_err(|_| EngineError::ShuttingDown)??)
    }

    /// Cuts `tp` back to `end` (a follower's divergent tail; see
    /// `LogWriter::truncate`) and answers the new log end. Refused while
    /// compaction or retention runs (`StorageError::Busy`: retry).
    pub async fn truncate(&self, tp: Tp, end: i64) -> Result<i64, EngineError> {
        let (reply, rx) = oneshot::channel();
        self.writer.send(WriteCmd::Truncate { tp, end, reply }).await.map_err(|_| EngineError::ShuttingDown)?;
        Ok(rx.await.map_err(|_| EngineError::ShuttingDown)??)
    }

    /// Reads `tp` for a follower: from `offset` up to the log end. Does
    /// file I/O.
    pub fn read_for_replica(&self, tp: &Tp, offset: i64, max_bytes: usize, min_one: bool) -> Result<ReadResult, EngineError> {
        Ok(self.storage.read_for_replica(tp, offset, max_bytes, min_one)?)
    }

    /// Caps `tp`'s high watermark at `limit` (what every in-sync replica
    /// has, or a follower's leader's hw) and wakes the fetches waiting on
    /// it when it moved. `i64::MAX` lifts the cap.
    pub fn limit_hw(&self, tp: &Tp, limit: i64) {
        if let Some(hw) = self.storage.limit_hw(tp, limit) {
            self.waiters.wake(&[(*tp, hw)]);
        }
    }

    /// Writes the high watermarks of the tps replication touches, if any
    /// moved (`storage::log::hws`): a restart exposes no more than they
    /// say until replication raises them. Blocking (an fsync); the
    /// replication task runs it every few seconds and at a clean stop.
    pub fn checkpoint_hws(&self) -> Result<bool, EngineError> {
        Ok(self.storage.checkpoint_hws()?)
    }

    /// Registers a follower's fetch for `tps`: woken when a flush writes
    /// any of them (before it is durable). Unregistered when dropped.
    pub fn subscribe_replica(&self, tps: Vec<Tp>, notify: &std::sync::Arc<tokio::sync::Notify>) -> super::Registration {
        self.replica_waiters.register(tps, false, notify)
    }

    /// Waits until `tp`'s high watermark reaches `end` (an acks=all answer
    /// in cluster mode: every in-sync replica has the batch), at most
    /// until `deadline`; `go_on` is asked at every wake and every 100 ms,
    /// and false ends the wait (this node no longer leads, say).
    pub async fn wait_hw(&self, tp: Tp, end: i64, deadline: tokio::time::Instant, go_on: impl Fn() -> bool) -> HwWait {
        let notify = Arc::new(Notify::new());
        let _registration = self.subscribe(vec![tp], false, &notify);
        loop {
            if self.offsets(&tp).is_some_and(|o| o.1 >= end) {
                return HwWait::Reached;
            }
            if !go_on() {
                return HwWait::Stopped;
            }
            if tokio::time::Instant::now() >= deadline {
                return HwWait::TimedOut;
            }
            tokio::select! {
                _ = notify.notified() => {}
                _ = tokio::time::sleep(Duration::from_millis(100)) => {}
                _ = tokio::time::sleep_until(deadline) => {}
            }
        }
    }

    /// What is durable of `tp` here: a leader's own share of its high
    /// watermark.
    pub fn durable_end(&self, tp: &Tp) -> Option<i64> {
        self.storage.durable_end(tp)
    }

    /// Where leader `epoch` ends in `tp`'s log: (the largest epoch at or
    /// below it, the start of the next epoch or the log end).
    pub fn end_offset_for(&self, tp: &Tp, epoch: i32) -> Option<(i32, i64)> {
        self.storage.end_offset_for(tp, epoch)
    }

    /// [`Engine::end_offset_for`] where `tp`'s log keeps leader epochs
    /// (cluster mode); None where it keeps none (single-node mode).
    pub fn epoch_end(&self, tp: &Tp, epoch: i32) -> Option<(i32, i64)> {
        self.storage.epoch_end(tp, epoch)
    }

    /// The latest leader epoch `tp`'s log holds (-1: none), a follower's
    /// `LastFetchedEpoch`.
    pub fn latest_epoch(&self, tp: &Tp) -> i32 {
        self.storage.epochs(tp).and_then(|e| e.last().map(|e| e.epoch)).unwrap_or(-1)
    }
}

/// How [`Engine::wait_hw`] ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HwWait {
    Reached,
    /// `go_on` said to stop.
    Stopped,
    TimedOut,
}
