//! The group coordinator: one task owns every group's state machine
//! (`group.rs`); handlers send it commands over a bounded channel and await
//! the answer. Parked JoinGroup/SyncGroup requests are answered when their
//! rebalance completes; the task sleeps until the earliest group deadline
//! (session expiry, join or sync timeout), so timers need no polling.
//!
//! Groups of the next-generation protocol (KIP-848, `consumer.rs`) live in
//! the same task: a group id is a classic group or a consumer group, never
//! both. An empty group of either kind is taken over by the other kind's
//! first member (its committed offsets stay); a non-empty one refuses the
//! other kind (INCONSISTENT_GROUP_PROTOCOL for JoinGroup, GROUP_ID_NOT_FOUND
//! for ConsumerGroupHeartbeat, as Kafka with migration off).
//!
//! Committed offsets live in the sled catalog and belong to the
//! coordinator alone (`offsets.rs`): every change to them goes through its
//! keeper thread, which flushes the catalog once for whatever is queued, so
//! concurrent commits share one flush and each is answered only after it
//! is durable. In cluster mode every change goes to the group's shard log
//! first (`journal.rs`), and to the catalog once the shard's in-sync
//! replicas have it; a shard's new leader loads its groups from that log.
//! A classic group's membership goes there too (each completed rebalance,
//! each time it becomes Empty, a tombstone when it is deleted), through one
//! writer per shard so that the log keeps the order they were asked in; a
//! shard's new leader restores its groups Stable with their members.

pub mod consumer;
pub mod group;
pub mod journal;
pub mod offsets;
pub mod transactions;
mod txn_offsets;

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::{mpsc, oneshot};

use crate::engine::{Clock, Engine};
use crate::meta::OffsetRecord;
use consumer::{ConsumerConfig, ConsumerGroup, HeartbeatArgs, HeartbeatResult};
use group::{Group, GroupConfig, JoinArgs, JoinResult, Reply, State, SyncArgs, SyncResult, Token};

/// What DescribeGroups reports of a member.
#[derive(Debug, Clone)]
pub struct MemberDescription {
    pub member_id: String,
    pub instance_id: Option<String>,
    pub client_id: String,
    pub client_host: String,
    pub metadata: Bytes,
    pub assignment: Bytes,
}

/// What ConsumerGroupDescribe reports of a consumer group member.
#[derive(Debug, Clone)]
pub struct ConsumerMemberDescription {
    pub member_id: String,
    pub instance_id: Option<String>,
    pub rack_id: Option<String>,
    pub member_epoch: i32,
    pub client_id: String,
    pub client_host: String,
    pub subscribed_topic_names: Vec<String>,
    pub subscribed_topic_regex: Option<String>,
    pub assignment: consumer::Assignment,
    pub target_assignment: consumer::Assignment,
}

/// What ConsumerGroupDescribe reports of a group; None: not a consumer
/// group (GROUP_ID_NOT_FOUND).
#[derive(Debug, Clone)]
pub struct ConsumerGroupDescription {
    pub group_id: String,
    pub state: &'static str,
    pub group_epoch: i32,
    pub assignment_epoch: i32,
    pub assignor: &'static str,
    pub members: Vec<ConsumerMemberDescription>,
}

#[derive(Debug, Clone)]
pub struct GroupDescription {
    pub group_id: String,
    /// None: the group does not exist.
    pub state: Option<&'static str>,
    pub protocol_type: String,
    pub protocol: String,
    pub members: Vec<MemberDescription>,
}

enum Cmd {
    Join { group: String, args: JoinArgs, reply: oneshot::Sender<JoinResult> },
    Sync { group: String, args: SyncArgs, reply: oneshot::Sender<SyncResult> },
    Heartbeat { group: String, generation: i32, member_id: String, instance_id: Option<String>, reply: oneshot::Sender<i16> },
    Leave { group: String, members: Vec<(String, Option<String>)>, reply: oneshot::Sender<(i16, Vec<i16>)> },
    /// `transactional`: a TxnOffsetCommit, which Kafka lets through without
    /// member details (generation -1, no member id) whatever the group's
    /// members. `version`: the request's (v9+ OffsetCommit answers
    /// GROUP_ID_NOT_FOUND for a group that does not exist).
    CommitCheck { group: String, commit: CommitIds, transactional: bool, version: i16, reply: oneshot::Sender<Result<(), i16>> },
    /// (id, protocol type, state, group type).
    List { reply: oneshot::Sender<Vec<(String, String, &'static str, &'static str)>> },
    ConsumerHeartbeat { group: String, args: HeartbeatArgs, reply: oneshot::Sender<HeartbeatResult> },
    ConsumerDescribe { groups: Vec<String>, reply: oneshot::Sender<Vec<(String, Option<ConsumerGroupDescription>)>> },
    /// OffsetFetch v9 naming a member: Ok, or the error for the group.
    FetchCheck { group: String, member_id: Option<String>, member_epoch: i32, reply: oneshot::Sender<Result<(), i16>> },
    Describe { groups: Vec<String>, reply: oneshot::Sender<Vec<GroupDescription>> },
    Delete { groups: Vec<String>, reply: oneshot::Sender<Vec<i16>> },
    /// Idle groups (no members, no pending member ids), each with the time
    /// it last had members and its commit count.
    Idle { reply: oneshot::Sender<Vec<IdleGroup>> },
    /// Drops these groups' in-memory state if they are still idle and no
    /// commit came in since they were listed.
    Forget { groups: Vec<(String, u64)>, reply: oneshot::Sender<()> },
    /// Cluster mode: drops every group of coordinator shard `shard` (its
    /// parked requests answered NOT_COORDINATOR), then restores `stored`
    /// as stored and knows the rest of `groups` (as Empty): the shard
    /// moved away from this node, or was loaded.
    Reset { shard: u32, groups: Vec<String>, stored: std::collections::BTreeMap<String, journal::StoredGroup>, reply: oneshot::Sender<()> },
    /// Cluster mode: `group`'s store `seq` is done or failed (the error
    /// whoever waits for it gets).
    Stored { group: String, seq: u64, result: Result<(), i16> },
}

/// A write to a shard's log made by the shard's group writer.
struct GroupWrite {
    record: journal::Record,
    done: WriteDone,
}

enum WriteDone {
    /// A group's state: the coordinator task is told how its store went.
    Stored { group: String, seq: u64 },
    /// A group's tombstone: nobody waits (one that fails leaves a stored
    /// Empty state, which the next cleanup pass forgets again).
    Tombstone,
}

/// Why a change to committed offsets was not made: the error code a
/// client gets, and what to log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoreError {
    pub code: i16,
    pub message: String,
}

impl std::fmt::Display for StoreError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} (error code {})", self.message, self.code)
    }
}

impl StoreError {
    /// The catalog failed (single-node mode, or applying a journaled change).
    fn storage(message: impl Into<String>) -> StoreError {
        StoreError { code: kafka_protocol::ResponseError::KafkaStorageError.code(), message: message.into() }
    }

    /// The shard log refused the change with `code`.
    fn journal(code: i16) -> StoreError {
        StoreError { code, message: format!("the coordinator shard's log refused the change (error code {code})") }
    }
}

/// Who an OffsetCommit or TxnOffsetCommit says it comes from.
#[derive(Debug, Clone)]
pub struct CommitIds {
    pub generation: i32,
    pub member_id: String,
    pub instance_id: Option<String>,
}

/// A group without members or pending member ids, as the cleanup pass
/// sees it.
#[derive(Debug, Clone)]
pub struct IdleGroup {
    pub id: String,
    pub empty_since_ms: i64,
    pub commits: u64,
}

/// Handle to the coordinator task; cheap to clone.
#[derive(Clone)]
pub struct Coordinator {
    tx: mpsc::Sender<Cmd>,
    offsets: mpsc::Sender<offsets::Job>,
    engine: Arc<Engine>,
    /// Cluster mode: where changes go first. Unset in single-node mode.
    journal: Arc<std::sync::OnceLock<Arc<dyn journal::Journal>>>,
    /// Cluster mode, before the journal is set: changes are refused.
    awaiting: Arc<std::sync::atomic::AtomicBool>,
    /// One turn per shard (cluster mode): a change is appended to the
    /// shard's log and applied to the catalog before the next one of that
    /// shard starts, so both see the shard's changes in one order.
    turns: Arc<Vec<tokio::sync::Mutex<()>>>,
    /// Cluster mode: the offsets open transactions commit if they commit,
    /// by shard (what the shard's log holds; replaced at each load).
    pending: Arc<std::sync::Mutex<HashMap<u32, journal::Pending>>>,
    /// Cluster mode: by shard, each producer's newest coordinator epoch of
    /// the markers that reached it (what the shard's log holds).
    fences: Arc<std::sync::Mutex<HashMap<u32, journal::Fences>>>,
    /// Cluster mode: TxnOffsetCommit's verification guards
    /// (`txn_offsets::Guards`).
    guards: Arc<std::sync::Mutex<txn_offsets::Guards>>,
    /// Cluster mode: each shard's group writer, which appends groups'
    /// states and tombstones to the shard's log one at a time, in the
    /// order asked (set with the journal).
    writers: Arc<std::sync::OnceLock<Vec<mpsc::Sender<GroupWrite>>>>,
}

const QUEUE: usize = 1024;

/// Kafka's limit on a group id is the string length itself (i16); we keep
/// group ids to a sane length and refuse longer ones with INVALID_GROUP_ID.
pub const MAX_GROUP_ID_LEN: usize = 255;

impl Coordinator {
    /// Starts the coordinator task and the committer thread. Groups that have
    /// committed offsets are known (as Empty) from the start.
    /// At shutdown (`stop` turns true) the task ends: parked JoinGroup and
    /// SyncGroup requests are released, their connections closed, and the
    /// clients look for a coordinator again.
    pub fn start(engine: Arc<Engine>, cfg: GroupConfig, ccfg: ConsumerConfig, clock: Clock, stop: tokio::sync::watch::Receiver<bool>) -> Coordinator {
        let (tx, rx) = mpsc::channel(QUEUE);
        let (ctx, crx) = mpsc::channel(QUEUE);
        let now = clock();
        let known = engine.catalog().offset_groups().unwrap_or_default();
        let groups = known.into_iter().map(|g| (g.clone(), Group::new(g, now))).collect();
        let state = Groups { classic: groups, consumers: HashMap::new(), cfg, ccfg, engine: engine.clone() };
        let writers: Arc<std::sync::OnceLock<Vec<mpsc::Sender<GroupWrite>>>> = Arc::default();
        tokio::spawn(run(rx, state, clock, stop, writers.clone()));
        {
            let engine = engine.clone();
            std::thread::Builder::new().name("canopy-offsets".into()).spawn(move || offsets::keeper(crx, engine)).expect("spawn the committed-offset keeper thread");
        }
        let turns = (0..crate::cluster::topics::COORDINATOR_SHARDS).map(|_| tokio::sync::Mutex::new(())).collect();
        Coordinator { tx, offsets: ctx, engine, journal: Arc::default(), awaiting: Arc::default(), turns: Arc::new(turns), pending: Arc::default(), fences: Arc::default(), guards: Arc::default(), writers }
    }

    /// Cluster mode, at start: until [`Coordinator::set_journal`], every
    /// change to committed offsets is refused (COORDINATOR_NOT_AVAILABLE)
    /// and no group is answered for.
    pub fn await_journal(&self) {
        self.awaiting.store(true, std::sync::atomic::Ordering::Release);
    }

    /// Cluster mode: every change to committed offsets goes to `journal`
    /// first. Set once, before requests are taken.
    pub fn set_journal(&self, journal: Arc<dyn journal::Journal>) {
        if self.journal.set(journal.clone()).is_err() {
            tracing::error!("the coordinator's journal was set twice; the first one stays");
            return;
        }
        let writers = (0..crate::cluster::topics::COORDINATOR_SHARDS)
            .map(|shard| {
                let (tx, rx) = mpsc::channel(GROUP_WRITES_QUEUED);
                tokio::spawn(group_writer(shard, rx, journal.clone(), self.turns.clone(), self.tx.clone()));
                tx
            })
            .collect();
        let _ = self.writers.set(writers);
    }


    /// Whether the groups of `key`'s shard may be answered for here: always
    /// in single-node mode; in cluster mode once the shard is loaded in
    /// this node's current leader epoch.
    pub fn ready(&self, key: &str) -> bool {
        match self.journal.get() {
            Some(j) => j.ready(journal::shard_of(key)),
            None => !self.awaiting.load(std::sync::atomic::Ordering::Acquire),
        }
    }

    /// Cluster mode: the committed offsets of `shard`'s groups become what
    /// `read` finds in its log (`None`: not now), in the catalog and in
    /// memory; groups held in memory are dropped, those stored are
    /// restored as stored (Stable with their members, or Empty), and the
    /// rest with offsets are known as Empty. The read runs in the shard's
    /// turn, so no change lands in the log between it and the catalog.
    /// Returns how many groups the shard has, and its transactional ids
    /// (the transaction coordinator's to take up).
    pub async fn load_shard(&self, shard: u32, read: impl std::future::Future<Output = Result<Option<journal::Shard>, String>>) -> Result<Option<(usize, journal::Txns)>, String> {
        let _turn = self.turns[shard as usize].lock().await;
        let Some(journal::Shard { offsets: rows, groups: stored, txns, pending, fences }) = read.await? else { return Ok(None) };
        self.pending.lock().expect("pending offsets lock").insert(shard, pending);
        self.fences.lock().expect("fences lock").insert(shard, fences);
        self.void_guards(shard);
        let groups: Vec<String> = rows.keys().map(|(g, _, _)| g.clone()).collect::<std::collections::BTreeSet<_>>().into_iter().collect();
        let count = groups.iter().filter(|g| !stored.contains_key(*g)).count() + stored.len();
        self.apply(offsets::Change::Load { shard, rows }).await.map_err(|e| e.to_string())?;
        self.ask(|reply| Cmd::Reset { shard, groups, stored, reply }).await.ok_or("coordinator stopped")?;
        Ok(Some((count, txns)))
    }

    /// Cluster mode: the shards' journal, once set.
    pub(crate) fn journal(&self) -> Option<Arc<dyn journal::Journal>> {
        self.journal.get().cloned()
    }

    /// `shard`'s turn (cluster mode): changes to its log take turns with
    /// each other and with its loads.
    pub(crate) async fn turn(&self, shard: u32) -> tokio::sync::MutexGuard<'_, ()> {
        self.turns[shard as usize].lock().await
    }

    /// Cluster mode: `shard` moved to another node; its groups are
    /// dropped from memory (their parked requests answered NOT_COORDINATOR)
    /// and their committed offsets from the catalog (a cache of the log
    /// here, which the lag metrics read: the shard's new coordinator
    /// reports them now).
    pub async fn unload_shard(&self, shard: u32) {
        let _turn = self.turns[shard as usize].lock().await;
        self.pending.lock().expect("pending offsets lock").remove(&shard);
        self.fences.lock().expect("fences lock").remove(&shard);
        self.void_guards(shard);
        if let Err(e) = self.apply(offsets::Change::Load { shard, rows: Default::default() }).await {
            tracing::warn!(shard, error = %e, "dropping a moved shard's committed offsets from the catalog failed; its groups' lag metrics may linger until it loads here again");
        }
        self.ask(|reply| Cmd::Reset { shard, groups: Vec::new(), stored: Default::default(), reply }).await;
    }

    async fn ask<T>(&self, make: impl FnOnce(oneshot::Sender<T>) -> Cmd) -> Option<T> {
        let (reply, rx) = oneshot::channel();
        self.tx.send(make(reply)).await.ok()?;
        rx.await.ok()
    }

    pub async fn join(&self, group: String, args: JoinArgs) -> Option<JoinResult> {
        self.ask(|reply| Cmd::Join { group, args, reply }).await
    }

    pub async fn sync(&self, group: String, args: SyncArgs) -> Option<SyncResult> {
        self.ask(|reply| Cmd::Sync { group, args, reply }).await
    }

    pub async fn heartbeat(&self, group: String, generation: i32, member_id: String, instance_id: Option<String>) -> Option<i16> {
        self.ask(|reply| Cmd::Heartbeat { group, generation, member_id, instance_id, reply }).await
    }

    pub async fn leave(&self, group: String, members: Vec<(String, Option<String>)>) -> Option<(i16, Vec<i16>)> {
        self.ask(|reply| Cmd::Leave { group, members, reply }).await
    }

    /// Whether an OffsetCommit of this `version` may commit.
    pub async fn commit_check(&self, group: String, commit: CommitIds, version: i16) -> Option<Result<(), i16>> {
        self.ask(|reply| Cmd::CommitCheck { group, commit, transactional: false, version, reply }).await
    }

    /// [`Coordinator::commit_check`] for a transactional offset commit.
    pub async fn txn_commit_check(&self, group: String, commit: CommitIds) -> Option<Result<(), i16>> {
        self.ask(|reply| Cmd::CommitCheck { group, commit, transactional: true, version: 0, reply }).await
    }

    /// Every group: (id, protocol type, state, group type "classic" or
    /// "consumer").
    pub async fn list(&self) -> Vec<(String, String, &'static str, &'static str)> {
        self.ask(|reply| Cmd::List { reply }).await.unwrap_or_default()
    }

    pub async fn consumer_heartbeat(&self, group: String, args: HeartbeatArgs) -> Option<HeartbeatResult> {
        self.ask(|reply| Cmd::ConsumerHeartbeat { group, args, reply }).await
    }

    pub async fn consumer_describe(&self, groups: Vec<String>) -> Vec<(String, Option<ConsumerGroupDescription>)> {
        self.ask(|reply| Cmd::ConsumerDescribe { groups, reply }).await.unwrap_or_default()
    }

    /// Whether an OffsetFetch naming this member and epoch may read the
    /// group's offsets (consumer groups check them; others pass).
    pub async fn fetch_check(&self, group: String, member_id: Option<String>, member_epoch: i32) -> Option<Result<(), i16>> {
        self.ask(|reply| Cmd::FetchCheck { group, member_id, member_epoch, reply }).await
    }

    pub async fn describe(&self, groups: Vec<String>) -> Vec<GroupDescription> {
        self.ask(|reply| Cmd::Describe { groups, reply }).await.unwrap_or_default()
    }

    /// Deletes empty groups and their committed offsets; per group, 0 or
    /// the error Kafka answers.
    pub async fn delete(&self, groups: Vec<String>) -> Vec<i16> {
        let n = groups.len();
        let mut codes = self.ask(|reply| Cmd::Delete { groups: groups.clone(), reply }).await.unwrap_or_else(|| vec![kafka_protocol::ResponseError::CoordinatorNotAvailable.code(); n]);
        if self.journal.get().is_some() {
            for (i, group) in groups.into_iter().enumerate() {
                if codes.get(i) == Some(&0) {
                    if let Err(e) = self.change(offsets::Change::Remove { group: group.clone(), only: None }).await {
                        codes[i] = e.code;
                        // Its offsets stay: the group is known again (as
                        // Empty), so the deletion can be retried.
                        let _ = self.txn_commit_check(group, CommitIds { generation: -1, member_id: String::new(), instance_id: None }).await;
                    }
                }
            }
            return codes;
        }
        // Queued together, so the keeper removes them all under one flush.
        let mut pending = Vec::new();
        for (i, group) in groups.into_iter().enumerate() {
            if codes.get(i) == Some(&0) {
                let (reply, rx) = oneshot::channel();
                let queued = self.offsets.send((offsets::Change::Remove { group, only: None }, reply)).await.is_ok();
                pending.push((i, queued.then_some(rx)));
            }
        }
        for (i, rx) in pending {
            let removed = match rx {
                Some(rx) => matches!(rx.await, Ok(Ok(_))),
                None => false,
            };
            if !removed {
                codes[i] = kafka_protocol::ResponseError::KafkaStorageError.code();
            }
        }
        codes
    }

    /// Groups with no members and no pending member ids, with when they
    /// last had members.
    async fn idle_groups(&self) -> Vec<IdleGroup> {
        self.ask(|reply| Cmd::Idle { reply }).await.unwrap_or_default()
    }

    /// One offset-expiry pass: idle groups without committed offsets are
    /// forgotten (nothing of them is worth keeping, so join attempts that
    /// never come back cannot pile up groups); the offsets of a group empty
    /// for `retention_ms` (Kafka's `offsets.retention.minutes`) whose newest
    /// commit is that old are removed, and the group with them. Returns how
    /// many groups' offsets expired.
    pub async fn expire_offsets(&self, retention_ms: i64) -> Result<usize, StoreError> {
        let idle = self.idle_groups().await;
        let cutoff_ms = self.engine.now_ms() - retention_ms;
        let applied = self.change(offsets::Change::Expire { idle, cutoff_ms }).await?;
        if !applied.forget.is_empty() {
            self.ask(|reply| Cmd::Forget { groups: applied.forget, reply }).await;
        }
        Ok(applied.expired)
    }

    /// Writes committed offsets and returns once they are durable (in
    /// cluster mode: once the shard's in-sync replicas have them).
    pub async fn store_offsets(&self, rows: Vec<offsets::Row>) -> Result<(), StoreError> {
        self.change(offsets::Change::Commit(rows)).await.map(drop)
    }

    /// Removes some of a group's committed offsets (OffsetDelete), durably.
    pub async fn delete_offsets(&self, group: String, partitions: Vec<(String, i32)>) -> Result<(), StoreError> {
        self.change(offsets::Change::Remove { group, only: Some(partitions) }).await.map(drop)
    }

    /// A group's committed offsets: (topic, partition, record). Every
    /// change answered before is seen.
    pub fn committed(&self, group: &str) -> Result<Vec<(String, i32, OffsetRecord)>, crate::meta::MetaError> {
        self.engine.catalog().group_offsets(group)
    }

    async fn change(&self, change: offsets::Change) -> Result<offsets::Applied, StoreError> {
        match self.journal.get() {
            None if self.awaiting.load(std::sync::atomic::Ordering::Acquire) => {
                Err(StoreError { code: kafka_protocol::ResponseError::CoordinatorNotAvailable.code(), message: "the coordinator shards are not loaded yet".into() })
            }
            None => self.apply(change).await,
            Some(j) => self.journaled(j.as_ref(), change).await,
        }
    }

    /// Applies `change` to the catalog (the keeper thread), durably.
    async fn apply(&self, change: offsets::Change) -> Result<offsets::Applied, StoreError> {
        let (reply, rx) = oneshot::channel();
        self.offsets.send((change, reply)).await.map_err(|_| StoreError::storage("coordinator stopped"))?;
        rx.await.map_err(|_| StoreError::storage("coordinator stopped"))?.map_err(StoreError::storage)
    }

    /// Applies a change its shard's log already has; should the catalog
    /// fail, the shard is loaded again from the log, so they agree.
    async fn apply_journaled(&self, j: &dyn journal::Journal, shard: u32, change: offsets::Change) -> Result<offsets::Applied, StoreError> {
        let applied = self.apply(change).await;
        if applied.is_err() {
            j.reload(shard);
        }
        applied
    }

    /// Cluster mode: `change` goes to its shards' logs, and to the catalog
    /// once each shard's in-sync replicas have it, one shard's turn at a
    /// time. A removal journals the rows it removes (read under the
    /// turn, so no commit of the shard lands between read and removal).
    async fn journaled(&self, j: &dyn journal::Journal, change: offsets::Change) -> Result<offsets::Applied, StoreError> {
        use journal::{shard_of, Entry, Record};
        let catalog_err = |e: crate::meta::MetaError| StoreError::storage(e.to_string());
        let tombstones = |group: &str, rows: &[(String, i32, OffsetRecord)]| rows.iter().map(|(t, p, _)| Record::Offset(Entry { group: group.to_owned(), topic: t.clone(), partition: *p, record: None })).collect::<Vec<_>>();
        match change {
            offsets::Change::Commit(rows) => {
                let mut by_shard: std::collections::BTreeMap<u32, Vec<offsets::Row>> = std::collections::BTreeMap::new();
                for row in rows {
                    by_shard.entry(shard_of(&row.0)).or_default().push(row);
                }
                for (shard, rows) in by_shard {
                    let _turn = self.turns[shard as usize].lock().await;
                    let entries = rows.iter().map(|(g, t, p, r)| Record::Offset(Entry { group: g.clone(), topic: t.clone(), partition: *p, record: Some(r.clone()) })).collect();
                    j.append(shard, entries).await.map_err(StoreError::journal)?;
                    self.apply_journaled(j, shard, offsets::Change::Commit(rows)).await?;
                }
                Ok(offsets::Applied::default())
            }
            offsets::Change::Remove { group, only } => {
                let shard = shard_of(&group);
                let _turn = self.turns[shard as usize].lock().await;
                // The shard may have moved away (its rows dropped) while
                // this waited for its turn: nothing read now is the log's.
                if !j.ready(shard) {
                    return Err(StoreError::journal(kafka_protocol::ResponseError::NotCoordinator.code()));
                }
                let mut rows = self.engine.catalog().group_offsets(&group).map_err(catalog_err)?;
                if let Some(only) = &only {
                    rows.retain(|(t, p, _)| only.iter().any(|(ot, op)| ot == t && op == p));
                }
                // Offsets an open transaction staged for these partitions
                // go too (Kafka's tombstone drops them): a later commit
                // marker must not bring back what was deleted.
                let pending = self.pending_keys(shard, &group, only.as_deref());
                if rows.is_empty() && pending.is_empty() {
                    return self.apply(offsets::Change::Remove { group, only }).await;
                }
                let records = tombstones(&group, &rows).into_iter().chain(Self::pending_tombstones(&pending)).collect();
                j.append(shard, records).await.map_err(StoreError::journal)?;
                self.forget_pending(shard, &pending);
                self.apply_journaled(j, shard, offsets::Change::Remove { group, only }).await
            }
            offsets::Change::Expire { idle, cutoff_ms } => {
                let mut out = offsets::Applied::default();
                for g in idle {
                    let shard = shard_of(&g.id);
                    // Only the shard's loaded leader expires its groups
                    // (checked in the turn: an unload drops the rows).
                    let _turn = self.turns[shard as usize].lock().await;
                    // A group an open transaction staged offsets for stays
                    // until the transaction ends (as in Kafka).
                    if !j.ready(shard) || !self.pending_keys(shard, &g.id, None).is_empty() {
                        continue;
                    }
                    let rows = self.engine.catalog().group_offsets(&g.id).map_err(catalog_err)?;
                    if rows.is_empty() {
                        out.forget.push((g.id.clone(), g.commits));
                    } else if offsets::expired(&g, &rows, cutoff_ms) {
                        if let Err(code) = j.append(shard, tombstones(&g.id, &rows)).await {
                            tracing::warn!(group = %g.id, code, "expiring a group's offsets: its shard's log refused; trying at the next pass");
                            continue;
                        }
                        self.apply_journaled(j, shard, offsets::Change::Remove { group: g.id.clone(), only: None }).await?;
                        tracing::info!(group = %g.id, "expired the committed offsets of an empty group");
                        out.forget.push((g.id.clone(), g.commits));
                        out.expired += 1;
                    }
                }
                Ok(out)
            }
            load @ offsets::Change::Load { .. } => self.apply(load).await,
        }
    }

    pub fn engine(&self) -> &Arc<Engine> {
        &self.engine
    }
}

/// Member ids look like Kafka's: `<client id>-<uuid>`.
fn member_id(client_id: &str) -> String {
    let client: String = client_id.chars().take(64).collect();
    format!("{client}-{}", uuid::Uuid::new_v4())
}

enum Parked {
    Join(oneshot::Sender<JoinResult>),
    Sync(oneshot::Sender<SyncResult>),
}

/// When each group next needs a `tick`: a min-heap of (deadline, group)
/// holding at most one live entry per group. A group is re-scheduled after
/// every command that touches it, but only when its deadline moved earlier;
/// a deadline that moved later (a heartbeat) is found when the old entry
/// comes due, so heartbeats cost no heap traffic and the heap stays about as
/// large as the number of groups with timers.
#[derive(Default)]
struct Timers {
    heap: BinaryHeap<Reverse<(i64, String)>>,
    scheduled: HashMap<String, i64>,
}

impl Timers {
    fn schedule(&mut self, g: &Group, cfg: &GroupConfig) {
        self.schedule_at(&g.id, g.next_deadline(cfg));
    }

    fn schedule_at(&mut self, id: &str, deadline: Option<i64>) {
        let Some(d) = deadline else { return };
        if self.scheduled.get(id).is_some_and(|&s| s <= d) {
            return;
        }
        self.scheduled.insert(id.to_owned(), d);
        self.heap.push(Reverse((d, id.to_owned())));
    }

    fn next(&self) -> Option<i64> {
        self.heap.peek().map(|Reverse((d, _))| *d)
    }

    /// Groups whose scheduled deadline has come (stale entries dropped).
    fn due(&mut self, now: i64) -> Vec<String> {
        let mut out = Vec::new();
        while self.heap.peek().is_some_and(|Reverse((d, _))| *d <= now) {
            let Reverse((d, id)) = self.heap.pop().expect("peeked");
            if self.scheduled.get(&id) == Some(&d) {
                self.scheduled.remove(&id);
                out.push(id);
            }
        }
        out
    }
}

/// Everything the coordinator task owns: the groups of both kinds and
/// what their state machines need.
struct Groups {
    classic: HashMap<String, Group>,
    consumers: HashMap<String, ConsumerGroup>,
    cfg: GroupConfig,
    ccfg: ConsumerConfig,
    engine: Arc<Engine>,
}

/// The engine's topics as a consumer group sees them.
struct EngineTopics<'a>(&'a Engine);

impl consumer::Topics for EngineTopics<'_> {
    fn by_name(&self, name: &str) -> Option<(consumer::TopicId, i32)> {
        self.0.topic(name).map(|t| (t.id(), t.partitions()))
    }
    fn by_id(&self, id: &consumer::TopicId) -> Option<(String, i32)> {
        self.0.topic_by_id(id).map(|t| (t.name().to_owned(), t.partitions()))
    }
    fn each_name(&self, f: &mut dyn FnMut(&str)) {
        self.0.each_topic_name(f)
    }
    fn version(&self) -> u64 {
        self.0.topics_version()
    }
}

impl Groups {
    fn consumer_heartbeat(&mut self, now: i64, group: String, args: HeartbeatArgs) -> HeartbeatResult {
        let fail = |e: kafka_protocol::ResponseError, m: &str| HeartbeatResult { error: e.code(), message: Some(m.to_owned()), member_epoch: -1, ..Default::default() };
        if let Some(c) = self.classic.get(&group) {
            if !c.is_idle() {
                return fail(kafka_protocol::ResponseError::GroupIdNotFound, "the group is a classic group with members");
            }
            self.classic.remove(&group);
        }
        if !self.consumers.contains_key(&group) {
            // A request that would be refused makes no group.
            if let Err(e) = consumer::validate(&args) {
                return e;
            }
            if args.member_epoch != 0 {
                return fail(kafka_protocol::ResponseError::UnknownMemberId, "unknown member");
            }
            self.consumers.insert(group.clone(), ConsumerGroup::new(group.clone(), now));
        }
        let g = self.consumers.get_mut(&group).expect("inserted");
        let client = args.client_id.clone();
        g.heartbeat(&self.ccfg, now, &EngineTopics(&self.engine), args, || member_id(&client))
    }

    fn consumer_describe(&self, id: &str) -> Option<ConsumerGroupDescription> {
        let g = self.consumers.get(id)?;
        Some(ConsumerGroupDescription {
            group_id: id.to_owned(),
            state: g.state(),
            group_epoch: g.epoch,
            assignment_epoch: g.assignment_epoch,
            assignor: g.assignor,
            members: g
                .members
                .values()
                .map(|m| ConsumerMemberDescription {
                    member_id: m.id.clone(),
                    instance_id: m.instance_id.clone(),
                    rack_id: m.rack_id.clone(),
                    member_epoch: m.epoch,
                    client_id: m.client_id.clone(),
                    client_host: m.client_host.clone(),
                    subscribed_topic_names: m.subscribed_names.iter().cloned().collect(),
                    subscribed_topic_regex: m.regex.clone(),
                    assignment: m.assigned.clone(),
                    target_assignment: g.target_of(&m.id),
                })
                .collect(),
        })
    }
}

/// Group records queued for one shard's writer. The run loop never waits
/// for room (the writer answers through the run loop's own queue): a
/// store that finds the queue full fails as a store whose append failed.
const GROUP_WRITES_QUEUED: usize = 1024;

/// A shard's group writer: appends groups' states and tombstones to the
/// shard's log in the order asked (so the log's last state of a group is
/// the last one asked for), whatever is queued as one append, in the
/// shard's turn (no load reads the log meanwhile), and tells how each
/// store went.
async fn group_writer(shard: u32, mut rx: mpsc::Receiver<GroupWrite>, journal: Arc<dyn journal::Journal>, turns: Arc<Vec<tokio::sync::Mutex<()>>>, coordinator: mpsc::Sender<Cmd>) {
    /// At most this many records in one append.
    const BATCH: usize = 256;
    while let Some(first) = rx.recv().await {
        let mut writes = vec![first];
        while writes.len() < BATCH {
            match rx.try_recv() {
                Ok(w) => writes.push(w),
                Err(_) => break,
            }
        }
        let (records, dones): (Vec<_>, Vec<_>) = writes.into_iter().map(|w| (w.record, w.done)).unzip();
        let result = {
            let _turn = turns[shard as usize].lock().await;
            journal.append(shard, records).await
        };
        // Kafka's answer to a sync whose store failed: a record too large
        // is the server's problem, not the commit's.
        let result = result.map_err(|code| if code == kafka_protocol::ResponseError::InvalidCommitOffsetSize.code() { kafka_protocol::ResponseError::UnknownServerError.code() } else { code });
        for done in dones {
            if let WriteDone::Stored { group, seq } = done {
                if coordinator.send(Cmd::Stored { group, seq, result }).await.is_err() {
                    return;
                }
            }
        }
    }
}

async fn run(mut rx: mpsc::Receiver<Cmd>, mut state: Groups, clock: Clock, mut stop: tokio::sync::watch::Receiver<bool>, writers: Arc<std::sync::OnceLock<Vec<mpsc::Sender<GroupWrite>>>>) {
    let mut parked: HashMap<Token, Parked> = HashMap::new();
    let mut next_token: Token = 1;
    let mut next_store: u64 = 1;
    let mut timers = Timers::default();
    loop {
        let now = clock();
        let sleep = timers.next().map(|d| Duration::from_millis((d - now).max(0) as u64)).unwrap_or(Duration::from_secs(3600));
        let cmd = tokio::select! {
            c = rx.recv() => match c { Some(c) => Some(c), None => return },
            _ = tokio::time::sleep(sleep) => None,
            _ = stop.wait_for(|s| *s) => return,
        };
        // Cluster mode (set once, with the journal): rebalances are stored
        // before they are answered.
        state.cfg.store_groups = writers.get().is_some();
        let Groups { classic: groups, consumers, cfg, ccfg, .. } = &mut state;
        let cfg = &*cfg;
        let now = clock();
        let mut replies = Vec::new();
        // The group a command changed, to re-schedule its timer.
        let mut touched: Option<String> = None;
        // Classic groups deleted or forgotten: a stored one leaves a
        // tombstone, queued behind its earlier states.
        let mut forgotten: Vec<Group> = Vec::new();
        if let Some(cmd) = cmd {
            match cmd {
                Cmd::Join { group, args, reply } => {
                    // A consumer group's name: refused while it has
                    // members, taken over when it has none.
                    if consumers.get(&group).is_some_and(|c| !c.is_empty()) {
                        let _ = reply.send(JoinResult { error: kafka_protocol::ResponseError::InconsistentGroupProtocol.code(), generation: -1, member_id: args.member_id, ..Default::default() });
                        continue;
                    }
                    consumers.remove(&group);
                    // A member id for a group that does not exist is not
                    // a member of anything (and creates no group).
                    if !args.member_id.is_empty() && !groups.contains_key(&group) {
                        let _ = reply.send(JoinResult { error: kafka_protocol::ResponseError::UnknownMemberId.code(), generation: -1, member_id: args.member_id, ..Default::default() });
                    } else {
                        touched = Some(group.clone());
                        let token = next_token;
                        next_token += 1;
                        parked.insert(token, Parked::Join(reply));
                        let g = groups.entry(group.clone()).or_insert_with(|| Group::new(group, now));
                        let client = args.client_id.clone();
                        replies.extend(g.join(cfg, now, token, args, || member_id(&client)));
                    }
                }
                Cmd::Sync { group, args, reply } => {
                    touched = Some(group.clone());
                    let token = next_token;
                    next_token += 1;
                    match groups.get_mut(&group) {
                        Some(g) => {
                            parked.insert(token, Parked::Sync(reply));
                            replies.extend(g.sync(cfg, now, token, args));
                        }
                        None => {
                            let _ = reply.send(SyncResult { error: kafka_protocol::ResponseError::UnknownMemberId.code(), ..Default::default() });
                        }
                    }
                }
                Cmd::Heartbeat { group, generation, member_id, instance_id, reply } => {
                    touched = Some(group.clone());
                    let code = match groups.get_mut(&group) {
                        Some(g) => g.heartbeat(now, generation, &member_id, instance_id.as_deref()),
                        None => kafka_protocol::ResponseError::UnknownMemberId.code(),
                    };
                    let _ = reply.send(code);
                }
                Cmd::Leave { group, members, reply } => match groups.get_mut(&group) {
                    Some(g) => {
                        touched = Some(group.clone());
                        let (codes, r) = g.leave(cfg, now, &members);
                        replies.extend(r);
                        let _ = reply.send((0, codes));
                    }
                    None => {
                        let _ = reply.send((kafka_protocol::ResponseError::UnknownMemberId.code(), vec![kafka_protocol::ResponseError::UnknownMemberId.code(); members.len()]));
                    }
                },
                Cmd::CommitCheck { group, commit, transactional, version, reply } => {
                    if let Some(c) = consumers.get_mut(&group) {
                        let r = c.validate_commit(commit.generation, &commit.member_id, transactional, version);
                        if r.is_ok() {
                            c.commits += 1;
                        }
                        let _ = reply.send(r);
                        continue;
                    }
                    let result = match groups.get_mut(&group) {
                        Some(g) => {
                            let r = g.validate_commit(commit.generation, &commit.member_id, commit.instance_id.as_deref(), transactional);
                            if r.is_ok() {
                                g.commits += 1;
                            }
                            r
                        }
                        // A consumer managing its own assignment makes a
                        // "simple" group by committing.
                        None if commit.generation < 0 => {
                            let mut g = Group::new(group.clone(), now);
                            g.commits = 1;
                            groups.insert(group, g);
                            Ok(())
                        }
                        None if !transactional && version >= 9 => Err(kafka_protocol::ResponseError::GroupIdNotFound.code()),
                        None => Err(kafka_protocol::ResponseError::IllegalGeneration.code()),
                    };
                    let _ = reply.send(result);
                }
                Cmd::List { reply } => {
                    let mut v: Vec<_> = groups.values().map(|g| (g.id.clone(), g.protocol_type.clone().unwrap_or_default(), g.state.name(), "classic")).collect();
                    v.extend(consumers.values().map(|g| (g.id.clone(), "consumer".to_owned(), g.state(), "consumer")));
                    v.sort();
                    let _ = reply.send(v);
                }
                Cmd::ConsumerHeartbeat { group, args, reply } => {
                    let r = state.consumer_heartbeat(now, group.clone(), args);
                    if let Some(g) = state.consumers.get(&group) {
                        timers.schedule_at(&group, g.next_deadline(&state.ccfg));
                    }
                    let _ = reply.send(r);
                    continue;
                }
                Cmd::ConsumerDescribe { groups: ids, reply } => {
                    let out = ids.into_iter().map(|id| {
                        let d = state.consumer_describe(&id);
                        (id, d)
                    }).collect();
                    let _ = reply.send(out);
                    continue;
                }
                Cmd::FetchCheck { group, member_id, member_epoch, reply } => {
                    let r = consumers.get(&group).map_or(Ok(()), |c| c.validate_fetch(member_epoch, member_id.as_deref()));
                    let _ = reply.send(r);
                }
                Cmd::Describe { groups: ids, reply } => {
                    let out = ids
                        .into_iter()
                        .map(|id| match consumers.get(&id) {
                            Some(c) => describe_consumer(c, id),
                            None => describe(groups.get(&id), id),
                        })
                        .collect();
                    let _ = reply.send(out);
                }
                Cmd::Delete { groups: ids, reply } => {
                    let codes = ids
                        .into_iter()
                        .map(|id| match groups.get(&id) {
                            None if consumers.get(&id).is_some_and(|c| !c.is_empty()) => kafka_protocol::ResponseError::NonEmptyGroup.code(),
                            None if consumers.remove(&id).is_some() => 0,
                            None => kafka_protocol::ResponseError::GroupIdNotFound.code(),
                            Some(g) if !g.is_empty() => kafka_protocol::ResponseError::NonEmptyGroup.code(),
                            Some(_) => {
                                if let Some(g) = groups.remove(&id) {
                                    forgotten.push(g);
                                }
                                0
                            }
                        })
                        .collect();
                    let _ = reply.send(codes);
                }
                Cmd::Idle { reply } => {
                    let mut v: Vec<IdleGroup> = groups.values().filter(|g| g.is_idle()).map(|g| IdleGroup { id: g.id.clone(), empty_since_ms: g.empty_since_ms, commits: g.commits }).collect();
                    v.extend(consumers.values().filter(|g| g.is_empty()).map(|g| IdleGroup { id: g.id.clone(), empty_since_ms: g.empty_since_ms, commits: g.commits }));
                    let _ = reply.send(v);
                }
                Cmd::Forget { groups: ids, reply } => {
                    for (id, commits) in ids {
                        if groups.get(&id).is_some_and(|g| g.is_idle() && g.commits == commits) {
                            forgotten.extend(groups.remove(&id));
                        }
                        if consumers.get(&id).is_some_and(|g| g.is_empty() && g.commits == commits) {
                            consumers.remove(&id);
                        }
                    }
                    let _ = reply.send(());
                }
                Cmd::Reset { shard, groups: known, stored, reply } => {
                    let here = |id: &String| journal::shard_of(id) == shard;
                    let gone: Vec<String> = groups.keys().filter(|id| here(id)).cloned().collect();
                    for id in gone {
                        if let Some(mut g) = groups.remove(&id) {
                            replies.extend(g.release(kafka_protocol::ResponseError::NotCoordinator.code()));
                        }
                    }
                    consumers.retain(|id, _| !here(id));
                    for (id, s) in stored {
                        let g = Group::restore(id.clone(), s, now);
                        timers.schedule(&g, cfg);
                        groups.insert(id, g);
                    }
                    for id in known {
                        groups.entry(id.clone()).or_insert_with(|| Group::new(id, now));
                    }
                    let _ = reply.send(());
                }
                Cmd::Stored { group, seq, result } => {
                    if let Some(g) = groups.get_mut(&group) {
                        touched = Some(group);
                        replies.extend(g.stored(cfg, now, seq, result));
                    }
                }
            }
        }
        let mut changed: Vec<String> = Vec::new();
        if let Some(id) = touched {
            if let Some(g) = groups.get(&id) {
                timers.schedule(g, cfg);
            }
            changed.push(id);
        }
        for id in timers.due(now) {
            if let Some(g) = groups.get_mut(&id) {
                replies.extend(g.tick(cfg, now));
                timers.schedule(g, cfg);
                changed.push(id.clone());
            }
            if let Some(g) = consumers.get_mut(&id) {
                g.tick(ccfg, now);
                timers.schedule_at(&id, g.next_deadline(ccfg));
            }
        }
        // What the changed groups ask to store goes to their shards'
        // writers (single-node mode keeps nothing of it).
        if let Some(writers) = writers.get() {
            // A group that never completed a join phase was never stored.
            for g in forgotten.into_iter().filter(|g| g.generation > 0) {
                let write = GroupWrite { record: journal::Record::Group { group: g.id.clone(), state: None }, done: WriteDone::Tombstone };
                if writers[journal::shard_of(&g.id) as usize].try_send(write).is_err() {
                    tracing::error!(group = %g.id, "a shard's group writer is stopped or full; the group's tombstone is not written");
                }
            }
        }
        for id in changed {
            // Stores are numbered across groups and reloads, so that a
            // result is never taken for a later store's.
            let seq = next_store;
            let Some(stored) = groups.get_mut(&id).and_then(|g| g.take_store(seq)) else { continue };
            next_store += 1;
            if let Some(writers) = writers.get() {
                let write = GroupWrite { record: journal::Record::Group { group: id.clone(), state: Some(stored) }, done: WriteDone::Stored { group: id.clone(), seq } };
                if writers[journal::shard_of(&id) as usize].try_send(write).is_err() {
                    tracing::error!(group = %id, "a shard's group writer is stopped or full; the group's state is not stored");
                    if let Some(g) = groups.get_mut(&id) {
                        replies.extend(g.stored(cfg, now, seq, Err(kafka_protocol::ResponseError::CoordinatorNotAvailable.code())));
                        timers.schedule(g, cfg);
                    }
                }
            }
        }
        for r in replies {
            match r {
                Reply::Join(t, result) => {
                    if let Some(Parked::Join(tx)) = parked.remove(&t) {
                        let _ = tx.send(result);
                    }
                }
                Reply::Sync(t, result) => {
                    if let Some(Parked::Sync(tx)) = parked.remove(&t) {
                        let _ = tx.send(result);
                    }
                }
            }
        }
        // A parked request whose client went away has a closed channel.
        parked.retain(|_, p| match p {
            Parked::Join(tx) => !tx.is_closed(),
            Parked::Sync(tx) => !tx.is_closed(),
        });
    }
}

/// A consumer group as DescribeGroups shows it: its state and members,
/// with protocol type "consumer" (the members' assignments are
/// ConsumerGroupDescribe's).
fn describe_consumer(g: &ConsumerGroup, id: String) -> GroupDescription {
    GroupDescription {
        group_id: id,
        state: Some(g.state()),
        protocol_type: "consumer".into(),
        protocol: g.assignor.into(),
        members: g
            .members
            .values()
            .map(|m| MemberDescription { member_id: m.id.clone(), instance_id: m.instance_id.clone(), client_id: m.client_id.clone(), client_host: m.client_host.clone(), metadata: Bytes::new(), assignment: Bytes::new() })
            .collect(),
    }
}

fn describe(g: Option<&Group>, id: String) -> GroupDescription {
    let Some(g) = g else {
        return GroupDescription { group_id: id, state: None, protocol_type: String::new(), protocol: String::new(), members: Vec::new() };
    };
    let protocol = g.protocol.clone().unwrap_or_default();
    GroupDescription {
        group_id: id,
        state: Some(g.state.name()),
        protocol_type: g.protocol_type.clone().unwrap_or_default(),
        members: g
            .members
            .values()
            .map(|m| MemberDescription {
                member_id: m.id.clone(),
                instance_id: m.instance_id.clone(),
                client_id: m.client_id.clone(),
                client_host: m.client_host.clone(),
                metadata: m.metadata(&protocol),
                assignment: if g.state == State::Stable { m.assignment.clone() } else { Bytes::new() },
            })
            .collect(),
        protocol,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn group_with_deadline(id: &str, session_ms: i32, now: i64) -> Group {
        let mut g = Group::new(id.into(), now);
        let args = join_args("", session_ms);
        let cfg = GroupConfig { min_session_timeout_ms: 1, ..GroupConfig::default() };
        g.join(&cfg, now, 1, args, || format!("{id}-m"));
        g
    }

    /// A shard log in memory: what was appended, and whether appends fail.
    #[derive(Default)]
    struct FakeLog {
        appended: std::sync::Mutex<Vec<journal::Record>>,
        failing: std::sync::atomic::AtomicBool,
        /// The shard moved away (or is loading).
        unready: std::sync::atomic::AtomicBool,
    }

    impl journal::Journal for FakeLog {
        fn append(&self, _shard: u32, records: Vec<journal::Record>) -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<(), i16>> + Send + '_>> {
            Box::pin(async move {
                if self.failing.load(std::sync::atomic::Ordering::SeqCst) {
                    return Err(kafka_protocol::ResponseError::CoordinatorNotAvailable.code());
                }
                self.appended.lock().unwrap().extend(records);
                Ok(())
            })
        }
        fn ready(&self, _shard: u32) -> bool {
            !self.unready.load(std::sync::atomic::Ordering::SeqCst)
        }
        fn reload(&self, _shard: u32) {}
        fn epoch(&self, shard: u32) -> Option<i32> {
            self.ready(shard).then_some(0)
        }
    }

    impl FakeLog {
        /// The group records appended so far, in order.
        fn groups(&self) -> Vec<(String, Option<journal::StoredGroup>)> {
            self.appended.lock().unwrap().iter().filter_map(|r| match r { journal::Record::Group { group, state } => Some((group.clone(), state.clone())), _ => None }).collect()
        }
    }

    fn coordinator(dir: &std::path::Path, log: Arc<FakeLog>) -> Coordinator {
        let engine = Engine::open(crate::engine::EngineConfig::new(dir), crate::engine::system_clock()).unwrap();
        let cfg = GroupConfig { initial_rebalance_delay_ms: 0, min_session_timeout_ms: 1, ..GroupConfig::default() };
        let (_stop_tx, stop) = tokio::sync::watch::channel(false);
        std::mem::forget(_stop_tx);
        let c = Coordinator::start(engine, cfg, ConsumerConfig::default(), crate::engine::system_clock(), stop);
        c.set_journal(log);
        c
    }

    fn join_args(member: &str, session_ms: i32) -> JoinArgs {
        JoinArgs {
            member_id: member.into(),
            instance_id: None,
            client_id: "c".into(),
            client_host: "h".into(),
            session_timeout_ms: session_ms,
            rebalance_timeout_ms: session_ms,
            protocol_type: "consumer".into(),
            protocols: vec![("range".into(), Bytes::from_static(b"m"))],
            require_known_member_id: true,
            supports_skip_assignment: true,
        }
    }

    /// One member joins `group` and syncs as its leader: the SyncGroup
    /// answer.
    async fn join_and_sync(c: &Coordinator, group: &str, session_ms: i32) -> (String, i32, SyncResult) {
        let first = c.join(group.into(), join_args("", session_ms)).await.unwrap();
        let joined = c.join(group.into(), join_args(&first.member_id, session_ms)).await.unwrap();
        assert_eq!(joined.error, 0);
        let id = joined.member_id.clone();
        let sync = SyncArgs { generation: joined.generation, member_id: id.clone(), assignments: vec![(id.clone(), Bytes::from_static(b"p0"))], ..Default::default() };
        (id, joined.generation, c.sync(group.into(), sync).await.unwrap())
    }

    #[tokio::test]
    async fn a_rebalance_is_answered_once_stored_and_a_failed_store_fails_the_sync() {
        let dir = tempfile::tempdir().unwrap();
        let log = Arc::new(FakeLog::default());
        let c = coordinator(dir.path(), log.clone());
        let (id, generation, sync) = join_and_sync(&c, "g", 10_000).await;
        assert_eq!((sync.error, sync.assignment), (0, Bytes::from_static(b"p0")));
        let stored = log.groups();
        assert_eq!(stored.len(), 1, "{stored:?}");
        let s = stored[0].1.clone().expect("a state, not a tombstone");
        assert_eq!((s.generation, s.members.len(), s.members[0].id.clone(), s.members[0].assignment.clone()), (generation, 1, id.clone(), Bytes::from_static(b"p0")));

        // Stores fail: the leader's sync gets the error, and the group
        // rebalances (its next join is a new generation).
        log.failing.store(true, std::sync::atomic::Ordering::SeqCst);
        let (_, _, sync) = join_and_sync(&c, "h", 10_000).await;
        assert_eq!(sync.error, kafka_protocol::ResponseError::CoordinatorNotAvailable.code());
        let d = c.describe(vec!["h".into()]).await;
        assert_eq!(d[0].state, Some("PreparingRebalance"));
    }

    #[tokio::test]
    async fn a_loaded_group_is_stable_with_its_members_and_their_sessions_run() {
        let dir = tempfile::tempdir().unwrap();
        let log = Arc::new(FakeLog::default());
        let first = coordinator(dir.path(), log.clone());
        let (id, generation, _) = join_and_sync(&first, "g", 300).await;
        let state = log.groups().pop().unwrap().1.unwrap();

        // Another node loads the shard: the member heartbeats on at its
        // generation, and gets its assignment again.
        let dir2 = tempfile::tempdir().unwrap();
        let second = coordinator(dir2.path(), Arc::new(FakeLog::default()));
        let shard = journal::shard_of("g");
        let loaded = journal::Shard { offsets: Default::default(), groups: [("g".to_string(), state)].into(), txns: Default::default(), pending: Default::default(), fences: Default::default() };
        assert_eq!(second.load_shard(shard, async { Ok(Some(loaded)) }).await, Ok(Some((1, Default::default()))));
        assert_eq!(second.heartbeat("g".into(), generation, id.clone(), None).await, Some(0));
        let again = second.sync("g".into(), SyncArgs { generation, member_id: id.clone(), ..Default::default() }).await.unwrap();
        assert_eq!((again.error, again.assignment), (0, Bytes::from_static(b"p0")));
        assert_eq!(second.describe(vec!["g".into()]).await[0].state, Some("Stable"));
        // Loaded at a third node and never heard from, the member expires
        // after its session (300 ms): the restore itself set the timer.
        let dir3 = tempfile::tempdir().unwrap();
        let second = coordinator(dir3.path(), Arc::new(FakeLog::default()));
        let loaded = journal::Shard { offsets: Default::default(), groups: [("g".to_string(), log.groups().pop().unwrap().1.unwrap())].into(), txns: Default::default(), pending: Default::default(), fences: Default::default() };
        assert_eq!(second.load_shard(shard, async { Ok(Some(loaded)) }).await, Ok(Some((1, Default::default()))));
        assert_eq!(second.describe(vec!["g".into()]).await[0].state, Some("Stable"));
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while second.describe(vec!["g".into()]).await[0].state != Some("Empty") {
            assert!(std::time::Instant::now() < deadline, "the restored member never expired");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    #[tokio::test]
    async fn a_shard_that_moves_away_leaves_nothing_of_its_groups() {
        let dir = tempfile::tempdir().unwrap();
        let log = Arc::new(FakeLog::default());
        let c = coordinator(dir.path(), log.clone());
        let (id, generation, _) = join_and_sync(&c, "g", 10_000).await;
        let rec = OffsetRecord { offset: 7, leader_epoch: 0, metadata: None, commit_ms: 1 };
        c.store_offsets(vec![("g".into(), "t".into(), 0, rec.clone()), ("other".into(), "t".into(), 0, rec)]).await.unwrap();
        assert_eq!(c.committed("g").unwrap().len(), 1);
        let shard = journal::shard_of("g");
        assert_ne!(journal::shard_of("other"), shard, "two shards");
        c.unload_shard(shard).await;
        // Its offsets leave the catalog (and with them the lag metrics),
        // its groups memory; another shard's stay.
        assert!(c.committed("g").unwrap().is_empty());
        assert!(!crate::kafka::coordinator::offsets::all_committed(c.engine().catalog()).iter().any(|(g, ..)| g == "g"));
        assert_eq!(c.committed("other").unwrap().len(), 1);
        assert_eq!(c.heartbeat("g".into(), generation, id, None).await, Some(kafka_protocol::ResponseError::UnknownMemberId.code()));
    }

    #[tokio::test]
    async fn a_removal_after_the_shard_moved_away_is_refused_not_made_on_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let log = Arc::new(FakeLog::default());
        let c = coordinator(dir.path(), log.clone());
        let rec = OffsetRecord { offset: 7, leader_epoch: 0, metadata: None, commit_ms: 1 };
        c.store_offsets(vec![("g".into(), "t".into(), 0, rec)]).await.unwrap();
        // The shard is not this node's now (a removal that waited for the
        // shard's turn while it was unloaded finds it so).
        log.unready.store(true, std::sync::atomic::Ordering::SeqCst);
        let e = c.delete_offsets("g".into(), vec![("t".into(), 0)]).await.unwrap_err();
        assert_eq!(e.code, kafka_protocol::ResponseError::NotCoordinator.code());
        assert_eq!(c.committed("g").unwrap().len(), 1, "nothing removed");
        assert_eq!(log.appended.lock().unwrap().len(), 1, "no tombstone: only the commit");
    }

    #[tokio::test]
    async fn becoming_empty_is_stored_and_deleting_leaves_a_tombstone_after_it() {
        let dir = tempfile::tempdir().unwrap();
        let log = Arc::new(FakeLog::default());
        let c = coordinator(dir.path(), log.clone());
        let (id, _, _) = join_and_sync(&c, "g", 10_000).await;
        assert_eq!(c.leave("g".into(), vec![(id, None)]).await.map(|(code, _)| code), Some(0));
        assert_eq!(c.delete(vec!["g".into()]).await, vec![0]);
        // A group that never completed a join phase leaves no tombstone.
        assert_eq!(c.txn_commit_check("simple".into(), CommitIds { generation: -1, member_id: String::new(), instance_id: None }).await, Some(Ok(())));
        assert_eq!(c.delete(vec!["simple".into()]).await, vec![0]);
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while log.groups().len() < 3 {
            assert!(std::time::Instant::now() < deadline, "{:?}", log.groups());
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let kinds: Vec<(String, Option<usize>)> = log.groups().into_iter().map(|(g, s)| (g, s.map(|s| s.members.len()))).collect();
        assert_eq!(kinds, vec![("g".into(), Some(1)), ("g".into(), Some(0)), ("g".into(), None)], "Stable, Empty, then the tombstone");
    }

    #[test]
    fn timers_fire_each_group_once_at_its_deadline() {
        let cfg = GroupConfig::default();
        let mut t = Timers::default();
        let a = group_with_deadline("a", 1000, 0);
        let b = group_with_deadline("b", 500, 0);
        t.schedule(&a, &cfg);
        t.schedule(&b, &cfg);
        // Rescheduling at the same or a later deadline adds nothing.
        t.schedule(&a, &cfg);
        assert_eq!(t.heap.len(), 2);
        assert_eq!(t.next(), Some(500));
        assert!(t.due(499).is_empty());
        assert_eq!(t.due(500), vec!["b".to_string()]);
        assert_eq!(t.due(1000), vec!["a".to_string()]);
        assert!(t.due(10_000).is_empty(), "nothing fires twice");
        // An earlier deadline replaces the scheduled one; the stale entry
        // is dropped when it comes due.
        let late = group_with_deadline("c", 5000, 0);
        t.schedule(&late, &cfg);
        let early = group_with_deadline("c", 100, 0);
        t.schedule(&early, &cfg);
        assert_eq!(t.due(100), vec!["c".to_string()]);
        assert!(t.due(5000).is_empty(), "the stale entry does not fire");
        assert!(t.heap.is_empty());
    }

    fn offset(o: i64) -> OffsetRecord {
        OffsetRecord { offset: o, leader_epoch: 1, metadata: None, commit_ms: 5 }
    }

    /// Cluster mode: a transaction's offsets wait in the group's shard (log
    /// first, then memory) until its marker commits or drops them there.
    #[tokio::test]
    async fn a_transactions_offsets_wait_in_the_shard_until_its_marker() {
        use kafka_protocol::ResponseError as E;
        let dir = tempfile::tempdir().unwrap();
        let log = Arc::new(FakeLog::default());
        let c = coordinator(dir.path(), log.clone());
        let shard = journal::shard_of("g");
        let groups: std::collections::HashSet<String> = ["g".to_string()].into();
        c.stage_txn_offsets(7, 2, "g", vec![("t".into(), 0, offset(10)), ("t".into(), 1, offset(20))], c.guard_txn_offsets("g", 7)).await.unwrap();
        assert!(c.committed("g").unwrap().is_empty(), "nothing committed before the marker");
        assert_eq!(c.pending_txn_offsets(&groups)["g"], [("t".to_string(), 0), ("t".to_string(), 1)].into());
        assert_eq!(log.appended.lock().unwrap().len(), 2, "both pending offsets in the log");
        // A marker older than the offsets changes nothing; another
        // producer's finds nothing to end.
        assert_eq!(c.end_txn_offsets(shard, 7, 1, 2, true).await, Err(E::InvalidProducerEpoch.code()));
        assert_eq!(log.appended.lock().unwrap().len(), 2);
        // The commit: the offsets, the pending ones' tombstones and the
        // coordinator's epoch (new for this producer) in one append, then
        // the catalog.
        c.end_txn_offsets(shard, 7, 3, 2, true).await.unwrap();
        let committed = c.committed("g").unwrap();
        assert_eq!(committed, vec![("t".to_string(), 0, offset(10)), ("t".to_string(), 1, offset(20))]);
        assert!(c.pending_txn_offsets(&groups).is_empty());
        {
            let appended = log.appended.lock().unwrap();
            assert_eq!(appended.len(), 7);
            assert!(matches!(&appended[2], journal::Record::Offset(e) if e.record == Some(offset(10))));
            assert!(matches!(&appended[5], journal::Record::Pending { producer_id: 7, state: None, partition: 1, .. }));
            assert_eq!(appended[6], journal::Record::Fence { producer_id: 7, coordinator_epoch: 2 });
        }
        // The marker again: nothing left to do, nothing written.
        assert_eq!(c.end_txn_offsets(shard, 7, 3, 2, true).await, Ok(()));
        assert_eq!(log.appended.lock().unwrap().len(), 7);
        // A deposed coordinator's marker (an older coordinator epoch) is
        // refused even with offsets waiting: they are a later
        // transaction's, its successor's to end.
        c.stage_txn_offsets(7, 3, "g", vec![("t".into(), 0, offset(11))], c.guard_txn_offsets("g", 7)).await.unwrap();
        assert_eq!(c.end_txn_offsets(shard, 7, 3, 1, true).await, Err(E::TransactionCoordinatorFenced.code()));
        assert_eq!(c.committed("g").unwrap(), committed);
        c.end_txn_offsets(shard, 7, 3, 2, false).await.unwrap();
        // An abort drops what it staged; the committed offsets stay.
        c.stage_txn_offsets(9, 0, "g", vec![("t".into(), 0, offset(99))], c.guard_txn_offsets("g", 9)).await.unwrap();
        c.end_txn_offsets(shard, 9, 0, 0, false).await.unwrap();
        assert_eq!(c.committed("g").unwrap(), committed);
        assert!(c.pending_txn_offsets(&groups).is_empty());
        assert!(log.appended.lock().unwrap().iter().any(|r| matches!(r, journal::Record::Pending { producer_id: 9, state: None, .. })));
        // A log that refuses: nothing staged, nothing ended.
        c.stage_txn_offsets(10, 0, "g", vec![("t".into(), 0, offset(50))], c.guard_txn_offsets("g", 10)).await.unwrap();
        log.failing.store(true, std::sync::atomic::Ordering::SeqCst);
        assert_eq!(c.stage_txn_offsets(11, 0, "g", vec![("t".into(), 1, offset(60))], c.guard_txn_offsets("g", 11)).await, Err(E::CoordinatorNotAvailable.code()));
        assert_eq!(c.end_txn_offsets(shard, 10, 0, 0, true).await, Err(E::NotEnoughReplicas.code()));
        assert_eq!(c.pending_txn_offsets(&groups)["g"], [("t".to_string(), 0)].into(), "producer 10's offset still waits, 11's never did");
        assert_eq!(c.committed("g").unwrap(), committed);
        // A shard this node does not lead (or has not loaded).
        log.failing.store(false, std::sync::atomic::Ordering::SeqCst);
        log.unready.store(true, std::sync::atomic::Ordering::SeqCst);
        assert_eq!(c.stage_txn_offsets(12, 0, "g", vec![("t".into(), 0, offset(1))], c.guard_txn_offsets("g", 12)).await, Err(E::NotCoordinator.code()));
        assert_eq!(c.end_txn_offsets(shard, 10, 0, 0, true).await, Err(E::NotLeaderOrFollower.code()));
        // Loaded again (elsewhere, say): what the log holds is what waits.
        log.unready.store(false, std::sync::atomic::Ordering::SeqCst);
        let mut shard_log = journal::Shard::default();
        shard_log.pending.insert(("g".into(), "t".into(), 3, 44), (1, offset(7)));
        shard_log.fences.insert(44, 6);
        assert!(c.load_shard(shard, async { Ok(Some(shard_log)) }).await.unwrap().is_some());
        assert_eq!(c.pending_txn_offsets(&groups)["g"], [("t".to_string(), 3)].into());
        assert_eq!(c.end_txn_offsets(shard, 44, 1, 5, true).await, Err(E::TransactionCoordinatorFenced.code()), "the log's fence holds after the load");
        c.end_txn_offsets(shard, 44, 1, 6, true).await.unwrap();
        assert_eq!(c.committed("g").unwrap(), vec![("t".to_string(), 3, offset(7))], "the load made the catalog the log's (empty), then the marker committed");
    }

    /// KIP-890's guard for the shard: offsets verified before their
    /// transaction's marker reached the shard are refused, not left
    /// waiting for a later transaction's commit.
    #[tokio::test]
    async fn offsets_verified_before_their_transactions_marker_are_refused() {
        use kafka_protocol::ResponseError as E;
        let dir = tempfile::tempdir().unwrap();
        let log = Arc::new(FakeLog::default());
        let c = coordinator(dir.path(), log.clone());
        let shard = journal::shard_of("g");
        let groups: std::collections::HashSet<String> = ["g".to_string()].into();
        // Verified, then the (abort) marker, then the offsets.
        let late = c.guard_txn_offsets("g", 7);
        let other = c.guard_txn_offsets("g", 8);
        c.end_txn_offsets(shard, 7, 0, 0, false).await.unwrap();
        assert_eq!(c.stage_txn_offsets(7, 0, "g", vec![("t".into(), 0, offset(10))], late).await, Err(E::InvalidTxnState.code()));
        assert!(c.pending_txn_offsets(&groups).is_empty(), "nothing staged");
        // Another producer's guard stands; a guard is used once.
        c.stage_txn_offsets(8, 0, "g", vec![("t".into(), 0, offset(11))], other).await.unwrap();
        assert_eq!(c.stage_txn_offsets(8, 0, "g", vec![("t".into(), 1, offset(12))], other).await, Err(E::InvalidTxnState.code()));
        // The next transaction's commit commits only its own offsets.
        c.end_txn_offsets(shard, 8, 0, 0, true).await.unwrap();
        assert_eq!(c.committed("g").unwrap(), vec![("t".to_string(), 0, offset(11))]);
        // A load of the shard drops the guards taken before it.
        let before = c.guard_txn_offsets("g", 9);
        assert!(c.load_shard(shard, async { Ok(Some(journal::Shard::default())) }).await.unwrap().is_some());
        // (NOT_COORDINATOR: the client finds the coordinator and asks
        // again; INVALID_TXN_STATE would end its producer.)
        assert_eq!(c.stage_txn_offsets(9, 0, "g", vec![("t".into(), 0, offset(13))], before).await, Err(E::NotCoordinator.code()));
        // A deposed end's marker (older than the offsets) leaves guards
        // standing.
        let standing = c.guard_txn_offsets("g", 9);
        c.stage_txn_offsets(9, 2, "g", vec![("t".into(), 0, offset(14))], c.guard_txn_offsets("g", 9)).await.unwrap();
        assert_eq!(c.end_txn_offsets(shard, 9, 1, 0, true).await, Err(E::InvalidProducerEpoch.code()));
        c.stage_txn_offsets(9, 2, "g", vec![("t".into(), 1, offset(15))], standing).await.unwrap();
    }

    /// Deleting a group's offsets drops what open transactions staged for
    /// them (their tombstones with the committed ones'), so a later
    /// commit marker brings nothing back; expiry leaves a group with
    /// staged offsets alone.
    #[tokio::test]
    async fn deleting_offsets_drops_what_a_transaction_staged_for_them() {
        let dir = tempfile::tempdir().unwrap();
        let log = Arc::new(FakeLog::default());
        let c = coordinator(dir.path(), log.clone());
        let shard = journal::shard_of("g");
        let groups: std::collections::HashSet<String> = ["g".to_string()].into();
        let known = || c.txn_commit_check("g".into(), CommitIds { generation: -1, member_id: String::new(), instance_id: None });
        c.store_offsets(vec![("g".into(), "t".into(), 0, offset(5))]).await.unwrap();
        assert_eq!(known().await, Some(Ok(())));
        c.stage_txn_offsets(7, 0, "g", vec![("t".into(), 0, offset(10)), ("t".into(), 1, offset(20))], c.guard_txn_offsets("g", 7)).await.unwrap();
        // Expiry, however old the group: it waits for the transaction.
        assert_eq!(c.expire_offsets(-1_000_000_000).await.unwrap(), 0);
        assert_eq!(c.committed("g").unwrap().len(), 1);
        // OffsetDelete of partition 1: only its staged offset goes.
        c.delete_offsets("g".into(), vec![("t".into(), 1)]).await.unwrap();
        assert_eq!(c.pending_txn_offsets(&groups)["g"], [("t".to_string(), 0)].into());
        assert!(matches!(log.appended.lock().unwrap().last(), Some(journal::Record::Pending { partition: 1, state: None, .. })));
        // The whole group's offsets: committed and staged.
        c.change(offsets::Change::Remove { group: "g".into(), only: None }).await.unwrap();
        assert!(c.pending_txn_offsets(&groups).is_empty());
        assert!(c.committed("g").unwrap().is_empty());
        // The commit marker finds nothing to commit.
        c.end_txn_offsets(shard, 7, 0, 0, true).await.unwrap();
        assert!(c.committed("g").unwrap().is_empty(), "deleted offsets stay deleted");
        // With nothing staged, the same expiry takes the group's offsets.
        c.store_offsets(vec![("g".into(), "t".into(), 0, offset(5))]).await.unwrap();
        assert_eq!(known().await, Some(Ok(())));
        assert_eq!(c.expire_offsets(-1_000_000_000).await.unwrap(), 1);
    }

}
