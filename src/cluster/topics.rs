//! Topics and replication units as the cluster's etcd holds them, and the
//! decisions taken over them (docs/cluster.md): where a new unit's
//! replicas go, and who leads a unit after a node goes or comes back.
//!
//! - `topics/<name>` holds a [`TopicEntry`]: the topic's id, partition
//!   count, replication factor and the configs it was created with.
//! - `units/<branch>~<p>` holds a [`UnitRecord`]: partition `p` of every
//!   topic of one branch shares one log per replica, so it shares one
//!   replica set, leader, leader epoch and ISR.
//!
//! Everything here is pure: the etcd writes are in `etcd.rs`, and these
//! functions say what to write.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use super::ClusterView;

/// A topic as etcd holds it (`topics/<name>`, JSON).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TopicEntry {
    /// The topic id, as a hyphenated UUID: every node creates its local
    /// copy of the topic with this id, so clients see one id everywhere.
    pub id: String,
    pub partitions: i32,
    pub replication_factor: i16,
    /// The configs given at creation (not the defaults).
    #[serde(default)]
    pub configs: BTreeMap<String, String>,
    pub created_ms: i64,
}

impl TopicEntry {
    /// The id's bytes; `None` when it is not a UUID.
    pub fn id_bytes(&self) -> Option<[u8; 16]> {
        uuid::Uuid::parse_str(&self.id).ok().map(|u| *u.as_bytes())
    }

    /// Why the entry cannot be a topic, if it cannot.
    pub fn check(&self) -> Result<(), String> {
        match self.id_bytes() {
            None => Err(format!("topic id {:?} is not a UUID", self.id)),
            Some(id) if id == [0; 16] => Err("topic id is zero".into()),
            Some(_) if self.partitions < 1 => Err(format!("{} partitions", self.partitions)),
            Some(_) if self.replication_factor < 1 => Err(format!("replication factor {}", self.replication_factor)),
            Some(_) => Ok(()),
        }
    }
}

/// The cluster's topics as the engine records them (what
/// `Engine::follow_topics` makes this node's topics).
pub fn topic_records(view: &ClusterView) -> BTreeMap<String, crate::meta::TopicRecord> {
    view.topics
        .iter()
        .filter_map(|(name, e)| Some((name.clone(), crate::meta::TopicRecord { name: name.clone(), id: e.id_bytes()?, partitions: e.partitions, replication_factor: e.replication_factor, configs: e.configs.clone(), created_ms: e.created_ms })))
        .collect()
}

/// A replication unit as etcd holds it (`units/<unit>`, JSON).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UnitRecord {
    /// The nodes holding the unit, in preference order (the first is the
    /// preferred leader).
    pub replicas: Vec<i32>,
    /// The leader, or -1 while no replica may lead.
    pub leader: i32,
    /// Moves at every change of leader (to -1 too).
    pub leader_epoch: i32,
    /// The in-sync replicas: only they may be elected.
    pub isr: Vec<i32>,
    /// A reassignment under way (AlterPartitionReassignments): the
    /// replicas it adds and those it removes, both also in `replicas`,
    /// which is the target followed by the replicas it removes (Kafka's
    /// addingReplicas and removingReplicas). Empty when none is.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub adding: Vec<i32>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub removing: Vec<i32>,
    /// The key's mod revision (not in the value): a change is written only
    /// if the key still has it.
    #[serde(default, skip)]
    pub mod_revision: i64,
}

impl UnitRecord {
    /// Why the record cannot describe a unit, if it cannot.
    pub fn check(&self) -> Result<(), String> {
        let distinct: BTreeSet<i32> = self.replicas.iter().copied().collect();
        if self.replicas.is_empty() || distinct.len() != self.replicas.len() || self.replicas.iter().any(|r| *r < 0) {
            return Err(format!("replicas {:?}", self.replicas));
        }
        if self.leader != -1 && !distinct.contains(&self.leader) {
            return Err(format!("leader {} is not a replica", self.leader));
        }
        if self.leader_epoch < 0 || self.isr.is_empty() || !self.isr.iter().all(|n| distinct.contains(n)) {
            return Err(format!("isr {:?} or epoch {}", self.isr, self.leader_epoch));
        }
        let (adding, removing): (BTreeSet<i32>, BTreeSet<i32>) = (self.adding.iter().copied().collect(), self.removing.iter().copied().collect());
        let apart = adding.len() == self.adding.len() && removing.len() == self.removing.len() && adding.is_disjoint(&removing);
        if !apart || !adding.is_subset(&distinct) || !removing.is_subset(&distinct) || adding.len() == distinct.len() || removing.len() == distinct.len() {
            return Err(format!("adding {:?} and removing {:?} of replicas {:?}", self.adding, self.removing, self.replicas));
        }
        Ok(())
    }

    /// Whether a reassignment is under way.
    pub fn reassigning(&self) -> bool {
        !self.adding.is_empty() || !self.removing.is_empty()
    }

    /// The replicas the unit moves to: all of them when no reassignment
    /// is under way.
    pub fn target(&self) -> Vec<i32> {
        self.replicas.iter().copied().filter(|r| !self.removing.contains(r)).collect()
    }

    /// The replicas the unit had before the reassignment under way.
    pub fn original(&self) -> Vec<i32> {
        self.replicas.iter().copied().filter(|r| !self.adding.contains(r)).collect()
    }
}

/// The unit partition `partition` of `topic` belongs to: its branch and
/// the partition (`~` is not legal in topic names, so no name collides).
pub fn unit_of(topic: &str, partition: i32) -> String {
    format!("{}~{partition}", crate::storage::branch_of(topic))
}

/// The branch of the coordinator shards' units (`__canopy.coordinators~<s>`):
/// not a legal topic name, so no topic's unit collides with them.
pub const COORDINATOR_BRANCH: &str = "__canopy.coordinators";

/// The internal topic holding the coordinator shards' logs (committed
/// offsets, `kafka::coordinator::journal`): partition `s` is shard `s`,
/// in unit `__canopy.coordinators~<s>`. Its name is reserved, so no
/// client can create, write or name it.
pub const COORDINATOR_TOPIC: &str = COORDINATOR_BRANCH;

/// How many shards groups and transactional ids are spread over (as
/// Kafka's 50 partitions of `__consumer_offsets`).
pub const COORDINATOR_SHARDS: u32 = 50;

/// The coordinator shard of the group or transactional id `key`: the
/// partition of `__canopy.coordinators` holding its state.
pub fn coordinator_shard(key: &str) -> u32 {
    crc32fast::hash(key.as_bytes()) % COORDINATOR_SHARDS
}

/// The unit whose leader coordinates the group or transactional id `key`.
pub fn coordinator_unit(key: &str) -> String {
    format!("{COORDINATOR_BRANCH}~{}", coordinator_shard(key))
}

/// Every coordinator shard's unit.
pub fn coordinator_units() -> Vec<String> {
    (0..COORDINATOR_SHARDS).map(|s| format!("{COORDINATOR_BRANCH}~{s}")).collect()
}

/// A partition as clients are told of it (Metadata, and the leader hints
/// of NOT_LEADER_OR_FOLLOWER).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartState {
    /// A live leader, or -1.
    pub leader: i32,
    pub leader_epoch: i32,
    pub replicas: Vec<i32>,
    pub isr: Vec<i32>,
    /// Replicas that are not registered now.
    pub offline: Vec<i32>,
}

impl ClusterView {
    /// Partition `partition` of `topic` as node `me` describes it. In
    /// single-node mode `me` leads everything, in epoch 0; in cluster mode
    /// the partition's unit says, and a leader that is not registered is
    /// no leader (-1).
    pub fn partition(&self, me: i32, topic: &str, partition: i32) -> PartState {
        if self.single {
            return PartState { leader: me, leader_epoch: 0, replicas: vec![me], isr: vec![me], offline: Vec::new() };
        }
        match self.units.get(&unit_of(topic, partition)) {
            Some(u) => PartState {
                leader: if self.nodes.contains_key(&u.leader) { u.leader } else { -1 },
                leader_epoch: u.leader_epoch,
                replicas: u.replicas.clone(),
                isr: u.isr.clone(),
                offline: u.replicas.iter().copied().filter(|r| !self.nodes.contains_key(r)).collect(),
            },
            // Created, but its unit not seen yet.
            None => PartState { leader: -1, leader_epoch: -1, replicas: Vec::new(), isr: Vec::new(), offline: Vec::new() },
        }
    }
}

impl ClusterView {
    /// The node coordinating `key` (a group or transactional id): the
    /// leader of its shard's unit. `Err(true)`: the shards are not
    /// created yet; `Err(false)`: its shard has no leader now. Always this
    /// node in single-node mode.
    pub fn coordinator(&self, me: i32, key: &str) -> Result<i32, bool> {
        if self.single {
            return Ok(me);
        }
        match self.units.get(&coordinator_unit(key)) {
            // The shards' log (the topic) is created after their units.
            _ if !self.topics.contains_key(COORDINATOR_TOPIC) => Err(true),
            None => Err(true),
            Some(u) if self.nodes.contains_key(&u.leader) => Ok(u.leader),
            Some(_) => Err(false),
        }
    }
}

impl ClusterView {
    /// The node that serves a subtree stream covering `units` (cluster
    /// mode, docs/cluster.md): the leader of the first unit in name order,
    /// provided it leads every other one too (it then holds all their
    /// records). `None` when no node does, and when a unit has more than
    /// one replica: a stream does not stop at each tp's high watermark
    /// yet, so it could hand out records the in-sync replicas do not have.
    /// A stream over nothing is served by the node asked (`me`).
    pub fn stream_server(&self, me: i32, units: &BTreeSet<String>) -> Option<i32> {
        let Some(first) = units.iter().next() else { return Some(me) };
        let leader = self.units.get(first).map(|u| u.leader).filter(|l| self.nodes.contains_key(l))?;
        units.iter().all(|u| self.units.get(u).is_some_and(|u| u.leader == leader && u.replicas.len() == 1)).then_some(leader)
    }
}

/// Replicas for each of `units` (new units: none exists yet), `rf` each,
/// over the registered nodes: for each replica the node that holds the
/// fewest replicas so far (counting the units placed before it), not in a
/// rack the unit already uses while another rack is left, ties going
/// round-robin. The first replica leads, in epoch 0, with every replica in
/// sync. `Err` when fewer nodes are registered than `rf`.
pub fn place(view: &ClusterView, units: &[String], rf: usize) -> Result<BTreeMap<String, UnitRecord>, String> {
    let nodes: Vec<(i32, Option<&str>)> = view.nodes.values().map(|n| (n.id, n.rack.as_deref())).collect();
    if rf == 0 || rf > nodes.len() {
        return Err(format!("replication factor {rf} is larger than the {} registered brokers", nodes.len()));
    }
    let mut load: BTreeMap<i32, usize> = nodes.iter().map(|(id, _)| (*id, 0)).collect();
    for u in view.units.values() {
        for r in &u.replicas {
            if let Some(l) = load.get_mut(r) {
                *l += 1;
            }
        }
    }
    let racks: BTreeSet<Option<&str>> = nodes.iter().map(|(_, r)| *r).collect();
    let mut out = BTreeMap::new();
    for (i, unit) in units.iter().enumerate() {
        let mut replicas: Vec<i32> = Vec::with_capacity(rf);
        let mut used_racks: BTreeSet<Option<&str>> = BTreeSet::new();
        for _ in 0..rf {
            let all_racks_used = used_racks.len() == racks.len();
            let best = nodes
                .iter()
                .enumerate()
                .filter(|(_, (id, _))| !replicas.contains(id))
                .min_by_key(|(j, (id, rack))| {
                    let rack_taken = !all_racks_used && used_racks.contains(rack);
                    // Ties rotate with the unit, so equal loads spread.
                    (rack_taken, load[id], (j + nodes.len() - i % nodes.len()) % nodes.len())
                })
                .map(|(_, n)| *n)
                .expect("rf <= nodes");
            replicas.push(best.0);
            used_racks.insert(best.1);
            *load.get_mut(&best.0).expect("a registered node") += 1;
        }
        let leader = replicas[0];
        out.insert(unit.clone(), UnitRecord { isr: replicas.clone(), replicas, leader, leader_epoch: 0, adding: Vec::new(), removing: Vec::new(), mod_revision: 0 });
    }
    Ok(out)
}

/// The topic config (and cluster-wide broker config) that lets a unit
/// elect a leader from outside its ISR.
pub const UNCLEAN: &str = "unclean.leader.election.enable";

/// Whether unit `unit` may elect outside its ISR: `UNCLEAN` is true for
/// every topic in it (its own config, else the cluster-wide broker
/// config, else this node's static setting, by default Kafka's false). Records of every topic of the
/// unit may be lost by it, so one topic that forbids it forbids it for
/// the unit. A unit no topic is in (a coordinator shard's) never may.
pub fn unclean_allowed(view: &ClusterView, unit: &str) -> bool {
    let Some((branch, p)) = unit.rsplit_once('~').and_then(|(b, p)| Some((b, p.parse::<i32>().ok()?))) else { return false };
    let on = |v: Option<&String>| v.map(|v| v.eq_ignore_ascii_case("true"));
    let broker = on(view.broker_configs.get(UNCLEAN)).unwrap_or(view.unclean_by_default);
    // A branch's topics sort together, from the branch's own name on.
    let of_branch = view.topics.range::<str, _>((std::ops::Bound::Included(branch), std::ops::Bound::Unbounded)).take_while(|(name, _)| name.starts_with(branch));
    let mut any = false;
    for (_, t) in of_branch.filter(|(name, t)| t.partitions > p && crate::storage::branch_of(name) == branch) {
        if !on(t.configs.get(UNCLEAN)).unwrap_or(broker) {
            return false;
        }
        any = true;
    }
    any
}

/// The controller's changes to units after nodes went or came back (Kafka's
/// fencing and election of a broker): registered ISR members stay in the
/// ISR (if none is registered, the ISR is kept, so that its members can
/// lead again when they return); a leader that is not registered is
/// replaced by the first registered ISR member in replica order; with
/// none, by the first registered replica where the unit allows an unclean
/// election ([`unclean_allowed`]; the ISR is then that replica alone), or
/// else by -1; every change of leader moves the epoch. Each changed
/// record keeps the mod revision it was read with (the write's guard).
pub fn elections(view: &ClusterView) -> Vec<(String, UnitRecord)> {
    let live = |n: &i32| view.nodes.contains_key(n);
    let mut out = Vec::new();
    for (name, u) in view.units.iter() {
        let in_sync: Vec<i32> = u.isr.iter().copied().filter(live).collect();
        let mut isr = if in_sync.is_empty() { u.isr.clone() } else { in_sync };
        let mut leader = if u.leader >= 0 && live(&u.leader) { u.leader } else { u.replicas.iter().copied().find(|r| live(r) && isr.contains(r)).unwrap_or(-1) };
        if leader < 0 {
            if let Some(r) = u.replicas.iter().copied().find(live).filter(|_| unclean_allowed(view, name)) {
                (leader, isr) = (r, vec![r]);
            }
        }
        if leader == u.leader && isr == u.isr {
            continue;
        }
        let epoch = if leader == u.leader { u.leader_epoch } else { u.leader_epoch + 1 };
        out.push((name.clone(), UnitRecord { leader, leader_epoch: epoch, isr, ..u.clone() }));
    }
    out
}

/// Why a unit's preferred leader does not take it over, as Kafka's
/// ElectLeaders answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NoElection {
    /// It leads already (ELECTION_NOT_NEEDED).
    NotNeeded,
    /// It is not registered, or not in the ISR
    /// (PREFERRED_LEADER_NOT_AVAILABLE): a preferred election never leaves
    /// the ISR.
    NotAvailable,
}

/// A preferred-leader election of unit `u`: its first replica leads it in
/// the next epoch, if that replica is live and in sync. The record keeps
/// the mod revision it was read with (the write's guard).
pub fn preferred_election(view: &ClusterView, u: &UnitRecord) -> Result<UnitRecord, NoElection> {
    let preferred = u.replicas[0];
    if u.leader == preferred {
        return Err(NoElection::NotNeeded);
    }
    if !view.nodes.contains_key(&preferred) || !u.isr.contains(&preferred) {
        return Err(NoElection::NotAvailable);
    }
    Ok(UnitRecord { leader: preferred, leader_epoch: u.leader_epoch + 1, ..u.clone() })
}

/// An unclean election of unit `u` (ElectLeaders UNCLEAN): not needed
/// while its leader is registered; else its first registered ISR member
/// leads, or, with none, its first registered replica, with an ISR of
/// itself; NotAvailable when no replica is registered
/// (ELIGIBLE_LEADERS_NOT_AVAILABLE). Asked for explicitly, so the topics'
/// `UNCLEAN` is not consulted, as in Kafka.
pub fn unclean_election(view: &ClusterView, u: &UnitRecord) -> Result<UnitRecord, NoElection> {
    let live = |n: &i32| view.nodes.contains_key(n);
    if u.leader >= 0 && live(&u.leader) {
        return Err(NoElection::NotNeeded);
    }
    if let Some(r) = u.replicas.iter().copied().find(|r| live(r) && u.isr.contains(r)) {
        return Ok(UnitRecord { leader: r, leader_epoch: u.leader_epoch + 1, isr: u.isr.iter().copied().filter(live).collect(), ..u.clone() });
    }
    let r = u.replicas.iter().copied().find(live).ok_or(NoElection::NotAvailable)?;
    Ok(UnitRecord { leader: r, leader_epoch: u.leader_epoch + 1, isr: vec![r], ..u.clone() })
}

/// Kafka's automatic leader rebalance: for each node, the units it is the
/// preferred leader of (their first replica) but does not lead; when they
/// are more than `percent` of the units it prefers, each of them whose
/// preferred leader can take it (live, in sync) goes back to it.
pub fn rebalance(view: &ClusterView, percent: u32) -> Vec<(String, UnitRecord)> {
    let mut per_node: BTreeMap<i32, (usize, Vec<&String>)> = BTreeMap::new();
    for (name, u) in view.units.iter() {
        let e = per_node.entry(u.replicas[0]).or_default();
        e.0 += 1;
        if u.leader != u.replicas[0] {
            e.1.push(name);
        }
    }
    let mut out = Vec::new();
    for (total, elsewhere) in per_node.into_values() {
        if elsewhere.len() * 100 <= total * percent as usize {
            continue;
        }
        out.extend(elsewhere.into_iter().filter_map(|name| preferred_election(view, &view.units[name]).ok().map(|u| (name.clone(), u))));
    }
    out
}

/// Why a reassignment of a unit is refused, as Kafka answers
/// AlterPartitionReassignments.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NoReassignment {
    /// INVALID_REPLICA_ASSIGNMENT: an empty target, a replica named
    /// twice, a node that is not registered; or a change that would leave
    /// no in-sync replica.
    Invalid(String),
    /// INVALID_REPLICATION_FACTOR: the target has another number of
    /// replicas, and the request does not allow the factor to change
    /// (AllowReplicationFactorChange, KIP-860).
    Factor(String),
    /// NO_REASSIGNMENT_IN_PROGRESS: a cancellation with nothing to cancel.
    NotInProgress,
}

/// Unit `name` as AlterPartitionReassignments asks it: `Some(target)`
/// moves it to `target` (Kafka's reassignment, first step: the replicas
/// become the target followed by the replicas it drops, with `adding` and
/// `removing` recording the move; the controller finishes it, see
/// [`reassignments_done`]); `None` cancels the one under way (the unit
/// goes back to its original replicas, without those it was adding in its
/// ISR, and the leader too if it was one of them). A new target replaces
/// one under way, counted from the original replicas. A target that only
/// reorders the replicas takes effect at once. A target of another size
/// changes the unit's replication factor (every topic of the unit's
/// branch, in that partition), unless `factor_may_change` is false.
/// `Ok(None)`: nothing to write. The record keeps the mod revision it was
/// read with (the write's guard).
pub fn reassign(view: &ClusterView, name: &str, u: &UnitRecord, target: Option<&[i32]>, factor_may_change: bool) -> Result<Option<UnitRecord>, NoReassignment> {
    let original = u.original();
    let (replicas, adding, removing) = match target {
        None if !u.reassigning() => return Err(NoReassignment::NotInProgress),
        None => (original, Vec::new(), Vec::new()),
        Some(target) => {
            if target.is_empty() {
                return Err(NoReassignment::Invalid("the target has no replica".into()));
            }
            if let Some(r) = target.iter().enumerate().find_map(|(i, r)| target[..i].contains(r).then_some(r)) {
                return Err(NoReassignment::Invalid(format!("the target names broker {r} twice")));
            }
            if let Some(r) = target.iter().find(|r| !view.nodes.contains_key(r)) {
                return Err(NoReassignment::Invalid(format!("broker {r} is not registered")));
            }
            if target.len() != original.len() && !factor_may_change {
                return Err(NoReassignment::Factor(format!("the target has {} replicas and the partition {}, and the request does not allow the replication factor to change", target.len(), original.len())));
            }
            let removing: Vec<i32> = original.iter().copied().filter(|r| !target.contains(r)).collect();
            let adding: Vec<i32> = target.iter().copied().filter(|r| !original.contains(r)).collect();
            if adding.is_empty() && removing.is_empty() {
                // The same replicas, in another order: nothing to copy.
                (target.to_vec(), adding, removing)
            } else {
                (target.iter().copied().chain(removing.iter().copied()).collect(), adding, removing)
            }
        }
    };
    let mut isr: Vec<i32> = u.isr.iter().copied().filter(|m| replicas.contains(m)).collect();
    if isr.is_empty() {
        // Only replicas the reassignment added were in sync (Kafka's
        // revert calls this an unclean election).
        if !unclean_allowed(view, name) {
            return Err(NoReassignment::Invalid("every in-sync replica is one the reassignment added; going back would need an unclean leader election".into()));
        }
        isr = vec![replicas[0]];
    }
    let (leader, leader_epoch) = if u.leader < 0 || isr.contains(&u.leader) {
        (u.leader, u.leader_epoch)
    } else {
        (replicas.iter().copied().find(|r| isr.contains(r) && view.nodes.contains_key(r)).unwrap_or(-1), u.leader_epoch + 1)
    };
    let to = UnitRecord { replicas, leader, leader_epoch, isr, adding, removing, mod_revision: u.mod_revision };
    Ok((to != *u).then_some(to))
}

/// The controller's last step of each reassignment whose target replicas
/// are all in the ISR (Kafka's completion of a reassignment): the unit
/// keeps only the target, its ISR only target replicas, and a leader the
/// target does not keep hands over, in the next epoch, to the first live
/// target replica. Each record keeps the mod revision it was read with.
pub fn reassignments_done(view: &ClusterView) -> Vec<(String, UnitRecord)> {
    let mut out = Vec::new();
    for (name, u) in view.units.iter().filter(|(_, u)| u.reassigning()) {
        let target = u.target();
        if !target.iter().all(|r| u.isr.contains(r)) {
            continue;
        }
        let (leader, leader_epoch) = if u.leader < 0 || target.contains(&u.leader) {
            (u.leader, u.leader_epoch)
        } else {
            match target.iter().copied().find(|r| view.nodes.contains_key(r)) {
                Some(r) => (r, u.leader_epoch + 1),
                // Nobody to hand over to yet: the elections decide first.
                None => continue,
            }
        };
        let isr = u.isr.iter().copied().filter(|m| target.contains(m)).collect();
        out.push((name.clone(), UnitRecord { replicas: target, leader, leader_epoch, isr, adding: Vec::new(), removing: Vec::new(), mod_revision: u.mod_revision }));
    }
    out
}

/// Controlled shutdown's changes for node `me`: each unit it leads that
/// has another registered ISR member goes to the first such member in
/// replica order, in the next epoch, with `me` out of the ISR. (unit, as
/// read, as it should become.)
pub fn handovers(view: &ClusterView, me: i32) -> Vec<(String, UnitRecord, UnitRecord)> {
    let mut out = Vec::new();
    for (name, u) in view.units.iter().filter(|(_, u)| u.leader == me) {
        let Some(next) = u.replicas.iter().copied().find(|r| *r != me && u.isr.contains(r) && view.nodes.contains_key(r)) else { continue };
        let isr = u.isr.iter().copied().filter(|m| *m != me).collect();
        out.push((name.clone(), u.clone(), UnitRecord { leader: next, leader_epoch: u.leader_epoch + 1, isr, ..u.clone() }));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::{Endpoint, NodeRecord};
    use std::sync::Arc;

    fn view(nodes: &[(i32, Option<&str>)]) -> ClusterView {
        let nodes = nodes
            .iter()
            .map(|(id, rack)| (*id, NodeRecord { id: *id, rack: rack.map(str::to_owned), incarnation: 1, endpoints: vec![Endpoint { listener: "PLAINTEXT".into(), host: "h".into(), port: 1 }] }))
            .collect();
        ClusterView { nodes, ..ClusterView::default() }
    }

    fn unit(replicas: &[i32], leader: i32, epoch: i32, isr: &[i32]) -> UnitRecord {
        UnitRecord { replicas: replicas.to_vec(), leader, leader_epoch: epoch, isr: isr.to_vec(), adding: Vec::new(), removing: Vec::new(), mod_revision: 9 }
    }

    #[test]
    fn units_are_per_branch_and_partition() {
        assert_eq!(unit_of("app.codestore.commits", 3), "app.codestore~3");
        assert_eq!(unit_of("app.codestore.pushes", 3), "app.codestore~3");
        assert_eq!(unit_of("clicks", 0), "clicks~0");
    }

    #[test]
    fn placement_spreads_units_evenly_and_over_racks() {
        let v = view(&[(1, None), (2, None), (3, None)]);
        let units: Vec<String> = (0..12).map(|p| unit_of("t", p)).collect();
        let placed = place(&v, &units, 1).unwrap();
        let mut load = BTreeMap::new();
        for u in placed.values() {
            u.check().unwrap();
            assert_eq!((u.leader, u.isr.clone()), (u.replicas[0], u.replicas.clone()));
            *load.entry(u.leader).or_insert(0) += 1;
        }
        assert_eq!(load.values().copied().collect::<Vec<_>>(), vec![4, 4, 4], "{load:?}");

        // Existing load counts: a new unit goes to the emptiest node.
        let mut v2 = v.clone();
        Arc::make_mut(&mut v2.units).insert("a~0".into(), unit(&[1], 1, 0, &[1]));
        Arc::make_mut(&mut v2.units).insert("a~1".into(), unit(&[2], 2, 0, &[2]));
        assert_eq!(place(&v2, &["b~0".into()], 1).unwrap()["b~0"].replicas, vec![3]);

        // Three replicas over three racks of two nodes: one per rack.
        let racked = view(&[(1, Some("a")), (2, Some("a")), (3, Some("b")), (4, Some("b")), (5, Some("c")), (6, Some("c"))]);
        for u in place(&racked, &units, 3).unwrap().values() {
            let racks: BTreeSet<_> = u.replicas.iter().map(|r| racked.nodes[r].rack.clone()).collect();
            assert_eq!(racks.len(), 3, "{u:?}");
        }
        assert!(place(&v, &units, 4).is_err(), "more replicas than brokers");
        assert!(place(&v, &units, 0).is_err());
    }

    #[test]
    fn a_stopping_leader_hands_its_units_to_live_isr_members() {
        let mut v = view(&[(1, None), (2, None), (3, None)]);
        let units = Arc::make_mut(&mut v.units);
        units.insert("a~0".into(), unit(&[1, 2, 3], 1, 4, &[1, 3, 2]));
        // Node 2 is out of sync: 3, the next in replica order that is in sync.
        units.insert("a~1".into(), unit(&[1, 2, 3], 1, 0, &[1, 3]));
        // Alone in its ISR: it keeps leading (no election outside the ISR).
        units.insert("a~2".into(), unit(&[1, 2], 1, 2, &[1]));
        // Led by another node: not its to hand over.
        units.insert("a~3".into(), unit(&[2, 1], 2, 7, &[2, 1]));
        // Its only other in-sync member is not registered.
        units.insert("b~0".into(), unit(&[1, 4], 1, 1, &[1, 4]));
        let got: BTreeMap<String, (i32, i32, Vec<i32>, i64)> = handovers(&v, 1).into_iter().map(|(name, from, to)| {
            assert_eq!((from.leader, to.replicas.clone()), (1, from.replicas.clone()));
            (name, (to.leader, to.leader_epoch, to.isr, to.mod_revision))
        }).collect();
        assert_eq!(got, BTreeMap::from([("a~0".to_owned(), (2, 5, vec![3, 2], 9)), ("a~1".to_owned(), (3, 1, vec![3], 9))]));
    }

    #[test]
    fn preferred_leaders_take_their_units_back_only_from_the_isr() {
        let mut v = view(&[(1, None), (2, None), (3, None)]);
        let units = Arc::make_mut(&mut v.units);
        units.insert("a~0".into(), unit(&[1, 2, 3], 2, 4, &[1, 2, 3]));
        units.insert("a~1".into(), unit(&[1, 2, 3], 1, 1, &[1, 2, 3]));
        units.insert("a~2".into(), unit(&[1, 2, 3], 2, 1, &[2, 3]));
        units.insert("b~0".into(), unit(&[4, 2], 2, 1, &[4, 2]));
        let elected = preferred_election(&v, &v.units["a~0"]).unwrap();
        assert_eq!((elected.leader, elected.leader_epoch, elected.isr.clone(), elected.mod_revision), (1, 5, vec![1, 2, 3], v.units["a~0"].mod_revision));
        assert_eq!(preferred_election(&v, &v.units["a~1"]), Err(NoElection::NotNeeded));
        assert_eq!(preferred_election(&v, &v.units["a~2"]), Err(NoElection::NotAvailable), "out of the ISR");
        assert_eq!(preferred_election(&v, &v.units["b~0"]), Err(NoElection::NotAvailable), "not registered");
        // Node 1 prefers three units and leads one: 67% elsewhere. Only the
        // one it can take goes back; none at all under a 70% threshold.
        let moved: Vec<String> = rebalance(&v, 10).into_iter().map(|(n, u)| format!("{n}:{}", u.leader)).collect();
        assert_eq!(moved, vec!["a~0:1"]);
        assert!(rebalance(&v, 70).is_empty());
    }

    fn moving(replicas: &[i32], adding: &[i32], removing: &[i32], leader: i32, epoch: i32, isr: &[i32]) -> UnitRecord {
        UnitRecord { adding: adding.to_vec(), removing: removing.to_vec(), ..unit(replicas, leader, epoch, isr) }
    }

    #[test]
    fn a_reassignment_adds_its_target_then_drops_what_the_target_does_not_name() {
        let mut v = view(&[(1, None), (2, None), (3, None), (4, None)]);
        let from = unit(&[1, 2], 1, 4, &[1, 2]);
        // First step: the target, then the replicas it drops; the ISR and
        // the leader as they were.
        let begun = reassign(&v, "t~0", &from, Some(&[3, 2]), true).unwrap().unwrap();
        assert_eq!(begun, moving(&[3, 2, 1], &[3], &[1], 1, 4, &[1, 2]));
        begun.check().unwrap();
        // (The original replicas' order is not kept, as in Kafka.)
        assert_eq!((begun.target(), begun.original()), (vec![3, 2], vec![2, 1]));
        Arc::make_mut(&mut v.units).insert("t~0".into(), begun.clone());
        assert_eq!(reassign(&v, "t~0", &begun, Some(&[3, 2]), true), Ok(None), "asked again: nothing to write");
        // Not done while a new replica is not in sync.
        assert!(reassignments_done(&v).is_empty());
        // Done once it is: the dropped leader hands over to the first live
        // target replica, in the next epoch, and the ISR keeps the target only.
        Arc::make_mut(&mut v.units).insert("t~0".into(), moving(&[3, 2, 1], &[3], &[1], 1, 4, &[1, 2, 3]));
        assert_eq!(reassignments_done(&v), vec![("t~0".to_string(), unit(&[3, 2], 3, 5, &[2, 3]))]);
        // A leader the target keeps stays, in its epoch.
        Arc::make_mut(&mut v.units).insert("t~0".into(), moving(&[3, 2, 1], &[3], &[1], 2, 4, &[1, 2, 3]));
        assert_eq!(reassignments_done(&v), vec![("t~0".to_string(), unit(&[3, 2], 2, 4, &[2, 3]))]);
        // With no live target replica to lead, the elections go first.
        v.nodes.retain(|id, _| *id == 1);
        Arc::make_mut(&mut v.units).insert("t~0".into(), moving(&[3, 2, 1], &[3], &[1], 1, 4, &[1, 2, 3]));
        assert!(reassignments_done(&v).is_empty());
        // Moving the one replica of a partition: the same steps.
        let v = view(&[(1, None), (2, None)]);
        let single = reassign(&v, "s~0", &unit(&[1], 1, 0, &[1]), Some(&[2]), true).unwrap().unwrap();
        assert_eq!(single, moving(&[2, 1], &[2], &[1], 1, 0, &[1]));
        let mut v2 = v.clone();
        Arc::make_mut(&mut v2.units).insert("s~0".into(), UnitRecord { isr: vec![1, 2], ..single });
        assert_eq!(reassignments_done(&v2), vec![("s~0".to_string(), unit(&[2], 2, 1, &[2]))]);
    }

    #[test]
    fn reassignments_are_refused_as_kafka_refuses_them() {
        let v = view(&[(1, None), (2, None), (3, None)]);
        let u = unit(&[1, 2], 1, 4, &[1, 2]);
        let invalid = |target: &[i32]| matches!(reassign(&v, "t~0", &u, Some(target), true), Err(NoReassignment::Invalid(_)));
        assert!(invalid(&[]), "no replica");
        assert!(invalid(&[3, 3]), "one named twice");
        assert!(invalid(&[3, 9]), "a broker not registered");
        assert!(invalid(&[3, -1]), "a negative id");
        assert!(matches!(reassign(&v, "t~0", &u, Some(&[1, 2, 3]), false), Err(NoReassignment::Factor(_))), "another factor, not allowed");
        assert!(matches!(reassign(&v, "t~0", &u, Some(&[3]), false), Err(NoReassignment::Factor(_))), "another factor, not allowed");
        assert_eq!(reassign(&v, "t~0", &u, None, true), Err(NoReassignment::NotInProgress));
        assert_eq!(reassign(&v, "t~0", &u, Some(&[1, 2]), false), Ok(None), "the replicas it has");
        // Another order of the same replicas takes effect at once.
        assert_eq!(reassign(&v, "t~0", &u, Some(&[2, 1]), false), Ok(Some(unit(&[2, 1], 1, 4, &[1, 2]))));
    }

    #[test]
    fn a_cancelled_reassignment_goes_back_and_a_new_target_replaces_one_under_way() {
        let mut v = view(&[(1, None), (2, None), (3, None), (4, None)]);
        // The added replica had come to lead: it goes, with its epoch. (The
        // original replicas come back in the order the move listed them,
        // as in Kafka.)
        let under_way = moving(&[3, 2, 1], &[3], &[1], 3, 5, &[1, 2, 3]);
        let back = reassign(&v, "t~0", &under_way, None, true).unwrap().unwrap();
        assert_eq!(back, unit(&[2, 1], 2, 6, &[1, 2]));
        back.check().unwrap();
        // A new target counts from the original replicas, and drops the
        // replica the old one was adding.
        let replaced = reassign(&v, "t~0", &moving(&[3, 2, 1], &[3], &[1], 1, 5, &[1, 2]), Some(&[4, 1]), true).unwrap().unwrap();
        assert_eq!(replaced, moving(&[4, 1, 2], &[4], &[2], 1, 5, &[1, 2]));
        assert_eq!(reassign(&v, "t~0", &moving(&[3, 2, 1], &[3], &[1], 1, 5, &[1, 2]), Some(&[1, 2]), true), Ok(Some(unit(&[1, 2], 1, 5, &[1, 2]))), "back to where it began, in the order asked");
        replaced.check().unwrap();
        // Only added replicas in sync: going back is an unclean election,
        // refused unless the unit's topics allow one.
        let only_added = moving(&[3, 2, 1], &[3], &[1], 3, 5, &[3]);
        assert!(matches!(reassign(&v, "t~0", &only_added, None, true), Err(NoReassignment::Invalid(_))));
        let topic = TopicEntry { id: uuid::Uuid::new_v4().to_string(), partitions: 1, replication_factor: 2, configs: [(UNCLEAN.to_string(), "true".to_string())].into(), created_ms: 0 };
        Arc::make_mut(&mut v.topics).insert("t".into(), topic);
        assert_eq!(reassign(&v, "t~0", &only_added, None, true), Ok(Some(unit(&[2, 1], 2, 6, &[2]))));
    }

    #[test]
    fn a_reassignment_may_change_a_units_replication_factor() {
        let mut v = view(&[(1, None), (2, None), (3, None)]);
        // Up: the new replica is added, and the move ends once it is in sync.
        let up = reassign(&v, "t~0", &unit(&[1, 2], 1, 4, &[1, 2]), Some(&[1, 2, 3]), true).unwrap().unwrap();
        assert_eq!(up, moving(&[1, 2, 3], &[3], &[], 1, 4, &[1, 2]));
        up.check().unwrap();
        Arc::make_mut(&mut v.units).insert("t~0".into(), UnitRecord { isr: vec![1, 2, 3], ..up });
        assert_eq!(reassignments_done(&v), vec![("t~0".to_string(), unit(&[1, 2, 3], 1, 4, &[1, 2, 3]))]);
        // Down: nothing to copy; the controller ends it at its next pass,
        // the leader handing over if the target drops it.
        let down = reassign(&v, "t~0", &unit(&[1, 2, 3], 1, 4, &[1, 2, 3]), Some(&[3]), true).unwrap().unwrap();
        assert_eq!(down, moving(&[3, 1, 2], &[], &[1, 2], 1, 4, &[1, 2, 3]));
        down.check().unwrap();
        Arc::make_mut(&mut v.units).insert("t~0".into(), down);
        assert_eq!(reassignments_done(&v), vec![("t~0".to_string(), unit(&[3], 3, 5, &[3]))]);
    }

    #[test]
    fn damaged_reassignments_are_refused() {
        assert!(moving(&[3, 2, 1], &[4], &[1], 1, 0, &[1]).check().is_err(), "adding a replica it does not list");
        assert!(moving(&[3, 2, 1], &[3], &[3], 1, 0, &[1]).check().is_err(), "adding and removing one replica");
        assert!(moving(&[3, 1], &[3, 1], &[], 1, 0, &[1]).check().is_err(), "adding every replica");
        assert!(moving(&[3, 1], &[], &[3, 1], 1, 0, &[1]).check().is_err(), "removing every replica");
        assert!(moving(&[3, 2, 1], &[3, 3], &[1], 1, 0, &[1]).check().is_err(), "adding one twice");
        // What an older node wrote (no such fields) reads as no reassignment.
        let old: UnitRecord = serde_json::from_str(r#"{"replicas":[1,2],"leader":1,"leader_epoch":0,"isr":[1,2]}"#).unwrap();
        assert!(!old.reassigning());
        assert!(!String::from_utf8(serde_json::to_vec(&old).unwrap()).unwrap().contains("adding"), "and is written as before");
    }

    #[test]
    fn unclean_elections_need_every_topic_of_the_unit_to_allow_them() {
        let topic = |configs: &[(&str, &str)]| TopicEntry { id: uuid::Uuid::new_v4().to_string(), partitions: 2, replication_factor: 3, configs: configs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(), created_ms: 0 };
        // Partition 1's leader (2) died alone in its ISR; 1 and 3 are live.
        let mut v = view(&[(1, None), (3, None)]);
        Arc::make_mut(&mut v.units).insert("u.b~1".into(), unit(&[2, 3, 1], 2, 4, &[2]));
        let elect = |v: &ClusterView| elections(v).into_iter().find(|(n, _)| n == "u.b~1").map(|(_, u)| u);
        Arc::make_mut(&mut v.topics).insert("u.b.one".into(), topic(&[]));
        assert_eq!(elect(&v), Some(unit(&[2, 3, 1], -1, 5, &[2])), "by default: no leader, the ISR kept");
        Arc::make_mut(&mut v.topics).insert("u.b.one".into(), topic(&[(UNCLEAN, "true")]));
        assert_eq!(elect(&v), Some(unit(&[2, 3, 1], 3, 5, &[3])), "allowed: the first live replica, alone in the ISR");
        // Another topic of the branch that forbids it forbids it for the unit.
        Arc::make_mut(&mut v.topics).insert("u.b.two".into(), topic(&[(UNCLEAN, "false")]));
        assert_eq!(elect(&v).map(|u| u.leader), Some(-1));
        // The cluster-wide broker config, unless a topic says otherwise.
        Arc::make_mut(&mut v.topics).insert("u.b.two".into(), topic(&[]));
        Arc::make_mut(&mut v.broker_configs).insert(UNCLEAN.into(), "true".into());
        assert_eq!(elect(&v).map(|u| u.leader), Some(3));
        Arc::make_mut(&mut v.topics).insert("u.b.one".into(), topic(&[(UNCLEAN, "false")]));
        assert_eq!(elect(&v).map(|u| u.leader), Some(-1));
        // The deciding node's static setting, under the cluster-wide one.
        Arc::make_mut(&mut v.topics).insert("u.b.one".into(), topic(&[]));
        Arc::make_mut(&mut v.broker_configs).clear();
        v.unclean_by_default = true;
        assert_eq!(elect(&v).map(|u| u.leader), Some(3));
        Arc::make_mut(&mut v.broker_configs).insert(UNCLEAN.into(), "false".into());
        assert_eq!(elect(&v).map(|u| u.leader), Some(-1));
        // A topic of another branch, or with fewer partitions, is not in the unit.
        assert!(!unclean_allowed(&v, "u.c~1") && !unclean_allowed(&v, "__canopy.coordinators~1"));

        // Asked for (ElectLeaders UNCLEAN), whatever the configs: a live ISR
        // member first, else any live replica; none live, none elected.
        let u = unit(&[2, 3, 1], 2, 4, &[2]);
        assert_eq!(unclean_election(&v, &u), Ok(unit(&[2, 3, 1], 3, 5, &[3])));
        assert_eq!(unclean_election(&v, &unit(&[2, 3, 1], -1, 4, &[2, 1])), Ok(unit(&[2, 3, 1], 1, 5, &[1])));
        assert_eq!(unclean_election(&v, &unit(&[3, 1], 3, 4, &[3])), Err(NoElection::NotNeeded));
        assert_eq!(unclean_election(&view(&[(1, None)]), &unit(&[2, 3], -1, 4, &[2])), Err(NoElection::NotAvailable));
    }

    #[test]
    fn elections_replace_gone_leaders_from_the_isr_and_move_the_epoch() {
        let mut v = view(&[(1, None), (3, None)]);
        let units = Arc::make_mut(&mut v.units);
        units.insert("a~0".into(), unit(&[2, 1, 3], 2, 4, &[2, 3]));
        units.insert("a~1".into(), unit(&[1, 2], 1, 0, &[1, 2]));
        units.insert("a~2".into(), unit(&[2], 2, 7, &[2]));
        units.insert("a~3".into(), unit(&[1], 1, 2, &[1]));
        units.insert("a~4".into(), unit(&[2, 3], -1, 5, &[3]));
        let got: BTreeMap<String, UnitRecord> = elections(&v).into_iter().collect();
        // The leader went: the first registered ISR member in replica order
        // (1 is registered but not in sync).
        assert_eq!(got["a~0"], unit(&[2, 1, 3], 3, 5, &[3]));
        // A follower went: it leaves the ISR, the leader stays.
        assert_eq!(got["a~1"], unit(&[1, 2], 1, 0, &[1]));
        // The only replica went: no leader, the ISR kept for its return.
        assert_eq!(got["a~2"], unit(&[2], -1, 8, &[2]));
        // Nothing to change.
        assert!(!got.contains_key("a~3"));
        // A leaderless unit whose ISR member came back.
        assert_eq!(got["a~4"], unit(&[2, 3], 3, 6, &[3]));
        assert!(got.values().all(|u| u.mod_revision == 9), "writes are guarded by the revision read");

        // Node 2 returns: the unit it alone holds is led again.
        let mut back = v.clone();
        back.nodes.insert(2, view(&[(2, None)]).nodes[&2].clone());
        Arc::make_mut(&mut back.units).insert("a~2".into(), got["a~2"].clone());
        let again: BTreeMap<String, UnitRecord> = elections(&back).into_iter().collect();
        assert_eq!(again["a~2"], unit(&[2], 2, 9, &[2]));
    }

    #[test]
    fn coordinators_are_their_shards_leaders() {
        let mut v = view(&[(1, None), (2, None)]);
        assert_eq!(v.coordinator(1, "g"), Err(true), "no shards yet");
        let placed = place(&v, &coordinator_units(), 1).unwrap();
        assert_eq!(placed.len(), COORDINATOR_SHARDS as usize);
        Arc::make_mut(&mut v.units).extend(placed.clone());
        assert_eq!(v.coordinator(1, "g"), Err(true), "the units, but not yet their log's topic");
        let log = TopicEntry { id: uuid::Uuid::nil().to_string(), partitions: COORDINATOR_SHARDS as i32, replication_factor: 1, configs: BTreeMap::new(), created_ms: 0 };
        Arc::make_mut(&mut v.topics).insert(COORDINATOR_TOPIC.to_owned(), log);
        let shard = coordinator_unit("group-a");
        assert!(shard.starts_with("__canopy.coordinators~"));
        assert_eq!(v.coordinator(1, "group-a"), Ok(placed[&shard].leader));
        assert_eq!(coordinator_unit("group-a"), shard, "stable");
        // Its node gone: no coordinator until it returns.
        let gone = placed[&shard].leader;
        v.nodes.remove(&gone);
        assert_eq!(v.coordinator(1, "group-a"), Err(false));
        let single = ClusterView { single: true, ..ClusterView::default() };
        assert_eq!(single.coordinator(4, "anything"), Ok(4));
        // Groups spread over the shards.
        let shards: BTreeSet<String> = (0..1000).map(|i| coordinator_unit(&format!("g{i}"))).collect();
        assert_eq!(shards.len(), COORDINATOR_SHARDS as usize);
    }

    #[test]
    fn a_stream_is_served_by_the_node_leading_all_it_covers() {
        let mut v = view(&[(1, None), (2, None)]);
        let units = Arc::make_mut(&mut v.units);
        units.insert("a.b~0".into(), unit(&[2], 2, 0, &[2]));
        units.insert("a.b~1".into(), unit(&[2], 2, 0, &[2]));
        units.insert("a.c~0".into(), unit(&[1], 1, 0, &[1]));
        let set = |names: &[&str]| names.iter().map(|s| s.to_string()).collect::<BTreeSet<String>>();
        assert_eq!(v.stream_server(1, &set(&["a.b~0", "a.b~1"])), Some(2));
        assert_eq!(v.stream_server(1, &set(&["a.b~0", "a.c~0"])), None, "split over two nodes");
        assert_eq!(v.stream_server(1, &set(&[])), Some(1));
        assert_eq!(v.stream_server(1, &set(&["a.d~0"])), None, "a unit not seen");
        Arc::make_mut(&mut v.units).insert("r.s~0".into(), unit(&[2, 1], 2, 0, &[2, 1]));
        assert_eq!(v.stream_server(1, &set(&["r.s~0"])), None, "replicated: a stream does not stop at the hw yet");
        v.nodes.remove(&2);
        assert_eq!(v.stream_server(1, &set(&["a.b~0"])), None, "its node gone");
    }

    #[test]
    fn records_that_cannot_be_units_or_topics_are_refused() {
        assert!(unit(&[], -1, 0, &[1]).check().is_err());
        assert!(unit(&[1, 1], 1, 0, &[1]).check().is_err());
        assert!(unit(&[1], 2, 0, &[1]).check().is_err());
        assert!(unit(&[1], 1, -1, &[1]).check().is_err());
        assert!(unit(&[1], 1, 0, &[2]).check().is_err());
        assert!(unit(&[1], 1, 0, &[]).check().is_err());
        unit(&[1, 2], -1, 3, &[2]).check().unwrap();
        let t = TopicEntry { id: uuid::Uuid::new_v4().to_string(), partitions: 3, replication_factor: 1, configs: BTreeMap::new(), created_ms: 0 };
        t.check().unwrap();
        assert!(TopicEntry { id: "x".into(), ..t.clone() }.check().is_err());
        assert!(TopicEntry { id: uuid::Uuid::nil().to_string(), ..t.clone() }.check().is_err());
        assert!(TopicEntry { partitions: 0, ..t.clone() }.check().is_err());
        assert!(TopicEntry { replication_factor: 0, ..t }.check().is_err());
    }

    #[test]
    fn partitions_are_described_from_their_unit() {
        let mut v = view(&[(1, None), (3, None)]);
        Arc::make_mut(&mut v.units).insert("a.b~0".into(), unit(&[2, 1], 2, 4, &[2, 1]));
        let p = v.partition(1, "a.b.c", 0);
        assert_eq!((p.leader, p.leader_epoch, p.offline), (-1, 4, vec![2]), "a leader that is not registered is none");
        assert_eq!(v.partition(1, "a.b.c", 1).leader, -1, "no unit seen yet");
        let single = ClusterView { single: true, ..ClusterView::default() };
        assert_eq!(single.partition(7, "x", 3), PartState { leader: 7, leader_epoch: 0, replicas: vec![7], isr: vec![7], offline: vec![] });
    }
}
