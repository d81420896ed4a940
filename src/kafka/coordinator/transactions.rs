//! The transaction coordinator.
//!
//! One record per transactional id (`meta::TxnRecord`: producer id, epoch,
//! state, the partitions and group offsets of the current transaction),
//! kept in memory and in the catalog (single-node mode) or its shard's log
//! (cluster mode). Requests for one id are serialised by
//! that id's lock; different ids run concurrently.
//!
//! ```text
//!  Empty/Complete* ──AddPartitions/AddOffsets──► Ongoing
//!  Ongoing ──EndTxn(commit)──► PrepareCommit ─markers─► CompleteCommit
//!  Ongoing ──EndTxn(abort) / timeout / new producer──► PrepareAbort ─markers─► CompleteAbort
//! ```
//!
//! The decision (Prepare*) is made durable before the first marker is
//! written, so a crash in between is finished the same way at start-up.
//! Besides that, only the start of a transaction (its first
//! AddPartitionsToTxn or AddOffsetsToTxn) is flushed: the catalog keeps
//! writes in order, so the decision's flush also makes the partitions and
//! offsets added in between durable, and a crash before it aborts the
//! transaction anyway — partitions whose addition was lost included, since
//! start-up aborts every open transaction it finds in the logs.
//! EndTxn answers once every marker is durable and the committed offsets
//! are stored, so a producer's next transaction never overlaps its last.
//!
//! At start-up every transaction is brought to an end: Prepare* ones are
//! finished, Ongoing ones are aborted (their producer is fenced by the
//! epoch bump and must start over; Kafka would wait for the timeout, which
//! would hold `read_committed` consumers back that long after a restart),
//! and any partition still holding an open transaction the coordinator's
//! record does not show gets an abort marker, its producer fenced the same
//! way. Nothing is left dangling.
//!
//! Transactions v2 (KIP-890 part 2, EndTxn v5, `transaction.version` 2):
//! every end moves the producer's epoch, and the markers carry the new one,
//! so a batch of the ended transaction that arrives late is refused by its
//! partition instead of joining the next transaction. The producer gets the
//! new epoch in the EndTxn answer and starts its sequences over; once its
//! epochs run out it continues under a new producer id. Partitions join a
//! transaction when its Produce (v12+) reaches them and a group when its
//! TxnOffsetCommit (v5+) does, without AddPartitionsToTxn or
//! AddOffsetsToTxn. Retries and the abort of a transaction that wrote
//! nothing are told apart by the epoch ([`v2_end`]), as Kafka does.
//!
//! Cluster mode (docs/cluster.md, "Transaction state"): a transaction may
//! span partitions any node leads. Its markers go to each partition's
//! leader, this node included, by WriteTxnMarkers over the inter-broker
//! links (`Transactions::write_markers`), and a leader asks this
//! coordinator (AddPartitionsToTxn v5) before it lets the transaction's
//! batches in. The start-up pass over the logs is single-node only.
//!
//! The records live in the coordinator shards' logs there, not in the
//! catalog (`coordinator::journal`; the id's shard is its groups' shard,
//! so its coordinator is the shard's leader): each change is appended and
//! replicated to the shard's in-sync replicas before memory takes it and
//! the client is answered. A node that begins leading a shard takes its
//! ids up from the log (`load_shard`): an ongoing transaction goes on, a
//! prepared one is finished. The decision is in the log before the first
//! marker is sent, so a coordinator that dies between them leaves its
//! successor the same decision to finish.
//!
//! Kafka's codes: INVALID_PRODUCER_ID_MAPPING (unknown id or producer id),
//! PRODUCER_FENCED (INVALID_PRODUCER_EPOCH for request versions before
//! KIP-588), CONCURRENT_TRANSACTIONS, INVALID_TXN_STATE.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kafka_protocol::ResponseError as E;
use tokio::sync::watch;

use super::Coordinator;

mod expiry;
use crate::engine::{Clock, Engine};
use crate::meta::{OffsetRecord, TxnOffset, TxnRecord, TxnState};
use crate::protocol::batch::Marker;
use crate::storage::Tp;

#[derive(Debug, Clone)]
pub struct TxnConfig {
    /// `transaction.max.timeout.ms`.
    pub max_timeout_ms: i32,
    /// `transactional.id.expiration.ms`.
    pub id_expiration_ms: i64,
    /// How often timed-out transactions are looked for.
    pub check_every: Duration,
}

impl Default for TxnConfig {
    fn default() -> Self {
        TxnConfig { max_timeout_ms: 900_000, id_expiration_ms: 604_800_000, check_every: Duration::from_secs(1) }
    }
}

type Slot = Arc<tokio::sync::Mutex<Option<TxnRecord>>>;

/// Handle to the transaction coordinator; cheap to clone.
#[derive(Clone)]
pub struct Transactions {
    inner: Arc<Inner>,
}

struct Inner {
    engine: Arc<Engine>,
    /// Where producer ids come from in cluster mode.
    cluster: Arc<crate::cluster::Membership>,
    groups: Coordinator,
    cfg: TxnConfig,
    clock: Clock,
    ids: Mutex<HashMap<String, Slot>>,
    /// Cluster mode: the links markers go to other nodes' partitions by
    /// (set once the broker exists; until then markers wait).
    peers: std::sync::OnceLock<Arc<crate::kafka::replication::peers::Forwarder>>,
    /// The timeout pass's tasks at work (at most `expiry::EXPIRE_AT_ONCE`).
    expiring: Arc<tokio::sync::Semaphore>,
    /// Ids the timeout pass found busy, with how many passes in a row.
    busy: Mutex<HashMap<String, u32>>,
}

/// How long an end waits for its markers before it answers
/// COORDINATOR_NOT_AVAILABLE (the producer retries; the timeout loop
/// finishes it meanwhile).
const MARKERS_WITHIN: Duration = Duration::from_secs(10);
/// Between rounds of markers some leader did not take.
const MARKERS_RETRY: Duration = Duration::from_millis(200);
/// Why markers were not all written.
enum MarkersFailed {
    /// A partition has a newer coordinator's marker for the producer: this
    /// node no longer coordinates the transaction.
    Fenced(String),
    Other(String),
}


/// Kafka's transaction coordinator's answer for a state append that
/// failed (the journal answers as the group coordinator maps it):
/// NOT_COORDINATOR and COORDINATOR_NOT_AVAILABLE as they are, anything
/// else (a record too large, a storage failure) UNKNOWN_SERVER_ERROR.
fn txn_append_error(code: i16) -> i16 {
    match E::try_from_code(code) {
        Some(E::NotCoordinator | E::CoordinatorNotAvailable) => code,
        _ => E::UnknownServerError.code(),
    }
}

/// Kafka's name of a state, as DescribeTransactions and ListTransactions
/// use them.
pub fn state_name(s: TxnState) -> &'static str {
    match s {
        TxnState::Empty => "Empty",
        TxnState::Ongoing => "Ongoing",
        TxnState::PrepareCommit => "PrepareCommit",
        TxnState::PrepareAbort => "PrepareAbort",
        TxnState::CompleteCommit => "CompleteCommit",
        TxnState::CompleteAbort => "CompleteAbort",
    }
}

pub const STATE_NAMES: [&str; 6] = ["Empty", "Ongoing", "PrepareCommit", "PrepareAbort", "CompleteCommit", "CompleteAbort"];

/// The code for a request from a stale epoch: PRODUCER_FENCED where the
/// request version knows it (KIP-588), else INVALID_PRODUCER_EPOCH.
pub fn fenced(knows_fenced: bool) -> i16 {
    if knows_fenced {
        E::ProducerFenced.code()
    } else {
        E::InvalidProducerEpoch.code()
    }
}

/// Checks that a request comes from the producer that holds the id now.
fn check_producer(rec: &TxnRecord, producer_id: i64, epoch: i16, knows_fenced: bool) -> Result<(), i16> {
    if producer_id != rec.producer_id {
        return Err(E::InvalidProducerIdMapping.code());
    }
    if epoch != rec.epoch {
        return Err(fenced(knows_fenced));
    }
    Ok(())
}

/// A transaction is about to take partitions or offsets: start it if it
/// has not started. Refused while an end is being written.
fn begin(rec: &mut TxnRecord, now: i64) -> Result<bool, i16> {
    match rec.state {
        TxnState::Ongoing => Ok(false),
        TxnState::PrepareCommit | TxnState::PrepareAbort => Err(E::ConcurrentTransactions.code()),
        TxnState::Empty | TxnState::CompleteCommit | TxnState::CompleteAbort => {
            rec.state = TxnState::Ongoing;
            rec.start_ms = now;
            rec.partitions.clear();
            rec.groups.clear();
            rec.offsets.clear();
            Ok(true)
        }
    }
}

/// The epoch after `epoch`, or None once it would overflow (a new producer
/// id is needed then).
fn next_epoch(epoch: i16) -> Option<i16> {
    (epoch < i16::MAX - 1).then_some(epoch + 1)
}

/// What an EndTxn of transactions v2 does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum V2End {
    /// A retry of an end that completed: answer with the producer id and
    /// epoch the producer continues with.
    Done,
    /// End the transaction (an open one, or an abort of one that wrote
    /// nothing here) under a new epoch.
    End(Marker),
    /// A retry of an end whose markers failed: finish it.
    Finish(Marker),
}

/// Kafka's EndTxn decision for transactions v2 (`endTransaction`, and the
/// table KAFKA-14563 put beside it). The epoch tells a retry from the next
/// end: a retry names the epoch before the bump (or, after the epochs ran
/// out, the previous producer id at its last epoch); a request naming the
/// current epoch is a new end.
///
/// | state          | abort, retry | abort, current | commit, retry | commit, current |
/// |----------------|--------------|----------------|---------------|-----------------|
/// | Empty          | fenced       | end (no data)  | fenced        | invalid state   |
/// | CompleteAbort  | done         | end (no data)  | invalid state | invalid state   |
/// | CompleteCommit | invalid state| end (no data)  | done          | invalid state   |
///
/// An Ongoing transaction ends at the current epoch only; a prepared one
/// (its markers failed) is finished by a retry naming the epoch before it.
fn v2_end(rec: &TxnRecord, producer_id: i64, epoch: i16, commit: bool) -> Result<V2End, i16> {
    let retry_on_bump = producer_id == rec.producer_id && i32::from(rec.epoch) == i32::from(epoch) + 1;
    let retry_on_overflow = rec.previous_producer_id >= 0 && producer_id == rec.previous_producer_id && epoch == i16::MAX - 1 && rec.epoch == 0;
    if producer_id != rec.producer_id && !retry_on_overflow {
        return Err(E::InvalidProducerIdMapping.code());
    }
    let current = producer_id == rec.producer_id && epoch == rec.epoch;
    let retry = retry_on_bump || retry_on_overflow;
    let valid = match rec.state {
        TxnState::Ongoing | TxnState::Empty => current,
        TxnState::PrepareCommit | TxnState::PrepareAbort => retry_on_bump,
        TxnState::CompleteCommit | TxnState::CompleteAbort => current || retry,
    };
    if !valid {
        return Err(E::ProducerFenced.code());
    }
    let marker = if commit { Marker::Commit } else { Marker::Abort };
    let invalid = Err(E::InvalidTxnState.code());
    match (rec.state, commit) {
        (TxnState::Ongoing, _) => Ok(V2End::End(marker)),
        (TxnState::PrepareCommit, true) | (TxnState::PrepareAbort, false) => Ok(V2End::Finish(marker)),
        (TxnState::PrepareCommit | TxnState::PrepareAbort, _) => invalid,
        (TxnState::CompleteCommit, true) | (TxnState::CompleteAbort, false) if retry => Ok(V2End::Done),
        (TxnState::CompleteCommit, true) => invalid,
        (TxnState::CompleteCommit | TxnState::CompleteAbort | TxnState::Empty, false) if !retry => Ok(V2End::End(Marker::Abort)),
        _ => invalid,
    }
}

/// The producer goes on under `new_id` at epoch 0 (its epochs ran out);
/// the old id is kept so that retries and re-inits naming it are known.
fn rotate(rec: &mut TxnRecord, new_id: i64) {
    rec.previous_producer_id = rec.producer_id;
    rec.producer_id = new_id;
    rec.epoch = 0;
    rec.last_epoch = -1;
}

/// What one transaction looks like to operators.
#[derive(Debug, Clone)]
pub struct TxnView {
    pub id: String,
    pub record: TxnRecord,
}

impl Transactions {
    /// Loads every transactional id and brings every transaction to an end
    /// (see the module docs), then starts the timeout loop.
    pub async fn start(engine: Arc<Engine>, cluster: Arc<crate::cluster::Membership>, groups: Coordinator, cfg: TxnConfig, clock: Clock, stop: watch::Receiver<bool>) -> anyhow::Result<Transactions> {
        let e = engine.clone();
        let mut records = tokio::task::spawn_blocking(move || e.catalog().txns()).await??;
        if !cluster.view().single {
            // Cluster mode: ids are loaded with their coordinator shards.
            // Records an older build left in the catalog are ignored, and
            // removed so the warning comes once.
            if !records.is_empty() {
                tracing::warn!(ids = records.len(), "the catalog holds transactional ids from a build that kept them there; the shard logs hold them now: these are ignored and removed");
                let (e, ids): (_, Vec<String>) = (engine.clone(), records.iter().map(|(id, _)| id.clone()).collect());
                let removed = tokio::task::spawn_blocking(move || -> Result<(), crate::meta::MetaError> {
                    for id in &ids {
                        e.catalog().remove_txn(id)?;
                    }
                    e.catalog().flush()
                })
                .await?;
                if let Err(err) = removed {
                    tracing::warn!(error = %err, "removing the catalog's old transactional ids failed; they stay ignored");
                }
            }
            records.clear();
        }
        let t = Transactions { inner: Arc::new(Inner { engine, cluster, groups, cfg, clock, ids: Mutex::new(HashMap::new()), peers: std::sync::OnceLock::new(), expiring: Arc::new(tokio::sync::Semaphore::new(expiry::EXPIRE_AT_ONCE)), busy: Mutex::new(HashMap::new()) }) };
        // Each producer id's transactional id, for the pass below.
        let mut owners: HashMap<i64, (String, Slot)> = HashMap::new();
        for (id, rec) in records {
            let slot: Slot = Arc::new(tokio::sync::Mutex::new(Some(rec)));
            t.inner.ids.lock().expect("txn ids lock").insert(id.clone(), slot.clone());
            let mut guard = slot.lock().await;
            let rec = guard.as_mut().expect("just loaded");
            let outcome = match rec.state {
                TxnState::PrepareCommit => t.finish(&id, &slot, rec, Marker::Commit, true).await,
                TxnState::PrepareAbort => t.finish(&id, &slot, rec, Marker::Abort, true).await,
                TxnState::Ongoing => {
                    tracing::info!(transactional_id = %id, producer_id = rec.producer_id, "aborting a transaction left open by the last run");
                    t.end(&id, &slot, rec, Marker::Abort, true).await
                }
                _ => Ok(()),
            };
            match outcome {
                // Cluster mode: a prepared end whose offsets wait for their
                // group's shard to load stays prepared; the timeout loop
                // finishes it.
                Err(code) if matches!(rec.state, TxnState::PrepareCommit | TxnState::PrepareAbort) && !t.inner.cluster.view().single => {
                    tracing::warn!(transactional_id = %id, code, "a prepared transaction is finished once its coordinator shards are loaded");
                }
                Err(code) => anyhow::bail!("recovering transaction {id:?} failed (error {code})"),
                Ok(()) => {}
            }
            owners.insert(rec.producer_id, (id, slot.clone()));
        }
        // Partitions still holding an open transaction: its record did not
        // say so (the writes that began it were not flushed yet). Abort it
        // there, and fence its producer as for any transaction a restart
        // cut short, so it cannot go on to commit the rest of it.
        // One pass per producer id, at the newest epoch it has open.
        // Single-node mode only: in a cluster a replica must not write
        // into a log it may only follow, and an open transaction there may
        // be another node's coordinator's.
        let mut dangling: HashMap<i64, (i16, Vec<Tp>)> = HashMap::new();
        let open = if t.inner.cluster.view().single { t.inner.engine.open_txns() } else { Vec::new() };
        for (tp, open) in open {
            let d = dangling.entry(open.producer_id).or_insert((open.epoch, Vec::new()));
            d.0 = d.0.max(open.epoch);
            d.1.push(tp);
        }
        for (pid, (epoch, tps)) in dangling {
            tracing::info!(producer_id = pid, partitions = tps.len(), "aborting a transaction left open in the logs by the last run");
            let mut marker_epoch = epoch;
            if let Some((id, slot)) = owners.get(&pid) {
                let mut guard = slot.lock().await;
                let rec = guard.as_mut().expect("loaded");
                match next_epoch(rec.epoch.max(epoch)) {
                    Some(next) => {
                        rec.last_epoch = rec.epoch;
                        rec.epoch = next;
                        marker_epoch = next;
                    }
                    None => {
                        // The last epoch fences on the markers; the
                        // producer goes on under a new producer id.
                        marker_epoch = i16::MAX;
                        let new_id = t.allocate().await.map_err(|code| anyhow::anyhow!("a new producer id for transaction {id:?} (error {code})"))?;
                        rotate(rec, new_id);
                    }
                }
                rec.state = TxnState::CompleteAbort;
                rec.update_ms = t.now();
                // (A failure fails the start: memory may run ahead here.)
                if let Err(code) = t.store(id, slot, Some(rec), true).await {
                    anyhow::bail!("fencing the producer of transaction {id:?} failed (error {code})");
                }
            }
            t.inner.engine.write_markers(pid, marker_epoch, Marker::Abort, &tps).await?;
        }
        tokio::spawn(expiry::timeout_loop(t.clone(), stop));
        Ok(t)
    }

    fn now(&self) -> i64 {
        (self.inner.clock)()
    }

    /// Cluster mode: the links to other nodes, once the broker exists.
    pub fn set_peers(&self, peers: Arc<crate::kafka::replication::peers::Forwarder>) {
        let _ = self.inner.peers.set(peers);
    }

    /// Writes `marker` of (`producer_id`, `epoch`) to `tps` and returns
    /// once each is durable (single-node mode), or (cluster mode) once
    /// each partition's leader has it in its in-sync replicas: every
    /// leader, this node included, is sent WriteTxnMarkers, which checks
    /// leadership and waits for the ISR, so all partitions are treated
    /// alike. A partition whose leader refuses retriably, has none, or
    /// cannot be reached is asked again at its leader in the next view,
    /// until [`MARKERS_WITHIN`]. A partition deleted meanwhile, or where
    /// the producer has a newer epoch already (another end fenced this
    /// one), needs no marker.
    ///
    /// `coordinator_epoch` is the leader epoch of the id's shard as this
    /// node loaded it: a leader that has a newer coordinator's marker for
    /// the producer refuses (TRANSACTION_COORDINATOR_FENCED), and this end
    /// stops there, its successor's to finish.
    async fn write_markers(&self, producer_id: i64, epoch: i16, coordinator_epoch: i32, marker: Marker, tps: &[Tp]) -> Result<(), MarkersFailed> {
        if self.inner.cluster.view().single {
            return self.inner.engine.write_markers(producer_id, epoch, marker, tps).await.map_err(|e| MarkersFailed::Other(e.to_string()));
        }
        let peers = self.inner.peers.get().ok_or_else(|| MarkersFailed::Other("this node is still starting".into()))?;
        let deadline = tokio::time::Instant::now() + MARKERS_WITHIN;
        // Each partition by name (a topic deleted meanwhile needs nothing).
        let mut pending: Vec<(String, i32)> = tps.iter().filter_map(|tp| self.inner.engine.topic_by_id(&tp.topic).map(|t| (t.name().to_owned(), tp.partition))).collect();
        let me = self.inner.cluster.node_id();
        let mut why = String::new();
        loop {
            let view = self.inner.cluster.view();
            let mut by_leader: std::collections::BTreeMap<i32, Vec<(String, i32)>> = std::collections::BTreeMap::new();
            let mut leaderless = Vec::new();
            for (name, p) in pending.drain(..) {
                match view.partition(me, &name, p).leader {
                    l if l >= 0 => by_leader.entry(l).or_default().push((name, p)),
                    _ => leaderless.push((name, p)),
                }
            }
            if !leaderless.is_empty() {
                why = format!("{} partitions have no leader", leaderless.len());
            }
            pending = leaderless;
            // Every leader at once.
            let mut sends = tokio::task::JoinSet::new();
            for (leader, parts) in by_leader {
                let peers = peers.clone();
                sends.spawn(async move {
                    // No call outlives the end's deadline.
                    let outcome = match tokio::time::timeout_at(deadline, send_markers(&peers, leader, producer_id, epoch, coordinator_epoch, marker, &parts)).await {
                        Ok(o) => o,
                        Err(_) => Err(format!("broker {leader} did not answer in time")),
                    };
                    (leader, parts, outcome)
                });
            }
            while let Some(done) = sends.join_next().await {
                let Ok((leader, parts, outcome)) = done else { return Err(MarkersFailed::Other("sending markers failed".into())) };
                match outcome {
                    Ok(codes) => {
                        for (at, code) in parts.into_iter().zip(codes) {
                            match E::try_from_code(code) {
                                None if code == 0 => {}
                                // Gone: only if this node's view agrees (a
                                // lagging leader may not have it yet).
                                Some(E::UnknownTopicOrPartition) if self.inner.engine.topic(&at.0).is_none_or(|t| at.1 >= t.partitions()) => {}
                                Some(E::InvalidProducerEpoch) => tracing::warn!(topic = %at.0, partition = at.1, producer_id, epoch, "a transaction marker found a newer producer epoch at its partition; none written there"),
                                Some(E::TransactionCoordinatorFenced) => return Err(MarkersFailed::Fenced(format!("{}-{} has a marker of a newer coordinator than this one (coordinator epoch {coordinator_epoch}): this node no longer coordinates the transaction", at.0, at.1))),
                                _ => {
                                    why = format!("broker {leader} refused the marker for {}-{} (error {code})", at.0, at.1);
                                    pending.push(at);
                                }
                            }
                        }
                    }
                    Err(e) => {
                        why = e;
                        pending.extend(parts);
                    }
                }
            }
            if pending.is_empty() {
                return Ok(());
            }
            if tokio::time::Instant::now() + MARKERS_RETRY >= deadline {
                return Err(MarkersFailed::Other(format!("{} partitions without their marker: {why}", pending.len())));
            }
            tokio::time::sleep(MARKERS_RETRY).await;
        }
    }

    /// Cluster mode: whether `slot` is still `id`'s here (its shard did
    /// not load again or move away since it was taken); always in
    /// single-node mode.
    fn current(&self, id: &str, slot: &Slot) -> bool {
        self.inner.cluster.view().single || self.existing(id).is_some_and(|s| Arc::ptr_eq(&s, slot))
    }

    /// The slot of an id this node knows, locked, if it is still the id's
    /// once the lock is had (cluster mode: NOT_COORDINATOR otherwise).
    async fn held(&self, id: &str) -> Result<(Slot, tokio::sync::OwnedMutexGuard<Option<TxnRecord>>), i16> {
        let slot = self.existing(id).ok_or(E::InvalidProducerIdMapping.code())?;
        let guard = slot.clone().lock_owned().await;
        if !self.current(id, &slot) {
            return Err(E::NotCoordinator.code());
        }
        Ok((slot, guard))
    }

    fn slot(&self, id: &str) -> Slot {
        self.inner.ids.lock().expect("txn ids lock").entry(id.to_owned()).or_default().clone()
    }

    fn existing(&self, id: &str) -> Option<Slot> {
        self.inner.ids.lock().expect("txn ids lock").get(id).cloned()
    }

    /// Stores `rec` as `id`'s record: in the catalog in single-node mode
    /// (`flush`: durably before returning), in the id's coordinator shard
    /// log in cluster mode, where it is answered once the shard's in-sync
    /// replicas have it (docs/cluster.md, "Transaction state"). Nothing
    /// reaches memory before this returns, so what a client was answered
    /// is what the shard's next coordinator loads.
    /// Memory (`rec`) takes `next` only once it is stored, so a refused
    /// append leaves memory as the log has it.
    async fn persist(&self, id: &str, slot: &Slot, rec: &mut TxnRecord, next: TxnRecord, flush: bool) -> Result<(), i16> {
        self.store(id, slot, Some(&next), flush).await?;
        *rec = next;
        Ok(())
    }

    /// [`Transactions::persist`], or (`None`) the removal of `id`. In
    /// cluster mode a write is refused (NOT_COORDINATOR) unless `slot` is
    /// still the id's slot here: once the shard loaded again (leadership
    /// moved away and back), an end still running on the slot it held is
    /// no one's to store, and the log's own record stands.
    async fn store(&self, id: &str, slot: &Slot, rec: Option<&TxnRecord>, flush: bool) -> Result<(), i16> {
        if !self.inner.cluster.view().single {
            let groups = &self.inner.groups;
            let journal = groups.journal().ok_or(E::CoordinatorNotAvailable.code())?;
            let shard = super::journal::shard_of(id);
            // In the shard's turn: no load replaces the slot between the
            // check and the append.
            let _turn = groups.turn(shard).await;
            if !self.current(id, slot) {
                return Err(E::NotCoordinator.code());
            }
            return journal.append(shard, vec![super::journal::Record::Txn { id: id.to_owned(), state: rec.cloned() }]).await.map_err(txn_append_error);
        }
        let engine = self.inner.engine.clone();
        let (id, rec) = (id.to_owned(), rec.cloned());
        let r = tokio::task::spawn_blocking(move || {
            match rec {
                Some(rec) => engine.catalog().put_txn(&id, &rec)?,
                None => engine.catalog().remove_txn(&id)?,
            }
            if flush {
                engine.catalog().flush()?;
            }
            Ok::<_, crate::meta::MetaError>(())
        })
        .await;
        match r {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => {
                tracing::error!(error = %e, "storing transaction state failed");
                Err(E::KafkaStorageError.code())
            }
            Err(_) => Err(E::CoordinatorNotAvailable.code()),
        }
    }

    /// Cluster mode: this node now coordinates `shard` (it loaded the
    /// shard's log; `txns` is what it says). Its transactional ids are
    /// those records, each in a new slot: a request or an end still
    /// running on an old one can no longer store anything. An ongoing
    /// transaction goes on with its timeout; a prepared one is finished by
    /// the timeout pass, or by its producer's retried EndTxn, whichever
    /// comes first. Returns how many ids the shard has.
    pub async fn load_shard(&self, shard: u32, txns: super::journal::Txns) -> usize {
        let _turn = self.inner.groups.turn(shard).await;
        let count = txns.len();
        let open = txns.values().filter(|r| !matches!(r.state, TxnState::Empty | TxnState::CompleteCommit | TxnState::CompleteAbort)).count();
        if open > 0 {
            tracing::info!(shard, open, "taking up transactions their last coordinator left open");
        }
        let mut ids = self.inner.ids.lock().expect("txn ids lock");
        ids.retain(|id, _| super::journal::shard_of(id) != shard);
        for (id, rec) in txns {
            ids.insert(id, Arc::new(tokio::sync::Mutex::new(Some(rec))));
        }
        count
    }

    /// Cluster mode: `shard` moved to another node; its transactional ids
    /// are forgotten here (their requests are answered NOT_COORDINATOR).
    pub async fn unload_shard(&self, shard: u32) {
        self.load_shard(shard, Default::default()).await;
    }

    /// Topic names to tps; partitions of topics deleted since are skipped.
    fn tps(&self, partitions: &[(String, i32)]) -> Vec<Tp> {
        partitions.iter().filter_map(|w| self.tp(w)).collect()
    }

    /// Ends the Ongoing transaction in `rec` (or, under transactions v2,
    /// one with no data to abort): the decision made durable, then markers
    /// and offsets. `bump`: the epoch moves first and the markers carry
    /// the new one — every end of transactions v2, and every end the
    /// coordinator makes on its own (timeout, a new producer, restart),
    /// which fences the producer. Epochs are handed out up to
    /// i16::MAX - 1; from there the markers take i16::MAX and the producer
    /// goes on under a new producer id at epoch 0 once the end completes.
    async fn end(&self, id: &str, slot: &Slot, rec: &mut TxnRecord, marker: Marker, bump: bool) -> Result<(), i16> {
        // The decision goes into a copy, kept only once it is durable.
        let mut next = rec.clone();
        if bump {
            next.last_epoch = next.epoch;
            match next_epoch(next.epoch) {
                Some(e) => next.epoch = e,
                None => {
                    next.epoch = i16::MAX;
                    next.next_producer_id = self.allocate().await?;
                }
            }
        }
        next.state = match marker {
            Marker::Commit => TxnState::PrepareCommit,
            Marker::Abort => TxnState::PrepareAbort,
        };
        next.update_ms = self.now();
        if !self.current(id, slot) {
            return Err(E::NotCoordinator.code());
        }
        // No batch of the transaction is admitted after this point, so all
        // of it lies below these ends (which recovery relies on).
        let known: Vec<(usize, Tp)> = next.partitions.iter().enumerate().filter_map(|(i, w)| self.tp(w).map(|tp| (i, tp))).collect();
        let ends = self.inner.engine.close_txn_partitions(next.producer_id, known.iter().map(|(_, tp)| *tp).collect()).await.map_err(|_| E::CoordinatorNotAvailable.code())?;
        next.ends = vec![-1; next.partitions.len()];
        for ((i, _), end) in known.iter().zip(ends) {
            next.ends[*i] = end;
        }
        self.persist(id, slot, rec, next, true).await?;
        self.finish(id, slot, rec, marker, false).await
    }

    /// A partition by topic name; None if the topic or partition is gone,
    /// and for internal topics (no transaction may write into them) but
    /// the coordinator topic (cluster mode): a group shard whose pending
    /// offsets the transaction's marker ends there.
    fn tp(&self, (topic, p): &(String, i32)) -> Option<Tp> {
        if crate::engine::topics::is_internal(topic) && topic != crate::cluster::topics::COORDINATOR_TOPIC {
            return None;
        }
        self.inner.engine.topic(topic).filter(|t| *p >= 0 && *p < t.partitions()).map(|t| t.tp(*p))
    }

    /// Writes the markers of a Prepare* transaction and completes it.
    /// `recovering`: at start-up, where markers written before the crash
    /// are not written again — only partitions where this producer's
    /// transaction is still open below the log end of the decision get one
    /// (a later transaction's records above it are not this one's).
    async fn finish(&self, id: &str, slot: &Slot, rec: &mut TxnRecord, marker: Marker, recovering: bool) -> Result<(), i16> {
        // (Single-node mode: in a cluster the logs here may be copies, and
        // partitions elsewhere have none; every partition gets a marker.)
        let tps: Vec<Tp> = if recovering && self.inner.cluster.view().single {
            let open = self.inner.engine.open_txns();
            rec.partitions
                .iter()
                .zip(rec.ends.iter().copied().chain(std::iter::repeat(i64::MAX)))
                .filter_map(|(w, end)| self.tp(w).filter(|tp| open.iter().any(|(t, o)| t == tp && o.producer_id == rec.producer_id && o.first_offset < end)))
                .collect()
        } else {
            self.tps(&rec.partitions)
        };
        // Cluster mode: the markers carry the shard's leader epoch, which
        // is the one this slot was loaded in while the slot is current.
        let coordinator_epoch = if self.inner.cluster.view().single {
            0
        } else {
            match self.inner.groups.journal().and_then(|j| j.epoch(super::journal::shard_of(id))) {
                Some(e) if self.current(id, slot) => e,
                // The shard moved away (or loaded again): its coordinator
                // now finishes this.
                _ => return Err(E::NotCoordinator.code()),
            }
        };
        match self.write_markers(rec.producer_id, rec.epoch, coordinator_epoch, marker, &tps).await {
            Ok(()) => {}
            Err(MarkersFailed::Fenced(e)) => {
                tracing::warn!(transactional_id = %id, error = %e, "a newer coordinator has this transaction; this node stops ending it");
                return Err(E::NotCoordinator.code());
            }
            Err(MarkersFailed::Other(e)) => {
                tracing::error!(transactional_id = %id, error = %e, "writing transaction markers failed; the transaction stays prepared and is retried");
                return Err(E::CoordinatorNotAvailable.code());
            }
        }
        if marker == Marker::Commit && !rec.offsets.is_empty() {
            for group in rec.offsets.iter().map(|o| o.group.clone()).collect::<std::collections::BTreeSet<_>>() {
                // Registers the group with the coordinator (listed, counted).
                let _ = self.inner.groups.txn_commit_check(group, super::CommitIds { generation: -1, member_id: String::new(), instance_id: None }).await;
            }
            let rows = rec.offsets.iter().map(|o| (o.group.clone(), o.topic.clone(), o.partition, o.record.clone())).collect();
            if let Err(e) = self.inner.groups.store_offsets(rows).await {
                tracing::error!(transactional_id = %id, error = %e, "storing a transaction's offsets failed; the transaction stays prepared and is retried");
                return Err(E::CoordinatorNotAvailable.code());
            }
        }
        let mut next = rec.clone();
        next.state = match marker {
            Marker::Commit => TxnState::CompleteCommit,
            Marker::Abort => TxnState::CompleteAbort,
        };
        next.partitions.clear();
        next.groups.clear();
        next.offsets.clear();
        next.ends.clear();
        next.start_ms = -1;
        next.update_ms = self.now();
        if next.next_producer_id >= 0 {
            // The markers took the last epoch: go on under the new id.
            let new_id = std::mem::replace(&mut next.next_producer_id, -1);
            rotate(&mut next, new_id);
        }
        // Not flushed: were it lost, the Prepare* record finishes again at
        // start-up (see `recovering`).
        self.persist(id, slot, rec, next, false).await
    }

    /// InitProducerId with a transactional id.
    pub async fn init(&self, id: &str, timeout_ms: i32, producer_id: i64, epoch: i16, version: i16) -> Result<(i64, i16), i16> {
        if timeout_ms <= 0 || timeout_ms > self.inner.cfg.max_timeout_ms {
            return Err(E::InvalidTransactionTimeout.code());
        }
        let (slot, mut guard) = loop {
            let slot = self.slot(id);
            let guard = slot.clone().lock_owned().await;
            // An id expired (or its shard loaded again) while this waited
            // for its lock: its slot left the map; take the one there now.
            if self.existing(id).is_some_and(|s| Arc::ptr_eq(&s, &slot)) {
                break (slot, guard);
            }
        };
        let now = self.now();
        let Some(rec) = guard.as_mut() else {
            let pid = self.allocate().await?;
            let rec = TxnRecord {
                producer_id: pid,
                epoch: 0,
                last_epoch: -1,
                state: TxnState::Empty,
                timeout_ms,
                start_ms: -1,
                update_ms: now,
                partitions: Vec::new(),
                groups: Vec::new(),
                offsets: Vec::new(),
                ends: Vec::new(),
                previous_producer_id: -1,
                next_producer_id: -1,
            };
            self.store(id, &slot, Some(&rec), true).await?;
            *guard = Some(rec);
            return Ok((pid, 0));
        };
        // KIP-360: a producer naming its id and epoch re-initialises only
        // if it is the current holder (or was, before a timeout bump, or
        // before its epochs ran out and it got a new id).
        let current = producer_id == rec.producer_id && (epoch == rec.epoch || epoch == rec.last_epoch);
        let rotated = producer_id == rec.previous_producer_id && epoch >= i16::MAX - 1;
        if producer_id >= 0 && !current && !rotated {
            return Err(fenced(version >= 4));
        }
        match rec.state {
            TxnState::PrepareCommit => self.finish(id, &slot, rec, Marker::Commit, false).await?,
            TxnState::PrepareAbort => self.finish(id, &slot, rec, Marker::Abort, false).await?,
            TxnState::Ongoing => self.end(id, &slot, rec, Marker::Abort, true).await?,
            _ => {}
        }
        let mut next = rec.clone();
        match next_epoch(next.epoch) {
            Some(e) => next.epoch = e,
            None => {
                let new_id = self.allocate().await?;
                rotate(&mut next, new_id);
            }
        }
        next.last_epoch = -1;
        next.state = TxnState::Empty;
        next.timeout_ms = timeout_ms;
        next.update_ms = now;
        self.persist(id, &slot, rec, next, true).await?;
        Ok((rec.producer_id, rec.epoch))
    }

    async fn allocate(&self) -> Result<i64, i16> {
        crate::kafka::allocate_producer_id(&self.inner.engine, &self.inner.cluster).await
    }

    /// AddPartitionsToTxn for one transaction. Returns a code for the whole
    /// transaction, or per partition (in request order).
    pub async fn add_partitions(&self, id: &str, producer_id: i64, epoch: i16, wanted: &[(String, i32)], verify_only: bool, version: i16) -> Result<Vec<i16>, i16> {
        let (slot, mut guard) = self.held(id).await?;
        let rec = guard.as_mut().ok_or(E::InvalidProducerIdMapping.code())?;
        check_producer(rec, producer_id, epoch, version >= 2)?;
        // Sets, not list scans: a request may name many partitions, and
        // name them many times (each occurrence is answered, as in Kafka).
        if verify_only {
            let ongoing = rec.state == TxnState::Ongoing;
            let have: HashSet<&(String, i32)> = rec.partitions.iter().collect();
            return Ok(wanted.iter().map(|w| if ongoing && have.contains(w) { 0 } else { E::InvalidTxnState.code() }).collect());
        }
        if matches!(rec.state, TxnState::PrepareCommit | TxnState::PrepareAbort) {
            return Err(E::ConcurrentTransactions.code());
        }
        let mut tps = Vec::with_capacity(wanted.len());
        let mut seen = HashSet::new();
        // Only brokers (v4+) name a coordinator shard: a group coordinator
        // asking for the transaction's offsets.
        let codes: Vec<i16> = wanted
            .iter()
            .map(|w| match self.tp(w).filter(|_| version >= 4 || !crate::engine::topics::is_internal(&w.0)) {
                Some(tp) => {
                    if seen.insert(tp) {
                        tps.push(tp);
                    }
                    0
                }
                None => E::UnknownTopicOrPartition.code(),
            })
            .collect();
        if codes.iter().any(|&c| c != 0) {
            // Kafka adds all or nothing: the rest were not attempted.
            return Ok(codes.into_iter().map(|c| if c == 0 { E::OperationNotAttempted.code() } else { c }).collect());
        }
        // Changes go into a copy, kept once stored.
        let mut next = rec.clone();
        let began = begin(&mut next, self.now())?;
        let mut changed = began;
        // After `begin`: a new transaction starts with no partitions.
        let mut have: HashSet<(String, i32)> = next.partitions.iter().cloned().collect();
        for w in wanted {
            if have.insert(w.clone()) {
                next.partitions.push(w.clone());
                changed = true;
            }
        }
        if changed {
            next.update_ms = self.now();
            // The start of a transaction is flushed: were it lost, a retry
            // of its EndTxn would find the last transaction complete and
            // answer success for one never decided.
            self.persist(id, &slot, rec, next, began).await?;
        }
        self.inner.engine.add_txn_partitions(rec.producer_id, rec.epoch, &tps);
        Ok(codes)
    }

    /// The partitions a transactional Produce of transactions v2 (v12+)
    /// writes join its transaction, beginning it if need be, as Kafka's
    /// partition leader asks its coordinator (AddPartitionsToTxn, not
    /// verify-only) before it appends. Partitions are known to exist.
    /// Returns a code per partition, in order. A partition whose topic
    /// went meanwhile is UNKNOWN_TOPIC_OR_PARTITION and does not hold the
    /// others back.
    pub async fn add_produced(&self, id: &str, producer_id: i64, epoch: i16, partitions: &[(String, i32)]) -> Vec<i16> {
        let (known, gone): (Vec<usize>, Vec<usize>) = (0..partitions.len()).partition(|&i| self.tp(&partitions[i]).is_some());
        let wanted: Vec<(String, i32)> = known.iter().map(|&i| partitions[i].clone()).collect();
        let mut codes = vec![0; partitions.len()];
        for i in gone {
            codes[i] = E::UnknownTopicOrPartition.code();
        }
        if wanted.is_empty() {
            return codes;
        }
        match self.add_partitions(id, producer_id, epoch, &wanted, false, 5).await {
            Ok(answered) => known.into_iter().zip(answered).for_each(|(i, c)| codes[i] = c),
            Err(code) => known.into_iter().for_each(|i| codes[i] = code),
        }
        codes
    }

    /// AddOffsetsToTxn.
    pub async fn add_offsets(&self, id: &str, producer_id: i64, epoch: i16, group: &str, version: i16) -> Result<(), i16> {
        let (slot, mut guard) = self.held(id).await?;
        let rec = guard.as_mut().ok_or(E::InvalidProducerIdMapping.code())?;
        check_producer(rec, producer_id, epoch, version >= 2)?;
        // Changes go into a copy, kept once stored.
        let mut next = rec.clone();
        let began = begin(&mut next, self.now())?;
        let mut changed = began;
        if !next.groups.iter().any(|g| g == group) {
            next.groups.push(group.to_owned());
            changed = true;
        }
        // Cluster mode: the group's shard is one of the transaction's
        // partitions, so its end's marker reaches the group's coordinator,
        // which holds the offsets (Kafka's `__consumer_offsets` partition).
        if !self.inner.cluster.view().single {
            let shard = (crate::cluster::topics::COORDINATOR_TOPIC.to_owned(), super::journal::shard_of(group) as i32);
            if !next.partitions.contains(&shard) {
                next.partitions.push(shard);
                changed = true;
            }
        }
        if changed {
            next.update_ms = self.now();
            self.persist(id, &slot, rec, next, began).await?;
        }
        Ok(())
    }

    /// TxnOffsetCommit: the offsets wait in the transaction until it
    /// commits. `offsets`: (topic, partition, offset, leader epoch,
    /// metadata); returns a code per entry.
    #[allow(clippy::too_many_arguments)]
    pub async fn commit_offsets(
        &self,
        id: &str,
        group: &str,
        producer_id: i64,
        epoch: i16,
        member: (i32, String, Option<String>),
        offsets: Vec<(String, i32, i64, i32, Option<String>)>,
        version: i16,
    ) -> Result<Vec<i16>, i16> {
        let (slot, mut guard) = self.held(id).await?;
        let rec = guard.as_mut().ok_or(E::InvalidProducerIdMapping.code())?;
        check_producer(rec, producer_id, epoch, version >= 3)?;
        // From v5 (transactions v2) the commit brings its group into the
        // transaction, beginning it if need be; before, AddOffsetsToTxn did.
        match rec.state {
            TxnState::Ongoing => {}
            TxnState::PrepareCommit | TxnState::PrepareAbort if version >= 5 => return Err(E::ConcurrentTransactions.code()),
            _ if version >= 5 => {}
            _ => return Err(E::InvalidTxnState.code()),
        }
        let (generation, member_id, instance) = member;
        match self.inner.groups.txn_commit_check(group.to_owned(), super::CommitIds { generation, member_id, instance_id: instance }).await {
            Some(Ok(())) => {}
            Some(Err(code)) => return Err(code),
            None => return Err(E::CoordinatorNotAvailable.code()),
        }
        // Changes go into a copy, kept once stored.
        let mut next = rec.clone();
        let began = begin(&mut next, self.now())?;
        let now = self.now();
        let mut codes = Vec::with_capacity(offsets.len());
        // Where each (group, topic, partition) already sits: a later commit
        // of the same partition replaces it in place (the last one wins).
        let mut at: HashMap<(String, String, i32), usize> = next.offsets.iter().enumerate().map(|(i, o)| ((o.group.clone(), o.topic.clone(), o.partition), i)).collect();
        for (topic, partition, offset, leader_epoch, metadata) in offsets {
            let code = if self.tp(&(topic.clone(), partition)).is_none() {
                E::UnknownTopicOrPartition.code()
            } else if metadata.as_ref().is_some_and(|m| m.len() > crate::kafka::handlers::offset_commit::MAX_METADATA_BYTES) {
                E::OffsetMetadataTooLarge.code()
            } else {
                let record = OffsetRecord { offset, leader_epoch, metadata, commit_ms: now };
                match at.entry((group.to_owned(), topic.clone(), partition)) {
                    std::collections::hash_map::Entry::Occupied(e) => next.offsets[*e.get()].record = record,
                    std::collections::hash_map::Entry::Vacant(e) => {
                        e.insert(next.offsets.len());
                        next.offsets.push(TxnOffset { group: group.to_owned(), topic, partition, record });
                    }
                }
                0
            };
            codes.push(code);
        }
        if !next.groups.iter().any(|g| g == group) {
            next.groups.push(group.to_owned());
        }
        next.update_ms = now;
        // A transaction begun here is flushed, as in `add_partitions`.
        self.persist(id, &slot, rec, next, began).await?;
        Ok(codes)
    }

    /// EndTxn. Returns the producer id and epoch the producer continues
    /// with (EndTxn v5 answers them; from transactions v2 on, version 5,
    /// every end moves the epoch).
    pub async fn end_txn(&self, id: &str, producer_id: i64, epoch: i16, commit: bool, version: i16) -> Result<(i64, i16), i16> {
        let (slot, mut guard) = self.held(id).await?;
        let rec = guard.as_mut().ok_or(E::InvalidProducerIdMapping.code())?;
        if version >= 5 {
            match v2_end(rec, producer_id, epoch, commit)? {
                V2End::Done => {}
                V2End::End(marker) => self.end(id, &slot, rec, marker, true).await?,
                V2End::Finish(marker) => self.finish(id, &slot, rec, marker, false).await?,
            }
            return Ok((rec.producer_id, rec.epoch));
        }
        check_producer(rec, producer_id, epoch, version >= 2)?;
        let marker = if commit { Marker::Commit } else { Marker::Abort };
        match (rec.state, commit) {
            (TxnState::Ongoing, _) => self.end(id, &slot, rec, marker, false).await?,
            // A retry of an end that went through.
            (TxnState::CompleteCommit, true) | (TxnState::CompleteAbort, false) => {}
            // An end whose markers failed earlier: finish it now.
            (TxnState::PrepareCommit, true) => self.finish(id, &slot, rec, Marker::Commit, false).await?,
            (TxnState::PrepareAbort, false) => self.finish(id, &slot, rec, Marker::Abort, false).await?,
            (TxnState::PrepareCommit | TxnState::PrepareAbort, _) => return Err(E::ConcurrentTransactions.code()),
            _ => return Err(E::InvalidTxnState.code()),
        }
        Ok((rec.producer_id, rec.epoch))
    }

    /// Whether TxnOffsetCommit for `group` has offsets waiting in an open
    /// transaction for `(topic, partition)` (OffsetFetch with
    /// require_stable answers UNSTABLE_OFFSET_COMMIT then).
    /// One pass over the open transactions for all of `groups`.
    /// (Cluster mode: the group coordinator holds them, not this one.)
    pub async fn pending_offsets(&self, groups: &HashSet<String>) -> HashMap<String, HashSet<(String, i32)>> {
        if !self.inner.cluster.view().single {
            return self.inner.groups.pending_txn_offsets(groups);
        }
        let slots: Vec<Slot> = self.inner.ids.lock().expect("txn ids lock").values().cloned().collect();
        let mut out: HashMap<String, HashSet<(String, i32)>> = HashMap::new();
        for slot in slots {
            let guard = slot.lock().await;
            if let Some(rec) = guard.as_ref() {
                for o in rec.offsets.iter().filter(|o| groups.contains(&o.group)) {
                    out.entry(o.group.clone()).or_default().insert((o.topic.clone(), o.partition));
                }
            }
        }
        out
    }

    /// The state of the named ids (None: unknown).
    pub async fn describe(&self, ids: &[String]) -> Vec<Option<TxnRecord>> {
        let mut out = Vec::with_capacity(ids.len());
        for id in ids {
            out.push(match self.existing(id) {
                Some(slot) => slot.lock().await.clone(),
                None => None,
            });
        }
        out
    }

    /// Every transactional id's state.
    pub async fn list(&self) -> Vec<TxnView> {
        let mut slots: Vec<(String, Slot)> = self.inner.ids.lock().expect("txn ids lock").iter().map(|(k, v)| (k.clone(), v.clone())).collect();
        slots.sort_by(|a, b| a.0.cmp(&b.0));
        let mut out = Vec::with_capacity(slots.len());
        for (id, slot) in slots {
            if let Some(record) = slot.lock().await.clone() {
                out.push(TxnView { id, record });
            }
        }
        out
    }

    pub fn now_ms(&self) -> i64 {
        self.now()
    }
}


#[cfg(test)]
mod tests {
    use super::*;

    fn rec(state: TxnState) -> TxnRecord {
        TxnRecord {
            producer_id: 7,
            epoch: 3,
            last_epoch: -1,
            state,
            timeout_ms: 1000,
            start_ms: -1,
            update_ms: 0,
            partitions: vec![("t".into(), 0)],
            groups: vec![],
            offsets: vec![],
            ends: vec![],
            previous_producer_id: -1,
            next_producer_id: -1,
        }
    }

    /// Cluster mode keeps transactional ids in the coordinator shards'
    /// logs: ids an older build left in the catalog are not loaded, and
    /// are removed at the start that finds them (the warning comes once).
    /// Single-node mode loads them as before.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn cluster_mode_drops_the_ids_an_older_build_left_in_the_catalog() {
        use crate::cluster::{ClusterView, Membership, NodeRecord};
        let dir = tempfile::tempdir().unwrap();
        let clock = crate::engine::system_clock();
        let me = NodeRecord { id: 1, rack: None, incarnation: 0, endpoints: vec![] };
        let start = |engine: Arc<Engine>, cluster: Membership| {
            let clock = clock.clone();
            async move {
                let (_stop_tx, stop) = watch::channel(false);
                let groups = Coordinator::start(engine.clone(), crate::kafka::coordinator::GroupConfig::default(), crate::kafka::coordinator::ConsumerConfig::default(), clock.clone(), stop.clone());
                let cfg = TxnConfig { check_every: std::time::Duration::from_secs(3600), ..TxnConfig::default() };
                Transactions::start(engine, Arc::new(cluster), groups, cfg, clock, stop).await.unwrap()
            }
        };
        let engine = Engine::open(crate::engine::EngineConfig::new(dir.path()), clock.clone()).unwrap();
        for id in ["old", "older"] {
            engine.catalog().put_txn(id, &TxnRecord { state: TxnState::CompleteCommit, partitions: vec![], ..rec(TxnState::Empty) }).unwrap();
        }
        engine.catalog().flush().unwrap();
        // Single-node mode: loaded, kept.
        let t = start(engine.clone(), Membership::single("c".into(), me.clone())).await;
        assert!(t.describe(&["old".to_string()]).await[0].is_some());
        assert_eq!(engine.catalog().txns().unwrap().len(), 2);
        drop(t);
        // Cluster mode: neither loaded nor kept.
        let view = ClusterView { single: false, cluster_id: "c".into(), nodes: std::collections::BTreeMap::from([(1, me.clone())]), ..ClusterView::default() };
        let t = start(engine.clone(), Membership::fixed(me, view)).await;
        assert!(engine.catalog().txns().unwrap().is_empty(), "removed from the catalog");
        assert!(t.describe(&["old".to_string()]).await[0].is_none());
    }

    /// Kafka's table for EndTxn under transactions v2: the producer (7)
    /// holds epoch 3; a retry names 2, the epoch before the last end.
    #[test]
    fn transactions_v2_ends_tell_retries_from_new_ends_by_epoch() {
        use TxnState::*;
        let (fenced, invalid) = (Err(E::ProducerFenced.code()), Err(E::InvalidTxnState.code()));
        let end = |s: TxnState, epoch: i16, commit: bool| v2_end(&rec(s), 7, epoch, commit);
        let (commit, abort) = (true, false);
        // Empty: an abort at the current epoch ends a transaction with no
        // data (the client added partitions it never wrote to); commit is
        // refused; a retry epoch is a zombie.
        assert_eq!(end(Empty, 3, abort), Ok(V2End::End(Marker::Abort)));
        assert_eq!(end(Empty, 2, abort), fenced);
        assert_eq!(end(Empty, 3, commit), invalid);
        assert_eq!(end(Empty, 2, commit), fenced);
        // CompleteAbort: a retried abort is done; a new abort ends an empty
        // transaction; a commit is refused.
        assert_eq!(end(CompleteAbort, 2, abort), Ok(V2End::Done));
        assert_eq!(end(CompleteAbort, 3, abort), Ok(V2End::End(Marker::Abort)));
        assert_eq!(end(CompleteAbort, 2, commit), invalid);
        assert_eq!(end(CompleteAbort, 3, commit), invalid);
        // CompleteCommit: a retried commit is done; a retried abort is not
        // what happened; a new abort ends an empty transaction.
        assert_eq!(end(CompleteCommit, 2, commit), Ok(V2End::Done));
        assert_eq!(end(CompleteCommit, 3, commit), invalid);
        assert_eq!(end(CompleteCommit, 2, abort), invalid);
        assert_eq!(end(CompleteCommit, 3, abort), Ok(V2End::End(Marker::Abort)));
        // Ongoing: ends at the current epoch only.
        assert_eq!(end(Ongoing, 3, commit), Ok(V2End::End(Marker::Commit)));
        assert_eq!(end(Ongoing, 3, abort), Ok(V2End::End(Marker::Abort)));
        assert_eq!(end(Ongoing, 2, commit), fenced);
        assert_eq!(end(Ongoing, 4, commit), fenced);
        // Prepared (markers failed): the retry finishes it, the other
        // result is refused, the current epoch is not a retry.
        assert_eq!(end(PrepareCommit, 2, commit), Ok(V2End::Finish(Marker::Commit)));
        assert_eq!(end(PrepareCommit, 2, abort), invalid);
        assert_eq!(end(PrepareAbort, 2, abort), Ok(V2End::Finish(Marker::Abort)));
        assert_eq!(end(PrepareAbort, 3, abort), fenced);
        // Older or newer epochs and other producers.
        assert_eq!(end(CompleteCommit, 1, commit), fenced);
        assert_eq!(end(CompleteCommit, 4, commit), fenced);
        assert_eq!(v2_end(&rec(Ongoing), 8, 3, true), Err(E::InvalidProducerIdMapping.code()));
        // After the epochs ran out the producer goes on as 9 at epoch 0; a
        // retry names 7 at the last epoch handed out.
        let rotated = TxnRecord { producer_id: 9, epoch: 0, previous_producer_id: 7, ..rec(CompleteCommit) };
        assert_eq!(v2_end(&rotated, 7, i16::MAX - 1, true), Ok(V2End::Done));
        assert_eq!(v2_end(&rotated, 7, i16::MAX - 1, false), invalid);
        assert_eq!(v2_end(&rotated, 7, 5, true), Err(E::InvalidProducerIdMapping.code()));
        assert_eq!(v2_end(&rotated, 9, 0, false), Ok(V2End::End(Marker::Abort)));
        // A record that never rotated has no previous id: -1 is no one's.
        let fresh = TxnRecord { epoch: 0, ..rec(CompleteCommit) };
        assert_eq!(v2_end(&fresh, -1, i16::MAX - 1, true), Err(E::InvalidProducerIdMapping.code()));
    }

    #[test]
    fn only_the_current_producer_and_epoch_pass() {
        let r = rec(TxnState::Empty);
        assert_eq!(check_producer(&r, 7, 3, true), Ok(()));
        assert_eq!(check_producer(&r, 8, 3, true), Err(E::InvalidProducerIdMapping.code()));
        assert_eq!(check_producer(&r, 7, 2, true), Err(E::ProducerFenced.code()));
        assert_eq!(check_producer(&r, 7, 2, false), Err(E::InvalidProducerEpoch.code()));
    }

    #[test]
    fn a_transaction_begins_once_and_not_while_it_ends() {
        for s in [TxnState::Empty, TxnState::CompleteCommit, TxnState::CompleteAbort] {
            let mut r = rec(s);
            assert_eq!(begin(&mut r, 50), Ok(true));
            assert_eq!((r.state, r.start_ms), (TxnState::Ongoing, 50));
            assert!(r.partitions.is_empty(), "the last transaction's partitions are gone");
            assert_eq!(begin(&mut r, 60), Ok(false));
            assert_eq!(r.start_ms, 50);
        }
        for s in [TxnState::PrepareCommit, TxnState::PrepareAbort] {
            assert_eq!(begin(&mut rec(s), 0), Err(E::ConcurrentTransactions.code()));
        }
        assert_eq!(next_epoch(5), Some(6));
        assert_eq!(next_epoch(i16::MAX - 1), None);
    }
}

/// WriteTxnMarkers for `parts` (topic, partition) at `leader`: each
/// partition's code, in order, or why there is no answer.
async fn send_markers(peers: &crate::kafka::replication::peers::Forwarder, leader: i32, producer_id: i64, epoch: i16, coordinator_epoch: i32, marker: Marker, parts: &[(String, i32)]) -> Result<Vec<i16>, String> {
    use kafka_protocol::messages::write_txn_markers_request::{WritableTxnMarker, WritableTxnMarkerTopic};
    use kafka_protocol::messages::{ProducerId, TopicName, WriteTxnMarkersRequest};
    use kafka_protocol::protocol::StrBytes;
    let topics = crate::protocol::txn::by_topic(parts.iter().map(|(n, p)| (n.as_str(), *p)))
        .into_iter()
        .map(|(name, ps)| WritableTxnMarkerTopic::default().with_name(TopicName(StrBytes::from_string(name.to_owned()))).with_partition_indexes(ps))
        .collect();
    let req = WriteTxnMarkersRequest::default().with_markers(vec![WritableTxnMarker::default()
        .with_producer_id(ProducerId(producer_id))
        .with_producer_epoch(epoch)
        .with_transaction_result(marker == Marker::Commit)
        .with_coordinator_epoch(coordinator_epoch)
        .with_topics(topics)]);
    let body = peers.call(leader, crate::kafka::replication::peers::Lane::Markers, kafka_protocol::messages::ApiKey::WriteTxnMarkers, crate::protocol::txn::WRITE_TXN_MARKERS_VERSION, &req).await.map_err(|e| e.to_string())?;
    let answer = crate::protocol::txn::decode_markers(&body).map_err(|e| format!("broker {leader}'s answer does not decode: {e}"))?;
    answer.codes(producer_id, parts).into_iter().zip(parts).map(|(code, (name, p))| code.ok_or_else(|| format!("broker {leader}'s answer has no {name}-{p}"))).collect()
}
