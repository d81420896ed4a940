//! The timeout pass of the transaction coordinator: transactions open
//! past their timeout are aborted, prepared ones finished, idle ids
//! forgotten (see [`Transactions::expire`]).

use super::*;

/// How many ids one timeout pass works on at once.
pub(super) const EXPIRE_AT_ONCE: usize = 64;
/// Passes in a row that may find an id busy before the timeout pass waits
/// for its lock (tokio's mutex is fair: requests that come after the wait
/// queue behind it).
const BUSY_PASSES: u32 = 5;

impl Transactions {
    /// Aborts transactions open past their timeout, finishes prepared
    /// ones, and forgets ids idle past `transactional.id.expiration.ms`.
    /// Each id due is worked on in a task of its own, up to
    /// [`EXPIRE_AT_ONCE`] at a time, and the pass does not wait for them:
    /// an end whose markers wait holds no other id back, not even for the
    /// next pass. An id busy with a request, or with a task of an earlier
    /// pass, is left for a later one; one found busy [`BUSY_PASSES`]
    /// passes in a row gets a task that waits for its lock, so a client
    /// that keeps its id busy cannot keep its transaction from timing
    /// out. Cluster mode: only ids of shards
    /// this node coordinates in its current leader epoch. An id whose
    /// slot is empty (a first InitProducerId that failed) leaves the map.
    pub async fn expire(&self) {
        let slots: Vec<(String, Slot)> = self.inner.ids.lock().expect("txn ids lock").iter().map(|(k, v)| (k.clone(), v.clone())).collect();
        let single = self.inner.cluster.view().single;
        {
            // Ids gone since they were found busy are not counted on.
            let live: std::collections::HashSet<&str> = slots.iter().map(|(id, _)| id.as_str()).collect();
            self.inner.busy.lock().expect("busy ids lock").retain(|id, _| live.contains(id.as_str()));
        }
        for (id, slot) in slots {
            if !single && !self.inner.groups.ready(&id) {
                continue;
            }
            let Ok(guard) = slot.clone().try_lock_owned() else {
                if self.busy_too_long(&id) {
                    let Ok(permit) = self.inner.expiring.clone().try_acquire_owned() else { return };
                    let t = self.clone();
                    tokio::spawn(async move {
                        let guard = slot.clone().lock_owned().await;
                        // Checked again under the lock: the shard may have
                        // moved, the transaction ended, while this waited.
                        let ready = t.inner.cluster.view().single || t.inner.groups.ready(&id);
                        if ready && guard.as_ref().is_some_and(|rec| t.due(rec)) {
                            t.expire_one(id, slot, guard).await;
                        }
                        drop(permit);
                    });
                }
                continue;
            };
            self.inner.busy.lock().expect("busy ids lock").remove(&id);
            let Some(rec) = guard.as_ref() else {
                let mut ids = self.inner.ids.lock().expect("txn ids lock");
                if ids.get(&id).is_some_and(|s| Arc::ptr_eq(s, &slot)) {
                    ids.remove(&id);
                }
                continue;
            };
            if !self.due(rec) {
                continue;
            }
            let Ok(permit) = self.inner.expiring.clone().try_acquire_owned() else { return };
            let t = self.clone();
            tokio::spawn(async move {
                t.expire_one(id, slot, guard).await;
                drop(permit);
            });
        }
    }

    /// Counts a pass that found `id` busy; true (and the count starts
    /// over) at the [`BUSY_PASSES`]th in a row: the pass waits for it.
    fn busy_too_long(&self, id: &str) -> bool {
        let mut busy = self.inner.busy.lock().expect("busy ids lock");
        let passes = busy.entry(id.to_owned()).or_default();
        *passes += 1;
        let wait = *passes >= BUSY_PASSES;
        if wait {
            busy.remove(id);
        }
        wait
    }

    /// Whether the timeout pass has work on `rec`: an end to finish, a
    /// transaction past its timeout, or an id idle past its expiration.
    fn due(&self, rec: &TxnRecord) -> bool {
        let now = self.now();
        match rec.state {
            TxnState::PrepareCommit | TxnState::PrepareAbort => true,
            TxnState::Ongoing => now - rec.start_ms > rec.timeout_ms as i64,
            TxnState::Empty | TxnState::CompleteCommit | TxnState::CompleteAbort => now - rec.update_ms > self.inner.cfg.id_expiration_ms,
        }
    }

    async fn expire_one(&self, id: String, slot: Slot, mut guard: tokio::sync::OwnedMutexGuard<Option<TxnRecord>>) {
        let Some(rec) = guard.as_mut() else { return };
        match rec.state {
            TxnState::PrepareCommit | TxnState::PrepareAbort => {
                // An end whose markers or offsets failed, or one a moved
                // coordinator left: finish it.
                let marker = if rec.state == TxnState::PrepareCommit { Marker::Commit } else { Marker::Abort };
                if let Err(code) = self.finish(&id, &slot, rec, marker, false).await {
                    tracing::warn!(transactional_id = %id, code, "finishing a prepared transaction failed; will retry");
                }
            }
            TxnState::Ongoing => {
                tracing::info!(transactional_id = %id, producer_id = rec.producer_id, timeout_ms = rec.timeout_ms, "aborting a timed-out transaction");
                if let Err(code) = self.end(&id, &slot, rec, Marker::Abort, true).await {
                    tracing::warn!(transactional_id = %id, code, "aborting a timed-out transaction failed; will retry");
                }
            }
            TxnState::Empty | TxnState::CompleteCommit | TxnState::CompleteAbort => {
                if self.store(&id, &slot, None, false).await.is_ok() {
                    tracing::info!(transactional_id = %id, "transactional id expired");
                    *guard = None;
                    drop(guard);
                    let mut ids = self.inner.ids.lock().expect("txn ids lock");
                    if ids.get(&id).is_some_and(|s| Arc::ptr_eq(s, &slot)) {
                        ids.remove(&id);
                    }
                }
            }
        }
    }
}

pub(super) async fn timeout_loop(t: Transactions, mut stop: watch::Receiver<bool>) {
    let every = t.inner.cfg.check_every;
    let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => t.expire().await,
            _ = stop.changed() => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A client that keeps its id busy cannot keep its transaction open
    /// past its timeout: once the pass has found the id busy
    /// [`BUSY_PASSES`] times in a row, it waits for the id's lock and
    /// aborts the transaction.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_busy_id_is_aborted_once_its_timeout_passes() {
        let dir = tempfile::tempdir().unwrap();
        let clock = crate::engine::system_clock();
        let engine = Engine::open(crate::engine::EngineConfig::new(dir.path()), clock.clone()).unwrap();
        engine.create_topic("t", 1, Default::default(), false).unwrap();
        let (stop_tx, stop) = watch::channel(false);
        let groups = Coordinator::start(engine.clone(), crate::kafka::coordinator::GroupConfig::default(), crate::kafka::coordinator::ConsumerConfig::default(), clock.clone(), stop.clone());
        let me = crate::cluster::NodeRecord { id: 1, rack: None, incarnation: 0, endpoints: vec![] };
        let cluster = Arc::new(crate::cluster::Membership::single("c".into(), me));
        // No timeout loop of its own during the test: the passes below.
        let cfg = TxnConfig { check_every: Duration::from_secs(3600), ..TxnConfig::default() };
        let t = Transactions::start(engine, cluster, groups, cfg, clock, stop).await.unwrap();
        let (pid, epoch) = t.init("busy", 1, -1, -1, 4).await.unwrap();
        assert_eq!(t.add_partitions("busy", pid, epoch, &[("t".into(), 0)], false, 3).await.unwrap(), vec![0]);
        tokio::time::sleep(Duration::from_millis(20)).await;
        let state = || async { t.describe(&["busy".to_string()]).await[0].as_ref().map(|r| r.state) };
        assert_eq!(state().await, Some(TxnState::Ongoing));
        // A request holds the id's lock at every pass.
        let held = t.existing("busy").unwrap().lock_owned().await;
        for _ in 0..BUSY_PASSES {
            t.expire().await;
        }
        drop(held);
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while state().await != Some(TxnState::CompleteAbort) {
            assert!(std::time::Instant::now() < deadline, "the busy id's timed-out transaction was not aborted: {:?}", state().await);
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        drop(stop_tx);
    }
}
