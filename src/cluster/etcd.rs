//! A node's session with the cluster's etcd: registration under a lease,
//! the lease kept alive (and the local [`Fence`] with it), the controller
//! campaign, and the watch that keeps the [`ClusterView`] current.
//!
//! - **Registration.** `nodes/<id>` is created under the node's lease by a
//!   transaction that requires the key to be absent: two live processes
//!   never share a node id. A restarted node waits for its previous
//!   incarnation's lease to lapse (at most one session timeout), then
//!   registers with a new incarnation (the key's new create revision).
//! - **Keep-alive.** Every heartbeat interval; each acknowledged one moves
//!   the fence to its send time plus the TTL etcd granted, minus 5%. A
//!   lease etcd no longer knows (TTL 0 on a keep-alive stream, or a stream
//!   that cannot be reopened for it) revokes the fence at once and the
//!   node registers again with a new lease. No keep-alive acknowledged for
//!   a session (a dead path to etcd) lets the fence lapse, and the watch
//!   starts again from a full read.
//! - **Controller.** Whenever the view has no controller, a node in good
//!   standing tries to create `controller` under its lease (a
//!   create-if-absent transaction); the key's create revision is the
//!   controller epoch. The lease ends with the node, and so does its
//!   controllership.
//! - **Watch.** A full read of the prefix, then a watch from the next
//!   revision; if the watch fails or is compacted away, the node reads
//!   everything again. Requests carry etcd's `require leader` flag, so a
//!   node attached to an etcd member cut off from its quorum gets errors
//!   instead of a silent watch.
//! - **Leaving.** A clean stop revokes the lease: the others see the node
//!   go at once instead of after the session timeout.

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use etcd_client::{Client, Compare, CompareOp, ConnectOptions, EventType, GetOptions, PutOptions, Txn, TxnOp, TxnOpResponse, WatchOptions};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::keys::Keys;
use super::topics::{self, TopicEntry, UnitRecord};
use crate::engine::{EngineError, TopicDirectory};
use crate::meta::TopicRecord;
use super::{boot_now, ClusterConfig, ClusterView, Fence, IdBlocks, KeyEvent, Membership, NodeRecord, ViewBuilder, PRODUCER_ID_BLOCK};

/// A running session: the membership handlers read, and the task that
/// keeps it (it ends, revoking the lease, when `stop` turns true).
pub struct Session {
    pub membership: Arc<Membership>,
    pub task: JoinHandle<()>,
    client: Client,
    keys: Keys,
}

/// Connects, registers `me` (its incarnation becomes its registration's
/// create revision) and starts the session; returns once the node is
/// registered, holds a block of producer ids and has read the cluster once.
///
/// `producer_id_floor`: ids below it were handed out by this node before
/// (its catalog's counter, which `reserve` raises); its blocks start at or
/// above it.
pub async fn join(cfg: ClusterConfig, me: NodeRecord, producer_id_floor: i64, reserve: Reserve, stop: watch::Receiver<bool>) -> anyhow::Result<Session> {
    // No HTTP/2 keep-alive pings: etcd refuses pings more often than every
    // 5 s and drops the connection. A dead path shows as unanswered lease
    // keep-alives, and the lapsed fence makes the watch start again.
    let opts = ConnectOptions::new().with_connect_timeout(Duration::from_secs(5)).with_timeout(Duration::from_secs(5)).with_require_leader(true);
    let mut client = Client::connect(&cfg.etcd_endpoints, Some(opts)).await.with_context(|| format!("connecting to etcd at {:?}", cfg.etcd_endpoints))?;
    let keys = Keys::new(&cfg.cluster_name);
    let cluster_id = cluster_id(&mut client, &keys).await.with_context(|| format!("etcd at {:?}", cfg.etcd_endpoints))?;
    let ttl_s = cfg.session_timeout_ms.div_ceil(1000).max(1) as i64;
    let fence = Arc::new(Fence::lapsed());
    let lease = Arc::new(AtomicI64::new(0));
    let mut s = State { client, keys, cluster_id, cfg, me, fence: fence.clone(), lease: lease.clone(), ttl_s, balanced_at: Instant::now() };
    let mut stopping = stop.clone();
    if !s.register(&mut stopping).await? {
        bail!("stopped while registering");
    }
    // The first block before the first read: the view then already says
    // that its ids are real.
    let producer_ids = Arc::new(ProducerIds {
        client: s.client.clone(),
        key: s.keys.producer_ids(),
        floor: producer_id_floor,
        reserve,
        blocks: tokio::sync::Mutex::new(IdBlocks::default()),
        claiming: std::sync::atomic::AtomicBool::new(false),
        last_read: tokio::sync::Mutex::new(None),
    });
    let first_block = producer_ids.claim().await.context("taking a block of producer ids")?;
    producer_ids.blocks.lock().await.add(first_block);
    let (builder, revision) = s.read_all().await?;
    let (tx, rx) = watch::channel(Arc::new(builder.view().clone()));
    let shards = Arc::new(Shards { client: s.client.clone(), keys: s.keys.clone(), view: rx.clone(), rf: s.cfg.offsets_replication_factor, creating: std::sync::atomic::AtomicBool::new(false) });
    let membership = Arc::new(Membership::new(&s.me, rx, fence.clone(), producer_ids, shards));
    tracing::info!(node_id = s.me.id, incarnation = s.me.incarnation, cluster = %s.cfg.cluster_name, nodes = builder.view().nodes.len(), "joined the cluster");
    let keeper = tokio::spawn(keep_alive(s.client.clone(), lease.clone(), fence.clone(), Duration::from_millis(s.cfg.heartbeat_interval_ms), stop.clone()));
    let mut client = s.client.clone();
    let (session_client, session_keys) = (s.client.clone(), s.keys.clone());
    let session = tokio::spawn(s.run(builder, revision, tx, stop));
    // The keep-alive ends with the session, however it ends: a session that
    // dies (a panic) must not leave the node registered and looking like a
    // member. It says so, the fence falls and the lease is revoked.
    let task = tokio::spawn(async move {
        let ended = session.await;
        keeper.abort();
        if let Err(e) = ended {
            fence.revoke();
            tracing::error!(error = %e, "the cluster session failed; this node no longer follows the cluster");
            let id = lease.swap(0, Ordering::AcqRel);
            if id != 0 {
                let _ = tokio::time::timeout(Duration::from_secs(5), client.lease_revoke(id)).await;
            }
        }
    });
    Ok(Session { membership, task, client: session_client, keys: session_keys })
}

/// The cluster id: created by the first node to ask, read by the rest.
async fn cluster_id(client: &mut Client, keys: &Keys) -> anyhow::Result<String> {
    let fresh = crate::engine::short_id(&uuid::Uuid::new_v4());
    let txn = Txn::new()
        .when([Compare::create_revision(keys.cluster_id(), CompareOp::Equal, 0)])
        .and_then([TxnOp::put(keys.cluster_id(), fresh.clone(), None)])
        .or_else([TxnOp::get(keys.cluster_id(), None)]);
    let resp = client.txn(txn).await.context("reading the cluster id")?;
    if resp.succeeded() {
        return Ok(fresh);
    }
    for op in resp.op_responses() {
        if let TxnOpResponse::Get(g) = op {
            if let Some(kv) = g.kvs().first() {
                return String::from_utf8(kv.value().to_vec()).context("the cluster id is not UTF-8");
            }
        }
    }
    bail!("the cluster id key vanished while it was read")
}

/// Records durably, before a block's ids are used, that ids below the
/// given bound were handed out by this node (its catalog's counter): a
/// later start, in either mode, never hands them out again, even if etcd's
/// counter were lost.
pub type Reserve = Arc<dyn Fn(i64) -> Result<(), String> + Send + Sync>;

/// Cluster mode's producer ids: blocks of [`PRODUCER_ID_BLOCK`] taken
/// from the `producer_ids` counter by compare-and-swap (KIP-730), so no
/// two nodes ever hand out the same id. The next block is taken in the
/// background once half of the current one is used, so a request waits
/// on etcd only when the node holds no id at all (then, after 5 s, it is
/// answered COORDINATOR_LOAD_IN_PROGRESS, as Kafka's ProducerIdManager
/// answers). Ids of a block a node took and did not hand out before it
/// stopped are never used.
pub struct ProducerIds {
    client: Client,
    key: Vec<u8>,
    floor: i64,
    reserve: Reserve,
    blocks: tokio::sync::Mutex<IdBlocks>,
    /// A background claim is running (or backing off after a failure).
    claiming: std::sync::atomic::AtomicBool,
    /// The last [`ProducerIds::end_now`] read: when, and what it said.
    last_read: tokio::sync::Mutex<Option<(Instant, Result<i64, String>)>>,
}

impl ProducerIds {
    /// The next id.
    pub async fn allocate(self: &Arc<Self>) -> Result<i64, String> {
        let mut blocks = self.blocks.lock().await;
        if blocks.is_empty() {
            // Nothing in hand: wait for a block (others wait behind the
            // lock; they would have nothing either).
            let block = tokio::time::timeout(Duration::from_secs(5), self.claim()).await.map_err(|_| "etcd did not give a block of producer ids within 5 s".to_owned())?.map_err(|e| format!("taking a block of producer ids: {e:#}"))?;
            blocks.add(block);
        }
        let id = blocks.take().expect("a block is held");
        if blocks.wants_block() && !self.claiming.swap(true, Ordering::AcqRel) {
            let me = self.clone();
            tokio::spawn(async move {
                match tokio::time::timeout(Duration::from_secs(5), me.claim()).await {
                    Ok(Ok(block)) => me.blocks.lock().await.add(block),
                    Ok(Err(e)) => tracing::error!(error = %format!("{e:#}"), "taking the next block of producer ids failed"),
                    Err(_) => tracing::error!("etcd did not give the next block of producer ids within 5 s"),
                }
                // After a failure, the next try waits a second.
                if me.blocks.lock().await.wants_block() {
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
                me.claiming.store(false, Ordering::Release);
            });
        }
        Ok(id)
    }

    /// The counter as etcd holds it now (a linearizable read): every id
    /// below it was handed out in some node's block. For a Produce naming
    /// an id above what this node's watch has shown (a block another node
    /// took just now), before it is refused as unknown. Reads are shared:
    /// one at a time, and a caller that waited behind one takes its
    /// answer, so ids made up by a client cost etcd at most a read per
    /// 100 ms.
    pub async fn end_now(&self) -> Result<i64, String> {
        let mut last = self.last_read.lock().await;
        if let Some((at, answer)) = &*last {
            // A failure is kept as long: callers queued behind a slow
            // etcd do not each wait for it again.
            if at.elapsed() < Duration::from_millis(100) {
                return answer.clone();
            }
        }
        let answer = self.read_end().await.map_err(|e| format!("{e:#}"));
        *last = Some((Instant::now(), answer.clone()));
        answer
    }

    async fn read_end(&self) -> anyhow::Result<i64> {
        let mut client = self.client.clone();
        let resp = tokio::time::timeout(Duration::from_secs(2), client.get(self.key.clone(), None)).await.context("etcd did not answer within 2 s")??;
        match resp.kvs().first() {
            Some(kv) => std::str::from_utf8(kv.value()).ok().and_then(|s| s.parse::<i64>().ok()).filter(|n| *n >= 1).context("the producer id counter is not a positive number"),
            None => Ok(1),
        }
    }

    /// Moves the counter one block on and reserves the block in the
    /// catalog; the ids passed over are ours.
    async fn claim(&self) -> anyhow::Result<std::ops::Range<i64>> {
        let mut client = self.client.clone();
        for _ in 0..64 {
            let resp = client.get(self.key.clone(), None).await?;
            let (start, compare) = match resp.kvs().first() {
                Some(kv) => {
                    let at = std::str::from_utf8(kv.value()).ok().and_then(|s| s.parse::<i64>().ok()).filter(|n| *n >= 1).context("the producer id counter is not a positive number")?;
                    (at, Compare::mod_revision(self.key.clone(), CompareOp::Equal, kv.mod_revision()))
                }
                None => (1, Compare::create_revision(self.key.clone(), CompareOp::Equal, 0)),
            };
            let start = start.max(self.floor);
            let end = start.checked_add(PRODUCER_ID_BLOCK).context("producer ids exhausted")?;
            let txn = Txn::new().when([compare]).and_then([TxnOp::put(self.key.clone(), end.to_string(), None)]);
            if client.txn(txn).await?.succeeded() {
                let reserve = self.reserve.clone();
                tokio::task::spawn_blocking(move || reserve(end)).await?.map_err(|e| anyhow::anyhow!("recording the block in the catalog: {e}"))?;
                tracing::info!(start, end, "took a block of producer ids");
                return Ok(start..end);
            }
        }
        bail!("the producer id counter kept moving (64 tries)")
    }
}

struct State {
    client: Client,
    keys: Keys,
    /// Every view starts from it (the key holds the same).
    cluster_id: String,
    cfg: ClusterConfig,
    me: NodeRecord,
    fence: Arc<Fence>,
    lease: Arc<AtomicI64>,
    ttl_s: i64,
    /// When the controller last looked for leader imbalance.
    balanced_at: Instant,
}

impl State {
    /// Grants a lease and creates `nodes/<id>` under it, retrying while
    /// another registration of this id holds the key, for at most two
    /// sessions; false if the node stops meanwhile.
    async fn register(&mut self, stop: &mut watch::Receiver<bool>) -> anyhow::Result<bool> {
        let wait = Duration::from_millis(self.cfg.session_timeout_ms.saturating_mul(2).saturating_add(2000));
        let give_up = Instant::now() + wait;
        loop {
            let sent = boot_now();
            let lease = self.client.lease_grant(self.ttl_s, None).await.context("granting a lease")?;
            let record = serde_json::to_vec(&self.me).expect("a node record encodes");
            let key = self.keys.node(self.me.id);
            let txn = Txn::new()
                .when([Compare::create_revision(key.clone(), CompareOp::Equal, 0)])
                .and_then([TxnOp::put(key.clone(), record, Some(PutOptions::new().with_lease(lease.id())))])
                .or_else([TxnOp::get(key, None)]);
            let resp = self.client.txn(txn).await.context("registering the node")?;
            if resp.succeeded() {
                // The put's revision is the key's create revision.
                self.me.incarnation = resp.header().map_or(0, |h| h.revision());
                self.lease.store(lease.id(), Ordering::Release);
                self.fence.extend(sent + lease_margin(Duration::from_secs(lease.ttl().max(0) as u64)));
                return Ok(true);
            }
            let _ = self.client.lease_revoke(lease.id()).await;
            if Instant::now() >= give_up {
                bail!("node id {} is registered by a live node (its lease did not lapse within {wait:?}); is another broker running with this node_id?", self.me.id);
            }
            tracing::info!(node_id = self.me.id, "node id still registered (a previous incarnation?); waiting for its lease to lapse");
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_millis(self.cfg.heartbeat_interval_ms)) => {}
                _ = stop.changed() => return Ok(false),
            }
        }
    }

    /// Every key of the cluster, as a view, and the revision it was read at.
    async fn read_all(&mut self) -> anyhow::Result<(ViewBuilder, i64)> {
        let resp = self.client.get(self.keys.prefix(), Some(GetOptions::new().with_prefix())).await.context("reading the cluster's keys")?;
        let revision = resp.header().map_or(0, |h| h.revision());
        let mut b = ViewBuilder::new(self.cluster_id.clone()).unclean_by_default(self.cfg.unclean_leader_election);
        for kv in resp.kvs() {
            if let Err(why) = b.apply(&self.keys, KeyEvent::Put { key: kv.key(), value: kv.value(), create_revision: kv.create_revision(), mod_revision: kv.mod_revision() }, revision) {
                tracing::warn!(%why, "ignoring a cluster key that does not decode");
            }
        }
        Ok((b, revision))
    }

    /// Tries once to become the controller (if there is none).
    async fn campaign(&mut self) {
        let lease = self.lease.load(Ordering::Acquire);
        if lease == 0 || !self.fence.alive() {
            return;
        }
        let key = self.keys.controller();
        let txn = Txn::new()
            .when([Compare::create_revision(key.clone(), CompareOp::Equal, 0)])
            .and_then([TxnOp::put(key, self.me.id.to_string(), Some(PutOptions::new().with_lease(lease)))]);
        match self.client.txn(txn).await {
            Ok(r) if r.succeeded() => tracing::info!(node_id = self.me.id, epoch = r.header().map_or(0, |h| h.revision()), "became the controller"),
            Ok(_) => {}
            Err(e) => tracing::warn!(error = %e, "controller campaign failed"),
        }
    }

    /// As the controller (and only while its lease is certainly alive):
    /// writes the elections the view calls for ([`topics::elections`]),
    /// each guarded by the unit's revision and by the controller key's
    /// create revision being this controller's epoch, so a deposed
    /// controller's writes fail. A failed write is tried again at the
    /// next event or heartbeat, from the view then.
    async fn control(&mut self, view: &ClusterView) {
        let Some(c) = view.controller.filter(|c| c.id == self.me.id) else { return };
        if !self.fence.alive() {
            return;
        }
        let changes = topics::elections(view);
        self.write_units(c.epoch, &changes, "unit changed by the controller").await;
        // Reassignments whose new replicas are all in sync end (a unit
        // changed above is looked at again from the next view).
        let done: Vec<(String, UnitRecord)> = topics::reassignments_done(view).into_iter().filter(|(name, _)| !changes.iter().any(|(c, _)| c == name)).collect();
        self.write_units(c.epoch, &done, "reassignment completed").await;
        // Kafka's auto.leader.rebalance: every interval, units go back to
        // their preferred leaders where a node leads too few of its own.
        // Only once no gone leader waits to be replaced.
        let every = Duration::from_millis(self.cfg.leader_imbalance_check_interval_ms);
        if self.cfg.auto_leader_rebalance && changes.is_empty() && self.balanced_at.elapsed() >= every {
            self.balanced_at = Instant::now();
            let moves = topics::rebalance(view, self.cfg.leader_imbalance_per_broker_percentage);
            self.write_units(c.epoch, &moves, "leadership back to the preferred replica").await;
        }
    }

    /// Writes units as the controller of `epoch`: each only if its key
    /// still has the revision it was read at, in transactions guarded by
    /// the controller key's create revision, so a deposed controller's
    /// writes fail.
    async fn write_units(&mut self, epoch: i64, changes: &[(String, UnitRecord)], what: &str) {
        for chunk in changes.chunks(OPS_PER_TXN) {
            let mut when = vec![Compare::create_revision(self.keys.controller(), CompareOp::Equal, epoch)];
            let mut ops = Vec::with_capacity(chunk.len());
            for (name, unit) in chunk {
                let key = self.keys.unit(name);
                when.push(Compare::mod_revision(key.clone(), CompareOp::Equal, unit.mod_revision));
                ops.push(TxnOp::put(key, serde_json::to_vec(unit).expect("a unit encodes"), None));
            }
            match self.client.txn(Txn::new().when(when).and_then(ops)).await {
                Ok(r) if r.succeeded() => {
                    for (name, unit) in chunk {
                        tracing::info!(unit = %name, replicas = ?unit.replicas, leader = unit.leader, leader_epoch = unit.leader_epoch, isr = ?unit.isr, "{what}");
                    }
                }
                Ok(_) => tracing::debug!("a controller write lost a race (the unit or the controller changed); trying again from the next view"),
                Err(e) => tracing::warn!(error = %e, "writing units failed"),
            }
        }
    }

    async fn run(mut self, mut builder: ViewBuilder, mut revision: i64, tx: watch::Sender<Arc<ClusterView>>, mut stop: watch::Receiver<bool>) {
        let publish = |b: &ViewBuilder| {
            tx.send_replace(Arc::new(b.view().clone()));
        };
        let mut backoff = Duration::from_millis(100);
        'session: loop {
            if builder.view().controller.is_none() {
                self.campaign().await;
            }
            let opts = WatchOptions::new().with_prefix().with_start_revision(revision + 1);
            let (_watcher, mut stream) = match self.client.watch(self.keys.prefix(), Some(opts)).await {
                Ok(w) => w,
                Err(e) => {
                    tracing::warn!(error = %e, "watching the cluster failed; retrying");
                    if !pause(&mut stop, &mut backoff).await {
                        break 'session;
                    }
                    continue;
                }
            };
            let mut check = tokio::time::interval(Duration::from_millis(self.cfg.heartbeat_interval_ms));
            loop {
                let msg = tokio::select! {
                    m = stream.message() => m,
                    _ = stop.changed() => break 'session,
                    _ = check.tick() => {
                        // Registration lost (the keep-alive found the lease
                        // expired): register again, then read everything
                        // (what changed meanwhile).
                        if self.lease.load(Ordering::Acquire) == 0 {
                            match self.register(&mut stop).await {
                                Ok(true) => tracing::info!(node_id = self.me.id, incarnation = self.me.incarnation, "registered again"),
                                Ok(false) => break 'session,
                                Err(e) => tracing::error!(error = %e, "registering again failed"),
                            }
                            break;
                        }
                        // No keep-alive acknowledged for a session: what the
                        // watch says may be stale; read everything again.
                        if !self.fence.alive() {
                            break;
                        }
                        // A campaign that failed on an etcd error is tried again.
                        if builder.view().controller.is_none() {
                            self.campaign().await;
                        }
                        // So is an election whose write failed.
                        self.control(builder.view()).await;
                        continue;
                    }
                };
                let resp = match msg {
                    Ok(Some(r)) => r,
                    Ok(None) | Err(_) => {
                        tracing::warn!(error = ?msg.err(), "the cluster watch ended; reading the cluster again");
                        break;
                    }
                };
                if resp.canceled() || resp.compact_revision() > 0 {
                    tracing::warn!(reason = resp.cancel_reason(), compacted = resp.compact_revision(), "the cluster watch was cancelled; reading the cluster again");
                    break;
                }
                // Resumed from the last event applied, not the header's
                // revision: a catch-up batch may stop short of it.
                for ev in resp.events() {
                    let Some(kv) = ev.kv() else { continue };
                    let event = match ev.event_type() {
                        EventType::Put => KeyEvent::Put { key: kv.key(), value: kv.value(), create_revision: kv.create_revision(), mod_revision: kv.mod_revision() },
                        EventType::Delete => KeyEvent::Delete { key: kv.key() },
                    };
                    if let Err(why) = builder.apply(&self.keys, event, kv.mod_revision()) {
                        tracing::warn!(%why, "ignoring a cluster key that does not decode");
                    }
                    revision = revision.max(kv.mod_revision());
                }
                publish(&builder);
                if builder.view().controller.is_none() {
                    self.campaign().await;
                }
                self.control(builder.view()).await;
                backoff = Duration::from_millis(100);
            }
            if !pause(&mut stop, &mut backoff).await {
                break 'session;
            }
            match self.read_all().await {
                Ok((b, r)) => {
                    (builder, revision) = (b, r);
                    publish(&builder);
                }
                Err(e) => tracing::warn!(error = %e, "reading the cluster failed; retrying"),
            }
        }
        // Leave: the others see this node go now, not a session later.
        let lease = self.lease.swap(0, Ordering::AcqRel);
        self.fence.revoke();
        if lease != 0 {
            let give = Duration::from_millis(self.cfg.session_timeout_ms);
            if !matches!(tokio::time::timeout(give, self.client.lease_revoke(lease)).await, Ok(Ok(_))) {
                tracing::warn!("revoking the lease failed; the registration lapses with it");
            }
        }
        tracing::info!(node_id = self.me.id, "left the cluster");
    }
}

/// What a lease of `ttl` certainly covers locally: 5% less, for clocks
/// that run at different rates.
fn lease_margin(ttl: Duration) -> Duration {
    ttl - ttl / 20
}

/// Sleeps `backoff` (doubling it up to 2 s); false if the node stops.
async fn pause(stop: &mut watch::Receiver<bool>, backoff: &mut Duration) -> bool {
    let d = *backoff;
    *backoff = (*backoff * 2).min(Duration::from_secs(2));
    tokio::select! {
        _ = tokio::time::sleep(d) => true,
        _ = stop.changed() => false,
    }
}

/// Renews the lease every `every`; each acknowledged renewal extends the
/// fence from its send time. A lease etcd no longer knows (TTL 0) sets the
/// shared lease id to 0, which tells the session to register again.
async fn keep_alive(mut client: Client, lease: Arc<AtomicI64>, fence: Arc<Fence>, every: Duration, mut stop: watch::Receiver<bool>) {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut stream: Option<(i64, etcd_client::LeaseKeeper, etcd_client::LeaseKeepAliveStream)> = None;
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stop.changed() => return,
        }
        let id = lease.load(Ordering::Acquire);
        if id == 0 {
            stream = None;
            continue;
        }
        if stream.as_ref().is_none_or(|(held, _, _)| *held != id) {
            match client.lease_keep_alive(id).await {
                Ok((k, s)) => stream = Some((id, k, s)),
                // Opening sends a first keep-alive; etcd-client reports a
                // lease etcd does not know (TTL 0) as this error.
                Err(etcd_client::Error::LeaseKeepAliveError(why)) => {
                    tracing::warn!(lease = id, %why, "the node's lease expired; registering again");
                    fence.revoke();
                    let _ = lease.compare_exchange(id, 0, Ordering::AcqRel, Ordering::Acquire);
                    continue;
                }
                Err(e) => {
                    tracing::warn!(error = %e, "opening the lease keep-alive failed");
                    continue;
                }
            }
        }
        let (_, keeper, responses) = stream.as_mut().expect("opened above");
        let sent = boot_now();
        let answer = async {
            keeper.keep_alive().await?;
            responses.message().await
        };
        match tokio::time::timeout(every.max(Duration::from_millis(500)), answer).await {
            Ok(Ok(Some(r))) if r.ttl() > 0 => fence.extend(sent + lease_margin(Duration::from_secs(r.ttl() as u64))),
            Ok(Ok(Some(_))) => {
                tracing::warn!(lease = id, "the node's lease expired; registering again");
                fence.revoke();
                let _ = lease.compare_exchange(id, 0, Ordering::AcqRel, Ordering::Acquire);
                stream = None;
            }
            Ok(Ok(None)) | Ok(Err(_)) | Err(_) => {
                tracing::warn!(lease = id, "a lease keep-alive went unanswered");
                stream = None;
            }
        }
    }
}

/// Nested transactions per etcd transaction: etcd refuses more than 128
/// operations in one (`--max-txn-ops`), and a nested one counts its own.
const OPS_PER_TXN: usize = 60;

/// How long an admin change waits for etcd before it is answered as a
/// timeout (the client retries).
const ADMIN_TIMEOUT: Duration = Duration::from_secs(10);

/// The cluster's topics in etcd: the engine's [`TopicDirectory`] in
/// cluster mode. Any node writes them (a topic change is rare and each
/// write is a compare-and-swap, so no forwarding to the controller is
/// needed); every node follows them through its watch.
///
/// - **Create.** The topic's units that do not exist yet are created
///   first, each only if still absent, placed over the registered nodes
///   ([`topics::place`]); then the topic, only if its name is free. A
///   unit left behind by a create that lost the race serves the next
///   topic of its branch.
/// - **Delete** removes the topic's key if it still holds the same id.
///   Its units stay: the branch's other topics (or its next ones) use them.
/// - **Update** (partitions, configs) rewrites the key from its current
///   value, by compare-and-swap; new partitions get their units first.
///
/// The engine calls it from blocking threads; each call runs on the
/// node's runtime.
pub struct Directory {
    client: Client,
    keys: Keys,
    view: watch::Receiver<Arc<ClusterView>>,
    runtime: tokio::runtime::Handle,
}

impl Directory {
    pub fn new(session: &Session, runtime: tokio::runtime::Handle) -> Directory {
        Directory { client: session.client.clone(), keys: session.keys.clone(), view: session.membership.subscribe(), runtime }
    }

    fn run<T>(&self, what: &str, f: impl std::future::Future<Output = Result<T, EngineError>>) -> Result<T, EngineError> {
        match self.runtime.block_on(tokio::time::timeout(ADMIN_TIMEOUT, f)) {
            Ok(r) => r,
            Err(_) => Err(EngineError::Cluster(format!("etcd did not answer {what} within {ADMIN_TIMEOUT:?}"))),
        }
    }

    async fn ensure_units(&self, names: Vec<String>, rf: i16) -> Result<(), EngineError> {
        let view = self.view.borrow().clone();
        ensure_units(&self.client, &self.keys, &view, names, rf).await
    }

    /// Waits (within the call's timeout) until this node's view reflects
    /// `revision`: a change answered here is then seen here (its
    /// partitions have leaders in Metadata, a deleted topic is gone).
    async fn seen(&self, revision: i64) {
        let mut view = self.view.clone();
        let _ = view.wait_for(|v| v.revision >= revision).await;
    }

    /// The topic's key as etcd holds it now: its entry and mod revision.
    async fn current(&self, name: &str) -> Result<Option<(TopicEntry, i64)>, EngineError> {
        let mut client = self.client.clone();
        let resp = client.get(self.keys.topic(name), None).await.map_err(etcd_failed)?;
        let Some(kv) = resp.kvs().first() else { return Ok(None) };
        let entry: TopicEntry = serde_json::from_slice(kv.value()).map_err(|e| EngineError::Cluster(format!("topic {name} in etcd does not decode: {e}")))?;
        Ok(Some((entry, kv.mod_revision())))
    }
}

/// Creates the units of `names` that `view` lacks, each only if still
/// absent in etcd, with `rf` replicas placed over the nodes `view` has
/// registered. A unit that exists with another replica count is refused:
/// a branch's topics share their units' replica sets (docs/cluster.md;
/// units per replication factor are not built yet).
async fn ensure_units(client: &Client, keys: &Keys, view: &ClusterView, names: Vec<String>, rf: i16) -> Result<(), EngineError> {
    // A unit being reassigned counts its target (as many as its original).
    if let Some((name, u)) = names.iter().find_map(|n| view.units.get(n).filter(|u| u.target().len() != rf as usize).map(|u| (n, u))) {
        return Err(EngineError::InvalidReplicationFactor(format!(
            "replication factor {rf}: unit {name} of this topic's branch has {} replicas, and a branch's topics share them (create the topic under a branch of its own)",
            u.target().len()
        )));
    }
    let missing: Vec<String> = names.into_iter().filter(|u| !view.units.contains_key(u)).collect();
    let placed = topics::place(view, &missing, rf.max(1) as usize).map_err(EngineError::InvalidReplicationFactor)?;
    let mut client = client.clone();
    let placed: Vec<(String, UnitRecord)> = placed.into_iter().collect();
    for chunk in placed.chunks(OPS_PER_TXN) {
        let ops: Vec<TxnOp> = chunk
            .iter()
            .map(|(name, unit)| {
                let key = keys.unit(name);
                let value = serde_json::to_vec(unit).expect("a unit encodes");
                TxnOp::txn(Txn::new().when([Compare::create_revision(key.clone(), CompareOp::Equal, 0)]).and_then([TxnOp::put(key, value, None)]))
            })
            .collect();
        client.txn(Txn::new().and_then(ops)).await.map_err(etcd_failed)?;
    }
    Ok(())
}

/// The coordinator shards' units, created when a coordinator is first
/// looked up (as Kafka creates `__consumer_offsets` at the first
/// FindCoordinator), over the nodes registered then; until they exist,
/// FindCoordinator answers COORDINATOR_NOT_AVAILABLE and clients retry.
pub(crate) struct Shards {
    client: Client,
    keys: Keys,
    view: watch::Receiver<Arc<ClusterView>>,
    /// Replicas per shard (`offsets_topic_replication_factor`).
    rf: i16,
    creating: std::sync::atomic::AtomicBool,
}

impl Shards {
    /// A unit's leader changes its ISR (Kafka's AlterPartition): written
    /// only if the unit's key still has the revision `from` was read at,
    /// so a stale leader's change, or one that raced the controller's,
    /// fails (`Ok(false)`) and is decided again from a newer view.
    pub(crate) async fn alter_isr(&self, unit: &str, from: &UnitRecord, isr: Vec<i32>) -> Result<bool, String> {
        self.replace_unit(unit, from, UnitRecord { isr, ..from.clone() }).await
    }

    /// Writes unit `unit` as `to` (an ISR change, controlled shutdown's
    /// handover), if it is still as `from` was read; `Ok(false)` when it
    /// changed meanwhile.
    pub(crate) async fn replace_unit(&self, unit: &str, from: &UnitRecord, to: UnitRecord) -> Result<bool, String> {
        let key = self.keys.unit(unit);
        let txn = Txn::new().when([Compare::mod_revision(key.clone(), CompareOp::Equal, from.mod_revision)]).and_then([TxnOp::put(key, serde_json::to_vec(&to).expect("a unit encodes"), None)]);
        match tokio::time::timeout(ADMIN_TIMEOUT, self.client.clone().txn(txn)).await {
            Ok(Ok(r)) => Ok(r.succeeded()),
            Ok(Err(e)) => Err(e.to_string()),
            Err(_) => Err(format!("etcd did not answer within {ADMIN_TIMEOUT:?}")),
        }
    }

    /// The shards' units, then their log's topic, each only if absent (as
    /// Kafka, not before `rf` nodes are registered).
    async fn create(&self, view: &ClusterView) -> Result<(), EngineError> {
        ensure_units(&self.client, &self.keys, view, topics::coordinator_units(), self.rf).await?;
        if view.topics.contains_key(topics::COORDINATOR_TOPIC) {
            return Ok(());
        }
        let entry = TopicEntry {
            id: uuid::Uuid::new_v4().to_string(),
            partitions: topics::COORDINATOR_SHARDS as i32,
            replication_factor: self.rf,
            // Compacted: the log keeps each committed offset's last change.
            configs: [("cleanup.policy".to_owned(), "compact".to_owned())].into(),
            created_ms: std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64),
        };
        let key = self.keys.topic(topics::COORDINATOR_TOPIC);
        let txn = Txn::new().when([Compare::create_revision(key.clone(), CompareOp::Equal, 0)]).and_then([TxnOp::put(key, serde_json::to_vec(&entry).expect("a topic entry encodes"), None)]);
        self.client.clone().txn(txn).await.map_err(etcd_failed)?;
        Ok(())
    }

    /// Starts creating the missing shards, unless that is under way.
    pub(crate) fn ensure(self: &Arc<Self>) {
        if self.creating.swap(true, Ordering::AcqRel) {
            return;
        }
        let me = self.clone();
        tokio::spawn(async move {
            let view = me.view.borrow().clone();
            match tokio::time::timeout(ADMIN_TIMEOUT, me.create(&view)).await {
                Ok(Ok(())) => tracing::info!(nodes = view.nodes.len(), replication_factor = me.rf, "coordinator shards created"),
                Ok(Err(e)) => tracing::warn!(error = %e, "creating the coordinator shards failed"),
                Err(_) => tracing::warn!("etcd did not create the coordinator shards within {ADMIN_TIMEOUT:?}"),
            }
            me.creating.store(false, Ordering::Release);
        });
    }
}

fn etcd_failed(e: etcd_client::Error) -> EngineError {
    EngineError::Cluster(format!("etcd: {e}"))
}

fn entry_of(t: &TopicRecord) -> TopicEntry {
    TopicEntry { id: uuid::Uuid::from_bytes(t.id).to_string(), partitions: t.partitions, replication_factor: t.replication_factor, configs: t.configs.clone(), created_ms: t.created_ms }
}

/// ACLs in etcd: one key per ACL (`acls/<hex of its key>`), so creating
/// one is a put (idempotent) and deleting one a delete; a change is
/// answered once this node's view has it. A request's changes go in
/// transactions of at most 100 operations (etcd takes 128), so one that
/// fails midway may leave part done: retrying it is safe.
impl crate::auth::acl::AclStore for Directory {
    fn change(&self, add: &[crate::auth::acl::Acl], remove: &[crate::auth::acl::Acl]) -> Result<(i64, std::collections::BTreeSet<crate::auth::acl::Acl>), String> {
        const CHUNK: usize = 100;
        self.run("an ACL change", async {
            let mut client = self.client.clone();
            // etcd refuses a transaction naming a key twice: each ACL once,
            // and one both made and removed is made.
            let add: std::collections::BTreeSet<&crate::auth::acl::Acl> = add.iter().collect();
            let remove: std::collections::BTreeSet<&crate::auth::acl::Acl> = remove.iter().filter(|a| !add.contains(a)).collect();
            let ops: Vec<TxnOp> = add
                .iter()
                .map(|a| TxnOp::put(self.keys.acl(a), serde_json::to_vec(a).expect("an ACL encodes"), None))
                .chain(remove.iter().map(|a| TxnOp::delete(self.keys.acl(a), None)))
                .collect();
            // The revision of the last transaction that changed something:
            // one that changed nothing (deletions of ACLs already gone)
            // makes no event this node's view could wait for.
            let mut revision = 0;
            let mut ops = ops.into_iter().peekable();
            while ops.peek().is_some() {
                let chunk: Vec<TxnOp> = ops.by_ref().take(CHUNK).collect();
                let resp = client.txn(Txn::new().and_then(chunk)).await.map_err(etcd_failed)?;
                let changed = resp.op_responses().iter().any(|r| match r {
                    TxnOpResponse::Delete(d) => d.deleted() > 0,
                    _ => true,
                });
                if changed {
                    revision = revision.max(resp.header().map_or(0, |h| h.revision()));
                }
            }
            self.seen(revision).await;
            let view = self.view.borrow().clone();
            Ok((view.revision, view.acls.values().cloned().collect()))
        })
        .map_err(|e| e.to_string())
    }
}

/// SCRAM users in etcd: one key per user (`scram/<hex of the name>`),
/// holding a credential per mechanism. A user's changes are applied to
/// what etcd holds of that user now and written by compare-and-swap on
/// the key's revision (retried when another node's change came first), so
/// two nodes changing one user's mechanisms never undo each other.
impl crate::auth::users::UserDirectory for Directory {
    #[allow(clippy::type_complexity)]
    fn alter(&self, groups: &[Vec<crate::auth::users::Alteration>]) -> Result<(Vec<Result<(), crate::auth::users::AlterError>>, i64, crate::auth::users::Users), String> {
        use crate::auth::users::{altered, Credentials};
        const TRIES: usize = 10;
        self.run("a SCRAM change", async {
            let mut client = self.client.clone();
            let mut results = Vec::with_capacity(groups.len());
            let mut revision = 0;
            for group in groups {
                let Some(user) = group.first().map(|c| c.user().to_owned()) else {
                    results.push(Ok(()));
                    continue;
                };
                let key = self.keys.scram(&user);
                let mut outcome = None;
                for _ in 0..TRIES {
                    let resp = client.get(key.clone(), None).await.map_err(etcd_failed)?;
                    let (current, at) = match resp.kvs().first() {
                        Some(kv) => (Some(serde_json::from_slice::<Credentials>(kv.value()).map_err(|e| EngineError::Cluster(format!("user {user:?} in etcd does not decode: {e}")))?), kv.mod_revision()),
                        None => (None, 0),
                    };
                    let next = match altered(&user, current, group) {
                        Ok(next) => next,
                        Err(e) => {
                            outcome = Some(Err(e));
                            break;
                        }
                    };
                    let write = match &next {
                        Some(creds) => TxnOp::put(key.clone(), serde_json::to_vec(creds).expect("credentials encode"), None),
                        None => TxnOp::delete(key.clone(), None),
                    };
                    let txn = Txn::new().when([Compare::mod_revision(key.clone(), CompareOp::Equal, at)]).and_then([write]);
                    let resp = client.txn(txn).await.map_err(etcd_failed)?;
                    if resp.succeeded() {
                        revision = revision.max(resp.header().map_or(0, |h| h.revision()));
                        outcome = Some(Ok(()));
                        break;
                    }
                }
                results.push(outcome.ok_or_else(|| EngineError::Cluster(format!("user {user:?} kept changing in etcd")))?);
            }
            self.seen(revision).await;
            let view = self.view.borrow().clone();
            Ok((results, view.revision, view.users.iter().map(|(u, c)| (u.clone(), c.clone())).collect()))
        })
        .map_err(|e| e.to_string())
    }

    fn hand_over(&self, users: &crate::auth::users::Users) -> Result<std::collections::BTreeSet<String>, String> {
        self.run("handing users over", self.hand_over_users(users)).map_err(|e| e.to_string())
    }
}

impl Directory {
    /// [`crate::auth::users::UserDirectory::hand_over`]: each user created
    /// only if its key is absent.
    async fn hand_over_users(&self, users: &crate::auth::users::Users) -> Result<std::collections::BTreeSet<String>, EngineError> {
        let mut client = self.client.clone();
        let (mut taken, mut revision) = (std::collections::BTreeSet::new(), 0);
        for (user, creds) in users {
            let key = self.keys.scram(user);
            let put = TxnOp::put(key.clone(), serde_json::to_vec(creds).expect("credentials encode"), None);
            let resp = client.txn(Txn::new().when([Compare::create_revision(key, CompareOp::Equal, 0)]).and_then([put])).await.map_err(etcd_failed)?;
            if resp.succeeded() {
                taken.insert(user.clone());
                revision = revision.max(resp.header().map_or(0, |h| h.revision()));
            }
        }
        self.seen(revision).await;
        Ok(taken)
    }
}

/// Client quotas in etcd: one key per entity (`quotas/<hex of its
/// key>`); each entity's changes are applied to what etcd holds of it now
/// and written by compare-and-swap on the key's revision, as users are.
impl crate::auth::quota::QuotaDirectory for Directory {
    fn alter(&self, changes: &[(crate::auth::quota::Entity, Vec<crate::auth::quota::Op>)]) -> Result<(i64, crate::auth::quota::Entries), String> {
        use crate::auth::quota::{altered, QuotaRecord};
        const TRIES: usize = 10;
        self.run("a quota change", async {
            let mut client = self.client.clone();
            let mut revision = 0;
            for (entity, ops) in changes {
                let key = self.keys.quota(entity);
                let mut done = false;
                for _ in 0..TRIES {
                    let resp = client.get(key.clone(), None).await.map_err(etcd_failed)?;
                    let (current, at) = match resp.kvs().first() {
                        Some(kv) => (serde_json::from_slice::<QuotaRecord>(kv.value()).map_err(|e| EngineError::Cluster(format!("quota {entity:?} in etcd does not decode: {e}")))?.known(), kv.mod_revision()),
                        None => (Default::default(), 0),
                    };
                    let values = altered(current.clone(), ops);
                    if values == current {
                        // Nothing to write (and no event to wait for).
                        done = true;
                        break;
                    }
                    let write = if values.is_empty() { TxnOp::delete(key.clone(), None) } else { TxnOp::put(key.clone(), serde_json::to_vec(&QuotaRecord::new(entity.clone(), &values)).expect("a quota encodes"), None) };
                    let resp = client.txn(Txn::new().when([Compare::mod_revision(key.clone(), CompareOp::Equal, at)]).and_then([write])).await.map_err(etcd_failed)?;
                    if resp.succeeded() {
                        revision = revision.max(resp.header().map_or(0, |h| h.revision()));
                        done = true;
                        break;
                    }
                }
                if !done {
                    return Err(EngineError::Cluster(format!("quota {entity:?} kept changing in etcd")));
                }
            }
            self.seen(revision).await;
            let view = self.view.borrow().clone();
            Ok((view.revision, super::quotas_of(&view)))
        })
        .map_err(|e| e.to_string())
    }
}

impl TopicDirectory for Directory {
    fn create(&self, t: &TopicRecord) -> Result<(), EngineError> {
        self.run("a topic creation", async {
            self.ensure_units((0..t.partitions).map(|p| topics::unit_of(&t.name, p)).collect(), t.replication_factor).await?;
            let key = self.keys.topic(&t.name);
            let value = serde_json::to_vec(&entry_of(t)).expect("a topic entry encodes");
            let txn = Txn::new().when([Compare::create_revision(key.clone(), CompareOp::Equal, 0)]).and_then([TxnOp::put(key, value, None)]);
            let resp = self.client.clone().txn(txn).await.map_err(etcd_failed)?;
            if resp.succeeded() {
                tracing::info!(topic = %t.name, partitions = t.partitions, "topic recorded in the cluster");
                self.seen(resp.header().map_or(0, |h| h.revision())).await;
                Ok(())
            } else {
                Err(EngineError::TopicExists)
            }
        })
    }

    fn delete(&self, t: &TopicRecord) -> Result<(), EngineError> {
        self.run("a topic deletion", async {
            let key = self.keys.topic(&t.name);
            for _ in 0..16 {
                let Some((entry, rev)) = self.current(&t.name).await? else { return Err(EngineError::UnknownTopicOrPartition) };
                if entry.id_bytes() != Some(t.id) {
                    return Err(EngineError::UnknownTopicOrPartition);
                }
                let txn = Txn::new().when([Compare::mod_revision(key.clone(), CompareOp::Equal, rev)]).and_then([TxnOp::delete(key.clone(), None)]);
                let resp = self.client.clone().txn(txn).await.map_err(etcd_failed)?;
                if resp.succeeded() {
                    self.seen(resp.header().map_or(0, |h| h.revision())).await;
                    return Ok(());
                }
            }
            Err(EngineError::Cluster(format!("topic {} kept changing", t.name)))
        })
    }

    fn update_cluster_configs(&self, old: &std::collections::BTreeMap<String, String>, new: &std::collections::BTreeMap<String, String>) -> Result<(), EngineError> {
        self.run("a broker config change", async {
            let key = self.keys.broker_configs();
            let mut client = self.client.clone();
            let resp = client.get(key.clone(), None).await.map_err(etcd_failed)?;
            let (current, rev) = match resp.kvs().first() {
                Some(kv) => (serde_json::from_slice::<std::collections::BTreeMap<String, String>>(kv.value()).map_err(|e| EngineError::Cluster(format!("the broker configs in etcd do not decode: {e}")))?, kv.mod_revision()),
                None => (Default::default(), 0),
            };
            // Computed from this node's copy: another node's change since
            // would be lost (the client retries once this node follows it).
            if current == *new {
                return Ok(());
            }
            if current != *old {
                return Err(EngineError::Cluster("the cluster's broker configs changed meanwhile on another broker; retry".into()));
            }
            let write = if new.is_empty() { TxnOp::delete(key.clone(), None) } else { TxnOp::put(key.clone(), serde_json::to_vec(new).expect("configs encode"), None) };
            let resp = client.txn(Txn::new().when([Compare::mod_revision(key.clone(), CompareOp::Equal, rev)]).and_then([write])).await.map_err(etcd_failed)?;
            if !resp.succeeded() {
                return Err(EngineError::Cluster("the cluster's broker configs changed meanwhile on another broker; retry".into()));
            }
            self.seen(resp.header().map_or(0, |h| h.revision())).await;
            Ok(())
        })
    }

    fn update(&self, old: &TopicRecord, new: &TopicRecord) -> Result<(), EngineError> {
        self.run("a topic change", async {
            let key = self.keys.topic(&old.name);
            for _ in 0..16 {
                let Some((mut entry, rev)) = self.current(&old.name).await? else { return Err(EngineError::UnknownTopicOrPartition) };
                if entry.id_bytes() != Some(old.id) {
                    return Err(EngineError::UnknownTopicOrPartition);
                }
                if new.partitions != old.partitions {
                    // Against what the cluster has, which may be ahead of
                    // this node's copy.
                    if new.partitions <= entry.partitions {
                        return Err(EngineError::InvalidPartitions(new.partitions));
                    }
                    self.ensure_units((entry.partitions..new.partitions).map(|p| topics::unit_of(&old.name, p)).collect(), entry.replication_factor).await?;
                    entry.partitions = new.partitions;
                }
                if new.configs != old.configs {
                    // Computed from this node's copy: if another node
                    // changed them meanwhile, writing over theirs would
                    // lose that change. The client retries once this node
                    // has followed it.
                    if entry.configs != old.configs && entry.configs != new.configs {
                        return Err(EngineError::Cluster(format!("the configs of {} changed meanwhile on another broker; retry", old.name)));
                    }
                    entry.configs = new.configs.clone();
                }
                let value = serde_json::to_vec(&entry).expect("a topic entry encodes");
                let txn = Txn::new().when([Compare::mod_revision(key.clone(), CompareOp::Equal, rev)]).and_then([TxnOp::put(key.clone(), value, None)]);
                let resp = self.client.clone().txn(txn).await.map_err(etcd_failed)?;
                if resp.succeeded() {
                    self.seen(resp.header().map_or(0, |h| h.revision())).await;
                    return Ok(());
                }
            }
            Err(EngineError::Cluster(format!("topic {} kept changing", old.name)))
        })
    }
}
