//! Replication between brokers (cluster mode; docs/cluster.md,
//! "Replication protocol"): Kafka's own. Followers fetch from their
//! unit's leader with Fetch and a replica id (`fetcher.rs`); the leader
//! answers them up to its log end (`handlers::replica_fetch`), keeps
//! each follower's position, and lets a tp's high watermark rise to what
//! every in-sync replica has. The leader also keeps the ISR: a follower
//! that has not caught up within `replica_lag_time_max_ms` leaves it, one
//! that has everything below the hw joins again, each by a
//! compare-and-swap on the unit's etcd key.
//!
//! Roles follow the view: [`Replication::reconcile`] begins this node's
//! leader epoch in every tp of a unit it now leads (before any produce is
//! taken in that epoch: `Broker::lead` asks [`Replication::leads`]),
//! freezes the hw of tps it no longer leads until their new leader says
//! more, and runs one fetcher per leader it follows.
//!
//! Single-node mode has none of this: every tp is led in epoch 0, with no
//! cap on its hw.

pub mod coordinators;
pub mod fetcher;
pub mod peers;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::cluster::topics::{unit_of, UnitRecord};
use crate::cluster::ClusterView;
use crate::engine::Topic;
use crate::kafka::Broker;
use crate::storage::Tp;

/// How often roles and ISRs are looked at besides view changes (a new
/// topic in a unit, a follower falling behind).
const TICK: Duration = Duration::from_millis(250);
/// How often the high watermarks are checkpointed (Kafka's
/// `replica.high.watermark.checkpoint.interval.ms`).
const HW_CHECKPOINT_EVERY: Duration = Duration::from_secs(5);

/// Writes the hw checkpoint every [`HW_CHECKPOINT_EVERY`], off the async
/// threads, until the broker stops (the engine writes the last one at
/// its shutdown); a failure leaves a lower bound on disk and is tried
/// again next time.
async fn checkpoint_hws(engine: Arc<crate::engine::Engine>, mut stop: watch::Receiver<bool>) {
    let mut every = tokio::time::interval(HW_CHECKPOINT_EVERY);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = every.tick() => {}
            _ = stop.changed() => return,
        }
        if *stop.borrow() {
            return;
        }
        let e = engine.clone();
        match tokio::task::spawn_blocking(move || e.checkpoint_hws()).await {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => tracing::warn!(error = %e, "writing the high-watermark checkpoint failed; trying again"),
            Err(e) => tracing::warn!(error = %e, "the high-watermark checkpoint task panicked"),
        }
    }
}

/// When a cluster task looks again: at every new view and every tick.
pub(crate) struct Rounds {
    views: watch::Receiver<Arc<ClusterView>>,
    tick: tokio::time::Interval,
}

impl Rounds {
    pub(crate) fn new(broker: &Broker, every: Duration) -> Rounds {
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        Rounds { views: broker.cluster.subscribe(), tick }
    }

    /// Waits for the next round; false once `stop` changes or the views end.
    pub(crate) async fn next(&mut self, stop: &mut watch::Receiver<bool>) -> bool {
        tokio::select! {
            changed = self.views.changed() => changed.is_ok(),
            _ = self.tick.tick() => true,
            _ = stop.changed() => false,
        }
    }
}

/// Replication's state on one node.
pub struct Replication {
    me: i32,
    /// Kafka's replica.lag.time.max.ms: a follower not caught up for this
    /// long leaves the ISR.
    lag_max_ms: i64,
    state: Mutex<State>,
    /// Bumped whenever what this node follows changes; fetchers watch it.
    follows: watch::Sender<u64>,
    /// What the metrics show (Kafka's ReplicaManager and fetcher gauges).
    pub stats: Stats,
}

/// Replication's gauges (set at every tick) and counters, named as
/// Kafka's: see `metrics::scrape`.
#[derive(Default)]
pub struct Stats {
    /// Partitions this node leads (LeaderCount).
    pub leader_partitions: AtomicU64,
    /// Of those, with an ISR smaller than the replica set
    /// (UnderReplicatedPartitions).
    pub under_replicated: AtomicU64,
    /// Of those, with an ISR smaller than `min.insync.replicas`
    /// (UnderMinIsrPartitionCount).
    pub under_min_isr: AtomicU64,
    /// Partitions without a live leader, counted by the controller only
    /// (OfflinePartitionsCount), and the view revision it was counted at.
    pub offline: AtomicU64,
    offline_revision: std::sync::atomic::AtomicI64,
    /// ISR changes this node wrote (IsrShrinksPerSec, IsrExpandsPerSec).
    pub isr_shrinks: AtomicU64,
    pub isr_expands: AtomicU64,
    /// Leader epochs this node began: summed over the nodes, the
    /// cluster's leader elections, per partition.
    pub leader_epochs: AtomicU64,
    /// The most records any followed partition is behind its leader's
    /// hw (the fetcher's MaxLag).
    pub max_lag: AtomicU64,
}

#[derive(Default)]
struct State {
    led: HashMap<Tp, Led>,
    followed: HashMap<Tp, Followed>,
    fetchers: HashMap<i32, JoinHandle<()>>,
    /// ISR members this node added to a unit it leads, until its view
    /// shows them: counted in the hw meanwhile (Kafka's maximal ISR), since
    /// etcd may already let them be elected.
    adding: HashMap<String, Vec<i32>>,
    /// When each tp last warned that its leader's log start passed it.
    out_of_range: HashMap<Tp, i64>,
    /// Per followed tp, records behind the leader's hw at the last fetch.
    lag: HashMap<Tp, i64>,
    /// Followed tps whose leader's log starts past this replica's log
    /// end: fetched from the leader's log start (Kafka's
    /// truncateFullyAndStartAt), until this replica's log reaches it.
    start_over: HashMap<Tp, i64>,
}

/// A tp this node leads.
struct Led {
    unit: String,
    epoch: i32,
    /// Where this node's epoch starts (its log end when it began): a
    /// follower joins the ISR only once it has that much.
    epoch_start: i64,
    /// When this node began leading (a follower's caught-up time before
    /// its first fetch).
    since_ms: i64,
    followers: HashMap<i32, Position>,
}

/// A follower's progress in one tp, as its fetches tell it.
#[derive(Debug, Clone, Copy)]
struct Position {
    /// The follower's registration it fetched in: a restarted node may
    /// have lost what it had (KIP-903), so its positions start over.
    incarnation: i64,
    fetch_offset: i64,
    /// The last time it had everything the leader had (Kafka's
    /// lastCaughtUpTimeMs).
    caught_up_ms: i64,
    last_fetch_ms: i64,
    /// The leader's log end at its last fetch.
    end_at_last_fetch: i64,
}

/// A tp this node follows.
#[derive(Clone)]
pub struct Followed {
    /// -1 while the unit has no live leader.
    pub leader: i32,
    pub leader_epoch: i32,
    pub topic: Arc<Topic>,
    pub partition: i32,
}

impl Replication {
    pub fn new(me: i32, lag_max_ms: i64) -> Arc<Replication> {
        Arc::new(Replication { me, lag_max_ms, state: Mutex::new(State::default()), follows: watch::Sender::new(0), stats: Stats::default() })
    }

    /// Whether this node has begun leader epoch `epoch` in `tp`: only then
    /// does it take produce there (its appends carry the epoch).
    pub fn leads(&self, tp: &Tp, epoch: i32) -> bool {
        self.state.lock().expect("replication lock").led.get(tp).is_some_and(|l| l.epoch == epoch)
    }

    /// Whether this node still follows `tp` from `leader` in `epoch`.
    pub fn follows(&self, tp: &Tp, leader: i32, epoch: i32) -> bool {
        self.state.lock().expect("replication lock").followed.get(tp).is_some_and(|f| f.leader == leader && f.leader_epoch == epoch)
    }

    /// Whether to warn now that `tp`'s leader no longer has what this
    /// replica needs (once a minute per tp).
    pub fn warn_out_of_range(&self, tp: &Tp, now_ms: i64) -> bool {
        let mut st = self.state.lock().expect("replication lock");
        let last = st.out_of_range.entry(*tp).or_insert(i64::MIN);
        let due = now_ms.saturating_sub(*last) >= 60_000;
        if due {
            *last = now_ms;
        }
        due
    }

    /// Where the fetcher asks `tp` from while its log end is `end`: the
    /// offset, and the epoch of the last batch fetched (-1 when this
    /// replica starts over at its leader's log start, having nothing the
    /// leader still has).
    pub fn fetch_from(&self, engine: &crate::engine::Engine, tp: &Tp, end: i64) -> (i64, i32) {
        let mut st = self.state.lock().expect("replication lock");
        match st.start_over.get(tp).copied() {
            Some(at) if at > end => (at, -1),
            Some(_) => {
                st.start_over.remove(tp);
                (end, engine.latest_epoch(tp))
            }
            None => (end, engine.latest_epoch(tp)),
        }
    }

    /// `tp`'s leader no longer has what follows this replica's log end:
    /// it starts over at the leader's log start `at`. True the first time.
    pub fn start_over(&self, tp: Tp, at: i64) -> bool {
        self.state.lock().expect("replication lock").start_over.insert(tp, at) != Some(at)
    }

    /// A fetch brought followed `tp` up to the leader's `hw`: its lag.
    pub fn lagged(&self, engine: &crate::engine::Engine, tp: Tp, hw: i64) {
        let end = engine.offsets(&tp).map_or(0, |o| o.2);
        self.state.lock().expect("replication lock").lag.insert(tp, (hw - end).max(0));
    }

    /// Sets the gauges of [`Stats`] from `view` and this node's roles.
    fn measure(&self, broker: &Broker, view: &ClusterView) {
        let mut st = self.state.lock().expect("replication lock");
        let State { led, followed, lag, start_over, .. } = &mut *st;
        lag.retain(|tp, _| followed.contains_key(tp));
        start_over.retain(|tp, _| followed.contains_key(tp));
        let (mut under, mut under_min) = (0, 0);
        for (tp, l) in led.iter() {
            let Some(u) = view.units.get(&l.unit) else { continue };
            // Against the replicas it had before a move under way (Kafka's
            // replication factor of a reassigning partition).
            under += (u.isr.len() < u.original().len()) as u64;
            let min = broker.engine.topic_by_id(&tp.topic).map_or(1, |t| t.config.min_insync_replicas);
            under_min += ((u.isr.len() as i32) < min) as u64;
        }
        let s = &self.stats;
        s.leader_partitions.store(led.len() as u64, Ordering::Relaxed);
        s.under_replicated.store(under, Ordering::Relaxed);
        s.under_min_isr.store(under_min, Ordering::Relaxed);
        s.max_lag.store(lag.values().copied().max().unwrap_or(0) as u64, Ordering::Relaxed);
        drop(st);
        // Counted again only when the view moved (it walks every partition).
        if s.offline_revision.swap(view.revision, Ordering::Relaxed) != view.revision {
            let controller = view.controller.as_ref().is_some_and(|c| c.id == self.me);
            let offline = if controller {
                view.topics.iter().map(|(name, t)| (0..t.partitions).filter(|p| view.units.get(&unit_of(name, *p)).is_none_or(|u| !view.nodes.contains_key(&u.leader))).count() as u64).sum()
            } else {
                0
            };
            s.offline.store(offline, Ordering::Relaxed);
        }
    }

    /// The tps this node follows from `leader`.
    pub fn followed_from(&self, leader: i32) -> Vec<Followed> {
        self.state.lock().expect("replication lock").followed.values().filter(|f| f.leader == leader).cloned().collect()
    }

    /// Runs roles, ISR upkeep and fetchers until `stop`.
    pub fn start(broker: Arc<Broker>, mut stop: watch::Receiver<bool>) -> JoinHandle<()> {
        let (engine, me) = (broker.engine.clone(), broker.replication.clone());
        broker.cluster.set_begun(Arc::new(move |topic, partition, epoch| engine.topic(topic).is_some_and(|t| me.leads(&t.tp(partition), epoch))));
        tokio::spawn(async move {
            // Its own task: a slow fsync holds up no role change.
            let checkpoints = tokio::spawn(checkpoint_hws(broker.engine.clone(), stop.clone()));
            let mut rounds = Rounds::new(&broker, TICK);
            while rounds.next(&mut stop).await {
                let r = broker.replication.clone();
                r.reconcile(&broker).await;
                r.keep_isrs(&broker).await;
                // An ISR that shrank lets the hw up without any fetch (to
                // this node's own durable end when it is alone).
                r.advance_all(&broker);
                r.measure(&broker, &broker.cluster.view());
            }
            for (_, f) in broker.replication.state.lock().expect("replication lock").fetchers.drain() {
                f.abort();
            }
            let _ = checkpoints.await;
        })
    }

    /// Takes up the roles the view gives this node (see the module doc).
    pub async fn reconcile(self: &Arc<Self>, broker: &Arc<Broker>) {
        let view = broker.cluster.view();
        if view.single {
            return;
        }
        let standing = broker.cluster.in_good_standing();
        let mut lead: HashMap<Tp, (String, i32)> = HashMap::new();
        let mut follow: HashMap<Tp, Followed> = HashMap::new();
        for topic in broker.engine.topics() {
            for p in 0..topic.partitions() {
                let unit = unit_of(topic.name(), p);
                let Some(u) = view.units.get(&unit) else { continue };
                if u.leader == self.me && standing {
                    lead.insert(topic.tp(p), (unit, u.leader_epoch));
                } else if u.replicas.contains(&self.me) && u.leader != self.me {
                    let leader = if view.nodes.contains_key(&u.leader) { u.leader } else { -1 };
                    follow.insert(topic.tp(p), Followed { leader, leader_epoch: u.leader_epoch, topic: topic.clone(), partition: p });
                }
            }
        }
        // Epochs to begin, per unit (one writer command each: a refusal in
        // one unit holds up no other).
        let mut begin: BTreeMap<(String, i32), Vec<(Tp, String)>> = BTreeMap::new();
        let mut frozen = Vec::new();
        let follows_changed;
        {
            let mut st = self.state.lock().expect("replication lock");
            st.led.retain(|tp, l| {
                let keep = lead.get(tp).is_some_and(|(_, e)| *e == l.epoch);
                if !keep {
                    frozen.push(*tp);
                }
                keep
            });
            for (tp, (unit, epoch)) in &lead {
                if !st.led.contains_key(tp) {
                    begin.entry((unit.clone(), *epoch)).or_default().push((*tp, unit.clone()));
                }
            }
            for tp in follow.keys() {
                if !st.followed.contains_key(tp) {
                    frozen.push(*tp);
                }
            }
            follows_changed = st.followed.len() != follow.len() || follow.iter().any(|(tp, f)| st.followed.get(tp).is_none_or(|o| o.leader != f.leader || o.leader_epoch != f.leader_epoch));
            st.followed = follow;
            // Additions the view shows are in the ISR proper now; a node
            // gone is counted no more (the controller takes it out).
            st.adding.retain(|unit, added| {
                added.retain(|m| view.nodes.contains_key(m));
                !added.is_empty() && view.units.get(unit).is_some_and(|u| u.leader == self.me && !added.iter().all(|m| u.isr.contains(m)))
            });
            for l in st.led.values_mut() {
                l.followers.retain(|id, p| view.nodes.get(id).is_some_and(|n| n.incarnation == p.incarnation));
            }
        }
        // A tp this node stops leading, or starts following, keeps the hw
        // it has until its leader says more.
        for tp in frozen {
            if let Some((_, hw, _)) = broker.engine.offsets(&tp) {
                broker.engine.limit_hw(&tp, hw);
            }
        }
        for ((unit, epoch), tps) in begin {
            let list: Vec<Tp> = tps.iter().map(|(tp, _)| *tp).collect();
            // Elections are new epochs, not a restarted leader taking its
            // own epoch up again.
            let elected = list.iter().filter(|tp| broker.engine.latest_epoch(tp) < epoch).count() as u64;
            match broker.engine.begin_epoch(list.clone(), epoch).await {
                Ok(()) => {
                    self.stats.leader_epochs.fetch_add(elected, Ordering::Relaxed);
                    let now = broker.engine.now_ms();
                    let mut st = self.state.lock().expect("replication lock");
                    for (tp, unit) in tps {
                        let epoch_start = broker.engine.offsets(&tp).map_or(0, |o| o.2);
                        st.led.insert(tp, Led { unit, epoch, epoch_start, since_ms: now, followers: HashMap::new() });
                    }
                    drop(st);
                    for tp in &list {
                        self.advance(broker, &view, tp);
                    }
                    tracing::info!(%unit, epoch, "leading in a new leader epoch");
                }
                Err(e) => tracing::warn!(%unit, epoch, error = %e, "beginning a leader epoch failed; trying again"),
            }
        }
        if follows_changed {
            self.follows.send_modify(|n| *n += 1);
        }
        self.run_fetchers(broker);
    }

    /// One fetcher per leader this node follows a tp from; a fetcher
    /// whose leader leads nothing of ours any more ends by itself.
    fn run_fetchers(&self, broker: &Arc<Broker>) {
        let mut st = self.state.lock().expect("replication lock");
        let leaders: HashSet<i32> = st.followed.values().map(|f| f.leader).filter(|l| *l >= 0).collect();
        st.fetchers.retain(|leader, h| {
            let keep = leaders.contains(leader) && !h.is_finished();
            if !keep {
                h.abort();
            }
            keep
        });
        for leader in leaders {
            st.fetchers.entry(leader).or_insert_with(|| tokio::spawn(fetcher::run(broker.clone(), leader, self.follows.subscribe())));
        }
    }

    /// A follower fetched `tp` from `fetch_offset` while this node's log
    /// ended at `end`: its position, and whether it is caught up.
    pub fn fetched(&self, follower: i32, incarnation: i64, tp: &Tp, fetch_offset: i64, end: i64, now_ms: i64) {
        let mut st = self.state.lock().expect("replication lock");
        let Some(led) = st.led.get_mut(tp) else { return };
        let since = led.since_ms;
        let fresh = Position { incarnation, fetch_offset, caught_up_ms: since, last_fetch_ms: now_ms, end_at_last_fetch: -1 };
        let p = led.followers.entry(follower).or_insert(fresh);
        if p.incarnation != incarnation {
            *p = fresh;
        }
        if fetch_offset >= end {
            p.caught_up_ms = now_ms;
        } else if fetch_offset >= p.end_at_last_fetch {
            p.caught_up_ms = p.caught_up_ms.max(p.last_fetch_ms);
        }
        p.fetch_offset = fetch_offset;
        p.last_fetch_ms = now_ms;
        p.end_at_last_fetch = end;
    }

    /// Raises `tp`'s hw cap to what every member of its unit's maximal ISR
    /// has (this node's own durable end is storage's share of the min).
    /// While the ISR is smaller than `min.insync.replicas`, the hw waits.
    pub fn advance(&self, broker: &Broker, view: &ClusterView, tp: &Tp) {
        let limit = {
            let st = self.state.lock().expect("replication lock");
            let Some(led) = st.led.get(tp) else { return };
            let Some(u) = view.units.get(&led.unit).filter(|u| u.leader_epoch == led.epoch) else { return };
            let Some(topic) = broker.engine.topic_by_id(&tp.topic) else { return };
            let mut isr = u.isr.clone();
            isr.extend(st.adding.get(&led.unit).into_iter().flatten().filter(|m| !u.isr.contains(m)));
            let hw = broker.engine.offsets(tp).map_or(0, |o| o.1);
            if (isr.len() as i32) < topic.config.min_insync_replicas {
                hw
            } else {
                isr.iter().filter(|m| **m != self.me).map(|m| led.followers.get(m).map_or(hw, |p| p.fetch_offset)).min().unwrap_or(i64::MAX)
            }
        };
        broker.engine.limit_hw(tp, limit);
    }

    /// [`Replication::advance`] for every tp this node leads.
    fn advance_all(&self, broker: &Broker) {
        let view = broker.cluster.view();
        let tps: Vec<Tp> = self.state.lock().expect("replication lock").led.keys().copied().collect();
        for tp in tps {
            self.advance(broker, &view, &tp);
        }
    }

    /// Whether a produce with acks=all may go to `tp` of `topic`: its
    /// unit's ISR has at least `min.insync.replicas` members.
    pub fn enough_replicas(view: &ClusterView, topic: &Topic, partition: i32) -> bool {
        view.single || view.units.get(&unit_of(topic.name(), partition)).is_some_and(|u| u.isr.len() as i32 >= topic.config.min_insync_replicas)
    }

    /// Waits until `tp`'s hw reaches `end` (an acks=all produce), at most
    /// until `deadline`. Err: the error code to answer (NOT_LEADER_OR_FOLLOWER
    /// when this node stopped leading in `epoch`,
    /// NOT_ENOUGH_REPLICAS_AFTER_APPEND when the hw got there with the ISR
    /// shrunk below `min.insync.replicas`, REQUEST_TIMED_OUT at the
    /// deadline).
    pub async fn replicated(&self, broker: &Broker, topic: &Topic, partition: i32, epoch: i32, end: i64, deadline: tokio::time::Instant) -> Result<(), i16> {
        use crate::engine::HwWait;
        use kafka_protocol::ResponseError as E;
        let tp = topic.tp(partition);
        // Still this epoch's leader: by its state (cleared before any
        // fetcher may cut this tp) and by the latest view (so a handover
        // answers NOT_LEADER_OR_FOLLOWER at the next wake).
        let still = || self.leads(&tp, epoch) && broker.cluster.lead(&broker.cluster.view(), topic.name(), partition) == Ok(epoch);
        match broker.engine.wait_hw(tp, end, deadline, still).await {
            // A hw seen, then this node found not leading: the hw may be a
            // new leader's over a cut tail, not this batch's.
            HwWait::Reached if !self.leads(&tp, epoch) => Err(E::NotLeaderOrFollower.code()),
            // Kafka's rule: there, but the ISR shrank meanwhile.
            HwWait::Reached if !Self::enough_replicas(&broker.cluster.view(), topic, partition) => Err(E::NotEnoughReplicasAfterAppend.code()),
            HwWait::Reached => Ok(()),
            HwWait::Stopped => Err(E::NotLeaderOrFollower.code()),
            HwWait::TimedOut => Err(E::RequestTimedOut.code()),
        }
    }

    /// The leader's ISR upkeep for every unit it leads: followers that
    /// have not caught up within `replica_lag_time_max_ms` leave, replicas
    /// that have everything below every tp's hw (and this epoch's start)
    /// join.
    async fn keep_isrs(self: &Arc<Self>, broker: &Arc<Broker>) {
        let view = broker.cluster.view();
        if view.single || !broker.cluster.in_good_standing() {
            return;
        }
        let now = broker.engine.now_ms();
        let changes: Vec<(String, UnitRecord, Vec<i32>, Vec<i32>)> = {
            let st = self.state.lock().expect("replication lock");
            let mut units: BTreeMap<&str, Vec<(&Tp, &Led)>> = BTreeMap::new();
            for (tp, l) in &st.led {
                units.entry(l.unit.as_str()).or_default().push((tp, l));
            }
            units
                .into_iter()
                .filter_map(|(name, tps)| {
                    let u = view.units.get(name).filter(|u| u.leader == self.me && u.leader_epoch == tps[0].1.epoch)?;
                    let lagging: Vec<i32> = u.isr.iter().copied().filter(|m| *m != self.me).filter(|m| tps.iter().any(|(_, l)| now - l.followers.get(m).map_or(l.since_ms, |p| p.caught_up_ms) > self.lag_max_ms)).collect();
                    let joining: Vec<i32> = u
                        .replicas
                        .iter()
                        .copied()
                        .filter(|r| !u.isr.contains(r) && view.nodes.contains_key(r))
                        .filter(|r| {
                            tps.iter().all(|(tp, l)| {
                                let hw = broker.engine.offsets(tp).map_or(i64::MAX, |o| o.1);
                                let incarnation = view.nodes.get(r).map(|n| n.incarnation);
                                l.followers.get(r).is_some_and(|p| Some(p.incarnation) == incarnation && p.fetch_offset >= hw && p.fetch_offset >= l.epoch_start)
                            })
                        })
                        .collect();
                    if lagging.is_empty() && joining.is_empty() {
                        return None;
                    }
                    let mut isr: Vec<i32> = u.isr.iter().copied().filter(|m| !lagging.contains(m)).collect();
                    isr.extend(&joining);
                    Some((name.to_owned(), u.clone(), isr, joining))
                })
                .collect()
        };
        // Each unit's write on its own: one slow etcd write holds no other
        // unit's change (a follower paused lags in every unit it follows at
        // once). The next round waits for all of them.
        let mut writes = tokio::task::JoinSet::new();
        for (unit, from, isr, joining) in changes {
            let (me, broker) = (self.clone(), broker.clone());
            writes.spawn(async move { me.change_isr(&broker, unit, from, isr, joining).await });
        }
        while writes.join_next().await.is_some() {}
    }

    /// Writes one unit's new ISR (see [`Replication::keep_isrs`]).
    async fn change_isr(&self, broker: &Broker, unit: String, from: UnitRecord, isr: Vec<i32>, joining: Vec<i32>) {
        // A member leaving starts over: it joins again only on what it
        // fetches from now on.
        let leaving: Vec<i32> = from.isr.iter().copied().filter(|m| !isr.contains(m)).collect();
        if !leaving.is_empty() {
            let mut st = self.state.lock().expect("replication lock");
            for l in st.led.values_mut().filter(|l| l.unit == unit) {
                l.followers.retain(|id, _| !leaving.contains(id));
            }
        }
        if !joining.is_empty() {
            // Counted before etcd may elect them.
            self.state.lock().expect("replication lock").adding.insert(unit.clone(), joining.clone());
        }
        let written = broker.cluster.alter_isr(&unit, &from, isr.clone()).await;
        match &written {
            Ok(true) => {
                // Per partition, as Kafka counts.
                let tps = self.state.lock().expect("replication lock").led.values().filter(|l| l.unit == unit).count() as u64;
                if !leaving.is_empty() {
                    self.stats.isr_shrinks.fetch_add(tps, Ordering::Relaxed);
                }
                if !joining.is_empty() {
                    self.stats.isr_expands.fetch_add(tps, Ordering::Relaxed);
                }
                tracing::info!(%unit, from = ?from.isr, to = ?isr, "ISR changed");
            }
            Ok(false) => tracing::debug!(%unit, "an ISR change lost a race; deciding again from the next view"),
            Err(e) => tracing::warn!(%unit, error = %e, "changing an ISR failed"),
        }
        // Certainly not written: not counted. (An error may hide a
        // write that went through: counted until the view says.)
        if matches!(written, Ok(false)) {
            self.state.lock().expect("replication lock").adding.remove(&unit);
        }
    }
}
