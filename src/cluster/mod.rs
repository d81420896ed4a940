//! Cluster mode (issue 24; the design is `docs/cluster.md`): which nodes
//! form the cluster and which of them is the controller, as etcd holds it.
//!
//! Every node registers a [`NodeRecord`] under its lease and watches the
//! cluster's keys; what it has seen is a [`ClusterView`], published to the
//! Kafka handlers through a [`Membership`]. Single-node mode (no
//! `etcd_endpoints`) has the same shape: a view of one node that is its
//! own controller, fixed for the process's life, so handlers never ask
//! which mode they run in.
//!
//! The pure parts live here and in [`keys`]: the records, the key layout,
//! and the view built from etcd's key-value events (unit-tested without
//! etcd). The etcd session itself ([`etcd`]) is built with the `cluster`
//! feature.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::sync::watch;

#[cfg(feature = "cluster")]
pub mod etcd;
pub mod keys;
pub mod topics;

pub use topics::{PartState, TopicEntry, UnitRecord};

/// How a node reaches the cluster's etcd, and how long its registration
/// outlives its last keep-alive.
#[derive(Debug, Clone)]
pub struct ClusterConfig {
    /// etcd client URLs (`http://host:port`).
    pub etcd_endpoints: Vec<String>,
    /// The etcd key prefix is `/canopy/<cluster_name>/`: one etcd can hold
    /// several clusters.
    pub cluster_name: String,
    /// A node whose lease is not renewed for this long leaves the cluster
    /// (Kafka's `broker.session.timeout.ms`); etcd counts leases in whole
    /// seconds, so it is rounded up to one.
    pub session_timeout_ms: u64,
    /// How often the lease is renewed (`broker.heartbeat.interval.ms`).
    pub heartbeat_interval_ms: u64,
    /// Replicas of each coordinator shard (`offsets.topic.replication.factor`).
    pub offsets_replication_factor: i16,
    /// Kafka's `unclean.leader.election.enable`, this node's static setting.
    pub unclean_leader_election: bool,
    /// Kafka's `auto.leader.rebalance.enable`.
    pub auto_leader_rebalance: bool,
    /// Kafka's `leader.imbalance.check.interval.seconds`, in milliseconds.
    pub leader_imbalance_check_interval_ms: u64,
    /// Kafka's `leader.imbalance.per.broker.percentage`.
    pub leader_imbalance_per_broker_percentage: u32,
}

/// One address a node serves a Kafka listener on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Endpoint {
    pub listener: String,
    pub host: String,
    pub port: i32,
}

/// What a node registers about itself (`nodes/<id>`, JSON).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeRecord {
    pub id: i32,
    pub rack: Option<String>,
    /// Tells a node's registrations apart, increasing: the etcd create
    /// revision of its `nodes/<id>` key (not in the value); a restarted
    /// node registers again with a larger one. The broker epoch fetches
    /// and KIP-951 answers will carry. 0 in single-node mode.
    #[serde(default, skip)]
    pub incarnation: i64,
    pub endpoints: Vec<Endpoint>,
}

impl NodeRecord {
    /// The node's address on `listener` (Kafka lists a broker only on the
    /// listener a request came in on).
    pub fn endpoint(&self, listener: &str) -> Option<&Endpoint> {
        self.endpoints.iter().find(|e| e.listener == listener)
    }
}

/// The controller: a node holding the `controller` key, and that key's
/// create revision, which is its epoch (a later controller's is larger).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Controller {
    pub id: i32,
    pub epoch: i64,
}

/// The cluster as one node has seen it: the live nodes, the controller,
/// the topics and their units.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ClusterView {
    /// Single-node mode: this node leads every partition (no units).
    pub single: bool,
    pub cluster_id: String,
    pub nodes: BTreeMap<i32, NodeRecord>,
    pub controller: Option<Controller>,
    /// Every producer id below this was handed out in some node's block
    /// (0: none yet, or single-node mode).
    pub producer_ids_end: i64,
    /// The etcd revision this view reflects (0 in single-node mode).
    pub revision: i64,
    /// Topics by name (cluster mode). Shared between views: a new view
    /// copies the map only when a topic changed.
    pub topics: Arc<BTreeMap<String, TopicEntry>>,
    /// Replication units by name (`<branch>~<p>`, cluster mode).
    pub units: Arc<BTreeMap<String, UnitRecord>>,
    /// Topics whose key does not decode: nodes keep what they have of
    /// them (see [`ViewBuilder::apply`]).
    pub damaged_topics: Arc<std::collections::BTreeSet<String>>,
    /// The cluster's ACLs, by [`keys::acl_id`] (cluster mode).
    pub acls: Arc<BTreeMap<String, crate::auth::acl::Acl>>,
    /// The cluster's SCRAM users (cluster mode).
    pub users: Arc<BTreeMap<String, crate::auth::users::Credentials>>,
    /// The cluster's client quotas, by [`keys::quota_id`] (cluster mode).
    pub quotas: Arc<BTreeMap<String, crate::auth::quota::QuotaRecord>>,
    /// The cluster-wide dynamic broker configs (BROKER "", cluster mode).
    pub broker_configs: Arc<BTreeMap<String, String>>,
    /// This node's own `unclean_leader_election_enable` (its static
    /// setting, under the cluster-wide dynamic one): what the elections
    /// this node decides fall back to, as Kafka's controller falls back to
    /// its own config. Not from etcd.
    pub unclean_by_default: bool,
}

/// This node's place in the cluster, shared by the handlers: the latest
/// view, and whether the node may still act as a member.
pub struct Membership {
    node_id: i32,
    rack: Option<String>,
    view: watch::Receiver<Arc<ClusterView>>,
    fence: Arc<Fence>,
    /// Cluster mode's producer id blocks.
    #[cfg(feature = "cluster")]
    producer_ids: Option<Arc<etcd::ProducerIds>>,
    /// Cluster mode's coordinator shards, created when first looked up.
    #[cfg(feature = "cluster")]
    shards: Option<Arc<etcd::Shards>>,
    /// Whether this node has begun leader epoch `epoch` in a topic's
    /// partition (set by replication: see [`Membership::lead`]).
    begun: std::sync::OnceLock<Begun>,
}

/// (topic, partition, epoch) → whether the node has begun that epoch.
pub type Begun = Arc<dyn Fn(&str, i32, i32) -> bool + Send + Sync>;

impl Membership {
    /// Single-node mode: `me`, alone and the controller, for ever.
    pub fn single(cluster_id: String, me: NodeRecord) -> Membership {
        let id = me.id;
        let view = ClusterView { single: true, cluster_id, nodes: BTreeMap::from([(id, me.clone())]), controller: Some(Controller { id, epoch: 1 }), ..ClusterView::default() };
        Membership::fixed(me, view)
    }

    /// `me` in a cluster whose view is `view`, for ever: single-node mode,
    /// and tests of what cluster mode does differently, without etcd.
    pub fn fixed(me: NodeRecord, view: ClusterView) -> Membership {
        let (id, rack) = (me.id, me.rack.clone());
        let (tx, rx) = watch::channel(Arc::new(view));
        // Nothing publishes again; the receiver keeps the last value.
        drop(tx);
        Membership {
            node_id: id,
            rack,
            view: rx,
            fence: Arc::new(Fence::forever()),
            #[cfg(feature = "cluster")]
            producer_ids: None,
            #[cfg(feature = "cluster")]
            shards: None,
            begun: std::sync::OnceLock::new(),
        }
    }

    #[cfg(feature = "cluster")]
    pub(crate) fn new(me: &NodeRecord, view: watch::Receiver<Arc<ClusterView>>, fence: Arc<Fence>, producer_ids: Arc<etcd::ProducerIds>, shards: Arc<etcd::Shards>) -> Membership {
        Membership { node_id: me.id, rack: me.rack.clone(), view, fence, producer_ids: Some(producer_ids), shards: Some(shards), begun: std::sync::OnceLock::new() }
    }

    /// The node coordinating the group or transactional id `key`
    /// ([`ClusterView::coordinator`]); the first lookup in a cluster
    /// without coordinator shards starts creating them (`None` meanwhile,
    /// and while the shard has no leader).
    pub fn coordinator(&self, key: &str) -> Option<i32> {
        match self.view().coordinator(self.node_id, key) {
            Ok(id) => Some(id),
            Err(missing) => {
                #[cfg(feature = "cluster")]
                if let (true, Some(s)) = (missing, &self.shards) {
                    s.ensure();
                }
                let _ = missing;
                None
            }
        }
    }

    /// Writes `isr` as unit `unit`'s in-sync replicas, if the unit is still
    /// as `from` was read (see `etcd::Shards::alter_isr`); `Ok(false)`:
    /// it changed meanwhile, or single-node mode (which has no units).
    pub async fn alter_isr(&self, unit: &str, from: &topics::UnitRecord, isr: Vec<i32>) -> Result<bool, String> {
        #[cfg(feature = "cluster")]
        if let Some(s) = &self.shards {
            return s.alter_isr(unit, from, isr).await;
        }
        let _ = (unit, from, isr);
        Ok(false)
    }

    /// ElectLeaders (preferred): each unit goes to its preferred leader,
    /// by compare-and-swap on its key (a lost race decided again from the
    /// newer view); one answer per unit, in order, once this node's view
    /// shows each election made, or at `timeout`. Single-node mode: this
    /// node leads everything, so no election is needed.
    pub async fn elect_preferred(&self, units: &[String], timeout: std::time::Duration) -> Vec<Elected> {
        self.elect(units, false, timeout).await
    }

    /// ElectLeaders (unclean): [`Membership::elect_preferred`] with
    /// [`topics::unclean_election`]: a unit whose leader is gone goes to a
    /// live ISR member, or to any live replica.
    pub async fn elect_unclean(&self, units: &[String], timeout: std::time::Duration) -> Vec<Elected> {
        self.elect(units, true, timeout).await
    }

    async fn elect(&self, units: &[String], unclean: bool, timeout: std::time::Duration) -> Vec<Elected> {
        #[cfg(feature = "cluster")]
        if let Some(s) = &self.shards {
            let answers = UnitAnswers { done: Elected::Done, unknown: Elected::Unknown, timed_out: Elected::TimedOut, failed: Elected::Failed };
            let decide = |view: &ClusterView, _: usize, u: &topics::UnitRecord| {
                let election = if unclean { topics::unclean_election(view, u) } else { topics::preferred_election(view, u) };
                match election {
                    Err(topics::NoElection::NotNeeded) => Err(Elected::NotNeeded),
                    Err(topics::NoElection::NotAvailable) => Err(Elected::NotAvailable),
                    Ok(to) => Ok(Some(to)),
                }
            };
            let written = |name: &str, _: usize, to: &topics::UnitRecord| tracing::info!(unit = %name, leader = to.leader, leader_epoch = to.leader_epoch, unclean, "leader elected (ElectLeaders)");
            return self.change_units(s, units, timeout, answers, decide, written).await;
        }
        let _ = (timeout, unclean);
        units.iter().map(|_| Elected::NotNeeded).collect()
    }

    /// AlterPartitionReassignments: each unit moves to its target, or its
    /// reassignment under way is cancelled (`None`), as
    /// [`topics::reassign`] decides (a target of another size only if
    /// `factor_may_change`), written as [`Membership::change_units`]
    /// writes; one answer per unit, in order. The controller finishes
    /// each move ([`topics::reassignments_done`]). Single-node mode: every
    /// partition has this node as its one replica, and no other can be
    /// named.
    pub async fn reassign(&self, units: &[(String, Option<Vec<i32>>)], factor_may_change: bool, timeout: std::time::Duration) -> Vec<Reassigned> {
        #[cfg(feature = "cluster")]
        if let Some(s) = &self.shards {
            let names: Vec<String> = units.iter().map(|(n, _)| n.clone()).collect();
            let answers = UnitAnswers { done: Reassigned::Done, unknown: Reassigned::Unknown, timed_out: Reassigned::TimedOut, failed: Reassigned::Failed };
            let decide = |view: &ClusterView, i: usize, u: &topics::UnitRecord| topics::reassign(view, &units[i].0, u, units[i].1.as_deref(), factor_may_change).map_err(Reassigned::Refused);
            let written = |name: &str, i: usize, to: &topics::UnitRecord| {
                let how = if units[i].1.is_some() { "begun" } else { "cancelled" };
                tracing::info!(unit = %name, replicas = ?to.replicas, adding = ?to.adding, removing = ?to.removing, leader = to.leader, "reassignment {how}");
            };
            return self.change_units(s, &names, timeout, answers, decide, written).await;
        }
        let _ = timeout;
        let view = self.view();
        let me = topics::UnitRecord { replicas: vec![self.node_id], leader: self.node_id, leader_epoch: 0, isr: vec![self.node_id], adding: Vec::new(), removing: Vec::new(), mod_revision: 0 };
        units
            .iter()
            .map(|(name, target)| match topics::reassign(&view, name, &me, target.as_deref(), factor_may_change) {
                Ok(_) => Reassigned::Done,
                Err(no) => Reassigned::Refused(no),
            })
            .collect()
    }

    /// Changes each of `units` as `decide` says from the latest view
    /// (`Err`: the answer, nothing written; `Ok(None)`: nothing to write,
    /// done; `Ok(Some(to))`: write `to`), by compare-and-swap on the unit's
    /// key against the revision it was read at; a lost race is decided
    /// again from the newer view. One answer per unit, in order, once this
    /// node's view shows each write (the unit's revision past the one it
    /// was read at), or at `timeout`. `written` logs a write.
    #[cfg(feature = "cluster")]
    async fn change_units<A: Clone>(
        &self,
        s: &etcd::Shards,
        units: &[String],
        timeout: std::time::Duration,
        answers: UnitAnswers<A>,
        mut decide: impl FnMut(&ClusterView, usize, &topics::UnitRecord) -> Result<Option<topics::UnitRecord>, A>,
        written: impl Fn(&str, usize, &topics::UnitRecord),
    ) -> Vec<A> {
        let deadline = tokio::time::Instant::now() + timeout;
        let mut out: Vec<Option<A>> = vec![None; units.len()];
        // Units written, with the revision they were read at.
        let mut read_at: BTreeMap<usize, i64> = BTreeMap::new();
        let mut views = self.view.clone();
        loop {
            let view = views.borrow_and_update().clone();
            for (i, name) in units.iter().enumerate() {
                if out[i].is_some() {
                    continue;
                }
                let Some(u) = view.units.get(name) else {
                    out[i] = Some(answers.unknown.clone());
                    continue;
                };
                if let Some(at) = read_at.get(&i) {
                    if u.mod_revision > *at {
                        out[i] = Some(answers.done.clone());
                    }
                    continue;
                }
                match decide(&view, i, u) {
                    Err(a) => out[i] = Some(a),
                    Ok(None) => out[i] = Some(answers.done.clone()),
                    Ok(Some(to)) => match s.replace_unit(name, u, to.clone()).await {
                        Ok(true) => {
                            written(name, i, &to);
                            read_at.insert(i, u.mod_revision);
                        }
                        // Changed meanwhile: decided again from the next view.
                        Ok(false) => {}
                        Err(e) => out[i] = Some((answers.failed)(e)),
                    },
                }
            }
            if out.iter().all(Option::is_some) {
                return out.into_iter().map(|a| a.expect("answered")).collect();
            }
            let next = tokio::time::timeout(std::time::Duration::from_millis(500), views.changed());
            match tokio::time::timeout_at(deadline, next).await {
                Err(_) => return out.into_iter().map(|a| a.unwrap_or_else(|| answers.timed_out.clone())).collect(),
                Ok(Ok(Err(_))) => return out.into_iter().map(|a| a.unwrap_or_else(|| (answers.failed)("this node left the cluster".into()))).collect(),
                Ok(_) => {}
            }
        }
    }

    /// Controlled shutdown: every unit this node leads goes to the first
    /// other live member of its ISR (in replica order), in the next epoch,
    /// with this node out of its ISR; each written by compare-and-swap, a
    /// lost race decided again from the newer view. Returns once this
    /// node's view shows it leading nothing it could hand over, or at
    /// `timeout`, etcd's answers included (units without another live ISR
    /// member stay: Kafka does not elect outside the ISR). Two nodes
    /// stopping at once may hand units to each other; the second hands
    /// them on, or they wait for an election. Nothing in single-node mode.
    pub async fn resign(&self, timeout: std::time::Duration) {
        #[cfg(feature = "cluster")]
        if let Some(s) = &self.shards {
            let deadline = tokio::time::Instant::now() + timeout;
            let mut views = self.view.clone();
            // Units handed over, and of those the coordinator shards'.
            let (mut moved, mut shards) = (0usize, 0usize);
            loop {
                let view = views.borrow_and_update().clone();
                let handovers = topics::handovers(&view, self.node_id);
                if handovers.is_empty() {
                    tracing::info!(units = moved, coordinator_shards = shards, "controlled shutdown: leadership handed over");
                    return;
                }
                let writes = async {
                    for (unit, from, to) in &handovers {
                        match s.replace_unit(unit, from, to.clone()).await {
                            Ok(true) => {
                                moved += 1;
                                shards += usize::from(unit.starts_with(topics::COORDINATOR_BRANCH) && unit[topics::COORDINATOR_BRANCH.len()..].starts_with('~'));
                            }
                            Ok(false) => {}
                            Err(e) => tracing::warn!(%unit, error = %e, "controlled shutdown: handing a unit over failed"),
                        }
                    }
                    // Until the view has moved on (or a little, for a write
                    // that failed), then again.
                    tokio::time::timeout(std::time::Duration::from_millis(500), views.changed()).await
                };
                match tokio::time::timeout_at(deadline, writes).await {
                    Err(_) => {
                        tracing::warn!(units = handovers.len(), "controlled shutdown: leadership not handed over in time; stopping anyway");
                        return;
                    }
                    // The session ended: no view will come.
                    Ok(Ok(Err(_))) => return,
                    Ok(_) => {}
                }
            }
        }
        let _ = timeout;
    }

    /// A producer id from this node's block of the cluster's ids (cluster
    /// mode); `None` in single-node mode, where the catalog hands them out.
    pub async fn allocate_producer_id(&self) -> Option<Result<i64, String>> {
        #[cfg(feature = "cluster")]
        if let Some(p) = &self.producer_ids {
            return Some(p.allocate().await);
        }
        None
    }

    /// Cluster mode: every producer id below the returned one was handed
    /// out, as etcd says now (not as this node's watch has shown so far).
    /// `None` in single-node mode, or when etcd does not answer.
    pub async fn producer_ids_end_now(&self) -> Option<i64> {
        #[cfg(feature = "cluster")]
        if let Some(p) = &self.producer_ids {
            return p.end_now().await.inspect_err(|e| tracing::warn!(error = %e, "reading the producer id counter failed")).ok();
        }
        None
    }

    pub fn node_id(&self) -> i32 {
        self.node_id
    }

    /// This node's rack (`broker_rack`).
    pub fn rack(&self) -> Option<&str> {
        self.rack.as_deref()
    }

    /// Whether this node leads `topic`'s partition `partition` in `view`
    /// now: the view names it, and its registration is certainly alive (a
    /// node past its lease may have been replaced). `Ok`: the leader
    /// epoch; `Err`: the (leader, epoch) clients should go to, leader -1
    /// when none is known. Always `Ok(0)` in single-node mode. Once
    /// replication runs ([`Membership::set_begun`]), the node must also
    /// have begun the epoch in the partition, so everything it appends
    /// carries it; until then it names itself, and clients retry.
    pub fn lead(&self, view: &ClusterView, topic: &str, partition: i32) -> Result<i32, (i32, i32)> {
        if view.single {
            return Ok(0);
        }
        let s = view.partition(self.node_id, topic, partition);
        if s.leader == self.node_id && self.in_good_standing() {
            return match self.begun.get() {
                Some(begun) if !begun(topic, partition, s.leader_epoch) => Err((self.node_id, s.leader_epoch)),
                _ => Ok(s.leader_epoch),
            };
        }
        Err((if s.leader == self.node_id { -1 } else { s.leader }, s.leader_epoch))
    }

    /// Replication's answer to whether an epoch is begun (once).
    pub fn set_begun(&self, begun: Begun) {
        let _ = self.begun.set(begun);
    }

    /// [`Membership::lead`] as a yes or no.
    pub fn leads(&self, view: &ClusterView, topic: &str, partition: i32) -> bool {
        self.lead(view, topic, partition).is_ok()
    }

    /// The latest view (cheap: an `Arc`).
    pub fn view(&self) -> Arc<ClusterView> {
        self.view.borrow().clone()
    }

    /// A receiver that wakes at every new view.
    pub fn subscribe(&self) -> watch::Receiver<Arc<ClusterView>> {
        self.view.clone()
    }

    /// Whether this node's registration is still certainly alive: its
    /// lease was renewed recently enough that etcd cannot have expired it.
    /// Past that, the node must not act as a member (lead, coordinate).
    pub fn in_good_standing(&self) -> bool {
        self.fence.alive()
    }
}

impl ClusterView {
    /// The controller's id, or -1 while there is none (Kafka's answer).
    pub fn controller_id(&self) -> i32 {
        self.controller.map_or(-1, |c| c.id)
    }
}

/// Now on the boot-time clock: monotonic, and also counting the time the
/// machine or VM was suspended (`Instant` does not), as a lease in etcd
/// goes on expiring meanwhile.
#[cfg(any(target_os = "linux", target_os = "android"))]
pub(crate) fn boot_now() -> Duration {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::Boottime);
    Duration::new(t.tv_sec as u64, t.tv_nsec as u32)
}

/// Elsewhere, the monotonic clock (which may stop while suspended).
#[cfg(not(any(target_os = "linux", target_os = "android")))]
pub(crate) fn boot_now() -> Duration {
    static ORIGIN: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    ORIGIN.get_or_init(std::time::Instant::now).elapsed() + Duration::from_secs(1)
}

/// The local deadline of a node's lease, on the boot-time clock
/// ([`boot_now`]): the send time of the last keep-alive etcd acknowledged,
/// plus the lease's TTL, minus a margin for clock rate differences. A
/// paused process (SIGSTOP) or a suspended machine wakes past it, and then
/// knows it may have been expired.
pub(crate) struct Fence {
    /// Microseconds of [`boot_now`]; `u64::MAX`: no deadline (single node);
    /// 0: no lease.
    deadline_us: AtomicU64,
}

// Without the `cluster` feature only single-node mode's fence is made.
#[cfg_attr(not(feature = "cluster"), allow(dead_code))]
impl Fence {
    pub(crate) fn forever() -> Fence {
        Fence { deadline_us: AtomicU64::new(u64::MAX) }
    }

    pub(crate) fn lapsed() -> Fence {
        Fence { deadline_us: AtomicU64::new(0) }
    }

    /// The lease is certainly alive until `until` (a [`boot_now`] time).
    pub(crate) fn extend(&self, until: Duration) {
        let us = until.as_micros().min(u64::MAX as u128 - 1) as u64;
        self.deadline_us.fetch_max(us, Ordering::AcqRel);
    }

    /// The lease is gone (expired, revoked): nothing is certain until a new
    /// registration extends it again.
    pub(crate) fn revoke(&self) {
        self.deadline_us.store(0, Ordering::Release);
    }

    pub(crate) fn alive(&self) -> bool {
        let d = self.deadline_us.load(Ordering::Acquire);
        d == u64::MAX || (boot_now().as_micros() as u64) < d
    }
}

/// What a preferred-leader election of a unit came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Elected {
    Done,
    /// Its preferred leader leads it already.
    NotNeeded,
    /// Its preferred leader is not registered or not in sync.
    NotAvailable,
    /// No such unit.
    Unknown,
    TimedOut,
    Failed(String),
}

/// The answers a per-unit change gives besides its own refusals.
#[cfg(feature = "cluster")]
struct UnitAnswers<A> {
    done: A,
    unknown: A,
    timed_out: A,
    failed: fn(String) -> A,
}

/// What a reassignment (or its cancellation) of a unit came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reassigned {
    /// Written (the controller finishes a move), or nothing to write.
    Done,
    Refused(topics::NoReassignment),
    /// No such unit.
    Unknown,
    TimedOut,
    Failed(String),
}

/// Where a cluster node's ACLs, SCRAM users and quotas live (etcd).
pub struct SecurityStores {
    pub acls: Arc<dyn crate::auth::acl::AclStore>,
    pub users: Arc<dyn crate::auth::users::UserDirectory>,
    pub quotas: Arc<dyn crate::auth::quota::QuotaDirectory>,
}

/// The quotas of a view, as the node enforces them.
pub fn quotas_of(v: &ClusterView) -> crate::auth::quota::Entries {
    v.quotas.values().map(|r| (r.entity.clone(), r.known())).filter(|(_, values)| !values.is_empty()).collect()
}

/// Makes `authorizer`, `users` and `quotas` take their ACLs, users and
/// quotas from the cluster: those of the current view at once, then every
/// view's whose ACLs, users or quotas changed, until `stop`. The catalog's are not used in
/// cluster mode (see [`hand_over_users`]).
pub fn follow_security(authorizer: &Arc<crate::auth::acl::Authorizer>, users: &Arc<crate::auth::users::UserStore>, quotas: &Arc<crate::auth::quota::Quotas>, stores: SecurityStores, membership: &Membership, mut stop: watch::Receiver<bool>) {
    let acls_of = |v: &ClusterView| v.acls.values().cloned().collect();
    let users_of = |v: &ClusterView| v.users.iter().map(|(u, c)| (u.clone(), c.clone())).collect();
    let mut views = membership.subscribe();
    let first = views.borrow_and_update().clone();
    authorizer.set_store(stores.acls, first.revision.max(1), acls_of(&first));
    users.set_directory(stores.users, first.revision.max(1), users_of(&first));
    quotas.set_directory(stores.quotas, first.revision.max(1), quotas_of(&first));
    let (authorizer, users, quotas) = (authorizer.clone(), users.clone(), quotas.clone());
    let (mut seen_acls, mut seen_users, mut seen_quotas) = (first.acls.clone(), first.users.clone(), first.quotas.clone());
    tokio::spawn(async move {
        loop {
            tokio::select! {
                changed = views.changed() => if changed.is_err() { return },
                _ = stop.changed() => return,
            }
            let view = views.borrow_and_update().clone();
            if !Arc::ptr_eq(&seen_acls, &view.acls) {
                seen_acls = view.acls.clone();
                authorizer.follow(view.revision, acls_of(&view));
            }
            if !Arc::ptr_eq(&seen_users, &view.users) {
                seen_users = view.users.clone();
                users.follow(view.revision, users_of(&view));
            }
            if !Arc::ptr_eq(&seen_quotas, &view.quotas) {
                seen_quotas = view.quotas.clone();
                quotas.follow(view.revision, quotas_of(&view));
            }
        }
    });
}

/// Cluster mode: users set in this node's data directory (`canopy user`
/// while it was stopped, or before it joined a cluster) go to the cluster
/// if it has no user of that name (the cluster's is never overwritten:
/// a node's old copy must not bring back a deleted user or an old
/// password), and leave the catalog either way, so they do not come back
/// with this node's next start. Blocking. Returns how many the cluster
/// took.
pub fn hand_over_users(local: crate::auth::users::Users, directory: &dyn crate::auth::users::UserDirectory, catalog: &crate::meta::Catalog) -> Result<usize, String> {
    let mut names: Vec<&String> = local.keys().collect();
    names.sort();
    if names.is_empty() {
        return Ok(0);
    }
    let taken = directory.hand_over(&local)?;
    let mut count = 0;
    for user in names {
        if taken.contains(user) {
            count += 1;
        } else {
            tracing::warn!(user = %user, "the cluster has a user of this name already; this node's copy is dropped (change it with AlterUserScramCredentials)");
        }
        catalog.put_scram_user(user, &Default::default()).map_err(|e| e.to_string())?;
    }
    Ok(count)
}

/// How many producer ids a node takes from etcd at a time (KIP-730's
/// block size).
pub const PRODUCER_ID_BLOCK: i64 = 1000;

/// The producer ids a node holds: the block it hands out from, and the
/// next, taken ahead once the current one is half used, so that an id is
/// handed out well after its block was recorded in etcd (where the other
/// nodes learn, through their watch, that ids below it are real).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct IdBlocks {
    current: std::ops::Range<i64>,
    ahead: Option<std::ops::Range<i64>>,
}

impl IdBlocks {
    /// The next id, if one is held.
    pub fn take(&mut self) -> Option<i64> {
        if self.current.is_empty() {
            self.current = self.ahead.take()?;
        }
        let id = self.current.start;
        self.current.start += 1;
        Some(id)
    }

    /// Whether a block should be taken now: nothing is held ahead and the
    /// current block is at least half used.
    pub fn wants_block(&self) -> bool {
        self.ahead.is_none() && (self.current.end - self.current.start) * 2 <= PRODUCER_ID_BLOCK
    }

    /// Whether no id is held.
    pub fn is_empty(&self) -> bool {
        self.current.is_empty() && self.ahead.as_ref().is_none_or(|a| a.is_empty())
    }

    pub fn add(&mut self, block: std::ops::Range<i64>) {
        if self.current.is_empty() && self.ahead.is_none() {
            self.current = block;
        } else {
            self.ahead = Some(block);
        }
    }
}

/// Builds a [`ClusterView`] from the cluster's keys: a full read, then the
/// watch's events, in revision order. Values that do not decode are left
/// out (and reported once by the caller): a damaged or foreign key must
/// not stop a node from following the rest.
#[derive(Debug, Default, Clone)]
pub struct ViewBuilder {
    view: ClusterView,
}

/// One change to a key under the cluster's prefix.
#[derive(Debug, Clone)]
pub enum KeyEvent<'a> {
    /// `mod_revision`: the key's revision after this put.
    Put { key: &'a [u8], value: &'a [u8], create_revision: i64, mod_revision: i64 },
    Delete { key: &'a [u8] },
}

impl ViewBuilder {
    /// A view of the cluster `cluster_id` with nothing seen yet.
    pub fn new(cluster_id: String) -> ViewBuilder {
        ViewBuilder { view: ClusterView { cluster_id, ..ClusterView::default() } }
    }

    pub fn view(&self) -> &ClusterView {
        &self.view
    }

    /// See [`ClusterView::unclean_by_default`].
    pub fn unclean_by_default(mut self, allowed: bool) -> ViewBuilder {
        self.view.unclean_by_default = allowed;
        self
    }

    /// Applies one event of `revision`. `Err` names a value that did not
    /// decode (the event is otherwise ignored).
    pub fn apply(&mut self, keys: &keys::Keys, event: KeyEvent<'_>, revision: i64) -> Result<(), String> {
        self.view.revision = self.view.revision.max(revision);
        let (key, value) = match event {
            KeyEvent::Put { key, value, create_revision, mod_revision } => (key, Some((value, create_revision, mod_revision))),
            KeyEvent::Delete { key } => (key, None),
        };
        match keys.parse(key) {
            Some(keys::Key::Node(id)) => {
                // A record that does not decode leaves the node out (not
                // its previous record in).
                self.view.nodes.remove(&id);
                if let Some((v, create_revision, _)) = value {
                    let mut rec: NodeRecord = serde_json::from_slice(v).map_err(|e| format!("node {id}: {e}"))?;
                    if rec.id != id {
                        return Err(format!("node {id}: the record names node {}", rec.id));
                    }
                    rec.incarnation = create_revision;
                    self.view.nodes.insert(id, rec);
                }
            }
            Some(keys::Key::Controller) => {
                self.view.controller = None;
                if let Some((v, create_revision, _)) = value {
                    let id = std::str::from_utf8(v).ok().and_then(|s| s.parse::<i32>().ok()).ok_or("controller: not a node id")?;
                    self.view.controller = Some(Controller { id, epoch: create_revision });
                }
            }
            Some(keys::Key::ProducerIds) => {
                if let Some((v, _, _)) = value {
                    let end = std::str::from_utf8(v).ok().and_then(|s| s.parse::<i64>().ok()).filter(|n| *n >= 1).ok_or("producer_ids: not a positive number")?;
                    self.view.producer_ids_end = self.view.producer_ids_end.max(end);
                }
            }
            Some(keys::Key::Topic(name)) => {
                // Unlike a node's record, a damaged topic key must not read
                // as a deleted topic (every node would drop its data): its
                // last good entry stays, and its name is marked so nodes
                // keep what they have of it.
                let Some((v, _, _)) = value else {
                    Arc::make_mut(&mut self.view.topics).remove(&name);
                    Arc::make_mut(&mut self.view.damaged_topics).remove(&name);
                    return Ok(());
                };
                let decoded = serde_json::from_slice::<TopicEntry>(v).map_err(|e| e.to_string()).and_then(|entry| entry.check().map(|()| entry));
                match decoded {
                    Ok(entry) => {
                        Arc::make_mut(&mut self.view.topics).insert(name.clone(), entry);
                        if self.view.damaged_topics.contains(&name) {
                            Arc::make_mut(&mut self.view.damaged_topics).remove(&name);
                        }
                    }
                    Err(why) => {
                        Arc::make_mut(&mut self.view.damaged_topics).insert(name.clone());
                        return Err(format!("topic {name}: {why}"));
                    }
                }
            }
            Some(keys::Key::Unit(name)) => {
                let units = Arc::make_mut(&mut self.view.units);
                units.remove(&name);
                if let Some((v, _, mod_revision)) = value {
                    let mut unit: UnitRecord = serde_json::from_slice(v).map_err(|e| format!("unit {name}: {e}"))?;
                    unit.check().map_err(|why| format!("unit {name}: {why}"))?;
                    unit.mod_revision = mod_revision;
                    units.insert(name, unit);
                }
            }
            Some(keys::Key::Acl(id)) => {
                // A damaged value keeps the ACL the key last held (logged
                // by the caller), as a topic's does: dropping it would turn
                // a DENY into an allow. One never readable is left out.
                let Some((v, _, _)) = value else {
                    Arc::make_mut(&mut self.view.acls).remove(&id);
                    return Ok(());
                };
                let acl: crate::auth::acl::Acl = serde_json::from_slice(v).map_err(|e| format!("ACL {id}: {e}"))?;
                if let Some(why) = acl.invalid() {
                    return Err(format!("ACL {id}: {why}"));
                }
                if keys::acl_id(&acl) != id {
                    return Err(format!("ACL {id}: the key is not the value's"));
                }
                Arc::make_mut(&mut self.view.acls).insert(id, acl);
            }
            Some(keys::Key::BrokerConfigs) => {
                // As a topic's: a damaged value keeps the last good one
                // (dropping every default would change every topic).
                let configs = match value {
                    Some((v, _, _)) => serde_json::from_slice::<BTreeMap<String, String>>(v).map_err(|e| format!("broker configs: {e}"))?,
                    None => BTreeMap::new(),
                };
                self.view.broker_configs = Arc::new(configs);
            }
            Some(keys::Key::Quota(id)) => {
                if self.view.quotas.contains_key(&id) {
                    Arc::make_mut(&mut self.view.quotas).remove(&id);
                }
                if let Some((v, _, _)) = value {
                    let record: crate::auth::quota::QuotaRecord = serde_json::from_slice(v).map_err(|e| format!("quota {id}: {e}"))?;
                    if keys::quota_id(&record.entity) != id {
                        return Err(format!("quota {id}: the key is not the value's entity"));
                    }
                    if let Some(why) = record.known().iter().find_map(|(k, v)| k.invalid(*v)) {
                        return Err(format!("quota {id}: {why}"));
                    }
                    Arc::make_mut(&mut self.view.quotas).insert(id, record);
                }
            }
            Some(keys::Key::Scram(user)) => {
                // As an ACL: a damaged user is left out (cannot log in).
                if self.view.users.contains_key(&user) {
                    Arc::make_mut(&mut self.view.users).remove(&user);
                }
                if let Some((v, _, _)) = value {
                    let creds: crate::auth::users::Credentials = serde_json::from_slice(v).map_err(|e| format!("user {user:?}: {e}"))?;
                    if creds.is_empty() || creds.iter().any(|(m, c)| !c.fits(*m)) {
                        return Err(format!("user {user:?}: not a credential per mechanism"));
                    }
                    Arc::make_mut(&mut self.view.users).insert(user, creds);
                }
            }
            Some(keys::Key::ClusterId) => {
                if let Some((v, _, _)) = value {
                    self.view.cluster_id = String::from_utf8(v.to_vec()).map_err(|_| "cluster id: not UTF-8")?;
                }
            }
            None => {}
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(id: i32) -> NodeRecord {
        NodeRecord { id, rack: None, incarnation: 7, endpoints: vec![Endpoint { listener: "PLAINTEXT".into(), host: "127.0.0.1".into(), port: 9092 + id }] }
    }

    #[test]
    fn a_view_follows_puts_and_deletes_and_skips_what_does_not_decode() {
        let k = keys::Keys::new("c1");
        let mut b = ViewBuilder::default();
        let one = serde_json::to_vec(&rec(1)).unwrap();
        let two = serde_json::to_vec(&rec(2)).unwrap();
        b.apply(&k, KeyEvent::Put { key: &k.cluster_id(), value: b"abc", create_revision: 2, mod_revision: 2 }, 2).unwrap();
        b.apply(&k, KeyEvent::Put { key: &k.node(1), value: &one, create_revision: 3, mod_revision: 3 }, 3).unwrap();
        b.apply(&k, KeyEvent::Put { key: &k.node(2), value: &two, create_revision: 4, mod_revision: 4 }, 4).unwrap();
        b.apply(&k, KeyEvent::Put { key: &k.controller(), value: b"2", create_revision: 5, mod_revision: 5 }, 5).unwrap();
        b.apply(&k, KeyEvent::Put { key: &k.producer_ids(), value: b"2001", create_revision: 3, mod_revision: 5 }, 5).unwrap();
        assert_eq!(b.view().producer_ids_end, 2001);
        assert!(b.apply(&k, KeyEvent::Put { key: &k.producer_ids(), value: b"-4", create_revision: 3, mod_revision: 5 }, 5).is_err());
        assert_eq!(b.view().nodes.keys().copied().collect::<Vec<_>>(), vec![1, 2]);
        assert_eq!(b.view().controller, Some(Controller { id: 2, epoch: 5 }));
        assert_eq!((b.view().cluster_id.as_str(), b.view().revision), ("abc", 5));

        assert_eq!(b.view().nodes[&2].incarnation, 4, "a registration's incarnation is its create revision");

        // Damage: a record that is not JSON, one naming another node. Each
        // is refused and leaves that node out, the others kept.
        assert!(b.apply(&k, KeyEvent::Put { key: &k.node(3), value: b"{not json", create_revision: 6, mod_revision: 6 }, 6).is_err());
        assert!(b.apply(&k, KeyEvent::Put { key: &k.node(3), value: &one, create_revision: 7, mod_revision: 7 }, 7).is_err());
        assert_eq!(b.view().nodes.keys().copied().collect::<Vec<_>>(), vec![1, 2]);
        assert!(b.apply(&k, KeyEvent::Put { key: &k.node(2), value: b"[]", create_revision: 4, mod_revision: 7 }, 7).is_err());
        assert_eq!(b.view().nodes.keys().copied().collect::<Vec<_>>(), vec![1], "a damaged update is no stale record");
        b.apply(&k, KeyEvent::Put { key: &k.node(2), value: &two, create_revision: 4, mod_revision: 7 }, 7).unwrap();
        // A controller that is not a number: no controller known.
        assert!(b.apply(&k, KeyEvent::Put { key: &k.controller(), value: b"two", create_revision: 8, mod_revision: 8 }, 8).is_err());
        assert_eq!(b.view().controller, None);
        b.apply(&k, KeyEvent::Put { key: &k.controller(), value: b"2", create_revision: 5, mod_revision: 8 }, 8).unwrap();
        // Keys of other clusters or unknown kinds change nothing.
        let other = keys::Keys::new("c2");
        b.apply(&k, KeyEvent::Put { key: &other.node(4), value: &one, create_revision: 9, mod_revision: 9 }, 9).unwrap();
        b.apply(&k, KeyEvent::Put { key: b"/canopy/c1/later/x", value: b"", create_revision: 10, mod_revision: 10 }, 10).unwrap();
        assert_eq!(b.view().nodes.len(), 2);

        // A node's lease lapses; the controller with it.
        b.apply(&k, KeyEvent::Delete { key: &k.node(2) }, 11).unwrap();
        b.apply(&k, KeyEvent::Delete { key: &k.controller() }, 11).unwrap();
        assert_eq!(b.view().nodes.keys().copied().collect::<Vec<_>>(), vec![1]);
        assert_eq!((b.view().controller, b.view().revision), (None, 11));
    }

    #[test]
    fn topics_and_units_follow_their_keys_and_a_damaged_topic_is_not_a_deleted_one() {
        let k = keys::Keys::new("c1");
        let mut b = ViewBuilder::new("id".into());
        let entry = TopicEntry { id: uuid::Uuid::new_v4().to_string(), partitions: 2, replication_factor: 1, configs: BTreeMap::new(), created_ms: 1 };
        let good = serde_json::to_vec(&entry).unwrap();
        let put = |b: &mut ViewBuilder, key: &[u8], value: &[u8], rev: i64| b.apply(&k, KeyEvent::Put { key, value, create_revision: 2, mod_revision: rev }, rev);
        put(&mut b, &k.topic("a.b"), &good, 2).unwrap();
        assert_eq!(b.view().topics.get("a.b"), Some(&entry));
        // Damaged: the last good entry stays, and the name is marked.
        assert!(put(&mut b, &k.topic("a.b"), b"{\"id\":1}", 3).is_err());
        assert!(put(&mut b, &k.topic("a.b"), &serde_json::to_vec(&TopicEntry { partitions: 0, ..entry.clone() }).unwrap(), 4).is_err());
        assert_eq!(b.view().topics.get("a.b"), Some(&entry));
        assert!(b.view().damaged_topics.contains("a.b"));
        // Damaged from the first read: nothing to follow, but marked.
        assert!(put(&mut b, &k.topic("c.d"), b"not json", 5).is_err());
        assert!(b.view().damaged_topics.contains("c.d") && !b.view().topics.contains_key("c.d"));
        // Repaired, then deleted.
        put(&mut b, &k.topic("a.b"), &good, 6).unwrap();
        assert!(!b.view().damaged_topics.contains("a.b"));
        b.apply(&k, KeyEvent::Delete { key: &k.topic("c.d") }, 7).unwrap();
        b.apply(&k, KeyEvent::Delete { key: &k.topic("a.b") }, 7).unwrap();
        assert!(b.view().topics.is_empty() && b.view().damaged_topics.is_empty());

        // Units carry their key's revision; a damaged one is left out.
        let unit = UnitRecord { replicas: vec![1], leader: 1, leader_epoch: 3, isr: vec![1], adding: Vec::new(), removing: Vec::new(), mod_revision: 0 };
        put(&mut b, &k.unit("a.b~0"), &serde_json::to_vec(&unit).unwrap(), 8).unwrap();
        assert_eq!(b.view().units["a.b~0"], UnitRecord { mod_revision: 8, ..unit.clone() });
        assert!(put(&mut b, &k.unit("a.b~0"), &serde_json::to_vec(&UnitRecord { leader: 5, ..unit }).unwrap(), 9).is_err(), "a leader that is no replica");
        assert!(b.view().units.is_empty());
    }

    #[test]
    fn id_blocks_hand_out_each_id_once_and_ask_ahead_at_half() {
        let mut b = IdBlocks::default();
        assert!(b.wants_block());
        assert_eq!(b.take(), None);
        b.add(1..1001);
        let mut seen = Vec::new();
        while !b.wants_block() {
            seen.push(b.take().unwrap());
        }
        assert_eq!(seen.len(), 500, "a block is asked for once half of the current one is used");
        b.add(5001..6001);
        assert!(!b.wants_block(), "one block ahead is enough");
        while let Some(id) = b.take() {
            seen.push(id);
        }
        let expected: Vec<i64> = (1..1001).chain(5001..6001).collect();
        assert_eq!(seen, expected, "every id of both blocks, in order, once");
        assert!(b.wants_block());
    }

    #[test]
    fn a_fence_holds_until_its_deadline_and_not_after_a_revoke() {
        let f = Fence::lapsed();
        assert!(!f.alive());
        f.extend(boot_now() + Duration::from_secs(60));
        assert!(f.alive());
        // An older keep-alive's answer arriving late does not shorten it.
        f.extend(boot_now());
        assert!(f.alive());
        f.revoke();
        assert!(!f.alive());
        f.extend(boot_now() - Duration::from_millis(1));
        assert!(!f.alive(), "a deadline in the past is no standing");
        assert!(Fence::forever().alive());
    }

    #[test]
    fn acls_follow_their_keys_and_a_damaged_one_keeps_the_last_good_value() {
        use crate::auth::acl::{Acl, Operation, PatternType, Permission, ResourceType};
        let k = keys::Keys::new("c1");
        let acl = |name: &str| Acl { resource_type: ResourceType::Topic, name: name.into(), pattern: PatternType::Prefixed, principal: "User:CN=w,O=x/y".into(), host: "*".into(), operation: Operation::Write, permission: Permission::Allow };
        let (a, b) = (acl("app."), acl("logs/\u{0}x"));
        let mut v = ViewBuilder::default();
        let put = |v: &mut ViewBuilder, key: &[u8], value: &[u8], rev| v.apply(&k, KeyEvent::Put { key, value, create_revision: rev, mod_revision: rev }, rev);
        put(&mut v, &k.acl(&a), &serde_json::to_vec(&a).unwrap(), 2).unwrap();
        assert_eq!(k.parse(&k.acl(&a)), Some(keys::Key::Acl(keys::acl_id(&a))));
        assert_eq!(v.view().acls.values().collect::<Vec<_>>(), vec![&a]);
        // Refused, the others kept: a value under another ACL's key, one
        // that is not JSON, one Kafka would not create (NUL in a field).
        assert!(put(&mut v, &k.acl(&acl("other.")), &serde_json::to_vec(&a).unwrap(), 3).is_err());
        assert!(put(&mut v, &k.acl(&acl("x")), b"{", 4).is_err());
        assert!(put(&mut v, &k.acl(&b), &serde_json::to_vec(&b).unwrap(), 5).is_err());
        assert_eq!(v.view().acls.len(), 1);
        // A damaged update of a good key keeps the ACL it held (a lost
        // DENY would allow).
        assert!(put(&mut v, &k.acl(&a), b"[]", 6).is_err());
        assert_eq!(v.view().acls.values().collect::<Vec<_>>(), vec![&a]);
        v.apply(&k, KeyEvent::Delete { key: &k.acl(&a) }, 8).unwrap();
        assert!(v.view().acls.is_empty());
    }

    #[test]
    fn users_follow_their_keys_and_a_damaged_one_cannot_log_in() {
        use crate::auth::scram::{Credential, Mechanism};
        let k = keys::Keys::new("c1");
        let creds: crate::auth::users::Credentials = [(Mechanism::Sha256, Credential::from_password(Mechanism::Sha256, b"pw", 4096))].into();
        let mut v = ViewBuilder::default();
        let put = |v: &mut ViewBuilder, key: &[u8], value: &[u8], rev| v.apply(&k, KeyEvent::Put { key, value, create_revision: rev, mod_revision: rev }, rev);
        put(&mut v, &k.scram("alice"), &serde_json::to_vec(&creds).unwrap(), 2).unwrap();
        assert_eq!(v.view().users.get("alice"), Some(&creds));
        // A SHA-256 credential filed as SHA-512, no credential at all, not
        // JSON: refused, and the user left out rather than kept stale.
        let mut wrong = crate::auth::users::Credentials::new();
        wrong.insert(Mechanism::Sha512, creds[&Mechanism::Sha256].clone());
        for bad in [serde_json::to_vec(&wrong).unwrap(), b"{}".to_vec(), b"[".to_vec()] {
            assert!(put(&mut v, &k.scram("alice"), &bad, 3).is_err());
            assert!(v.view().users.is_empty());
            put(&mut v, &k.scram("alice"), &serde_json::to_vec(&creds).unwrap(), 4).unwrap();
        }
        v.apply(&k, KeyEvent::Delete { key: &k.scram("alice") }, 5).unwrap();
        assert!(v.view().users.is_empty());
    }

    #[test]
    fn broker_configs_follow_their_key_and_a_damaged_value_keeps_the_last() {
        let k = keys::Keys::new("c1");
        let mut v = ViewBuilder::default();
        let put = |v: &mut ViewBuilder, value: &[u8], rev| v.apply(&k, KeyEvent::Put { key: &k.broker_configs(), value, create_revision: 2, mod_revision: rev }, rev);
        put(&mut v, br#"{"log.retention.ms":"1000"}"#, 2).unwrap();
        assert_eq!(v.view().broker_configs.get("log.retention.ms").map(String::as_str), Some("1000"));
        assert!(put(&mut v, b"[1]", 3).is_err());
        assert_eq!(v.view().broker_configs.len(), 1, "the last good configs stay");
        v.apply(&k, KeyEvent::Delete { key: &k.broker_configs() }, 4).unwrap();
        assert!(v.view().broker_configs.is_empty());
    }

    #[test]
    fn quotas_follow_their_keys_and_a_bad_value_is_left_out() {
        use crate::auth::quota::{Entity, Kind, Name, QuotaRecord};
        let k = keys::Keys::new("c1");
        let alice = Entity { user: Some(Name::Named("alice".into())), client_id: Some(Name::Default) };
        let rec = |e: &Entity, v: f64| serde_json::to_vec(&QuotaRecord::new(e.clone(), &[(Kind::Produce, v)].into())).unwrap();
        let mut v = ViewBuilder::default();
        let put = |v: &mut ViewBuilder, key: &[u8], value: &[u8], rev| v.apply(&k, KeyEvent::Put { key, value, create_revision: rev, mod_revision: rev }, rev);
        put(&mut v, &k.quota(&alice), &rec(&alice, 1024.0), 2).unwrap();
        assert_eq!(quotas_of(v.view()), [(alice.clone(), [(Kind::Produce, 1024.0)].into())].into());
        // A negative rate, another entity's record: refused, left out.
        assert!(put(&mut v, &k.quota(&alice), &rec(&alice, -1.0), 3).is_err());
        assert!(quotas_of(v.view()).is_empty());
        let bob = Entity { user: Some(Name::Named("bob".into())), client_id: None };
        assert!(put(&mut v, &k.quota(&bob), &rec(&alice, 1.0), 4).is_err());
        put(&mut v, &k.quota(&alice), &rec(&alice, 2048.0), 5).unwrap();
        v.apply(&k, KeyEvent::Delete { key: &k.quota(&alice) }, 6).unwrap();
        assert!(quotas_of(v.view()).is_empty());
    }

    /// A directory that takes every change, or none.
    struct FakeUsers(bool, std::sync::Mutex<Vec<String>>);

    impl crate::auth::users::UserDirectory for FakeUsers {
        fn alter(&self, groups: &[Vec<crate::auth::users::Alteration>]) -> Result<(Vec<Result<(), crate::auth::users::AlterError>>, i64, crate::auth::users::Users), String> {
            if !self.0 {
                return Err("etcd is away".into());
            }
            self.1.lock().unwrap().extend(groups.iter().map(|g| g[0].user().to_owned()));
            Ok((groups.iter().map(|_| Ok(())).collect(), 9, Default::default()))
        }
        fn hand_over(&self, users: &crate::auth::users::Users) -> Result<std::collections::BTreeSet<String>, String> {
            if !self.0 {
                return Err("etcd is away".into());
            }
            // The cluster has "bob" already.
            let taken: std::collections::BTreeSet<String> = users.keys().filter(|u| *u != "bob").cloned().collect();
            self.1.lock().unwrap().extend(taken.iter().cloned());
            Ok(taken)
        }
    }

    #[test]
    fn catalog_users_go_to_the_cluster_and_leave_the_catalog() {
        use crate::auth::scram::Mechanism;
        let dir = tempfile::tempdir().unwrap();
        crate::auth::users::set_password(dir.path(), "alice", b"pw", &Mechanism::ALL, 4096).unwrap();
        crate::auth::users::set_password(dir.path(), "bob", b"pw", &Mechanism::ALL, 4096).unwrap();
        let catalog = crate::meta::Catalog::open(&dir.path().join("catalog")).unwrap();
        let local = crate::auth::users::UserStore::load(&catalog).unwrap().all();
        // The cluster away: nothing leaves the catalog.
        assert!(hand_over_users(local.clone(), &FakeUsers(false, Default::default()), &catalog).is_err());
        assert_eq!(catalog.scram_users().unwrap().len(), 2);
        // alice is taken; the cluster's bob is kept, this node's dropped.
        let taken = FakeUsers(true, Default::default());
        assert_eq!(hand_over_users(local, &taken, &catalog), Ok(1));
        assert_eq!(*taken.1.lock().unwrap(), vec!["alice".to_owned()]);
        assert!(catalog.scram_users().unwrap().is_empty(), "handed over or not, the users leave the catalog");
    }

    #[test]
    fn single_node_mode_is_a_cluster_of_one_controlled_by_itself() {
        let m = Membership::single("id".into(), rec(0));
        assert_eq!((m.node_id(), m.view().controller_id()), (0, 0));
        assert!(m.in_good_standing());
        assert_eq!(m.view().nodes.len(), 1);
        assert_eq!(m.view().nodes[&0].endpoint("PLAINTEXT").map(|e| e.port), Some(9092));
        assert_eq!(m.view().nodes[&0].endpoint("SSL"), None);
    }
}
