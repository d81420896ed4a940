//! Coordinator shards on replicated logs (cluster mode; docs/cluster.md,
//! "Replicated state"). Shard `s` of the group coordinators is partition
//! `s` of the internal topic `__canopy.coordinators`, replicated like any
//! other partition, and its leader is the shard's coordinator.
//!
//! - **Writes.** A change to committed offsets (pending ones of open
//!   transactions too), a group's membership or a
//!   transactional id's state is appended to the shard's
//!   partition (`coordinator::journal`'s records) and acknowledged once
//!   the in-sync replicas have it, with Kafka's acks=all rules, in the
//!   leader epoch the shard was loaded in; only then does the coordinator
//!   apply it to its catalog and answer. Errors are answered as Kafka's
//!   group coordinator maps them (NOT_COORDINATOR when leadership moved,
//!   COORDINATOR_NOT_AVAILABLE when the ISR is short or the wait ends).
//! - **Loads.** When this node begins leading a shard, it waits until the
//!   shard's high watermark reaches its log end (everything its log holds
//!   is then on every in-sync replica: no offset it loads can be lost by
//!   a later failover), reads the log from its start, and makes the
//!   catalog's rows for the shard's groups what the log says. Until then
//!   the shard's groups are answered NOT_COORDINATOR (`Broker::coordinates`)
//!   and clients look for their coordinator again.
//!   Its transactional ids are taken up from their last records
//!   (`coordinator::transactions`).
//! - **Moves.** A shard this node stops leading is dropped from memory:
//!   its groups' parked joins and syncs are answered NOT_COORDINATOR, its
//!   transactional ids are forgotten.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use kafka_protocol::ResponseError as E;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::cluster::topics::{COORDINATOR_SHARDS, COORDINATOR_TOPIC};
use crate::engine::{Ack, Topic};
use crate::kafka::coordinator::journal::{self, Journal, Record, Shard};
use crate::kafka::Broker;

/// How long a change waits for the shard's in-sync replicas (Kafka's
/// `offsets.commit.timeout.ms`).
const COMMIT_TIMEOUT: Duration = Duration::from_secs(5);

/// How often shard leadership is looked at besides view changes (a load
/// waiting for its high watermark).
const TICK: Duration = Duration::from_millis(100);

/// Bytes read from a shard's log per step of a load.
const LOAD_STEP_BYTES: usize = 1 << 20;

/// The coordinator shards this node leads and has loaded.
pub struct ShardLogs {
    broker: Weak<Broker>,
    /// Shard -> the leader epoch it was loaded in.
    loaded: Mutex<HashMap<u32, i32>>,
    /// Shards loaded here and not unloaded since (a reload that waits or
    /// fails leaves `loaded` without them, but their groups and offsets
    /// are still here until unloaded).
    held: Mutex<std::collections::HashSet<u32>>,
    /// Shard -> when a load that failed may be tried again.
    retry_at: Mutex<HashMap<u32, tokio::time::Instant>>,
}

/// How long a shard whose load failed waits before the next try (a load
/// reads the whole log).
const RETRY_AFTER_FAILED_LOAD: Duration = Duration::from_secs(5);

impl ShardLogs {
    /// Gives the coordinator its journal, and runs loads and unloads until
    /// `stop`.
    pub fn start(broker: Arc<Broker>, mut stop: watch::Receiver<bool>) -> JoinHandle<()> {
        let logs = Arc::new(ShardLogs { broker: Arc::downgrade(&broker), loaded: Mutex::default(), held: Mutex::default(), retry_at: Mutex::default() });
        broker.coordinator.set_journal(logs.clone());
        tokio::spawn(async move {
            let mut rounds = super::Rounds::new(&broker, TICK);
            while rounds.next(&mut stop).await {
                logs.reconcile(&broker).await;
            }
        })
    }

    fn loaded(&self, shard: u32) -> Option<i32> {
        self.loaded.lock().expect("shard logs lock").get(&shard).copied()
    }

    /// Loads the shards this node now leads, drops those it no longer does.
    async fn reconcile(&self, broker: &Arc<Broker>) {
        let Some(topic) = broker.engine.topic(COORDINATOR_TOPIC) else { return };
        let view = broker.cluster.view();
        for shard in 0..COORDINATOR_SHARDS.min(topic.partitions() as u32) {
            let lead = broker.lead(&view, COORDINATOR_TOPIC, shard as i32).ok();
            let loaded = self.loaded(shard);
            match (lead, loaded) {
                (Some(epoch), Some(at)) if epoch == at => {}
                (Some(epoch), _) => {
                    self.loaded.lock().expect("shard logs lock").remove(&shard);
                    if self.retry_at.lock().expect("shard logs lock").get(&shard).is_some_and(|at| *at > tokio::time::Instant::now()) {
                        continue;
                    }
                    match self.load(broker, &topic, shard, epoch).await {
                        Ok(Some((groups, txns))) => {
                            self.retry_at.lock().expect("shard logs lock").remove(&shard);
                            self.loaded.lock().expect("shard logs lock").insert(shard, epoch);
                            self.held.lock().expect("shard logs lock").insert(shard);
                            tracing::info!(shard, epoch, groups, transactional_ids = txns, "coordinator shard loaded");
                        }
                        Ok(None) => {}
                        Err(e) => {
                            self.retry_at.lock().expect("shard logs lock").insert(shard, tokio::time::Instant::now() + RETRY_AFTER_FAILED_LOAD);
                            tracing::error!(shard, epoch, error = %e, "loading a coordinator shard failed; trying again in {RETRY_AFTER_FAILED_LOAD:?}");
                        }
                    }
                }
                (None, loaded) => {
                    let held = self.held.lock().expect("shard logs lock").remove(&shard);
                    if loaded.is_some() || held {
                        self.loaded.lock().expect("shard logs lock").remove(&shard);
                        broker.coordinator.unload_shard(shard).await;
                        broker.transactions.unload_shard(shard).await;
                        tracing::info!(shard, "coordinator shard moved away");
                    }
                }
            }
        }
    }

    /// Loads `shard` in leader `epoch`: `Ok(None)` while its high
    /// watermark is below its log end (or leadership moved meanwhile),
    /// else the number of groups with committed offsets or a stored state,
    /// and of transactional ids. The groups are loaded first, so that a
    /// prepared transaction's offsets find their group's shard loaded when
    /// it is the same one.
    async fn load(&self, broker: &Arc<Broker>, topic: &Arc<Topic>, shard: u32, epoch: i32) -> Result<Option<(usize, usize)>, String> {
        let tp = topic.tp(shard as i32);
        let read = async {
            let Some((start, hw, end)) = broker.engine.offsets(&tp) else { return Ok(None) };
            if hw < end {
                return Ok(None);
            }
            let engine = broker.engine.clone();
            let max = engine.config().max_inflated_batch_bytes;
            let rows = tokio::task::spawn_blocking(move || -> Result<Shard, String> {
                let mut rows = Shard::default();
                let mut at = start;
                while at < end {
                    let r = engine.read(&tp, at, LOAD_STEP_BYTES, true).map_err(|e| e.to_string())?;
                    if r.next_offset <= at {
                        return Err(format!("the log gave nothing at offset {at} (log end {end})"));
                    }
                    for b in &r.records {
                        journal::replay(&mut rows, b, max)?;
                    }
                    at = r.next_offset;
                }
                Ok(rows)
            })
            .await
            .map_err(|e| e.to_string())??;
            Ok((broker.lead(&broker.cluster.view(), COORDINATOR_TOPIC, shard as i32) == Ok(epoch)).then_some(rows))
        };
        let Some((groups, txns)) = broker.coordinator.load_shard(shard, read).await? else { return Ok(None) };
        Ok(Some((groups, broker.transactions.load_shard(shard, txns).await)))
    }
}

/// Kafka's group coordinator's answer for an offset append that failed
/// with `code` (GroupMetadataManager's mapping).
fn commit_error(code: i16) -> i16 {
    match code {
        c if c == E::UnknownTopicOrPartition.code() || c == E::NotEnoughReplicas.code() || c == E::NotEnoughReplicasAfterAppend.code() || c == E::RequestTimedOut.code() => E::CoordinatorNotAvailable.code(),
        c if c == E::NotLeaderOrFollower.code() || c == E::KafkaStorageError.code() => E::NotCoordinator.code(),
        c if c == E::MessageTooLarge.code() || c == E::RecordListTooLarge.code() => E::InvalidCommitOffsetSize.code(),
        c => c,
    }
}

impl Journal for ShardLogs {
    fn append(&self, shard: u32, records: Vec<Record>) -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<(), i16>> + Send + '_>> {
        Box::pin(async move {
            let broker = self.broker.upgrade().ok_or(E::CoordinatorNotAvailable.code())?;
            let topic = broker.engine.topic(COORDINATOR_TOPIC).ok_or(E::CoordinatorNotAvailable.code())?;
            let view = broker.cluster.view();
            let partition = shard as i32;
            let epoch = broker.lead(&view, COORDINATOR_TOPIC, partition).map_err(|_| E::NotCoordinator.code())?;
            if self.loaded(shard) != Some(epoch) {
                return Err(E::NotCoordinator.code());
            }
            if !super::Replication::enough_replicas(&view, &topic, partition) {
                return Err(commit_error(E::NotEnoughReplicas.code()));
            }
            let batch = journal::encode_batch(&records, broker.engine.now_ms());
            let appended = broker.engine.append(&topic, partition, batch.into(), Ack::Durable).await.map_err(|e| commit_error(crate::kafka::errors::code(&e)))?;
            let deadline = tokio::time::Instant::now() + COMMIT_TIMEOUT;
            let replicated = broker.replication.replicated(&broker, &topic, partition, epoch, appended.last_offset + 1, deadline).await;
            if replicated.is_err() {
                // In the log, maybe for good, but not applied: what the
                // catalog holds for the shard is read again from the log.
                self.reload(shard);
            }
            replicated.map_err(commit_error)
        })
    }

    fn reload(&self, shard: u32) {
        self.loaded.lock().expect("shard logs lock").remove(&shard);
    }

    fn ready(&self, shard: u32) -> bool {
        self.epoch(shard).is_some()
    }

    fn epoch(&self, shard: u32) -> Option<i32> {
        let broker = self.broker.upgrade()?;
        let view = broker.cluster.view();
        broker.lead(&view, COORDINATOR_TOPIC, shard as i32).ok().filter(|epoch| self.loaded(shard) == Some(*epoch))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn append_errors_are_answered_as_kafkas_group_coordinator_does() {
        assert_eq!(commit_error(E::NotEnoughReplicas.code()), E::CoordinatorNotAvailable.code());
        assert_eq!(commit_error(E::NotEnoughReplicasAfterAppend.code()), E::CoordinatorNotAvailable.code());
        assert_eq!(commit_error(E::RequestTimedOut.code()), E::CoordinatorNotAvailable.code());
        assert_eq!(commit_error(E::NotLeaderOrFollower.code()), E::NotCoordinator.code());
        assert_eq!(commit_error(E::KafkaStorageError.code()), E::NotCoordinator.code());
        assert_eq!(commit_error(E::MessageTooLarge.code()), E::InvalidCommitOffsetSize.code());
        assert_eq!(commit_error(E::InvalidRecord.code()), E::InvalidRecord.code());
    }
}
